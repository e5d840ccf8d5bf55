"""lightning_gae.tensorboard.views: what StepViews draws for one explanation step of an image, text and tabular model, with
no writer: the pictures and their bounded size, the evolution strip's columns, the fixed colour range kept across steps,
and the markdown tables."""

import numpy as np
import pytest
import torch

from lightning_gae import Explanation, ImageTokens, TabularTokens, TextTokens, display
from lightning_gae.tensorboard.views import MAX_IMAGE_SIDE, SetInput, StepViews, bounded
from tests.helpers.pictures import find

VOCAB = ["[CLS]", "[SEP]", "[PAD]", "the", "cat", "sat", "on", "a", "mat"]


def _explanation(tokens, classes=3):
    """An explanation as explain() returns it for ``tokens`` [B, N] (one token set), the last class explained."""
    batch = tokens.shape[0]
    logits = torch.arange(classes, dtype=torch.float32).repeat(batch, 1)
    return Explanation(tokens=tokens, logits=logits, target=torch.full((batch,), classes - 1), score=logits[:, -1],
                       method="gae", relevance={"tokens": tokens})


def _draw(views, modality, shown, inputs, explanations, step, indices):
    """One step of single-set samples drawn the way TensorBoardViews.write draws it: (pictures, strips, tables)."""
    shown_maps = {m: views.display_maps(modality, e.tokens, "tokens", shown, inputs) for m, e in explanations.items()}
    flags = views.unit_flags(modality, shown, inputs)
    ranges = views.ranges(shown_maps, views.scored_units(modality, shown, inputs))
    predictions = views.predictions(next(iter(explanations.values())), len(indices))
    pictures, strips, tables = [], {}, []
    for k, index in enumerate(indices):
        header = views.header(index, None, predictions[k], None)
        pictures.append(views.picture(modality, shown, inputs, k, shown_maps, ranges, header, flags))
        if views.add_column(modality, shown[k], index, step, shown_maps, ranges, k, header):
            if views.strip_due(index, last=False):
                strips[index] = views.evolution(index)
        table = views.markdown(modality, shown, inputs, k, shown_maps, header, flags)
        if table is not None:
            tables.append(table)
    return pictures, strips, tables, ranges


# --- images -------------------------------------------------------------------------------------------------


