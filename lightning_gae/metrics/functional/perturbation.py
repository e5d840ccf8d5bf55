"""Perturbation protocols as functions: remove input units in relevance order, watch the model.

Every protocol here runs the same engine (:mod:`lightning_gae.metrics.functional._removal`): the
units an attribution scores are ranked, and for every step of a curve the top (or bottom) share of
each sample's removable units is removed by the modality and the model scored again.

Each protocol is a ``_<name>_update`` returning sums over samples (the states of the metric class),
a ``_<name>_compute`` turning them into the value, and the public function doing both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_gae._structures import ClassTarget as Target
from lightning_gae.metrics.functional._removal import (
    PROTOCOLS,
    Order,
    Protocol,
    Score,
    check_fractions,
    check_protocol,
    perturbed_scores,
    random_attribution,
    ranked_masks,
    removal_counts,
    unit_ranking,
    unorderable,
)
from lightning_gae.modalities.tokens import Modality

__all__ = [
    "ERASER_BINS",
    "check_protocol",
    "perturbed_scores",
    "ranked_masks",
    "removal_counts",
    "PERTURBATION_FRACTIONS",
    "PROTOCOLS",
    "RISE_FRACTIONS",
    "abpc",
    "aopc",
    "comprehensiveness",
    "deletion_auc",
    "insertion_auc",
    "perturbation_auc",
    "perturbation_curve",
    "random_attribution",
    "sufficiency",
]

PERTURBATION_FRACTIONS: tuple[float, ...] = tuple(round(0.1 * k, 1) for k in range(10))
"""Chefer et al.: 0%, 10%, ..., 90% of the units removed."""
RISE_FRACTIONS: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(21))
"""Deletion / insertion: 0%, 5%, ..., 100%."""
ERASER_BINS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
"""DeYoung et al. (ERASER): the top 1, 5, 10, 20 and 50% of the tokens."""


def _perturbation_auc_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(curve_sum [S], count)``: the per-step score summed over the batch's samples."""
    curves = _perturbation_curves(forward_fn, modality, inputs, attributions, target, order, fractions, score,
                                  max_batch, protocol)
    return curves.sum(dim=0), curves.shape[0]


def _perturbation_curves(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B, S]``: each sample's own score at every step (what ``_perturbation_auc_update`` sums)."""
    return _ordered_curves(forward_fn, modality, inputs, attributions, target, (order,), fractions, score, max_batch,
                           protocol)[0]


def _ordered_curves(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target,
    orders: Sequence[Order],
    fractions: Sequence[float],
    score: Score,
    max_batch: int,
    protocol: Protocol,
) -> Tensor:
    """``[O, B, S]``: each sample's curve for every removal order, all in one pass of the engine.

    The orders' masks are stacked along the steps, so their perturbed inputs share the forward
    chunks and the unperturbed (0%) steps are scored once, from the clean forward.
    """
    check_fractions(fractions, "fractions")
    scores, removable = unit_ranking(modality, inputs, attributions)
    counts = removal_counts(fractions, removable)
    masks = torch.cat([ranked_masks(scores, removable, counts, order) for order in orders])
    curves, _ = perturbed_scores(forward_fn, modality, inputs, masks, target, score, max_batch=max_batch,
                                 protocol=protocol)
    curves = curves.reshape(len(orders), len(fractions), -1).transpose(1, 2)
    return curves.masked_fill(unorderable(scores, removable)[None, :, None], float("nan"))


def _perturbation_auc_compute(curve_sum: Tensor, count: Tensor | int, fractions: Sequence[float], scale: float = 100.0) -> Tensor:
    """Trapezoid area under the mean curve over ``fractions`` (the 0 step included), times ``scale``."""
    curve = curve_sum / count
    x = torch.tensor([float(f) for f in fractions], dtype=curve.dtype, device=curve.device)
    return torch.trapezoid(curve, x) * scale


