"""lightning_gae.modalities.image: patch relevance back to pixels, the patch grid inferred, images drawn."""

import numpy as np
import pytest
import torch

from lightning_gae.modalities import ImageTokens


def _distinct_colours(picture):
    return len(np.unique(picture.reshape(-1, 3), axis=0))


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
