"""Source relevance against known source-target alignments, as a ``torchmetrics.Metric``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_gae.metrics.functional.alignment import _alignment_accuracy_compute, _alignment_accuracy_update

__all__ = ["AlignmentAccuracy"]


class AlignmentAccuracy(Metric):
    r"""Share of target tokens whose most relevant source token is the one they are aligned with.

    A (sample, target position) pair with a known alignment is a hit when the aligned source
    token's relevance is strictly above every other source token's (ties are misses); the result
    is hits / pairs over everything seen (:func:`lightning_gae.metrics.functional.alignment_accuracy`).

    Args:
        ignore_index: the alignment value of target tokens that copy no source token (EOS, padding).

    Update:
        ``update(relevance, alignment, valid=None)``: ``relevance [B, S]`` with ``alignment [B]``,
        or ``[B, T, S]`` with ``[B, T]``; ``valid [B, S]`` the source positions that can win.

    Compute:
        A scalar in [0, 1] (NaN before any counted pair).

    Example:
        >>> import torch
        >>> metric = AlignmentAccuracy()
        >>> metric.update(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([1]))
        >>> metric.update(torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.1]]), torch.tensor([2, -1]))
        >>> metric.compute()
        tensor(0.5000)
    """

    hits: Tensor
    count: Tensor

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, ignore_index: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ignore_index = ignore_index
        self.add_state("hits", default=torch.tensor(0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, relevance: Tensor, alignment: Tensor, valid: Tensor | None = None) -> None:
        hits, count = _alignment_accuracy_update(relevance, alignment, valid, self.ignore_index)
        self.hits += hits.to(self.hits.device)
        self.count += count.to(self.count.device)

    def compute(self) -> Tensor:
        return _alignment_accuracy_compute(self.hits, self.count)
