r"""Relevance on a declared region (a watermark, a spurious token, a set of features), as functions.

Three questions about one region :math:`R` (a bool mask over the model's tokens, see
:func:`lightning_gae.modalities.regions.region_token_mask`) and one explanation:

- how much of the relevance sits on it (:func:`region_share`);
- whether its tokens are among the most relevant (:func:`region_recall`);
- whether the model really uses it: the drop of the explained class's probability when the region is
  removed, against removing random regions of the same size (:func:`region_removal_drop`).

The first two are plausibility (where the explanation points); the third is about the model, whatever
the explanation says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lightning_gae.metrics.functional._removal import Target, perturbed_scores
from lightning_gae.modalities.tokens import Modality

__all__ = ["RegionRemoval", "region_recall", "region_removal_drop", "region_share"]


def _check(relevance: Tensor, region_mask: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(relevance float32, region & valid, valid)``, all ``[B, N]`` on the relevance's device, or raise."""
    if relevance.dim() != 2:
        raise ValueError(f"relevance must be token relevance [B, N]; got shape {tuple(relevance.shape)}")
    if region_mask.shape != relevance.shape:
        raise ValueError(f"region_mask {tuple(region_mask.shape)} must have the shape of relevance "
                         f"{tuple(relevance.shape)}: one bool per token (lightning_gae.modalities.regions.region_token_mask)")
    if valid is None:
        valid = torch.ones_like(region_mask, dtype=torch.bool, device=relevance.device)
    elif valid.shape != relevance.shape:
        raise ValueError(f"valid {tuple(valid.shape)} must have the shape of relevance {tuple(relevance.shape)}")
    valid = valid.to(relevance.device).bool()
    return relevance.detach().float(), region_mask.to(relevance.device).bool() & valid, valid


# --- share of the relevance mass ------------------------------------------------------------------


