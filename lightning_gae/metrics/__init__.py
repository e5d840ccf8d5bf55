"""Faithfulness metrics as ``torchmetrics.Metric`` classes; their maths in :mod:`lightning_gae.metrics.functional`.

Perturbation protocols run the model on inputs with units removed in relevance order
(``update(inputs, attributions, target=None)``; ``protocol="target"`` or ``"predicted"`` says
which class is scored and against what); the others compare relevance with ground truth or with
another explanation. Every state reduces by sum across processes, and every metric names its
states after what they hold, so any of them can share a ``MetricCollection`` (compute groups on).
"""

from collections.abc import Callable
from typing import Any

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
}
"""The perturbation metrics by the names the callback, ``compare`` and the CLI use (all take
``update(inputs, attributions, target)``; the classes declare ``higher_is_better``)."""


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
    "RationaleAgreement",
    "RationaleRecall",
    "RegionRecall",
    "RegionShare",
    "RelevanceSegmentation",
    "Sufficiency",
    "functional",
    "perturbation_metric",
    "random_attribution",
]
