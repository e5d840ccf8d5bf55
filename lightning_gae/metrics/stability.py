"""Relevance against itself at another step, as a ``torchmetrics.Metric``; its maths in
:mod:`lightning_gae.metrics.functional.stability`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_gae.metrics._dict_metric import DictMetric
from lightning_gae.metrics.functional.stability import _explanation_stability_compute, _explanation_stability_update

__all__ = ["ExplanationStability"]


class ExplanationStability(DictMetric):
    r"""Agreement of two explanations ``[B, N]`` of the same samples: Spearman rank correlation, top-k IoU.

    Args:
        top_fraction: the share of tokens in the top-k sets, :math:`k = \mathrm{round}(fN)`.

    Update:
        ``update(first, second)``.

    Compute:
        ``{"spearman", "topk_iou", "topk_overlap"}``: means over samples (Spearman from torchmetrics;
        samples where either explanation is constant are left out of it). See
        :func:`~lightning_gae.metrics.functional.explanation_stability`.

    Example (the second ranking swaps the two most relevant tokens, which stay the top half):

    >>> import torch
    >>> metric = ExplanationStability(top_fraction=0.5)
    >>> metric.update(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[1.0, 2.0, 4.0, 3.0]]))
    >>> out = metric.compute()
    >>> round(out["spearman"].item(), 4), round(out["topk_iou"].item(), 4)
    (0.8, 1.0)
    """

    spearman_sum: Tensor
    spearman_count: Tensor
    iou_sum: Tensor
    overlap_sum: Tensor
    count: Tensor

    plot_lower_bound = -1.0
    plot_upper_bound = 1.0

    def __init__(self, top_fraction: float = 0.1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0 < top_fraction <= 1:
            raise ValueError(f"top_fraction must be in (0, 1]; got {top_fraction}")
        self.top_fraction = top_fraction
        for name in ("spearman_sum", "iou_sum", "overlap_sum"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float32), dist_reduce_fx="sum")
        for name in ("spearman_count", "count"):
            self.add_state(name, default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, first: Tensor, second: Tensor) -> None:
        rho, rho_count, iou, overlap, count = _explanation_stability_update(first, second.to(first.device), self.top_fraction)
        self.spearman_sum += rho.to(self.spearman_sum)
        self.spearman_count += int(rho_count)
        self.iou_sum += iou.to(self.iou_sum)
        self.overlap_sum += overlap.to(self.overlap_sum)
        self.count += count

    def compute(self) -> dict[str, Tensor]:
        out = _explanation_stability_compute(self.spearman_sum, self.spearman_count, self.iou_sum, self.overlap_sum, self.count)
        return {k: v.float() for k, v in out.items()}
