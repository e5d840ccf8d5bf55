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
from torch import Tensor

from lightning_gae._structures import display_input, map_tensors
from lightning_gae.callbacks._state import RunState
from lightning_gae.callbacks._token_sets import prepare_sets
from lightning_gae.callbacks.answer_samples import keep_readout
from lightning_gae.options import EngineOptions
from lightning_gae.callbacks.samples import class_names
from lightning_gae.engine.readout import Explanation
from lightning_gae.metrics.ground_truth import scored_truth
from lightning_gae.modalities.tokens import ImageTokens, Modality, TextTokens
from lightning_gae.tensorboard.summary import TensorBoardViews

__all__ = ["check_explanations"]

Explainer = Callable[[LightningModule, Any], tuple[dict[str, Explanation], dict[str, Tensor]]]


def check_explanations(run: RunState, trainer: Trainer, pl_module: LightningModule, inputs: Any, explain: Explainer,
                       modality: Modality | Mapping[str, Modality] | None, methods: Sequence[str], target: Any,
                       query: Any, metrics: Sequence[str], captum_baselines: Sequence[str], engine: EngineOptions,
                       new_views: Callable[[], TensorBoardViews]) -> None:
    """Explain the tracked ``inputs`` once and settle ``run.modality`` (or ``run.sets``); raise with the fix."""
    try:
        explanations, maps = explain(pl_module, inputs)
    except Exception as err:
        hint = ""
        if isinstance(err, TypeError) and isinstance(inputs, Mapping):
            hint = (f" The model is called as model(**inputs) with the batch keys {list(inputs)}; if its "
                    "forward does not take all of them, pass batches=BatchOptions(inputs=lambda batch: {...}) that "
                    "keeps only its inputs.")
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
    if modality is None and run.readout is not None:
        modality = TextTokens()
    if run.readout is not None:
        modality = keep_readout(modality)
    if modality is None:
        modality = ImageTokens.infer(display_input(inputs), first.tokens.shape[1])
    if modality is None:
        raise ValueError(
            "GAECallback: cannot infer the modality of these inputs; pass modality=ImageTokens(patch_size=...), "
            "TextTokens(tokenizer=...) or TabularTokens(feature_names=[...])"
        )
    if isinstance(modality, ImageTokens) and modality.prefix_tokens == 0 and query == 0:
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
            modality.removable(cpu_inputs)
            modality.unit_scores(first.tokens.cpu(), cpu_inputs)
        entry = None if run.truth is None else scored_truth(modality, run.truth)
        if entry is not None:
            entry.update_args(modality, cpu_inputs, first.tokens.cpu(), run.truth)
    except Exception as err:
        run.modality = None
        raise ValueError(f"GAECallback(modality={modality!r}) does not fit the model's explanations of these "
                         f"inputs: {type(err).__name__}: {err}") from err
