"""Faithfulness metrics as ``torchmetrics.Metric`` classes; their maths in :mod:`lightning_gae.metrics.functional`.

Perturbation protocols run the model on inputs with units removed in relevance order
(``update(inputs, attributions, target=None)``; ``protocol="target"`` or ``"predicted"`` says
which class is scored and against what); the others compare relevance with ground truth or with
another explanation. Every state reduces by sum across processes, and every metric names its
states after what they hold, so any of them can share a ``MetricCollection`` (compute groups on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import Self

from lightning_gae.metrics import functional
from lightning_gae.metrics.alignment import AlignmentAccuracy
from lightning_gae.metrics.regions import RegionRecall, RegionShare
from lightning_gae.metrics.segmentation import RationaleAgreement, RationaleRecall, RelevanceSegmentation
from lightning_gae.metrics.stability import ExplanationStability
from lightning_gae.metrics.functional import random_attribution
from lightning_gae.metrics.perturbation import (
    ABPC,
    AOPC,
    Comprehensiveness,
    DeletionAUC,
    InsertionAUC,
    NegativePerturbationAUC,
    PerturbationAUC,
    PositivePerturbationAUC,
    ROAD,
    ROADLeRF,
    Sufficiency,
)

PERTURBATION_METRICS: dict[str, Callable[..., Any]] = {
    "positive_perturbation_auc": PositivePerturbationAUC,
    "negative_perturbation_auc": NegativePerturbationAUC,
    "deletion_auc": DeletionAUC,
    "insertion_auc": InsertionAUC,
    "comprehensiveness": Comprehensiveness,
    "sufficiency": Sufficiency,
    "aopc": AOPC,
    "abpc": ABPC,
    "road": ROAD,
    "road_lerf": ROADLeRF,
}
"""The perturbation metrics by the names the callback, ``compare`` and the CLI use (all take
``update(inputs, attributions, target)``; the classes declare ``higher_is_better``)."""


class Registration:
    """A metric added to :data:`PERTURBATION_METRICS` by :func:`register_metric`; ``remove()`` (or leaving a
    ``with`` block) takes it out again."""

    def __init__(self, name: str) -> None:
        self.name = name

    def remove(self) -> None:
        """Take the metric out of :data:`PERTURBATION_METRICS`."""
        PERTURBATION_METRICS.pop(self.name, None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def register_metric(name: str, metric: Callable[..., Any]) -> Registration:
    """Add a perturbation-style metric to :data:`PERTURBATION_METRICS`, the table every face reads: ``compare``,
    ``GAECallback`` and :class:`~lightning_gae.options.FaithfulnessOptions` then take it by ``name``, and the callback
    logs it as ``<name>/<method>`` with its standard error, ranked on the GAE tab by its ``higher_is_better``.

    ``metric`` is a class (or any callable) built as ``metric(forward_fn, modality, protocol=..., max_batch=...,
    sync_on_compute=False)`` whose objects are ``torchmetrics.Metric`` s with a ``higher_is_better`` and a
    ``per_sample_states(inputs, attributions, target) -> {state: [B, ...]}``: what each sample alone adds to every
    state. Every state must be a sum over samples (``dist_reduce_fx="sum"``), so that the standard error can leave
    samples out (:func:`lightning_gae.metrics.stderr.value_and_stderr`). See the guide "Add a metric".

    Raises:
        ValueError: a name that is taken, empty or holds ``/`` (scalar tags are ``<name>/<method>``), or a metric
            without ``higher_is_better`` or ``per_sample_states``.
    """
    if not name or "/" in name or name in PERTURBATION_METRICS:
        taken = " is taken" if name in PERTURBATION_METRICS else " must be a non-empty name without '/'"
        raise ValueError(f"register_metric({name!r}): the name{taken}; the table holds {sorted(PERTURBATION_METRICS)}")
    missing = [a for a in ("higher_is_better", "per_sample_states") if getattr(metric, a, None) is None]
    if missing:
        raise ValueError(f"register_metric({name!r}, {getattr(metric, '__name__', metric)!r}): it has no {missing}; "
                         "the scoring pipeline ranks by higher_is_better and reads each sample's states from "
                         "per_sample_states(inputs, attributions, target)")
    PERTURBATION_METRICS[name] = metric
    return Registration(name)


def perturbation_metric(name: str, forward_fn: Callable[..., Any], modality: Any, **kwargs: Any) -> Any:
    """A perturbation metric by name, e.g. ``perturbation_metric("negative_perturbation_auc", model, modality)``.

    ``kwargs`` go to the class (``protocol``, ``max_batch``, ``sync_on_compute``, ...).

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    if name not in PERTURBATION_METRICS:
        raise ValueError(f"unknown metric {name!r}; choose from {sorted(PERTURBATION_METRICS)}")
    return PERTURBATION_METRICS[name](forward_fn, modality, **kwargs)


__all__ = [
    "ABPC",
    "AOPC",
    "AlignmentAccuracy",
    "PERTURBATION_METRICS",
    "Comprehensiveness",
    "DeletionAUC",
    "ExplanationStability",
    "InsertionAUC",
    "PerturbationAUC",
    "ROAD",
    "ROADLeRF",
    "RationaleAgreement",
    "RationaleRecall",
    "RegionRecall",
    "RegionShare",
    "Registration",
    "RelevanceSegmentation",
    "Sufficiency",
    "functional",
    "perturbation_metric",
    "random_attribution",
    "register_metric",
]
