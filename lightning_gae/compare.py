r"""GAE next to its attention baselines and Captum's gradient methods, on the same samples and metrics.

:func:`compare` scores every method (any name of :data:`~lightning_gae.attribution.ATTRIBUTION_METHODS`,
attributed by :func:`~lightning_gae.attribution.attribute`) with every metric, each value with its
standard error over the samples, and times the attribution step; :class:`Comparison` holds the
table. :func:`comparison_grid` draws the attributions of a few samples side by side. The scores are
:func:`lightning_gae.evaluation.score_batches`', the pipeline ``GAECallback`` scores with too, so the two agree
on the same samples.

The classes explained are fixed once for all methods. Samples go through :func:`attribute`
``batch_size`` at a time; only the attribution step is timed (``time.perf_counter``), the
metrics' own forwards are not. Each metric is updated with one sample at a time, so every value
comes with its standard error over the samples (the jackknife, which for a mean over samples
is the sample standard deviation over :math:`\sqrt{n}`), in :attr:`Comparison.stderr`.

With ``ground_truth``, each method is also scored against the known answer: image masks
``[N, H, W]`` give ``segmentation_{pixel_accuracy,miou,mean_ap}``
(:class:`~lightning_gae.metrics.RelevanceSegmentation`); rationale tokens ``[N, T]`` give
``rationale_{token_f1,auprc}`` over the removable tokens and informative features ``[N, F]``
give ``feature_recovery_{token_f1,auprc}`` (:class:`~lightning_gae.metrics.RationaleAgreement`,
``token_f1`` being the share of the top-k units that are right, k the number of right ones).
Attributions are scored as they come (Captum's signed maps included).

The two protocols of the CVPR 2021 table, with the labels as ``target``:

- ``protocol="target"``: every method explains ``target`` (None: the model's predictions) and
  the metrics score that class: accuracy is "the prediction is still ``target``";
- ``protocol="predicted"``: every method explains the model's prediction, the probability
  metrics score it, and accuracy is "the prediction equals the label ``target``" (None: the
  unperturbed prediction), so the curve starts at the model's accuracy.

Models with several token sets (``explain(...).relevance`` has more than one: encoder-decoders,
image and text towers, co-attention) are compared set by set. Each method's relevance of every
set is kept in :attr:`Comparison.relevance` (for sequence outputs ``[B, T, C]`` over the query
set, a row per target position ``t``, each explained with ``query=t``, :func:`sequence_rows`).
``ground_truth`` is then a mapping by batch key, and each entry scores the set it belongs to:
``"alignment"`` ``[N, T]`` the source set's rows (``<set>/alignment_accuracy``,
:class:`~lightning_gae.metrics.AlignmentAccuracy`), ``"masks"`` the image set
(``<set>/segmentation_*``), ``"rationales"`` the text set (``<set>/rationale_*``). Perturbation
metrics do not apply (they remove units of one input and read one class logit): ask for none.
Captum's methods attribute one input tensor, not one per set; they are left out, with the reason
in :attr:`Comparison.skipped` and a warning.

Declared regions (``regions=``) give per method and region the columns ``region_share_<name>`` and
``region_recall_<name>``: the same functions (:func:`~lightning_gae.metrics.functional.region_share`,
:func:`~lightning_gae.metrics.functional.region_recall`) over the same tokens (padding left out) as
``GAECallback(regions=...)`` logs, as means over the samples that hold the region, with their standard errors; the
``random`` method is the floor (with one batch and the callback's seed, the very noise the callback draws). Captum's
maps are turned into token relevance first (an image map's mean per patch); their share is of the positive part.

Example:
    A small ViT-style classifier (8 x 8 images in 2 x 2 patches, read at token 0) with random weights, scored
    on its predictions (with the labels, ``protocol="target"`` and ``"predicted"`` give the paper's two columns):

    >>> import torch
    >>> from torch import nn
    >>> from lightning_gae.compare import compare
    >>> class ViT(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.patch, self.head = nn.Conv2d(1, 16, 2, stride=2), nn.Linear(16, 3)
    ...         layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
    ...         self.encoder = nn.TransformerEncoder(layer, num_layers=2)
    ...     def forward(self, x):
    ...         return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2))[:, 0])
    >>> _ = torch.manual_seed(0)
    >>> result = compare(ViT().eval(), torch.rand(4, 1, 8, 8), methods=("gae", "random", "saliency"))
    >>> print(result.to_markdown())
    | method | positive_perturbation_auc ↓ | negative_perturbation_auc ↑ | ms / sample |
    | --- | ---: | ---: | ---: |
    | gae | ... |
    | random | ... |
    | saliency | ... |
    >>> result.num_samples, sorted(result.methods["gae"])
    (4, ['negative_perturbation_auc', 'positive_perturbation_auc', 'seconds_per_sample'])
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

import numpy as np
import torch
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_gae.display import grid
from lightning_gae._structures import ClassTarget, class_index, first_tensor, take
from lightning_gae.attribution import ATTRIBUTION_METHODS, attribute
from lightning_gae.attribution.gradients import batch_tensor, predict
from lightning_gae.methods import explain, get_method, method_names, methods_of
from lightning_gae.engine.readout import check_inputs
from lightning_gae.evaluation import Batch, MetricSource, region_masks, score_batches, score_sets, set_scorers, set_truths
from lightning_gae.metrics import PERTURBATION_METRICS
from lightning_gae.metrics.stderr import SampleScores
from lightning_gae.metrics.functional.perturbation import Protocol, check_protocol
from lightning_gae.modalities.regions import Region
from lightning_gae.modalities.tokens import Modality, render_map
from lightning_gae.options import EngineOptions, FaithfulnessOptions, RegionOptions
from lightning_gae.engine.token_sets import Streams
from lightning_gae.language.decoder_rows import is_sequence_output, last_positions, sequence_rows
from lightning_gae.metrics.ground_truth import RECALL, TruthScore, scored_truth, truth_score
from lightning_gae.modalities.inputs import infer_modality, token_set_input, token_set_inputs

__all__ = [
    "ATTRIBUTION_METHODS",
    "DEFAULT_METHODS",
    "Comparison",
    "attribute",
    "compare",
    "comparison_grid",
    "infer_modality",
    "last_positions",
    "sequence_rows",
    "token_set_input",
    "token_set_inputs",
]

DEFAULT_METHODS: tuple[str, ...] = tuple(m.name for m in methods_of() if m.default)
"""What :func:`compare` and ``lightning-gae compare`` run unless told otherwise: the registered methods marked
``default`` (GradientSHAP, attention flow, one max flow per token and sample, and the LRP methods are asked for by
name)."""

Target = ClassTarget
SetTarget = Union[Target, Callable[[Any], Tensor]]
Progress = Callable[[str, int, int], None]
"""``progress(method, samples_done, total)``: see :func:`compare`."""


@dataclass
class Comparison:
    """Every method scored by every metric on the same samples and targets.

    Attributes:
        methods: method -> {metric name -> value, ..., ``"seconds_per_sample"`` -> the attribution
            step's wall-clock time per sample}.
        num_samples: how many samples were scored.
        higher_is_better: metric name -> its direction (the metric's ``higher_is_better``).
        protocol: which class was explained and scored, ``"target"`` or ``"predicted"`` (see :func:`compare`).
        stderr: method -> {metric name -> the value's standard error over the samples} (see
            :func:`compare`); empty when not measured.
        sets: the token sets of a model with several (encoder/decoder, image/text); empty otherwise.
            Their scores are named ``<set>/<metric>``.
        relevance: for a model with several token sets, method -> set -> the relevance of every
            sample, ``[N, N_set]`` (``[N, T, N_set]`` for sequence outputs: a row per target position).
        skipped: method -> why it was left out (Captum's methods on a model with several token sets).
        regions: the declared regions scored (``regions=`` of :func:`compare`), name -> kind (``"evidence"`` or
            ``"suspect"``); their columns are ``region_share_<name>`` and ``region_recall_<name>``.
    """

    methods: dict[str, dict[str, float]]
    num_samples: int
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    protocol: str = "target"
    stderr: dict[str, dict[str, float]] = field(default_factory=dict)
    sets: list[str] = field(default_factory=list)
    relevance: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    regions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"methods": {name: {metric: value, ..., "seconds_per_sample": s}}, "num_samples": n, "protocol": p,
        "stderr": {name: {metric: se}}}``, JSON-ready."""
        out = {"methods": {name: dict(values) for name, values in self.methods.items()}, "num_samples": self.num_samples,
               "protocol": self.protocol, "stderr": {name: dict(values) for name, values in self.stderr.items()}}
        if self.sets:
            out["sets"] = list(self.sets)
        if self.skipped:
            out["skipped"] = dict(self.skipped)
        if self.regions:
            out["regions"] = dict(self.regions)
        return out

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """A table: a row per method, a column per metric (↑ higher is better, ↓ lower), the best in bold
        (``± standard error`` where measured), then the time. A declared region's share and recall are better high on
        an evidence region and low on a suspect one; the ``random`` row is their floor. A method without a column's
        value (a map that is not token relevance, for a region) shows ``–``."""
        metrics = list(self.higher_is_better)
        best = {}
        for metric, higher in self.higher_is_better.items():
            values = [v for scores in self.methods.values() if (v := scores.get(metric)) is not None and v == v]
            best[metric] = (max(values) if higher else min(values)) if values else None
        header = ["method", *(f"{m} {'↑' if self.higher_is_better[m] else '↓'}" for m in metrics), "ms / sample"]
        lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
        for name, scores in self.methods.items():
            errors = self.stderr.get(name, {})
            cells = ["–" if m not in scores else
                     (f"**{scores[m]:.4g}**" if scores[m] == best[m] else f"{scores[m]:.4g}")
                     + (f" ± {errors[m]:.2g}" if m in errors else "") for m in metrics]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {1000 * scores['seconds_per_sample']:.3g} |")
        lines += [f"\n{name} left out: {reason}" for name, reason in self.skipped.items()]
        return "\n".join(lines) + "\n"


def _tabulate(scores: SampleScores, results: dict[str, dict[str, float]], errors: dict[str, dict[str, float]],
              directions: dict[str, bool]) -> None:
    """Every column of ``scores`` into the :class:`Comparison` tables."""
    for method, columns in scores.columns().items():
        for column, score in columns.items():
            results.setdefault(method, {})[column] = score.value
            errors.setdefault(method, {})[column] = score.stderr
            directions[column] = score.higher_is_better


def compare(
    model: nn.Module,
    inputs: Any,
    target: SetTarget = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    modality: Modality | Mapping[str, Modality] | None = None,
    ground_truth: Tensor | Mapping[str, Tensor] | None = None,
    query: Any = None,
    faithfulness: FaithfulnessOptions | None = None,
    engine: EngineOptions | None = None,
    protocol: Protocol = "target",
    batch_size: int = 64,
    seed: int = 0,
    recall: bool = False,
    groups: Sequence[int] | Tensor | None = None,
    progress: Progress | None = None,
    regions: RegionOptions | Sequence[Region] | None = None,
) -> Comparison:
    """Score every attribution method with every perturbation metric, ground truth and declared region on the same
    samples and targets, each value with its standard error (how: the module's description above).

    Args:
        model: the classifier (logits ``[B, C]``, a tuple or ``.logits``); it is left in the mode it had.
        inputs: the samples: a tensor, a mapping of keyword arguments or ``(batch,)`` for a model whose forward
            takes the batch itself (see :func:`attribute`); a tuple of tensors for a model with several token sets.
        target: None, an int, or one class per sample (usually the labels): the class explained and scored, or the
            labels the prediction is checked against (``protocol``). For a model with several token sets also
            ``[N, T]`` classes per target position, or a callable ``output -> Tensor[B]``.
        methods: names from :data:`~lightning_gae.attribution.ATTRIBUTION_METHODS`.
        modality: how inputs are removed and tokens mapped (``ImageTokens``, ``TextTokens``, ``TabularTokens``; one
            per set, by set, for several token sets); None infers ``ImageTokens`` for ViT-style square images.
        ground_truth: None, or the known answer per sample (nonzero = right), as above; a mapping by batch key for a
            model with several token sets.
        query: the attention methods' readout row (``query=`` of :func:`~lightning_gae.explain`; ``"last"`` for a
            causal LM's answer rows, :func:`lightning_gae.language.answers.answer_rows`); None: their default.
        faithfulness: the ``metrics`` (from :data:`lightning_gae.metrics.PERTURBATION_METRICS`; default positive and
            negative perturbation AUC) and ``max_batch`` (perturbed inputs per forward pass) of
            :class:`~lightning_gae.options.FaithfulnessOptions`; its subset and schedule fields are the callback's.
        engine: ``embedding_layer`` (token-id inputs' embedding, for Captum's methods), ``streams`` and ``set_inputs``
            (set -> the input its tokens come from) of :class:`~lightning_gae.options.EngineOptions`.
        protocol: ``"target"`` or ``"predicted"``, as above.
        batch_size: samples per attribution call and metric update.
        seed: seed of ``"random"`` and GradientSHAP; batch ``i`` uses ``seed + i``.
        recall: also score text ``ground_truth`` with :class:`~lightning_gae.metrics.RationaleRecall`
            (``recall_{top1,hit_at_k,mass}``).
        groups: one label per sample for samples that are not independent (the answer rows of one prompt): the
            standard errors leave a group out at a time. None: every sample on its own.
        progress: called as ``progress(method, samples_done, total)`` when a method starts and after each of its
            batches is scored (``lightning-gae compare`` draws a bar per method with it).
        regions: declared :class:`~lightning_gae.modalities.regions.Region` s (or the callback's
            :class:`~lightning_gae.options.RegionOptions`, whose ``top_k`` the recall uses): the columns
            ``region_share_<name>`` and ``region_recall_<name>``, as ``GAECallback(regions=...)`` logs them.

    Returns:
        A :class:`Comparison`; ``to_markdown()`` and ``to_dict()`` give the table.

    Raises:
        ValueError: an unknown method, metric or protocol (the message lists the known ones), a modality that
            cannot be inferred (the message names ``modality=``), ``batch_size < 1``, regions on a model with several
            token sets or that do not fit the modality, or anything :func:`attribute` rejects.
    """
    unknown = [m for m in methods if m not in method_names()]
    if unknown or not methods:
        raise ValueError(f"methods={list(methods)}: choose from {list(method_names())}")
    check_inputs(model, inputs)
    faithfulness, engine = _options(faithfulness, engine)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    total = first_tensor(inputs).shape[0]
    progress = progress or _silent
    declared = regions if isinstance(regions, RegionOptions) else RegionOptions(regions=regions or ())
    probe = _probe(model, inputs, target, modality, engine.streams, total)
    if isinstance(modality, Mapping) or (probe is not None and len(probe.relevance) > 1):
        if declared.regions:
            raise ValueError("compare(regions=...): the model has several token sets; regions are scored on a model "
                             "with one (as GAECallback(regions=...) does)")
        return _compare_sets(model, inputs, target, methods, faithfulness.metrics, modality, batch_size, seed, protocol,
                             ground_truth, engine.streams, engine.set_inputs, probe, total, progress)
    plan = _plan(model, inputs, target, modality, ground_truth, faithfulness.metrics, protocol, batch_size, recall,
                 groups, declared)
    results: dict[str, dict[str, float]] = {}
    errors: dict[str, dict[str, float]] = {}
    directions: dict[str, bool] = {}
    for method in methods:
        options = {} if query is None or not get_method(method).token_relevance else {"query": query}
        clock = _Clock()
        batches = _attributed(model, inputs, method, plan, options, engine.embedding_layer, seed, clock, progress)
        scores = score_batches(batches, faithfulness.metrics, model, plan.modality, max_batch=faithfulness.max_batch,
                               explains_prediction=protocol == "predicted", extra_truth=plan.extra_truth,
                               top_k=declared.top_k)
        scores.groups = plan.groups
        results.setdefault(method, {})
        _tabulate(scores, results, errors, directions)
        results[method]["seconds_per_sample"] = clock.seconds / plan.total
    return Comparison(methods=results, num_samples=plan.total, higher_is_better=_region_directions(declared, directions),
                      protocol=protocol, stderr=errors, regions={r.name: r.kind for r in declared.regions})


def _region_directions(declared: RegionOptions, directions: dict[str, bool]) -> dict[str, bool]:
    """``directions`` with each region's columns: more relevance is better on evidence, worse on a suspect region."""
    for region in declared.regions:
        for column in (f"region_share_{region.name}", f"region_recall_{region.name}"):
            if column in directions:
                directions[column] = not region.suspect
    return directions


def _options(faithfulness: FaithfulnessOptions | None, engine: EngineOptions | None
             ) -> tuple[FaithfulnessOptions, EngineOptions]:
    """The option groups :func:`compare` reads, defaults filled in, or raise."""
    faithfulness = FaithfulnessOptions() if faithfulness is None else faithfulness
    engine = EngineOptions() if engine is None else engine
    if not isinstance(faithfulness, FaithfulnessOptions) or not isinstance(engine, EngineOptions):
        raise ValueError("compare(faithfulness=..., engine=...): give FaithfulnessOptions(...) and EngineOptions(...) "
                         "(lightning_gae.options)")
    if engine.attention_modules is not None or engine.answer_tokens is not None:
        raise ValueError("compare(engine=EngineOptions(attention_modules=..., answer_tokens=...)): compare explains "
                         "with the attention the capture finds and scores the rows it is given (answer rows: "
                         "lightning_gae.language.answer_rows with query='last'); leave both None")
    return faithfulness, engine


def _probe(model: nn.Module, inputs: Any, target: SetTarget, modality: Any, streams: Streams | None,
           total: int) -> Any:
    """One sample's raw attention explanation, which tells the model's token sets; None without attention."""
    try:
        return explain(model, take(inputs, 0, 1, total), target=target if callable(target) else None,
                       method="raw_attention", streams=streams)
    except ValueError:
        # No attention to tell sets apart (a model scored with Captum's methods alone): one input, as before.
        if isinstance(modality, Mapping):
            raise
        return None


class _Plan(NamedTuple):
    """What every method of :func:`compare` is scored on: the same batches, classes, ground truth and regions."""

    total: int
    batch_size: int
    explained: Tensor
    labels: Tensor | None
    modality: Modality
    truth: Tensor | None
    extra_truth: tuple[TruthScore, ...]
    groups: Tensor | None
    masks: dict[str, Tensor]


def _plan(model: nn.Module, inputs: Any, target: SetTarget, modality: Modality | None, ground_truth: Any,
          metrics: Sequence[str], protocol: str, batch_size: int, recall: bool, groups: Any,
          declared: RegionOptions) -> _Plan:
    """:func:`compare`'s arguments for a model with one token set, checked, and the classes explained fixed once."""
    unknown = [m for m in metrics if m not in PERTURBATION_METRICS]
    if unknown or not metrics:
        raise ValueError(f"compare(faithfulness=FaithfulnessOptions(metrics={list(metrics)})): choose at least one "
                         f"of {list(PERTURBATION_METRICS)}")
    check_protocol(protocol)
    if callable(target):
        raise ValueError("compare(target=<callable>) reads one scalar per sample of a model with several token sets; "
                         "for a model with one, pass None, an int or one class per sample")
    x, _ = batch_tensor(inputs)
    total = x.shape[0]
    starts = range(0, total, batch_size)
    given = None if target is None else class_index(target, total, x.device)
    if given is None or protocol == "predicted":
        explained = torch.cat([predict(model, take(inputs, s, s + batch_size, total)) for s in starts])
    else:
        explained = given
    if modality is None:
        modality = infer_modality(model, inputs)
    if ground_truth is not None:
        if ground_truth.shape[0] != total:
            raise ValueError(f"ground_truth has {ground_truth.shape[0]} samples for {total} inputs; give one per sample")
        entry = truth_score(modality)
        if scored_truth(modality, ground_truth) is None:
            raise ValueError(f"ground_truth {tuple(ground_truth.shape)}: {type(modality).__name__}'s ground truth "
                             f"({entry.name}) has {entry.truth_dims} dims with the samples")
    if recall and (ground_truth is None or modality.ground_truth != RECALL.truth):
        raise ValueError("compare(recall=True) scores text rationales: pass ground_truth=[N, T] and a modality that "
                         "scores rationales (TextTokens)")
    groups = None if groups is None else torch.as_tensor(groups)
    if groups is not None and groups.numel() != total:
        raise ValueError(f"compare(groups=...) has {groups.numel()} labels for {total} samples: pass one "
                         "label per sample (e.g. the prompt of each answer row), or None")
    # Over all samples at once: a region's per-sample mask [N, H, W] fits the samples, not a batch of them.
    masks = _region_masks(declared, modality, inputs)
    # With the labels, protocol="predicted" checks the prediction against them (score_batches).
    labels = given if protocol == "predicted" else None
    return _Plan(total, batch_size, explained, labels, modality, ground_truth, (RECALL,) if recall else (), groups, masks)


class _Clock:
    """The seconds an attribution step took, summed over a method's batches."""

    seconds = 0.0


def _attributed(model: nn.Module, inputs: Any, method: str, plan: _Plan, options: Mapping[str, Any],
                embedding_layer: Any, seed: int, clock: _Clock, progress: Progress) -> Iterator[Batch]:
    """``method``'s attributions of each batch of ``plan``, timed by ``clock``; ``progress`` after each is scored."""
    progress(method, 0, plan.total)
    for index, start in enumerate(range(0, plan.total, plan.batch_size)):
        stop = min(start + plan.batch_size, plan.total)
        chunk = take(inputs, start, stop, plan.total)
        began = time.perf_counter()
        attributions = attribute(method, model, chunk, plan.explained[start:stop], embedding_layer=embedding_layer,
                                 seed=seed + index, **options)
        clock.seconds += time.perf_counter() - began
        yield Batch(chunk, {method: attributions}, plan.explained[start:stop],
                    None if plan.labels is None else plan.labels[start:stop],
                    None if plan.truth is None else plan.truth[start:stop],
                    {name: mask[start:stop] for name, mask in plan.masks.items()})
        progress(method, stop, plan.total)


def _region_masks(regions: RegionOptions, modality: Modality, inputs: Any) -> dict[str, Tensor]:
    """Region name -> bool ``[N, tokens]`` over the samples' tokens, on the CPU
    (:func:`~lightning_gae.evaluation.region_masks`)."""
    try:
        return region_masks(regions.regions, modality, inputs)
    except ValueError as error:
        raise ValueError(f"compare(regions=...) does not fit the samples with {type(modality).__name__}: {error}") from None


def _silent(method: str, done: int, total: int) -> None:
    """No progress to show."""


def _made(metrics: Mapping[str, Metric]) -> MetricSource:
    """The metric objects of one method, made before its batches, by column name."""
    return lambda name, build: metrics[name]


def _compare_sets(model: nn.Module, inputs: Any, target: SetTarget, methods: Sequence[str], metrics: Sequence[str],
                  modality: Modality | Mapping[str, Modality] | None, batch_size: int, seed: int, protocol: str,
                  ground_truth: Tensor | Mapping[str, Tensor] | None, streams: Streams | None,
                  set_inputs: Mapping[str, int | str] | None, probe: Any, total: int, progress: Progress) -> Comparison:
    """:func:`compare` for a model with several token sets: each set's relevance, scored against its own ground truth."""
    sizes = {x: r.shape[1] for x, r in probe.relevance.items()}
    truths = set_truths(metrics, modality, ground_truth, sizes)
    assert modality is None or isinstance(modality, Mapping)  # set_truths refuses one modality for several sets
    layout = token_set_inputs(inputs, sizes, modality, set_inputs, "compare")
    sequence = is_sequence_output(probe, target)
    scorers = set_scorers(truths, sizes, layout, sequence, probe, total)
    skipped = {m: (f"Captum's {m} attributes one input tensor, but this model takes one input per token set "
                   f"({', '.join(f'{x}: {k!r}' for x, (_, k) in layout.items())}), so it gives no relevance per set")
               for m in methods if not get_method(m).token_relevance}
    skipped.update({m: refusal for m in methods if m not in skipped
                    for refusal in [get_method(m).refusal(list(sizes))] if refusal is not None})
    for method, reason in skipped.items():
        warnings.warn(f"compare: {reason}; {method} is left out", UserWarning, stacklevel=3)
    labels = target if isinstance(target, Tensor) and target.dim() == 2 else None
    starts = range(0, total, batch_size)
    results: dict[str, dict[str, float]] = {}
    errors: dict[str, dict[str, float]] = {}
    directions: dict[str, bool] = {}
    relevance: dict[str, dict[str, Tensor]] = {}
    for method in (m for m in methods if m not in skipped):
        progress(method, 0, total)
        found = get_method(method)
        explained = found.explained_as if found.kind == "baseline" else method
        metrics_now = {name: build() for name, build, _ in scorers.values()}
        scores = SampleScores()
        parts: dict[str, list[Tensor]] = {}
        seconds = 0.0
        for index, start in enumerate(starts):
            stop = min(start + batch_size, total)
            chunk = take(inputs, start, stop, total)
            began = time.perf_counter()
            if sequence:
                last = last_positions(model, chunk, streams=streams)
                chunk_labels = None if labels is None else labels[start:stop].to(last.device)
                by_set = sequence_rows(model, chunk, explained, last, chunk_labels, streams=streams)
            else:
                chunk_target = target if callable(target) or target is None or isinstance(target, int) else \
                    torch.as_tensor(target)[start:stop]
                exp = explain(model, chunk, target=chunk_target, method=explained, streams=streams)
                by_set = {x: r.detach().float().cpu() for x, r in exp.relevance.items()}
            if found.kind == "baseline":
                flat = [r.flatten(1) for r in by_set.values()]
                noise = found.rule(torch.cat(flat, dim=1), seed + index).split([f.shape[1] for f in flat], dim=1)
                by_set = {x: n.reshape(r.shape) for (x, r), n in zip(by_set.items(), noise)}
            seconds += time.perf_counter() - began
            for x, r in by_set.items():
                parts.setdefault(x, []).append(r)
            score_sets(scores, method, scorers, _made(metrics_now), chunk, by_set,
                       {key: truth[start:stop].cpu() for key, truth in truths.items()})
            progress(method, stop, total)
        relevance[method] = {x: torch.cat(found) for x, found in parts.items()}
        results.setdefault(method, {})
        _tabulate(scores, results, errors, directions)
        results[method]["seconds_per_sample"] = seconds / total
    return Comparison(methods=results, num_samples=total, higher_is_better=directions, protocol=protocol, stderr=errors,
                      sets=list(sizes), relevance=relevance, skipped=skipped)


def comparison_grid(
    model: nn.Module,
    inputs: Any,
    methods: Sequence[str] = DEFAULT_METHODS,
    target: Target = None,
    modality: Modality | None = None,
    embedding_layer: str | nn.Module | None = None,
    seed: int = 0,
    query: Any = None,
) -> np.ndarray:
    """A samples x (input | each method) picture of the attributions, drawn by the modality.

    Each method is drawn by its registered ``signed`` fact in every sample (:func:`~lightning_gae.modalities.render_map`):
    a signed method on a diverging colormap, white at 0, over ``(-m, m)``; a non-negative one on a sequential colormap
    over ``(0, max)`` (:func:`lightning_gae.display.colormap_for`).

    Args:
        model: the classifier.
        inputs: the few samples to draw (a tensor or a mapping, see :func:`attribute`).
        methods: names from :data:`~lightning_gae.attribution.ATTRIBUTION_METHODS`, one column each.
        target: None (the predictions), an int, or one class per sample.
        modality: draws each sample; None infers ``ImageTokens`` for ViT-style square images.
        embedding_layer: see :func:`attribute`.
        seed: seed of ``"random"`` and GradientSHAP (``compare``'s first batch uses the same).
        query: the attention methods' readout row, as in :func:`compare`.

    Returns:
        uint8 ``[h, w, 3]`` (:func:`lightning_gae.display.grid`), rows titled with the explained class.

    Raises:
        ValueError: as :func:`attribute`, or a modality that cannot be inferred.

    Example:
        The classifier of :func:`compare`'s example; ``matplotlib.pyplot.imsave("grid.png", picture)`` saves it:

        >>> import torch
        >>> from torch import nn
        >>> from lightning_gae.compare import comparison_grid
        >>> class ViT(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.patch, self.head = nn.Conv2d(1, 16, 2, stride=2), nn.Linear(16, 3)
        ...         layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
        ...         self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        ...     def forward(self, x):
        ...         return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2))[:, 0])
        >>> picture = comparison_grid(ViT().eval(), torch.rand(2, 1, 8, 8), methods=("gae", "saliency"))
        >>> picture.ndim, picture.shape[2], picture.dtype
        (3, 3, dtype('uint8'))
    """
    display, _ = batch_tensor(inputs)
    if modality is None:
        modality = infer_modality(model, inputs)
    classes = predict(model, inputs) if target is None else class_index(target, display.shape[0], display.device)
    columns = []
    for method in methods:
        options = {} if query is None or not get_method(method).token_relevance else {"query": query}
        attributions = attribute(method, model, inputs, classes, embedding_layer=embedding_layer, seed=seed, **options)
        # In the units the modality draws: pixels for images; one value per token or feature otherwise.
        columns.append(modality.input_map(attributions, display, inputs))
    # Each method drawn by its registered sign in every sample: a signed method keeps its diverging colormap, white
    # at 0, on a sample whose map happens to have no negative value.
    signs = [get_method(method).signed for method in methods]
    cells = [[modality.render(display[i], None, ""),
              *(render_map(modality, display[i], maps[i], signed) for maps, signed in zip(columns, signs))]
             for i in range(display.shape[0])]
    rows = [f"#{i}: class {int(c)}" for i, c in enumerate(classes)]
    return grid(cells, rows, ["input", *methods])
