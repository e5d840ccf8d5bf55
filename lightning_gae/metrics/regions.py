"""Relevance on a declared region as ``torchmetrics.Metric`` classes (their maths in
:mod:`lightning_gae.metrics.functional.regions`), and the region scoring ``compare`` and ``GAECallback`` share: the
means with their standard errors (:func:`score_regions`), each sample's share (:func:`held_shares`) beside the share
chance puts there (:func:`chance_shares`, :func:`excess_over_chance`, :func:`beyond_chance`) and whether the model
uses the region (:func:`removal_check`). Region scores are computed here and nowhere else.

Every share is a share of the *positive* part of the relevance (:func:`~lightning_gae.metrics.functional.region_share`):
signed methods (AttnLRP, attention Grad-CAM, Captum's gradients) put negative relevance on evidence against the
class, which is no mass on anything, so every share lies in [0, 1] whatever the method."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_gae.metrics.stderr import SampleScores
from lightning_gae.metrics.functional.regions import (
    _region_recall_compute,
    _region_recall_update,
    _region_share_compute,
    _region_share_update,
    region_removal_drop,
    region_share,
)
from lightning_gae.modalities.tokens import Modality

__all__ = ["MIN_SAMPLES", "REMOVAL_MIN_DROP", "STDERR_MULTIPLE", "ChanceExcess", "RegionRecall", "RegionShare",
           "RemovalCheck", "beyond_chance", "chance_shares", "excess_over_chance", "held_shares", "removal_check",
           "score_regions"]

STDERR_MULTIPLE: float = 2.0
"""How many standard errors a mean difference must exceed to count (about a 95% interval): a region's excess over
chance (:func:`beyond_chance`) and the removal check's drop over random regions (:class:`RemovalCheck`)."""

MIN_SAMPLES: int = 3
"""The fewest samples holding a region that a verdict is drawn from (an alert, the removal check): fewer cannot
estimate a standard error worth the name."""

REMOVAL_MIN_DROP: float = 0.01
"""The smallest excess drop of the explained class's probability (region removed, over random regions of its size)
that says the model uses a region: a change below one point of probability is no use of it, however sure."""


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


def chance_shares(region_mask: Tensor, valid: Tensor | None = None) -> Tensor:
    r"""The share of each sample's relevance that chance puts on the region: :math:`|R \cap V| / |V|`, with
    :math:`V` the sample's valid tokens (not padding), so the region's size and the sample's length both count.

    It is the exact expectation of the share of uniform random relevance (the ``random`` method's i.i.d. values:
    by symmetry each valid token holds :math:`1/|V|` of the mass on average), without the noise of one draw.
    NaN for a sample that does not hold the region.

    >>> import torch
    >>> region = torch.tensor([[False, True, False, False], [False, True, True, False], [False] * 4])
    >>> chance_shares(region, valid=torch.tensor([[True] * 4, [True, True, True, False], [True] * 4]))
    tensor([0.2500, 0.6667,    nan])
    """
    region = region_mask.bool()
    valid = torch.ones_like(region) if valid is None else valid.to(region.device).bool()
    on = (region & valid).sum(dim=1).float()
    chance = on / valid.sum(dim=1).clamp(min=1).float()
    return chance.masked_fill(on == 0, float("nan"))


class ChanceExcess(NamedTuple):
    """A method's share of relevance on a region beside chance's, over the samples that hold it and have a share
    (:func:`excess_over_chance`); NaN where fewer than two samples count."""

    share: float
    """The mean share."""
    chance: float
    """The mean share chance puts there (:func:`chance_shares`)."""
    excess: float
    """The mean of each sample's share minus its chance share."""
    stderr: float
    """The standard error of ``excess`` over the samples."""
    samples: int
    """How many samples count."""


def excess_over_chance(shares: Tensor, chance: Tensor) -> ChanceExcess:
    """Each sample's share minus the share chance puts on the region, as a mean with its standard error over the
    samples where both are defined (the share is NaN where the relevance has no positive mass).

    >>> import torch
    >>> found = excess_over_chance(torch.tensor([0.30, 0.20, 0.25, float("nan")]), torch.tensor([0.05] * 4))
    >>> round(found.share, 3), round(found.excess, 3), round(found.stderr, 4), found.samples
    (0.25, 0.2, 0.0289, 3)
    """
    counted = torch.isfinite(shares) & torch.isfinite(chance)
    share, floor = shares[counted].double(), chance[counted].double()
    nan = float("nan")
    if len(share) == 0:
        return ChanceExcess(nan, nan, nan, nan, 0)
    difference = share - floor
    stderr = float(difference.std(unbiased=True) / math.sqrt(len(difference))) if len(difference) > 1 else nan
    return ChanceExcess(float(share.mean()), float(floor.mean()), float(difference.mean()), stderr, len(difference))


