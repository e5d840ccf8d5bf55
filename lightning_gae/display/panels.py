"""Colour-lookup panels: the callback's pictures, built with array indexing, no figure per picture.

Colours come from indexing a matplotlib colormap's table and glyphs from bitmaps of matplotlib's
FreeType wrapper, so a training step renders without creating a figure per sample.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Literal

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib import ft2font
from matplotlib.font_manager import FontProperties, findfont

from lightning_gae.display._common import PAD_PX, WHITE, ArrayLike, as_numpy, as_uint8

__all__ = [
    "DIVERGING_CMAP",
    "SEQUENTIAL_CMAP",
    "Scale",
    "colorbar",
    "colorize",
    "colormap_for",
    "colormap_lut",
    "enlarge",
    "evolution_grid",
    "feature_table",
    "heatmap_panel",
    "matrix_panel",
    "panel_row",
    "stack",
    "text_line",
    "token_rows",
    "value_range",
]

SEQUENTIAL_CMAP = "inferno"
"""Colormap of non-negative relevance: perceptually uniform, black for none."""
DIVERGING_CMAP = "RdBu_r"
"""Colormap of signed relevance: white at 0, red for positive, blue for negative."""
Scale = Literal["per_map", "fixed"]
"""How the colours of a map span its values over pictures: ``"per_map"``, each map's own :func:`value_range`;
``"fixed"``, a range set once and kept, so that maps of successive steps compare."""

_TEXT_PX = 13
_INK = (0, 0, 0)
_GAP = 8
_BAR_PX = 10
_EMPTY = (236, 236, 236)


@functools.lru_cache(maxsize=32)
def colormap_lut(cmap: str) -> np.ndarray:
    """``cmap`` (a matplotlib colormap name) as a read-only uint8 table of 256 RGB colours ``[256, 3]``."""
    if cmap not in matplotlib.colormaps:
        raise ValueError(f"cmap={cmap!r} is not a matplotlib colormap; e.g. {SEQUENTIAL_CMAP!r} or {DIVERGING_CMAP!r}")
    lut = (matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))[:, :3] * 255.0 + 0.5).astype(np.uint8)
    lut.flags.writeable = False
    return lut


def value_range(values: ArrayLike, signed: bool | None = None) -> tuple[float, float]:
    """The colour range of a relevance map: ``(0, max)`` for a non-negative method, ``(-m, m)`` with ``m = max |v|``
    for a signed one.

    Anchored at 0 (never min-max), so a map that is flat stays one colour instead of being stretched
    to the full scale, and a signed map puts 0 at the centre of a diverging colormap (white).

    Args:
        values: the map (or every map that shares the range).
        signed: the method's relevance is signed (:func:`colormap_for`): always ``(-m, m)``, even for a map that
            happens to have no negative value, so that a method keeps one colormap in every sample; False: always
            ``(0, max)`` (negative values, e.g. rounding, take the first colour); None: signed when a value is
            below 0.

    A map without a non-zero finite value gets ``(0, 1)`` (``(-1, 1)`` when signed).
    """
    array = as_numpy(values).astype(np.float64)
    finite = array[np.isfinite(array)]
    if signed is None:
        signed = bool(finite.size) and float(finite.min()) < 0
    top = float(np.abs(finite).max() if signed else np.clip(finite, 0.0, None).max()) if finite.size else 0.0
    if top == 0.0:
        top = 1.0
    return (-top, top) if signed else (0.0, top)


def colormap_for(signed: bool) -> str:
    """The colormap of a method's maps, by whether its relevance is signed (the method's ``signed`` fact): one
    convention for every picture and the GAE tab, :data:`DIVERGING_CMAP` (white at 0) or :data:`SEQUENTIAL_CMAP`."""
    return DIVERGING_CMAP if signed else SEQUENTIAL_CMAP


def colorize(values: ArrayLike, vmin: float, vmax: float, cmap: str = SEQUENTIAL_CMAP) -> np.ndarray:
    """Values of any shape as uint8 colours ``[..., 3]`` by lookup into ``cmap``'s 256 entries.

    ``vmin`` maps to the first entry and ``vmax`` to the last; values beyond are clipped, NaN takes the first.
    """
    if not vmax > vmin:
        raise ValueError(f"colorize needs vmax > vmin; got vmin={vmin}, vmax={vmax}")
    scaled = (as_numpy(values).astype(np.float64) - vmin) / (vmax - vmin)
    index = np.clip(np.rint(np.nan_to_num(scaled, nan=0.0) * 255.0), 0, 255).astype(np.intp)
    return colormap_lut(cmap)[index]


def _cmap_for(vmin: float, cmap: str | None) -> str:
    return cmap or (DIVERGING_CMAP if vmin < 0 else SEQUENTIAL_CMAP)


@functools.lru_cache(maxsize=1)
def _font() -> ft2font.FT2Font:
    return ft2font.FT2Font(findfont(FontProperties(family="DejaVu Sans")))


def _line_box(size: int) -> tuple[int, int]:
    """``(height, baseline)`` in pixels of one text line: room for the font's ascender and descender."""
    font = _font()
    ascent = font.ascender / font.units_per_EM * size
    descent = -font.descender / font.units_per_EM * size
    return math.ceil(ascent) + math.ceil(descent) + 2, math.ceil(ascent) + 1


