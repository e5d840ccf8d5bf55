"""Agreement of two explanations of the same samples (e.g. consecutive training steps)."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional import spearman_corrcoef

__all__ = ["explanation_stability"]


def _explanation_stability_update(first: Tensor, second: Tensor, top_fraction: float = 0.1) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """``(spearman_sum, spearman_count, iou_sum, overlap_sum, count)`` over samples."""
    if first.shape != second.shape or first.dim() != 2:
        raise ValueError(f"two explanations [B, N] of the same samples are needed; got {tuple(first.shape)} and {tuple(second.shape)}")
    if not 0 < top_fraction <= 1:
        raise ValueError(f"top_fraction must be in (0, 1]; got {top_fraction}")
    first, second = first.detach().float(), second.detach().float()
    # One column per sample: torchmetrics gives one correlation per column, and 0 (not nan) for a
    # constant one, which has no ranking to correlate: those samples are left out of the mean.
    rho = spearman_corrcoef(first.T, second.T).reshape(-1)
    ranked = (first.amax(dim=1) > first.amin(dim=1)) & (second.amax(dim=1) > second.amin(dim=1))
    k = max(1, round(top_fraction * first.shape[1]))
    a = torch.zeros_like(first, dtype=torch.bool).scatter_(1, first.topk(k, dim=1).indices, True)
    b = torch.zeros_like(second, dtype=torch.bool).scatter_(1, second.topk(k, dim=1).indices, True)
    shared = (a & b).sum(dim=1).float()
    iou = shared / (a | b).sum(dim=1)
    return rho[ranked].sum(), ranked.sum(), iou.sum(), (shared / k).sum(), first.shape[0]


def _explanation_stability_compute(
    spearman_sum: Tensor, spearman_count: Tensor, iou_sum: Tensor, overlap_sum: Tensor, count: Tensor | int
) -> dict[str, Tensor]:
    return {
        "spearman": spearman_sum / spearman_count,
        "topk_iou": iou_sum / count,
        "topk_overlap": overlap_sum / count,
    }


def explanation_stability(first: Tensor, second: Tensor, top_fraction: float = 0.1) -> dict[str, Tensor]:
    r"""How much two explanations ``[B, N]`` of the same samples agree.

    ``spearman``: the mean over samples of the Spearman rank correlation of their token relevance,
    :math:`\rho = \mathrm{corr}(\mathrm{rank}(a), \mathrm{rank}(b))` (torchmetrics; samples where
    either explanation is constant have no ranking and are left out; nan if all are);
    ``topk_iou``: the mean of :math:`|T_a \cap T_b| / |T_a \cup T_b|` over the two top-:math:`k`
    token sets, :math:`k = \mathrm{round}(\text{top\_fraction} \cdot N)`; ``topk_overlap``: the
    mean of :math:`|T_a \cap T_b| / k`.

    >>> import torch
    >>> a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    >>> b = torch.tensor([[1.0, 2.0, 4.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    >>> out = explanation_stability(a, b, top_fraction=0.5)
    >>> round(out["spearman"].item(), 4)   # the constant second row is left out: 1 - 6 * 2 / (4 * 15)
    0.8
    """
    return _explanation_stability_compute(*_explanation_stability_update(first, second, top_fraction))