def _image_step(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.rand(2, 17, generator=g) * scale
    tokens[:, 0] = 0.0
    return _explanation(tokens)


IMAGES = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
PATCHES = ImageTokens(patch_size=2)


def test_an_image_step_is_the_input_beside_every_methods_heatmap_at_the_panel_size():
    views = StepViews(panel_px=64)
    explanations = {"gae": _image_step(1), "rollout": _image_step(2)}
    pictures, _, tables, ranges = _draw(views, PATCHES, IMAGES, IMAGES, explanations, step=1, indices=[10, 11])
    assert len(pictures) == 2 and tables == [] and pictures[0].shape == pictures[1].shape
    for k, picture in enumerate(pictures):
        assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
        # The input and each method's heatmap (its patch grid, in its own colour range) at 64 px, whole, left to right.
        image = PATCHES.display_image(IMAGES[k]).numpy()
        panels = [display.enlarge(image, 64)]
        for method, explanation in explanations.items():
            grid = explanation.tokens[k, 1:].reshape(4, 4).numpy()
            panels.append(display.heatmap_panel(image, grid, 64, ranges[method][k][:2], alpha=views.alpha))
        corners = [find(picture, panel) for panel in panels]
        assert all(len(c) == 1 for c in corners), corners
        xs = [c[0][1] for c in corners]
        assert xs == sorted(xs) and xs[-1] - xs[0] >= 2 * 64
        # This step's column of each sample's evolution strip: every method at the strip's 128 px.
        (column,) = views.history[10 + k]
        assert column[0] == 1 and {m: c.shape for m, c in column[2].items()} == {"gae": (128, 128, 3),
                                                                             "rollout": (128, 128, 3)}


def test_a_token_count_that_does_not_fit_the_patch_grid_is_refused():
    with pytest.raises(ValueError, match="do not fit"):
        StepViews.display_maps(PATCHES, torch.zeros(2, 10), "tokens", IMAGES, IMAGES)


def test_the_evolution_strip_holds_the_last_steps_oldest_first_at_a_constant_size():
    views = StepViews(evolution_length=3)
    strips = {}
    for step in range(1, 6):
        _, drawn, _, _ = _draw(views, PATCHES, IMAGES, IMAGES, {"gae": _image_step(step)}, step, indices=[0, 1])
        strips[step] = drawn.get(0)
    # Drawn when three new columns have come: at step 3, then not again before step 6.
    assert [s for s, strip in strips.items() if strip is not None] == [3]
    assert [column[0] for column in views.history[0]] == [3, 4, 5]
    assert views.strip_due(0, last=True) and not views.strip_due(0, last=False)
    strip = views.evolution(0)
    assert not views.strip_due(0, last=True), "a drawn strip has nothing new until the next step"
    # The columns are steps 3, 4 and 5, left to right, each cell once and whole.
    corners = [find(strip, cells["gae"]) for _, _, cells in views.history[0]]
    assert all(len(c) == 1 for c in corners), corners
    xs = [c[0][1] for c in corners]
    assert xs == sorted(xs) and len({c[0][0] for c in corners}) == 1
    assert strips[3].shape == strip.shape
    # One column (a run's first step) is drawn at the full strip's size, the empty columns left of it.
    fresh = StepViews(evolution_length=3)
    _draw(fresh, PATCHES, IMAGES, IMAGES, {"gae": _image_step(5)}, 5, indices=[0, 1])
    single = fresh.evolution(0)
    assert single.shape == strip.shape
    (corner,) = find(single, fresh.history[0][-1][2]["gae"])
    assert corner == (corners[-1][0][0], xs[-1])
    # A longer strip is wider by its extra columns.
    longer = StepViews(evolution_length=5)
    _draw(longer, PATCHES, IMAGES, IMAGES, {"gae": _image_step(5)}, 5, indices=[0, 1])
    assert longer.evolution(0).shape[0] == strip.shape[0]
    assert longer.evolution(0).shape[1] - strip.shape[1] == 2 * (xs[1] - xs[0])


def test_a_fixed_colour_range_is_set_at_the_first_step_and_kept():
    first, doubled = _image_step(1), _image_step(1, scale=2.0)
    fixed, per_map = StepViews(scale="fixed"), StepViews(scale="per_map")
    ranges = {}
    for name, views in (("fixed", fixed), ("per_map", per_map)):
        for step, explanation in ((1, first), (2, doubled)):
            ranges[name, step] = _draw(views, PATCHES, IMAGES, IMAGES, {"gae": explanation}, step, indices=[0, 1])[3]
    # Fixed: one range over every tracked sample of the first step, for every later step; larger values saturate.
    top = float(first.tokens.max())
    assert [r[:2] for r in ranges["fixed", 1]["gae"]] == [(0.0, pytest.approx(top))] * 2
    assert [r[:2] for r in ranges["fixed", 2]["gae"]] == [r[:2] for r in ranges["fixed", 1]["gae"]]
    assert [r[2] for r in ranges["fixed", 1]["gae"]] == [False, False]
    assert any(r[2] for r in ranges["fixed", 2]["gae"])
    # Per map: each map's own range, so twice the values draw the same colours.
    assert [r[1] for r in ranges["per_map", 2]["gae"]] == pytest.approx([2 * r[1] for r in ranges["per_map", 1]["gae"]])
    for k in (0, 1):
        before, after = (per_map.history[k][i][2]["gae"] for i in (0, 1))
        assert np.array_equal(before, after)
        before, after = (fixed.history[k][i][2]["gae"] for i in (0, 1))
        assert not np.array_equal(before, after)


# --- text and features ----------------------------------------------------------------------------------------


def test_a_text_step_draws_the_real_tokens_and_tables_them_without_padding():
    text = TextTokens(vocab=VOCAB, special_ids=[0, 1], pad_id=2)
    ids = torch.tensor([[0, 3, 4, 5, 1, 2, 2], [0, 3, 8, 6, 7, 8, 1]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 2).long()}
    relevance = torch.tensor([[0.0, 0.5, 1.0, 0.25, 9.0, 0.0, 0.0], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.0]])
    views = StepViews(scale="fixed")
    pictures, strips, tables, ranges = _draw(views, text, ids, inputs, {"gae": _explanation(relevance)}, 1, [4, 7])
    assert strips == {} and views.history == {}
    assert all(p.dtype == np.uint8 and p.ndim == 3 for p in pictures)
    # Special tokens ([SEP]'s 9.0) set no colour: the range spans the real, ordinary tokens of both samples.
    assert [r[:2] for r in ranges["gae"]] == [(0.0, 1.0)] * 2
    lines = tables[0].splitlines()
    assert lines[0].startswith("val \\#4")
    assert lines[2:4] == ["| token | gae |", "| --- | ---: |"]
    assert lines[4:] == ["| \\[CLS\\] | 0 |", "| the | 0.5 |", "| cat | 1 |", "| sat | 0.25 |", "| \\[SEP\\] | 9 |"]
    assert len(tables[1].splitlines()) == 4 + 7


