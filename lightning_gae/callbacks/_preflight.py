"""GAECallback's check when a run starts: the tracked samples explained once, so what cannot work stops the run
with its fix before the first training step.

Every method and Captum baseline runs on the samples, the modality (given or inferred) maps their relevance back to
the inputs, every picture of the first logged step is drawn once (written nowhere), and what the metrics and the
ground truth's metric ask of the modality is asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from lightning_gae._structures import display_input, map_tensors
from lightning_gae.callbacks._explainer import Explainer
from lightning_gae.callbacks.batch_layout import forward_hint
from lightning_gae.callbacks._state import RunState
from lightning_gae.callbacks._token_sets import prepare_sets
from lightning_gae.callbacks.answer_samples import keep_readout
from lightning_gae.options import EngineOptions
from lightning_gae.callbacks.samples import class_names
from lightning_gae.metrics.ground_truth import scored_truth
from lightning_gae.modalities import ImageTokens, Modality, TextTokens
from lightning_gae.modalities.inputs import infer_token_modality
from lightning_gae.tensorboard.summary import TensorBoardViews

__all__ = ["check_explanations", "check_removal", "infer_modality"]

def check_explanations(run: RunState, trainer: Trainer, pl_module: LightningModule, inputs: Any, explain: Explainer,
                       modality: Modality | Mapping[str, Modality] | None, methods: Sequence[str], target: Any,
                       query: Any, metrics: Sequence[str], captum_baselines: Sequence[str], engine: EngineOptions,
                       new_views: Callable[[], TensorBoardViews]) -> None:
    """Explain the tracked ``inputs`` once and settle ``run.modality`` (or ``run.sets``); raise with the fix."""
    try:
        explanations, maps = explain(pl_module, inputs)
    except Exception as err:
        hint = forward_hint(pl_module, inputs, err)
        raise ValueError(f"GAECallback: the tracked validation samples cannot be explained, so the run stops "
                         f"before training ({type(err).__name__}: {err}).{hint}") from err
    first = next(iter(explanations.values()))
    if len(first.relevance) > 1:
        prepare_sets(run, trainer, pl_module, inputs, explanations, modality, methods, target, metrics,
                     captum_baselines, engine, new_views)
        return
    if isinstance(modality, Mapping):
        raise ValueError(f"GAECallback(modality={{{', '.join(map(repr, modality))}: ...}}) names token sets, but "
                         f"the model attends over one set of {first.tokens.shape[1]} tokens: pass one modality")
    run.sets = None
    if run.readout is not None:
        modality = keep_readout(TextTokens() if modality is None else modality)
    if modality is None:
        modality = infer_modality(trainer, pl_module, run, inputs, first.tokens.shape[1])
    if modality is None:
        raise ValueError(
            "GAECallback: cannot infer the modality of these inputs; pass modality=ImageTokens(patch_size=...), "
            "TextTokens(tokenizer=...) or TabularTokens(feature_names=[...])"
        )
    if modality.first_token_is_input and query == 0:
        rank_zero_warn(
            f"GAECallback: {modality!r} has no CLS token, so query=0 explains the first patch, not the "
            "prediction; pass GAECallback(query=\"mean\") to explain the pooled patches",
            category=UserWarning,
        )
    try:
        run.modality = modality
        shown = display_input(inputs).detach().cpu()
        # to_input first: its error says which layout would fit the token count.
        for exp in explanations.values():
            modality.to_input(exp.tokens.detach().cpu(), shown)
        # Every picture and tensor the first logged step will write, drawn once by views that write nowhere.
        new_views().write([], 0, modality=modality, inputs=inputs, shown=shown, sample_indices=run.shown,
                          explanations=explanations, maps=maps, labels=run.labels, class_names=class_names(trainer))
        # What the metrics and the ground truth's metric ask of the modality before their forwards.
        cpu_inputs = map_tensors(inputs, lambda t: t.cpu())
        if metrics:
            modality.unit_scores(first.tokens.cpu(), cpu_inputs)
            check_removal(modality, cpu_inputs, metrics)
        truth = run.truth
        entry = None if truth is None else scored_truth(modality, truth)
        if entry is not None and truth is not None:
            entry.update_args(modality, cpu_inputs, first.tokens.cpu(), truth)
    except Exception as err:
        run.modality = None
        if isinstance(err, _CannotRemove):
            raise ValueError(str(err)) from err.__cause__
        raise ValueError(f"GAECallback(modality={modality!r}) does not fit the model's explanations of these "
                         f"inputs: {type(err).__name__}: {err}") from err


class _CannotRemove(Exception):
    """The modality fits the explanations, but the metrics cannot remove its units: its own message, unwrapped."""


def check_removal(modality: Modality, inputs: Any, metrics: Sequence[str]) -> None:
    """Remove every removable unit of ``inputs`` once, as the metrics will: a modality that cannot (a ``TextTokens``
    with no id to put in a removed token's place) stops the run now instead of failing every scored step.

    Raises:
        _CannotRemove: naming the modality's argument to give, or ``FaithfulnessOptions(metrics=())``.
    """
    try:
        modality.remove(inputs, modality.removable(inputs))
    except Exception as err:
        raise _CannotRemove(
            f"GAECallback(faithfulness=FaithfulnessOptions(metrics={list(metrics)})): the metrics remove parts of the "
            f"inputs, but modality={modality!r} cannot remove them ({type(err).__name__}: {err}). Give the modality "
            "what it asks for, or pass faithfulness=FaithfulnessOptions(metrics=()) to score no removal metric"
        ) from err


def infer_modality(trainer: Trainer, pl_module: LightningModule, run: RunState, inputs: Any,
                   num_tokens: int) -> Modality | None:
    """The modality of inputs that say it: images whose patch grid fits the tokens, integer token ids one per token
    (``input_ids``), or features ``[B, F]`` one per token (after at most one prefix token); else None.

    Text takes the ``tokenizer`` of the module or data module if one has it; tabular features are named by their
    input and removed to their mean over the samples read. Both are said once, with the argument that sets them.
    """
    image = ImageTokens.infer(display_input(inputs), num_tokens)
    if image is not None:
        return image
    holders = (pl_module, getattr(trainer, "datamodule", None))
    fit_on = display_input(run.scored.inputs) if run.scored is not None else None
    found, note = infer_token_modality(pl_module, inputs, num_tokens, holders, fit_on)
    if note is not None:
        rank_zero_warn(f"GAECallback: {note}")
    return found
