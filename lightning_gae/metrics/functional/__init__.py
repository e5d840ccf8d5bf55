"""The faithfulness metrics as plain functions, the torchmetrics way (classes in ``lightning_gae.metrics``)."""

from lightning_gae.metrics.functional.alignment import alignment_accuracy
from lightning_gae.metrics.functional.perturbation import (
    ERASER_BINS,
    PERTURBATION_FRACTIONS,
    PROTOCOLS,
    RISE_FRACTIONS,
    abpc,
    aopc,
    comprehensiveness,
    deletion_auc,
    insertion_auc,
    perturbation_auc,
    perturbation_curve,
    random_attribution,
    sufficiency,
)
from lightning_gae.metrics.functional.regions import RegionRemoval, region_recall, region_removal_drop, region_share
from lightning_gae.metrics.functional.segmentation import rationale_agreement, rationale_recall, relevance_segmentation
from lightning_gae.metrics.functional.stability import explanation_stability

__all__ = [
    "ERASER_BINS",
    "PERTURBATION_FRACTIONS",
    "PROTOCOLS",
    "RISE_FRACTIONS",
    "RegionRemoval",
    "abpc",
    "alignment_accuracy",
    "aopc",
    "comprehensiveness",
    "deletion_auc",
    "explanation_stability",
    "insertion_auc",
    "perturbation_auc",
    "perturbation_curve",
    "random_attribution",
    "rationale_agreement",
    "rationale_recall",
    "region_recall",
    "region_removal_drop",
    "region_share",
    "relevance_segmentation",
    "sufficiency",
]
