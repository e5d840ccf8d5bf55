"""GAECallback's TensorBoard output, one explanation step at a time: the standard tabs and the dashboard's tensors.

Tags are grouped so that one TensorBoard group holds one thing to compare:

* Images: ``gae_heatmaps/val_<i>``: one picture per tracked sample (validation index ``i``) with
  the input and every method side by side, each with its colorbar; ``gae_evolution/val_<i>``
  (images): methods x the last steps, always the same size;
* Scalars: ``<metric>/<method>`` (:func:`scalar_tag`), so a metric's group holds every method;
  the same values in one run per method (:mod:`lightning_gae.tensorboard.method_runs`), so that
  TensorBoard draws each method in its own colour, and a Custom Scalars layout with one chart per
  metric and one line per method, ``random`` included;
* Histograms: ``relevance/<method>``; Text (text and tabular data): ``gae_tokens/val_<i>``, a
  markdown table of tokens or features and every method's score;
* the GAE dashboard's tensors under ``gae_dashboard/`` (:mod:`lightning_gae.tensorboard.metadata`).

Models with several token sets (``sets=``, :class:`SetInput`) keep these tags: ``gae_heatmaps/val_<i>``
shows every set (an image set as a heatmap beside a text set's tokens, one row per method), or
for a sequence-to-sequence model (``rows=``) one matrix per set and method: a row per target
position, its relevance over the set's tokens; ``gae_tokens/val_<i>`` holds a table per text set.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.util import tensor_util
from torch import Tensor

from lightning_gae._structures import map_tensors
from lightning_gae.display import Scale
from lightning_gae.engine.readout import Explanation
from lightning_gae.methods import methods_of
from lightning_gae.metrics.functional.health import IDENTITY_TOLERANCE, beside_identity
from lightning_gae.modalities.tokens import Modality
from lightning_gae.tensorboard import metadata
from lightning_gae.tensorboard.method_runs import (
    FAITHFULNESS_GROUP,
    REGION_GROUP,
    RELEVANCE_GROUP,
    RELEVANCE_SCALARS,
    MethodRuns,
    is_faithfulness,
    restart_event,
    scalar_group,
)
from lightning_gae.tensorboard.ranks import FAITHFULNESS_SAMPLES, Curves, higher_is_better, tie_note
from lightning_gae.tensorboard.views import SetInput, StepViews, bounded, markdown_cell, markdown_text

__all__ = ["RELEVANCE_SCALARS", "SetInput", "TensorBoardViews", "custom_scalars_layout",
           "faithfulness_rows", "faithfulness_table", "negligible_notes", "sample_tag", "scalar_tag", "write_alerts",
           "write_health"]


def scalar_tag(metric: str, method: str) -> str:
    """The tag of ``metric`` for ``method``: grouped by metric, so one Scalars group compares the methods."""
    return f"{metric}/{method}"


def sample_tag(index: int) -> str:
    """The tag suffix of the tracked sample at validation index ``index``."""
    return f"val_{index}"


def custom_scalars_layout(metrics: Iterable[str]) -> dict[str, dict[str, list[Any]]]:
    """A Custom Scalars layout (``SummaryWriter.add_custom_scalars``): one multi-line chart per metric.

    Each chart's one regular expression takes the metric's tag in the runs of the methods
    (``gae_faithfulness/<metric>``, ``gae_relevance/<scalar>``; :mod:`~lightning_gae.tensorboard.method_runs`),
    so every method, ``random`` included, is a line on the same axes in its run's colour, and the
    chart's list of matches names them.
    """
    charts: dict[str, dict[str, list[Any]]] = {"GAE faithfulness": {}, "GAE relevance": {}, "GAE regions": {}}
    titles = {FAITHFULNESS_GROUP: "GAE faithfulness", RELEVANCE_GROUP: "GAE relevance", REGION_GROUP: "GAE regions"}
    for metric in sorted(set(metrics)):
        group = scalar_group(metric)
        charts[titles[group]][metric] = ["Multiline", [f"^{group}/{re.escape(metric)}$"]]
    return {title: content for title, content in charts.items() if content}


def faithfulness_rows(scalars: Mapping[str, float]) -> tuple[list[str], list[list[str]]] | None:
    """The faithfulness scalars of a step as ``(metrics, rows)``: a row ``[method, cell per metric]`` per method,
    each cell ``value ± standard error`` (blank where the method has no value); None when the step has none.

    The Text tab's table (:func:`faithfulness_table`) and the lines GAECallback prints when a fit ends are this.
    """
    values: dict[str, dict[str, float]] = {}
    for tag, value in scalars.items():
        parts = tag.split("/")
        if len(parts) == 2 and is_faithfulness(parts[0]):
            values.setdefault(parts[0], {})[parts[1]] = value
    if not values:
        return None
    metrics = sorted(values)
    methods = list(dict.fromkeys(m for metric in metrics for m in values[metric]))

    def cell(metric: str, method: str) -> str:
        if method not in values[metric]:
            return ""
        error = scalars.get(f"{metric}/{method}/stderr")
        return f"{values[metric][method]:.4g}" + ("" if error is None else f" ± {error:.2g}")

    return metrics, [[method, *(cell(metric, method) for metric in metrics)] for method in methods]


def faithfulness_table(scalars: Mapping[str, float], curves: Curves | None = None) -> str | None:
    """The faithfulness scalars of a step as one markdown table: a row per method, a column per metric,
    ``value ± standard error``, then the number of samples scored (``faithfulness_samples``) when given and why
    the methods tie where they all do (:func:`tie_note`, from ``curves``); None when the step has none
    (:func:`faithfulness_rows`).

    Written to the Text tab (``gae_faithfulness``): each step's numbers to read, beside the charts.
    """
    found = faithfulness_rows(scalars)
    if found is None:
        return None
    metrics, rows = found
    lines = ["| method | " + " | ".join(markdown_cell(m) for m in metrics) + " |", "| --- |" + " ---: |" * len(metrics)]
    lines += ["| " + " | ".join([markdown_cell(method), *cells]) + " |" for method, *cells in rows]
    count = scalars.get(FAITHFULNESS_SAMPLES)
    if count is not None:
        lines += ["", f"value ± standard error over {int(count)} validation samples"]
    note = tie_note(scalars, curves)
    if note is not None:
        lines += ["", f"ties: {note}"]
    return "\n".join(lines)


def _literal_markdown(text: str) -> str:
    """An entry's text as markdown that shows every user string (a region's, method's or class's name) literally
    (:func:`~lightning_gae.tensorboard.views.markdown_text`); the entries' own structure, a ``**headline**`` and
    ``- detail`` lines, is kept."""
    lines = []
    for line in text.split("\n"):
        stripped = line.strip()
        if len(stripped) > 4 and stripped.startswith("**") and stripped.endswith("**"):
            lines.append(f"**{markdown_text(stripped[2:-2])}**")
        elif stripped.startswith("- "):
            lines.append(f"- {markdown_text(stripped[2:])}")
        else:
            lines.append(markdown_text(line))
    return "\n".join(lines)


def negligible_notes(explanations: Mapping[str, Explanation]) -> list[str]:
    """Per sample, what its picture says of the methods whose map is negligible beside the identity (their row starts
    from the read-out token's 1, and nothing beside it reaches
    :data:`~lightning_gae.metrics.functional.health.IDENTITY_TOLERANCE` of it), e.g. ``"gae: negligible beside the
    identity (max 7.7e-07)"``; ``""`` where none is. Such a map, drawn on its own colour scale, is round-off at full
    contrast."""
    identity = {m.name for m in methods_of() if m.beside_identity}
    count = next(iter(explanations.values())).tokens.shape[0] if explanations else 0
    notes: list[list[str]] = [[] for _ in range(count)]
    for method, exp in explanations.items():
        if method not in identity or exp.tokens.dim() != 2:
            continue
        for k, largest in enumerate(beside_identity(exp.tokens).tolist()):
            if largest < IDENTITY_TOLERANCE:
                notes[k].append(f"{method}: negligible beside the identity (max {largest:.2g})")
    return ["; ".join(n) for n in notes]


def _write_marks(writers: Sequence[Any], step: int, text_tag: str, kind: str, names: tuple[str, str],
                 entries: Sequence[tuple[str, str, str]]) -> None:
    """A step's ``entries`` (``(first, second, text)``) as one Text tab entry under ``text_tag`` and, for the GAE
    tab, one ``kind`` tensor each, tagged ``<prefix>/<kind>/<first>/<second>`` with ``names`` as its metadata keys.

    The Text tab renders markdown, and TensorBoard's sanitiser keeps some HTML (an ``<img>``): the text goes there
    escaped (:func:`_literal_markdown`); the GAE tab's tensor keeps it as given and the tab shows it as text."""
    if not entries:
        return
    values = [_tensor_summary(f"{metadata.TAG_PREFIX}/{kind}/{a}/{b}", np.array([text.encode("utf-8")], dtype=object),
                              metadata.encode(kind, **{names[0]: a, names[1]: b})) for a, b, text in entries]
    for writer in writers:
        writer.add_text(text_tag, "\n\n".join(_literal_markdown(text) for _, _, text in entries), step)
        writer._get_file_writer().add_summary(Summary(value=values), step)
        writer.flush()


