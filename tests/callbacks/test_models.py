"""GAECallback on the models and precisions users train: bf16, a text model on Hugging Face-style dict batches,
an FT-Transformer on tabular features, a ViT without a CLS token. Real fits, event files read back."""

from __future__ import annotations

import math
import warnings

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import seed_everything
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gae import ImageTokens, TabularTokens, TextTokens, display
from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from recipes.digits import DigitsDataModule
from tests.helpers.models import MeanPooledViT, small_vit
from tests.helpers.trainer import EPOCH_END_STEPS, assert_heatmaps_at_steps, no_skipped_explanation


def colormap_pixels(picture):
    """How many pixels have a colour of the heatmaps' colormap (black and white aside)."""
    lut = {tuple(c) for c in display.colormap_lut(display.SEQUENTIAL_CMAP).tolist()[8:-8]}
    return sum(tuple(p) in lut for p in picture.reshape(-1, 3).tolist())


# --- precision ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_training_logs_heatmaps_and_finite_scalars(tmp_path, precision, make_trainer, read_events):
    seed_everything(0)
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"))
    trainer = make_trainer(tmp_path, [callback], limit_val_batches=1, precision=precision)
    model = small_vit()
    with no_skipped_explanation():
        trainer.fit(model, DigitsDataModule(batch_size=32))
    # bf16-true trains bf16 weights: the tracked float32 samples must be cast like the batches are.
    assert model.model.head.weight.dtype == (torch.bfloat16 if precision == "bf16-true" else torch.float32)
    acc = read_events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    for method in ("gae", "rollout"):
        values = [e.value for e in acc.Scalars(f"relevance_concentration/{method}")]
        assert len(values) == 2 and all(math.isfinite(v) and 0.0 < v <= 1.0 for v in values)
        assert all(math.isfinite(e.value) for e in acc.Scalars(f"relevance_stability_spearman/{method}"))


# --- text and tabular models --------------------------------------------------------------------

VOCAB = ["[PAD]", "[CLS]", "[SEP]", "good", *[f"w{i}" for i in range(4, 24)]]
PAD, CLS, SEP, GOOD = 0, 1, 2, 3


def synthetic_texts(count: int, seed: int) -> list[dict[str, Tensor]]:
    """Sentences of 3..10 words; the label is whether the word "good" occurs."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(count):
        words = torch.randint(GOOD + 1, len(VOCAB), (int(torch.randint(3, 11, (1,), generator=g)),), generator=g)
        label = i % 2
        if label:
            words[int(torch.randint(len(words), (1,), generator=g))] = GOOD
        ids = torch.cat([torch.tensor([CLS]), words, torch.tensor([SEP])])
        samples.append({"input_ids": ids, "labels": torch.tensor(label)})
    return samples


def pad_batch(samples: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    length = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), length), PAD)
    for row, s in zip(ids, samples):
        row[: len(s["input_ids"])] = s["input_ids"]
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": torch.stack([s["labels"] for s in samples])}


class TextClassifier(pl.LightningModule):
    """A tiny BERT (random weights, nothing downloaded) trained on HF-style dict batches."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=16, pad_token_id=PAD, num_labels=2)
        self.bert = BertForSequenceClassification(config)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return F.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class FTTransformer(pl.LightningModule):
    """FT-Transformer style: one token per feature (its own linear embedding), a CLS token, an encoder."""

    def __init__(self, features: int, dim: int = 16, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, dim) / math.sqrt(dim))
        self.bias = nn.Parameter(torch.zeros(features, dim))
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 2)

    def forward(self, x: Tensor) -> Tensor:
        tokens = x[..., None] * self.weight + self.bias
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1)
        return self.head(self.encoder(h)[:, 0])

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def assert_rgb_picture(picture):
    assert picture.ndim == 3 and picture.shape[2] == 3 and min(picture.shape[:2]) > 20
    assert len(np.unique(picture.reshape(-1, 3), axis=0)) > 10, "a blank picture"


@pytest.mark.slow
def test_text_model_with_dict_batches_and_padding(tmp_path, make_trainer, read_events):
    seed_everything(0)
    # Batches of 8 with their own padded length: the callback concatenates them, padding again.
    train = DataLoader(synthetic_texts(64, seed=0), batch_size=8, shuffle=True, collate_fn=pad_batch)
    val = DataLoader(synthetic_texts(32, seed=1), batch_size=8, collate_fn=pad_batch)
    modality = TextTokens(vocab=VOCAB, special_ids=[CLS, SEP], pad_id=PAD)
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"), modality=modality)
    trainer = make_trainer(tmp_path, [callback], limit_val_batches=1)
    with no_skipped_explanation():
        trainer.fit(TextClassifier(), train, val)
    acc = read_events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    sample = callback.sample_indices[0]
    strip = acc.picture(f"gae_heatmaps/val_{sample}")
    assert_rgb_picture(strip)
    # Relevance colours the words' boxes with the colormap: both methods' rows of tokens cover a real area.
    assert colormap_pixels(strip) > 500
    # The Text tab has the same relevance as a table: a header row, then one row per real token.
    table = acc.Tensors(f"gae_tokens/val_{sample}")[-1].tensor_proto.string_val[0].decode()
    assert "| token | gae | rollout |" in table and table.count("\n|") > 5


