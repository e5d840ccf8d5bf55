"""Relevance on a declared region as ``torchmetrics.Metric`` classes (their maths in
:mod:`lightning_gae.metrics.functional.regions`), and the region scoring ``compare`` and ``GAECallback`` share: the
means with their standard errors (:func:`score_regions`), each sample's share (:func:`held_shares`) and whether the
model uses the region (:func:`removal_check`). Region scores are computed here and nowhere else."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_gae.metrics.stderr import SampleScores
from lightning_gae.metrics.functional.health import not_better_than_random
from lightning_gae.metrics.functional.regions import (
    _region_recall_compute,
    _region_recall_update,
    _region_share_compute,
    _region_share_update,
    region_removal_drop,
    region_share,
)
from lightning_gae.modalities.tokens import Modality

__all__ = ["RegionRecall", "RegionShare", "RemovalCheck", "held_shares", "removal_check", "score_regions"]


class _RegionMetric(Metric):
    """A mean over samples of a per-sample value, kept as a sum and a count (both reduce by sum across processes,
    and the jackknife of :mod:`lightning_gae.metrics.stderr` leaves samples out of them).

    Which way is better depends on the region, not on the metric: more relevance on an evidence region, less
    on a suspect one (:attr:`lightning_gae.modalities.regions.Region.kind`); ``higher_is_better`` is None.
    """

    is_differentiable = False
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def _sum_states(self, name: str) -> None:
        self._sum_name, self._count_name = f"{name}_sum", f"{name}_count"
        self.add_state(self._sum_name, default=torch.tensor(0.0, dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state(self._count_name, default=torch.tensor(0), dist_reduce_fx="sum")

    def _add(self, values: Tensor, counted: Tensor) -> None:
        total = getattr(self, self._sum_name)
        # A NaN of a counted sample (non-finite relevance) stays in the sum, so compute() says so.
        setattr(self, self._sum_name, total + values[counted].sum().to(total))
        setattr(self, self._count_name, getattr(self, self._count_name) + int(counted.sum()))

    def plot(self, val: Tensor | None = None, ax: Any = None) -> Any:
        """Plot the value (or a sequence of values) with matplotlib; returns ``(figure, axes)``."""
        return self._plot(val, ax)


class RegionShare(_RegionMetric):
    r"""The mean over samples of the share of positive relevance mass on a region.

    Per sample, :math:`\sum_{n \in R} \max(r_n, 0) / \sum_n \max(r_n, 0)`
    (:func:`~lightning_gae.metrics.functional.region_share`); samples without positive relevance have no
    share and are not counted; a non-finite relevance makes the result NaN.

    Args:
        kwargs: ``torchmetrics.Metric`` options.

    Update:
        ``update(attributions, region_mask, valid=None)``: token relevance ``[B, N]``, the region bool ``[B, N]``
        (:func:`lightning_gae.modalities.regions.region_token_mask`), the tokens that count.

    Compute:
        a scalar in [0, 1] (NaN before any counted sample).

    >>> import torch
    >>> metric = RegionShare()
    >>> metric.update(torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.3, -1.0]]), torch.tensor([[True, False, False]] * 2))
    >>> round(metric.compute().item(), 4)       # (0.5 + 0.25) / 2
    0.375
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sum_states("region_share")

    def update(self, attributions: Tensor, region_mask: Tensor, valid: Tensor | None = None) -> None:
        self._add(*_region_share_update(attributions, region_mask, valid))

    def compute(self) -> Tensor:
        return _region_share_compute(getattr(self, self._sum_name), getattr(self, self._count_name)).float()


