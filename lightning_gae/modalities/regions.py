"""Regions of interest a user declares once: where relevance should be (evidence) or should not be (suspect).

A shortcut (a watermark, a border, a spurious token) is a region of the input. :class:`Region` names one,
for any modality, and :func:`region_token_mask` turns it into the boolean mask over the model's tokens that
the region metrics (:mod:`lightning_gae.metrics.functional.regions`) score relevance against. Each modality
says which form of region it takes (:meth:`~lightning_gae.Modality.region_tokens`):

- images (:class:`~lightning_gae.ImageTokens`): a pixel mask ``[H, W]`` (every sample) or ``[B, H, W]`` (one
  per sample); a patch token is in the region when at least half of its pixels are (:data:`PATCH_SHARE`);
- text (:class:`~lightning_gae.TextTokens`): the tokens whose id is in ``token_ids``, or where
  ``predicate(input_ids)`` is True; padding never is;
- tabular data (:class:`~lightning_gae.TabularTokens`): the tokens of ``features`` (indices or names).

Prefix tokens (CLS, registers) belong to no region.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from lightning_gae.modalities.tokens import Modality

__all__ = ["PATCH_SHARE", "REGION_KINDS", "Region", "region_token_mask", "region_valid_tokens", "regions_of",
           "token_relevance"]

REGION_KINDS: tuple[str, ...] = ("evidence", "suspect")
"""``"evidence"``: relevance should sit there; ``"suspect"``: it should not (a shortcut)."""

PATCH_SHARE: float = 0.5
"""The share of a patch's pixels that must lie in an image region's mask for its token to be in the region.