def breast_cancer():
    """Standardised features ``x [569, 30]``, labels, the train/val split and the feature names."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = torch.as_tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = torch.as_tensor(data.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    return x, y, order[:450], order[450:], list(data.feature_names)


@pytest.mark.slow
def test_tabular_model_on_breast_cancer_features(tmp_path, make_trainer, read_events):
    seed_everything(0)
    x, y, train, val, names = breast_cancer()
    # The perturbation metrics put the training means in place of a removed feature.
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"), modality=TabularTokens(names).fit(x[train]))
    trainer = make_trainer(tmp_path, [callback], limit_val_batches=1)
    with no_skipped_explanation():
        trainer.fit(FTTransformer(x.shape[1]),
                    DataLoader(TensorDataset(x[train], y[train]), batch_size=32, shuffle=True),
                    DataLoader(TensorDataset(x[val], y[val]), batch_size=64))
    acc = read_events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    for method in ("gae", "rollout", "random"):
        # By default the faithfulness subset is scored at the first explanation step (its interim part) and on the
        # final weights (all of it): the last explanation step's.
        assert [e.step for e in acc.Scalars(f"positive_perturbation_auc/{method}")] == EPOCH_END_STEPS
    table = acc.picture(f"gae_heatmaps/val_{callback.sample_indices[0]}")
    assert_rgb_picture(table)
    # One row per feature, 30 of them: the table is tall and the cells' colours cover a real area.
    assert table.shape[0] > 30 * 20 and colormap_pixels(table) > 500


def test_tabular_tokens_without_means_and_with_metrics_are_refused_when_the_callback_is_built(tmp_path, make_trainer):
    # Removing a feature needs a value to put in its place: without means every step's metrics would fail.
    x, y, train, val, names = breast_cancer()
    # A check that needs neither the model nor the data: it fails when the callback is built, before any run.
    with pytest.raises(ValueError, match=r"GAECallback\(faithfulness=FaithfulnessOptions\(metrics=\['positive_perturbation_auc', "
                                         r"'negative_perturbation_auc'\]\)\) removes features, but modality=TabularTokens"
                                         r"\(30 features.*has no value.*TabularTokens\(\.\.\.\)\.fit\(train_features\), or pass "
                                         r"faithfulness=FaithfulnessOptions\(metrics=\(\)\)"):
        GAECallback(num_samples=2, modality=TabularTokens(names))
    # Without the metrics nothing removes a feature, and the run explains as before.
    trainer = make_trainer(tmp_path, [], limit_val_batches=1)
    GAECallback(modality=TabularTokens(names), faithfulness=FaithfulnessOptions(metrics=())).setup(trainer, FTTransformer(x.shape[1]), "fit")


# --- a ViT without a CLS token -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("query", [0, "mean"])
def test_an_image_modality_without_cls_read_at_token_0_warns_to_use_the_mean(tmp_path, query, make_trainer,
                                                                            read_events):
    # Issue 10 item 17: token 0 of a model without CLS is a patch, not what the head reads.
    seed_everything(0)
    model = MeanPooledViT(dim=32, depth=2, heads=2)
    callback = GAECallback(num_samples=2, methods=["gae"], query=query,
                           modality=ImageTokens(patch_size=2, prefix_tokens=0),
                           faithfulness=FaithfulnessOptions(metrics=[]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_epochs=1).fit(model, DigitsDataModule(batch_size=32))
    told = [w for w in caught if "has no CLS token" in str(w.message)]
    if query == 0:
        assert len(told) == 1 and 'query="mean"' in str(told[0].message)
    else:
        assert not told
        # query="mean" explains the pooled patches: 16 tokens per sample, every one with relevance.
        assert read_events(tmp_path / "tb" / "version_0").Tags()["images"]


@pytest.mark.slow
def test_attnlrp_beside_gae_on_a_hugging_face_text_model(tmp_path, make_trainer, read_events):
    # The LRP method in the callback: the BERT inside the LightningModule gives its word embedding, and AttnLRP is
    # drawn, tabled and scored like the attention methods, on the same samples.
    seed_everything(0)
    train = DataLoader(synthetic_texts(32, seed=0), batch_size=8, shuffle=True, collate_fn=pad_batch)
    val = DataLoader(synthetic_texts(32, seed=1), batch_size=8, collate_fn=pad_batch)
    modality = TextTokens(vocab=VOCAB, special_ids=[CLS, SEP], pad_id=PAD)
    callback = GAECallback(num_samples=2, methods=("gae", "attnlrp"), modality=modality,
                           faithfulness=FaithfulnessOptions(samples=16))
    trainer = make_trainer(tmp_path, [callback], limit_val_batches=1)
    with no_skipped_explanation():
        trainer.fit(TextClassifier(), train, val)
    acc = read_events(trainer.logger.log_dir)
    sample = callback.sample_indices[0]
    table = acc.Tensors(f"gae_tokens/val_{sample}")[-1].tensor_proto.string_val[0].decode()
    assert "| token | gae | attnlrp |" in table
    scalars = acc.Tags()["scalars"]
    for tag in ("relevance_concentration/attnlrp", "positive_perturbation_auc/attnlrp", "negative_perturbation_auc/attnlrp"):
        assert tag in scalars, scalars