def perturbation_curve(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """The mean score ``[S]`` after removing each fraction of units (see :func:`perturbation_auc`)."""
    curve_sum, count = _perturbation_auc_update(forward_fn, modality, inputs, attributions, target, order,
                                                fractions, score, max_batch, protocol)
    return curve_sum / count


def perturbation_auc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""Perturbation test of Chefer et al.: area under the score curve as units are removed.

    For each fraction :math:`f_s` the top :math:`\lfloor f_s n_b \rfloor` of sample :math:`b`'s
    :math:`n_b` removable units are removed, most relevant first (``order="positive"``, lower is
    better) or least relevant first (``"negative"``, higher is better), and the model scores the
    result; with :math:`c_s` the mean score over samples,

    .. math:: \mathrm{AUC} = 100 \sum_s \tfrac{1}{2}(c_s + c_{s+1})(f_{s+1} - f_s).

    Args:
        forward_fn: the model, or a callable giving logits ``[B, C]``.
        modality: which units exist and how they are removed (e.g. ``ImageTokens`` sets pixels black).
        inputs: a batch (tensor, tuple or mapping, as for ``explain``).
        attributions: token relevance ``[B, N]`` or an input-shaped map.
        target: with ``protocol="target"`` the class explained and scored (None: the unperturbed
            prediction); with ``"predicted"`` the labels the prediction is checked against.
        order: ``"positive"`` or ``"negative"``.
        fractions: increasing fractions in [0, 1]; default 0, 0.1, ..., 0.9.
        score: ``"accuracy"`` (the paper) or ``"probability"`` of the scored class.
        max_batch: at most this many perturbed inputs per forward pass.
        protocol: ``"target"`` or ``"predicted"`` (:data:`PROTOCOLS`).

    Returns:
        A scalar tensor; with the default fractions, in [0, 90].

    Example (class 1 while the features sum above 0.9; removing the top third already flips it):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[1.0, 0.5, 0.25]])
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> perturbation_curve(model, modality, x, x, fractions=(0, 1 / 3, 2 / 3))
    tensor([1., 0., 0.])
    >>> round(perturbation_auc(model, modality, x, x, fractions=(0, 1 / 3, 2 / 3)).item(), 2)
    16.67
    >>> round(perturbation_auc(model, modality, x, x, order="negative", fractions=(0, 1 / 3, 2 / 3)).item(), 2)
    66.67
    """
    curve_sum, count = _perturbation_auc_update(forward_fn, modality, inputs, attributions, target, order,
                                                fractions, score, max_batch, protocol)
    return _perturbation_auc_compute(curve_sum, count, fractions)


def _abpc_per_sample(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B]`` float64: each sample's own ABPC, the area between its negative and positive curves (×100)."""
    negative, positive = _ordered_curves(forward_fn, modality, inputs, attributions, target, ("negative", "positive"),
                                         fractions, score, max_batch, protocol).double()
    x = torch.tensor([float(f) for f in fractions], dtype=torch.float64, device=negative.device)
    return torch.trapezoid(negative - positive, x, dim=-1) * 100.0


def _abpc_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(sum, count)`` over the batch's samples of their own ABPC."""
    per_sample = _abpc_per_sample(forward_fn, modality, inputs, attributions, target, fractions, score, max_batch,
                                  protocol)
    return per_sample.sum(), per_sample.numel()


