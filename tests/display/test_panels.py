"""lightning_gae.display.panels: the callback's pictures by colormap lookups and glyph bitmaps, uint8 RGB arrays."""

import matplotlib
import numpy as np
import pytest
import torch

from lightning_gae import display
from tests.helpers.pictures import colour_box, one_colour


@pytest.mark.parametrize("cmap", [display.SEQUENTIAL_CMAP, display.DIVERGING_CMAP, "viridis"])
def test_colorize_is_a_lookup_into_the_matplotlib_colormap(cmap):
    values = np.array([[-3.0, -1.0, 0.0], [0.5, 1.0, 7.0]])
    out = display.colorize(values, -1.0, 1.0, cmap)
    assert out.dtype == np.uint8 and out.shape == (2, 3, 3)
    # Dense reference: matplotlib's own colormap at the same 256 levels, out-of-range values clipped.
    levels = np.rint((np.clip(values, -1.0, 1.0) + 1.0) / 2.0 * 255.0) / 255.0
    expected = np.round(matplotlib.colormaps[cmap](levels)[..., :3] * 255.0).astype(np.uint8)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(display.colorize(np.array([np.nan]), 0.0, 1.0, cmap)[0], display.colormap_lut(cmap)[0])
    with pytest.raises(ValueError, match="vmax > vmin"):
        display.colorize(values, 1.0, 1.0)
    with pytest.raises(ValueError, match="not a matplotlib colormap"):
        display.colorize(values, 0.0, 1.0, "no-such-map")


def test_value_range_starts_at_zero_and_centres_signed_maps():
    assert display.value_range(np.array([0.2, 0.5, 0.1])) == (0.0, 0.5)
    # Not min-max: a flat map stays flat instead of being stretched over the whole scale.
    assert display.value_range(np.full(4, 0.25)) == (0.0, 0.25)
    assert display.value_range(torch.tensor([-0.3, 0.1, 0.2])) == pytest.approx((-0.3, 0.3))
    assert display.value_range(np.zeros(3)) == (0.0, 1.0)
    assert display.value_range(np.array([np.nan, 2.0])) == (0.0, 2.0)


