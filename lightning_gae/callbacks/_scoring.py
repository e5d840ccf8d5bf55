"""What GAECallback scores at an explanation step: relevance statistics, faithfulness with standard errors, ground truth.

The faithfulness scalars come from the scoring pipeline :func:`lightning_gae.compare.compare` reads too
(:func:`lightning_gae.evaluation.score_batches`), so the callback and ``compare`` agree on the same samples.
No metric here syncs across processes itself: on several ranks, the faithfulness subset's per-sample states
are gathered before the values are computed (``share``, :func:`lightning_gae.callbacks.distributed.gather_scores`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.aggregation import SumMetric

from lightning_gae._structures import map_tensors, take
from lightning_gae.callbacks._explainer import Explainer
from lightning_gae.callbacks.distributed import random_rows, subset_part
from lightning_gae.callbacks.samples import Samples
from lightning_gae.evaluation import Batch, score_batches, score_sets, set_scorers
from lightning_gae.language.answers import NextTokenLogits
from lightning_gae.metrics.stderr import SampleScores
from lightning_gae.methods.random import RANDOM
from lightning_gae.metrics.functional import explanation_stability, relevance_concentration
from lightning_gae.modalities.tokens import Modality
from lightning_gae.tensorboard.summary import scalar_tag
from lightning_gae.tensorboard.ranks import (FAITHFULNESS_ACCURACY, FAITHFULNESS_CLASSES, FAITHFULNESS_PREDICTED_CLASSES,
                                             FAITHFULNESS_SAMPLES)
from lightning_gae.metrics.ground_truth import SET_TRUTH, TruthScore

__all__ = ["Curves", "ScoredBatch", "cached_metric", "faithfulness", "finite_scalars", "relevance_scalars",
           "scored_batches", "set_truth_scalars", "warn_once"]

ScoredBatch = Batch
"""One batch to score: inputs, attributions by method, explained class, labels, ground truth (:class:`Batch`)."""
Curves = dict[str, dict[str, tuple[Sequence[float], Tensor]]]
"""Metric -> method -> ``(fractions, mean curve)``."""


def cached_metric(cache: dict[str, Metric], name: str, module: LightningModule | NextTokenLogits,
                  build: Callable[[], Metric]) -> Metric:
    """One metric object per name in ``cache``, reset, on the module's device; rebuilt for another module or device."""
    metric = cache.get(name)
    if metric is None or metric.device != module.device or getattr(metric, "forward_fn", module) is not module:
        metric = build().to(module.device)
        cache[name] = metric
    metric.reset()
    return metric


def relevance_scalars(method: str, tokens: Tensor, previous: Tensor | None, top_fraction: float) -> dict[str, float]:
    """``relevance_concentration`` (the mean over samples of :func:`relevance_concentration`: the share of the positive
    relevance in the top ``top_fraction`` of tokens, in [0, 1]; samples without positive relevance are left out of the
    mean, and a step where no sample has any logs no value) and, against the previous step's relevance of the same
    shape, ``relevance_stability_{spearman,topk_overlap}``."""
    tokens = tokens.detach().cpu()
    shares = relevance_concentration(tokens, top_fraction)
    shares = shares[~shares.isnan()]
    out = {} if not len(shares) else {scalar_tag("relevance_concentration", method): shares.mean().item()}
    if previous is not None and previous.shape == tokens.shape:
        stability = explanation_stability(tokens, previous, top_fraction)
        out[scalar_tag("relevance_stability_spearman", method)] = stability["spearman"].item()
        out[scalar_tag("relevance_stability_topk_overlap", method)] = stability["topk_overlap"].item()
    return out


