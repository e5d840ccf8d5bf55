"""Options grouped by concern, shared by ``GAECallback`` and :func:`~lightning_gae.compare.compare`; each group
checks itself when built.

``GAECallback`` takes all five beside its everyday arguments; ``compare`` takes the two that apply to a finished
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

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from numbers import Real
from typing import Any

from torch import Tensor

from lightning_gae.display import Scale
from lightning_gae.engine.token_sets import Streams
from lightning_gae.metrics import PERTURBATION_METRICS
from lightning_gae.modalities.regions import Region

__all__ = ["BatchOptions", "DisplayOptions", "EngineOptions", "FaithfulnessOptions", "RegionOptions"]


# --- one check per field ----------------------------------------------------------------------------------------
# Every group checks every field the same way: ``settle`` runs each field's ``Field`` and keeps the value it reads;
# a refusal names the group, the field, the value and the forms the field accepts. GAECallback's own arguments use
# the same checks (callbacks/_arguments.py).


@dataclass(frozen=True)
class Field:
    """What one argument accepts: ``read(value)`` returns the value as it is kept, or raises ``ValueError`` whose
    text says what is wrong and which forms are accepted (:func:`settle` puts ``Owner(field=value): `` before it)."""

    read: Callable[[Any], Any]
    show: bool = True
    """Whether the refusal shows the value (a region's mask is too long to: it shows ``...``)."""


def shown(value: Any, limit: int = 100) -> str:
    """``value`` as a refusal shows it: a tuple as the list a YAML file would give, a long value cut short."""
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def check_field(owner: str, name: str, value: Any, field: Field) -> Any:
    """``field.read(value)``, its refusal prefixed with ``owner(name=value): ``."""
    try:
        return field.read(value)
    except ValueError as refused:
        raise ValueError(f"{owner}({name}={shown(value) if field.show else '...'}): {refused}") from None


def checked(owner: str, values: Mapping[str, Any], checks: Mapping[str, Field]) -> dict[str, Any]:
    """Every one of ``values`` (argument -> value) read by its entry of ``checks``. An argument without a check is a
    mistake of ``owner``'s own code (every argument is checked): a ``TypeError``."""
    if sorted(values) != sorted(checks):
        raise TypeError(f"{owner}: the arguments {sorted(set(values) ^ set(checks))} need a check each")
    return {name: check_field(owner, name, value, checks[name]) for name, value in values.items()}


def settle(group: Any, checks: Mapping[str, Field]) -> None:
    """Checks every field of the dataclass ``group`` by its entry of ``checks`` (:func:`checked`) and keeps what
    each reads."""
    values = {f.name: getattr(group, f.name) for f in fields(group)}
    for name, value in checked(type(group).__name__, values, checks).items():
        setattr(group, name, value)


def _or_none(text: str, none: str | None) -> str:
    return text if none is None else f"{text}, or None ({none})"


def _integer(value: Any) -> int | None:
    """``value`` as an int when it is an integer (numpy's and 0-d integer tensors included), bool not; else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def flag(none: str | None = None) -> Field:
    """``True`` or ``False`` (``none``: also None, which means ``none``); ``"no"``, 0 and 1 are refused."""
    def read(value: Any) -> bool | None:
        if isinstance(value, bool) or (value is None and none is not None):
            return value
        raise ValueError(_or_none("use True or False", none))
    return Field(read)


def count(minimum: int = 1, none: str | None = None, hint: str = "") -> Field:
    """An integer of at least ``minimum`` (``none``: or None, meaning that); floats, strings and bools are refused."""
    words = {0: "an integer, 0 or more", 1: "a positive integer"}.get(minimum, f"an integer of at least {minimum}")

    def read(value: Any) -> int | None:
        if value is None and none is not None:
            return None
        number = _integer(value)
        if number is None or number < minimum:
            raise ValueError(_or_none(f"use {words}{hint}", none))
        return number
    return Field(read)


def share(words: str = "a share", none: str | None = None) -> Field:
    """A number in ``(0, 1]`` (an int or a float; bools and strings are refused), kept as a float."""
    def read(value: Any) -> float | None:
        if value is None and none is not None:
            return None
        number = float(value) if isinstance(value, Real) and not isinstance(value, bool) else math.nan
        if not 0 < number <= 1:
            raise ValueError(_or_none(f"use {words} in (0, 1]", none))
        return number
    return Field(read)


def one_of(options: Sequence[str], meanings: str) -> Field:
    """One of the strings ``options`` (``meanings`` says what each does)."""
    def read(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError(f"use {' or '.join(repr(o) for o in options)} ({meanings})")
        return value
    return Field(read)


def function(none: str | None = None, words: str = "a function") -> Field:
    """A callable (``none``: or None, meaning that)."""
    def read(value: Any) -> Any:
        if (value is None and none is not None) or callable(value):
            return value
        raise ValueError(_or_none(f"give {words}", none))
    return Field(read)


def instance(kind: type, words: str, none: str | None = None) -> Field:
    """An instance of ``kind`` (``words``: how it is built, e.g. ``lightning_gae.Streams(...)``)."""
    def read(value: Any) -> Any:
        if (value is None and none is not None) or isinstance(value, kind):
            return value
        raise ValueError(_or_none(f"give {words}", none))
    return Field(read)


def _listed(value: Any, accepted: str) -> list[Any]:
    """The items of a list-like ``value`` (a list, a tuple, a 1-d array); a single string, mapping or set is refused
    with ``accepted`` (it would be read character by character, key by key, or in no order)."""
    if isinstance(value, (str, bytes, Mapping, set, frozenset)) or not isinstance(value, Iterable):
        raise ValueError(accepted)
    return list(value)


def _twice(items: Sequence[Any]) -> list[Any]:
    return sorted({i for i in items if items.count(i) > 1}, key=str)


def names(choices: Callable[[], Sequence[str]], what: str, empty: str | None = None,
          hints: Callable[[list[str]], str] | None = None) -> Field:
    """A list of distinct names out of ``choices()`` (read when checked: registries grow), kept as a tuple;
    ``empty``: what an empty list means (None: it is refused); ``hints(unknown)``: a pointer for names that belong
    elsewhere."""
    def read(value: Any) -> tuple[str, ...]:
        known = list(choices())
        accepted = f"choose from {known}" + ("" if empty is None else f", or () for {empty}")
        example = f"[{value!r}]" if isinstance(value, str) else f"[{known[0]!r}]" if known else "[]"
        items = _listed(value, f"give a list of {what}, e.g. {example}")
        unknown = [i for i in items if i not in known]
        if unknown:
            hint = hints(unknown) if hints is not None else ""
            raise ValueError(f"{unknown} are not {what}; {hint + '; ' if hint else ''}{accepted}")
        if _twice(items):
            raise ValueError(f"{_twice(items)} are given more than once; name each once ({accepted})")
        if not items and empty is None:
            raise ValueError(f"name at least one; {accepted}")
        return tuple(items)
    return Field(read)


def _key_or_position(value: Any) -> int | str | None:
    """A key (a string) or a position (an integer 0 or more), else None."""
    if isinstance(value, str):
        return value
    position = _integer(value)
    return position if position is not None and position >= 0 else None


def _dataloader(value: Any) -> int | str:
    read = _key_or_position(value)
    if read is None:
        raise ValueError("use a position 0, 1, ... or the key of a mapping of validation dataloaders")
    return read


def _positions(value: Any) -> list[int] | None:
    accepted = ("give a list of distinct positions in the validation set (integers 0 or more, e.g. [0, 5]), or None "
                "for a seeded choice")
    if value is None:
        return None
    items = _listed(value, accepted)
    read = [_integer(i) for i in items]
    positions = [r for r in read if r is not None and r >= 0]
    if len(positions) < len(items):
        raise ValueError(f"{shown([i for i, r in zip(items, read) if r is None or r < 0])} are no positions; {accepted}")
    if not positions:
        raise ValueError(accepted)
    if _twice(positions):
        raise ValueError(f"{_twice(positions)} are given more than once; {accepted}")
    return positions


def _seed(value: Any) -> int:
    seed = _integer(value)
    if seed is None or not 0 <= seed < 2**32:
        raise ValueError("use an integer from 0 to 2**32 - 1")
    return seed


def _globs(value: Any) -> str | list[str] | None:
    accepted = ("give module-path globs, a list of strings (e.g. ['blocks.*.attn.attn_drop']) or one string, or None "
                "(the softmaxes and attention functions the capture recognises)")
    if value is None:
        return None
    items = [value] if isinstance(value, str) else _listed(value, accepted)
    if not items or not all(isinstance(i, str) and i for i in items):
        raise ValueError(accepted)
    return items


def _module_path(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise ValueError("give the module path of the token embedding (a string, e.g. 'bert.embeddings.word_embeddings'), "
                     "or None to find it for Hugging Face models")


def _set_inputs(value: Any) -> dict[str, int | str] | None:
    accepted = ("give a mapping token set -> input key or tuple position, e.g. {'encoder': 0, 'decoder': 1}, or None "
                "to find the input each set's modality fits")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(accepted)
    read = {k: _key_or_position(v) for k, v in value.items()}
    kept = {k: v for k, v in read.items() if isinstance(k, str) and v is not None}
    if len(kept) < len(read):
        wrong = {k: v for k, v in value.items() if k not in kept}
        raise ValueError(f"the entries {shown(wrong)} are not set name -> key or position; {accepted}")
    return kept


def _regions(value: Any) -> tuple[Region, ...]:
    if isinstance(value, Region):
        raise ValueError(f"give a list of regions: regions=[Region({value.name!r}, ...)]")
    items = _listed(value, "give a list of lightning_gae.modalities.regions.Region(...), e.g. "
                           "[Region('watermark', 'suspect', mask=...)]")
    wrong = [type(r).__name__ for r in items if not isinstance(r, Region)]
    if wrong:
        raise ValueError(f"{wrong} are not lightning_gae.modalities.regions.Region; give a list of Region(...)")
    named = [r.name for r in items]
    if _twice(named):
        raise ValueError(f"the names {named} repeat; give every region its own")
    return tuple(items)


def _margin(value: Any) -> float | None:
    number = float(value) if isinstance(value, Real) and not isinstance(value, bool) else math.nan
    if value is None:
        return None
    if not 0 <= number < 1:
        raise ValueError("use share points above chance, a number in [0, 1) (e.g. 0.05), or None: never by chance")
    return number


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
        ValueError: naming the field and what it accepts: an unknown or repeated metric (or one name instead of a
            list), a flag that is not True or False, a count that is not an integer (a float, a string, a bool) or
            is negative, a schedule or batch size below 1.
    """

    metrics: Sequence[str] = ("positive_perturbation_auc", "negative_perturbation_auc")
    random_baseline: bool = True
    samples: int = 256
    interim_samples: int = 32
    every_n_explanations: int | None = 2
    max_batch: int = 256

    def __post_init__(self) -> None:
        settle(self, {
            "metrics": names(lambda: sorted(PERTURBATION_METRICS), "metrics", empty="no metric"),
            "random_baseline": flag(),
            "samples": count(0, hint=" (0: score the displayed samples)"),
            "interim_samples": count(0, hint=" (0: score all the samples at every scheduled step)"),
            "every_n_explanations": count(hint=" (1: every explanation step)", none="score once, on the final weights"),
            "max_batch": count(),
        })


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
        ValueError: naming the field and what it accepts: a ``dataloader_idx`` that is neither a position nor a
            key, a reader that is not callable, a scan limit below 1, ``sample_indices`` that are not a list of
            distinct positions 0 or more (one string, a float, a repeated position), a seed outside 0 .. 2**32 - 1.
    """

    dataloader_idx: int | str = 0
    inputs: Callable[[Any], Any] | None = None
    labels: Callable[[Any], Tensor | None] | None = None
    ground_truth: Callable[[Any], Tensor | None] | None = None
    max_scan_batches: int = 64
    sample_indices: Sequence[int] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        settle(self, {
            "dataloader_idx": Field(_dataloader),
            "inputs": function("the default reader", "a function batch -> inputs"),
            "labels": function("the default reader", "a function batch -> labels"),
            "ground_truth": function("the default reader", "a function batch -> ground_truth"),
            "max_scan_batches": count(),
            "sample_indices": Field(_positions),
            "seed": Field(_seed),
        })


@dataclass
class EngineOptions:
    """How the model is explained, where it cannot be found out by itself.

    Args:
        attention_modules: module-path globs (a list, or one glob) of the modules whose output is the attention
            probabilities (``attention_modules=`` of :func:`~lightning_gae.explain`), for models that compute
            attention without a softmax the capture recognises.
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
        ValueError: naming the field and what it accepts: globs or a module path that are not (non-empty) strings,
            ``streams`` that are not a ``Streams``, ``set_inputs`` that are not a mapping of set names to input keys
            or positions, an ``answer_tokens`` that is not True, False or None.
    """

    attention_modules: Sequence[str] | None = None
    streams: Streams | None = None
    embedding_layer: str | None = None
    set_inputs: Mapping[str, int | str] | None = None
    answer_tokens: bool | None = None

    def __post_init__(self) -> None:
        settle(self, {
            "attention_modules": Field(_globs),
            "streams": instance(Streams, "a lightning_gae.Streams(...)", none="inferred or a preset"),
            "embedding_layer": Field(_module_path),
            "set_inputs": Field(_set_inputs),
            "answer_tokens": flag(none="when the module holds a Hugging Face causal LM and the batches carry labels"),
        })


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
        ValueError: naming the field and what it accepts: a length that is not a positive integer, a fraction that
            is not a number in (0, 1] (a bool or a string included), an unknown scale.
    """

    evolution_length: int = 5
    top_fraction: float = 0.1
    heatmap_scale: Scale = "per_map"

    def __post_init__(self) -> None:
        settle(self, {
            "evolution_length": count(),
            "top_fraction": share("a fraction"),
            "heatmap_scale": one_of(("per_map", "fixed"), "each map its own colour range, or each method's range from "
                                                          "its first step"),
        })


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
    region is removed, against random regions of its size: whether the model really uses it), and once more, as a
    follow-up, at the first later step whose removal check finds the region used where the alert's did not; the
    alert also goes to the Text tab (``gae_alerts``) and to the summary printed when the run ends. ``threshold`` and
    ``rise`` add absolute rules for suspect regions.

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
        ValueError: naming the field and what it accepts: regions that are not a list of ``Region`` (one
            ``Region`` alone included), two regions with one name, a threshold or rise that is not a number in
            (0, 1] or None, a margin that is not a number in [0, 1) or None, a ``top_k`` that is not a positive
            integer or None, a flag that is not True or False.
    """

    regions: Sequence[Region] = ()
    threshold: float | None = None
    rise: float | None = None
    top_k: int | None = None
    stop_on_shortcut: bool = False
    from_data: bool = False
    margin: float | None = 0.05

    def __post_init__(self) -> None:
        settle(self, {
            "regions": Field(_regions, show=False),
            "margin": Field(_margin),
            "threshold": share(none="never by share"),
            "rise": share(none="never by rise"),
            "top_k": count(none="as many as the region has"),
            "stop_on_shortcut": flag(),
            "from_data": flag(),
        })
