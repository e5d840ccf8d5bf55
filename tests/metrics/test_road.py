"""ROAD and its LeRF twin: against a slow per-sample oracle, on tables equal to the perturbation test, through
compare and the options."""

import math

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from lightning_gae import explain
from lightning_gae.callbacks import GAECallback
from lightning_gae.compare import compare
from lightning_gae.metrics import (
    PERTURBATION_METRICS,
    ROAD,
    NegativePerturbationAUC,
    PositivePerturbationAUC,
    ROADLeRF,
    perturbation_metric,
)
from lightning_gae.metrics.functional import noisy_linear_imputation, road_auc
from lightning_gae.modalities import ImageTokens, TabularTokens
from lightning_gae.options import FaithfulnessOptions
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier
from tests.helpers.metric_oracle import linear_imputation_oracle

MEAN, STD = (0.5, 0.4), (0.25, 0.5)
FRACTIONS = (0.0, 0.2, 0.5, 0.8)


def _pixel_model():
    """A fixed linear map of the pixels through a tanh: every imputed value moves the probability."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(2 * 6 * 5, 16), nn.Tanh(), nn.Linear(16, 3)).eval()


def _road_oracle(model, images, pixel_maps, target, order):
    """Each sample alone, each step alone: rank its pixels (stable, most relevant first for MoRF), take
    floor(f * n), undo mean/std, impute densely, normalise again, read the target's probability; trapezoid x100."""
    mean, std = torch.tensor(MEAN).view(2, 1, 1), torch.tensor(STD).view(2, 1, 1)
    values = []
    for image, relevance, t in zip(images, pixel_maps, target):
        key = relevance.flatten().double() * (-1 if order == "positive" else 1)
        ranked = sorted(range(key.numel()), key=lambda i: (key[i].item(), i))
        curve = []
        for f in FRACTIONS:
            count = math.floor(f * key.numel() + 1e-6)
            mask = torch.zeros(key.numel(), dtype=torch.bool)
            mask[ranked[:count]] = True
            mask = mask.reshape(image.shape[-2:])
            imputed = linear_imputation_oracle(image.double() * std + mean, mask)
            x = ((imputed - mean) / std).float()
            with torch.no_grad():
                curve.append(model(x[None]).softmax(dim=1)[0, t].item())
        values.append(100 * sum((FRACTIONS[s + 1] - FRACTIONS[s]) * (curve[s] + curve[s + 1]) / 2
                                for s in range(len(FRACTIONS) - 1)))
    return torch.tensor(values, dtype=torch.float64)


@pytest.mark.parametrize("cls", [ROAD, ROADLeRF])
def test_road_is_the_per_sample_oracle_without_noise(cls):
    model, modality = _pixel_model(), ImageTokens(patch_size=1, prefix_tokens=0, mean=MEAN, std=STD)
    g = torch.Generator().manual_seed(1)
    images = torch.randn(5, 2, 6, 5, generator=g)
    pixel_maps = torch.randn(5, 6, 5, generator=g)
    target = torch.tensor([0, 1, 2, 0, 1])
    expected = _road_oracle(model, images, pixel_maps, target, cls.order)

    metric = cls(model, modality, fractions=FRACTIONS, score="probability", noise=0.0)
    states = metric.per_sample_states(images, pixel_maps, target)
    torch.testing.assert_close(metric.per_sample_values(states), expected, rtol=0, atol=1e-4)
    metric.update(images, pixel_maps, target)
    assert metric.compute().item() == pytest.approx(expected.mean().item(), abs=1e-4)
    assert road_auc(model, modality, images, pixel_maps, target, cls.order, FRACTIONS, "probability",
                    noise=0.0).item() == pytest.approx(expected.mean().item(), abs=1e-4)
    # Black pixels are another removal: the imputation is what is scored.
    black = (PositivePerturbationAUC if cls is ROAD else NegativePerturbationAUC)(
        model, modality, fractions=FRACTIONS, score="probability")
    black.update(images, pixel_maps, target)
    assert abs(black.compute().item() - metric.compute().item()) > 0.1


def test_the_noise_is_seeded_and_the_same_for_every_update():
    model, modality = _pixel_model(), ImageTokens(patch_size=1, prefix_tokens=0, mean=MEAN, std=STD)
    g = torch.Generator().manual_seed(2)
    images, pixel_maps = torch.randn(4, 2, 6, 5, generator=g), torch.randn(4, 6, 5, generator=g)
    values = [ROAD(model, modality, score="probability", seed=seed).per_sample_states(images, pixel_maps)
              for seed in (0, 0, 1)]
    name = next(iter(values[0]))
    assert torch.equal(values[0][name], values[1][name]) and not torch.equal(values[0][name], values[2][name])
    clean = ROAD(model, modality, score="probability", noise=0.0).per_sample_states(images, pixel_maps)[name]
    assert 0 < (values[0][name] - clean).abs().max() < 0.05


