"""Matplotlib figures as pictures: titled images, grids, token strips and feature bars.

Each draws on its own ``matplotlib.figure.Figure`` with an Agg canvas and never touches ``pyplot``,
so rendering needs no display and leaves no global figure behind.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TypeVar

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle
from torch import Tensor

from lightning_gae.display._common import PAD_PX, WHITE, ArrayLike, as_numpy, as_uint8
from lightning_gae.display.panels import colormap_for, value_range

__all__ = ["feature_bars", "figure_to_array", "grid", "normalize", "overlay", "side_by_side", "titled_image", "token_strip"]

_A = TypeVar("_A", np.ndarray, Tensor)

_DPI = 100
_FONT_SIZE = 9
_TEXT_TOP_PX = 3  # blank pixels above the first line of a title
_ROW_TITLE_PX = 120  # row titles wrap at this width, so one long title cannot eat the grid


@functools.lru_cache(maxsize=1)
def _measuring_renderer() -> RendererAgg:
    return FigureCanvasAgg(Figure(dpi=_DPI)).get_renderer()


def _title_font() -> FontProperties:
    return FontProperties(size=_FONT_SIZE)


def _text_width(text: str, font: FontProperties) -> float:
    """Width in pixels of the widest line of ``text`` as Agg draws it."""
    renderer = _measuring_renderer()
    return max((renderer.get_text_width_height_descent(line, font, ismath=False)[0] for line in text.split("\n")), default=0.0)


@functools.lru_cache(maxsize=1)
def _line_metrics() -> tuple[int, int]:
    """``(pitch, ascent)`` in pixels of a title line: room for the tallest glyphs and brackets, plus leading."""
    renderer = _measuring_renderer()
    _, height, descent = renderer.get_text_width_height_descent("ÅÉgjpq|()[]", _title_font(), ismath=False)
    return math.ceil(height) + 2, math.ceil(height - descent)


def _wrap(text: str, width_px: float, font: FontProperties | None = None) -> list[str]:
    """``text`` as lines Agg draws at most ``width_px`` wide: broken at spaces, inside a word only if it is wider."""
    font = font or _title_font()
    lines: list[str] = []
    for paragraph in text.split("\n") if text else []:
        line = ""
        for word in paragraph.split(" "):
            candidate = f"{line} {word}" if line else word
            if line and _text_width(candidate, font) > width_px:
                lines.append(line)
                candidate = word
            while len(candidate) > 1 and _text_width(candidate, font) > width_px:
                cut = 1
                while _text_width(candidate[: cut + 1], font) <= width_px:
                    cut += 1
                lines.append(candidate[:cut])
                candidate = candidate[cut:]
            line = candidate
        lines.append(line)
    return lines


def _lines_height(lines: Sequence[str]) -> int:
    """Pixels that ``lines`` drawn by :func:`_draw_lines` occupy."""
    return len(lines) * _line_metrics()[0]


def _draw_lines(fig: Figure, lines: Sequence[str], x_px: float, top_px: float, ha: str) -> None:
    """Draw ``lines`` from ``top_px`` (pixels below the figure's top) down, one fixed pitch apart.

    Each line is its own text on its own baseline, so the block is exactly :func:`_lines_height`
    tall whatever matplotlib's line spacing is, and titles can be given room that they never leave.
    """
    pitch, ascent = _line_metrics()
    fig_w, fig_h = fig.bbox.width, fig.bbox.height
    for i, line in enumerate(lines):
        fig.text(x_px / fig_w, 1.0 - (top_px + i * pitch + ascent) / fig_h, line, ha=ha, va="baseline",
                 fontproperties=_title_font(), parse_math=False)


def _title_height(lines: Sequence[str]) -> int:
    """Height of a title block above a picture: margin, lines, and a gap before the picture (0 without lines)."""
    return 2 * _TEXT_TOP_PX + _lines_height(lines) if lines else 0


def _figure(width_px: int, height_px: int) -> Figure:
    fig = Figure(figsize=(width_px / _DPI, height_px / _DPI), dpi=_DPI, facecolor="white")
    FigureCanvasAgg(fig)
    return fig


def figure_to_array(fig: Figure) -> np.ndarray:
    """Draw ``fig`` and return its pixels as ``uint8 [h, w, 3]`` (alpha dropped).

    A figure without an Agg canvas gets one; the figure is not closed (it holds no global state).
    """
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def normalize(relevance: _A) -> _A:
    """Min-max scale ``relevance`` (any shape) to [0, 1]; a constant map (0/0) becomes all zeros.

    Returns the same kind as given: a float32 tensor for a tensor, a float ndarray otherwise.
    """
    if isinstance(relevance, Tensor):
        values = relevance.detach().float()
        if values.numel() == 0:
            return values.clone()
        low, span = values.min(), values.max() - values.min()
        return (values - low) / span if span > 0 else torch.zeros_like(values)
    values = np.asarray(relevance, dtype=np.float64)
    if values.size == 0:
        return values.copy()
    low, span = values.min(), values.max() - values.min()
    return (values - low) / span if span > 0 else np.zeros_like(values)


def overlay(image: ArrayLike, relevance: ArrayLike, cmap: str | None = None, alpha: float = 0.5,
            signed: bool | None = None) -> np.ndarray:
    """Blend a colour-mapped relevance map over an image.

    Args:
        image: ``[H, W, 3]`` floats in [0, 1].
        relevance: ``[H, W]``; its colours span :func:`~lightning_gae.display.value_range` (anchored at 0).
        cmap: a ``matplotlib.colormaps`` name; None: :func:`~lightning_gae.display.colormap_for` the range's sign.
        alpha: weight of the heatmap (0 = the image alone, 1 = the heatmap alone).
        signed: the method's ``signed`` fact (:func:`~lightning_gae.display.value_range`); None: signed when a value
            is below 0.

    Returns:
        float ``[H, W, 3]`` in [0, 1].
    """
    picture = as_numpy(image).astype(np.float64)
    heat = as_numpy(relevance)
    if picture.ndim != 3 or picture.shape[-1] != 3 or heat.shape != picture.shape[:2]:
        raise ValueError(f"overlay needs an image [H, W, 3] and relevance [H, W]; got {picture.shape} and {heat.shape}")
    vmin, vmax = value_range(heat, signed)
    colours = matplotlib.colormaps[cmap or colormap_for(vmin < 0)](np.clip((heat - vmin) / (vmax - vmin), 0.0, 1.0))
    return (1.0 - alpha) * picture + alpha * colours[..., :3]


def titled_image(image: ArrayLike, title: str = "", min_size: int = 128) -> np.ndarray:
    """An image with a title above it, upscaled (nearest neighbour) until its longer side is ``min_size``.

    Args:
        image: ``[H, W, 3]``, uint8 or floats in [0, 1].
        title: wrapped to the image's width.
        min_size: tiny inputs (8x8 digits) are enlarged by an integer factor so they are visible.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    pixels = as_uint8(image)
    # An integer factor keeps every input pixel a crisp square.
    factor = max(1, math.ceil(min_size / max(pixels.shape[:2])))
    pixels = pixels.repeat(factor, axis=0).repeat(factor, axis=1)
    height, width = pixels.shape[:2]
    lines = _wrap(title, width)
    top = _title_height(lines)
    fig = _figure(width + 2 * PAD_PX, height + top + PAD_PX)
    fig.figimage(pixels, xo=PAD_PX, yo=PAD_PX, origin="upper")
    _draw_lines(fig, lines, PAD_PX + width / 2, _TEXT_TOP_PX, ha="center")
    return figure_to_array(fig)


def token_strip(
    tokens: Sequence[str],
    relevance: ArrayLike,
    title: str = "",
    cmap: str | None = None,
    muted: Sequence[bool] | None = None,
    max_width: int = 720,
    vrange: tuple[float, float] | None = None,
) -> np.ndarray:
    """Tokens as text on backgrounds coloured by relevance, wrapped over several lines.

    Args:
        tokens: ``T`` strings, drawn in order.
        relevance: ``[T]``.
        title: drawn above the strip.
        cmap: a ``matplotlib.colormaps`` name; None: :func:`~lightning_gae.display.colormap_for` the range's sign.
        muted: ``T`` flags; muted tokens (e.g. ``[CLS]``/``[SEP]``) are drawn grey and left out of the
            colour scale, so one special token cannot wash out the rest.
        max_width: width in pixels at which lines wrap.
        vrange: ``(vmin, vmax)`` of the colours; None: :func:`~lightning_gae.display.value_range` of the tokens
            that are not muted (anchored at 0).

    Returns:
        uint8 ``[h, w, 3]``.
    """
    values = as_numpy(relevance).astype(np.float64).reshape(-1)
    flags = np.zeros(len(tokens), dtype=bool) if muted is None else np.asarray(muted, dtype=bool)
    if not len(tokens) == values.shape[0] == flags.shape[0]:
        raise ValueError(
            f"token_strip got {len(tokens)} tokens, {values.shape[0]} relevance values and {flags.shape[0]} muted flags"
        )
    vmin, vmax = vrange or value_range(values[~flags])
    scaled = np.clip((values - vmin) / (vmax - vmin), 0.0, 1.0)
    colours = matplotlib.colormaps[cmap or colormap_for(vmin < 0)](scaled)[:, :3]

    font = FontProperties(size=_FONT_SIZE + 1)
    widths = [_text_width(t, font) + 2 * 3 for t in tokens]
    gap, row = 2, 20
    # Greedy line filling: a token moves to the next line when it would cross max_width.
    placed: list[tuple[float, int]] = []
    x, line, used = 0.0, 0, 0.0
    for w in widths:
        if x > 0 and x + w > max_width - 2 * PAD_PX:
            x, line = 0.0, line + 1
        placed.append((x, line))
        x += w + gap
        used = max(used, x - gap)
    lines = line + 1 if tokens else 0

    title_lines = _wrap(title, max_width - 2 * PAD_PX)
    top = _title_height(title_lines)
    width = int(math.ceil(max(used, _text_width("\n".join(title_lines), _title_font())))) + 2 * PAD_PX
    height = top + lines * (row + gap) + 2 * PAD_PX
    fig = _figure(width, height)
    fig_w, fig_h = fig.bbox.width, fig.bbox.height
    _draw_lines(fig, title_lines, PAD_PX, _TEXT_TOP_PX, ha="left")
    for token, w, (x, line), colour, mute in zip(tokens, widths, placed, colours, flags):
        left = PAD_PX + x
        bottom = fig_h - top - PAD_PX - (line + 1) * (row + gap) + gap
        face = (0.88, 0.88, 0.88) if mute else tuple(colour)
        # Dark backgrounds get white text, by perceived luminance.
        ink = "#555555" if mute else ("white" if np.dot(colour, (0.299, 0.587, 0.114)) < 0.5 else "black")
        box = Rectangle((left / fig_w, bottom / fig_h), w / fig_w, row / fig_h, transform=fig.transFigure, facecolor=face, edgecolor="none")
        fig.add_artist(box)
        fig.text((left + w / 2) / fig_w, (bottom + row / 2) / fig_h, token, ha="center", va="center_baseline",
                 fontproperties=font, color=ink, parse_math=False)
    return figure_to_array(fig)


def feature_bars(
    names: Sequence[str],
    relevance: ArrayLike,
    title: str = "",
    values: ArrayLike | None = None,
    color: str | None = None,
    vrange: tuple[float, float] | None = None,
    cmap: str | None = None,
) -> np.ndarray:
    """A horizontal bar per feature, first feature on top, length = relevance (not rescaled).

    Args:
        names: ``F`` feature names, the bar labels.
        relevance: ``[F]``.
        title: drawn above the chart.
        values: optional ``[F]`` input values, shown as ``name = value`` in the labels.
        color: one colour for every bar; None: each bar the colour of its relevance on ``cmap`` over ``vrange``.
        vrange: ``(vmin, vmax)``, the relevance axis and the colours' range; None:
            :func:`~lightning_gae.display.value_range` of ``relevance`` (anchored at 0, symmetric when signed).
        cmap: a ``matplotlib.colormaps`` name; None: :func:`~lightning_gae.display.colormap_for` the range's sign.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    lengths = as_numpy(relevance).astype(np.float64).reshape(-1)
    if lengths.shape[0] != len(names):
        raise ValueError(f"feature_bars got {len(names)} names and {lengths.shape[0]} relevance values")
    labels = list(names)
    if values is not None:
        shown = as_numpy(values).reshape(-1)
        labels = [f"{n} = {v:.5g}" for n, v in zip(names, shown.tolist())]
    fig = Figure(figsize=(5.0, 0.8 + 0.25 * max(1, len(labels))), dpi=_DPI, layout="constrained", facecolor="white")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positions = np.arange(len(labels))
    vmin, vmax = vrange or value_range(lengths)
    colours = color or matplotlib.colormaps[cmap or colormap_for(vmin < 0)](
        np.clip((lengths - vmin) / (vmax - vmin), 0.0, 1.0))
    # A thin dark edge keeps the light end of a colormap visible on the white page.
    ax.barh(positions, lengths, color=colours, height=0.7, edgecolor=(0.3, 0.3, 0.3), linewidth=0.5)
    ax.set_xlim(vmin, vmax)
    ax.set_yticks(positions, labels, fontsize=_FONT_SIZE)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.tick_params(axis="x", labelsize=_FONT_SIZE - 1)
    ax.set_xlabel("relevance", fontsize=_FONT_SIZE)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        # Constrained layout makes room above the axes for every line, but none beside the figure: wrap to its width.
        title_font = FontProperties(size=_FONT_SIZE + 1)
        fig.suptitle("\n".join(_wrap(title, fig.bbox.width - 2 * PAD_PX, title_font)), x=PAD_PX / fig.bbox.width,
                     ha="left", fontproperties=title_font, parse_math=False)
    for label in ax.get_yticklabels():
        label.set_parse_math(False)
    return figure_to_array(fig)


def _pad_to(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` on a white ``[height, width, 3]`` canvas, centred across and at the bottom.

    Bottom-aligned, the pictures of a row line up even when their titles wrap to different heights.
    """
    canvas = np.full((height, width, 3), WHITE, dtype=np.uint8)
    top, left = height - image.shape[0], (width - image.shape[1]) // 2
    canvas[top : top + image.shape[0], left : left + image.shape[1]] = image
    return canvas


def grid(cells: Sequence[Sequence[ArrayLike]], row_titles: Sequence[str], col_titles: Sequence[str]) -> np.ndarray:
    """A rows x columns grid of rendered images (e.g. samples x methods), titled on both axes.

    Args:
        cells: ``rows`` lists of ``cols`` images ``[h, w, 3]`` (uint8 or floats in [0, 1]); sizes may
            differ, each is centred across, at the bottom of a cell as large as the largest.
        row_titles: ``rows`` strings, left of each row, wrapped at 120 px; the margin fits the widest
            (empty strings leave no margin).
        col_titles: ``cols`` strings, above each column, wrapped to the cell width.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    if not cells or not cells[0]:
        raise ValueError("grid needs at least one row and one column")
    cols = len(cells[0])
    if any(len(row) != cols for row in cells) or len(row_titles) != len(cells) or len(col_titles) != cols:
        raise ValueError(
            f"grid needs {len(cells)} row titles, {cols} column titles and {cols} cells in every row; "
            f"got {len(row_titles)} row titles, {len(col_titles)} column titles and rows of {[len(r) for r in cells]}"
        )
    images = [[as_uint8(c) for c in row] for row in cells]
    cell_h = max(img.shape[0] for row in images for img in row)
    cell_w = max(img.shape[1] for row in images for img in row)

    row_lines = [_wrap(t, _ROW_TITLE_PX) for t in row_titles]
    col_lines = [_wrap(t, cell_w) for t in col_titles]
    widest = max(_text_width("\n".join(lines), _title_font()) for lines in row_lines)
    left = int(math.ceil(widest)) + 2 * PAD_PX if widest else 0
    top = max(_title_height(lines) for lines in col_lines)
    gap = PAD_PX
    # A row as tall as its wrapped title, so a title never reaches into the next row.
    row_h = [max(cell_h, _lines_height(lines)) for lines in row_lines]
    width = left + cols * (cell_w + gap) + gap
    height = top + sum(row_h) + (len(images) + 1) * gap
    fig = _figure(width, height)
    fig_h = fig.bbox.height
    y_top = top + gap
    for row, lines, h in zip(images, row_lines, row_h):
        for c, img in enumerate(row):
            x_left = left + gap + c * (cell_w + gap)
            fig.figimage(_pad_to(img, h, cell_w), xo=x_left, yo=fig_h - y_top - h, origin="upper")
        _draw_lines(fig, lines, left - PAD_PX, y_top + (h - _lines_height(lines)) / 2, ha="right")
        y_top += h + gap
    for c, lines in enumerate(col_lines):
        _draw_lines(fig, lines, left + gap + c * (cell_w + gap) + cell_w / 2, _TEXT_TOP_PX, ha="center")
    return figure_to_array(fig)


def side_by_side(images: Sequence[ArrayLike], titles: Sequence[str]) -> np.ndarray:
    """A horizontal strip of images with a title above each, e.g. one explanation over training steps.

    Args:
        images: ``[h, w, 3]`` each, uint8 or floats in [0, 1].
        titles: one per image.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    return grid([list(images)], [""], titles)