def test_a_tabular_step_draws_a_row_per_feature_and_tables_the_values():
    tabular = TabularTokens(["age", "bmi", "bp"], prefix_tokens=1)
    features = torch.tensor([[52.0, 27.5, 1.25], [33.0, 22.0, 0.5]])
    relevance = torch.tensor([[0.0, 0.1, 0.7, 0.2], [0.0, 0.3, 0.3, 0.4]])
    views = StepViews()
    pictures, strips, tables, _ = _draw(views, tabular, features, features,
                                        {"gae": _explanation(relevance), "rollout": _explanation(relevance / 2)}, 1, [0, 1])
    assert strips == {} and len(pictures) == 2
    assert all(p.dtype == np.uint8 and p.ndim == 3 for p in pictures)
    lines = tables[0].splitlines()  # the names and values escaped for markdown
    assert lines[2:] == ["| feature | gae | rollout |", "| --- | ---: | ---: |", "| age = 52 | 0.1 | 0.05 |",
                         "| bmi = 27\\.5 | 0.7 | 0.35 |", "| bp = 1\\.25 | 0.2 | 0.1 |"]
    # A row per feature: two more features, a taller picture of the same methods.
    wider = TabularTokens(["age", "bmi", "bp", "s1", "s2"], prefix_tokens=1)
    more = torch.cat([features, features[:, :2]], dim=1)
    (taller, _), _, _, _ = _draw(StepViews(), wider, more, more, {"gae": _explanation(torch.rand(2, 6)),
                                                                  "rollout": _explanation(torch.rand(2, 6))}, 1, [0, 1])
    assert pictures[0].shape[0] == pictures[1].shape[0] < taller.shape[0]


# --- several token sets and the size limit --------------------------------------------------------------------


def _sets_explanation(relevance, query_set):
    single = _explanation(relevance[query_set])
    return Explanation(tokens=single.tokens, logits=single.logits, target=single.target, score=single.score,
                       method="gae", relevance=relevance, query_set=query_set)


def test_every_picture_of_several_token_sets_is_bounded_by_the_size_limit():
    text = TextTokens(vocab=VOCAB, special_ids=[0, 1], pad_id=2)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(VOCAB), (2, 600), generator=g)
    sets = {"image": SetInput(PATCHES, IMAGES, IMAGES), "text": SetInput(text, ids, {"input_ids": ids})}
    relevance = {"image": torch.rand(2, 17, generator=g), "text": torch.rand(2, 600, generator=g)}
    # A narrow text column of 600 tokens is far taller than the limit: each picture is shrunk to it, aspect kept.
    pictures = StepViews(panel_px=16).set_pictures(sets, [0, 1], {"gae": _sets_explanation(relevance, "image")})
    assert len(pictures) == 2
    assert all(p.dtype == np.uint8 and max(p.shape[:2]) == MAX_IMAGE_SIDE for p in pictures)
    # Without the long text set nothing needs shrinking.
    image_only = StepViews(panel_px=16).set_pictures({"image": sets["image"]}, [0, 1],
                                                     {"gae": _sets_explanation({"image": relevance["image"]}, "image")})
    assert all(max(p.shape[:2]) < MAX_IMAGE_SIDE for p in image_only)


def test_a_picture_larger_than_the_limit_is_shrunk_keeping_its_aspect():
    tall = np.random.default_rng(0).integers(0, 255, (3 * MAX_IMAGE_SIDE, 300, 3), dtype=np.uint8)
    small = tall[:100]
    shrunk = bounded(tall)
    assert shrunk.dtype == np.uint8 and shrunk.shape == (MAX_IMAGE_SIDE, 100, 3)
    assert bounded(small) is small


def test_arguments_are_checked_when_the_views_are_made():
    with pytest.raises(ValueError, match="per_map"):
        StepViews(scale="global")
    with pytest.raises(ValueError, match="panel_px >= 16"):
        StepViews(panel_px=8)
