"""lightning_gae.modalities.regions: a declared region's checks, and its token mask against a plain loop per modality."""

import pytest
import torch

from lightning_gae import ImageTokens, TabularTokens, TextTokens
from lightning_gae.modalities.regions import PATCH_SHARE, Region, region_token_mask


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="", kind="suspect", token_ids=[1]), "name must be a non-empty string"),
    (dict(name="w", kind="bad", token_ids=[1]), "kind='bad'"),
    (dict(name="w", kind="suspect"), "exactly one of mask=.*got none"),
    (dict(name="w", kind="suspect", token_ids=[1], features=[0]), r"exactly one of .*\['token_ids', 'features'\]"),
    (dict(name="w", kind="suspect", mask=torch.zeros(4)), r"mask must be pixels \[H, W\] or \[B, H, W\]"),
    (dict(name="w", kind="suspect", token_ids=[]), "token_ids must be a non-empty list of ints"),
    (dict(name="w", kind="suspect", token_ids=[1.5]), "token_ids must be a non-empty list of ints"),
    (dict(name="w", kind="suspect", predicate=3), "predicate must be callable"),
    (dict(name="w", kind="suspect", features=[]), "features must be a non-empty list"),
    (dict(name="w", kind="suspect", token_ids=[5, -1]), r"Region 'w': token_ids \[5, -1\] holds a negative id"),
    (dict(name="w", kind="suspect", token_ids=-3), r"token_ids \[-3\] holds a negative id"),
    (dict(name="w", kind="suspect", features=["age", -1]), r"Region 'w': features \['age', -1\] holds a negative index"),
])
def test_a_region_names_the_argument_it_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Region(**kwargs)


def test_a_region_from_yaml_values_is_normalised():
    region = Region("border", "evidence", mask=[[1, 0], [0, 0]])
    assert isinstance(region.mask, torch.Tensor) and region.mask.shape == (2, 2) and not region.suspect
    assert Region("tok", "suspect", token_ids=7).token_ids == (7,) and Region("tok", "suspect", token_ids=[7]).suspect


def patches_loop(mask, patch, prefix):
    """One image mask [H, W]: per patch, row-major, whether at least PATCH_SHARE of its pixels are in the mask."""
    rows, cols = mask.shape[0] // patch, mask.shape[1] // patch
    out = [False] * prefix
    for r in range(rows):
        for c in range(cols):
            inside = sum(bool(mask[r * patch + i, c * patch + j]) for i in range(patch) for j in range(patch))
            out.append(inside / patch**2 >= PATCH_SHARE)
    return out


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("per_sample", [False, True])
def test_an_image_mask_becomes_the_patches_it_covers_half_of(prefix, per_sample):
    generator = torch.Generator().manual_seed(prefix)
    images = torch.zeros(3, 1, 9, 9)                        # 9 = 3 patches of 3 + one pixel no patch covers
    masks = torch.rand(3, 9, 9, generator=generator) < 0.5
    masks[:, 8, :] = True                                   # the uncovered row changes nothing
    mask = masks if per_sample else masks[0]
    tokens = region_token_mask(Region("r", "suspect", mask=mask), ImageTokens(patch_size=3, prefix_tokens=prefix), images)
    expected = [patches_loop(masks[i] if per_sample else masks[0], 3, prefix) for i in range(3)]
    assert tokens.tolist() == expected
    # Exactly half a patch counts (the rule's boundary), a quarter does not.
    half = torch.zeros(4, 4)
    half[0, :] = 1                                          # half of patch 0, half of patch 1
    half[2, 2] = 1                                          # a quarter of patch 3
    got = region_token_mask(Region("r", "suspect", mask=half), ImageTokens(patch_size=2, prefix_tokens=0), torch.zeros(1, 1, 4, 4))
    assert got.tolist() == [[True, True, False, False]]


def test_an_image_mask_of_the_wrong_size_says_which_fits():
    with pytest.raises(ValueError, match=r"give \[8, 8\] or \[2, 8, 8\]"):
        region_token_mask(Region("r", "suspect", mask=torch.ones(4, 4)), ImageTokens(patch_size=2), torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"give \[8, 8\] or \[2, 8, 8\]"):
        region_token_mask(Region("r", "suspect", mask=torch.ones(3, 8, 8)), ImageTokens(patch_size=2), torch.zeros(2, 1, 8, 8))
    with pytest.raises(ValueError, match="does not fit ImageTokens: it needs mask="):
        region_token_mask(Region("r", "suspect", token_ids=[1]), ImageTokens(patch_size=2), torch.zeros(2, 1, 8, 8))


def test_text_regions_by_ids_or_predicate_never_include_padding():
    pad = 0
    ids = torch.tensor([[1, 7, 5, 7, 2, pad], [1, 5, 5, 2, pad, pad]])
    modality = TextTokens(special_ids=(0, 1, 2), pad_id=pad)
    by_ids = region_token_mask(Region("spurious", "suspect", token_ids=[7, pad]), modality, ids)
    expected = [[i in (7, pad) and i != pad for i in row] for row in ids.tolist()]
    assert by_ids.tolist() == expected
    by_predicate = region_token_mask(Region("odd", "suspect", predicate=lambda t: t % 2 == 1), modality,
                                     {"input_ids": ids, "attention_mask": (ids != pad).long()})
    assert by_predicate.tolist() == [[i % 2 == 1 for i in row] for row in ids.tolist()]
    with pytest.raises(ValueError, match="predicate returned shape"):
        region_token_mask(Region("bad", "suspect", predicate=lambda t: t[:, 0]), modality, ids)
    with pytest.raises(ValueError, match="needs token_ids= or predicate="):
        region_token_mask(Region("bad", "suspect", features=[0]), modality, ids)


def test_tabular_regions_by_index_or_name_after_the_prefix():
    modality = TabularTokens(["age", "income", "height"], prefix_tokens=1)
    x = torch.zeros(2, 3)
    tokens = region_token_mask(Region("money", "suspect", features=["income", 2]), modality, x)
    assert tokens.tolist() == [[False, False, True, True]] * 2
    with pytest.raises(ValueError, match="'weight' is not one of feature_names"):
        region_token_mask(Region("w", "suspect", features=["weight"]), modality, x)
    with pytest.raises(ValueError, match="feature index 3 is out of range"):
        region_token_mask(Region("w", "suspect", features=[3]), modality, x)


def test_an_image_region_of_a_hugging_face_batch_reads_its_pixel_values():
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[:2, :2] = True
    images = torch.zeros(2, 3, 8, 8)
    region = Region("corner", "suspect", mask=mask)
    modality = ImageTokens(patch_size=2)
    assert torch.equal(region_token_mask(region, modality, {"pixel_values": images}),
                       region_token_mask(region, modality, images))
