"""What each kind of ground truth is scored with: the one table ``compare`` and ``GAECallback`` both read.

A modality names the kind of ground truth its samples carry (:attr:`~lightning_gae.Modality.ground_truth`): image
masks score an image set, rationale tokens a text set, informative features a tabular set (:data:`GROUND_TRUTH`, by
that name); for models with several token sets a batch key says which kind its ground truth is, and so which set it
scores (:data:`SET_TRUTH`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor
from torchmetrics import Metric

from lightning_gae.metrics.segmentation import RationaleAgreement, RationaleRecall, RelevanceSegmentation
from lightning_gae.modalities import Modality

__all__ = ["GROUND_TRUTH", "RECALL", "SET_TRUTH", "TruthScore", "scored_truth", "truth_score"]


@dataclass(frozen=True)
class TruthScore:
    """How one kind of ground truth scores an attribution.

    Attributes:
        name: the scalar's prefix (``<name>_<key>/<method>``, ``<set>/<name>_<key>`` per token set).
        truth: the kind of ground truth it scores: a modality's :attr:`~lightning_gae.Modality.ground_truth`.
        truth_dims: the ground truth's dims with the batch (images' masks ``[B, H, W]``: 3).
        metric: ``modality -> Metric`` (built without syncing: one process scores).
        update_args: ``(modality, inputs, attributions, truth) -> the metric's update arguments``, each with the
            batch in dim 0.
    """

    name: str
    truth: str
    truth_dims: int
    metric: Callable[[Modality], Metric]
    update_args: Callable[[Modality, Any, Tensor, Tensor], tuple[Any, ...]]


GROUND_TRUTH: dict[str, TruthScore] = {entry.truth: entry for entry in (
    TruthScore("segmentation", "segmentation", 3, lambda m: RelevanceSegmentation(m, sync_on_compute=False),
               lambda m, inputs, a, truth: (a, truth)),
    TruthScore("rationale", "rationale", 2, lambda m: RationaleAgreement(sync_on_compute=False),
               lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth, m.removable(inputs))),
    TruthScore("feature_recovery", "feature_recovery", 2, lambda m: RationaleAgreement(sync_on_compute=False),
               lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth)),
)}
"""Kind of ground truth (a modality's :attr:`~lightning_gae.Modality.ground_truth`) -> its metric. Image masks
``[B, H, W]`` give ``segmentation_{pixel_accuracy,miou,mean_ap}`` (:class:`~lightning_gae.metrics.RelevanceSegmentation`,
through the modality's ``to_input``); rationale tokens ``[B, T]`` give ``rationale_{token_f1,auprc}`` over the
removable units and informative features ``[B, F]`` ``feature_recovery_{token_f1,auprc}``
(:class:`~lightning_gae.metrics.RationaleAgreement`, through the modality's ``unit_scores``)."""


RECALL = TruthScore("recall", "rationale", 2, lambda m: RationaleRecall(sync_on_compute=False),
                    lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth, m.removable(inputs)))
"""Rationale ground truth scored as ``recall_{top1,hit_at_k,mass}`` (:class:`~lightning_gae.metrics.RationaleRecall`):
what a causal LM's answer rows are asked (does the relevance find the tokens the answer comes from)."""


SET_TRUTH: dict[str, str | None] = {"alignment": None, "masks": "segmentation", "segmentation": "segmentation",
                                    "rationales": "rationale"}
"""Batch key of a ground truth -> its kind (:data:`GROUND_TRUTH`), which the token set whose modality scores it
takes, for models with several sets (``None``: ``alignment [B, T]``, the source position each target token copies,
scores the source set's rows)."""


def truth_score(modality: Modality) -> TruthScore:
    """The :data:`GROUND_TRUTH` entry of ``modality``'s :attr:`~lightning_gae.Modality.ground_truth`.

    Raises:
        ValueError: a modality that scores no ground truth, or names one :data:`GROUND_TRUTH` lacks.
    """
    entry = _entry(modality)
    if entry is None:
        raise ValueError(f"{type(modality).__name__} scores no ground truth (its ground_truth is None); a modality "
                         f"names the kind it scores, one of {list(GROUND_TRUTH)}")
    return entry


def scored_truth(modality: Modality, truth: Tensor) -> TruthScore | None:
    """The :data:`GROUND_TRUTH` entry that scores ``truth`` for ``modality``, or None when there is none or the
    truth's dims do not fit it (a batch's third element that is not this modality's ground truth).

    Raises:
        ValueError: the modality names a ground truth :data:`GROUND_TRUTH` lacks.
    """
    entry = _entry(modality)
    return entry if entry is not None and truth.dim() == entry.truth_dims else None


def _entry(modality: Modality) -> TruthScore | None:
    """The entry of the ground truth ``modality`` names, None for none, or raise for a name the table lacks."""
    kind = modality.ground_truth
    if kind is not None and kind not in GROUND_TRUTH:
        raise ValueError(f"{type(modality).__name__}.ground_truth = {kind!r} names no ground truth: use one of "
                         f"{list(GROUND_TRUTH)} or None")
    return None if kind is None else GROUND_TRUTH[kind]
