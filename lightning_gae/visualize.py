"""Rendering relevance as pictures: numpy ``uint8 [h, w, 3]`` arrays, ready for TensorBoard.

Everything draws on its own ``matplotlib.figure.Figure`` with an Agg canvas and never touches
``pyplot``, so rendering needs no display and leaves no global figure behind.
Images are placed pixel for pixel (``Figure.figimage``), so what a modality renders is what the
grid shows, without resampling.
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Sequence
from typing import TypeVar, Union

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle
from torch import Tensor

__all__ = [
    "feature_bars",
    "figure_to_array",
    "grid",
    "normalize",
    "overlay",
    "side_by_side",
    "titled_image",
    "token_strip",
]

ArrayLike = Union[np.ndarray, Tensor]
_A = TypeVar("_A", np.ndarray, Tensor)

_DPI = 100
_FONT_SIZE = 9
_LINE_PX = 13  # height of one line of text at _FONT_SIZE and _DPI, with leading
_CHAR_PX = 5.6  # average glyph width at _FONT_SIZE, for wrapping titles to a pixel width
_PAD_PX = 6
_WHITE = 255


def _numpy(x: ArrayLike) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)


def _uint8(image: ArrayLike) -> np.ndarray:
    """``[H, W, 3]`` uint8 from uint8 or from floats in [0, 1]."""
    array = _numpy(image)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"expected an RGB image [H, W, 3], got shape {array.shape}")
    if array.dtype == np.uint8:
        return array
    return (np.clip(array, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _wrap(text: str, width_px: float) -> str:
    return textwrap.fill(text, width=max(4, int(width_px / _CHAR_PX)), break_long_words=True) if text else ""


@functools.lru_cache(maxsize=1)
def _measuring_renderer() -> RendererAgg:
    return FigureCanvasAgg(Figure(dpi=_DPI)).get_renderer()


def _text_width(text: str, font: FontProperties) -> float:
    """Width in pixels of the widest line of ``text`` as Agg draws it."""
    renderer = _measuring_renderer()
    return max((renderer.get_text_width_height_descent(line, font, ismath=False)[0] for line in text.split("\n")), default=0.0)


def _lines(text: str) -> int:
    return text.count("\n") + 1 if text else 0


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


def overlay(image: ArrayLike, relevance: ArrayLike, cmap: str = "jet", alpha: float = 0.5) -> np.ndarray:
    """Blend a colour-mapped relevance map over an image.

    Args:
        image: ``[H, W, 3]`` floats in [0, 1].
        relevance: ``[H, W]``; min-max normalised here, so only its shape within the image matters.
        cmap: a ``matplotlib.colormaps`` name.
        alpha: weight of the heatmap (0 = the image alone, 1 = the heatmap alone).

    Returns:
        float ``[H, W, 3]`` in [0, 1].
    """
    picture = _numpy(image).astype(np.float64)
    heat = _numpy(relevance)
    if picture.ndim != 3 or picture.shape[-1] != 3 or heat.shape != picture.shape[:2]:
        raise ValueError(f"overlay needs an image [H, W, 3] and relevance [H, W]; got {picture.shape} and {heat.shape}")
    colours = matplotlib.colormaps[cmap](normalize(heat))[..., :3]
    return (1.0 - alpha) * picture + alpha * colours


def titled_image(image: ArrayLike, title: str = "", min_size: int = 128) -> np.ndarray:
    """An image with a title above it, upscaled (nearest neighbour) until its longer side is ``min_size``.

    Args:
        image: ``[H, W, 3]``, uint8 or floats in [0, 1].
        title: wrapped to the image's width.
        min_size: tiny inputs (8x8 digits) are enlarged by an integer factor so they are visible.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    pixels = _uint8(image)
    # An integer factor keeps every input pixel a crisp square.
    factor = max(1, math.ceil(min_size / max(pixels.shape[:2])))
    pixels = pixels.repeat(factor, axis=0).repeat(factor, axis=1)
    height, width = pixels.shape[:2]
    text = _wrap(title, width)
    top = _lines(text) * _LINE_PX + _PAD_PX if text else 0
    fig = _figure(width + 2 * _PAD_PX, height + top + _PAD_PX)
    fig.figimage(pixels, xo=_PAD_PX, yo=_PAD_PX, origin="upper")
    if text:
        fig.text(0.5, 1.0 - 3 / fig.bbox.height, text, ha="center", va="top", fontsize=_FONT_SIZE, parse_math=False)
    return figure_to_array(fig)


