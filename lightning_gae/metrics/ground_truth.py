"""What each kind of ground truth is scored with: the one table ``compare`` and ``GAECallback`` both read.

Image masks score an image set, rationale tokens a text set, informative features a tabular set
(:data:`GROUND_TRUTH`); for models with several token sets a batch key says which set its ground truth
scores (:data:`SET_TRUTH`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor
from torchmetrics import Metric

from lightning_gae.metrics.segmentation import RationaleAgreement, RationaleRecall, RelevanceSegmentation
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens

__all__ = ["GROUND_TRUTH", "RECALL", "SET_TRUTH", "TruthScore", "scored_truth", "truth_score"]


@dataclass(frozen=True)
class TruthScore:
    """How one kind of ground truth scores an attribution.

    Attributes:
        name: the scalar's prefix (``<name>_<key>/<method>``, ``<set>/<name>_<key>`` per token set).
        modality: the modality whose relevance it scores.
        truth_dims: the ground truth's dims with the batch (images' masks ``[B, H, W]``: 3).
        metric: ``modality -> Metric`` (built without syncing: one process scores).
        update_args: ``(modality, inputs, attributions, truth) -> the metric's update arguments``, each with the
            batch in dim 0.
    """

    name: str
    modality: type[Modality]
    truth_dims: int
    metric: Callable[[Modality], Metric]
    update_args: Callable[[Modality, Any, Tensor, Tensor], tuple[Any, ...]]


GROUND_TRUTH: tuple[TruthScore, ...] = (
    # This entry is read for ImageTokens only (its modality field), which RelevanceSegmentation takes.
    TruthScore("segmentation", ImageTokens, 3, lambda m: RelevanceSegmentation(m, sync_on_compute=False),  # type: ignore[arg-type]
               lambda m, inputs, a, truth: (a, truth)),
    TruthScore("rationale", TextTokens, 2, lambda m: RationaleAgreement(sync_on_compute=False),
               lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth, m.removable(inputs))),
    TruthScore("feature_recovery", TabularTokens, 2, lambda m: RationaleAgreement(sync_on_compute=False),
               lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth)),
)
"""The metric of each kind of ground truth, by modality. Image masks ``[B, H, W]`` give
``segmentation_{pixel_accuracy,miou,mean_ap}`` (:class:`~lightning_gae.metrics.RelevanceSegmentation`); rationale
tokens ``[B, T]`` give ``rationale_{token_f1,auprc}`` over the removable tokens and informative features ``[B, F]``
``feature_recovery_{token_f1,auprc}`` (:class:`~lightning_gae.metrics.RationaleAgreement`)."""


RECALL = TruthScore("recall", TextTokens, 2, lambda m: RationaleRecall(sync_on_compute=False),
                    lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth, m.removable(inputs)))
"""Text ground truth scored as ``recall_{top1,hit_at_k,mass}`` (:class:`~lightning_gae.metrics.RationaleRecall`):
what a causal LM's answer rows are asked (does the relevance find the tokens the answer comes from)."""


SET_TRUTH: dict[str, type[Modality] | None] = {"alignment": None, "masks": ImageTokens, "segmentation": ImageTokens,
                                               "rationales": TextTokens}
"""Batch key of a ground truth -> the modality of the token set it scores, for models with several sets
(``None``: ``alignment [B, T]``, the source position each target token copies, scores the source set's rows)."""


def truth_score(modality: Modality) -> TruthScore:
    """The :data:`GROUND_TRUTH` entry of ``modality``.

    Raises:
        ValueError: a modality no ground truth is defined for.
    """
    for entry in GROUND_TRUTH:
        if isinstance(modality, entry.modality):
            return entry
    kinds = ", ".join(entry.modality.__name__ for entry in GROUND_TRUTH)
    raise ValueError(f"ground truth needs a {kinds} modality; got {type(modality).__name__}")


def scored_truth(modality: Modality, truth: Tensor) -> TruthScore | None:
    """The :data:`GROUND_TRUTH` entry that scores ``truth`` for ``modality``, or None when there is none or the
    truth's dims do not fit it (a batch's third element that is not this modality's ground truth)."""
    entry = next((e for e in GROUND_TRUTH if isinstance(modality, e.modality)), None)
    return entry if entry is not None and truth.dim() == entry.truth_dims else None