class RegionRecall(_RegionMetric):
    r"""The mean over samples of the recall of a region's tokens among the :math:`k` most relevant tokens.

    Per sample, :math:`|T_k \cap R| / \min(k, |R|)` with ties at the :math:`k`-th value sharing the slots
    left (:func:`~lightning_gae.metrics.functional.region_recall`); samples with an empty region are not
    counted; a non-finite relevance makes the result NaN.

    Args:
        k: how many top tokens; None: each sample's region size.
        kwargs: ``torchmetrics.Metric`` options.

    Update:
        ``update(attributions, region_mask, valid=None)`` as :class:`RegionShare`.

    Compute:
        a scalar in [0, 1] (NaN before any counted sample).
    """

    def __init__(self, k: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if k is not None and k < 1:
            raise ValueError(f"k must be >= 1 (or None for each sample's region size); got {k}")
        self.k = k
        # Named by k: a MetricCollection merges metrics whose states share names and values into one compute
        # group, and recalls at two k can be equal after the first batch.
        self._sum_states(f"region_recall_at_{'size' if k is None else k}")

    def update(self, attributions: Tensor, region_mask: Tensor, valid: Tensor | None = None) -> None:
        self._add(*_region_recall_update(attributions, region_mask, self.k, valid))

    def compute(self) -> Tensor:
        return _region_recall_compute(getattr(self, self._sum_name), getattr(self, self._count_name)).float()


def score_regions(scores: SampleScores, method: str, masks: Mapping[str, Tensor], relevance: Tensor,
                  valid: Tensor | None = None, top_k: int | None = None) -> None:
    """A batch's :class:`RegionShare` and :class:`RegionRecall` per region into ``scores``, one sample at a time (so
    that each value has its standard error), as ``region_share_<name>`` and ``region_recall_<name>`` of ``method``.

    Only the samples that hold the region count (a sample without the spurious word has no share of it), as in the
    means ``GAECallback(regions=...)`` logs.

    Args:
        scores: where the per-sample states go (:class:`~lightning_gae.metrics.stderr.SampleScores`).
        method: the row they belong to.
        masks: region name -> bool ``[B, N]`` (:func:`lightning_gae.modalities.regions.region_token_mask`).
        relevance: token relevance ``[B, N]``.
        valid: bool ``[B, N]``, the tokens that count (not padding); None: all.
        top_k: the recall's ``k``; None: each sample's region size.
    """
    for name, mask in masks.items():
        held = mask.any(dim=1).to(relevance.device)
        if not bool(held.any()):
            continue
        args = (relevance[held], mask.to(relevance.device)[held], None if valid is None else valid.to(relevance.device)[held])
        scores.add_updates(f"region_share_{name}", method, RegionShare(sync_on_compute=False), args)
        scores.add_updates(f"region_recall_{name}", method, RegionRecall(k=top_k, sync_on_compute=False), args)


def held_shares(relevance: Tensor, masks: Mapping[str, Tensor], valid: Tensor | None = None) -> dict[str, Tensor]:
    """Region name -> each sample's :func:`~lightning_gae.metrics.functional.region_share` ``[B]``, NaN for a sample
    that does not hold the region (the samples :func:`score_regions` leaves out).

    >>> import torch
    >>> held_shares(torch.tensor([[1.0, 3.0], [2.0, 2.0]]), {"word": torch.tensor([[False, True], [False, False]])})
    {'word': tensor([0.7500,    nan])}
    """
    out = {}
    for name, mask in masks.items():
        held = mask.any(dim=1).to(relevance.device)
        out[name] = region_share(relevance, mask, valid).masked_fill(~held, float("nan"))
    return out


class RemovalCheck(NamedTuple):
    """Whether the model uses a region (:func:`removal_check`): the mean drops of the explained class's probability
    over the samples that hold it, with their standard errors; NaN when fewer than two samples tell."""

    region: float
    region_stderr: float
    random: float
    random_stderr: float
    uses: bool
    """The region's drop is above random regions' beyond the standard errors."""
    held: int
    """How many samples hold the region."""


def removal_check(model: Callable[..., Any], inputs: Any, mask: Tensor, modality: Modality, seed: int) -> RemovalCheck:
    """Remove the region from the samples that hold it, and random regions of its size
    (:func:`~lightning_gae.metrics.functional.region_removal_drop`, drawn with ``seed``), and compare the drops of the
    explained class's probability (:func:`~lightning_gae.metrics.functional.health.not_better_than_random`)."""
    held = mask.any(dim=1)
    nan = float("nan")
    if not bool(held.any()):
        return RemovalCheck(nan, nan, nan, nan, False, 0)
    found = region_removal_drop(model, inputs, mask, modality, target=None, generator=torch.Generator().manual_seed(seed))
    region = found.region.detach().float().cpu()[held]
    random = found.random.detach().float().cpu()[held].mean(dim=1)
    region, random = region[torch.isfinite(region)], random[torch.isfinite(random)]
    if len(region) < 2 or len(random) < 2:
        return RemovalCheck(nan, nan, nan, nan, False, int(held.sum()))
    region_se, random_se = (float(t.std(unbiased=True) / math.sqrt(len(t))) for t in (region, random))
    uses = not not_better_than_random(float(region.mean()), region_se, float(random.mean()), random_se,
                                      higher_is_better=True)
    return RemovalCheck(float(region.mean()), region_se, float(random.mean()), random_se, uses, int(held.sum()))
