"""display.py: pure rendering helpers returning uint8 RGB arrays."""

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from lightning_gae import display


def _is_rgb_picture(array):
    return isinstance(array, np.ndarray) and array.dtype == np.uint8 and array.ndim == 3 and array.shape[-1] == 3


def _picture(h=20, w=30, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_figure_to_array_has_the_figure_pixel_size():
    fig = Figure(figsize=(2.0, 1.5), dpi=50)
    fig.patch.set_facecolor((1.0, 0.0, 0.0))
    array = display.figure_to_array(fig)
    assert _is_rgb_picture(array) and array.shape == (75, 100, 3)
    assert (array == [255, 0, 0]).all()


@pytest.mark.parametrize("flat", [torch.zeros(3, 4), torch.full((3, 4), 2.5), np.ones(5)])
def test_normalize_maps_a_constant_to_zero_without_nan(flat):
    out = display.normalize(flat)
    assert type(out) is type(flat)
    values = np.asarray(out)
    assert not np.isnan(values).any() and (values == 0).all()


def test_normalize_spans_zero_to_one_keeping_order():
    out = display.normalize(torch.tensor([2.0, -1.0, 5.0, 0.5]))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([0.5, 0.0, 1.0, 0.25]))


def test_overlay_blends_image_and_colormap_with_alpha():
    image = np.full((4, 4, 3), 0.2)
    relevance = np.arange(16.0).reshape(4, 4)
    np.testing.assert_allclose(display.overlay(image, relevance, alpha=0.0), image)
    heat = matplotlib.colormaps["jet"](relevance / 15.0)[..., :3]
    np.testing.assert_allclose(display.overlay(image, relevance, alpha=1.0), heat)
    np.testing.assert_allclose(display.overlay(image, relevance, alpha=0.25), 0.75 * image + 0.25 * heat)
    with pytest.raises(ValueError, match=r"relevance \[H, W\]"):
        display.overlay(image, np.zeros((3, 4)))


def test_titled_image_enlarges_tiny_images_with_crisp_pixels():
    tiny = np.zeros((8, 8, 3))
    tiny[..., 2] = 1.0
    tiny[3, 5] = (1.0, 0.0, 0.0)
    out = display.titled_image(tiny, "a title")
    assert _is_rgb_picture(out) and min(out.shape[:2]) >= 128
    # The one red input pixel becomes one solid 16x16 block, where it was among the blue ones.
    rows, cols = np.nonzero((out == [255, 0, 0]).all(-1))
    assert len(rows) == 256 and np.ptp(rows) == 15 and np.ptp(cols) == 15
    blue_rows, blue_cols = np.nonzero((out == [0, 0, 255]).all(-1))
    assert len(blue_rows) == 63 * 256
    assert rows.min() - blue_rows.min() == 3 * 16 and cols.min() - blue_cols.min() == 5 * 16
    untitled = display.titled_image(tiny)
    assert untitled.shape[0] < out.shape[0]


def test_token_strip_colours_by_relevance_and_wraps_long_text():
    tokens = ["the", "cat", "sat", "on", "the", "mat"]
    low = display.token_strip(tokens, np.array([1.0, 0, 0, 0, 0, 0]), "one")
    high = display.token_strip(tokens, np.array([0, 0, 0, 0, 0, 1.0]), "one")
    assert _is_rgb_picture(low) and low.shape == high.shape and not np.array_equal(low, high)
    assert len(np.unique(low.reshape(-1, 3), axis=0)) > 5
    long = display.token_strip(tokens * 30, np.linspace(0, 1, 180), "one")
    assert long.shape[0] > 3 * low.shape[0] and long.shape[1] <= 720
    with pytest.raises(ValueError, match="6 tokens, 5 relevance"):
        display.token_strip(tokens, np.zeros(5))


