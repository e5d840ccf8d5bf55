"""GAECallback's TensorBoard output, one explanation step at a time: the standard tabs and the dashboard's tensors.

Tags are grouped so that one TensorBoard group holds one thing to compare:

* Images: ``gae_heatmaps/val_<i>``: one picture per tracked sample (validation index ``i``) with
  the input and every method side by side, each with its colorbar; ``gae_evolution/val_<i>``
  (images): methods x the last steps, always the same size;
* Scalars: ``<metric>/<method>`` (:func:`scalar_tag`), so a metric's group holds every method,
  and a Custom Scalars layout with one chart per metric and one line per method, ``random``
  included;
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
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from tensorboard.compat.proto import summary_pb2
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.plugins.text import summary_v2 as text_summary
from tensorboard.util import tensor_util
from torch import Tensor

from lightning_gae import visualize
from lightning_gae.explain import Explanation, map_tensors
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens
from lightning_gae.tensorboard import metadata

__all__ = ["RELEVANCE_SCALARS", "SetInput", "TensorBoardViews", "custom_scalars_layout", "faithfulness_table", "sample_tag",
           "scalar_tag"]

Scale = Literal["per_map", "fixed"]
Curves = Mapping[str, Mapping[str, tuple[Sequence[float], Tensor]]]

RELEVANCE_SCALARS = ("relevance_concentration", "relevance_stability_spearman", "relevance_stability_topk_overlap")
"""Scalars about the relevance itself (not faithfulness): charted in their own Custom Scalars category."""

_EVOLUTION_PX = 128
# Longest side of a logged picture: larger PNGs make TensorBoard's image panel and the browser stall
# (a long text or a long evolution_length would otherwise grow a picture without bound).
_MAX_IMAGE_SIDE = 4096


def scalar_tag(metric: str, method: str) -> str:
    """The tag of ``metric`` for ``method``: grouped by metric, so one Scalars group compares the methods."""
    return f"{metric}/{method}"


def sample_tag(index: int) -> str:
    """The tag suffix of the tracked sample at validation index ``index``."""
    return f"val_{index}"


def custom_scalars_layout(metrics: Iterable[str]) -> dict[str, dict[str, list[Any]]]:
    """A Custom Scalars layout (``SummaryWriter.add_custom_scalars``): one multi-line chart per metric.

    Each chart's one regular expression takes every ``<metric>/<method>`` tag, so every method,
    ``random`` included, is a line on the same axes.
    """
    charts: dict[str, dict[str, list[Any]]] = {"GAE faithfulness": {}, "GAE relevance": {}}
    for metric in sorted(set(metrics)):
        category = "GAE relevance" if metric in RELEVANCE_SCALARS else "GAE faithfulness"
        charts[category][metric] = ["Multiline", [f"^{re.escape(metric)}/[^/]+$"]]
    return {title: content for title, content in charts.items() if content}


def faithfulness_table(scalars: Mapping[str, float]) -> str | None:
    """The faithfulness scalars of a step as one markdown table: a row per method, a column per metric,
    ``value ± standard error``; None when the step has none.

    Written to the Text tab (``gae_faithfulness``) next to the Custom Scalars charts, which cannot tell
    methods apart when a metric was scored at one step only (by default the callback scores once).
    """
    values: dict[str, dict[str, float]] = {}
    for tag, value in scalars.items():
        parts = tag.split("/")
        if len(parts) == 2 and parts[0] not in RELEVANCE_SCALARS:
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

    lines = ["| method | " + " | ".join(metrics) + " |", "| --- |" + " ---: |" * len(metrics)]
    lines += ["| " + " | ".join([_markdown_cell(method), *(cell(metric, method) for metric in metrics)]) + " |"
              for method in methods]
    return "\n".join(lines)


def _bounded(image: np.ndarray) -> np.ndarray:
    """``image`` shrunk (aspect kept) so that neither side exceeds ``_MAX_IMAGE_SIDE`` pixels."""
    if max(image.shape[:2]) <= _MAX_IMAGE_SIDE:
        return image
    picture = Image.fromarray(image)
    picture.thumbnail((_MAX_IMAGE_SIDE, _MAX_IMAGE_SIDE))
    return np.asarray(picture)


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


def _markdown_cell(text: str) -> str:
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~])", r"\\\1", text) or " "


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


@dataclass(frozen=True)
class SetInput:
    """One token set of a model with several (encoder and decoder, image and text towers), as it is drawn.

    Attributes:
        modality: how the set's tokens map onto its input (``ImageTokens``, ``TextTokens``, ``TabularTokens``).
        shown: the set's input as a person sees it: images ``[B, C, H, W]``, token ids ``[B, T]`` or features.
        inputs: what ``modality`` maps with: ``shown``, or a mapping with ``input_ids`` and its ``attention_mask``.
    """

    modality: Modality
    shown: Tensor
    inputs: Any


class TensorBoardViews:
    """Writes each explanation step of :class:`~lightning_gae.callbacks.GAECallback` to TensorBoard writers.

    Args:
        panel_px: the longer side of an image panel in pixels (TensorBoard shows images at their size);
            a whole picture is shrunk (aspect kept) to at most 4096 pixels on a side.
        scale: ``"per_map"``: each map's colours span 0 to its own largest magnitude; ``"fixed"``:
            a method's colour range is set at the first step written (over every tracked sample) and
            kept, so maps are comparable across steps (larger values take the end colour, marked ``≥``).
        evolution_length: columns of the ``gae_evolution`` pictures: the last steps, oldest first.
        alpha: weight of the heatmap colours over the grey image.
    """

    def __init__(self, panel_px: int = 256, scale: Scale = "per_map", evolution_length: int = 5, alpha: float = 0.7) -> None:
        if scale not in ("per_map", "fixed"):
            raise ValueError(f"scale={scale!r}; use 'per_map' or 'fixed'")
        if panel_px < 16 or evolution_length < 1 or not 0.0 <= alpha <= 1.0:
            raise ValueError(f"need panel_px >= 16, evolution_length >= 1 and alpha in [0, 1]; got {panel_px}, "
                             f"{evolution_length} and {alpha}")
        self.panel_px = panel_px
        self.scale = scale
        self.evolution_length = evolution_length
        self.alpha = alpha
        self._history: dict[int, deque[tuple[int, dict[str, np.ndarray]]]] = {}
        self._fixed: dict[str, tuple[float, float]] = {}
        # Per writer (its log dir): a second Trainer logging elsewhere gets its own inputs and layout.
        self._charted: dict[str, set[str]] = {}
        self._inputs_written: set[str] = set()

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
    ) -> None:
        """Write one step.

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
        """
        if not explanations:
            raise ValueError("TensorBoardViews.write needs at least one explanation")
        if sets is not None:
            values, inputs_values = self._set_values(writers, sets, sample_indices, explanations, rows, labels,
                                                     class_names)
            self._finish(writers, step, explanations, scalars, curves, values, inputs_values)
            return
        inputs = map_tensors(inputs, lambda t: t.detach().cpu())
        shown = shown.detach().cpu()
        first = next(iter(explanations.values()))
        raw: dict[str, tuple[Tensor, str]] = {m: (e.tokens.detach().float().cpu(), "tokens") for m, e in explanations.items()}
        for method, attributions in (maps or {}).items():
            raw[method] = (self._input_space(modality, attributions.detach().float().cpu(), shown, inputs), "input")
        shown_maps = {m: self._display(modality, values, space, shown, inputs) for m, (values, space) in raw.items()}
        scored = self._scored_units(modality, shown, inputs)
        ranges = self._ranges(shown_maps, scored)
        predictions = self._predictions(first, len(sample_indices))

        values: list[Summary.Value] = []
        inputs_values: list[Summary.Value] = []
        # The inputs go once to each writer: only drawn while some writer has not had them.
        need_inputs = any(_writer_key(w) not in self._inputs_written for w in writers)
        for k, index in enumerate(sample_indices):
            label = None if labels is None else _label(labels[k])
            header = self._header(index, label, predictions[k], class_names)
            name = sample_tag(index)
            images = {f"gae_heatmaps/{name}": self._picture(modality, shown, inputs, k, shown_maps, ranges, header, scored)}
            if isinstance(modality, ImageTokens):
                images[f"gae_evolution/{name}"] = self._evolution(modality, shown[k], index, step, shown_maps, ranges, k, header)
            values.extend(_image_value(tag, _bounded(picture)) for tag, picture in images.items())
            if not isinstance(modality, ImageTokens):
                # TensorBoard's own text summary: SummaryWriter.add_text would append "/text_summary" to the tag.
                table = self._markdown(modality, shown, inputs, k, shown_maps, header)
                values.extend(text_summary.text_pb(f"gae_tokens/{name}", table).value)
            if need_inputs:
                inputs_values.append(self._input_value(modality, shown, inputs, k, index, label, class_names))
            values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/prediction/{name}", predictions[k],
                                          metadata.encode("prediction", sample=index)))
            for order, (method, (tensor, space)) in enumerate(raw.items()):
                values.append(_tensor_summary(f"{metadata.TAG_PREFIX}/relevance/{method}/{name}", tensor[k].numpy(),
                                              metadata.encode("relevance", sample=index, method=method, space=space,
                                                              order=order)))
        self._finish(writers, step, explanations, scalars, curves, values, inputs_values)

    def write_scores(self, writers: Sequence[Any], step: int, scalars: Mapping[str, float],
                     curves: Curves | None = None) -> None:
        """The faithfulness of a step that draws nothing (the subset scored when fit ends): its curves for the
        GAE tab, the Text tab's ``gae_faithfulness`` table and the Custom Scalars layout of its metrics; the
        loggers write the scalars themselves."""
        values = self._curve_values(curves) + self._table_values(scalars)
        for writer in writers:
            layout = self._layout(writer, scalars)
            if layout:
                writer.add_custom_scalars(layout)
            if values:
                writer._get_file_writer().add_summary(Summary(value=values), step)
            writer.flush()

    @staticmethod
    def _table_values(scalars: Mapping[str, float] | None) -> list[Summary.Value]:
        table = faithfulness_table(scalars or {})
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
        values = values + self._curve_values(curves) + self._table_values(scalars)
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

    # --- relevance in the units a person sees ---------------------------------------------------

    @staticmethod
    def _input_space(modality: Modality, attributions: Tensor, shown: Tensor, inputs: Any) -> Tensor:
        """A Captum-style map in input units: pixels ``[B, H, W]``, or one value per token or feature."""
        if isinstance(modality, ImageTokens):
            return modality.pixel_map(attributions, shown)
        return modality.unit_scores(attributions, inputs)

    @staticmethod
    def _display(modality: Modality, values: Tensor, space: str, shown: Tensor, inputs: Any) -> np.ndarray:
        """``[B, ...]`` as drawn: the patch grid (token relevance) or pixels for images, one value per token or feature."""
        if space == "input":
            return values.numpy()
        if isinstance(modality, ImageTokens):
            rows, cols = shown.shape[-2] // modality.patch_size, shown.shape[-1] // modality.patch_size
            if values.shape[1] != modality.prefix_tokens + rows * cols:
                # A reshape alone would accept any multiple of the grid and draw other samples' patches.
                raise ValueError(f"{values.shape[1]} tokens do not fit {modality!r} on {shown.shape[-2]}x"
                                 f"{shown.shape[-1]} images ({modality.prefix_tokens} + {rows}x{cols} patches)")
            return values[:, modality.prefix_tokens :].reshape(-1, rows, cols).numpy()
        return modality.to_input(values, inputs).numpy()

    @staticmethod
    def _text_flags(modality: TextTokens, shown: Tensor, inputs: Any) -> tuple[Tensor, Tensor]:
        """``(valid, muted)`` ``[B, T]``: real tokens (attention mask, else not padding), and special tokens."""
        mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
        if isinstance(mask, Tensor) and mask.shape == shown.shape:
            valid = mask != 0
        elif modality.pad_id is not None:
            valid = shown != modality.pad_id
        else:
            valid = torch.ones_like(shown, dtype=torch.bool)
        muted = torch.isin(shown, torch.tensor(sorted(modality.special_ids), dtype=shown.dtype))
        return valid, muted

    def _scored_units(self, modality: Modality, shown: Tensor, inputs: Any) -> np.ndarray | None:
        """bool ``[B, T]``: the text tokens that set the colour scale (real, not special); None for other modalities."""
        if not isinstance(modality, TextTokens):
            return None
        valid, muted = self._text_flags(modality, shown, inputs)
        return (valid & ~muted).numpy()

    def _ranges(self, shown_maps: Mapping[str, np.ndarray], scored: np.ndarray | None) -> dict[str, list[tuple[float, float, bool]]]:
        """Method -> per sample ``(vmin, vmax, saturated)``."""
        out: dict[str, list[tuple[float, float, bool]]] = {}
        for method, maps in shown_maps.items():
            rows = [m[scored[k]] if scored is not None and scored[k].any() else m for k, m in enumerate(maps)]
            if self.scale == "per_map":
                out[method] = [(*visualize.value_range(r), False) for r in rows]
                continue
            if method not in self._fixed:
                self._fixed[method] = visualize.value_range(np.concatenate([r.reshape(-1) for r in rows]))
            vmin, vmax = self._fixed[method]
            out[method] = [(vmin, vmax, bool(np.nanmax(np.abs(r)) > vmax)) for r in rows]
        return out

    @staticmethod
    def _predictions(exp: Explanation, count: int) -> np.ndarray:
        """``float64 [B, 3]``: predicted class, explained class, the explained class's probability (NaN if unknown)."""
        out = np.full((count, 3), np.nan)
        logits = exp.logits
        if logits is not None and logits.dim() == 2:
            probs = logits.detach().float().cpu().softmax(dim=-1)
            out[:, 0] = probs.argmax(dim=-1).numpy()
            if exp.target is not None:
                target = exp.target.detach().cpu().long()
                out[:, 1] = target.numpy()
                out[:, 2] = probs.gather(1, target[:, None])[:, 0].numpy()
        elif exp.target is not None:
            out[:, 1] = exp.target.detach().cpu().numpy()
        return out

    @staticmethod
    def _class(value: float | int | None, class_names: Sequence[str] | None) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "?"
        number = int(value)
        if class_names is not None and 0 <= number < len(class_names) and class_names[number] != str(number):
            return f"{number} ({class_names[number]})"
        return str(number)

    def _header(self, index: int, label: int | list[int] | None, prediction: np.ndarray, class_names: Sequence[str] | None) -> str:
        parts = [f"val #{index}"]
        if isinstance(label, list):
            parts.append("labels " + (", ".join(self._class(c, class_names) for c in label) or "none"))
        elif label is not None:
            parts.append(f"label {self._class(label, class_names)}")
        pred, target, prob = prediction.tolist()
        if not math.isnan(pred):
            parts.append(f"pred {self._class(pred, class_names)}" + ("" if math.isnan(prob) or pred != target else f", p={prob:.2f}"))
        if not math.isnan(target) and target != pred:
            parts.append(f"explains {self._class(target, class_names)}" + ("" if math.isnan(prob) else f", p={prob:.2f}"))
        return " · ".join(parts)

    # --- pictures -------------------------------------------------------------------------------

    def _picture(self, modality: Modality, shown: Tensor, inputs: Any, k: int, shown_maps: Mapping[str, np.ndarray],
                 ranges: Mapping[str, list[tuple[float, float, bool]]], header: str, scored: np.ndarray | None) -> np.ndarray:
        if isinstance(modality, ImageTokens):
            image = modality.display_image(shown[k]).numpy()
            panels = [("input", visualize.enlarge(image, self.panel_px))]
            for method, maps in shown_maps.items():
                vmin, vmax, saturated = ranges[method][k]
                heat = visualize.heatmap_panel(image, maps[k], self.panel_px, (vmin, vmax), alpha=self.alpha)
                bar = visualize.colorbar(vmin, vmax, heat.shape[1], saturated=saturated)
                panels.append((method, visualize.stack([heat, bar], axis=0, gap=3)))
            return visualize.panel_row(panels, header)
        if isinstance(modality, TextTokens):
            valid, muted = self._text_flags(modality, shown, inputs)
            keep = valid[k].numpy()
            tokens = [t for t, v in zip(modality.token_strings(shown[k]), keep) if v]
            rows = [(m, maps[k][keep], ranges[m][k][:2]) for m, maps in shown_maps.items()]
            return visualize.token_rows(tokens, rows, muted=muted[k].numpy()[keep].tolist(), header=header)
        if isinstance(modality, TabularTokens):
            columns = [(m, maps[k], ranges[m][k][:2]) for m, maps in shown_maps.items()]
            return visualize.feature_table(modality.feature_names, columns, values=shown[k].float().numpy(), header=header)
        raise ValueError(f"TensorBoardViews draws ImageTokens, TextTokens and TabularTokens; got {type(modality).__name__}")

    def _evolution(self, modality: ImageTokens, x: Tensor, index: int, step: int, shown_maps: Mapping[str, np.ndarray],
                   ranges: Mapping[str, list[tuple[float, float, bool]]], k: int, header: str) -> np.ndarray:
        image = modality.display_image(x).numpy()
        cells = {m: visualize.heatmap_panel(image, maps[k], _EVOLUTION_PX, ranges[m][k][:2], alpha=self.alpha)
                 for m, maps in shown_maps.items()}
        history = self._history.setdefault(index, deque(maxlen=self.evolution_length))
        history.append((step, cells))
        # Empty columns first: the newest step is always the rightmost, and the picture never changes size.
        slots: list[tuple[int, dict[str, np.ndarray]] | None] = [None] * (self.evolution_length - len(history)) + list(history)
        shape = next(iter(cells.values())).shape[:2]
        grid = [[None if slot is None else slot[1].get(m) for slot in slots] for m in shown_maps]
        titles = ["" if slot is None else f"step {slot[0]}" for slot in slots]
        return visualize.evolution_grid(grid, list(shown_maps), titles, shape, header)

    def _markdown(self, modality: Modality, shown: Tensor, inputs: Any, k: int, shown_maps: Mapping[str, np.ndarray],
                  header: str) -> str:
        if isinstance(modality, TextTokens):
            valid, _ = self._text_flags(modality, shown, inputs)
            keep = valid[k].numpy()
            units = [t for t, v in zip(modality.token_strings(shown[k]), keep) if v]
            first = "token"
        else:
            keep = np.ones(len(modality.feature_names), dtype=bool)
            units = [f"{n} = {v:.4g}" for n, v in zip(modality.feature_names, shown[k].float().tolist())]
            first = "feature"
        methods = list(shown_maps)
        lines = [_markdown_cell(header), "", "| " + " | ".join([first, *methods]) + " |",
                 "| --- |" + " ---: |" * len(methods)]
        for u, unit in enumerate(units):
            scores = [f"{shown_maps[m][k][keep][u]:.4g}" for m in methods]
            lines.append("| " + " | ".join([_markdown_cell(unit), *scores]) + " |")
        return "\n".join(lines)

    # --- several token sets ---------------------------------------------------------------------

    def set_pictures(
        self,
        sets: Mapping[str, SetInput],
        sample_indices: Sequence[int],
        explanations: Mapping[str, Explanation],
        rows: Mapping[str, Mapping[str, Tensor]] | None = None,
        labels: Tensor | None = None,
        class_names: Sequence[str] | None = None,
    ) -> list[np.ndarray]:
        """The ``gae_heatmaps`` picture of each sample of a model with several token sets (see :meth:`write`), uint8 ``[h, w, 3]``."""
        drawn = self._set_drawing(sets, sample_indices, explanations, rows, labels, class_names)
        return [picture for picture, _ in drawn["pictures"]]

    def _set_drawing(self, sets: Mapping[str, SetInput], sample_indices: Sequence[int],
                     explanations: Mapping[str, Explanation], rows: Mapping[str, Mapping[str, Tensor]] | None,
                     labels: Tensor | None, class_names: Sequence[str] | None) -> dict[str, Any]:
        """Every set's values as drawn, each sample's picture and text table, and what the tensors need."""
        first = next(iter(explanations.values()))
        missing = [x for x in first.relevance if x not in sets]
        if missing:
            raise ValueError(f"TensorBoardViews.write(sets=...) has no SetInput for the token sets {missing}; the "
                             f"explanations have the sets {list(first.relevance)}")
        sets = {x: SetInput(sets[x].modality, sets[x].shown.detach().cpu(), map_tensors(sets[x].inputs, lambda t: t.detach().cpu()))
                for x in first.relevance}
        raw = {m: {x: e.relevance[x].detach().float().cpu() for x in sets} for m, e in explanations.items()}
        shown_maps = {m: {x: self._display(sets[x].modality, values, "tokens", sets[x].shown, sets[x].inputs)
                          for x, values in by_set.items()} for m, by_set in raw.items()}
        kept = {x: self._kept(s) for x, s in sets.items()}
        ranges: dict[tuple[str, str], list[tuple[float, float, bool]]] = {}
        for x, s in sets.items():
            # The fixed colour range of a (method, set) pair is kept under its own key.
            found = self._ranges({f"{m}/{x}": maps[x] for m, maps in shown_maps.items()},
                                 self._scored_units(s.modality, s.shown, s.inputs))
            ranges.update({(m, x): found[f"{m}/{x}"] for m in shown_maps})
        matrices = None if rows is None else self._matrices(rows, sets, kept, first)
        predictions = self._predictions(first, len(sample_indices))
        pictures = []
        for k, index in enumerate(sample_indices):
            label = None if labels is None or labels.dim() != 1 else int(labels[k])
            header = self._header(index, label, predictions[k], class_names)
            if matrices is not None:
                # The header's one explained class would be one row's; every row explains its own.
                header = f"val #{index} · row t explains the token predicted at target position t"
            if matrices is None:
                picture = self._sets_picture(sets, kept, k, shown_maps, ranges, header)
            else:
                picture = self._matrix_picture(matrices, k, header)
            pictures.append((_bounded(picture), self._sets_markdown(sets, kept, k, shown_maps, matrices, header)))
        return {"sets": sets, "raw": raw, "pictures": pictures, "predictions": predictions, "query_set": first.query_set}

    def _set_values(self, writers: Sequence[Any], sets: Mapping[str, SetInput], sample_indices: Sequence[int],
                    explanations: Mapping[str, Explanation], rows: Mapping[str, Mapping[str, Tensor]] | None,
                    labels: Tensor | None, class_names: Sequence[str] | None) -> tuple[list[Summary.Value], list[Summary.Value]]:
        """Pictures and text of every token set written; the dashboard's tensors and the inputs' tensors returned."""
        drawn = self._set_drawing(sets, sample_indices, explanations, rows, labels, class_names)
        sets, raw, predictions, query_set = drawn["sets"], drawn["raw"], drawn["predictions"], drawn["query_set"]
        values: list[Summary.Value] = []
        inputs_values: list[Summary.Value] = []
        need_inputs = any(_writer_key(w) not in self._inputs_written for w in writers)
        for k, index in enumerate(sample_indices):
            label = None if labels is None or labels.dim() != 1 else int(labels[k])
            name = sample_tag(index)
            picture, table = drawn["pictures"][k]
            values.append(_image_value(f"gae_heatmaps/{name}", picture))
            if table:
                values.extend(text_summary.text_pb(f"gae_tokens/{name}", table).value)
            if need_inputs:
                query = sets[query_set]
                inputs_values.append(self._input_value(query.modality, query.shown, query.inputs, k, index, label, class_names))
                for x, s in sets.items():
                    inputs_values.append(self._input_value(s.modality, s.shown, s.inputs, k, index, label, class_names,
                                                           token_set=x))
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
        return values, inputs_values

    def _kept(self, token_set: SetInput) -> np.ndarray:
        """bool ``[B, U]``: the units drawn (text: real tokens; everything else: all)."""
        if isinstance(token_set.modality, TextTokens):
            return self._text_flags(token_set.modality, token_set.shown, token_set.inputs)[0].numpy()
        return np.ones((token_set.shown.shape[0], 1), dtype=bool)

    @staticmethod
    def _unit_names(modality: Modality, shown: Tensor, k: int, count: int) -> list[str]:
        """Display names of sample ``k``'s ``count`` tokens of a set: strings for text, positions otherwise."""
        if isinstance(modality, TextTokens):
            return modality.token_strings(shown[k])
        return [str(i) for i in range(count)]

    def _matrices(self, rows: Mapping[str, Mapping[str, Tensor]], sets: Mapping[str, SetInput], kept: Mapping[str, np.ndarray],
                  first: Explanation) -> dict[str, Any]:
        """Per sample, the target x source matrices of every method and set, their labels and colour ranges."""
        query = sets[first.query_set]
        logits = first.logits
        out: dict[str, Any] = {"panels": [], "tables": []}
        for k in range(query.shown.shape[0]):
            positions = (np.flatnonzero(kept[first.query_set][k]) if isinstance(query.modality, TextTokens)
                         else np.arange(first.tokens.shape[1]))
            if logits is not None and logits.dim() == 3:
                # Row t is the token predicted at position t (what the explanation of query=t explains).
                made = logits[k].detach().argmax(dim=-1).cpu()
                outputs = self._unit_names(query.modality, made[None], 0, made.shape[0])
            else:
                outputs = self._unit_names(query.modality, query.shown, k, query.shown.shape[1])
            row_labels = [f"{t}: {outputs[t]}" for t in positions]
            panels, tables = [], []
            for method, by_set in rows.items():
                line = []
                for x, tensor in by_set.items():
                    s = sets[x]
                    columns = np.flatnonzero(kept[x][k]) if isinstance(s.modality, TextTokens) else np.arange(tensor.shape[2])
                    matrix = tensor[k].detach().float().cpu().numpy()[positions][:, columns]
                    names = self._unit_names(s.modality, s.shown, k, tensor.shape[2])
                    col_labels = [names[c] for c in columns]
                    key = f"{method}/{x}/rows"
                    if self.scale == "fixed":
                        if key not in self._fixed:
                            self._fixed[key] = visualize.value_range(matrix)
                        (vmin, vmax), saturated = self._fixed[key], bool(np.nanmax(np.abs(matrix)) > self._fixed[key][1])
                    else:
                        (vmin, vmax), saturated = visualize.value_range(matrix), False
                    panel = visualize.matrix_panel(matrix, row_labels, col_labels, (vmin, vmax), self.panel_px)
                    bar = visualize.colorbar(vmin, vmax, max(panel.shape[1], 128), saturated=saturated)
                    line.append((f"{method} · {x} (rows: targets)", visualize.stack([panel, bar], axis=0, gap=3)))
                    if isinstance(s.modality, TextTokens):
                        tables.append((f"{method} · {x}", row_labels, col_labels, matrix))
                panels.append(line)
            out["panels"].append(panels)
            out["tables"].append(tables)
        return out

    @staticmethod
    def _matrix_picture(matrices: Mapping[str, Any], k: int, header: str) -> np.ndarray:
        lines = matrices["panels"][k]
        return visualize.stack([visualize.panel_row(line, header if i == 0 else "") for i, line in enumerate(lines)],
                               axis=0)

    def _sets_picture(self, sets: Mapping[str, SetInput], kept: Mapping[str, np.ndarray], k: int,
                      shown_maps: Mapping[str, Mapping[str, np.ndarray]],
                      ranges: Mapping[tuple[str, str], list[tuple[float, float, bool]]], header: str) -> np.ndarray:
        """The inputs, then one line per method: every set's relevance side by side (images as heatmaps, text as tokens)."""
        inputs, lines = [], {m: [] for m in shown_maps}
        for x, s in sets.items():
            modality = s.modality
            if isinstance(modality, ImageTokens):
                image = modality.display_image(s.shown[k]).numpy()
                inputs.append((f"input · {x}", visualize.enlarge(image, self.panel_px)))
                for m, maps in shown_maps.items():
                    vmin, vmax, saturated = ranges[(m, x)][k]
                    heat = visualize.heatmap_panel(image, maps[x][k], self.panel_px, (vmin, vmax), alpha=self.alpha)
                    bar = visualize.colorbar(vmin, vmax, heat.shape[1], saturated=saturated)
                    lines[m].append((f"{m} · {x}", visualize.stack([heat, bar], axis=0, gap=3)))
            elif isinstance(modality, TextTokens):
                keep = kept[x][k]
                _, muted = self._text_flags(modality, s.shown, s.inputs)
                tokens = [t for t, v in zip(modality.token_strings(s.shown[k]), keep) if v]
                inputs.append((f"input · {x}", visualize.text_line(" ".join(tokens), 2 * self.panel_px)))
                for m, maps in shown_maps.items():
                    block = visualize.token_rows(tokens, [("", maps[x][k][keep], ranges[(m, x)][k][:2])],
                                                 muted=muted[k].numpy()[keep].tolist(), width=2 * self.panel_px)
                    lines[m].append((f"{m} · {x}", block))
            elif isinstance(modality, TabularTokens):
                inputs.append((f"input · {x}", visualize.text_line(f"{len(modality.feature_names)} features")))
                for m, maps in shown_maps.items():
                    table = visualize.feature_table(modality.feature_names, [(m, maps[x][k], ranges[(m, x)][k][:2])],
                                                    values=s.shown[k].float().numpy())
                    lines[m].append((f"{m} · {x}", table))
            else:
                raise ValueError(f"TensorBoardViews draws ImageTokens, TextTokens and TabularTokens; set {x!r} has "
                                 f"{type(modality).__name__}")
        rows = [visualize.panel_row(inputs, header)] + [visualize.panel_row(line) for line in lines.values()]
        return visualize.stack(rows, axis=0)

    def _sets_markdown(self, sets: Mapping[str, SetInput], kept: Mapping[str, np.ndarray], k: int,
                       shown_maps: Mapping[str, Mapping[str, np.ndarray]], matrices: Mapping[str, Any] | None,
                       header: str) -> str:
        """A table per text set (tokens x methods), or per method and text set the target x source matrix."""
        parts = [_markdown_cell(header)]
        if matrices is not None:
            for title, row_labels, col_labels, matrix in matrices["tables"][k]:
                parts += ["", f"**{_markdown_cell(title)}** (rows: target positions)", "",
                          "| " + " | ".join(["", *(_markdown_cell(c) for c in col_labels)]) + " |",
                          "| --- |" + " ---: |" * len(col_labels)]
                parts += ["| " + " | ".join([_markdown_cell(r), *(f"{v:.3g}" for v in row)]) + " |"
                          for r, row in zip(row_labels, matrix.tolist())]
            return "\n".join(parts) if len(parts) > 1 else ""
        methods = list(shown_maps)
        for x, s in sets.items():
            if not isinstance(s.modality, TextTokens):
                continue
            keep = kept[x][k]
            tokens = [t for t, v in zip(s.modality.token_strings(s.shown[k]), keep) if v]
            parts += ["", f"**{_markdown_cell(x)}**", "", "| " + " | ".join(["token", *methods]) + " |",
                      "| --- |" + " ---: |" * len(methods)]
            for u, token in enumerate(tokens):
                scores = [f"{shown_maps[m][x][k][keep][u]:.4g}" for m in methods]
                parts.append("| " + " | ".join([_markdown_cell(token), *scores]) + " |")
        return "\n".join(parts) if len(parts) > 1 else ""

    # --- the dashboard's input summary ----------------------------------------------------------

    def _input_value(self, modality: Modality, shown: Tensor, inputs: Any, k: int, index: int, label: int | list[int] | None,
                     class_names: Sequence[str] | None, token_set: str | None = None) -> Summary.Value:
        """The ``input`` summary of sample ``k``, or with ``token_set`` that set's ``set_input`` summary."""
        fields: dict[str, Any] = {"sample": index, "position": k, "label": label,
                                  "class_names": None if class_names is None else [str(c) for c in class_names]}
        if token_set is not None:
            fields["set"] = token_set
        if isinstance(modality, ImageTokens):
            pixels = (modality.display_image(shown[k]).numpy() * 255.0 + 0.5).astype(np.uint8)
            rows, cols = shown.shape[-2] // modality.patch_size, shown.shape[-1] // modality.patch_size
            fields.update(modality="image", prefix_tokens=modality.prefix_tokens, grid=[rows, cols],
                          patch_size=modality.patch_size)
            value = pixels
        elif isinstance(modality, TextTokens):
            valid, muted = self._text_flags(modality, shown, inputs)
            fields.update(modality="text", valid=valid[k].tolist(), muted=muted[k].tolist())
            value = np.array([t.encode("utf-8") for t in modality.token_strings(shown[k])], dtype=object)
        elif isinstance(modality, TabularTokens):
            fields.update(modality="tabular", prefix_tokens=modality.prefix_tokens, feature_names=modality.feature_names)
            value = shown[k].double().numpy()
        else:
            raise ValueError(f"TensorBoardViews draws ImageTokens, TextTokens and TabularTokens; got {type(modality).__name__}")
        if token_set is None:
            return _tensor_summary(f"{metadata.TAG_PREFIX}/input/{sample_tag(index)}", value, metadata.encode("input", **fields))
        return _tensor_summary(f"{metadata.TAG_PREFIX}/set_input/{token_set}/{sample_tag(index)}", value,
                               metadata.encode("set_input", **fields))