def write_health(writers: Sequence[Any], step: int, flags: Sequence[tuple[str, str, str]]) -> None:
    """A step's flags (``(method, cause, markdown)``: an explanation that is not faithful) as one Text tab entry
    (``gae_health``) and, for the GAE tab, one ``flag`` tensor per method and cause."""
    _write_marks(writers, step, "gae_health", "flag", ("method", "cause"), flags)


def write_alerts(writers: Sequence[Any], step: int, alerts: Sequence[tuple[str, str, str]]) -> None:
    """A step's alerts (``(region, method, markdown)``: a suspect region took a method's relevance) as one Text tab
    entry (``gae_alerts``; the Text tab keeps one per tag and step) and, for the GAE tab, one ``alert`` tensor each."""
    _write_marks(writers, step, "gae_alerts", "alert", ("region", "method"), alerts)


REGION_STATS = ("share", "recall")


def _region_values(scalars: Mapping[str, float] | None) -> list[Summary.Value]:
    """The dashboard's ``region`` tensors of a step: each ``region_<stat>_<region>/<method>`` scalar."""
    values = []
    for tag, value in (scalars or {}).items():
        parts = tag.split("/")
        stat = next((s for s in REGION_STATS if parts[0].startswith(f"region_{s}_")), None)
        if len(parts) != 2 or stat is None:
            continue
        region, method = parts[0][len(f"region_{stat}_"):], parts[1]
        values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/region/{stat}/{region}/{method}", np.array([value]),
                                      metadata.encode("region", region=region, stat=stat, method=method)))
    return values