def test_muted_tokens_are_grey_and_outside_the_colour_scale():
    tokens = ["[CLS]", "good", "bad", "[SEP]"]
    relevance = np.array([0.0, 0.2, 0.1, 50.0])
    muted = display.token_strip(tokens, relevance, muted=[True, False, False, True])
    plain = display.token_strip(tokens, relevance)
    # "good" is the most relevant non-muted token, so it gets the darkest red of the colormap.
    darkest = np.round(np.array(matplotlib.colormaps["Reds"](1.0)[:3]) * 255).astype(int)
    has_darkest = lambda img: (np.abs(img.astype(int) - darkest).max(-1) <= 1).sum()  # noqa: E731
    assert has_darkest(muted) > 50 and has_darkest(plain) > 50
    grey = lambda img: (np.abs(img.astype(int) - 224).max(-1) <= 1).sum()  # noqa: E731
    assert grey(muted) > 100 and grey(plain) == 0


def test_feature_bars_length_follows_relevance():
    red = np.round(np.array(matplotlib.colors.to_rgb("tab:red")) * 255).astype(int)
    count = lambda img: (np.abs(img.astype(int) - red).max(-1) <= 1).sum()  # noqa: E731
    one = display.feature_bars(["a", "b", "c"], [1.0, 0.0, 0.0], "t")
    two = display.feature_bars(["a", "b", "c"], [1.0, 1.0, 0.0], "t")
    half = display.feature_bars(["a", "b", "c"], [1.0, 0.5, 0.0], "t")
    assert _is_rgb_picture(one) and one.shape == two.shape
    assert 1.8 < count(two) / count(one) < 2.2
    assert 1.3 < count(half) / count(one) < 1.7
    taller = display.feature_bars([f"f{i}" for i in range(12)], np.ones(12), "t", values=np.arange(12.0))
    assert taller.shape[0] > one.shape[0]
    with pytest.raises(ValueError, match="3 names and 2"):
        display.feature_bars(["a", "b", "c"], [1.0, 0.0])


def test_grid_grows_with_rows_and_columns_and_pads_cells():
    a, b = _picture(20, 30), _picture(40, 10, seed=1)
    one = display.grid([[a]], ["r0"], ["c0"])
    wide = display.grid([[a, a, a]], ["r0"], ["c0", "c1", "c2"])
    tall = display.grid([[a], [a], [a]], ["r0", "r1", "r2"], ["c0"])
    mixed = display.grid([[a, b]], ["r0"], ["c0", "c1"])
    assert all(_is_rgb_picture(p) for p in (one, wide, tall, mixed))
    assert wide.shape[1] > 2 * one.shape[1] - 40 and wide.shape[0] == one.shape[0]
    assert tall.shape[0] >= one.shape[0] + 2 * 20 and tall.shape[1] == one.shape[1]
    # Cells share the largest size: 40 px tall, 30 px wide.
    assert mixed.shape[0] >= 40 and mixed.shape[1] >= 60


def test_grid_places_cells_pixel_for_pixel():
    cell = _picture(12, 16)
    out = display.grid([[cell]], [""], [""])
    hits = [(r, c) for r in range(out.shape[0] - 11) for c in range(out.shape[1] - 15)
            if np.array_equal(out[r : r + 12, c : c + 16], cell)]
    assert len(hits) == 1


def test_grid_titles_must_match_the_cells():
    a = _picture()
    with pytest.raises(ValueError, match="row titles"):
        display.grid([[a, a], [a]], ["r0", "r1"], ["c0", "c1"])
    with pytest.raises(ValueError, match="row titles"):
        display.grid([[a]], ["r0", "r1"], ["c0"])


def test_side_by_side_is_a_titled_strip():
    frames = [_picture(seed=s) for s in range(4)]
    strip = display.side_by_side(frames, [f"step {s}" for s in range(4)])
    single = display.side_by_side(frames[:1], ["step 0"])
    assert _is_rgb_picture(strip) and strip.shape[0] == single.shape[0] and strip.shape[1] > 3 * single.shape[1] - 40
    for frame in frames:
        rows = [r for r in range(strip.shape[0] - 19) for c in range(strip.shape[1] - 29)
                if np.array_equal(strip[r : r + 20, c : c + 30], frame)]
        assert len(rows) == 1