def test_heatmap_panel_uses_a_diverging_colormap_for_signed_maps_and_is_256_px():
    image = np.zeros((8, 8, 3))
    signed = np.array([[-1.0, 0.0], [0.0, 1.0]])
    panel = display.heatmap_panel(image, signed, size=256, alpha=1.0)
    assert panel.shape == (256, 256, 3)
    lut = display.colormap_lut(display.DIVERGING_CMAP)
    np.testing.assert_array_equal(panel[0, 0], lut[0])
    np.testing.assert_array_equal(panel[-1, -1], lut[255])
    # Zero sits at the diverging map's centre: the middle of the anti-diagonal is the neutral colour.
    np.testing.assert_array_equal(panel[0, -1], lut[128])
    positive = display.heatmap_panel(image, np.array([[0.0, 1.0]]), size=256, alpha=1.0)
    np.testing.assert_array_equal(positive[0, 0], display.colormap_lut(display.SEQUENTIAL_CMAP)[0])
    # alpha blends over the image in grey: a white image lifts every colour.
    lifted = display.heatmap_panel(np.ones((8, 8, 3)), signed, alpha=0.5)
    assert (lifted.astype(int) >= panel.astype(int) // 2).all() and lifted.mean() > panel.mean()
    wide = display.heatmap_panel(np.zeros((8, 16, 3)), np.zeros((4, 8)), size=256)
    assert wide.shape == (128, 256, 3)


def test_heatmap_panel_draws_each_patch_as_its_own_value_and_encodes_small():
    import io

    from PIL import Image

    image = np.zeros((8, 8, 3))
    grid = np.random.default_rng(0).random((4, 4))
    panel = display.heatmap_panel(image, grid, size=256, vrange=(0.0, 1.0), alpha=1.0)
    lut = display.colormap_lut(display.SEQUENTIAL_CMAP)
    for r in range(4):
        for c in range(4):
            block = panel[64 * r : 64 * (r + 1), 64 * c : 64 * (c + 1)]
            # One colour per patch: the value the metrics rank, not a blend with the neighbours.
            np.testing.assert_array_equal(block, np.broadcast_to(lut[int(np.rint(grid[r, c] * 255))], block.shape))
    smooth = display.heatmap_panel(image, grid, size=256, vrange=(0.0, 1.0), alpha=1.0, interpolation="bilinear")
    assert len(np.unique(smooth.reshape(-1, 3), axis=0)) > 16

    def png_bytes(picture):
        buffer = io.BytesIO()
        Image.fromarray(picture).save(buffer, format="PNG", compress_level=1)
        return buffer.tell()

    assert png_bytes(panel) * 5 < png_bytes(smooth)
    with pytest.raises(ValueError, match="interpolation='cubic'"):
        display.heatmap_panel(image, grid, interpolation="cubic")


def test_text_line_is_one_line_of_constant_height_cut_to_its_width():
    short, tall = display.text_line("a"), display.text_line("Ågj|()")
    assert short.shape[0] == tall.shape[0] and (tall < 128).any()
    long_text = "gae: label 5 | pred 5 | target 5 (p=0.99) " * 4
    cut = display.text_line(long_text, width=200)
    assert cut.shape == (short.shape[0], 200, 3)
    assert not np.array_equal(cut, display.text_line(long_text)[:, :200]), "cut between glyphs, with an ellipsis"
    centred = display.text_line("x", width=100, align="center")
    ink = np.nonzero((centred < 128).any(-1).any(0))[0]
    assert 40 < ink.mean() < 60


def test_panel_row_titles_stay_on_one_line_whatever_their_length():
    panel, other = one_colour((0, 0, 255), 64, 64), one_colour((255, 0, 0), 64, 64)
    short = display.panel_row([("a", panel), ("b", other)], "header")
    long = display.panel_row([("a very long method name " * 5, panel), ("b", other)], "header " * 50)
    assert short.shape == long.shape
    (top, left, height, width), solid = colour_box(long, (0, 0, 255))
    assert (height, width) == (64, 64) and solid


def test_evolution_grid_keeps_its_size_as_steps_fill_it():
    cell = one_colour((255, 0, 0), 32, 32)
    empty = display.evolution_grid([[None, None, None]], ["gae"], ["", "", ""], (32, 32))
    filled = display.evolution_grid([[cell, cell, cell]], ["gae"], ["step 1", "step 2", "step 3"], (32, 32))
    assert empty.shape == filled.shape
    with pytest.raises(ValueError, match="32x32"):
        display.evolution_grid([[one_colour((0, 0, 0), 8, 8), None, None]], ["gae"], ["", "", ""], (32, 32))


def test_token_rows_wrap_long_text_downwards_at_a_constant_font_size():
    tokens = ["[CLS]", "the", "cat", "sat", "[SEP]"]
    row = [("gae", np.array([0.0, 0.2, 0.5, 1.0, 0.0]), (0.0, 1.0))]
    short = display.token_rows(tokens, row, muted=[True, False, False, False, True])
    long = display.token_rows(tokens * 40, [("gae", np.linspace(0, 1, 200), (0.0, 1.0))], muted=[False] * 200)
    assert short.shape[1] == long.shape[1] and long.shape[0] > 3 * short.shape[0]
    brightest = display.colormap_lut(display.SEQUENTIAL_CMAP)[255]
    assert (short == brightest).all(-1).sum() > 100, "the most relevant token's box has the top colour"
    grey = (short == 224).all(-1).sum()
    assert grey > 100, "special tokens are drawn on grey"
    with pytest.raises(ValueError, match="5 tokens and 4 relevance"):
        display.token_rows(tokens, [("gae", np.zeros(4), (0.0, 1.0))])


def test_feature_table_has_a_row_per_feature_and_a_coloured_cell_per_method():
    names = [f"f{i}" for i in range(6)]
    one = display.feature_table(names[:3], [("gae", [0.0, 0.5, 1.0], (0.0, 1.0))])
    two = display.feature_table(names, [("gae", np.linspace(0, 1, 6), (0.0, 1.0)), ("ig", np.linspace(-1, 1, 6), (-1.0, 1.0))],
                                  values=np.arange(6.0))
    assert two.shape[0] > one.shape[0] and two.shape[1] > one.shape[1]
    top = display.colormap_lut(display.SEQUENTIAL_CMAP)[255]
    assert (one == top).all(-1).sum() > 200
    with pytest.raises(ValueError, match="3 names and 2"):
        display.feature_table(names[:3], [("gae", [0.0, 1.0], (0.0, 1.0))])


def test_a_methods_sign_not_its_map_decides_the_range_and_the_colormap():
    from lightning_gae.display import colormap_for, value_range

    positive, mixed = np.array([0.0, 0.5, 2.0]), np.array([-1.0, 0.5, 2.0])
    # Signed: symmetric around 0 (white in the middle of RdBu_r) even for a map with no negative value.
    assert value_range(positive, signed=True) == (-2.0, 2.0) and value_range(mixed, signed=True) == (-2.0, 2.0)
    # Non-negative: from 0, even where rounding left a value below it.
    assert value_range(np.array([-1e-7, 0.5, 2.0]), signed=False) == (0.0, 2.0)
    assert value_range(np.zeros(3), signed=True) == (-1.0, 1.0) and value_range(np.zeros(3), signed=False) == (0.0, 1.0)
    assert (colormap_for(True), colormap_for(False)) == ("RdBu_r", "inferno")