def _score_values(scalars: Mapping[str, float] | None) -> list[Summary.Value]:
    """The dashboard's ``score`` tensors of a step: each faithfulness ``<metric>/<method>`` with its standard error
    and the number of samples it was scored on."""
    values = []
    count = (scalars or {}).get(FAITHFULNESS_SAMPLES, float("nan"))
    for tag, value in (scalars or {}).items():
        parts = tag.split("/")
        if len(parts) != 2 or not is_faithfulness(parts[0]):
            continue
        error = (scalars or {}).get(f"{tag}/stderr", float("nan"))
        metric, method = parts
        values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/score/{metric}/{method}", np.array([value, error, count]),
                                      metadata.encode("score", metric=metric, method=method,
                                                      higher_is_better=higher_is_better(metric))))
    return values


def _tie_values(scalars: Mapping[str, float] | None, curves: Curves | None) -> list[Summary.Value]:
    """The dashboard's ``tie`` tensor of a step: why every method ties where they all do (:func:`tie_note`)."""
    note = None if faithfulness_rows(scalars or {}) is None else tie_note(scalars or {}, curves)
    if note is None:
        return []
    return [_tensor_summary(f"{metadata.TAG_PREFIX}/tie", np.array([note.encode("utf-8")], dtype=object),
                            metadata.encode("tie"))]


def _image_value(tag: str, picture: np.ndarray) -> Summary.Value:
    """An Images-tab summary of uint8 ``[h, w, 3]``, PNG-encoded once for every writer.

    zlib level 1: the pictures are flat colour blocks and text, which level 1 already packs well,
    at about half the encoding time of the default level 6.
    """
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG", compress_level=1)
    image = Summary.Image(height=picture.shape[0], width=picture.shape[1], colorspace=picture.shape[2],
                          encoded_image_string=buffer.getvalue())
    return Summary.Value(tag=tag, image=image)


