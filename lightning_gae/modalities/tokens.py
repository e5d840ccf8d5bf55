"""What a token is in the input: :class:`Modality`, the one interface every part of the package asks.

``explain()`` returns relevance per *token* (``Explanation.tokens``, ``[B, N]``). A modality knows
how the model made its tokens from the input, and owns everything that depends on it: mapping
relevance onto the input (pixels, token ids, features, samples of a signal), removing parts of the
input for the faithfulness metrics (:mod:`lightning_gae.metrics`), turning a declared region into
tokens, and drawing a sample for the Images tab, the Text tab and the GAE tab. The metrics, the
Captum classes, ``compare`` and the callback call these methods and never ask which modality they
hold, so a new kind of input is one subclass (``docs/guides/add-a-modality.md``):

* five methods to implement: :meth:`Modality.to_input`, :meth:`~Modality.unit_scores`,
  :meth:`~Modality.removable`, :meth:`~Modality.remove` and :meth:`~Modality.render`;
* every other method has a default that fits a sequence of ``prefix_tokens`` (CLS, registers)
  followed by one token per removal unit, drawn with :meth:`~Modality.render`; override the ones
  your input needs otherwise (:meth:`~Modality.region_tokens` to score declared regions).

The package's own: :class:`~lightning_gae.ImageTokens` (ViT patches),
:class:`~lightning_gae.TextTokens` (token ids) and
:class:`~lightning_gae.TabularTokens` (one token per feature). They are plain classes
with typed ``__init__`` arguments, so LightningCLI builds them from YAML::

    modality:
      class_path: lightning_gae.modalities.ImageTokens
      init_args: {patch_size: 2, prefix_tokens: 1}
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import matplotlib
import numpy as np
import torch
from torch import Tensor

from lightning_gae import display

__all__ = ["MethodMap", "Modality", "check_cmap", "check_tokens", "render_map", "spread"]

InterpolateMode = Literal["nearest", "bilinear"]


def check_cmap(cmap: str) -> None:
    """Fail when the config is read, not at the first rendering many steps into training."""
    if cmap not in matplotlib.colormaps:
        raise ValueError(f"cmap={cmap!r} is not a matplotlib colormap; e.g. 'jet', 'viridis', 'Reds'")


def check_tokens(tokens: Tensor, batch: int) -> None:
    """Token relevance must be ``[B, N]`` with the inputs' batch size."""
    if tokens.dim() != 2 or tokens.shape[0] != batch:
        raise ValueError(f"tokens must be [B, N] with B={batch} as in the inputs; got shape {tuple(tokens.shape)}")


def spread(relevance: Tensor, x: Tensor) -> Tensor:
    """``relevance [B, K]`` repeated over the trailing dims of ``x [B, K, ...]`` (Captum's input-shaped attribution)."""
    lead = relevance.dim()
    if tuple(relevance.shape) != tuple(x.shape[:lead]):
        raise ValueError(
            f"the modality mapped the tokens to shape {tuple(relevance.shape)}, which is not the leading part "
            f"of the input's shape {tuple(x.shape)}"
        )
    return relevance.reshape(relevance.shape + (1,) * (x.dim() - lead)).expand(x.shape)


@dataclass(frozen=True)
class MethodMap:
    """One method's map of one sample, as the GAE pictures draw it.

    Attributes:
        method: the method's name.
        values: the sample's map in the units :meth:`~lightning_gae.Modality.token_map` or
            :meth:`~lightning_gae.Modality.input_map` gave.
        vrange: ``(vmin, vmax)``, the colour scale's ends.
        saturated: whether values lie past the scale (a fixed scale set at an earlier step), marked on the colour bar.
    """

    method: str
    values: np.ndarray
    vrange: tuple[float, float]
    saturated: bool

    @property
    def signed(self) -> bool:
        """Whether the map is drawn signed, its scale reaching below 0 as the scale of a method whose ``signed`` fact
        is True always does (:func:`lightning_gae.display.value_range`)."""
        return self.vrange[0] < 0


