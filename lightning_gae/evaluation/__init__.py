"""Scoring: every method's attributions against every metric, ground truth and region, the same way for
:func:`lightning_gae.compare.compare` and ``GAECallback`` (:mod:`lightning_gae.evaluation.pipeline`)."""

from lightning_gae.evaluation.pipeline import Batch, MetricSource, region_masks, score_batches

__all__ = ["Batch", "MetricSource", "region_masks", "score_batches"]
