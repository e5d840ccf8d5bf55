"""What GAECallback scores at an explanation step: relevance statistics, faithfulness with standard errors, ground truth.

The faithfulness scalars come from the same per-sample scoring as :func:`lightning_gae.compare.compare`
(:class:`lightning_gae.metrics.stderr.SampleScores`) and the same ground truth -> metric table
(:data:`lightning_gae.metrics.ground_truth.GROUND_TRUTH`), so the callback and ``compare`` agree on the same samples.
No metric here syncs across processes itself: on several ranks, the faithfulness subset's per-sample states
are gathered before the values are computed (``share``, :func:`lightning_gae.callbacks.distributed.gather_scores`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor
from torchmetrics import Metric

from lightning_gae._structures import map_tensors, take
from lightning_gae.callbacks.distributed import random_rows, subset_part
from lightning_gae.callbacks.samples import Samples
from lightning_gae.metrics import AlignmentAccuracy, perturbation_metric
from lightning_gae.metrics.stderr import SampleScores
from lightning_gae.metrics.functional import explanation_stability
from lightning_gae.modalities.tokens import Modality, TextTokens
from lightning_gae.tensorboard.summary import FAITHFULNESS_SAMPLES, scalar_tag
from lightning_gae.metrics.ground_truth import SET_TRUTH, TruthScore, scored_truth, truth_score

__all__ = ["Curves", "ScoredBatch", "cached_metric", "faithfulness", "finite_scalars", "relevance_scalars",
           "scored_batches", "set_truth_scalars"]

ScoredBatch = tuple[Any, dict[str, Tensor], Tensor, "Tensor | None", "Tensor | None"]
"""One batch to score: inputs, attributions by method, explained class, labels, ground truth."""
Curves = dict[str, dict[str, tuple[Sequence[float], Tensor]]]
"""Metric -> method -> ``(fractions, mean curve)``."""


def cached_metric(cache: dict[str, Metric], name: str, module: LightningModule, build: Callable[[], Metric]) -> Metric:
    """One metric object per name in ``cache``, reset, on the module's device; rebuilt for another module or device."""
    metric = cache.get(name)
    stale = metric is None or metric.device != module.device
    if not stale and getattr(metric, "forward_fn", module) is not module:
        stale = True
    if stale:
        metric = build().to(module.device)
        cache[name] = metric
    metric.reset()
    return metric


def relevance_scalars(method: str, tokens: Tensor, previous: Tensor | None, top_fraction: float) -> dict[str, float]:
    """``relevance_concentration`` (share of relevance in the top ``top_fraction`` of tokens) and, against the
    previous step's relevance of the same shape, ``relevance_stability_{spearman,topk_overlap}``."""
    tokens = tokens.detach().cpu()
    k = max(1, round(top_fraction * tokens.shape[1]))
    total = tokens.sum(dim=1).clamp(min=1e-12)
    out = {scalar_tag("relevance_concentration", method): (tokens.topk(k, dim=1).values.sum(dim=1) / total).mean().item()}
    if previous is not None and previous.shape == tokens.shape:
        stability = explanation_stability(tokens, previous, top_fraction)
        out[scalar_tag("relevance_stability_spearman", method)] = stability["spearman"].item()
        out[scalar_tag("relevance_stability_topk_overlap", method)] = stability["topk_overlap"].item()
    return out


