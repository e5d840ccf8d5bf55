r"""Every metric value with its standard error over samples: the one scoring loop ``compare`` and ``GAECallback`` share.

A metric is updated with the samples' states kept apart (one state dict per sample), and
:func:`value_and_stderr` turns them into the value over all samples and its jackknife standard
error. :class:`SampleScores` runs that for many (metric, method) pairs: perturbation metrics give
every sample's states from one batched pass (``per_sample_states``), the others are updated with
one sample at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["SampleScores", "Score", "per_sample_states", "value_and_stderr"]


def per_sample_states(metric: Metric, update: Callable[[int], None], count: int) -> list[dict[str, Tensor]]:
    """The metric's states after ``update(i)`` alone, for each sample ``i`` of ``count``."""
    states = []
    for i in range(count):
        metric.reset()
        update(i)
        # Every state of a metric scored per sample is a tensor (sum-reduced); Metric declares lists too.
        states.append({name: value.detach().clone() for name, value in metric.metric_state.items()})  # type: ignore[union-attr]
    return states


def value_and_stderr(metric: Metric, samples: Sequence[Mapping[str, Tensor]],
                     groups: Sequence[int] | Tensor | None = None) -> tuple[dict[str, float], dict[str, float]]:
    r"""The metric over all samples and its jackknife standard error, from one state per sample.

    Every state of the library's metrics is a sum over samples (that is how they sync across
    processes), so the states of all samples but ``i`` are the total minus sample ``i``'s, and the
    metric's own ``compute`` gives each leave-one-out value :math:`\theta_{(i)}`. The jackknife
    :math:`\mathrm{se}^2 = \frac{n - 1}{n} \sum_i (\theta_{(i)} - \bar\theta)^2` is exactly
    :math:`s / \sqrt{n}` for a mean over samples (the perturbation AUCs, AP, AUPRC) and also
    covers ratios over pooled counts (pixel accuracy, mIoU). Returns ``{key: value}`` and
    ``{key: se}`` (key ``""`` for a scalar metric).

    ``groups`` (one label per sample) makes it a delete-a-group jackknife: samples that are not independent
    of each other (the answer tokens of one prompt) share a label and are left out together, so the error
    is over the :math:`G` groups, :math:`\mathrm{se}^2 = \frac{G - 1}{G} \sum_g (\theta_{(g)} - \bar\theta)^2`,
    and the value is still over all samples. With every sample its own group it is the plain jackknife.
    """
    def computed(states: Mapping[str, Tensor]) -> dict[str, float]:
        for name, value in states.items():
            setattr(metric, name, value)
        # The class's own compute, not the instance's wrapper: that one syncs and caches.
        out = type(metric).compute(metric)
        return {key: float(v) for key, v in out.items()} if isinstance(out, dict) else {"": float(out)}

    n = len(samples)
    label = None if groups is None else torch.as_tensor(groups).flatten().cpu()
    if label is not None and label.numel() != n:
        raise ValueError(f"value_and_stderr: groups has {label.numel()} labels for {n} samples; pass one per sample")
    if label is not None and len(label.unique()) == n:
        label = None  # every sample its own group: the plain jackknife
    per_sample_values = getattr(metric, "per_sample_values", None)
    if per_sample_values is not None and label is None:
        # A mean over samples: the jackknife reduces to the own values' standard deviation over sqrt(n),
        # without a compute() per left-out sample.
        own = per_sample_values({name: torch.stack([s[name] for s in samples]) for name in samples[0]})
        spread = float(own.std()) / math.sqrt(n) if n > 1 else math.nan
        return {"": float(own.mean())}, {"": spread}
    stacked = {name: torch.stack([s[name] for s in samples]) for name in samples[0]}
    total = {name: value.sum(dim=0) for name, value in stacked.items()}
    value = computed(total)
    if label is None:
        left_out = [{name: total[name] - s[name] for name in total} for s in samples]
    else:
        left_out = [{name: total[name] - stacked[name][label == g].sum(dim=0) for name in total} for g in label.unique()]
    leave_out = [computed(states) for states in left_out]
    g = len(leave_out)
    stderr = {}
    for key in value:
        others = torch.tensor([v[key] for v in leave_out], dtype=torch.float64)
        stderr[key] = math.sqrt((g - 1) / g * float(((others - others.mean()) ** 2).sum())) if g > 1 else math.nan
    metric.reset()
    return value, stderr


class Score(NamedTuple):
    """One metric value over samples."""

    value: float
    stderr: float
    """The jackknife standard error (NaN for one sample)."""
    count: int  # type: ignore[assignment]  # the number of samples, a field that shadows tuple.count
    higher_is_better: bool


