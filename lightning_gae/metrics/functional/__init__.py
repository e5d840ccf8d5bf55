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
from lightning_gae.metrics.functional.health import (
    beside_identity,
    differs_beyond_stderr,
    identity_dominated,
    not_better_than_random,
    relevance_concentration,
    tied_groups,
)
from lightning_gae.metrics.functional.imputation import noisy_linear_imputation
from lightning_gae.metrics.functional.road import road_auc, road_curve
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
    "beside_identity",
    "comprehensiveness",
    "deletion_auc",
    "differs_beyond_stderr",
    "explanation_stability",
    "identity_dominated",
    "insertion_auc",
    "noisy_linear_imputation",
    "not_better_than_random",
    "perturbation_auc",
    "perturbation_curve",
    "random_attribution",
    "rationale_agreement",
    "rationale_recall",
    "region_recall",
    "region_removal_drop",
    "region_share",
    "relevance_concentration",
    "relevance_segmentation",
    "road_auc",
    "road_curve",
    "sufficiency",
    "tied_groups",
]
