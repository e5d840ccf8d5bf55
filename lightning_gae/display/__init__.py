"""Rendering relevance as pictures: numpy ``uint8 [h, w, 3]`` arrays, ready for TensorBoard.

Two families. :mod:`~lightning_gae.display.figures` (:func:`titled_image`, :func:`grid`,
:func:`token_strip`, ...) draws matplotlib figures on their own Agg canvas, never through
``pyplot``. :mod:`~lightning_gae.display.panels` (:func:`colorize`, :func:`heatmap_panel`,
:func:`panel_row`, :func:`token_rows`, :func:`feature_table`, :func:`evolution_grid`) builds the
callback's pictures by colormap lookups and glyph bitmaps, without a figure per sample.
"""

from lightning_gae.display import figures, panels
from lightning_gae.display.figures import (
    feature_bars,
    figure_to_array,
    grid,
    normalize,
    overlay,
    side_by_side,
    titled_image,
    token_strip,
)
from lightning_gae.display.panels import (
    DIVERGING_CMAP,
    SEQUENTIAL_CMAP,
    Scale,
    colorbar,
    colorize,
    colormap_for,
    colormap_lut,
    enlarge,
    evolution_grid,
    feature_table,
    heatmap_panel,
    matrix_panel,
    panel_row,
    stack,
    text_line,
    token_rows,
    value_range,
)

# Every public name of the two modules, re-exported here.
__all__ = sorted({*figures.__all__, *panels.__all__})