def token_strip(
    tokens: Sequence[str],
    relevance: ArrayLike,
    title: str = "",
    cmap: str = "Reds",
    muted: Sequence[bool] | None = None,
    max_width: int = 720,
) -> np.ndarray:
    """Tokens as text on backgrounds coloured by relevance, wrapped over several lines.

    Args:
        tokens: ``T`` strings, drawn in order.
        relevance: ``[T]``; min-max normalised over the tokens that are not muted.
        title: drawn above the strip.
        cmap: a ``matplotlib.colormaps`` name; a light low end keeps the text readable.
        muted: ``T`` flags; muted tokens (e.g. ``[CLS]``/``[SEP]``) are drawn grey and left out of the
            colour scale, so one special token cannot wash out the rest.
        max_width: width in pixels at which lines wrap.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    values = _numpy(relevance).astype(np.float64).reshape(-1)
    flags = np.zeros(len(tokens), dtype=bool) if muted is None else np.asarray(muted, dtype=bool)
    if not len(tokens) == values.shape[0] == flags.shape[0]:
        raise ValueError(
            f"token_strip got {len(tokens)} tokens, {values.shape[0]} relevance values and {flags.shape[0]} muted flags"
        )
    scaled = np.zeros_like(values)
    scaled[~flags] = normalize(values[~flags])
    colours = matplotlib.colormaps[cmap](scaled)[:, :3]

    font = FontProperties(size=_FONT_SIZE + 1)
    widths = [_text_width(t, font) + 2 * 3 for t in tokens]
    gap, row = 2, 20
    # Greedy line filling: a token moves to the next line when it would cross max_width.
    placed: list[tuple[float, int]] = []
    x, line, used = 0.0, 0, 0.0
    for w in widths:
        if x > 0 and x + w > max_width - 2 * _PAD_PX:
            x, line = 0.0, line + 1
        placed.append((x, line))
        x += w + gap
        used = max(used, x - gap)
    lines = line + 1 if tokens else 0

    text = _wrap(title, max_width)
    top = _lines(text) * _LINE_PX + _PAD_PX if text else 0
    width = int(math.ceil(max(used, _text_width(text, FontProperties(size=_FONT_SIZE))))) + 2 * _PAD_PX
    height = top + lines * (row + gap) + 2 * _PAD_PX
    fig = _figure(width, height)
    fig_w, fig_h = fig.bbox.width, fig.bbox.height
    if text:
        fig.text(_PAD_PX / fig_w, 1.0 - 3 / fig_h, text, ha="left", va="top", fontsize=_FONT_SIZE, parse_math=False)
    for token, w, (x, line), colour, mute in zip(tokens, widths, placed, colours, flags):
        left = _PAD_PX + x
        bottom = fig_h - top - _PAD_PX - (line + 1) * (row + gap) + gap
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
    color: str = "tab:red",
) -> np.ndarray:
    """A horizontal bar per feature, first feature on top, length = relevance (not rescaled).

    Args:
        names: ``F`` feature names, the bar labels.
        relevance: ``[F]``.
        title: drawn above the chart.
        values: optional ``[F]`` input values, shown as ``name = value`` in the labels.
        color: the bars' colour.

    Returns:
        uint8 ``[h, w, 3]``.
    """
    lengths = _numpy(relevance).astype(np.float64).reshape(-1)
    if lengths.shape[0] != len(names):
        raise ValueError(f"feature_bars got {len(names)} names and {lengths.shape[0]} relevance values")
    labels = list(names)
    if values is not None:
        shown = _numpy(values).reshape(-1)
        labels = [f"{n} = {v:.5g}" for n, v in zip(names, shown.tolist())]
    fig = Figure(figsize=(5.0, 0.8 + 0.25 * max(1, len(labels))), dpi=_DPI, layout="constrained", facecolor="white")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positions = np.arange(len(labels))
    ax.barh(positions, lengths, color=color, height=0.7)
    ax.set_yticks(positions, labels, fontsize=_FONT_SIZE)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.tick_params(axis="x", labelsize=_FONT_SIZE - 1)
    ax.set_xlabel("relevance", fontsize=_FONT_SIZE)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=_FONT_SIZE + 1, loc="left", parse_math=False)
    for label in ax.get_yticklabels():
        label.set_parse_math(False)
    return figure_to_array(fig)


def _pad_to(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Centre ``image`` on a white ``[height, width, 3]`` canvas."""
    canvas = np.full((height, width, 3), _WHITE, dtype=np.uint8)
    top, left = (height - image.shape[0]) // 2, (width - image.shape[1]) // 2
    canvas[top : top + image.shape[0], left : left + image.shape[1]] = image
    return canvas


def grid(cells: Sequence[Sequence[ArrayLike]], row_titles: Sequence[str], col_titles: Sequence[str]) -> np.ndarray:
    """A rows x columns grid of rendered images (e.g. samples x methods), titled on both axes.

    Args:
        cells: ``rows`` lists of ``cols`` images ``[h, w, 3]`` (uint8 or floats in [0, 1]); sizes may
            differ, each is centred in a cell as large as the largest.
        row_titles: ``rows`` strings, left of each row (empty strings leave no margin).
        col_titles: ``cols`` strings, above each column.

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
    images = [[_uint8(c) for c in row] for row in cells]
    cell_h = max(img.shape[0] for row in images for img in row)
    cell_w = max(img.shape[1] for row in images for img in row)

    row_texts = [_wrap(t, 20 * _CHAR_PX) for t in row_titles]
    col_texts = [_wrap(t, cell_w) for t in col_titles]
    widest = max(_text_width(t, FontProperties(size=_FONT_SIZE)) for t in row_texts)
    left = int(math.ceil(widest)) + 2 * _PAD_PX if widest else 0
    top = max(_lines(t) for t in col_texts) * _LINE_PX + _PAD_PX if any(col_texts) else 0
    gap = _PAD_PX
    width = left + cols * (cell_w + gap) + gap
    height = top + len(images) * (cell_h + gap) + gap
    fig = _figure(width, height)
    fig_w, fig_h = fig.bbox.width, fig.bbox.height
    for r, row in enumerate(images):
        y_top = top + gap + r * (cell_h + gap)
        for c, img in enumerate(row):
            x_left = left + gap + c * (cell_w + gap)
            fig.figimage(_pad_to(img, cell_h, cell_w), xo=x_left, yo=fig_h - y_top - cell_h, origin="upper")
        if row_texts[r]:
            fig.text((left - _PAD_PX) / fig_w, 1.0 - (y_top + cell_h / 2) / fig_h, row_texts[r],
                     ha="right", va="center", fontsize=_FONT_SIZE, parse_math=False)
    for c, text in enumerate(col_texts):
        if text:
            x_mid = left + gap + c * (cell_w + gap) + cell_w / 2
            fig.text(x_mid / fig_w, 1.0 - 3 / fig_h, text, ha="center", va="top", fontsize=_FONT_SIZE, parse_math=False)
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