def abpc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""ABPC, the area between the perturbation curves (the figure AttnLRP, Achtibat et al. 2024, reports).

    With :math:`c^-_s` the mean score after removing the least relevant :math:`\lfloor f_s n_b
    \rfloor` units first and :math:`c^+_s` after removing the most relevant first (the curves of
    :func:`perturbation_auc` with ``order="negative"`` and ``"positive"``),

    .. math:: \mathrm{ABPC} = 100 \sum_s \tfrac{1}{2}\big[(c^-_s - c^+_s) + (c^-_{s+1} - c^+_{s+1})\big](f_{s+1} - f_s)
              = \mathrm{AUC}^- - \mathrm{AUC}^+.

    Higher is better: a faithful explanation keeps the score while its least relevant units go and
    loses it fast while its most relevant go. Both curves come from one pass of the engine over
    ``2 x (len(fractions) - 1) x B`` perturbed inputs. Arguments as in :func:`perturbation_auc`
    (``inputs`` a batch of ``B``; ``attributions`` ``[B, N]`` or input-shaped).

    Returns:
        A scalar tensor (float64), the mean over samples; with the default fractions and
        ``score="accuracy"``, in [-90, 90].

    Example (class 1 while the features sum above 0.9; the most relevant feature alone decides it):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[1.0, 0.5, 0.25]])
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> round(abpc(model, modality, x, x, fractions=(0, 1 / 3, 2 / 3)).item(), 2)  # 66.67 - 16.67
    50.0
    >>> round(abpc(model, modality, x, -x, fractions=(0, 1 / 3, 2 / 3)).item(), 2)  # relevance reversed
    -50.0
    """
    total, count = _abpc_update(forward_fn, modality, inputs, attributions, target, fractions, score, max_batch,
                                protocol)
    return _mean_compute(total, count)


# --- deletion / insertion (RISE) -------------------------------------------------------------------


def _deletion_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    insertion: bool = False,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(curve_sum [S], count)`` of the scored class's probability as units are deleted (or inserted)."""
    curves = _deletion_curves(forward_fn, modality, inputs, attributions, target, fractions, max_batch, insertion,
                              protocol)
    return curves.sum(dim=0), curves.shape[0]


def _deletion_curves(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    insertion: bool = False,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B, S]``: each sample's own probability at every step (what ``_deletion_update`` sums)."""
    check_fractions(fractions, "fractions")
    scores, removable = unit_ranking(modality, inputs, attributions)
    chosen = ranked_masks(scores, removable, removal_counts(fractions, removable), "positive")
    if insertion:
        # Inserting the top k into the blurred image = removing everything else, with blur as the fill.
        curves, _ = perturbed_scores(forward_fn, modality, inputs, removable[None] & ~chosen, target, "probability",
                                     fill=modality.blurred(inputs), max_batch=max_batch, protocol=protocol)
    else:
        curves, _ = perturbed_scores(forward_fn, modality, inputs, chosen, target, "probability", max_batch=max_batch,
                                     protocol=protocol)
    return curves.T.masked_fill(unorderable(scores, removable)[:, None], float("nan"))


def deletion_auc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""Deletion (RISE): area under the scored class's probability as the most relevant units are removed first.

    With :math:`p_s` the mean probability after removing the top :math:`\lfloor f_s n_b \rfloor`
    units the modality's way (black pixels, mask ids, feature means),
    :math:`\sum_s \tfrac{1}{2}(p_s + p_{s+1})(f_{s+1} - f_s)` over ``fractions`` (default 0, 0.05,
    ..., 1), so it lies in [0, 1]. Lower is better. Arguments as in :func:`perturbation_auc`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> # p(class 1) = sigmoid(3) at 0%, sigmoid(0) = 0.5 once "a" is gone: 0.5 * (0.953 + 0.5) / 2 + 0.5 * 0.5
    >>> round(deletion_auc(model, modality, x, x, target=1, fractions=(0, 0.5, 1)).item(), 3)
    0.613
    """
    curve_sum, count = _deletion_update(forward_fn, modality, inputs, attributions, target, fractions, max_batch,
                                        protocol=protocol)
    return _perturbation_auc_compute(curve_sum, count, fractions, scale=1.0)


def insertion_auc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""Insertion (RISE): area under the scored class's probability as the most relevant units are put back first.

    The curve starts from :meth:`~lightning_gae.Modality.blurred` (a Gaussian blur of an image;
    every removable token or feature removed otherwise), puts the top :math:`\lfloor f_s n_b
    \rfloor` units back at step :math:`s` and ends at the input; the area is the trapezoid as in
    :func:`deletion_auc`. Higher is better. Arguments as in :func:`perturbation_auc`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> # sigmoid(0) = 0.5 from nothing, sigmoid(3) = 0.953 once "a" is back: 0.5 * (0.5 + 0.953) / 2 + 0.5 * 0.953
    >>> round(insertion_auc(model, modality, x, x, target=1, fractions=(0, 0.5, 1)).item(), 3)
    0.839
    """
    curve_sum, count = _deletion_update(forward_fn, modality, inputs, attributions, target, fractions, max_batch,
                                        insertion=True, protocol=protocol)
    return _perturbation_auc_compute(curve_sum, count, fractions, scale=1.0)


