"""recipes/shortcuts.py: the cue agrees with the label as declared, its region maps onto the right tokens; and
(slow) the model learns the shortcut, GAE's relevance moves onto it, the removal check sees it and GAECallback
alerts, the clean variant none of these, for two seeds (recipes/measure_shortcuts.py; the numbers in
docs/evidence/results/shortcuts.md)."""

import pytest
import torch

from lightning_gae import ImageTokens
from lightning_gae.modalities.regions import region_token_mask
from recipes.measure_shortcuts import measure
from recipes.shortcuts import SPURIOUS_WORD, SpuriousReviewsDataModule, WatermarkedDigitsDataModule
from recipes.text_rationales import POSITIVE, VOCAB, ReviewTokens


def cue_class(images):
    """The class the corner square names: its grey level is (c + 1) / 10."""
    return (images[:, 0, 0, 0] * 10).round().long() - 1


@pytest.mark.parametrize("shortcut", [True, False])
def test_the_watermark_names_the_label_in_training_only_when_asked(shortcut):
    data = WatermarkedDigitsDataModule(shortcut=shortcut, seed=0)
    data.setup("fit")
    (x, y), (vx, vy) = data.train_set.tensors, data.val_set.tensors
    agree = (cue_class(x) == y).float().mean().item()
    # 0.95 + 0.05 / 10 by chance, or 1 / 10; validation is 1 / 10 in both.
    assert agree == pytest.approx(0.955 if shortcut else 0.1, abs=0.03)
    assert (cue_class(vx) == vy).float().mean().item() == pytest.approx(0.1, abs=0.04)
    assert set(cue_class(x).tolist()) == set(range(10))
    # The square is the first patch of the recipe's ViT, nothing else.
    tokens = region_token_mask(data.region, ImageTokens(patch_size=2, prefix_tokens=1), vx[:4])
    assert tokens.tolist() == [[False, True] + [False] * 15] * 4
    assert data.region.suspect and data.watermark_mask.sum().item() == 4


def test_the_same_seed_gives_the_same_squares():
    first, second = WatermarkedDigitsDataModule(seed=3), WatermarkedDigitsDataModule(seed=3)
    first.setup("fit")
    second.setup("fit")
    assert torch.equal(first.train_set.tensors[0], second.train_set.tensors[0])


@pytest.mark.parametrize("shortcut", [True, False])
def test_the_spurious_word_goes_with_the_label_in_training_only_when_asked(shortcut):
    data = SpuriousReviewsDataModule(shortcut=shortcut, seed=0, num_train=2000, num_val=512)
    data.setup("fit")
    train, val = data.train_set.tensors, data.val_set.tensors
    spurious = VOCAB.index(SPURIOUS_WORD)
    assert data.spurious_id == spurious
    present = (train["input_ids"] == spurious).sum(dim=1)
    assert present.max() <= 1                                      # once, where put; never a natural occurrence
    positive = train["labels"] == 1
    assert present[positive].float().mean().item() == pytest.approx(0.95 if shortcut else 0.5, abs=0.04)
    assert present[~positive].float().mean().item() == pytest.approx(0.05 if shortcut else 0.5, abs=0.04)
    held = (val["input_ids"] == spurious).sum(dim=1).float()
    for label in (0, 1):
        assert held[val["labels"] == label].mean().item() == pytest.approx(0.5, abs=0.08)
    # Sentiment noise: in about 20% of the training reviews the planted words argue for the other class.
    words_positive = torch.isin(train["input_ids"], torch.tensor([VOCAB.index(w) for w in POSITIVE])).any(dim=1)
    assert (words_positive != positive).float().mean().item() == pytest.approx(0.2, abs=0.03)
    val_positive = torch.isin(val["input_ids"], torch.tensor([VOCAB.index(w) for w in POSITIVE])).any(dim=1)
    assert torch.equal(val_positive, val["labels"] == 1)
    tokens = region_token_mask(data.region, ReviewTokens(), {"input_ids": val["input_ids"]})
    assert torch.equal(tokens, val["input_ids"] == spurious)


@pytest.mark.parametrize("kwargs", [dict(correlation=1.5), dict(sentiment_noise=-0.1)])
def test_data_arguments_are_checked(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SpuriousReviewsDataModule(**kwargs)
    if "correlation" in kwargs:
        with pytest.raises(ValueError, match="correlation"):
            WatermarkedDigitsDataModule(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("data", ["images", "text"])
def test_the_shortcut_is_learned_and_gae_relevance_moves_onto_it(data, seed):
    torch.set_num_threads(1)
    shortcut, clean = measure(data, True, seed), measure(data, False, seed)
    # Thresholds from docs/evidence/results/shortcuts.md (two seeds), each with a margin of 1.4x or more.
    # The model learns the shortcut: on the shortcut-free validation set it loses what it had in training
    # (gaps 0.44-0.62 against 0.01-0.05 for the clean variant).
    assert shortcut["train_acc"] - shortcut["val_acc"] > 0.2
    assert clean["val_acc"] > 0.9 and clean["val_acc"] > shortcut["val_acc"] + 0.2
    # GAE's relevance moves onto the region only where it is a shortcut (0.22-1.0 of it, chance 0.06), and off it
    # where it is not (0.000-0.015): beyond chance by 0.16-0.94 against 0.05-0.06 below it.
    assert shortcut["share_end"] > max(4 * clean["share_end"], 1.5 * shortcut["chance"])
    assert clean["share_end"] < clean["chance"]
    assert shortcut["excess"] > 4 * shortcut["excess_stderr"] and clean["excess"] < 0
    # The removal check agrees: removing the region costs more than a random region only in the shortcut model
    # (0.46-0.91 against 0.06-0.09; clean 0.00-0.005 against 0.005-0.143).
    assert shortcut["drop_region"] > shortcut["drop_random"] + 0.1
    assert clean["drop_region"] < clean["drop_random"] + 0.02
    # GAECallback, as the recipe's config sets it up with the default RegionOptions, alerts on the shortcut (GAE
    # among the methods) and stays silent on the clean twin.
    assert "gae" in {a["method"] for a in shortcut["alerts"]} and all(a["rule"] == "chance" for a in shortcut["alerts"])
    assert clean["alerts"] == []
