"""The tracked samples of one fit, validation or test of GAECallback, held by its Run (:mod:`.run`): read when the
stage starts, freed in teardown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from torchmetrics import Metric

from lightning_gae.callbacks.failures import Failures
from lightning_gae.callbacks.samples import Samples
from lightning_gae.language.answers import NextTokenLogits
from lightning_gae.modalities.tokens import Modality

__all__ = ["SHARED", "RunState"]


@dataclass
class RunState:
    """The tracked samples of a run and what was found out about them before the loops started.

    Attributes:
        sample_indices: the tracked samples' positions in the validation set.
        inputs, labels, truth, groups: the tracked samples (CPU); ``groups``: the samples left out together by the
            standard errors (a causal LM's answer rows: their prompt).
        keyed: ground truth by batch key (``alignment``, ``masks``, ``rationales``), for several token sets.
        scored: the faithfulness subset (None with ``samples=0``: the displayed samples are scored);
            ``interim``: the part of it a fit scores before the final weights (None: all of it).
        modality: the (query set's) modality; ``sets``: each token set's modality and input key, for models with
            several; ``last``: the last real position of the query set per sample, when a decoder's rows are drawn.
        row_names: a causal LM's answer rows' names; ``readout``: the model read at each row's readout.
        metric_objects: the metrics built for this run, by name (they hold the module).
        region_masks: each declared region's tokens in the tracked samples, ``[B, N]`` bool.
        failures: what failed in the run's explanation steps (warned once per kind, counted for the summary).
    """

    sample_indices: list[int] | None = None
    inputs: Any = None
    labels: Tensor | None = None
    truth: Tensor | None = None
    groups: Tensor | None = None
    keyed: dict[str, Tensor] = field(default_factory=dict)
    scored: Samples | None = None
    interim: Samples | None = None
    modality: Modality | None = None
    sets: dict[str, tuple[Modality, int | str]] | None = None
    last: Tensor | None = None
    row_names: list[str] | None = None
    readout: NextTokenLogits | None = None
    metric_objects: dict[str, Metric] = field(default_factory=dict)
    region_masks: dict[str, Tensor] = field(default_factory=dict)
    failures: Failures = field(default_factory=Failures)

    @property
    def shown(self) -> list[Any]:
        """What the views name each tracked sample by: its validation index, or ``"<index>/answer_<n>"``."""
        return self.row_names if self.row_names is not None else list(self.sample_indices or [])


# What rank zero reads from the validation set and every rank then tracks and scores.
SHARED = ("sample_indices", "inputs", "labels", "truth", "keyed", "groups", "scored", "interim", "row_names")
