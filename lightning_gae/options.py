"""Options grouped by concern, shared by ``GAECallback`` and :func:`~lightning_gae.compare.compare`; each group
checks itself when built.

``GAECallback`` takes all four beside its everyday arguments; ``compare`` takes the two that apply to a finished
model (``faithfulness``: its metrics and batch size; ``engine``: embedding layer, token sets, their inputs). A YAML
config of ``LightningCLI`` sets them as nested keys of the callback's ``init_args``::

    - class_path: lightning_gae.callbacks.GAECallback
      init_args:
        methods: [gae, rollout]
        faithfulness:
          metrics: [positive_perturbation_auc]
          samples: 128
        batches:
          inputs: recipes.text.batch_inputs
        display:
          heatmap_scale: fixed

and on the command line ``--trainer.callbacks.faithfulness.samples=64`` overrides one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lightning_gae.display import Scale
from lightning_gae.engine.token_sets import Streams
from lightning_gae.metrics import PERTURBATION_METRICS
from lightning_gae.modalities.regions import Region

__all__ = ["BatchOptions", "DisplayOptions", "EngineOptions", "FaithfulnessOptions", "RegionOptions"]


def _positive(owner: str, name: str, value: Any, allow_none: bool = False, hint: str = "") -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}({name}={value!r}): use a positive integer{hint}")


@dataclass
class FaithfulnessOptions:
    """How faithful each method is, scored on a fixed subset of the validation set.

    Args:
        metrics: faithfulness metrics by name, any of ``"positive_perturbation_auc"``,
            ``"negative_perturbation_auc"``, ``"deletion_auc"``, ``"insertion_auc"``, ``"comprehensiveness"``,
            ``"sufficiency"``, ``"aopc"``, ``"abpc"``; tokens are removed the modality's way. ``()``: none (ground truth
            in the batches is still scored).
        random_baseline: also score a seeded random attribution, the floor every method should beat.
        samples: how many validation samples (seeded, stratified by class when there are labels, at most the
            samples read) the metrics and the ground-truth scalars are scored on, apart from the samples shown;
            each scalar ``<metric>/<method>`` comes with its standard error ``<metric>/<method>/stderr`` over them.
            0 scores the displayed samples instead, at every explanation step.
        interim_samples: how many of ``samples`` a ``fit`` scores (a seeded, stratified part, the same at every
            step and on the final weights, so that a curve's points differ by the weights, not by the samples);
            ``validate``/``test`` score all ``samples``. 0, or at least ``samples``: all of them at every point.
        every_n_explanations: when a ``fit`` scores: at the first explanation step and every ``n``-th after it
            (1: every step), and on the final weights; None: the final weights only.
        max_batch: at most this many samples per explained batch and perturbed inputs per forward.

    Raises:
        ValueError: an unknown metric, a negative count, or a schedule that is not a positive integer.
    """

    metrics: Sequence[str] = ("positive_perturbation_auc", "negative_perturbation_auc")
    random_baseline: bool = True
    samples: int = 256
    interim_samples: int = 32
    every_n_explanations: int | None = 2
    max_batch: int = 256

    def __post_init__(self) -> None:
        self.metrics = tuple(self.metrics)
        unknown = [m for m in self.metrics if m not in PERTURBATION_METRICS]
        if unknown:
            raise ValueError(f"FaithfulnessOptions(metrics={list(self.metrics)}): {unknown} are not metrics; choose "
                             f"from {sorted(PERTURBATION_METRICS)}")
        _positive("FaithfulnessOptions", "max_batch", self.max_batch)
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 0:
            raise ValueError(f"FaithfulnessOptions(samples={self.samples!r}): use a positive integer, or 0 to score "
                             "the displayed samples")
        _positive("FaithfulnessOptions", "every_n_explanations", self.every_n_explanations, allow_none=True,
                  hint=" (1: every explanation step), or None to score once, on the final weights")
        if isinstance(self.interim_samples, bool) or not isinstance(self.interim_samples, int) or self.interim_samples < 0:
            raise ValueError(f"FaithfulnessOptions(interim_samples={self.interim_samples!r}): use a positive integer, "
                             "or 0 to score all the samples at every scheduled step")


@dataclass
class BatchOptions:
    """Which validation batches the samples come from and how a batch is read.

    Args:
        dataloader_idx: which validation dataloader: its position (as ``validation_step``'s ``dataloader_idx``
            numbers them) or, for a mapping of dataloaders or a ``CombinedLoader`` over one, its key.
        inputs: ``batch -> model inputs``; None: ``x`` of ``(x, y)``, a mapping without its labels and ground truth.
        labels: ``batch -> labels``; None: ``y`` of ``(x, y)``, a mapping's (or dataclass's) ``labels``/``label``,
            else its one ``y``, ``target`` or ``targets``.
        ground_truth: ``batch -> masks [B, H, W] or rationales [B, T]``; None: a mapping's
            ``masks``/``segmentation``/``rationales``, or ``z`` of ``(x, y, z)``.
        max_scan_batches: at most this many validation batches are read to choose the samples.
        sample_indices: positions in the validation set to track instead of a seeded choice.
        seed: seed of the choice of the tracked samples and of the faithfulness subset.

    Raises:
        ValueError: a ``dataloader_idx`` that is neither a position nor a key, a scan limit below 1, or a
            negative sample index.
    """

    dataloader_idx: int | str = 0
    inputs: Callable[[Any], Any] | None = None
    labels: Callable[[Any], Tensor | None] | None = None
    ground_truth: Callable[[Any], Tensor | None] | None = None
    max_scan_batches: int = 64
    sample_indices: Sequence[int] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        index = self.dataloader_idx
        if isinstance(index, bool) or not isinstance(index, (int, str)) or (isinstance(index, int) and index < 0):
            raise ValueError(f"BatchOptions(dataloader_idx={index!r}): use a position 0, 1, ... or the key of a "
                             "mapping of validation dataloaders")
        _positive("BatchOptions", "max_scan_batches", self.max_scan_batches)
        for name in ("inputs", "labels", "ground_truth"):
            reader = getattr(self, name)
            if reader is not None and not callable(reader):
                raise ValueError(f"BatchOptions({name}={reader!r}): give a function batch -> {name}, or None for "
                                 "the default reader")
        if self.sample_indices is not None:
            self.sample_indices = [int(i) for i in self.sample_indices]
            if any(i < 0 for i in self.sample_indices):
                raise ValueError(f"BatchOptions(sample_indices={self.sample_indices}): positions in the validation "
                                 "set are 0 or more")


@dataclass
class EngineOptions:
    """How the model is explained, where it cannot be found out by itself.

    Args:
        attention_modules: module-path globs of the modules whose output is the attention probabilities
            (``attention_modules=`` of :func:`~lightning_gae.explain`), for models that compute attention
            without a softmax the capture recognises.
        streams: declares the token sets where no preset or inference finds them (:class:`~lightning_gae.Streams`).
        embedding_layer: module path of the token embedding, for Captum baselines on token ids and for
            ``"attnlrp"``; None finds it for Hugging Face models.
        set_inputs: for several token sets, which model input each set's tokens come from: the key of a mapping
            input or the position in a tuple input, e.g. ``{"encoder": 0, "decoder": 1}``. None finds the one
            input each set's modality fits; when two fit alike the run stops and asks for this.
        answer_tokens: explain a causal language model's answer tokens (the labels that are not -100), each one
            a sample read at the position that predicts it; None: when the module holds a Hugging Face causal LM
            and the batches carry ``input_ids`` and ``labels [B, T]``.

    Raises:
        ValueError: arguments of the wrong type.
    """

    attention_modules: Sequence[str] | None = None
    streams: Streams | None = None
    embedding_layer: str | None = None
    set_inputs: Mapping[str, int | str] | None = None
    answer_tokens: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.attention_modules, str):
            self.attention_modules = [self.attention_modules]
        if self.streams is not None and not isinstance(self.streams, Streams):
            raise ValueError(f"EngineOptions(streams={self.streams!r}): give a lightning_gae.Streams(...)")
        if self.set_inputs is not None and not isinstance(self.set_inputs, Mapping):
            raise ValueError(f"EngineOptions(set_inputs={self.set_inputs!r}): give a mapping token set -> input key "
                             "or tuple position")
        if self.answer_tokens is not None and not isinstance(self.answer_tokens, bool):
            raise ValueError(f"EngineOptions(answer_tokens={self.answer_tokens!r}): use True, False or None")


@dataclass
class DisplayOptions:
    """How the explanations are drawn.

    Args:
        evolution_length: how many past heatmaps an evolution strip shows; a sample's strip is written every
            ``evolution_length`` explanation steps and at the last one of a run.
        top_fraction: the share of tokens counted as "top" by the overlap and concentration scalars.
        heatmap_scale: ``"per_map"`` (each heatmap's colours span 0 to its own largest magnitude) or ``"fixed"``
            (a method's colour range is set at its first logged step and kept, so that steps compare).

    Raises:
        ValueError: a non-positive length, a fraction outside (0, 1], an unknown scale.
    """

    evolution_length: int = 5
    top_fraction: float = 0.1
    heatmap_scale: Scale = "per_map"

    def __post_init__(self) -> None:
        _positive("DisplayOptions", "evolution_length", self.evolution_length)
        if not 0 < self.top_fraction <= 1:
            raise ValueError(f"DisplayOptions(top_fraction={self.top_fraction}): use a fraction in (0, 1]")
        if self.heatmap_scale not in ("per_map", "fixed"):
            raise ValueError(f"DisplayOptions(heatmap_scale={self.heatmap_scale!r}): use 'per_map' (each map its own "
                             "colour range) or 'fixed' (each method's range from its first step)")


@dataclass
class RegionOptions:
    """Regions of the input declared once, watched over training: where relevance should sit, and where it should not.

    At every explanation step the callback logs, per method and region, ``region_share_<region>/<method>`` (the
    share of the positive relevance mass on the region, mean over the tracked samples that hold it) and
    ``region_recall_<region>/<method>`` (how many of the region's tokens are among the ``top_k`` most relevant),
    with ``random`` as the floor, charted per region in Custom Scalars ("GAE regions"). Chance is the yardstick: when
    a method puts more of its relevance on a *suspect* region than uniform random relevance would, per sample
    (region tokens over the tokens a region can hold in it), by more than two standard errors and by more than
    ``margin`` (:func:`~lightning_gae.metrics.regions.beyond_chance`), or less on an *evidence* region by as much,
    the callback warns once for that method and region, with the step, the share beside chance's, the samples most
    affected, the method's faithfulness and a removal check (the drop of the explained class's probability when the
    region is removed, against random regions of its size: whether the model really uses it); the alert also goes to
    the Text tab (``gae_alerts``) and to the summary printed when the run ends. ``threshold`` and ``rise`` add
    absolute rules for suspect regions.

    Args:
        regions: the regions (:class:`~lightning_gae.modalities.regions.Region`: an image mask, text token ids or a
            predicate, table features; kind ``"evidence"`` or ``"suspect"``).
        margin: how far (in share points) a method's mean share must exceed chance's on a suspect region, or fall short
            of it on an evidence region, beyond two standard errors, to raise the alert; None: never by chance. The
            default 0.05 catches the shortcut recipes and a one-patch corner shortcut and stays silent on their clean
            twins and on a region that covers the whole input.
        threshold: the share of a method's relevance on a suspect region that raises the alert; None: never by share.
        rise: the rise of that share since the run's first explanation step that raises it; None: never by rise.
        top_k: how many of the most relevant tokens the recall counts; None: as many as the region has.
        stop_on_shortcut: also stop training (``trainer.should_stop``) when an alert is raised.
        from_data: also the regions the datamodule declares (its ``region`` or ``regions`` attribute, as the shortcut
            recipes' data modules do), read when fit starts: what a YAML config uses, since it cannot build a mask.

    Raises:
        ValueError: something that is not a ``Region``, two regions with one name, a threshold or rise outside
            (0, 1], a margin outside [0, 1), a ``top_k`` below 1.
    """

    regions: Sequence[Region] = ()
    threshold: float | None = None
    rise: float | None = None
    top_k: int | None = None
    stop_on_shortcut: bool = False
    from_data: bool = False
    margin: float | None = 0.05

    def __post_init__(self) -> None:
        self.regions = tuple(self.regions)
        wrong = [type(r).__name__ for r in self.regions if not isinstance(r, Region)]
        if wrong:
            raise ValueError(f"RegionOptions(regions=...): {wrong} are not lightning_gae.modalities.regions.Region")
        names = [r.name for r in self.regions]
        if len(set(names)) != len(names):
            raise ValueError(f"RegionOptions(regions=...): the names {names} repeat; give every region its own")
        for name in ("threshold", "rise"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"RegionOptions({name}={value}): use a share in (0, 1], or None")
        if self.margin is not None and not 0 <= self.margin < 1:
            raise ValueError(f"RegionOptions(margin={self.margin}): use share points in [0, 1) above chance, or None")
        _positive("RegionOptions", "top_k", self.top_k, allow_none=True)
