"""Ground truth per token set: how a model with several token sets (encoder/decoder, image/text) is scored against
the ground truth its samples carry, each batch key scoring the set it belongs to
(:data:`~lightning_gae.metrics.ground_truth.SET_TRUTH`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from torch import Tensor
from torchmetrics import Metric

from lightning_gae._structures import map_tensors
from lightning_gae.metrics import AlignmentAccuracy
from lightning_gae.metrics.ground_truth import SET_TRUTH, TruthScore, truth_score
from lightning_gae.metrics.stderr import SampleScores
from lightning_gae.modalities.inputs import token_set_input
from lightning_gae.modalities.regions import region_valid_tokens
from lightning_gae.modalities.tokens import Modality

__all__ = ["SetScorers", "score_sets", "set_scorers", "set_truths"]


SetScorers = dict[str, tuple[str, Callable[[], Metric], Callable[..., tuple[Any, ...]]]]
"""Batch key -> (column prefix, a new metric, (chunk, relevance by set, truth) -> its update arguments)."""


def set_truths(metrics: Sequence[str], modality: Modality | Mapping[str, Modality] | None,
                ground_truth: Tensor | Mapping[str, Tensor] | None, sizes: Mapping[str, int]) -> dict[str, Tensor]:
    """The ground truth by batch key of a model with several token sets (``compare``'s arguments), or raise: no
    perturbation metric applies, and the modality and ground truth are mappings by set and by batch key."""
    if metrics:
        raise ValueError(
            f"FaithfulnessOptions(metrics={list(metrics)}) cannot apply to a model with the token sets {list(sizes)}: a perturbation metric "
            "removes units of one input and reads one class logit per sample, and here neither says which set's tokens "
            "to remove. Pass faithfulness=FaithfulnessOptions(metrics=()) and score the sets against ground truth (ground_truth={'alignment' | 'masks' | "
            "'rationales': tensor})"
        )
    if modality is not None and not isinstance(modality, Mapping):
        raise ValueError(f"modality={modality!r}: the model has the token sets {list(sizes)}; pass one per set, "
                         "modality={set: ImageTokens(...)/TextTokens(...)}")
    if ground_truth is not None and not isinstance(ground_truth, Mapping):
        raise ValueError(f"ground_truth of a model with the token sets {list(sizes)} is a mapping from the batch key "
                         f"({list(SET_TRUTH)}) to its tensor, so that each set is scored with its own")
    truths = dict(ground_truth or {})
    unknown = [k for k in truths if k not in SET_TRUTH]
    if unknown:
        raise ValueError(f"ground_truth keys {unknown}: use {list(SET_TRUTH)}")
    return truths


def set_scorers(truths: Mapping[str, Tensor], sizes: Mapping[str, int], layout: Mapping[str, Any], sequence: bool,
                 probe: Any, total: int) -> SetScorers:
    """Each ground truth's scorer (:data:`SetScorers`) of a model with several token sets, or raise.

    ``"alignment"`` scores the source set's rows per target position (``sequence`` outputs of two sets); the other keys
    score the one set whose modality's ``ground_truth`` is their kind (``layout``: set -> ``(modality, input key)``, as
    :func:`~lightning_gae.modalities.inputs.token_set_inputs` gives it) by its entry of
    :data:`~lightning_gae.metrics.ground_truth.GROUND_TRUTH`.
    """
    scorers: SetScorers = {}
    for key, truth in truths.items():
        if truth.shape[0] != total:
            raise ValueError(f"ground_truth[{key!r}] has {truth.shape[0]} samples for {total} inputs; give one per sample")
        kind = SET_TRUTH[key]
        if kind is None:
            if not sequence or len(sizes) != 2:
                raise ValueError(f"ground_truth['alignment'] scores a source set per target position: it needs sequence "
                                 f"logits [B, T, C] over the query set, a class target and two token sets; the model has "
                                 f"{list(sizes)} and logits {None if probe.logits is None else tuple(probe.logits.shape)}")
            source = next(x for x in sizes if x != probe.query_set)
            scorers[key] = (f"{source}/alignment_accuracy", lambda: AlignmentAccuracy(sync_on_compute=False),
                            _alignment_args(source, *layout[source]))
            continue
        owners = [x for x, (m, _) in layout.items() if m.ground_truth == kind]
        if len(owners) != 1 or sequence:
            raise ValueError(f"ground_truth[{key!r}] scores the one set whose modality scores {kind!r} ground truth, of "
                             "a model read at one position; "
                             f"the sets are {[f'{x}: {m!r}' for x, (m, _) in layout.items()]}"
                             + ("; its outputs are sequences" if sequence else ""))
        x, (set_modality, input_key) = owners[0], layout[owners[0]]
        score = truth_score(set_modality)

        def update_args(chunk: Any, by_set: Mapping[str, Tensor], truth: Tensor, x: str = x, m: Modality = set_modality,
                        k: int | str = input_key, score: TruthScore = score) -> tuple[Any, ...]:
            return score.update_args(m, token_set_input(chunk, k)[1], by_set[x], truth)

        scorers[key] = (f"{x}/{score.name}", partial(score.metric, set_modality), update_args)
    return scorers


def _alignment_args(source: str, modality: Modality, key: int | str) -> Callable[..., tuple[Any, ...]]:
    """The alignment's update arguments: the source set's rows, the alignment, and the source tokens that count
    (a text set's real tokens: padding is never the aligned position)."""

    def update_args(chunk: Any, by_set: Mapping[str, Tensor], truth: Tensor) -> tuple[Any, ...]:
        rows = by_set[source]
        source_inputs = map_tensors(token_set_input(chunk, key)[1], lambda t: t.detach().cpu())
        return rows, truth, region_valid_tokens(modality, source_inputs, rows.shape[-1])

    return update_args


def score_sets(scores: SampleScores, method: str, scorers: SetScorers, metric: Callable[[str, Callable[[], Metric]], Metric],
               chunk: Any, by_set: Mapping[str, Tensor], truths: Mapping[str, Tensor]) -> None:
    """One batch of ``method``'s relevance by set (``by_set``: ``[B, N_set]``, or a decoder's rows ``[B, T, N_set]``)
    scored by every scorer against its ground truth (``truths``: batch key -> this batch's), one sample at a time,
    into ``scores`` under the scorer's column (``<set>/<name>``); ``metric(column, build)`` gives the metric object."""
    for key, (name, build, args) in scorers.items():
        scores.add_updates(name, method, metric(name, build), args(chunk, by_set, truths[key]))