def _tensor_summary(tag: str, value: np.ndarray, content: bytes) -> Summary.Value:
    plugin = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content)
    # TensorBoard's fast loader (its Rust data server) drops summaries that do not declare a data class.
    described = SummaryMetadata(plugin_data=plugin, data_class=summary_pb2.DATA_CLASS_TENSOR)
    return Summary.Value(tag=tag, metadata=described, tensor=tensor_util.make_tensor_proto(value))


def _label(value: Tensor) -> int | list[int]:
    """A class index, or for a multi-hot ``[C]`` label the indices of its positive classes."""
    if value.numel() == 1:
        return int(value.reshape(()))
    return torch.nonzero(value.reshape(-1) > 0).flatten().tolist()


def _writer_key(writer: Any) -> str:
    get_logdir = getattr(writer, "get_logdir", None)
    return str(get_logdir()) if callable(get_logdir) else f"writer-{id(writer)}"


class TensorBoardViews(StepViews):
    """Writes each explanation step of :class:`~lightning_gae.callbacks.GAECallback` to TensorBoard writers,
    as :class:`~lightning_gae.tensorboard.views.StepViews` draws it (the arguments are its own). Each writer gets the
    tracked samples' inputs once and a Custom Scalars layout whenever a metric first appears in it.
    """

    def __init__(self, panel_px: int = 256, scale: Scale = "per_map", evolution_length: int = 5, alpha: float = 1.0) -> None:
        # alpha=1 by default: every heatmap pixel is a colour of its colour bar (the input is the panel beside it).
        super().__init__(panel_px, scale, evolution_length, alpha)
        # Per writer (its log dir): a second Trainer logging elsewhere gets its own inputs and layout.
        self._charted: dict[str, set[str]] = {}
        self._inputs_written: set[str] = set()
        self._runs = MethodRuns()

    def restart(self, writers: Sequence[Any], step: int) -> None:
        """A fit resumed from a checkpoint at ``step`` into the writers' runs: TensorBoard drops what the interrupted fit
        logged there at ``step`` and after, in each run and its methods' runs, so that the steps the resumed fit logs
        again are shown once (:func:`~lightning_gae.tensorboard.method_runs.restart_event`)."""
        for writer in writers:
            writer._get_file_writer().add_event(restart_event(step))
            writer.flush()
            self._runs.restart(writer, step)

    def close(self) -> None:
        """Close the methods' runs (:mod:`~lightning_gae.tensorboard.method_runs`); a later write reopens them."""
        self._runs.close()

    def write(
        self,
        writers: Sequence[Any],
        step: int,
        *,
        modality: Modality,
        inputs: Any,
        shown: Tensor,
        sample_indices: Sequence[int],
        explanations: Mapping[str, Explanation],
        maps: Mapping[str, Tensor] | None = None,
        scalars: Mapping[str, float] | None = None,
        curves: Curves | None = None,
        labels: Tensor | None = None,
        class_names: Sequence[str] | None = None,
        sets: Mapping[str, SetInput] | None = None,
        rows: Mapping[str, Mapping[str, Tensor]] | None = None,
        last: bool = True,
    ) -> dict[str, np.ndarray]:
        """Write one step; returns its pictures, ``tag -> uint8 [h, w, 3]`` (the Images tab's), for the loggers that
        are not TensorBoard (``writers`` may be empty: the pictures are drawn all the same).

        Args:
            writers: ``SummaryWriter``s (``torch.utils.tensorboard``), e.g. ``TensorBoardLogger.experiment``.
            step: the global step.
            modality: how the inputs are drawn and the tokens map onto them.
            inputs: the tracked samples' model inputs (any structure ``explain`` takes).
            shown: the tensor a person looks at: images ``[B, C, H, W]``, ``input_ids [B, T]`` or features ``[B, F]``.
            sample_indices: validation index of each of the ``B`` samples.
            explanations: method -> :class:`~lightning_gae.Explanation` of the samples.
            maps: Captum method -> its attribution of the samples (input-shaped, or one value per unit).
            scalars: ``scalar_tag(metric, method)`` -> value, as the loggers got them (for the Custom Scalars layout).
            curves: metric -> method -> ``(fractions, mean score per fraction)``.
            labels: ``[B]`` true classes, or ``[B, C]`` multi-hot labels, if known.
            class_names: names of the classes, if the data module knows them.
            sets: for a model with several token sets, each set's :class:`SetInput` (every set of the
                explanations' ``relevance``); ``modality``, ``inputs`` and ``shown`` are then the query set's.
            rows: method -> set -> ``[B, T, N_set]``: the relevance of every position ``t`` of the
                query set (a decoder) explained with ``query=t``, drawn as target x source matrices.
            last: whether this is the last step of a run. An image's ``gae_evolution`` strip is written at
                the last step and whenever ``evolution_length`` steps have come since its previous strip
                (so the strips show every step once); :meth:`write_strips` writes those still due.
        """
        if not explanations:
            raise ValueError("TensorBoardViews.write needs at least one explanation")
        if sets is not None:
            values, inputs_values, pictures = self._set_values(writers, sets, sample_indices, explanations, rows,
                                                               labels, class_names)
            self._finish(writers, step, explanations, scalars, curves, values, inputs_values)
            return pictures
        inputs = map_tensors(inputs, lambda t: t.detach().cpu())
        shown = shown.detach().cpu()
        first = next(iter(explanations.values()))
        raw: dict[str, tuple[Tensor, str]] = {m: (e.tokens.detach().float().cpu(), "tokens") for m, e in explanations.items()}
        for method, attributions in (maps or {}).items():
            raw[method] = (self.input_space(modality, attributions.detach().float().cpu(), shown, inputs), "input")
        shown_maps = {m: self.display_maps(modality, values, space, shown, inputs) for m, (values, space) in raw.items()}
        flags = self.unit_flags(modality, shown, inputs)
        ranges = self.ranges(shown_maps, None if flags is None else flags[0] & ~flags[1])
        predictions = self.predictions(first, len(sample_indices))
        negligible = negligible_notes(explanations)

        # Typed by the several-sets branch above, which returns the same three.
        values, inputs_values, pictures = [], [], {}
        # The inputs go once to each writer: only drawn while some writer has not had them.
        need_inputs = any(_writer_key(w) not in self._inputs_written for w in writers)
        for k, index in enumerate(sample_indices):
            label = None if labels is None else _label(labels[k])
            header = self.header(index, label, predictions[k], class_names)
            header += f" · {negligible[k]}" if negligible[k] else ""
            name = sample_tag(index)
            images = {f"gae_heatmaps/{name}": self.picture(modality, shown, inputs, k, shown_maps, ranges, header, flags)}
            if self.add_column(modality, shown[k], index, step, shown_maps, ranges, k, header) and self.strip_due(index, last):
                images[f"gae_evolution/{name}"] = self.evolution(index)
            images = {tag: bounded(picture) for tag, picture in images.items()}
            pictures.update(images)
            values.extend(_image_value(tag, picture) for tag, picture in images.items())
            table = self.markdown(modality, shown, inputs, k, shown_maps, header, flags)
            if table is not None:
                # TensorBoard's own text summary: SummaryWriter.add_text would append "/text_summary" to the tag.
                values.extend(text_summary.text_pb(f"gae_tokens/{name}", table).value)
            if need_inputs:
                inputs_values.append(self._input_value(modality, shown, flags, first.tokens.shape[1], k, index, label,
                                                       class_names))
            values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/prediction/{name}", predictions[k],
                                          metadata.encode("prediction", sample=index)))
            for order, (method, (tensor, space)) in enumerate(raw.items()):
                values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/relevance/{method}/{name}", tensor[k].numpy(),
                                              metadata.encode("relevance", sample=index, method=method, space=space,
                                                              order=order)))
        self._finish(writers, step, explanations, scalars, curves, values, inputs_values)
        return pictures

    def write_strips(self, writers: Sequence[Any], step: int) -> dict[str, np.ndarray]:
        """The ``gae_evolution`` strips whose newest columns were not written yet (a run that ended between the
        steps :meth:`write` writes them at), at ``step``; returned as ``tag -> picture`` for the other loggers."""
        pictures = {f"gae_evolution/{sample_tag(index)}": bounded(self.evolution(index))
                    for index in sorted(self.history) if self.strip_due(index, last=True)}
        values = [_image_value(tag, picture) for tag, picture in pictures.items()]
        for writer in writers if values else ():
            writer._get_file_writer().add_summary(Summary(value=values), step)
            writer.flush()
        return pictures

    def write_scores(self, writers: Sequence[Any], step: int, scalars: Mapping[str, float],
                     curves: Curves | None = None) -> None:
        """The faithfulness of a step that draws nothing (the subset scored when fit ends): its curves for the
        GAE tab, the Text tab's ``gae_faithfulness`` table and the Custom Scalars layout of its metrics; the
        loggers write the scalars themselves."""
        values = (self._curve_values(curves) + self._table_values(scalars, curves) + _score_values(scalars)
                  + _region_values(scalars) + _tie_values(scalars, curves))
        for writer in writers:
            layout = self._layout(writer, scalars)
            if layout:
                writer.add_custom_scalars(layout)
            if values:
                writer._get_file_writer().add_summary(Summary(value=values), step)
            writer.flush()
            self._runs.write(writer, step, scalars)

    @staticmethod
    def _table_values(scalars: Mapping[str, float] | None, curves: Curves | None = None) -> list[Summary.Value]:
        table = faithfulness_table(scalars or {}, curves)
        return [] if table is None else list(text_summary.text_pb("gae_faithfulness", table).value)

    @staticmethod
    def _curve_values(curves: Curves | None) -> list[Summary.Value]:
        values = []
        for metric, by_method in (curves or {}).items():
            for method, (fractions, curve) in by_method.items():
                points = np.stack([np.asarray(fractions, dtype=np.float64), curve.detach().double().cpu().numpy()])
                values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/curve/{metric}/{method}", points,
                                              metadata.encode("curve", metric=metric, method=method)))
        return values

    def _layout(self, writer: Any, scalars: Mapping[str, float] | None) -> dict[str, Any] | None:
        """The Custom Scalars layout to write when ``scalars`` bring a metric this writer has not charted yet."""
        metrics = {tag.split("/", 1)[0] for tag in scalars or {} if "/" in tag}
        charted = self._charted.setdefault(_writer_key(writer), set())
        layout = custom_scalars_layout(charted | metrics) if not metrics <= charted else None
        charted |= metrics
        return layout

    def _finish(self, writers: Sequence[Any], step: int, explanations: Mapping[str, Explanation],
                scalars: Mapping[str, float] | None, curves: Curves | None, values: list[Summary.Value],
                inputs_values: Sequence[Summary.Value]) -> None:
        """The curves, faithfulness table, histograms and Custom Scalars layout of a step, then every tensor
        summary, flushed.

        ``inputs_values`` (the tracked samples' inputs) go to each writer once, the first time it is written to.
        """
        values = (values + self._curve_values(curves) + self._table_values(scalars, curves) + _score_values(scalars)
                  + _region_values(scalars) + _tie_values(scalars, curves))
        for writer in writers:
            key = _writer_key(writer)
            layout = self._layout(writer, scalars)
            written = values if key in self._inputs_written else [*inputs_values, *values]
            self._inputs_written.add(key)
            for method, exp in explanations.items():
                writer.add_histogram(f"relevance/{method}", exp.tokens.detach().float().cpu(), step)
            if layout:
                # Written again when a metric first appears (stability needs two steps); TensorBoard reads the last.
                writer.add_custom_scalars(layout)
            # SummaryWriter has no public call for a tensor summary owned by another plugin; its own
            # add_* methods write through this file writer the same way.
            writer._get_file_writer().add_summary(Summary(value=written), step)
            writer.flush()
            self._runs.write(writer, step, scalars or {})

    def _set_values(self, writers: Sequence[Any], sets: Mapping[str, SetInput], sample_indices: Sequence[int],
                    explanations: Mapping[str, Explanation], rows: Mapping[str, Mapping[str, Tensor]] | None,
                    labels: Tensor | None, class_names: Sequence[str] | None
                    ) -> tuple[list[Summary.Value], list[Summary.Value], dict[str, np.ndarray]]:
        """Every token set's pictures and text, the dashboard's tensors and the inputs' tensors; and the pictures."""
        first = next(iter(explanations.values()))
        query_modality = sets[first.query_set].modality if first.query_set in sets else None
        if class_names is None and rows is not None and query_modality is not None and first.logits is not None:
            # A decoder's classes are its vocabulary: name them by their tokens, not their ids.
            class_names = query_modality.vocabulary(first.logits.shape[-1])
        drawn = self.set_drawing(sets, sample_indices, explanations, rows, labels, class_names)
        sets, raw, predictions, query_set = drawn["sets"], drawn["raw"], drawn["predictions"], drawn["query_set"]
        values: list[Summary.Value] = []
        inputs_values: list[Summary.Value] = []
        pictures: dict[str, np.ndarray] = {}
        need_inputs = any(_writer_key(w) not in self._inputs_written for w in writers)
        flags = {x: self.unit_flags(s.modality, s.shown, s.inputs) for x, s in sets.items()}
        for k, index in enumerate(sample_indices):
            label = None if labels is None or labels.dim() != 1 else int(labels[k])
            name = sample_tag(index)
            picture, table = drawn["pictures"][k]
            pictures[f"gae_heatmaps/{name}"] = picture
            values.append(_image_value(f"gae_heatmaps/{name}", picture))
            if table:
                values.extend(text_summary.text_pb(f"gae_tokens/{name}", table).value)
            if need_inputs:
                counts = {x: tensor.shape[1] for x, tensor in next(iter(raw.values())).items()}
                query = sets[query_set]
                inputs_values.append(self._input_value(query.modality, query.shown, flags[query_set], counts[query_set], k,
                                                       index, label, class_names))
                for order, (x, s) in enumerate(sets.items()):
                    inputs_values.append(self._input_value(s.modality, s.shown, flags[x], counts[x], k, index, label,
                                                           class_names, token_set=x, order=order, query=x == query_set))
            if drawn["outputs"] is not None:
                predicted = np.array([t.encode("utf-8") for t in drawn["outputs"][k]], dtype=object)
                values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/row_labels/{name}", predicted,
                                              metadata.encode("row_labels", sample=index, set=query_set)))
            values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/prediction/{name}", predictions[k],
                                          metadata.encode("prediction", sample=index)))
            for order, (method, by_set) in enumerate(raw.items()):
                # The query set under the single-set kind too: a reader of those kinds shows that set.
                values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/relevance/{method}/{name}",
                                              by_set[query_set][k].numpy(),
                                              metadata.encode("relevance", sample=index, method=method, space="tokens",
                                                              order=order)))
                for x, tensor in by_set.items():
                    values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/set_relevance/{method}/{x}/{name}", tensor[k].numpy(),
                                                  metadata.encode("set_relevance", sample=index, method=method, set=x,
                                                                  space="tokens", order=order)))
                for x, tensor in ({} if rows is None else rows[method]).items():
                    values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/set_rows/{method}/{x}/{name}",
                                                  tensor[k].detach().float().cpu().numpy(),
                                                  metadata.encode("set_relevance", sample=index, method=method, set=x,
                                                                  space="rows", order=order)))
        return values, inputs_values, pictures

    # --- the dashboard's input summary ----------------------------------------------------------

    def _input_value(self, modality: Modality, shown: Tensor, flags: tuple[np.ndarray, np.ndarray] | None, count: int,
                     k: int, index: int, label: int | list[int] | None, class_names: Sequence[str] | None,
                     token_set: str | None = None, order: int = 0, query: bool = False) -> Summary.Value:
        """The ``input`` summary of sample ``k`` (:meth:`~lightning_gae.Modality.dashboard_input`; ``flags``:
        :meth:`unit_flags`, ``count``: the set's token count), or with ``token_set`` that set's ``set_input`` summary
        (``order``: its place among the sets; ``query``: whether it is the query set)."""
        fields: dict[str, Any] = {"sample": index, "position": k, "label": label,
                                  "class_names": None if class_names is None else [str(c) for c in class_names]}
        if token_set is not None:
            fields.update(set=token_set, order=order, query=query)
        described, value = modality.dashboard_input(shown[k], None if flags is None else (flags[0][k], flags[1][k]), count)
        fields.update(described)
        if token_set is None:
            return _tensor_summary(f"{metadata.TAG_PREFIX}/input/{sample_tag(index)}", value, metadata.encode("input", **fields))
        return _tensor_summary(f"{metadata.TAG_PREFIX}/set_input/{token_set}/{sample_tag(index)}", value,
                               metadata.encode("set_input", **fields))