def faithfulness(batches: Iterable[ScoredBatch], metrics: Sequence[str], explains_prediction: bool, modality: Modality,
                 module: LightningModule | NextTokenLogits, cache: dict[str, Metric], max_batch: int,
                 extra_truth: Sequence[TruthScore] = (),
                 share: Callable[[SampleScores], SampleScores] | None = None,
                 groups: Tensor | None = None) -> tuple[dict[str, float], Curves]:
    """Each metric and method over every batch, with its standard error (``<tag>/stderr``), the number of samples
    scored (``faithfulness_samples``) and what the model predicted on them (``faithfulness_accuracy`` with class labels,
    ``faithfulness_classes``, ``faithfulness_predicted_classes``: :class:`_Predictions`), and the metrics' curves.

    The scores are :func:`lightning_gae.evaluation.score_batches`' (``explains_prediction``: the attributions explain
    each sample's prediction, ``target="pred"``; ``extra_truth``: e.g. the recall of a causal LM's answer rows), with
    one metric object per name kept in ``cache`` on the module's device. ``share`` turns the per-sample states of
    ``batches`` into those of every sample scored (on several ranks: every rank's part). ``groups`` labels every
    sample scored (after ``share``), the samples of one group left out together by the standard errors.
    """
    predictions = _Predictions()
    scores = score_batches(predictions.watch(batches), metrics, module, modality, max_batch=max_batch,
                           explains_prediction=explains_prediction, extra_truth=extra_truth,
                           metric=lambda key, build: cached_metric(cache, key, module, build))
    if share is not None:
        scores = share(scores)
        predictions.scores = share(predictions.scores)
    scores.groups = groups
    out: dict[str, float] = {}
    counts = set()
    for method, columns in scores.columns().items():
        for column, score in columns.items():
            tag = scalar_tag(column, method)
            out[tag] = score.value
            counts.add(score.count)
            if score.count > 1:
                out[f"{tag}/stderr"] = score.stderr
    if counts:
        # Every metric and method of a step is scored on the same samples.
        out[FAITHFULNESS_SAMPLES] = float(max(counts))
        out.update(predictions.scalars(explains_prediction))
    return out, scores.curves()


class _Predictions:
    """What the model predicted on the scored samples, kept as the batches go by (:meth:`watch`), from the logits the
    explanations read (no forward pass of its own): each sample's predicted class and class label as the states of a
    ``SumMetric`` of that sample alone, in a :class:`SampleScores` so that on several ranks they are gathered with
    the scores' own samples."""

    KEYS = {"prediction": ("prediction", "model"), "label": ("label", "model")}

    def __init__(self) -> None:
        self.scores = SampleScores()
        self.classes = 0

    def _keep(self, what: str, values: Tensor) -> None:
        self.scores.add_updates(*self.KEYS[what], SumMetric(sync_on_compute=False).to(values.device), [values.float()])

    def watch(self, batches: Iterable[ScoredBatch]) -> Iterator[ScoredBatch]:
        """``batches`` as they come."""
        for batch in batches:
            logits, labels = batch.logits, batch.labels
            if logits is not None and logits.dim() == 2 and logits.shape[0] > 0:
                self.classes = int(logits.shape[1])
                self._keep("prediction", logits.argmax(dim=1))
                if labels is not None and labels.dim() == 1 and not labels.is_floating_point():
                    self._keep("label", labels.to(logits.device))
            yield batch

    def scalars(self, explains_prediction: bool) -> dict[str, float]:
        """``faithfulness_classes`` (how many classes the model chooses from), ``faithfulness_predicted_classes`` (how
        many of them it predicted on the scored samples) and, where the samples have class labels and the methods
        explain the prediction, ``faithfulness_accuracy``: what tells a model at chance
        (:func:`~lightning_gae.tensorboard.ranks.at_chance`)."""
        rows = self.scores.rows()
        if self.KEYS["prediction"] not in rows:
            return {}
        predicted = rows[self.KEYS["prediction"]]["sum_value"].reshape(-1)
        out = {FAITHFULNESS_CLASSES: float(self.classes),
               FAITHFULNESS_PREDICTED_CLASSES: float(len(predicted.unique()))}
        if self.KEYS["label"] in rows and explains_prediction:
            labels = rows[self.KEYS["label"]]["sum_value"].reshape(-1)
            out[FAITHFULNESS_ACCURACY] = float((predicted == labels).double().mean())
        return out