class Modality(ABC):
    """How a model's tokens relate to its input: mapping relevance back, removing, regions and drawing.

    Attributes:
        prefix_tokens: tokens before the input's units (CLS, distillation, registers); they are
            never removed, never in a region and drawn muted by the defaults.
        ground_truth: the kind of ground truth this modality's samples carry, by the name of its entry in
            :data:`~lightning_gae.metrics.ground_truth.GROUND_TRUTH` that scores it (``"segmentation"``,
            ``"rationale"``, ``"feature_recovery"``); None: no ground truth is scored.
    """

    prefix_tokens: int = 0
    ground_truth: str | None = None

    # --- tokens <-> input (implement these) ---------------------------------------------------

    @abstractmethod
    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Token relevance ``[B, N]`` mapped onto the input space of ``inputs`` (one batch), float32."""

    @abstractmethod
    def render(self, x: Tensor, relevance: Tensor | None, title: str, *, signed: bool | None = None) -> np.ndarray:
        """One sample ``x`` with its input-space relevance (or alone, for None) as uint8 ``[h, w, 3]``.

        ``signed``: the drawn method's ``signed`` fact, so that it is drawn alike in every sample: True, on
        :func:`~lightning_gae.display.colormap_for`'s diverging colormap with the range ``(-m, m)`` (white at 0), even
        for a map without a negative value; False, on the sequential one with ``(0, max)``; None, decided by the map
        (signed when a value is below 0). :func:`~lightning_gae.modalities.render_map` passes it.
        """

    @abstractmethod
    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """An attribution as one score per removal unit (pixel, patch, token, feature).

        Args:
            attributions: token relevance ``[B, N]`` (an :class:`~lightning_gae.Explanation`'s
                ``tokens``) or an input-shaped map (Captum's convention).
            inputs: the batch the attributions explain.

        Returns:
            float32 ``[B, U]``.
        """

    @abstractmethod
    def removable(self, inputs: Any) -> Tensor:
        """bool ``[B, U]``: the units removal may touch (False for special and padded tokens)."""

    @abstractmethod
    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """A copy of ``inputs`` with the units where ``drop [B, U]`` is True removed.

        ``fill``: inputs of the same structure whose units replace the removed ones (the blurred
        start of an insertion curve); None means the modality's own removal value.
        """

    # --- removal --------------------------------------------------------------------------------

    def blurred(self, inputs: Any) -> Any:
        """The start of an insertion curve: every removable unit removed (images: a blurred copy)."""
        return self.remove(inputs, self.removable(inputs))

    def impute(self, inputs: Any, drop: Tensor, imputation: Callable[[Tensor, Tensor], Tensor]) -> Any:
        """A copy of ``inputs`` with the units where ``drop [B, U]`` is True inferred from the units kept (ROAD's removal).

        ``imputation(values [B, C, H, W], mask [B, H, W]) -> values`` fills the pixels where ``mask`` is True (e.g.
        :func:`~lightning_gae.metrics.functional.noisy_linear_imputation`). The default is :meth:`remove`: tokens and
        features have no neighbourhood to infer a removed one from.
        """
        return self.remove(inputs, drop)

    @property
    def can_remove(self) -> bool:
        """Whether :meth:`remove` works without a ``fill`` (a table needs its features' means first)."""
        return True

    def removable_tokens(self, inputs: Any) -> Tensor:
        """bool ``[B, N]``: the tokens whose input :meth:`remove` can take away; the prefix never is.

        The default: one token per removal unit after ``prefix_tokens``.
        """
        units = self.removable(inputs)
        prefix = torch.zeros(units.shape[0], self.prefix_tokens, dtype=torch.bool, device=units.device)
        return torch.cat([prefix, units], dim=1)

    def token_units(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Token masks ``[S, B, N]`` as masks over the removal units ``[S, B, U]`` (what removing a token removes).

        The default: one unit per token after ``prefix_tokens``.
        """
        return tokens[..., self.prefix_tokens :]

    # --- tokens in the units a person sees ------------------------------------------------------

    def input_map(self, attributions: Tensor, shown: Tensor, inputs: Any) -> Tensor:
        """An attribution (token relevance or Captum's input-shaped map) in the units its pictures show.

        Args:
            attributions: ``[B, N]`` token relevance or an input-shaped map.
            shown: the tensor a person looks at (images, token ids, features).
            inputs: the batch.

        The default: one value per removal unit (:meth:`unit_scores`).
        """
        return self.unit_scores(attributions, inputs)

    def token_map(self, tokens: Tensor, shown: Tensor, inputs: Any) -> Tensor:
        """Token relevance ``[B, N]`` as the GAE pictures draw it; the default is :meth:`to_input`."""
        return self.to_input(tokens, inputs)

    def relevance_on(self, x: Tensor, tokens: Tensor, mode: InterpolateMode = "nearest") -> Tensor | None:
        """Token relevance ``[B, N]`` in the shape of one model input ``x`` (the Captum classes' return), or None when
        ``x`` is not this modality's input. The default repeats :meth:`to_input` over ``x``'s trailing dims."""
        return spread(self.to_input(tokens, x), x)

    def token_relevance(self, attributions: Tensor, inputs: Any, tokens: int) -> Tensor | None:
        """An attribution as token relevance ``[B, tokens]`` on the CPU (what the region metrics score), or None.

        Token relevance is kept; a map of one value per unit (``[B, U]``, or ``[B, U, D]`` summed over ``D``) gets
        0 for the prefix tokens.
        """
        found = attributions.detach().float().cpu()
        if found.dim() == 3:
            found = found.sum(dim=-1)
        if found.dim() == 2 and found.shape[1] == tokens:
            return found
        if found.dim() == 2:
            found = torch.cat([torch.zeros(found.shape[0], self.prefix_tokens), found], dim=1)
        return found if found.dim() == 2 and found.shape[1] == tokens else None

    def real_tokens(self, inputs: Any) -> Tensor | None:
        """bool ``[B, N]``: the tokens that are not padding, or None when every token is real (the default)."""
        return None

    def token_labels(self, x: Tensor, count: int) -> list[str]:
        """Display names of one sample's ``count`` tokens (``x``: the sample as shown); the default: positions."""
        return [str(i) for i in range(count)]

    def vocabulary(self, count: int) -> list[str] | None:
        """Names of a decoder's ``count`` classes when they are this modality's token ids, else None (the default)."""
        return None

    @property
    def first_token_is_input(self) -> bool:
        """Whether token 0 is a unit of the input (no CLS before it), so that ``query=0`` explains that unit rather
        than the prediction; the callback and the Captum classes warn then."""
        return False

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        """Whether the input tensor ``x`` is laid out like ``num_tokens`` tokens of this modality."""
        return False

    # --- regions --------------------------------------------------------------------------------

    def region_tokens(self, region: Any, inputs: Any) -> Tensor:
        """A declared :class:`~lightning_gae.modalities.regions.Region` as bool ``[B, N]`` over the model's tokens
        (prefix and padding never in it).

        Raises:
            ValueError: the default, for a modality that declares no regions.
        """
        raise ValueError(f"{type(self).__name__} turns no Region into tokens: override {type(self).__name__}."
                         "region_tokens(region, inputs) to score regions")

    # --- pictures -------------------------------------------------------------------------------

    def drawn_units(self, shown: Tensor, inputs: Any) -> tuple[Tensor, Tensor] | None:
        """``(valid, muted)`` bool ``[B, U]``: the units drawn, and those drawn grey and kept out of the colour scale
        (special tokens); None (the default) when every unit is drawn and scored."""
        return None

    def panels(self, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None,
               panel_px: int, alpha: float) -> tuple[np.ndarray, list[np.ndarray]]:
        """One sample ``x`` as the GAE pictures show it: its input panel, and one panel per method of ``maps``.

        ``flags``: the sample's row of :meth:`drawn_units`. The default draws :meth:`render` of each map.
        """
        return self.render(x, None, ""), [render_map(self, x, torch.from_numpy(np.asarray(m.values)), m.signed)
                                          for m in maps]

    def picture(self, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None, header: str,
                panel_px: int, alpha: float) -> np.ndarray:
        """The Images tab's ``gae_heatmaps`` picture of one sample: the input beside every method, titled ``header``."""
        shown, cells = self.panels(x, maps, flags, panel_px, alpha)
        return display.panel_row([("input", shown), *((m.method, c) for m, c in zip(maps, cells))], header)

    def set_panels(self, name: str, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None,
                   panel_px: int, alpha: float) -> tuple[np.ndarray, list[np.ndarray]]:
        """The token set ``name`` of a model with several, for the picture that shows every set; the default is
        :meth:`panels`."""
        return self.panels(x, maps, flags, panel_px, alpha)

    def evolution_cells(self, x: Tensor, maps: Sequence[MethodMap], alpha: float) -> list[np.ndarray] | None:
        """One cell per method for the ``gae_evolution`` strip of this step, or None (the default: no strip)."""
        return None

    def table_units(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None) -> tuple[str, list[str]] | None:
        """The Text tab's ``gae_tokens`` table of one sample: its first column's title and a label per drawn unit, or
        None (the default: no table)."""
        return None

    def dashboard_input(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None,
                        count: int) -> tuple[dict[str, Any], np.ndarray]:
        """The GAE tab's ``input`` of one sample: its description and the value the browser draws.

        The tab draws ``"image"`` (pixels and a patch grid), ``"text"`` (a chip per token) and
        ``"tabular"`` (a row per feature) samples; the default is a chip per token, labelled by
        :meth:`token_labels`, the prefix muted. ``count``: the model's token count.
        """
        fields = {"modality": "text", "valid": [True] * count, "muted": [i < self.prefix_tokens for i in range(count)]}
        return fields, np.array([t.encode("utf-8") for t in self.token_labels(x, count)], dtype=object)


def render_map(modality: Modality, x: Tensor, relevance: Tensor, signed: bool | None, title: str = "") -> np.ndarray:
    """``modality.render(x, relevance, title, signed=signed)``: one method's map of one sample, drawn by the method's
    ``signed`` fact.

    A modality whose ``render`` was written without the ``signed`` keyword is called without it and draws the map as
    it decides from the data, as it always did.
    """
    parameters = inspect.signature(modality.render).parameters.values()
    if any(p.name == "signed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return modality.render(x, relevance, title, signed=signed)
    return modality.render(x, relevance, title)