def _region_share_update(relevance: Tensor, region_mask: Tensor, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(shares [B], counted [B])``: each sample's share, and which samples a mean over samples counts.

    A sample without positive relevance has no share (NaN, not counted); a sample with a non-finite
    relevance is NaN and counted, so that a mean over samples turns NaN instead of hiding it.
    """
    relevance, region, valid = _check(relevance, region_mask, valid)
    finite = (torch.isfinite(relevance) | ~valid).all(dim=1)
    positive = relevance.clamp(min=0).masked_fill(~valid, 0.0)
    total = positive.sum(dim=1)
    on_region = positive.masked_fill(~region, 0.0).sum(dim=1)
    has_mass = total > 0
    shares = torch.where(finite & has_mass, on_region / torch.where(has_mass, total, 1.0), torch.nan)
    return shares, ~finite | has_mass


def _region_share_compute(share_sum: Tensor, count: Tensor | int) -> Tensor:
    return share_sum / count if count else torch.tensor(float("nan"), device=share_sum.device)


def region_share(relevance: Tensor, region_mask: Tensor, valid: Tensor | None = None) -> Tensor:
    r"""The share of each sample's positive relevance mass that lies on the region.

    .. math:: \mathrm{share} = \frac{\sum_{n \in R} \max(r_n, 0)}{\sum_n \max(r_n, 0)}

    Negative relevance (evidence against the class, in signed methods such as AttnLRP's) is no mass *on*
    anything, so it counts as 0 in both sums; the share is in [0, 1]. A random relevance puts about
    :math:`|R| / N` on the region: that is the floor a method is compared with.

    Args:
        relevance: token relevance ``[B, N]`` (``explain(...).tokens``).
        region_mask: bool ``[B, N]``, True for the region's tokens.
        valid: bool ``[B, N]``, the tokens that count (e.g. not padding); default all.

    Returns:
        float32 ``[B]``; 0 for an empty region. NaN where the share is undefined: the sample has no positive
        relevance (0 / 0: e.g. GAE's relevance vanished), or a valid token's relevance is NaN or infinite.

    >>> import torch
    >>> relevance = torch.tensor([[0.6, 0.2, -0.5, 0.2], [0.0, 0.0, 0.0, 0.0]])
    >>> region_share(relevance, torch.tensor([[True, False, True, False]] * 2))
    tensor([0.6000,    nan])
    """
    shares, counted = _region_share_update(relevance, region_mask, valid)
    return shares.masked_fill(~counted, torch.nan)


# --- recall among the top k ------------------------------------------------------------------------


def _region_recall_update(relevance: Tensor, region_mask: Tensor, k: int | None = None,
                          valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(recalls [B], counted [B])``: an empty region is NaN and not counted; a non-finite row NaN and counted."""
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1 (or None for the region's size); got {k}")
    relevance, region, valid = _check(relevance, region_mask, valid)
    finite = (torch.isfinite(relevance) | ~valid).all(dim=1)
    size = region.sum(dim=1)
    available = valid.sum(dim=1)
    top = (size if k is None else torch.full_like(size, k)).clamp(max=available)
    # The k-th largest valid value: every token above it is in the top k, the tokens equal to it share the
    # slots left, each with the same chance (the expectation over a random order of the ties).
    ranked = relevance.masked_fill(~valid, -torch.inf).sort(dim=1, descending=True).values
    threshold = ranked.gather(1, (top - 1).clamp(min=0)[:, None])
    above = valid & (relevance > threshold)
    tied = valid & (relevance == threshold)
    slots = (top - above.sum(dim=1)).float()
    tied_on_region = (tied & region).sum(dim=1).float()
    hits = (above & region).sum(dim=1).float() + slots * tied_on_region / tied.sum(dim=1).clamp(min=1)
    counted = size > 0
    recalls = hits / torch.minimum(top, size).clamp(min=1)
    recalls = torch.where(counted & finite, recalls, torch.nan)
    return recalls, counted


def _region_recall_compute(recall_sum: Tensor, count: Tensor | int) -> Tensor:
    return recall_sum / count if count else torch.tensor(float("nan"), device=recall_sum.device)


def region_recall(relevance: Tensor, region_mask: Tensor, k: int | None = None, valid: Tensor | None = None) -> Tensor:
    r"""How many of the region's tokens are among the :math:`k` most relevant tokens, per sample.

    With :math:`T_k` the :math:`k` most relevant valid tokens,

    .. math:: \mathrm{recall@}k = \frac{|T_k \cap R|}{\min(k, |R|)}

    so 1 means the region fills as much of the top :math:`k` as it can (for :math:`k = |R|`, the
    default, the top :math:`|R|` tokens are the region's). Ranks are by signed relevance. Ties at the
    :math:`k`-th value are shared: the tied tokens split the slots left evenly, which is the expected
    recall over a random order of the ties (so a flat relevance scores the random floor :math:`k/N`-ish,
    not whatever an index order would give).

    Args:
        relevance: token relevance ``[B, N]``.
        region_mask: bool ``[B, N]``, True for the region's tokens.
        k: how many top tokens; None: the region's size. Capped at the number of valid tokens.
        valid: bool ``[B, N]``, the tokens that are ranked (e.g. not padding); default all.

    Returns:
        float32 ``[B]`` in [0, 1]; NaN for an empty region, and where a valid relevance is NaN or infinite.

    >>> import torch
    >>> relevance = torch.tensor([[0.9, 0.5, 0.5, 0.1]])
    >>> region = torch.tensor([[False, True, False, False]])
    >>> region_recall(relevance, region, k=1), region_recall(relevance, region, k=2)   # ties share the 2nd slot
    (tensor([0.]), tensor([0.5000]))
    """
    recalls, counted = _region_recall_update(relevance, region_mask, k, valid)
    return recalls.masked_fill(~counted, torch.nan)


# --- does the model use the region? ------------------------------------------------------------------


class RegionRemoval(NamedTuple):
    """The drops of the explained class's probability when a region is removed (:func:`region_removal_drop`)."""

    region: Tensor
    """``[B]`` the drop when the region is removed (NaN for an empty region)."""
    random: Tensor
    """``[B, num_random]`` the drop for each random region of the same size."""

    @property
    def excess(self) -> Tensor:
        """``[B]`` the region's drop minus the mean random drop: above 0 when the model uses the region more
        than a random place of the same size."""
        return self.region - self.random.mean(dim=1)


def _removable_tokens(modality: Modality, inputs: Any) -> Tensor:
    """bool ``[B, N]``: the tokens whose input the modality can remove (no prefix, special or padded token)."""
    return modality.removable_tokens(inputs)


def _token_units(modality: Modality, tokens: Tensor, inputs: Any) -> Tensor:
    """Token masks ``[S, B, N]`` as the modality's removal units ``[S, B, U]`` (:meth:`~lightning_gae.Modality.token_units`)."""
    return modality.token_units(tokens, inputs)


def region_removal_drop(
    model: Callable[..., Any],
    inputs: Any,
    region_mask: Tensor,
    modality: Modality,
    target: Target = None,
    num_random: int = 8,
    generator: torch.Generator | None = None,
    max_batch: int = 256,
) -> RegionRemoval:
    r"""Whether the model uses a region: the drop of the explained class's probability when the region is
    removed, beside the drops when random regions of the same size are.

    With :math:`p(x)` the probability of the explained class (the perturbation metrics' score), :math:`x_{\setminus R}`
    the input with the region's tokens removed by the modality (black patches or pixels, mask ids, feature
    means) and :math:`S_1, \dots, S_m` random sets of :math:`|R|` removable tokens (drawn uniformly, the
    region's own tokens included, independently per sample),

    .. math:: \mathrm{drop}_R = p(x) - p(x_{\setminus R}), \qquad \mathrm{drop}_{S_j} = p(x) - p(x_{\setminus S_j}).

    A model that uses the region loses more from removing it than from removing random places of the
    same size: ``RegionRemoval.excess`` above 0, beyond its standard error over samples
    (:func:`lightning_gae.metrics.functional.health.not_better_than_random` with ``higher_is_better=True``).
    Only removable tokens count (patch tokens; real, non-special text tokens; features): the region is
    restricted to them.

    Args:
        model: the model (put in eval mode, no gradients) or a callable returning logits ``[B, C]``;
            called as ``explain`` calls it.
        inputs: one batch of ``B`` samples.
        region_mask: bool ``[B, N]`` over the model's tokens (:func:`~lightning_gae.modalities.regions.region_token_mask`).
        modality: removes the tokens (``ImageTokens``, ``TextTokens``, ``TabularTokens`` with ``means``).
        target: the class explained (None: each sample's prediction, an int, or one class per sample).
        num_random: how many random regions per sample.
        generator: the random source of the random regions (seed it for the same regions every time).
        max_batch: at most this many perturbed inputs per forward pass.

    Returns:
        :class:`RegionRemoval`: ``region [B]`` and ``random [B, num_random]``; both NaN for a sample whose
        region has no removable token.

    Example (the model's logit for class 1 is feature ``"a"``; ``"c"`` is ignored):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), 4 * x[:, 0]], dim=1)
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> x = torch.ones(1, 3)
    >>> used = region_removal_drop(model, x, torch.tensor([[True, False, False]]), modality, target=1,
    ...                            generator=torch.Generator().manual_seed(0))
    >>> unused = region_removal_drop(model, x, torch.tensor([[False, False, True]]), modality, target=1,
    ...                              generator=torch.Generator().manual_seed(0))
    >>> round(used.region.item(), 3), round(unused.region.item(), 3)      # sigmoid(4) - sigmoid(0), 0
    (0.482, 0.0)
    >>> bool(used.excess > 0), bool(unused.excess < 0)
    (True, True)
    """
    if num_random < 1:
        raise ValueError(f"num_random must be >= 1 (random regions to compare the region with); got {num_random}")
    removable = _removable_tokens(modality, inputs)
    if region_mask.shape != removable.shape:
        raise ValueError(f"region_mask {tuple(region_mask.shape)} does not fit the {tuple(removable.shape)} tokens "
                         f"{type(modality).__name__} makes of these inputs (lightning_gae.modalities.regions.region_token_mask)")
    device = removable.device
    region = region_mask.to(device).bool() & removable
    size = region.sum(dim=1)
    # Uniform random sets of `size` removable tokens: the `size` smallest of uniform keys, drawn on the CPU
    # so that a seed gives the same regions on every device.
    keys = torch.rand((num_random, *region.shape), generator=generator).to(device).masked_fill(~removable, torch.inf)
    ranks = keys.argsort(dim=2).argsort(dim=2)
    random = (ranks < size[None, :, None]) & removable
    masks = _token_units(modality, torch.cat([region[None], random]), inputs)
    scores, clean = perturbed_scores(model, modality, inputs, masks, target, score="probability", max_batch=max_batch)
    drops = (clean[None] - scores).float()
    empty = (size == 0).to(drops.device)
    return RegionRemoval(drops[0].masked_fill(empty, torch.nan), drops[1:].T.masked_fill(empty[:, None], torch.nan))