def test_on_a_table_road_is_the_perturbation_test():
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).eval()
    modality = TabularTokens(list("abcde"), prefix_tokens=0, means=[0.1, -0.2, 0.3, 0.0, 0.5])
    g = torch.Generator().manual_seed(3)
    x, relevance = torch.randn(7, 5, generator=g), torch.randn(7, 5, generator=g)
    for twin, cls in ((PositivePerturbationAUC, ROAD), (NegativePerturbationAUC, ROADLeRF)):
        ours, reference = cls(model, modality, score="probability"), twin(model, modality, score="probability")
        ours.update(x, relevance)
        reference.update(x, relevance)
        assert ours.compute().item() == pytest.approx(reference.compute().item(), abs=1e-6)


def test_road_is_in_the_table_and_refuses_fractions_up_to_one():
    assert PERTURBATION_METRICS["road"] is ROAD and PERTURBATION_METRICS["road_lerf"] is ROADLeRF
    assert ROAD.higher_is_better is False and ROADLeRF.higher_is_better is True
    assert FaithfulnessOptions(metrics=("road", "road_lerf")).metrics == ("road", "road_lerf")
    metric = perturbation_metric("road", nn.Identity(), ImageTokens(2), protocol="predicted", max_batch=8)
    assert metric.protocol == "predicted" and metric.max_batch == 8
    with pytest.raises(ValueError, match="fractions must stay below 1"):
        ROAD(nn.Identity(), ImageTokens(2), fractions=(0.0, 0.5, 1.0))
    with pytest.raises(ValueError, match="noise must be >= 0"):
        ROADLeRF(nn.Identity(), ImageTokens(2), noise=-0.1)


def test_compare_scores_road_with_standard_errors_equal_to_the_metric():
    torch.manual_seed(0)
    model = ViTClassifier(dim=16, depth=1, heads=2).eval()
    images = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    result = compare(model, images, methods=("gae", "rollout"), batch_size=6, modality=ImageTokens(2),
                     faithfulness=FaithfulnessOptions(metrics=("road", "road_lerf")))
    assert result.higher_is_better == {"road": False, "road_lerf": True}
    for method in ("gae", "rollout"):
        for name in ("road", "road_lerf"):
            assert 0 <= result.methods[method][name] <= 90 and result.stderr[method][name] >= 0
    tokens = explain(model, images, method="gae").tokens
    reference = ROAD(model, ImageTokens(2))
    reference.update(images, tokens)
    assert result.methods["gae"]["road"] == pytest.approx(reference.compute().item(), abs=1e-5)


def test_images_impute_whole_patches_in_zero_one_space():
    modality = ImageTokens(patch_size=2, prefix_tokens=0, mean=MEAN, std=STD, removal="patch")
    images = torch.randn(2, 2, 6, 5, generator=torch.Generator().manual_seed(5))
    drop = torch.zeros(2, 6, dtype=torch.bool)  # 3 x 2 patches; the last column of pixels belongs to none
    drop[0, [0, 3]] = True
    drop[1, 5] = True
    out = modality.impute(images, drop, lambda x, m: noisy_linear_imputation(x, m, noise=0.0))
    mean, std = torch.tensor(MEAN).view(2, 1, 1), torch.tensor(STD).view(2, 1, 1)
    pixels = drop.reshape(2, 1, 3, 2).repeat_interleave(2, 2).repeat_interleave(2, 3)[:, 0]
    pixels = torch.nn.functional.pad(pixels, (0, 1))
    for image, mask, got in zip(images, pixels, out):
        expected = (linear_imputation_oracle(image.double() * std + mean, mask) - mean) / std
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)
        assert torch.equal(got[:, ~mask], image[:, ~mask])


@pytest.mark.slow
def test_the_callback_logs_road_with_its_standard_error_as_compare_scores_it(tmp_path):
    seed_everything(0)
    model, data = ViTClassifier(dim=16, depth=1, heads=2), DigitsDataModule(batch_size=32)
    options = FaithfulnessOptions(metrics=("road", "road_lerf"), samples=0)
    callback = GAECallback(num_samples=8, methods=("gae", "rollout"), faithfulness=options)
    trainer = Trainer(logger=TensorBoardLogger(tmp_path), callbacks=[callback], accelerator="cpu", devices=1,
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(model, datamodule=data)
    x, y = data.val_set.tensors
    index = torch.tensor(callback.sample_indices)
    result = compare(model.eval(), x[index], target=y[index], methods=("gae", "rollout", "random"),
                     modality=ImageTokens(2), protocol="predicted", faithfulness=options)
    events = EventAccumulator(trainer.logger.log_dir)
    events.Reload()
    for method in ("gae", "rollout", "random"):
        for name in ("road", "road_lerf"):
            logged = events.Scalars(f"{name}/{method}")[-1].value
            assert logged == pytest.approx(result.methods[method][name], abs=1e-4), (name, method)
            assert events.Scalars(f"{name}/{method}/stderr")[-1].value >= 0