@functools.lru_cache(maxsize=8192)
def _coverage(text: str, size: int) -> np.ndarray:
    """Ink coverage in [0, 1] of ``text`` on one line ``[height, width]``, glyphs on a common baseline."""
    height, baseline = _line_box(size)
    if not text:
        out = np.zeros((height, 1), dtype=np.float32)
    else:
        font = _font()
        font.set_size(size, 72)  # 72 dpi: the size is in pixels
        font.set_text(text)
        font.draw_glyphs_to_bitmap(antialiased=True)
        bitmap = np.asarray(font.get_image(), dtype=np.float32) / 255.0
        descent = round(font.get_descent() / 64)
        out = np.zeros((height, bitmap.shape[1] + 1), dtype=np.float32)
        top = baseline + descent - bitmap.shape[0]
        src = bitmap[max(0, -top) : height - top]
        out[max(0, top) : max(0, top) + src.shape[0], : bitmap.shape[1]] = src
    out.flags.writeable = False
    return out


def _fit(text: str, width: int, size: int) -> str:
    """``text``, cut and ended with an ellipsis when it is wider than ``width`` pixels."""
    if _coverage(text, size).shape[1] <= width:
        return text
    low, high = 0, len(text)
    while low < high:  # the longest prefix that fits with the ellipsis
        middle = (low + high + 1) // 2
        if _coverage(text[:middle] + "…", size).shape[1] <= width:
            low = middle
        else:
            high = middle - 1
    return text[:low] + "…"


