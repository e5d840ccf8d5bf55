"""Recipes whose right answer is known: the generated ground truth is what it claims, the models are explained."""

import json

import lightning.pytorch as pl
import pytest
import torch

import lightning_gae as lg
from lightning_gae.cli import main
from lightning_gae.compare import attribute, infer_modality
from recipes.shapes import SHAPES
from recipes.tabular import FeatureTokens, TabularClassifier, TabularDataModule, make_tabular, tabular_splits
from recipes.text_rationales import (
    CLS_ID,
    NEGATIVE,
    PAD_ID,
    POSITIVE,
    SEP_ID,
    VOCAB,
    BertReviewClassifier,
    ReviewClassifier,
    ReviewsDataModule,
    ReviewTokens,
    make_reviews,
)
from recipes.vit_shapes import HFViTClassifier, ShapeClassesDataModule, ShapesViTClassifier
from tests.helpers.processes import ROOT


def test_reviews_are_decided_by_their_planted_words_alone():
    data = make_reviews(200, max_length=24, generator=torch.Generator().manual_seed(0))
    sentiment = {VOCAB.index(w): 1 for w in POSITIVE} | {VOCAB.index(w): 0 for w in NEGATIVE}
    for ids, mask, rationale, label in zip(data["input_ids"], data["attention_mask"], data["rationales"], data["labels"]):
        words = ids[mask.bool()].tolist()
        assert words[0] == CLS_ID and words[-1] == SEP_ID and words.count(SEP_ID) == 1
        assert (ids[~mask.bool()] == PAD_ID).all() and mask.tolist() == sorted(mask.tolist(), reverse=True)
        planted = [int(i) for i, r in zip(ids, rationale) if r]
        assert 1 <= len(planted) <= 3
        # Every sentiment word is planted, and all of them have the label's polarity.
        assert [i for i in ids.tolist() if i in sentiment] == planted
        assert {sentiment[i] for i in planted} == {int(label)}
    assert 0.35 < data["labels"].float().mean() < 0.65


def test_review_tokens_never_remove_cls_sep_or_padding():
    data = make_reviews(4, generator=torch.Generator().manual_seed(1))
    modality = ReviewTokens()
    batch = {k: data[k] for k in ("input_ids", "attention_mask")}
    removed = modality.remove(batch, torch.ones_like(batch["input_ids"], dtype=torch.bool))["input_ids"]
    kept = torch.isin(batch["input_ids"], torch.tensor([PAD_ID, CLS_ID, SEP_ID]))
    assert torch.equal(removed[kept], batch["input_ids"][kept])
    assert (removed[~kept] == VOCAB.index("[MASK]")).all()


@pytest.mark.parametrize("model_class", [ReviewClassifier, BertReviewClassifier])
def test_review_models_are_explained_and_attributed_at_their_word_embedding(model_class):
    torch.manual_seed(0)
    model = model_class().eval()
    data = make_reviews(3, generator=torch.Generator().manual_seed(2))
    batch = {k: data[k] for k in ("input_ids", "attention_mask")}
    exp = lg.explain(model, batch)
    assert exp.tokens.shape == (3, 32) and len(exp.layers) == 2
    assert (exp.tokens[batch["attention_mask"] == 0] == 0).all()
    # What sits in padded positions must not change the prediction: the attention mask reaches every layer.
    scrambled = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, VOCAB.index("excellent"))
    assert not torch.equal(scrambled, batch["input_ids"])
    torch.testing.assert_close(model(scrambled, batch["attention_mask"]), model(**batch))
    ig = attribute("integrated_gradients", model, batch)
    assert ig.shape == (3, 32) and ig.abs().sum() > 0


@pytest.mark.slow
def test_a_short_fit_learns_the_reviews_and_gae_finds_the_planted_words():
    pl.seed_everything(0)
    data = ReviewsDataModule(num_train=2048, num_val=64, batch_size=64)
    model = ReviewClassifier(dim=32, depth=2, heads=2)
    pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(model, data)
    batch = next(iter(data.val_dataloader()))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    model.eval()
    assert (model(**inputs).argmax(dim=1) == batch["labels"]).float().mean() > 0.9
    tokens = lg.explain(model, inputs).tokens
    valid = ReviewTokens().removable(inputs)
    top = tokens.masked_fill(~valid, -1).argmax(dim=1)
    # The most relevant word is a planted one far more often than chance (about 2 of 20 words).
    assert batch["rationales"].gather(1, top[:, None]).float().mean() > 0.5


