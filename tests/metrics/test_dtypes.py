"""Metric states an Apple-silicon (MPS) device can hold: no float64 state (issue 10, item 16)."""

import inspect

import pytest
import torch
from torch import nn

import lightning_gae.metrics as metrics
from lightning_gae import ImageTokens
from lightning_gae.metrics.functional.perturbation import removal_counts
from torchmetrics import Metric


def _metric_classes():
    return [c for _, c in inspect.getmembers(metrics, inspect.isclass) if issubclass(c, Metric)]


class PatchSum(nn.Module):
    def forward(self, x):
        return torch.stack([x[:, :, :4].sum((1, 2, 3)), x[:, :, 4:].sum((1, 2, 3))], dim=1)


def _instance(cls):
    if "forward_fn" in inspect.signature(cls.__init__).parameters:
        return cls(PatchSum(), ImageTokens(patch_size=2))
    if "modality" in inspect.signature(cls.__init__).parameters:
        return cls(ImageTokens(patch_size=2))
    return cls()


@pytest.mark.parametrize("cls", _metric_classes(), ids=lambda c: c.__name__)
def test_states_are_float32_or_integer(cls):
    metric = _instance(cls)
    assert metric._defaults, "every metric keeps summed states"
    for name, default in metric._defaults.items():
        assert default.dtype in (torch.float32, torch.int64), f"{cls.__name__}.{name} is {default.dtype}"
    metric.reset()
    assert all(getattr(metric, name).dtype != torch.float64 for name in metric._defaults)


def test_states_stay_float32_after_an_update():
    images = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    tokens = torch.rand(3, 17, generator=torch.Generator().manual_seed(1))
    for cls in (metrics.PerturbationAUC, metrics.Comprehensiveness):
        metric = _instance(cls)
        metric.update(images, tokens, target=1)
        assert {getattr(metric, n).dtype for n in metric._defaults} <= {torch.float32, torch.int64}
        assert torch.isfinite(metric.compute()).all()


def test_removal_counts_stay_exact_for_large_unit_counts():
    # A guard for the change that keeps float64 off the device: the count is still computed exactly.
    # 0.3 * 3_495_263 = 1_048_578.9: in float32 the product rounds up to 1_048_579.0, in float64 (on the CPU) it does not.
    removable = torch.ones(1, 3_495_263, dtype=torch.bool)
    counts = removal_counts([0.0, 0.3], removable)
    assert counts[:, 0].tolist() == [0, 1_048_578]
    assert counts.device == removable.device