def set_truth_scalars(explanations: Mapping[str, Any], rows: Mapping[str, Mapping[str, Tensor]] | None,
                      sets: Mapping[str, tuple[Modality, int | str]], inputs: Any, keyed: Mapping[str, Tensor],
                      module: LightningModule, cache: dict[str, Metric]) -> dict[str, float]:
    """A model with several token sets: each set scored against the ground truth the batches carry for it
    (:data:`~lightning_gae.metrics.ground_truth.SET_TRUTH`: alignment of a decoder's rows, masks, rationales), by
    :func:`lightning_gae.evaluation.score_sets` as ``compare`` scores them, logged as ``<name>/<method>``.

    A ground truth no set can take alone is left out (the run's start checked what it could), and ``segmentation``
    is when the batches carry ``masks``."""
    first = next(iter(explanations.values()))
    sizes = {x: r.shape[1] for x, r in first.relevance.items()}
    total = first.tokens.shape[0]
    owned = {key: truth for key, truth in keyed.items() if SET_TRUTH.get(key, object) is not None
             and sum(m.ground_truth == SET_TRUTH[key] for m, _ in sets.values()) == 1
             and not (key == "segmentation" and "masks" in keyed)}
    scorers = set_scorers(owned, sizes, sets, False, first, total)
    aligned = {} if rows is None or "alignment" not in keyed else {"alignment": keyed["alignment"]}
    row_scorers = set_scorers(aligned, sizes, sets, True, first, total)
    scores = SampleScores()

    def metric(name: str, build: Callable[[], Metric]) -> Metric:
        return cached_metric(cache, name, module, build)

    for method, exp in explanations.items():
        truths = {key: truth.to(module.device) for key, truth in owned.items()}
        score_sets(scores, method, scorers, metric, inputs, exp.relevance, truths)
        if row_scorers:
            assert rows is not None  # row scorers exist only for the rows' alignment truth
            score_sets(scores, method, row_scorers, metric, inputs, rows[method], aligned)
    # compare's columns are <set>/<name>; a logged scalar is <name>/<method>.
    return {f"{column.split('/', 1)[1]}/{method}": score.value for method, columns in scores.columns().items()
            for column, score in columns.items()}


def scored_batches(trainer: Trainer, pl_module: LightningModule, subset: Samples, explain: Explainer,
                   max_batch: int, random_baseline: bool, seed: int) -> Iterable[ScoredBatch]:
    """This rank's part of ``subset`` (the faithfulness subset or its interim part; all of it on one process) in
    batches of ``max_batch``, each explained once per method (``explain(module, inputs, labels)``), with the random
    floor (:data:`~lightning_gae.methods.random.RANDOM`) when ``random_baseline``."""
    total = len(subset)
    rows, _ = subset_part(total, trainer.world_size, trainer.global_rank)
    with torch.inference_mode(False):  # validate()'s hooks: labels made in inference mode cannot be targets
        part = subset.part(rows)
    for start in range(0, len(rows), max_batch):
        stop = min(start + max_batch, len(rows))
        inputs = take(part.inputs, start, stop, len(rows))
        inputs = trainer.precision_plugin.convert_input(map_tensors(inputs, lambda t: t.to(pl_module.device)))
        labels = None if part.labels is None else part.labels[start:stop]
        explanations, maps = explain(pl_module, inputs, labels)
        first = next(iter(explanations.values()))
        scored: dict[str, Tensor] = {**{m: e.tokens for m, e in explanations.items()}, **maps}
        if random_baseline:
            # Seeded by position, so that a sample's random ranking is the same at every step and on any ranks.
            scored[RANDOM.name] = random_rows(first.tokens, rows[start:stop], seed, max_batch, total)
        truth = None if part.truth is None else part.truth[start:stop]
        yield Batch(inputs, scored, first.target, labels, truth, logits=first.logits)


def finite_scalars(scalars: dict[str, float], step: int, warned: set[str]) -> dict[str, float]:
    """``scalars`` without the values that are not finite, which are named in a warning (once per set of tags: the
    warnings given are kept in ``warned``)."""
    dropped = sorted(tag for tag, value in scalars.items() if not math.isfinite(value))
    if dropped:
        warn_once(warned, f"non-finite scalars {dropped}",
                  f"GAECallback: {dropped} came out not finite at step {step} and are not logged")
    return {tag: value for tag, value in scalars.items() if tag not in dropped}


def warn_once(warned: set[str], key: str, message: str) -> None:
    """Warn ``message`` (rank zero) unless a warning of ``key`` was given before; ``warned`` keeps the keys given."""
    if key not in warned:
        warned.add(key)
        rank_zero_warn(message)
