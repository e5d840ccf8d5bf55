"""lightning_gae.attribution.attribute and compare refuse what explain() refuses (an empty batch, NaN inputs) for every
method, Captum's included, instead of failing inside Captum or attributing NaN inputs silently; Captum's methods
attribute a model whose forward takes the batch (a dataclass here) as the same model called by keyword."""

import dataclasses

import pytest
import torch

from lightning_gae.attribution import attribute
from tests.helpers.models import TinyViT


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "gae"])
def test_attribute_refuses_an_empty_batch_and_nan_inputs_for_captums_methods_as_for_the_others(method):
    torch.manual_seed(0)
    model, x = TinyViT().eval(), torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match="hold no sample"):
        attribute(method, model, x[:0])
    x[1, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or inf values \(1 in inputs\)"):
        attribute(method, model, x)


def test_compare_refuses_an_empty_batch_with_what_to_pass():
    from lightning_gae.compare import compare

    with pytest.raises(ValueError, match="hold no sample"):
        compare(TinyViT().eval(), torch.rand(0, 1, 8, 8), methods=("gae",))


@dataclasses.dataclass
class _ImageBatch:
    pixel_values: torch.Tensor
    labels: torch.Tensor


@pytest.mark.parametrize("method", ["saliency", "input_x_gradient", "integrated_gradients", "gae"])
def test_a_model_taking_a_dataclass_batch_is_attributed_at_its_pixel_values(method):
    torch.manual_seed(0)
    vit = TinyViT().eval()

    class ByName(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vit = vit

        def forward(self, pixel_values):
            return self.vit(pixel_values)

    class TakesTheBatch(ByName):
        def forward(self, batch: _ImageBatch):
            return self.vit(batch.pixel_values)

    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    batch = _ImageBatch(x, torch.tensor([0, 1, 2]))
    options = {"n_steps": 8} if method == "integrated_gradients" else {}
    whole = attribute(method, TakesTheBatch(), (batch,), **options)
    by_name = attribute(method, ByName(), {"pixel_values": x}, **options)
    torch.testing.assert_close(whole, by_name)
    assert whole.abs().sum() > 0