def text_line(
    text: str,
    width: int | None = None,
    size: int = _TEXT_PX,
    align: str = "left",
    ink: Sequence[int] = _INK,
    background: Sequence[int] = (WHITE, WHITE, WHITE),
) -> np.ndarray:
    """One line of text as uint8 ``[h, w, 3]``.

    Args:
        text: drawn on one line; with ``width``, cut with an ellipsis where it would be wider.
        width: the picture's width in pixels; None: as wide as the text.
        size: font size in pixels.
        align: ``"left"``, ``"center"`` or ``"right"`` within ``width``.
        ink: the text's RGB colour.
        background: the RGB colour behind it.
    """
    cover = _coverage(text if width is None else _fit(text, width, size), size)
    out_w = cover.shape[1] if width is None else width
    offset = {"left": 0, "center": (out_w - cover.shape[1]) // 2, "right": out_w - cover.shape[1]}[align]
    alpha = np.zeros((cover.shape[0], out_w), dtype=np.float32)
    alpha[:, max(0, offset) : max(0, offset) + cover.shape[1]] = cover[:, : out_w]
    back, front = np.asarray(background, dtype=np.float32), np.asarray(ink, dtype=np.float32)
    return (back + alpha[..., None] * (front - back) + 0.5).astype(np.uint8)


def _blank(height: int, width: int, colour: Sequence[int] = (WHITE, WHITE, WHITE)) -> np.ndarray:
    return np.broadcast_to(np.asarray(colour, dtype=np.uint8), (height, width, 3)).copy()


def _pad(image: np.ndarray, top: int, bottom: int, left: int, right: int, colour: Sequence[int]) -> np.ndarray:
    out = _blank(image.shape[0] + top + bottom, image.shape[1] + left + right, colour)
    out[top : top + image.shape[0], left : left + image.shape[1]] = image
    return out


def stack(parts: Sequence[np.ndarray], axis: int, gap: int = 0, align: str = "start") -> np.ndarray:
    """Pictures ``uint8 [h, w, 3]`` one after another along ``axis`` (0: down, 1: across) on white, ``gap`` pixels apart.

    Narrower ones are padded with white at the end (``align="start"``) or on both sides (``"center"``).
    """
    other = 1 - axis
    extent = max(p.shape[other] for p in parts)
    length = sum(p.shape[axis] for p in parts) + gap * (len(parts) - 1)
    shape = [0, 0, 3]
    shape[axis], shape[other] = length, extent
    # One white canvas, each part copied into its place (no padded copy per part).
    out = np.full(shape, WHITE, dtype=np.uint8)
    at = 0
    for part in parts:
        before = (extent - part.shape[other]) // 2 if align == "center" else 0
        place = [slice(None), slice(None)]
        place[axis] = slice(at, at + part.shape[axis])
        place[other] = slice(before, before + part.shape[other])
        out[tuple(place)] = part
        at += part.shape[axis] + gap
    return out


def _number(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"


def colorbar(vmin: float, vmax: float, width: int, cmap: str | None = None, saturated: bool = False) -> np.ndarray:
    """A horizontal colour scale ``width`` pixels wide above the values of its ends (and of 0 when inside).

    ``cmap`` None picks :data:`DIVERGING_CMAP` for a range below 0, else :data:`SEQUENTIAL_CMAP`;
    ``saturated`` marks the top value with ``≥`` (larger values take the last colour).
    """
    ramp = colorize(np.linspace(vmin, vmax, width), vmin, vmax, _cmap_for(vmin, cmap))
    bar = np.broadcast_to(ramp[None], (_BAR_PX, width, 3))
    labels = text_line(_number(vmin), width, size=_TEXT_PX - 2)
    right = text_line(("≥ " if saturated else "") + _number(vmax), width, size=_TEXT_PX - 2, align="right")
    labels = np.minimum(labels, right)
    if vmin < 0 < vmax:
        labels = np.minimum(labels, text_line("0", width, size=_TEXT_PX - 2, align="center"))
    return stack([bar, labels], axis=0, gap=1)


def heatmap_panel(
    image: ArrayLike,
    relevance: ArrayLike,
    size: int = 256,
    vrange: tuple[float, float] | None = None,
    cmap: str | None = None,
    alpha: float = 0.7,
    interpolation: Literal["nearest", "bilinear"] = "nearest",
) -> np.ndarray:
    """An image, in grey, under its colour-mapped relevance; the longer side is ``size`` pixels.

    Args:
        image: ``[H, W, 3]``, uint8 or floats in [0, 1]; enlarged nearest-neighbour so input pixels stay crisp.
        relevance: ``[h, w]`` at any resolution (a patch grid or pixels), resized to the panel.
        size: the panel's longer side in pixels.
        vrange: ``(vmin, vmax)`` of the colours; None: :func:`value_range` of ``relevance``.
        cmap: None picks :data:`DIVERGING_CMAP` for a range below 0, else :data:`SEQUENTIAL_CMAP`.
        alpha: weight of the colours over the grey image.
        interpolation: ``"nearest"`` draws each patch (or pixel) as the one value it has, which is
            what the metrics score, and PNG-encodes about 15 times smaller than ``"bilinear"``'s
            smooth blend (TensorBoard's writer checksums every byte in Python).

    Returns:
        uint8 ``[h, w, 3]``.
    """
    picture = as_uint8(image)
    heat = as_numpy(relevance).astype(np.float64)
    if heat.ndim != 2:
        raise ValueError(f"heatmap_panel needs relevance [h, w]; got shape {heat.shape}")
    height, width = picture.shape[:2]
    scale = size / max(height, width)
    out_h, out_w = max(1, round(height * scale)), max(1, round(width * scale))
    rows, cols = np.arange(out_h) * height // out_h, np.arange(out_w) * width // out_w
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation={interpolation!r}; use 'nearest' or 'bilinear'")
    vmin, vmax = vrange or value_range(heat)
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    if interpolation == "bilinear":
        grey = picture[rows][:, cols].astype(np.float32) @ weights
        resized = F.interpolate(torch.from_numpy(heat)[None, None], size=(out_h, out_w), mode="bilinear",
                                align_corners=False)
        return _blend(colorize(resized[0, 0].numpy(), vmin, vmax, _cmap_for(vmin, cmap)), grey, alpha)
    # Nearest: every output pixel takes one image pixel and one relevance value (the source index of
    # torch's "nearest-exact"), so the blend is computed once per distinct pair of rows and of columns
    # and then repeated: the same pixels, without colouring and blending the enlarged panel.
    src_h, src_w = heat.shape
    rows_h = np.minimum(((np.arange(out_h) + 0.5) * src_h / out_h).astype(np.intp), src_h - 1)
    cols_w = np.minimum(((np.arange(out_w) + 0.5) * src_w / out_w).astype(np.intp), src_w - 1)
    row_pairs, row_of = np.unique(rows * src_h + rows_h, return_inverse=True)
    col_pairs, col_of = np.unique(cols * src_w + cols_w, return_inverse=True)
    grey = picture[row_pairs // src_h][:, col_pairs // src_w].astype(np.float32) @ weights
    colours = colorize(heat, vmin, vmax, _cmap_for(vmin, cmap))[row_pairs % src_h][:, col_pairs % src_w]
    return _blend(colours, grey, alpha)[row_of.reshape(-1)][:, col_of.reshape(-1)]


def _blend(colours: np.ndarray, grey: np.ndarray, alpha: float) -> np.ndarray:
    """uint8 colours ``[..., 3]`` over grey levels ``[...]`` with weight ``alpha``."""
    return (alpha * colours.astype(np.float32) + (1.0 - alpha) * grey[..., None] + 0.5).astype(np.uint8)


def matrix_panel(
    values: ArrayLike,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    vrange: tuple[float, float] | None = None,
    size: int = 256,
    cmap: str | None = None,
) -> np.ndarray:
    """A matrix ``[R, C]`` as coloured square cells, row labels on the left and column labels written upwards above.

    Args:
        values: ``[R, C]`` (e.g. one row per target token, one column per source token); NaN cells are drawn grey.
        row_labels: ``R`` strings, cut to 96 px.
        col_labels: ``C`` strings, cut to 96 px.
        vrange: ``(vmin, vmax)`` of the colours; None: :func:`value_range` of ``values``.
        size: the cells' longer side in pixels (at least; cells are at least 14 px square, so labels stay readable).
        cmap: None picks :data:`DIVERGING_CMAP` for a range below 0, else :data:`SEQUENTIAL_CMAP`.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    matrix = as_numpy(values).astype(np.float64)
    if matrix.ndim != 2 or matrix.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"matrix_panel got values {matrix.shape} for {len(row_labels)} row and {len(col_labels)} column labels")
    rows, cols = matrix.shape
    cell = max(14, math.ceil(size / max(rows, cols, 1)))
    vmin, vmax = vrange or value_range(matrix[np.isfinite(matrix)])
    colours = colorize(matrix, vmin, vmax, _cmap_for(vmin, cmap))
    colours[~np.isfinite(matrix)] = _EMPTY
    body = colours.repeat(cell, axis=0).repeat(cell, axis=1)
    size_px = min(_TEXT_PX, cell - 2)
    row_px = min(96, max((_coverage(t, size_px).shape[1] for t in row_labels), default=0) + 4)
    col_px = min(96, max((_coverage(t, size_px).shape[1] for t in col_labels), default=0) + 4)
    left = stack([np.pad(text_line(t, row_px, size=size_px, align="right"),
                         ((0, max(0, cell - _line_box(size_px)[0])), (0, 0), (0, 0)), constant_values=WHITE)[:cell]
                  for t in row_labels], axis=0)
    # Column labels are drawn as lines and turned a quarter, so a long token never widens its column.
    top = stack([np.rot90(np.pad(text_line(t, col_px, size=size_px),
                                 ((0, max(0, cell - _line_box(size_px)[0])), (0, 0), (0, 0)), constant_values=WHITE)[:cell])
                 for t in col_labels], axis=1)
    corner = _blank(top.shape[0], left.shape[1])
    return stack([stack([corner, top], axis=1, gap=2), stack([left, body], axis=1, gap=2)], axis=0, gap=2)


def enlarge(image: ArrayLike, size: int = 256) -> np.ndarray:
    """``image`` resized nearest-neighbour so that its longer side is ``size`` pixels, uint8 ``[h, w, 3]``."""
    picture = as_uint8(image)
    height, width = picture.shape[:2]
    scale = size / max(height, width)
    out_h, out_w = max(1, round(height * scale)), max(1, round(width * scale))
    return picture[np.arange(out_h) * height // out_h][:, np.arange(out_w) * width // out_w]


def panel_row(panels: Sequence[tuple[str, np.ndarray]], header: str = "") -> np.ndarray:
    """Pictures side by side, each under a one-line title cut to its width, below an optional header line.

    Args:
        panels: ``(title, uint8 [h, w, 3])`` pairs, left to right; shorter pictures are padded below.
        header: one line above everything (cut to the total width).

    Returns:
        uint8 ``[h, w, 3]``.
    """
    if not panels:
        raise ValueError("panel_row needs at least one panel")
    columns = [stack([text_line(title, p.shape[1], align="center"), p], axis=0, gap=2) for title, p in panels]
    row = stack(columns, axis=1, gap=_GAP)
    parts = [text_line(header, row.shape[1]), row] if header else [row]
    body = stack(parts, axis=0, gap=4)
    return np.pad(body, ((PAD_PX, PAD_PX), (PAD_PX, PAD_PX), (0, 0)), constant_values=WHITE)


def token_rows(
    tokens: Sequence[str],
    rows: Sequence[tuple[str, ArrayLike, tuple[float, float]]],
    muted: Sequence[bool] | None = None,
    header: str = "",
    width: int = 768,
    cmap: str | None = None,
) -> np.ndarray:
    """Text, once per method: tokens on boxes coloured by that method's relevance, wrapped at ``width``.

    Every token keeps the same font size whatever the sentence length, so the picture grows downwards.

    Args:
        tokens: ``T`` strings.
        rows: ``(method, relevance [T], (vmin, vmax))`` per method, each drawn as a titled block with a colorbar.
        muted: ``T`` flags; muted tokens (special tokens) are drawn on grey, outside the colour scale.
        header: one line above everything.
        width: wrapping width in pixels.
        cmap: None picks :data:`DIVERGING_CMAP` for a range below 0, else :data:`SEQUENTIAL_CMAP`.

    Returns:
        uint8 ``[h, width + padding, 3]``.
    """
    flags = [False] * len(tokens) if muted is None else [bool(m) for m in muted]
    if len(flags) != len(tokens):
        raise ValueError(f"token_rows got {len(tokens)} tokens and {len(flags)} muted flags")
    blocks = [text_line(header, width)] if header else []
    for method, relevance, (vmin, vmax) in rows:
        values = as_numpy(relevance).astype(np.float64).reshape(-1)
        if values.shape[0] != len(tokens):
            raise ValueError(f"token_rows got {len(tokens)} tokens and {values.shape[0]} relevance values for {method!r}")
        colours = colorize(values, vmin, vmax, _cmap_for(vmin, cmap))
        lines: list[list[np.ndarray]] = [[]]
        used = 0
        for token, colour, mute in zip(tokens, colours, flags):
            face = (224, 224, 224) if mute else tuple(int(c) for c in colour)
            light = float(np.dot(face, (0.299, 0.587, 0.114))) >= 128
            box = text_line(token, size=_TEXT_PX + 1, ink=(85, 85, 85) if mute else (_INK if light else (WHITE,) * 3),
                            background=face)
            box = _pad(box, 2, 2, 4, 4, face)[:, :width]
            if used and used + box.shape[1] > width:
                lines.append([])
                used = 0
            lines[-1].append(box)
            used += box.shape[1] + 2
        text = stack([stack(line, axis=1, gap=2) for line in lines if line] or [_blank(1, width)], axis=0, gap=2)
        title = stack([text_line(method, size=_TEXT_PX + 1), colorbar(vmin, vmax, 192, cmap)], axis=1, gap=16)
        blocks.append(stack([title, text], axis=0, gap=4))
    body = stack([_blank(1, width), *blocks], axis=0, gap=10)
    return np.pad(body, ((PAD_PX, PAD_PX), (PAD_PX, PAD_PX), (0, 0)), constant_values=WHITE)


def feature_table(
    names: Sequence[str],
    columns: Sequence[tuple[str, ArrayLike, tuple[float, float]]],
    values: ArrayLike | None = None,
    header: str = "",
    cell_px: int = 112,
    cmap: str | None = None,
) -> np.ndarray:
    """A table of features (rows) x methods (columns), each cell coloured by relevance and showing it.

    Args:
        names: ``F`` feature names.
        columns: ``(method, relevance [F], (vmin, vmax))`` per method; a colorbar closes each column.
        values: optional ``[F]`` input values, shown as ``name = value``.
        header: one line above the table.
        cell_px: width of a method column in pixels.
        cmap: None picks :data:`DIVERGING_CMAP` for a range below 0, else :data:`SEQUENTIAL_CMAP`.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    labels = list(names)
    if values is not None:
        labels = [f"{n} = {v:.4g}" for n, v in zip(names, as_numpy(values).reshape(-1).tolist())]
    label_w = min(320, max(_coverage(label, _TEXT_PX).shape[1] for label in [*labels, "feature"]) + 8)
    line_h = _line_box(_TEXT_PX)[0] + 6
    label_col = stack([text_line("feature", label_w)] + [np.pad(text_line(label, label_w), ((3, 3), (0, 0), (0, 0)),
                                                                  constant_values=WHITE) for label in labels],
                       axis=0, gap=2)
    table = [label_col]
    for method, relevance, (vmin, vmax) in columns:
        scores = as_numpy(relevance).astype(np.float64).reshape(-1)
        if scores.shape[0] != len(labels):
            raise ValueError(f"feature_table got {len(labels)} names and {scores.shape[0]} relevance values for {method!r}")
        colours = colorize(scores, vmin, vmax, _cmap_for(vmin, cmap))
        cells = [text_line(method, cell_px, align="center")]
        for score, colour in zip(scores.tolist(), colours):
            face = tuple(int(c) for c in colour)
            ink = _INK if float(np.dot(face, (0.299, 0.587, 0.114))) >= 128 else (WHITE,) * 3
            cell = text_line(_number(score), cell_px, align="center", ink=ink, background=face)
            cells.append(_pad(cell, 3, line_h - cell.shape[0] - 3, 0, 0, face))
        cells.append(colorbar(vmin, vmax, cell_px, cmap))
        table.append(stack(cells, axis=0, gap=2))
    body = stack(table, axis=1, gap=_GAP)
    if header:
        body = stack([text_line(header, body.shape[1]), body], axis=0, gap=4)
    return np.pad(body, ((PAD_PX, PAD_PX), (PAD_PX, PAD_PX), (0, 0)), constant_values=WHITE)


def evolution_grid(
    cells: Sequence[Sequence[np.ndarray | None]],
    row_titles: Sequence[str],
    col_titles: Sequence[str],
    cell_shape: tuple[int, int],
    header: str = "",
) -> np.ndarray:
    """A grid of equal cells (e.g. methods x the last steps) whose size never depends on how many are filled.

    Args:
        cells: rows of pictures ``uint8 [cell_h, cell_w, 3]``; None draws an empty grey cell.
        row_titles: one per row, drawn left of it on one line.
        col_titles: one per column, on one line above it, cut to the cell width.
        cell_shape: ``(cell_h, cell_w)``: every picture must have it.
        header: one line above everything.

    Returns:
        uint8 ``[h, w, 3]``, the same size for the same number of rows and columns.
    """
    cell_h, cell_w = cell_shape
    if any(len(row) != len(col_titles) for row in cells) or len(row_titles) != len(cells):
        raise ValueError(f"evolution_grid needs {len(cells)} row titles and {len(col_titles)} cells per row")
    title_w = max(_coverage(t, _TEXT_PX).shape[1] for t in row_titles) + 4
    columns = [stack([_blank(_line_box(_TEXT_PX)[0], title_w)]
                      + [np.pad(text_line(t, title_w, align="right"), ((0, cell_h - _line_box(_TEXT_PX)[0]), (0, 0), (0, 0)),
                                constant_values=WHITE) for t in row_titles], axis=0, gap=4)]
    for c, title in enumerate(col_titles):
        column = [text_line(title, cell_w, align="center")]
        for row in cells:
            cell = row[c]
            if cell is not None and cell.shape[:2] != (cell_h, cell_w):
                raise ValueError(f"evolution_grid cells must be {cell_h}x{cell_w}; got {cell.shape[0]}x{cell.shape[1]}")
            column.append(_blank(cell_h, cell_w, _EMPTY) if cell is None else cell)
        columns.append(stack(column, axis=0, gap=4))
    body = stack(columns, axis=1, gap=4)
    if header:
        body = stack([text_line(header, body.shape[1]), body], axis=0, gap=4)
    return np.pad(body, ((PAD_PX, PAD_PX), (PAD_PX, PAD_PX), (0, 0)), constant_values=WHITE)
