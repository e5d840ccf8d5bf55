"""lightning_gae.display.figures: pure rendering helpers returning uint8 RGB arrays."""

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from lightning_gae import display
from tests.helpers.pictures import colour_box, one_colour


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
    relevance = np.arange(1.0, 17.0).reshape(4, 4)
    np.testing.assert_allclose(display.overlay(image, relevance, alpha=0.0), image)
    # From 0, not min-max: the smallest value (1) is not the colormap's first colour.
    heat = matplotlib.colormaps[display.SEQUENTIAL_CMAP](relevance / 16.0)[..., :3]
    np.testing.assert_allclose(display.overlay(image, relevance, alpha=1.0), heat)
    np.testing.assert_allclose(display.overlay(image, relevance, alpha=0.25), 0.75 * image + 0.25 * heat)
    with pytest.raises(ValueError, match=r"relevance \[H, W\]"):
        display.overlay(image, np.zeros((3, 4)))


def test_overlay_draws_a_signed_method_white_at_zero_whatever_the_sample():
    image = np.zeros((1, 3, 3))
    positive = display.overlay(image, np.array([[0.0, 0.5, 1.0]]), alpha=1.0, signed=True)
    mixed = display.overlay(image, np.array([[0.0, 0.5, -1.0]]), alpha=1.0, signed=True)
    diverging = matplotlib.colormaps[display.DIVERGING_CMAP]
    np.testing.assert_allclose(positive[0], diverging(np.array([0.5, 0.75, 1.0]))[:, :3])
    np.testing.assert_allclose(mixed[0], diverging(np.array([0.5, 0.75, 0.0]))[:, :3])
    assert (positive[0, 0] > 0.95).all()  # 0 is white in both
    sequential = display.overlay(image, np.array([[0.0, 0.5, 1.0]]), alpha=1.0, signed=False)
    np.testing.assert_allclose(sequential[0], matplotlib.colormaps[display.SEQUENTIAL_CMAP]([0.0, 0.5, 1.0])[:, :3])


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


def _pixels_of(picture, cmap, at):
    colour = np.round(np.array(matplotlib.colormaps[cmap](at)[:3]) * 255).astype(int)
    return int((np.abs(picture.astype(int) - colour).max(-1) <= 1).sum())


def test_token_strip_colours_from_zero_on_the_colormap_of_the_range():
    # Min-max would give the least relevant token the colormap's first colour; from 0 it is half way.
    strip = display.token_strip(["half", "full"], np.array([0.5, 1.0]))
    assert _pixels_of(strip, display.SEQUENTIAL_CMAP, 0.5) > 50 and _pixels_of(strip, display.SEQUENTIAL_CMAP, 0.0) == 0
    signed = display.token_strip(["half", "full"], np.array([0.5, 1.0]), vrange=(-1.0, 1.0))
    assert _pixels_of(signed, display.DIVERGING_CMAP, 0.75) > 50 and _pixels_of(signed, display.DIVERGING_CMAP, 1.0) > 50


def test_feature_bars_take_their_values_colour_on_the_colormap_of_the_range():
    signed = display.feature_bars(["a", "b", "c"], [1.0, -0.5, 0.0], "t")
    assert _pixels_of(signed, display.DIVERGING_CMAP, 1.0) > 100 and _pixels_of(signed, display.DIVERGING_CMAP, 0.25) > 50
    positive = display.feature_bars(["a", "b", "c"], [1.0, 0.5, 0.0], "t")
    assert _pixels_of(positive, display.SEQUENTIAL_CMAP, 0.5) > 50
    assert _pixels_of(positive, display.DIVERGING_CMAP, 1.0) == 0
    # A signed method's range, given, keeps its diverging colours on a map without a negative value.
    kept = display.feature_bars(["a", "b", "c"], [1.0, 0.5, 0.0], "t", vrange=(-1.0, 1.0))
    assert _pixels_of(kept, display.DIVERGING_CMAP, 0.75) > 50


def test_muted_tokens_are_grey_and_outside_the_colour_scale():
    tokens = ["[CLS]", "good", "bad", "[SEP]"]
    relevance = np.array([0.0, 0.2, 0.1, 50.0])
    muted = display.token_strip(tokens, relevance, muted=[True, False, False, True])
    plain = display.token_strip(tokens, relevance)
    # "good" is the most relevant non-muted token, so it gets the last colour of the colormap.
    darkest = np.round(np.array(matplotlib.colormaps[display.SEQUENTIAL_CMAP](1.0)[:3]) * 255).astype(int)
    has_darkest = lambda img: (np.abs(img.astype(int) - darkest).max(-1) <= 1).sum()  # noqa: E731
    assert has_darkest(muted) > 50 and has_darkest(plain) > 50
    grey = lambda img: (np.abs(img.astype(int) - 224).max(-1) <= 1).sum()  # noqa: E731
    # (the plain strip's few are the anti-aliased edges of white letters on dark boxes)
    assert grey(muted) > 100 and grey(plain) < grey(muted) / 20


def test_feature_bars_length_follows_relevance():
    red = np.round(np.array(matplotlib.colors.to_rgb("tab:red")) * 255).astype(int)
    count = lambda img: (np.abs(img.astype(int) - red).max(-1) <= 1).sum()  # noqa: E731
    one = display.feature_bars(["a", "b", "c"], [1.0, 0.0, 0.0], "t", color="tab:red")
    two = display.feature_bars(["a", "b", "c"], [1.0, 1.0, 0.0], "t", color="tab:red")
    half = display.feature_bars(["a", "b", "c"], [1.0, 0.5, 0.0], "t", color="tab:red")
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


@pytest.mark.parametrize("title", ["short", LONG_TITLE, "x" * 60, LONG_TITLE + " | " + LONG_TITLE])
def test_titles_wrap_above_the_picture_and_never_cover_it(title):
    out = display.titled_image(one_colour((0, 0, 255)), title)
    (top, left, height, width), solid = colour_box(out, (0, 0, 255))
    assert (height, width) == (128, 128) and solid, "title text was drawn over the picture"
    ink = (out < 160).any(-1)
    assert ink[:top].any(), "the title is missing"
    assert not ink[:, 0].any() and not ink[:, -1].any() and not ink[0].any(), "the title is clipped at the border"


def test_grid_row_titles_are_whole_and_cell_titles_stay_out_of_the_cells():
    colours = [[(0, 0, 255), (255, 0, 0)], [(0, 160, 0), (255, 0, 255)]]
    cells = [[display.titled_image(one_colour(c), LONG_TITLE) for c in row] for row in colours]
    rows = ["sample 336", "a row title long enough to wrap over three lines"]
    out = display.grid(cells, rows, ["input", LONG_TITLE])
    boxes = []
    for row in colours:
        for colour in row:
            box, solid = colour_box(out, colour)
            assert box[2:] == (128, 128) and solid, f"text was drawn over the {colour} picture"
            boxes.append(box)
    first_cell_left = min(left for _, left, _, _ in boxes)
    ink = (out < 160).any(-1)
    title_ink = np.nonzero(ink[:, :first_cell_left].any(0))[0]
    # Row titles: inked, inside the image, and left of the first column without touching it.
    assert len(title_ink) and title_ink.min() > 0 and title_ink.max() < first_cell_left - 2
    narrow = display.grid(cells, ["s", "s"], ["input", LONG_TITLE])
    assert out.shape[1] - narrow.shape[1] > 40, "the row-title margin must grow with the titles"
