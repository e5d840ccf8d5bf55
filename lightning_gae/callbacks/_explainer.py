"""What GAECallback explains inputs with: its methods and Captum baselines, told the target, the query and the engine's
options, as one value that the run's check, its explanation steps and its scoring call alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning.pytorch import LightningModule
from torch import Tensor

from lightning_gae.attribution import attribute
from lightning_gae.callbacks._tracked import tracked_target
from lightning_gae.engine.readout import Explanation
from lightning_gae.language.answers import NextTokenLogits
from lightning_gae.methods import explain_methods
from lightning_gae.options import EngineOptions

__all__ = ["Explainer"]


@dataclass(frozen=True)
class Explainer:
    """Explains inputs with every method and Captum baseline of a run: ``explainer(module, inputs, labels=None)``.

    Attributes:
        methods, captum_baselines, target, query, engine: the callback's arguments of the same names.
        seed: the Captum baselines' seed (``BatchOptions.seed``).
        tracked_labels: the tracked samples' labels, what ``target="label"`` explains when no ``labels`` are given.
        readout: a causal LM's answer rows are read through the logits at their readout (then ``query="last"``).
    """

    methods: tuple[str, ...]
    captum_baselines: tuple[str, ...]
    target: Any
    query: int | str
    engine: EngineOptions
    seed: int
    tracked_labels: Tensor | None = None
    readout: NextTokenLogits | None = None

    def __call__(self, pl_module: LightningModule, inputs: Any,
                 labels: Tensor | None = None) -> tuple[dict[str, Explanation], dict[str, Tensor]]:
        """Each method's explanation and each Captum baseline's attribution of ``inputs``.

        ``labels``: those of ``inputs`` when they are not the tracked samples (the faithfulness subset).
        """
        if labels is None or callable(self.target):
            target = tracked_target(self.target, self.tracked_labels, pl_module.device, self.query)
        else:
            target = None if self.target == "pred" else labels.to(pl_module.device)
        # One recorded forward for every method (GAE alone keeps its memory-lean path).
        readout = self.readout
        query: Any = "last" if readout is not None else self.query
        explanations = explain_methods(pl_module, inputs, self.methods, target=target, query=query,
                                       attention_modules=self.engine.attention_modules, streams=self.engine.streams,
                                       embedding_layer=self.engine.embedding_layer)
        first = next(iter(explanations.values()))
        # Every method explains the same classes: the first explanation's (the prediction or the label).
        classifier = readout if readout is not None else pl_module
        maps = {m: attribute(m, classifier, inputs, first.target, embedding_layer=self.engine.embedding_layer,
                             seed=self.seed)
                for m in self.captum_baselines}
        return explanations, maps