def beyond_chance(found: ChanceExcess, suspect: bool, margin: float, multiple: float = STDERR_MULTIPLE,
                  min_samples: int = MIN_SAMPLES) -> bool:
    r"""Whether a share differs from chance the way that raises an alert: for a suspect region (a shortcut) more
    relevance than chance puts there, for an evidence region less, by more than ``multiple`` standard errors *and*
    by more than ``margin`` (share points), on at least ``min_samples`` samples:

    .. math:: s\,\bar e > \max(\mathrm{multiple} \cdot \mathrm{se}(\bar e),\ \mathrm{margin}),
        \qquad s = +1 \text{ (suspect)},\ -1 \text{ (evidence)}

    The standard error keeps noise from alerting; the margin keeps a real but negligible lean from alerting.

    >>> beyond_chance(ChanceExcess(0.25, 0.05, 0.20, 0.03, 8), suspect=True, margin=0.05)
    True
    >>> beyond_chance(ChanceExcess(0.08, 0.05, 0.03, 0.005, 8), suspect=True, margin=0.05)   # sure, but negligible
    False
    >>> beyond_chance(ChanceExcess(1.0, 1.0, 0.0, 0.0, 8), suspect=True, margin=0.05)        # the whole input
    False
    """
    if found.samples < min_samples or not math.isfinite(found.excess) or not math.isfinite(found.stderr):
        return False
    signed = found.excess if suspect else -found.excess
    return signed > multiple * found.stderr and signed > margin


class RemovalCheck(NamedTuple):
    """Whether the model uses a region (:func:`removal_check`): the mean drops of the explained class's probability
    over the samples that hold it, with their standard errors, and the interval of their difference; NaN where fewer
    than two samples tell."""

    region: float
    region_stderr: float
    random: float
    random_stderr: float
    uses: bool
    """The region's drop exceeds random regions' by more than ``REMOVAL_MIN_DROP``, with the whole interval
    above 0, on at least ``MIN_SAMPLES`` samples."""
    held: int
    """How many samples hold the region."""
    measured: int = 0
    """How many samples the drops were measured on (those of ``held`` whose region has a removable token)."""
    low: float = float("nan")
    """The low end of the interval of the mean excess drop (region minus random regions, per sample), ``excess`` ±
    ``STDERR_MULTIPLE`` standard errors; ``low`` and ``high`` its ends."""
    high: float = float("nan")

    @property
    def excess(self) -> float:
        """The mean excess drop, the region's over random regions' of its size."""
        return (self.low + self.high) / 2

    @property
    def tells(self) -> bool:
        """Enough samples to tell, and an interval that does not cover 0."""
        return self.measured >= MIN_SAMPLES and math.isfinite(self.low) and (self.low > 0 or self.high < 0)

    @classmethod
    def from_drops(cls, region: Tensor, random: Tensor, held: int) -> RemovalCheck:
        """The check from the per-sample drops of the samples that hold the region: ``region [n]`` and the mean of
        the random regions' ``random [n]`` (:func:`~lightning_gae.metrics.functional.region_removal_drop`)."""
        region, random = region.detach().double().cpu(), random.detach().double().cpu()
        finite = torch.isfinite(region) & torch.isfinite(random)
        region, random = region[finite], random[finite]
        nan = float("nan")
        if len(region) < 2:
            return cls(nan, nan, nan, nan, False, held, len(region))
        region_se, random_se, excess_se = (float(t.std(unbiased=True) / math.sqrt(len(t)))
                                           for t in (region, random, region - random))
        excess = float((region - random).mean())
        low, high = excess - STDERR_MULTIPLE * excess_se, excess + STDERR_MULTIPLE * excess_se
        uses = len(region) >= MIN_SAMPLES and low > 0 and excess > REMOVAL_MIN_DROP
        return cls(float(region.mean()), region_se, float(random.mean()), random_se, uses, held, len(region), low, high)


def removal_check(model: Callable[..., Any], inputs: Any, mask: Tensor, modality: Modality, seed: int) -> RemovalCheck:
    """Remove the region from the samples that hold it, and random regions of its size
    (:func:`~lightning_gae.metrics.functional.region_removal_drop`, drawn with ``seed``), and compare the drops of the
    explained class's probability sample by sample (:meth:`RemovalCheck.from_drops`)."""
    held = mask.any(dim=1)
    nan = float("nan")
    if not bool(held.any()):
        return RemovalCheck(nan, nan, nan, nan, False, 0)
    found = region_removal_drop(model, inputs, mask, modality, target=None, generator=torch.Generator().manual_seed(seed))
    held = held.to(found.region.device)
    return RemovalCheck.from_drops(found.region[held], found.random[held].mean(dim=1), int(held.sum()))