# --- ERASER: comprehensiveness, sufficiency; AOPC ------------------------------------------------


def _eraser_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    keep_only: bool = False,
    with_zero: bool = False,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(sum, count)`` over samples of the mean probability drop over ``bins``."""
    per_sample = _eraser_per_sample(forward_fn, modality, inputs, attributions, target, bins, keep_only, with_zero,
                                    max_batch, protocol)
    return per_sample.sum(), per_sample.numel()


def _eraser_per_sample(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    keep_only: bool = False,
    with_zero: bool = False,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B]``: each sample's mean probability drop over ``bins`` (what ``_eraser_update`` sums)."""
    check_fractions(bins, "bins")
    scores, removable = unit_ranking(modality, inputs, attributions)
    top = ranked_masks(scores, removable, removal_counts(bins, removable, at_least_one=True), "positive")
    masks = removable[None] & ~top if keep_only else top
    probs, clean = perturbed_scores(forward_fn, modality, inputs, masks, target, "probability", max_batch=max_batch,
                                    protocol=protocol)
    drops = clean[None] - probs
    # AOPC's k = 0 term (nothing removed) is a drop of exactly 0: it only adds to the denominator.
    per_sample = drops.sum(dim=0) / (len(bins) + 1) if with_zero else drops.mean(dim=0)
    return per_sample.masked_fill(unorderable(scores, removable), float("nan"))


def _mean_compute(total: Tensor, count: Tensor | int) -> Tensor:
    return total / count


def comprehensiveness(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""ERASER comprehensiveness: :math:`\frac{1}{|K|}\sum_{k \in K} p(x) - p(x \setminus r_k)`, higher is better.

    :math:`r_k` is the top :math:`k` share of the removable units (at least one unit), ``bins``
    :math:`K` default to 1, 5, 10, 20 and 50%; :math:`p` is the scored class's probability.
    Arguments as in :func:`perturbation_auc`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> round(comprehensiveness(model, modality, x, x, target=1, bins=(0.5,)).item(), 3)  # sigmoid(3) - sigmoid(0)
    0.453
    """
    total, count = _eraser_update(forward_fn, modality, inputs, attributions, target, bins, max_batch=max_batch,
                                  protocol=protocol)
    return _mean_compute(total, count)


def sufficiency(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""ERASER sufficiency: :math:`\frac{1}{|K|}\sum_{k \in K} p(x) - p(r_k)`, only the top units kept; lower is better.

    Arguments as in :func:`comprehensiveness`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> sufficiency(model, modality, x, x, target=1, bins=(0.5,)).item()  # "a" alone keeps all of it
    0.0
    """
    total, count = _eraser_update(forward_fn, modality, inputs, attributions, target, bins, keep_only=True,
                                  max_batch=max_batch, protocol=protocol)
    return _mean_compute(total, count)


def aopc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""AOPC (Samek et al.), most relevant first: :math:`\frac{1}{|K|+1}\sum_{k \in \{0\} \cup K} p(x) - p(x \setminus r_k)`.

    The average over the removal steps of the probability drop, the unperturbed step included, on
    ERASER's bins; equal to :func:`comprehensiveness` times :math:`|K| / (|K| + 1)`. Higher is better.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> round(aopc(model, modality, x, x, target=1, bins=(0.5,)).item(), 4)  # (0 + 0.453) / 2
    0.2263
    """
    total, count = _eraser_update(forward_fn, modality, inputs, attributions, target, bins, with_zero=True,
                                  max_batch=max_batch, protocol=protocol)
    return _mean_compute(total, count)