LONG_TITLE = "rollout: label 3 | pred 3 | target 3 (p=0.98)"


def _solid(colour, h=8, w=8):
    return np.broadcast_to(np.array(colour, dtype=np.uint8), (h, w, 3)).copy()


def _block(out, colour):
    """Bounding box (top, left, height, width) of ``colour`` in ``out``, and whether it is filled solid."""
    rows, cols = np.nonzero((out == colour).all(-1))
    top, left = rows.min(), cols.min()
    height, width = np.ptp(rows) + 1, np.ptp(cols) + 1
    return (top, left, height, width), len(rows) == height * width


@pytest.mark.parametrize("title", ["short", LONG_TITLE, "x" * 60, LONG_TITLE + " | " + LONG_TITLE])
def test_titles_wrap_above_the_picture_and_never_cover_it(title):
    out = display.titled_image(_solid((0, 0, 255)), title)
    (top, left, height, width), solid = _block(out, (0, 0, 255))
    assert (height, width) == (128, 128) and solid, "title text was drawn over the picture"
    ink = (out < 160).any(-1)
    assert ink[:top].any(), "the title is missing"
    assert not ink[:, 0].any() and not ink[:, -1].any() and not ink[0].any(), "the title is clipped at the border"


def test_grid_row_titles_are_whole_and_cell_titles_stay_out_of_the_cells():
    colours = [[(0, 0, 255), (255, 0, 0)], [(0, 160, 0), (255, 0, 255)]]
    cells = [[display.titled_image(_solid(c), LONG_TITLE) for c in row] for row in colours]
    rows = ["sample 336", "a row title long enough to wrap over three lines"]
    out = display.grid(cells, rows, ["input", LONG_TITLE])
    boxes = []
    for row in colours:
        for colour in row:
            box, solid = _block(out, colour)
            assert box[2:] == (128, 128) and solid, f"text was drawn over the {colour} picture"
            boxes.append(box)
    first_cell_left = min(left for _, left, _, _ in boxes)
    ink = (out < 160).any(-1)
    title_ink = np.nonzero(ink[:, :first_cell_left].any(0))[0]
    # Row titles: inked, inside the image, and left of the first column without touching it.
    assert len(title_ink) and title_ink.min() > 0 and title_ink.max() < first_cell_left - 2
    narrow = display.grid(cells, ["s", "s"], ["input", LONG_TITLE])
    assert out.shape[1] - narrow.shape[1] > 40, "the row-title margin must grow with the titles"


# --- panels: colormap lookups and glyph bitmaps --------------------------------------------------


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
    panel, other = _solid((0, 0, 255), 64, 64), _solid((255, 0, 0), 64, 64)
    short = display.panel_row([("a", panel), ("b", other)], "header")
    long = display.panel_row([("a very long method name " * 5, panel), ("b", other)], "header " * 50)
    assert short.shape == long.shape
    (top, left, height, width), solid = _block(long, (0, 0, 255))
    assert (height, width) == (64, 64) and solid


def test_evolution_grid_keeps_its_size_as_steps_fill_it():
    cell = _solid((255, 0, 0), 32, 32)
    empty = display.evolution_grid([[None, None, None]], ["gae"], ["", "", ""], (32, 32))
    filled = display.evolution_grid([[cell, cell, cell]], ["gae"], ["step 1", "step 2", "step 3"], (32, 32))
    assert empty.shape == filled.shape
    with pytest.raises(ValueError, match="32x32"):
        display.evolution_grid([[_solid((0, 0, 0), 8, 8), None, None]], ["gae"], ["", "", ""], (32, 32))


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
