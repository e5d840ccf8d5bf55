"""The one scoring pipeline: methods x metrics x ground truth x regions -> per-sample scores with standard errors.

:func:`score_batches` scores every method's attributions of a stream of :class:`Batch` es with the perturbation
metrics (:data:`lightning_gae.metrics.PERTURBATION_METRICS`), the modality's ground truth
(:data:`lightning_gae.metrics.ground_truth.GROUND_TRUTH`) and the declared regions
(:func:`lightning_gae.metrics.regions.score_regions`), one state per sample
(:class:`lightning_gae.metrics.stderr.SampleScores`). :func:`lightning_gae.compare.compare` and ``GAECallback`` both
read their numbers from it; only how they gather the batches and print the result differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from torch import Tensor
from torchmetrics import Metric

from lightning_gae._structures import map_tensors
from lightning_gae.metrics import perturbation_metric
from lightning_gae.metrics.ground_truth import TruthScore, scored_truth
from lightning_gae.metrics.regions import score_regions
from lightning_gae.metrics.stderr import SampleScores
from lightning_gae.modalities.regions import Region, region_token_mask, region_valid_tokens, token_relevance
from lightning_gae.modalities.tokens import Modality

__all__ = ["Batch", "MetricSource", "region_masks", "score_batches"]

MetricSource = Callable[[str, Callable[[], Metric]], Metric]
"""``(key, build) -> metric``: where :func:`score_batches` gets a metric object (a new one by default; the callback
keeps one per key across steps, on the model's device)."""


class Batch(NamedTuple):
    """One batch to score: the samples, each method's attributions of them, and what they are scored against."""

    inputs: Any
    """The samples, as the model takes them."""
    attributions: Mapping[str, Tensor]
    """Method -> its attributions of ``inputs`` (token relevance ``[B, N]`` or a Captum map)."""
    target: Tensor | None = None
    """The class each method explained ``[B]`` (None: the predictions)."""
    labels: Tensor | None = None
    """The samples' class labels ``[B]``, or None."""
    truth: Tensor | None = None
    """The samples' ground truth (batch in dim 0), or None."""
    regions: Mapping[str, Tensor] | None = None
    """Region name -> bool ``[B, N]`` over the tokens (:func:`region_masks`), or None."""
    logits: Tensor | None = None
    """The model's logits on ``inputs`` ``[B, C]`` as the explanations read them, or None: what the model predicted
    (not scored here; the callback tells from them whether the model is at chance)."""


def _new_metric(key: str, build: Callable[[], Metric]) -> Metric:
    return build()


def _protocol(batch: Batch, explains_prediction: bool, device: Any) -> tuple[str, Any]:
    """``(protocol, what the metrics are told)``: with class labels, attributions of the prediction are scored by the
    papers' *predicted* protocol (Chefer et al., CVPR 2021, Table 1: the 0% step is the accuracy); otherwise by the
    *target* protocol on the explained class."""
    labels = batch.labels
    if explains_prediction and labels is not None and labels.dim() == 1 and not labels.is_floating_point():
        return "predicted", labels.to(device)
    return "target", batch.target


def score_batches(batches: Iterable[Batch], metrics: Sequence[str], model: Callable[..., Any], modality: Modality,
                  max_batch: int = 256, explains_prediction: bool = False, extra_truth: Sequence[TruthScore] = (),
                  top_k: int | None = None, metric: MetricSource = _new_metric) -> SampleScores:
    """Every method of every batch scored sample by sample: each metric of ``metrics`` (named as in
    :data:`~lightning_gae.metrics.PERTURBATION_METRICS`), the batch's ground truth by the modality's entry of
    :data:`~lightning_gae.metrics.ground_truth.GROUND_TRUTH` when its dims fit it and by each of ``extra_truth``,
    and each declared region's share and recall (the ``k`` of ``top_k``).

    Args:
        batches: the batches (:class:`Batch`); a method's samples are kept in the order its batches come.
        metrics: perturbation metric names.
        model: what the perturbation metrics run (the classifier, or a readout of its logits).
        modality: removes the inputs' units, maps attributions to tokens, says which ground truth applies.
        max_batch: perturbed inputs per forward pass of a perturbation metric.
        explains_prediction: the attributions explain each sample's prediction; with class labels the metrics then
            check the perturbed prediction against the labels (``protocol="predicted"``).
        extra_truth: further ground truth scores (e.g. :data:`~lightning_gae.metrics.ground_truth.RECALL`).
        top_k: the region recall's ``k`` (None: each sample's region size).
        metric: where the metric objects come from (:data:`MetricSource`).

    Returns:
        :class:`~lightning_gae.metrics.stderr.SampleScores`: ``columns()`` gives each value with its standard error.
    """
    scores = SampleScores()
    for batch in batches:
        if not batch.attributions:
            continue
        device = next(iter(batch.attributions.values())).device
        protocol, reference = _protocol(batch, explains_prediction, device)
        for name in metrics:
            scorer = metric(f"{name}/{protocol}", partial(perturbation_metric, name, model, modality, protocol=protocol,
                                                          max_batch=max_batch, sync_on_compute=False))
            for method, attributions in batch.attributions.items():
                # Each sample's own states from one batched pass: perturbed inputs go through the model
                # max_batch at a time instead of one sample's few at a time.
                scores.add_perturbation(name, method, scorer, batch.inputs, attributions, reference)
        if batch.truth is not None:
            _score_truth(scores, batch, batch.truth, [scored_truth(modality, batch.truth), *extra_truth], modality, metric)
        if batch.regions:
            _score_regions(scores, batch, batch.regions, modality, top_k)
    return scores


def _score_truth(scores: SampleScores, batch: Batch, truth: Tensor, entries: Sequence[TruthScore | None],
                 modality: Modality, metric: MetricSource) -> None:
    """Each method of ``batch`` against its ground truth ``truth``, by every entry that applies."""
    for entry in entries:
        if entry is None:
            continue
        scorer = metric(entry.name, partial(entry.metric, modality))
        for method, attributions in batch.attributions.items():
            scores.add_updates(entry.name, method, scorer,
                               entry.update_args(modality, batch.inputs, attributions, truth.to(attributions.device)))


def _score_regions(scores: SampleScores, batch: Batch, regions: Mapping[str, Tensor], modality: Modality,
                   top_k: int | None) -> None:
    """Each region's share and recall (``regions``: the batch's) of every method of ``batch`` whose attributions are
    token relevance or can be made into it (:func:`~lightning_gae.modalities.regions.token_relevance`); padding does
    not count."""
    tokens = next(iter(regions.values())).shape[1]
    cpu = map_tensors(batch.inputs, lambda t: t.detach().cpu())
    valid = region_valid_tokens(modality, cpu, tokens)
    for method, attributions in batch.attributions.items():
        relevance = token_relevance(modality, attributions, cpu, tokens)
        if relevance is not None:
            score_regions(scores, method, regions, relevance, valid, top_k)


def region_masks(regions: Sequence[Region], modality: Modality, inputs: Any) -> dict[str, Tensor]:
    """Region name -> bool ``[B, N]`` over the samples' tokens, on the CPU
    (:func:`~lightning_gae.modalities.regions.region_token_mask`).

    Raises:
        ValueError: naming the region whose tokens could not be found (a predicate that raised, a mask or features
            that do not fit the samples).
    """
    cpu = map_tensors(inputs, lambda t: t.detach().cpu())
    masks = {}
    for region in regions:
        try:
            masks[region.name] = region_token_mask(region, modality, cpu).cpu()
        except Exception as err:
            raise ValueError(f"Region {region.name!r} could not be found in the samples' tokens "
                             f"({type(err).__name__}: {err}); fix or remove it") from err
    return masks
