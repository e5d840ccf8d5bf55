"""Scoring: every method's attributions against every metric, ground truth and region, the same way for
:func:`lightning_gae.compare.compare` and ``GAECallback`` (:func:`score_batches`); models with several token sets
are scored set by set against their ground truth (:func:`set_scorers`, :func:`score_sets`)."""

from lightning_gae.evaluation.pipeline import Batch, MetricSource, region_masks, score_batches
from lightning_gae.evaluation.token_sets import SetScorers, score_sets, set_scorers, set_truths

__all__ = ["Batch", "MetricSource", "SetScorers", "region_masks", "score_batches", "score_sets", "set_scorers", "set_truths"]
