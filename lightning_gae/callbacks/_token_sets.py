"""GAECallback on a model with several token sets: each set's modality and input, a decoder's rows, their check.

An encoder-decoder, a dual encoder or a co-attention model explains over several token sets
(``explain(...).relevance``): each set gets a modality and the model input its tokens come from; a decoder is
explained position by position (one row per target position); ground truth in the batches is scored per set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from torch import Tensor

from lightning_gae._structures import map_tensors
from lightning_gae.callbacks._state import RunState
from lightning_gae.options import EngineOptions
from lightning_gae.callbacks.samples import class_names
from lightning_gae.tensorboard.views import SetInput
from lightning_gae.engine.readout import Explanation
from lightning_gae.language.decoder_rows import is_sequence_output, last_positions, sequence_rows
from lightning_gae.modalities.inputs import token_set_input, token_set_inputs
from lightning_gae.modalities.tokens import Modality
from lightning_gae.tensorboard.summary import TensorBoardViews

__all__ = ["check_set_truth", "prepare_sets", "set_views", "decoder_rows"]


def set_views(run: RunState, inputs: Any) -> dict[str, SetInput]:
    """What the views draw each token set with; a text set among keyword inputs keeps its attention_mask."""
    assert run.sets is not None  # set at the run's start for a model with several token sets
    return {x: SetInput(modality, *token_set_input(inputs, key)) for x, (modality, key) in run.sets.items()}


def decoder_rows(run: RunState, pl_module: LightningModule, inputs: Any, methods: Sequence[str], target: Any,
                 engine: EngineOptions) -> dict[str, dict[str, Tensor]]:
    """Method -> set -> ``[B, T, N_set]``: row ``t`` is ``explain(..., query=t)``'s relevance of the set."""
    assert run.last is not None  # the decoder's positions are read first
    # Labels exist unless target='pred': target='label' checks it at the start; a callable target without labels
    # is not handled here (mypy sees it).
    labels = None if target == "pred" else run.labels.to(pl_module.device)  # type: ignore[union-attr]
    return {m: sequence_rows(pl_module, inputs, m, run.last.to(pl_module.device), labels,
                             attention_modules=engine.attention_modules, streams=engine.streams) for m in methods}


def check_set_truth(run: RunState, first: Explanation, rows: dict[str, dict[str, Tensor]] | None) -> None:
    """An ``alignment`` in the batches needs a decoder's rows over two token sets."""
    alignment = run.keyed.get("alignment")
    if alignment is None:
        return
    if rows is None:
        raise ValueError("the batches carry an alignment, but the model's explanations are not per target "
                         "position (sequence logits [B, T, C] over the query set and target='pred' or 'label')")
    if len(first.relevance) != 2 or alignment.dim() != 2 or alignment.shape[1] != first.tokens.shape[1]:
        raise ValueError(f"the alignment {tuple(alignment.shape)} must be [B, T] with T = {first.tokens.shape[1]} "
                         f"target positions, for a model with two token sets (it has {list(first.relevance)})")


def prepare_sets(run: RunState, trainer: Trainer, pl_module: LightningModule, inputs: Any,
                 explanations: dict[str, Explanation], modality: Modality | Mapping[str, Modality] | None,
                 methods: Sequence[str], target: Any, metrics: Sequence[str], captum_baselines: Sequence[str],
                 engine: EngineOptions, new_views: Callable[[], TensorBoardViews]) -> None:
    """Check a model with several token sets: a modality and an input per set, what can be scored, one drawing."""
    first = next(iter(explanations.values()))
    sets = list(first.relevance)
    if metrics or captum_baselines:
        raise ValueError(
            f"GAECallback: the model has the token sets {sets}; the perturbation metrics {list(metrics)} and "
            f"Captum baselines {list(captum_baselines)} remove or attribute one input and read class logits, "
            "which does not say which set's tokens to remove. Pass faithfulness=FaithfulnessOptions(metrics=()) and "
            "captum_baselines=() (ground truth in the batches, masks, rationales or alignment, is still scored per set)."
        )
    try:
        if modality is not None and not isinstance(modality, Mapping):
            raise ValueError(f"GAECallback(modality={modality!r}): the model has the token sets {sets}; pass one "
                             "modality per set, modality={set: ImageTokens(...)/TextTokens(...)}")
        run.sets = token_set_inputs(inputs, {x: r.shape[1] for x, r in first.relevance.items()}, modality,
                                    engine.set_inputs, "GAECallback")
        run.modality = run.sets[first.query_set][0]
        views = set_views(run, map_tensors(inputs, lambda t: t.detach().cpu()))
        rows = None
        run.last = None
        if is_sequence_output(first, target):
            if target == "label" and run.labels is not None and run.labels.dim() != 2:
                raise ValueError(f"target='label' on sequence outputs needs labels [B, T], one per target position; "
                                 f"the batches carry labels of shape {tuple(run.labels.shape)}")
            run.last = last_positions(pl_module, inputs, attention_modules=engine.attention_modules,
                                      streams=engine.streams).cpu()
            rows = decoder_rows(run, pl_module, inputs, methods, target, engine)
        check_set_truth(run, first, rows)
        assert run.sample_indices is not None  # chosen before the first step
        new_views().write([], 0, modality=run.modality, inputs=inputs, shown=views[first.query_set].shown,
                          sample_indices=run.sample_indices, explanations=explanations, labels=run.labels,
                          class_names=class_names(trainer), sets=views, rows=rows)
    except Exception as err:
        run.sets = run.modality = None
        raise ValueError(f"GAECallback(modality={modality!r}, engine=EngineOptions(set_inputs={engine.set_inputs!r})) "
                         f"does not fit the token sets {sets} of the model's explanations: {type(err).__name__}: "
                         f"{err}") from err
    # The single-set ground truth (the first of masks/rationales) is scored per set instead.
    run.truth = None