def faithfulness(batches: Iterable[ScoredBatch], metrics: Sequence[str], explains_prediction: bool, modality: Modality,
                 module: LightningModule, cache: dict[str, Metric], max_batch: int,
                 extra_truth: Sequence[TruthScore] = (),
                 share: Callable[[SampleScores], SampleScores] | None = None,
                 groups: Tensor | None = None) -> tuple[dict[str, float], Curves]:
    """Each metric and method over every batch, with its standard error (``<tag>/stderr``) and the number of samples
    scored (``faithfulness_samples``), and the metrics' curves.

    ``explains_prediction``: the attributions explain each sample's prediction (``target="pred"``); with class
    labels they are then scored by the papers' *predicted* protocol (Chefer et al., CVPR 2021, Table 1: the 0% step
    is the accuracy), otherwise by the *target* protocol on the explained class. A batch's ground truth is scored by
    the modality's entry of :data:`~lightning_gae.metrics.ground_truth.GROUND_TRUTH` when its dims fit, and by each of
    ``extra_truth`` (e.g. the recall of a causal LM's answer rows). ``share`` turns the per-sample states of
    ``batches`` into those of every sample scored (on several ranks: every rank's part). ``groups`` labels
    every sample scored (after ``share``), the samples of one group left out together by the standard errors.
    """
    scores = SampleScores()
    for inputs, scored, target, labels, truth in batches:
        if explains_prediction and labels is not None and labels.dim() == 1 and not labels.is_floating_point():
            protocol, reference = "predicted", labels.to(module.device)
        else:
            protocol, reference = "target", target
        for name in metrics:
            metric = cached_metric(cache, f"{name}/{protocol}", module, lambda: perturbation_metric(
                name, module, modality, protocol=protocol, max_batch=max_batch, sync_on_compute=False))
            for method, attributions in scored.items():
                # Each sample's own states from one batched pass: perturbed inputs go through the model
                # max_batch at a time instead of one sample's few at a time.
                scores.add_perturbation(name, method, metric, inputs, attributions, reference)
        if truth is None:
            continue
        entries = [scored_truth(modality, truth), *extra_truth]
        truth = truth.to(module.device)
        for entry in entries:
            if entry is None:
                continue
            metric = cached_metric(cache, entry.name, module, lambda: entry.metric(modality))
            for method, attributions in scored.items():
                scores.add_updates(entry.name, method, metric, entry.update_args(modality, inputs, attributions, truth))
    if share is not None:
        scores = share(scores)
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
    return out, scores.curves()


def set_truth_scalars(explanations: Mapping[str, Any], rows: Mapping[str, Mapping[str, Tensor]] | None,
                      sets: Mapping[str, tuple[Modality, int | str]], views: Mapping[str, Any],
                      keyed: Mapping[str, Tensor], module: LightningModule, cache: dict[str, Metric]) -> dict[str, float]:
    """A model with several token sets: each set scored against the ground truth the batches carry for it
    (:data:`~lightning_gae.metrics.ground_truth.SET_TRUTH`: alignment of a decoder's rows, masks, rationales)."""
    out: dict[str, float] = {}
    first = next(iter(explanations.values()))
    alignment = keyed.get("alignment")
    if alignment is not None and rows is not None:
        source = next(x for x in first.relevance if x != first.query_set)
        view = views[source]
        valid = None
        if isinstance(view.modality, TextTokens):
            valid = view.modality.real_tokens(map_tensors(view.inputs, lambda t: t.cpu()))
        for method, by_set in rows.items():
            metric = cached_metric(cache, "alignment", module, lambda: AlignmentAccuracy(sync_on_compute=False))
            metric.update(by_set[source], alignment, valid)
            out[scalar_tag("alignment_accuracy", method)] = metric.compute().item()
    for key, kind in SET_TRUTH.items():
        truth = keyed.get(key)
        owners = [x for x, (modality, _) in sets.items() if kind is not None and isinstance(modality, kind)]
        if truth is None or len(owners) != 1 or (key == "segmentation" and "masks" in keyed):
            continue
        view = views[owners[0]]
        entry = truth_score(view.modality)
        truth = truth.to(module.device)
        for method, exp in explanations.items():
            metric = cached_metric(cache, entry.name, module, lambda: entry.metric(view.modality))
            metric.update(*entry.update_args(view.modality, view.inputs, exp.relevance[owners[0]], truth))
            out.update({scalar_tag(f"{entry.name}_{k}", method): v.item() for k, v in metric.compute().items()})
    return out


def scored_batches(trainer: Trainer, pl_module: LightningModule, subset: Samples,
                   explain: Callable[[LightningModule, Any, Tensor | None], tuple[Mapping[str, Any], Mapping[str, Tensor]]],
                   max_batch: int, random_baseline: bool, seed: int) -> Iterable[ScoredBatch]:
    """This rank's part of ``subset`` (the faithfulness subset or its interim part; all of it on one process) in
    batches of ``max_batch``, each explained once per method (``explain(module, inputs, labels)``)."""
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
            scored["random"] = random_rows(first.tokens, rows[start:stop], seed, max_batch, total)
        truth = None if part.truth is None else part.truth[start:stop]
        yield inputs, scored, first.target, labels, truth


def finite_scalars(warn_once: Callable[[str, str], None], scalars: dict[str, float], step: int) -> dict[str, float]:
    """``scalars`` without the values that are not finite, which are named in a warning (once, by ``warn_once``)."""
    dropped = sorted(tag for tag, value in scalars.items() if not math.isfinite(value))
    if dropped:
        warn_once(f"non-finite scalars {dropped}", f"GAECallback: {dropped} came out not finite at step {step} and are "
                                                   "not logged")
    return {tag: value for tag, value in scalars.items() if tag not in dropped}
