"""A modality defined outside the package: 1-D signals cut into patches (docs/guides/add-a-modality.md's worked
example, the same code). GAECallback runs on it end to end with nothing of the package changed: pictures, the
faithfulness scores, and a declared time window's share of relevance."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule, seed_everything
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gae import Modality, display
from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from lightning_gae.compare import attribute, compare
from lightning_gae.metrics.functional import rationale_agreement
from lightning_gae.modalities import MethodMap
from lightning_gae.modalities.regions import Region
from lightning_gae.options import RegionOptions
from tests.helpers.models import TinyBlock


# --- the modality (the guide's code) --------------------------------------------------------------------------


class SignalPatches(Modality):
    """A signal ``[B, T]`` cut into patches of ``patch`` samples: ``prefix_tokens`` (a CLS) then one token per patch.

    Removing a patch sets its samples to 0; a region is a window of samples, ``mask`` ``[1, T]`` or ``[B, T]``.
    """

    # Samples may carry the patches that decide their class [B, P]: scored as rationales are, per patch.
    ground_truth = "rationale"

    def __init__(self, patch: int, prefix_tokens: int = 1) -> None:
        if patch < 1 or prefix_tokens < 0:
            raise ValueError(f"patch must be >= 1 and prefix_tokens >= 0; got {patch} and {prefix_tokens}")
        self.patch = patch
        self.prefix_tokens = prefix_tokens

    def __repr__(self) -> str:
        return f"SignalPatches(patch={self.patch}, prefix_tokens={self.prefix_tokens})"

    def _signal(self, inputs: Any) -> Tensor:
        if not isinstance(inputs, Tensor) or inputs.dim() != 2 or inputs.shape[1] % self.patch:
            raise ValueError(f"SignalPatches needs signals [B, T] with T a multiple of {self.patch}; got "
                             f"{getattr(inputs, 'shape', type(inputs).__name__)}")
        return inputs

    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Each patch token's relevance on its samples: ``[B, T]``."""
        signal = self._signal(inputs)
        patches = tokens[:, self.prefix_tokens :].float()
        if patches.shape[1] * self.patch != signal.shape[1]:
            raise ValueError(f"{tokens.shape[1]} tokens do not fit signals of {signal.shape[1]} samples in patches "
                             f"of {self.patch} after {self.prefix_tokens} prefix tokens")
        return patches.repeat_interleave(self.patch, dim=1)

    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """One score per patch ``[B, P]``: a patch token's relevance, or a Captum map's mean over the patch."""
        signal = self._signal(inputs)
        if attributions.shape == signal.shape:
            return attributions.float().reshape(signal.shape[0], -1, self.patch).mean(dim=2)
        return self.to_input(attributions, inputs)[:, :: self.patch]

    def removable(self, inputs: Any) -> Tensor:
        signal = self._signal(inputs)
        return torch.ones(signal.shape[0], signal.shape[1] // self.patch, dtype=torch.bool, device=signal.device)

    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        signal = self._signal(inputs)
        replacement = torch.zeros_like(signal) if fill is None else self._signal(fill)
        return torch.where(drop.to(signal.device).repeat_interleave(self.patch, dim=1), replacement, signal)

    def render(self, x: Tensor, relevance: Tensor | None, title: str, *, signed: bool | None = None) -> np.ndarray:
        """The signal as a dark line over its relevance's colours, one column per sample (a patch's score, or a
        Captum map's per sample), on the colormap of the method's sign (``signed``; None: the map's own)."""
        values = x.detach().float().cpu()
        rows = 24
        span = (values.max() - values.min()).clamp(min=1e-6)
        level = ((values.max() - values) / span * (rows - 1)).round().long()
        image = np.ones((rows, values.numel(), 3))
        image[level.numpy(), np.arange(values.numel())] = 0.0
        if relevance is None:
            return display.titled_image(display.enlarge(image, 128), title)
        heat = relevance.detach().float().cpu().reshape(-1)
        if heat.numel() != values.numel():
            heat = heat.repeat_interleave(values.numel() // heat.numel())
        vmin, vmax = display.value_range(heat, signed)
        panel = display.heatmap_panel(image, heat[None].numpy(), size=128, vrange=(vmin, vmax),
                                      cmap=display.colormap_for(vmin < 0))
        return display.titled_image(panel, title)

    def region_tokens(self, region: Region, inputs: Any) -> Tensor:
        """The patches that at least half lie in the window ``mask``."""
        signal = self._signal(inputs)
        if region.mask is None:
            raise region.mismatch(self, "mask= (samples [1, T] or [B, T])")
        window = (region.mask != 0).float().to(signal.device).expand(signal.shape)
        inside = window.reshape(signal.shape[0], -1, self.patch).mean(dim=2) >= 0.5
        prefix = torch.zeros(signal.shape[0], self.prefix_tokens, dtype=torch.bool, device=signal.device)
        return torch.cat([prefix, inside], dim=1)

    def token_labels(self, x: Tensor, count: int) -> list[str]:
        """``CLS``, then each patch by its first sample: ``t0``, ``t4``, ..."""
        return ["CLS"] * self.prefix_tokens + [f"t{p * self.patch}" for p in range(count - self.prefix_tokens)]


# --- a tiny transformer over the patches, and signals whose class is a bump in one window -------------------------

LENGTH, PATCH, WINDOW = 32, 4, (8, 16)


class SignalTransformer(LightningModule):
    """Patches of the signal embedded, a CLS token at 0, pre-norm attention blocks, a head on the CLS."""

    def __init__(self, dim: int = 16, depth: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Linear(PATCH, dim)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, LENGTH // PATCH + 1, dim) * 0.5)
        self.blocks = nn.ModuleList(TinyBlock(dim, heads, "sdpa") for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x.reshape(x.shape[0], -1, PATCH))
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h)[:, 0])

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _signals(count: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = 0.3 * torch.randn(count, LENGTH, generator=g)
    y = torch.arange(count) % 2
    x[y == 1, WINDOW[0] : WINDOW[1]] += 2.0
    return TensorDataset(x, y)


def _window() -> Tensor:
    mask = torch.zeros(1, LENGTH)
    mask[:, WINDOW[0] : WINDOW[1]] = 1
    return mask


# --- the modality alone -----------------------------------------------------------------------------------------


def test_the_modality_maps_removes_and_finds_its_window():
    modality = SignalPatches(PATCH)
    signal = torch.arange(2.0 * LENGTH).reshape(2, LENGTH)
    tokens = torch.arange(2.0 * 9).reshape(2, 9)
    assert modality.to_input(tokens, signal)[0, :8].tolist() == [1.0] * 4 + [2.0] * 4
    assert modality.unit_scores(tokens, signal).tolist() == tokens[:, 1:].tolist()
    drop = torch.zeros(2, 8, dtype=torch.bool)
    drop[:, 1] = True
    removed = modality.remove(signal, drop)
    assert removed[:, 4:8].eq(0).all() and torch.equal(removed[:, 8:], signal[:, 8:])
    # The package's defaults built on these: the removable tokens skip the CLS, a token is its patch.
    assert modality.removable_tokens(signal)[0].tolist() == [False] + [True] * 8
    in_window = modality.region_tokens(Region("bump", "evidence", mask=_window()), signal)
    assert in_window[0].tolist() == [False, False, False, True, True, False, False, False, False]
    assert modality.token_units(in_window[None], signal).shape == (1, 2, 8)
    with pytest.raises(ValueError, match="does not fit SignalPatches"):
        modality.region_tokens(Region("w", "suspect", token_ids=[3]), signal)


def test_the_guide_shows_this_modality_as_the_test_runs_it():
    guide = Path(__file__).resolve().parents[2] / "docs" / "guides" / "add-a-modality.md"
    assert inspect.getsource(SignalPatches) in guide.read_text()


def test_its_picture_changes_with_the_relevance():
    modality = SignalPatches(PATCH)
    signal = _signals(2, 0).tensors[0]
    one, other = torch.zeros(LENGTH), torch.zeros(LENGTH)
    one[:8], other[-8:] = 1.0, 1.0
    first, second = modality.render(signal[1], one, "x"), modality.render(signal[1], other, "x")
    assert first.dtype == np.uint8 and first.shape == second.shape and not np.array_equal(first, second)


def test_the_callbacks_pictures_draw_its_maps_by_the_methods_sign():
    # The default panels hand render the sign of each map's scale: (-m, m) is a signed method's, whatever its values.
    modality = SignalPatches(PATCH)
    signal = _signals(2, 0).tensors[0][1]
    values = np.linspace(0.1, 1.0, LENGTH)
    _, cells = modality.panels(signal, [MethodMap("signed", values, (-1.0, 1.0), False),
                                        MethodMap("positive", values, (0.0, 1.0), False)], None, 128, 0.7)
    heat = torch.from_numpy(values)
    assert np.array_equal(cells[0], modality.render(signal, heat, "", signed=True))
    assert np.array_equal(cells[1], modality.render(signal, heat, "", signed=False))
    assert not np.array_equal(cells[0], cells[1])


def test_the_ground_truth_it_declares_is_scored_with_the_existing_metric():
    # ground_truth = "rationale": the patches of the window [N, P] are scored as text rationales are, through its
    # unit_scores and removable, with no table entry of its own.
    torch.manual_seed(0)
    modality, signals = SignalPatches(PATCH), _signals(6, 3).tensors[0]
    patches = modality.region_tokens(Region("bump", "evidence", mask=_window()), signals)[:, 1:].long()
    model = SignalTransformer().eval()
    result = compare(model, signals, methods=("gae",), modality=modality, ground_truth=patches, batch_size=4,
                     faithfulness=FaithfulnessOptions(metrics=("deletion_auc",)))
    gae = modality.unit_scores(attribute("gae", model, signals), signals)
    expected = rationale_agreement(gae, patches, modality.removable(signals))
    assert {k: result.methods["gae"][f"rationale_{k}"] for k in expected} == pytest.approx(
        {k: v.item() for k, v in expected.items()}, abs=1e-5)


    class Misnamed(SignalPatches):
        ground_truth = "masks"                              # a batch key, not a kind of ground truth

    with pytest.raises(ValueError, match=r"Misnamed.ground_truth = 'masks' names no ground truth"):
        compare(model, signals, methods=("gae",), modality=Misnamed(PATCH), ground_truth=patches,
                faithfulness=FaithfulnessOptions(metrics=("deletion_auc",)))


# --- the callback on it, end to end ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_callback_logs_pictures_scores_and_a_region_of_a_modality_it_does_not_know(tmp_path, make_trainer,
                                                                                      read_events):
    seed_everything(0)
    callback = GAECallback(
        num_samples=4, every_n_epochs=1, methods=("gae", "rollout"), modality=SignalPatches(PATCH),
        captum_baselines=("saliency",),
        faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=16, every_n_explanations=1),
        regions=RegionOptions(regions=[Region("bump", "evidence", mask=_window())], threshold=None),
    )
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=8, limit_val_batches=2)
    trainer.fit(SignalTransformer(), DataLoader(_signals(128, 1), batch_size=16, shuffle=True),
                DataLoader(_signals(32, 2), batch_size=16))

    events = read_events(trainer.logger.log_dir)
    images = events.Tags()["images"]
    # Pictures: one per tracked sample and step, the same size at both steps; the weights moved, so did the picture.
    for sample in callback.sample_indices:
        tag = f"gae_heatmaps/val_{sample}"
        assert tag in images, images
        logged = events.Images(tag)
        assert len(logged) == 2 and logged[0].height == logged[1].height > 0 and logged[0].width == logged[1].width
        assert logged[0].encoded_image_string != logged[1].encoded_image_string
    picture = events.picture(f"gae_heatmaps/val_{callback.sample_indices[0]}")
    assert picture.ndim == 3 and picture.shape[2] == 3 and picture.shape[1] > picture.shape[0]
    # The modality draws no evolution strip and no token table (its defaults); the GAE tab gets its input.
    assert not [t for t in images if t.startswith("gae_evolution/")]
    assert f"gae_dashboard/input/val_{callback.sample_indices[0]}" in events.Tags()["tensors"]
    # Faithfulness of every method, random included, and the window's share of relevance.
    scalars = events.scalar_values()
    for method in ("gae", "rollout", "saliency", "random"):
        assert np.isfinite(scalars[f"positive_perturbation_auc/{method}"]).all(), sorted(scalars)
    for method in ("gae", "rollout"):
        shares = scalars[f"region_share_bump/{method}"]
        assert len(shares) == 2 and all(0.0 <= s <= 1.0 for s in shares)