class SampleScores:
    """Per-sample states of metrics x methods, gathered batch by batch, then each value with its standard error.

    Example:
        Class 1 while the features sum above 0.9, each sample's features as their own relevance (the second sample
        keeps class 1 after its first removal, so the AUCs differ):

        >>> import torch
        >>> from lightning_gae import TabularTokens
        >>> from lightning_gae.metrics import PerturbationAUC
        >>> from lightning_gae.metrics.stderr import SampleScores
        >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
        >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
        >>> metric = PerturbationAUC(model, modality, order="positive", fractions=(0, 1 / 3, 2 / 3))
        >>> scores = SampleScores()
        >>> x = torch.tensor([[1.0, 0.5, 0.25], [0.5, 0.5, 0.5]])   # one batch; the next ones are added alike
        >>> scores.add_perturbation("positive_perturbation_auc", "features", metric, x, x, torch.tensor([1, 1]))
        >>> values, errors = scores.results()[("positive_perturbation_auc", "features")]
        >>> round(values[""], 2), round(errors[""], 2)     # the mean of 16.67 and 50, its standard error
        (33.33, 16.67)
    """

    def __init__(self) -> None:
        self._states: dict[tuple[str, str], list[dict[str, Tensor]]] = {}
        self._metrics: dict[tuple[str, str], Metric] = {}
        self.groups: Tensor | None = None
        """One label per sample, in the order added (or gathered), for samples that are not independent (the
        answer tokens of one prompt share a label): standard errors leave each group out whole."""

    def add_perturbation(self, name: str, method: str, metric: Metric, inputs: Any, attributions: Tensor,
                         target: Any) -> None:
        """A perturbation metric's states of every sample of the batch, from one batched pass (``per_sample_states``)."""
        # A perturbation metric's own method, which Metric does not declare.
        rows = metric.per_sample_states(inputs, attributions, target)  # type: ignore[operator]
        count = attributions.shape[0]
        self._keep(name, method, metric, [{state: value[i] for state, value in rows.items()} for i in range(count)])

    def add_updates(self, name: str, method: str, metric: Metric, args: Sequence[Any]) -> None:
        """``metric.update(*args)`` one sample at a time: every tensor of ``args`` has the batch in dim 0."""
        count = next(a for a in args if isinstance(a, Tensor)).shape[0]

        def one(i: int) -> None:
            metric.update(*(a[i : i + 1] if isinstance(a, Tensor) else a for a in args))

        self._keep(name, method, metric, per_sample_states(metric, one, count))

    def _keep(self, name: str, method: str, metric: Metric, states: list[dict[str, Tensor]]) -> None:
        self._metrics[(name, method)] = metric
        self._states.setdefault((name, method), []).extend(states)

    def __bool__(self) -> bool:
        return bool(self._states)

    def rows(self) -> dict[tuple[str, str], dict[str, Tensor]]:
        """``(name, method) -> {state: [n, ...]}``: every sample's states, stacked in the order added."""
        return {key: {state: torch.stack([s[state] for s in states]) for state in states[0]}
                for key, states in self._states.items()}

    def set_rows(self, rows: Mapping[tuple[str, str], Mapping[str, Tensor]]) -> None:
        """Replace the samples of every ``(name, method)`` by ``rows`` (as :meth:`rows` gives them), e.g. the
        samples of every process gathered (``GAECallback`` splits its faithfulness subset across ranks)."""
        for key, states in rows.items():
            count = len(next(iter(states.values())))
            self._states[key] = [{state: value[i] for state, value in states.items()} for i in range(count)]

    def count(self, name: str, method: str) -> int:
        """How many samples ``(name, method)`` was scored on."""
        return len(self._states[(name, method)])

    def results(self) -> dict[tuple[str, str], tuple[dict[str, float], dict[str, float]]]:
        """``(name, method) -> ({key: value}, {key: standard error})``; key ``""`` for a scalar metric."""
        return {key: value_and_stderr(self._metrics[key], states, self.groups) for key, states in self._states.items()}

    def columns(self) -> dict[str, dict[str, Score]]:
        """Method -> column -> its :class:`Score`; a metric with several values (a dict) gives the columns
        ``<name>_<key>``, a scalar one the column ``<name>``."""
        out: dict[str, dict[str, Score]] = {}
        for (name, method), (values, errors) in self.results().items():
            metric = self._metrics[(name, method)]
            for key, value in values.items():
                out.setdefault(method, {})[f"{name}_{key}" if key else name] = Score(
                    value, errors[key], self.count(name, method), bool(metric.higher_is_better))
        return out

    def curves(self) -> dict[str, dict[str, tuple[Sequence[float], Tensor]]]:
        """Name -> method -> ``(fractions, mean curve)`` for the metrics that have a curve (perturbation AUCs)."""
        out: dict[str, dict[str, tuple[Sequence[float], Tensor]]] = {}
        for (name, method), states in self._states.items():
            metric = self._metrics[(name, method)]
            if not hasattr(metric, "curve"):
                continue
            total = {state: torch.stack([s[state] for s in states]).sum(dim=0) for state in states[0]}
            for state, value in total.items():
                setattr(metric, state, value)
            # A perturbation AUC's own fractions and curve, which Metric does not declare.
            out.setdefault(name, {})[method] = (metric.fractions, metric.curve().float().cpu())  # type: ignore[assignment,operator]
            metric.reset()
        return out
