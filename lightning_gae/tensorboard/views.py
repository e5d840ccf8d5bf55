"""One explanation step as pictures and tables, per modality: what GAECallback shows, without any I/O.

:class:`StepViews` draws the tracked samples of a step (a picture per sample with the input and every
method side by side, an evolution strip for images, a markdown table for text and features, and
for models with several token sets every set, or a target x source matrix per decoder). It keeps
what makes successive steps comparable: each method's fixed colour range (``scale="fixed"``) and the
last steps of every evolution strip. :class:`lightning_gae.tensorboard.TensorBoardViews` writes what
it draws to TensorBoard.

Everything that depends on the kind of input is the modality's (:class:`~lightning_gae.Modality`'s drawing
hooks: :meth:`~lightning_gae.Modality.picture`, :meth:`~lightning_gae.Modality.set_panels`,
:meth:`~lightning_gae.Modality.evolution_cells`, :meth:`~lightning_gae.Modality.table_units`); these views lay
the pieces out, keep the colour ranges and the strips' history.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from torch import Tensor

from lightning_gae import display
from lightning_gae._structures import map_tensors
from lightning_gae.display import Scale
from lightning_gae.engine.readout import Explanation
from lightning_gae.methods import get_method, method_names
from lightning_gae.modalities.tokens import MethodMap, Modality

__all__ = ["MAX_IMAGE_SIDE", "Scale", "SetInput", "StepViews", "bounded", "markdown_cell", "markdown_text", "method_signed"]

MAX_IMAGE_SIDE = 4096
"""Longest side of a drawn picture: larger PNGs make TensorBoard's image panel and the browser stall
(a long text or a long evolution_length would otherwise grow a picture without bound)."""


def bounded(image: np.ndarray) -> np.ndarray:
    """``image`` shrunk (aspect kept) so that neither side exceeds :data:`MAX_IMAGE_SIDE` pixels."""
    if max(image.shape[:2]) <= MAX_IMAGE_SIDE:
        return image
    picture = Image.fromarray(image)
    picture.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
    return np.asarray(picture)


def markdown_text(text: str) -> str:
    """``text`` (a user's name: a region, a method, a class, a token) as literal text inside markdown: HTML's
    ``&``, ``<`` and ``>`` as entities (markdown keeps raw HTML, and TensorBoard's sanitiser keeps some tags, such
    as ``<img>``) and markdown's own marks behind a backslash."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|])", r"\\\1", text)


def markdown_cell(text: str) -> str:
    """``text`` escaped for one cell of a markdown table (:func:`markdown_text`; a blank cell for empty text)."""
    return markdown_text(text) or " "


def method_signed(method: str, maps: Sequence[np.ndarray] = ()) -> bool:
    """Whether ``method``'s maps are drawn signed (a diverging colormap, white at 0): the method's registered
    ``signed`` fact, so that it is drawn alike in every sample, step and view; for a method this process does not
    know (registered only in the process that wrote a run), whether any of ``maps`` has a value below 0."""
    if method in method_names():
        return get_method(method).signed
    return any(bool(np.any(np.asarray(m, dtype=np.float64) < 0)) for m in maps)


@dataclass(frozen=True)
class SetInput:
    """One token set of a model with several (encoder and decoder, image and text towers), as it is drawn.

    Attributes:
        modality: how the set's tokens map onto its input (``ImageTokens``, ``TextTokens``, ``TabularTokens``, ...).
        shown: the set's input as a person sees it: images ``[B, C, H, W]``, token ids ``[B, T]`` or features.
        inputs: what ``modality`` maps with: ``shown``, or a mapping with ``input_ids`` and its ``attention_mask``.
    """

    modality: Modality
    shown: Tensor
    inputs: Any



class StepViews:
    """Draws each explanation step of :class:`~lightning_gae.callbacks.GAECallback`; keeps what spans steps.

    Args:
        panel_px: the longer side of an image panel in pixels (TensorBoard shows images at their size);
            a whole picture is shrunk (aspect kept) to at most 4096 pixels on a side.
        scale: ``"per_map"``: each map's colours span 0 to its own largest magnitude; ``"fixed"``:
            a method's colour range is set at the first step drawn (over every tracked sample) and
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
        # Per sample: its strip's columns (step, header, cells), and how many came since the strip was last drawn.
        self.history: dict[int, deque[tuple[int, str, dict[str, np.ndarray]]]] = {}
        self._unseen: dict[int, int] = {}
        self._fixed: dict[str, tuple[float, float]] = {}

    # --- relevance in the units a person sees ---------------------------------------------------

    @staticmethod
    def input_space(modality: Modality, attributions: Tensor, shown: Tensor, inputs: Any) -> Tensor:
        """A Captum-style map in input units: pixels ``[B, H, W]``, or one value per token or feature."""
        return modality.input_map(attributions, shown, inputs)

    @staticmethod
    def display_maps(modality: Modality, values: Tensor, space: str, shown: Tensor, inputs: Any) -> np.ndarray:
        """``[B, ...]`` as drawn: the patch grid (token relevance) or pixels for images, one value per token or feature."""
        if space == "input":
            return values.numpy()
        return modality.token_map(values, shown, inputs).numpy()

    @staticmethod
    def unit_flags(modality: Modality, shown: Tensor, inputs: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """``(valid, muted)`` ``[B, U]``: the units drawn and those drawn grey (:meth:`~lightning_gae.Modality.drawn_units`;
        text: real tokens, special tokens); None when every unit is drawn and scored."""
        flags = modality.drawn_units(shown, inputs)
        return None if flags is None else (flags[0].numpy(), flags[1].numpy())

    def scored_units(self, modality: Modality, shown: Tensor, inputs: Any) -> np.ndarray | None:
        """bool ``[B, U]``: the units that set the colour scale (drawn, not muted); None when all of them do."""
        flags = self.unit_flags(modality, shown, inputs)
        return None if flags is None else flags[0] & ~flags[1]

    @staticmethod
    def method_maps(shown_maps: Mapping[str, np.ndarray], ranges: Mapping[str, list[tuple[float, float, bool]]],
                    k: int) -> list[MethodMap]:
        """Sample ``k``'s map and colour range of every method."""
        return [MethodMap(m, maps[k], ranges[m][k][:2], ranges[m][k][2]) for m, maps in shown_maps.items()]

    def ranges(self, shown_maps: Mapping[str, np.ndarray], scored: np.ndarray | None,
               methods: Mapping[str, str] | None = None) -> dict[str, list[tuple[float, float, bool]]]:
        """Key (a method) -> per sample ``(vmin, vmax, saturated)``; a signed method (:func:`method_signed`) spans
        ``(-m, m)`` in every sample, a non-negative one ``(0, max)``, so each method keeps one colormap in every
        picture. ``methods``: the method of each key, where keys are not methods' names."""
        out: dict[str, list[tuple[float, float, bool]]] = {}
        for method, maps in shown_maps.items():
            rows = [m[scored[k]] if scored is not None and scored[k].any() else m for k, m in enumerate(maps)]
            signed = method_signed((methods or {}).get(method, method), rows)
            if self.scale == "per_map":
                out[method] = [(*display.value_range(r, signed), False) for r in rows]
                continue
            if method not in self._fixed:
                self._fixed[method] = display.value_range(np.concatenate([r.reshape(-1) for r in rows]), signed)
            vmin, vmax = self._fixed[method]
            out[method] = [(vmin, vmax, bool(np.nanmax(np.abs(r)) > vmax)) for r in rows]
        return out

    @staticmethod
    def predictions(exp: Explanation, count: int) -> np.ndarray:
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

    def header(self, index: int, label: int | list[int] | None, prediction: np.ndarray, class_names: Sequence[str] | None) -> str:
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

    def picture(self, modality: Modality, shown: Tensor, inputs: Any, k: int, shown_maps: Mapping[str, np.ndarray],
                 ranges: Mapping[str, list[tuple[float, float, bool]]], header: str,
                 flags: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Sample ``k``'s ``gae_heatmaps`` picture (:meth:`~lightning_gae.Modality.picture`); ``flags``: :meth:`unit_flags`."""
        row = None if flags is None else (flags[0][k], flags[1][k])
        return modality.picture(shown[k], self.method_maps(shown_maps, ranges, k), row, header, self.panel_px, self.alpha)

    def add_column(self, modality: Modality, x: Tensor, index: int, step: int, shown_maps: Mapping[str, np.ndarray],
                    ranges: Mapping[str, list[tuple[float, float, bool]]], k: int, header: str) -> bool:
        """This step's column of sample ``index``'s evolution strip (drawn by :meth:`evolution`); False when the
        modality draws no strip (:meth:`~lightning_gae.Modality.evolution_cells`)."""
        maps = self.method_maps(shown_maps, ranges, k)
        found = modality.evolution_cells(x, maps, self.alpha)
        if found is None:
            return False
        cells = {m.method: cell for m, cell in zip(maps, found)}
        self.history.setdefault(index, deque(maxlen=self.evolution_length)).append((step, header, cells))
        self._unseen[index] = self._unseen.get(index, 0) + 1
        return True

    def strip_due(self, index: int, last: bool) -> bool:
        """Whether sample ``index``'s strip is drawn now: at the last step of a run (``last``) when it has a column
        not drawn yet, or once ``evolution_length`` new columns have come, so that strips a slider steps through
        show each step once."""
        unseen = self._unseen.get(index, 0)
        return unseen >= self.evolution_length or (last and unseen > 0)

    def evolution(self, index: int) -> np.ndarray:
        """Sample ``index``'s strip: methods x its last ``evolution_length`` columns, oldest first."""
        history = self.history[index]
        self._unseen[index] = 0
        _, header, cells = history[-1]
        # Empty columns first: the newest step is always the rightmost, and the picture never changes size.
        slots: list[tuple[int, str, dict[str, np.ndarray]] | None] = (
            [None] * (self.evolution_length - len(history)) + list(history))
        shape = next(iter(cells.values())).shape[:2]
        grid = [[None if slot is None else slot[2].get(m) for slot in slots] for m in cells]
        titles = ["" if slot is None else f"step {slot[0]}" for slot in slots]
        return display.evolution_grid(grid, list(cells), titles, shape, header)

    def markdown(self, modality: Modality, shown: Tensor, inputs: Any, k: int, shown_maps: Mapping[str, np.ndarray],
                  header: str, flags: tuple[np.ndarray, np.ndarray] | None = None) -> str | None:
        """Sample ``k``'s ``gae_tokens`` table: a row per unit (:meth:`~lightning_gae.Modality.table_units`), a column
        per method; None for a modality that writes none (images)."""
        row = None if flags is None else (flags[0][k], flags[1][k])
        found = modality.table_units(shown[k], row)
        if found is None:
            return None
        first, units = found
        keep = np.ones(len(units), dtype=bool) if row is None else row[0]
        methods = list(shown_maps)
        lines = [markdown_cell(header), "", "| " + " | ".join(markdown_cell(c) for c in [first, *methods]) + " |",
                 "| --- |" + " ---: |" * len(methods)]
        for u, unit in enumerate(units):
            scores = [f"{shown_maps[m][k][keep][u]:.4g}" for m in methods]
            lines.append("| " + " | ".join([markdown_cell(unit), *scores]) + " |")
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
        drawn = self.set_drawing(sets, sample_indices, explanations, rows, labels, class_names)
        return [picture for picture, _ in drawn["pictures"]]

    def set_drawing(self, sets: Mapping[str, SetInput], sample_indices: Sequence[int],
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
        shown_maps = {m: {x: self.display_maps(sets[x].modality, values, "tokens", sets[x].shown, sets[x].inputs)
                          for x, values in by_set.items()} for m, by_set in raw.items()}
        flags = {x: self.unit_flags(s.modality, s.shown, s.inputs) for x, s in sets.items()}
        ranges: dict[tuple[str, str], list[tuple[float, float, bool]]] = {}
        for x, s in sets.items():
            # The fixed colour range of a (method, set) pair is kept under its own key.
            found = self.ranges({f"{m}/{x}": maps[x] for m, maps in shown_maps.items()},
                                 self.scored_units(s.modality, s.shown, s.inputs), {f"{m}/{x}": m for m in shown_maps})
            ranges.update({(m, x): found[f"{m}/{x}"] for m in shown_maps})
        matrices = None if rows is None else self._matrices(rows, sets, flags, first)
        predictions = self.predictions(first, len(sample_indices))
        pictures = []
        for k, index in enumerate(sample_indices):
            label = None if labels is None or labels.dim() != 1 else int(labels[k])
            header = self.header(index, label, predictions[k], class_names)
            if matrices is not None:
                # The header's one explained class would be one row's; every row explains its own.
                header = f"val #{index} · row t explains the token predicted at target position t"
            if matrices is None:
                picture = self._sets_picture(sets, flags, k, shown_maps, ranges, header)
            else:
                picture = self._matrix_picture(matrices, k, header)
            pictures.append((bounded(picture), self._sets_markdown(sets, flags, k, shown_maps, matrices, header)))
        return {"sets": sets, "raw": raw, "pictures": pictures, "predictions": predictions, "query_set": first.query_set,
                "outputs": None if matrices is None else matrices["outputs"]}

    def _matrices(self, rows: Mapping[str, Mapping[str, Tensor]], sets: Mapping[str, SetInput],
                  flags: Mapping[str, tuple[np.ndarray, np.ndarray] | None], first: Explanation) -> dict[str, Any]:
        """Per sample, the target x source matrices of every method and set, their labels and colour ranges."""
        query = sets[first.query_set]
        logits = first.logits
        out: dict[str, Any] = {"panels": [], "tables": [], "outputs": []}
        for k in range(query.shown.shape[0]):
            drawn = flags[first.query_set]
            positions = np.flatnonzero(drawn[0][k]) if drawn is not None else np.arange(first.tokens.shape[1])
            if logits is not None and logits.dim() == 3:
                # Row t is the token predicted at position t (what the explanation of query=t explains).
                made = logits[k].detach().argmax(dim=-1).cpu()
                outputs = query.modality.token_labels(made, made.shape[0])
            else:
                outputs = query.modality.token_labels(query.shown[k], query.shown.shape[1])
            out["outputs"].append(outputs)
            row_labels = [f"{t}: {outputs[t]}" for t in positions]
            panels, tables = [], []
            for method, by_set in rows.items():
                line = []
                for x, tensor in by_set.items():
                    s, drawn_x = sets[x], flags[x]
                    columns = np.flatnonzero(drawn_x[0][k]) if drawn_x is not None else np.arange(tensor.shape[2])
                    matrix = tensor[k].detach().float().cpu().numpy()[positions][:, columns]
                    names = s.modality.token_labels(s.shown[k], tensor.shape[2])
                    col_labels = [names[c] for c in columns]
                    key = f"{method}/{x}/rows"
                    signed = method_signed(method, [matrix])
                    if self.scale == "fixed":
                        if key not in self._fixed:
                            self._fixed[key] = display.value_range(matrix, signed)
                        (vmin, vmax), saturated = self._fixed[key], bool(np.nanmax(np.abs(matrix)) > self._fixed[key][1])
                    else:
                        (vmin, vmax), saturated = display.value_range(matrix, signed), False
                    panel = display.matrix_panel(matrix, row_labels, col_labels, (vmin, vmax), self.panel_px)
                    bar = display.colorbar(vmin, vmax, max(panel.shape[1], 128), saturated=saturated)
                    line.append((f"{method} · {x} (rows: targets)", display.stack([panel, bar], axis=0, gap=3)))
                    if drawn_x is not None:
                        tables.append((f"{method} · {x}", row_labels, col_labels, matrix))
                panels.append(line)
            out["panels"].append(panels)
            out["tables"].append(tables)
        return out

    @staticmethod
    def _matrix_picture(matrices: Mapping[str, Any], k: int, header: str) -> np.ndarray:
        lines = matrices["panels"][k]
        return display.stack([display.panel_row(line, header if i == 0 else "") for i, line in enumerate(lines)],
                               axis=0)

    def _sets_picture(self, sets: Mapping[str, SetInput], flags: Mapping[str, tuple[np.ndarray, np.ndarray] | None],
                      k: int, shown_maps: Mapping[str, Mapping[str, np.ndarray]],
                      ranges: Mapping[tuple[str, str], list[tuple[float, float, bool]]], header: str) -> np.ndarray:
        """The inputs, then one line per method: every set's relevance side by side (images as heatmaps, text as tokens,
        as each set's modality draws it: :meth:`~lightning_gae.Modality.set_panels`)."""
        inputs: list[tuple[str, np.ndarray]] = []
        lines: dict[str, list[tuple[str, np.ndarray]]] = {m: [] for m in shown_maps}
        for x, s in sets.items():
            maps = [MethodMap(m, by_set[x][k], ranges[(m, x)][k][:2], ranges[(m, x)][k][2]) for m, by_set in shown_maps.items()]
            drawn = flags[x]
            row = None if drawn is None else (drawn[0][k], drawn[1][k])
            shown, cells = s.modality.set_panels(x, s.shown[k], maps, row, self.panel_px, self.alpha)
            inputs.append((f"input · {x}", shown))
            for m, cell in zip(maps, cells):
                lines[m.method].append((f"{m.method} · {x}", cell))
        rows = [display.panel_row(inputs, header)] + [display.panel_row(line) for line in lines.values()]
        return display.stack(rows, axis=0)

    def _sets_markdown(self, sets: Mapping[str, SetInput], flags: Mapping[str, tuple[np.ndarray, np.ndarray] | None], k: int,
                       shown_maps: Mapping[str, Mapping[str, np.ndarray]], matrices: Mapping[str, Any] | None,
                       header: str) -> str:
        """A table per text set (tokens x methods: a set whose modality flags its units), or per method and text set the
        target x source matrix."""
        parts = [markdown_cell(header)]
        if matrices is not None:
            for title, row_labels, col_labels, matrix in matrices["tables"][k]:
                parts += ["", f"**{markdown_cell(title)}** (rows: target positions)", "",
                          "| " + " | ".join(["", *(markdown_cell(c) for c in col_labels)]) + " |",
                          "| --- |" + " ---: |" * len(col_labels)]
                parts += ["| " + " | ".join([markdown_cell(r), *(f"{v:.3g}" for v in row)]) + " |"
                          for r, row in zip(row_labels, matrix.tolist())]
            return "\n".join(parts) if len(parts) > 1 else ""
        methods = list(shown_maps)
        for x, s in sets.items():
            drawn = flags[x]
            if drawn is None:
                continue
            keep = drawn[0][k]
            tokens = [t for t, v in zip(s.modality.token_labels(s.shown[k], len(keep)), keep) if v]
            parts += ["", f"**{markdown_cell(x)}**", "", "| " + " | ".join(markdown_cell(c) for c in ["token", *methods]) + " |",
                      "| --- |" + " ---: |" * len(methods)]
            for u, token in enumerate(tokens):
                scores = [f"{shown_maps[m][x][k][keep][u]:.4g}" for m in methods]
                parts.append("| " + " | ".join([markdown_cell(token), *scores]) + " |")
        return "\n".join(parts) if len(parts) > 1 else ""