A watermark aligned with the patch grid maps onto exactly its patches, and a region that covers half a patch
counts it (the rule rounds to the nearest patch, as a pixel's nearest patch decides which token it is)."""


@dataclass
class Region:
    """One region of interest, declared once and scored at every step.

    Give exactly one of ``mask`` (images), ``token_ids`` or ``predicate`` (text) and ``features`` (tabular).

    Args:
        name: how the region is called in logs and alerts (e.g. ``"watermark"``).
        kind: ``"evidence"`` (where relevance should be) or ``"suspect"`` (where it should not).
        mask: pixels ``[H, W]`` for every sample, or ``[B, H, W]`` one per sample; nonzero = in the region.
            A nested list (from a YAML file) is turned into a tensor.
        token_ids: the token ids that form the region (e.g. a spurious word's id).
        predicate: ``input_ids [B, T] -> bool [B, T]``, True for the region's tokens.
        features: feature indices, or names of ``TabularTokens.feature_names``.

    Raises:
        ValueError: naming the argument: an empty name, an unknown kind, none or several of
            ``mask``/``token_ids``/``predicate``/``features``, a mask that is not 2-d or 3-d, empty ids or
            features, a negative token id or feature index, a predicate that is not callable.

    Example:
        A spurious word of a character vocabulary and a feature of a table, as tokens (an image mask:
        :func:`region_token_mask`):

        >>> import torch
        >>> from lightning_gae import TabularTokens, TextTokens
        >>> from lightning_gae.modalities.regions import Region, region_token_mask
        >>> spurious = Region("spurious_token", "suspect", token_ids=[3])
        >>> region_token_mask(spurious, TextTokens(vocab=["_", *"abc"], pad_id=0), torch.tensor([[1, 3, 2, 0]]))
        tensor([[False,  True, False, False]])
        >>> income = Region("income", "evidence", features=["income"])
        >>> region_token_mask(income, TabularTokens(["age", "income"]), torch.rand(1, 2))   # token 0: the CLS
        tensor([[False, False,  True]])
    """

    name: str
    kind: Literal["evidence", "suspect"]
    mask: Tensor | None = None
    token_ids: Sequence[int] | None = None
    predicate: Callable[[Tensor], Tensor] | None = None
    features: Sequence[int | str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Region name must be a non-empty string (it names the logged scalars); got {self.name!r}")
        if self.kind not in REGION_KINDS:
            raise ValueError(f"Region {self.name!r}: kind={self.kind!r}; use 'evidence' (relevance should be there) "
                             "or 'suspect' (it should not: a shortcut)")
        given = [k for k in ("mask", "token_ids", "predicate", "features") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"Region {self.name!r}: give exactly one of mask= (images), token_ids= or predicate= "
                             f"(text), features= (tabular); got {given or 'none'}")
        if self.mask is not None:
            self.mask = torch.as_tensor(self.mask)
            if self.mask.dim() not in (2, 3) or self.mask.numel() == 0:
                raise ValueError(f"Region {self.name!r}: mask must be pixels [H, W] or [B, H, W]; "
                                 f"got shape {tuple(self.mask.shape)}")
        if self.token_ids is not None:
            ids = [self.token_ids] if isinstance(self.token_ids, int) else list(self.token_ids)
            if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError(f"Region {self.name!r}: token_ids must be a non-empty list of ints; got {self.token_ids!r}")
            if any(i < 0 for i in ids):
                raise ValueError(f"Region {self.name!r}: token_ids {ids} holds a negative id, which no token has; give "
                                 "the vocabulary's ids (0 and up)")
            self.token_ids = tuple(ids)
        if self.predicate is not None and not callable(self.predicate):
            raise ValueError(f"Region {self.name!r}: predicate must be callable, input_ids [B, T] -> bool [B, T]; "
                             f"got {type(self.predicate).__name__}")
        if self.features is not None:
            features = [self.features] if isinstance(self.features, (int, str)) else list(self.features)
            if not features or not all(isinstance(f, (int, str)) and not isinstance(f, bool) for f in features):
                raise ValueError(f"Region {self.name!r}: features must be a non-empty list of feature indices or names; "
                                 f"got {self.features!r}")
            if any(isinstance(f, int) and f < 0 for f in features):
                raise ValueError(f"Region {self.name!r}: features {features} holds a negative index; give feature "
                                 "indices from 0 (or names)")
            self.features = tuple(features)

    def mismatch(self, modality: Modality, wanted: str) -> ValueError:
        """The error for a region of the wrong form for ``modality``, saying the form it ``wanted``."""
        return ValueError(f"Region {self.name!r} does not fit {type(modality).__name__}: it needs {wanted}")

    @property
    def suspect(self) -> bool:
        """Whether relevance on the region is a warning sign (a shortcut) rather than the evidence wanted."""
        return self.kind == "suspect"


def region_token_mask(region: Region, modality: Modality, inputs: Any) -> Tensor:
    """The region as bool ``[B, N]`` over the model's tokens, aligned with ``explain(...).tokens``.

    Args:
        region: the declared region; its form must fit the modality (a mask for images, ids or a
            predicate for text, features for tabular data).
        modality: the model's modality; it says which form of region it takes
            (:meth:`~lightning_gae.Modality.region_tokens`).
        inputs: the batch: images ``[B, C, H, W]``; ``input_ids [B, T]`` or a mapping with ``input_ids``;
            features ``[B, F]``.

    Returns:
        bool ``[B, N]``; prefix tokens and padding are never in the region.

    Raises:
        ValueError: a region of the wrong form for the modality, a mask whose size is not the images',
            a per-sample mask of another batch size, a feature that is not one of the modality's.

    >>> import torch
    >>> from lightning_gae import ImageTokens
    >>> mask = torch.zeros(4, 4, dtype=torch.bool)
    >>> mask[:2, :2] = True                                  # the top-left 2x2 patch
    >>> mask[2, 2] = True                                    # a quarter of the bottom-right patch: below half
    >>> region_token_mask(Region("corner", "suspect", mask=mask), ImageTokens(patch_size=2), torch.zeros(1, 1, 4, 4))
    tensor([[False,  True, False, False, False]])
    """
    return modality.region_tokens(region, inputs)


def region_valid_tokens(modality: Modality, inputs: Any, tokens: int) -> Tensor | None:
    """The tokens a region's share and recall count: the modality's real tokens (no padding,
    :meth:`~lightning_gae.Modality.real_tokens`), else None (all).

    The callback and :func:`lightning_gae.compare.compare` both pass it as ``valid`` to the region metrics, so that
    they score the same tokens; ``tokens`` is the relevance's token count (a mismatch counts every token).
    """
    try:
        valid = modality.real_tokens(inputs)
    except Exception:  # noqa: BLE001 - a modality that cannot tell: every token counts
        return None
    return valid.cpu() if isinstance(valid, Tensor) and valid.shape[-1] == tokens else None


def token_relevance(modality: Modality, attributions: Tensor, inputs: Any, tokens: int) -> Tensor | None:
    """An attribution as token relevance ``[B, tokens]`` on the CPU, for the region metrics; None when it cannot be one.

    Token relevance (``explain(...).tokens``) is kept; Captum's maps become tokens as the modality says
    (:meth:`~lightning_gae.Modality.token_relevance`): an image map (``[B, C, H, W]`` or ``[B, H, W]``) its mean per
    patch, a table's ``[B, F]`` its features, a text map ``[B, T, D]`` its sum over ``D``; the prefix tokens (CLS,
    registers) get 0.
    """
    return modality.token_relevance(attributions, inputs, tokens)


def regions_of(source: Any) -> list[Region]:
    """The regions an object declares (a datamodule's ``region`` or ``regions`` attribute: one
    :class:`Region` or a sequence of them); an empty list where it declares none."""
    found = getattr(source, "regions", None) or getattr(source, "region", None)
    if found is None:
        return []
    found = list(found) if isinstance(found, (list, tuple)) else [found]
    wrong = [type(r).__name__ for r in found if not isinstance(r, Region)]
    if wrong:
        raise ValueError(f"{type(source).__name__}.region(s) holds {wrong}, not lightning_gae.modalities.regions.Region")
    return found