def test_generated_features_follow_the_stated_rule():
    x, y = make_tabular(500, num_features=12, num_informative=4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(y, ((x[:, 0] * x[:, 1] + x[:, 2] - x[:, 3]) > 0).long())
    # Every informative feature changes some labels; the noise features change none.
    for j in range(12):
        flipped = x.clone()
        flipped[:, j] = -flipped[:, j]
        changed = (((flipped[:, 0] * flipped[:, 1] + flipped[:, 2] - flipped[:, 3]) > 0).long() != y).any()
        assert bool(changed) == (j < 4)


@pytest.mark.parametrize("dataset", ["generated", "breast_cancer"])
def test_feature_tokens_fill_with_the_training_means_the_model_sees(dataset):
    data = TabularDataModule(dataset=dataset, num_train=256, num_val=64)
    data.setup("fit")
    train = data.train_set.tensors[0]
    modality = FeatureTokens(dataset=dataset, num_train=256, num_val=64)
    torch.testing.assert_close(torch.tensor(modality.means, dtype=torch.float64), train.double().mean(dim=0),
                               atol=1e-6, rtol=0)
    assert len(modality.feature_names) == train.shape[1] == (12 if dataset == "generated" else 30)
    batch = next(iter(data.val_dataloader()))
    if dataset == "generated":
        x, y, informative = batch
        assert informative.shape == x.shape and informative[0].tolist() == [1] * 4 + [0] * 8
    else:
        x, y = batch
        assert len(data.val_set) == 114 and set(y.tolist()) == {0, 1}
    exp = lg.explain(TabularClassifier(num_features=x.shape[1]).eval(), x)
    assert modality.to_input(exp.tokens, x).shape == x.shape


def test_breast_cancer_is_standardised_by_the_training_split_only():
    splits = tabular_splits("breast_cancer")
    x_train, x_val = splits["train"][0], splits["val"][0]
    torch.testing.assert_close(x_train.mean(dim=0), torch.zeros(30), atol=1e-5, rtol=0)
    assert not torch.allclose(x_val.mean(dim=0), torch.zeros(30), atol=1e-3)


def test_shape_classes_carry_the_shape_as_label_and_its_mask():
    data = ShapeClassesDataModule(num_train=64, num_val=32)
    data.setup("fit")
    images, labels, masks = next(iter(data.val_dataloader()))
    assert data.class_names == list(SHAPES)
    assert images.shape == (32, 3, 32, 32) and masks.shape == (32, 32, 32) and masks.dtype == torch.bool
    assert set(labels.tolist()) <= set(range(len(SHAPES)))
    # Coloured pixels are the shape's (the clutter is grey): none lies outside its mask.
    coloured = (images.amax(1) - images.amin(1)) > 0.5
    assert (coloured & ~masks).sum() == 0 and coloured.flatten(1).any(dim=1).all()


@pytest.mark.parametrize("model_class", [ShapesViTClassifier, HFViTClassifier])
def test_shape_models_are_explained_on_the_patch_grid(model_class):
    torch.manual_seed(0)
    model = model_class().eval()
    data = ShapeClassesDataModule(num_train=8, num_val=4)
    data.setup("fit")
    images = next(iter(data.val_dataloader()))[0]
    exp = lg.explain(model, images)
    assert exp.tokens.shape == (4, 1 + 8 * 8) and len(exp.layers) == 4
    modality = infer_modality(model, images)
    assert (modality.patch_size, modality.prefix_tokens) == (4, 1)


@pytest.mark.slow
def test_compare_on_a_recipe_checkpoint_scores_the_known_answer(tmp_path, monkeypatch):
    config = ROOT / "configs" / "text_rationales.yaml"
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(config), "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
          "--data.init_args.num_train=128", "--data.init_args.num_val=64"])
    (checkpoint,) = tmp_path.glob("runs/text_rationales/version_0/checkpoints/*.ckpt")
    main(["compare", "--config", str(config), "--ckpt_path", str(checkpoint), "--output", "out", "--num_samples", "6",
          "--methods", "gae", "random", "--metrics", "positive_perturbation_auc"])
    report = json.loads((tmp_path / "out" / "comparison.json").read_text())
    for method in ("gae", "random"):
        assert set(report["methods"][method]) == {"positive_perturbation_auc", "rationale_token_f1", "rationale_auprc",
                                                  "seconds_per_sample"}
        assert set(report["stderr"][method]) == {"positive_perturbation_auc", "rationale_token_f1", "rationale_auprc"}
        assert 0.0 <= report["methods"][method]["rationale_auprc"] <= 1.0
