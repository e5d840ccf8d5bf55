"""GAECallback under the training set-ups users run: bf16, gradient accumulation, other and several
loggers, DDP, and text and tabular models. Real Trainers, real event files read back with TensorBoard."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from PIL import Image
from pytorch_lightning.loggers import TensorBoardLogger as PLTensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gae import TabularTokens, TextTokens, visualize
from lightning_gae.callbacks import GAECallback
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier

ROOT = Path(__file__).resolve().parents[1]


def vit():
    return ViTClassifier(dim=32, depth=2, heads=2)


def make_trainer(root, callbacks, logger=None, **kwargs):
    options = dict(max_epochs=2, limit_train_batches=2, limit_val_batches=1)
    options.update(kwargs)
    return Trainer(
        default_root_dir=root,
        logger=TensorBoardLogger(root, name="tb") if logger is None else logger,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        **options,
    )


def events(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def image_steps(acc, tag):
    return [e.step for e in acc.Images(tag)]


def decoded(acc, tag):
    """The last image logged under ``tag``, decoded from its PNG."""
    return np.asarray(Image.open(io.BytesIO(acc.Images(tag)[-1].encoded_image_string)))


@contextmanager
def no_skipped_explanation():
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        yield
    skipped = [str(w.message) for w in records if "was skipped" in str(w.message)]
    assert not skipped, skipped


def assert_heatmaps_at_steps(acc, callback, steps):
    for sample in callback.sample_indices:
        assert image_steps(acc, f"gae_heatmaps/val_{sample}") == steps


def colormap_pixels(picture):
    """How many pixels have a colour of the heatmaps' colormap (black and white aside)."""
    lut = {tuple(c) for c in visualize.colormap_lut(visualize.SEQUENTIAL_CMAP).tolist()[8:-8]}
    return sum(tuple(p) in lut for p in picture.reshape(-1, 3).tolist())


def weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# Lightning logs at `_batches_that_stepped`, which a validation at the end of an epoch still sees one
# below global_step (it is incremented after the validation); self.log("val_loss") lands there, and so
# do the callback's explanations. Two epochs of 2 batches: global steps 2 and 4, logged at 1 and 3.
EPOCH_END_STEPS = [1, 3]


# --- precision ----------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_training_logs_heatmaps_and_finite_scalars(tmp_path, precision):
    seed_everything(0)
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"))
    trainer = make_trainer(tmp_path, [callback], precision=precision)
    model = vit()
    with no_skipped_explanation():
        trainer.fit(model, DigitsDataModule(batch_size=32))
    # bf16-true trains bf16 weights: the tracked float32 samples must be cast like the batches are.
    assert model.model.head.weight.dtype == (torch.bfloat16 if precision == "bf16-true" else torch.float32)
    acc = events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    for method in ("gae", "rollout"):
        values = [e.value for e in acc.Scalars(f"relevance_concentration/{method}")]
        assert len(values) == 2 and all(math.isfinite(v) and 0.0 < v <= 1.0 for v in values)
        assert all(math.isfinite(e.value) for e in acc.Scalars(f"relevance_stability_spearman/{method}"))


# --- gradient accumulation ----------------------------------------------------------------------


def test_accumulation_explains_once_per_optimizer_step_multiple_of_n(tmp_path):
    # 8 micro-batches per epoch, 2 per optimizer step: steps 1..4, then 5..8. on_train_batch_end fires
    # twice with the same global_step (3 and 6 included), but each step must be explained once. Steps 3
    # and 6 are explained right after the optimizer stepped, where Lightning logs that batch at 2 and 5.
    callback = GAECallback(num_samples=2, every_n_epochs=None, every_n_train_steps=3)
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=8, accumulate_grad_batches=2)
    with no_skipped_explanation():
        trainer.fit(vit(), DigitsDataModule(batch_size=16))
    assert trainer.global_step == 8
    acc = events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, [2, 5])
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == [2, 5]
    assert [e.step for e in acc.Scalars("relevance_stability_spearman/gae")] == [5]


def test_accumulation_training_is_bitwise_unchanged_by_the_callback(tmp_path):
    # Validation every 3 micro-batches falls between the two halves of steps 2 and 5, so the epoch
    # explanations at steps 1 and 4 run while .grad holds half a step's gradient: they must not add
    # to it. Steps 3 and 6 are explained by step, right after the optimizer stepped. Logged at Lightning's
    # steps: 1 and 4 mid-accumulation, 2 and 5 for global steps 3 and 6 (the epoch ends' validations
    # see the same weights and are not explained twice).
    results = []
    for callbacks in ([], [GAECallback(num_samples=2, every_n_train_steps=3, methods=("gae", "attn_gradcam"))]):
        seed_everything(3)
        model = ViTClassifier(dim=32, depth=2, heads=2, dropout=0.1)
        trainer = make_trainer(tmp_path / str(len(callbacks)), callbacks, limit_train_batches=6,
                               accumulate_grad_batches=2, val_check_interval=3)
        trainer.fit(model, DigitsDataModule(batch_size=16))
        results.append(weights(model))
    without, with_callback = results
    assert without.keys() == with_callback.keys()
    assert all(torch.equal(without[k], with_callback[k]) for k in without)
    assert image_steps(events(trainer.logger.log_dir), f"gae_heatmaps/val_{callbacks[0].sample_indices[0]}") == [1, 2, 4, 5]


# --- loggers ------------------------------------------------------------------------------------


def test_pytorch_lightning_tensorboard_logger_together_with_a_csv_logger(tmp_path):
    # The separate pytorch_lightning package has its own logger classes; lightning.pytorch's Trainer
    # takes them, and the callback finds the SummaryWriter of whichever logger has one.
    tensorboard = PLTensorBoardLogger(tmp_path, name="tb")
    table = CSVLogger(tmp_path, name="csv")
    callback = GAECallback(num_samples=2)
    trainer = make_trainer(tmp_path, [callback], logger=[tensorboard, table])
    with no_skipped_explanation():
        trainer.fit(vit(), DigitsDataModule(batch_size=32))

    acc = events(tensorboard.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == EPOCH_END_STEPS
    with open(Path(table.log_dir) / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("relevance_concentration/gae")]
    assert [int(r["step"]) for r in rows] == EPOCH_END_STEPS
    assert all(0.0 < float(r["relevance_concentration/gae"]) <= 1.0 for r in rows)
    assert rows[-1]["relevance_stability_spearman/gae"]


# --- DDP ----------------------------------------------------------------------------------------

DDP_SCRIPT = """
    import json, sys
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning_gae.callbacks import GAECallback
    from recipes.digits import DigitsDataModule
    from recipes.vit import ViTClassifier

    root = sys.argv[1]
    seed_everything(0)
    callback = GAECallback(num_samples=3, every_n_train_steps=2)
    trainer = Trainer(default_root_dir=root, logger=TensorBoardLogger(root, name="tb"), callbacks=[callback],
                      max_epochs=2, limit_train_batches=3, limit_val_batches=2, accelerator="cpu",
                      strategy="ddp", devices=2, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    trainer.fit(ViTClassifier(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    with open(f"{root}/rank_{trainer.global_rank}.json", "w") as f:
        json.dump({"samples": callback.sample_indices, "finished": trainer.state.finished}, f)
"""


def test_ddp_on_two_cpu_processes_logs_once_from_rank_zero(tmp_path):
    script = tmp_path / "train_ddp.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # Its own session: on a hang, the rank the launcher started is killed along with rank 0.
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, (stdout + stderr)[-4000:]
    ranks = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert all(r["finished"] for r in ranks)

    # Every event file under the run, whichever rank might have written it: one image per tag and step.
    event_dirs = {p.parent for p in tmp_path.rglob("events.out.tfevents.*")}
    counts = Counter()
    for logdir in event_dirs:
        acc = events(logdir)
        for tag in acc.Tags()["images"]:
            counts.update((tag, e.step) for e in acc.Images(tag))
    assert len(event_dirs) == 1
    samples = ranks[0]["samples"]
    # Global steps 2, 4, 6 by step, 3 and 6 by epoch (3 batches an epoch); Lightning logs them at 1, 3, 5
    # and 2 (6 is explained once).
    for sample in samples:
        assert sorted(s for (t, s) in counts if t == f"gae_heatmaps/val_{sample}") == [1, 2, 3, 5]
    assert set(counts.values()) == {1}
    # The faithfulness subset is scored once, by rank zero when fit ends, on the weights of the last step (5).
    acc = events(next(iter(event_dirs)))
    assert [e.step for e in acc.Scalars("positive_perturbation_auc/gae")] == [5]

    # Each rank reads a shard of the validation set; the samples are nevertheless those one process picks.
    single = GAECallback(num_samples=3)
    make_trainer(tmp_path / "single", [single], limit_val_batches=2).validate(vit(), DigitsDataModule(batch_size=32))
    assert samples == ranks[1]["samples"] == single.sample_indices


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


def test_text_model_with_dict_batches_and_padding(tmp_path):
    seed_everything(0)
    # Batches of 8 with their own padded length: the callback concatenates them, padding again.
    train = DataLoader(synthetic_texts(64, seed=0), batch_size=8, shuffle=True, collate_fn=pad_batch)
    val = DataLoader(synthetic_texts(32, seed=1), batch_size=8, collate_fn=pad_batch)
    modality = TextTokens(vocab=VOCAB, special_ids=[CLS, SEP], pad_id=PAD)
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"), modality=modality)
    trainer = make_trainer(tmp_path, [callback])
    with no_skipped_explanation():
        trainer.fit(TextClassifier(), train, val)
    acc = events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    sample = callback.sample_indices[0]
    strip = decoded(acc, f"gae_heatmaps/val_{sample}")
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


def test_tabular_model_on_breast_cancer_features(tmp_path):
    seed_everything(0)
    x, y, train, val, names = breast_cancer()
    # The perturbation metrics put the training means in place of a removed feature.
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"), modality=TabularTokens(names).fit(x[train]))
    trainer = make_trainer(tmp_path, [callback])
    with no_skipped_explanation():
        trainer.fit(FTTransformer(x.shape[1]),
                    DataLoader(TensorDataset(x[train], y[train]), batch_size=32, shuffle=True),
                    DataLoader(TensorDataset(x[val], y[val]), batch_size=64))
    acc = events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    for method in ("gae", "rollout", "random"):
        # By default the faithfulness subset is scored once, on the final weights: the last explanation step's.
        assert [e.step for e in acc.Scalars(f"positive_perturbation_auc/{method}")] == EPOCH_END_STEPS[-1:]
    table = decoded(acc, f"gae_heatmaps/val_{callback.sample_indices[0]}")
    assert_rgb_picture(table)
    # One row per feature, 30 of them: the table is tall and the cells' colours cover a real area.
    assert table.shape[0] > 30 * 20 and colormap_pixels(table) > 500


def test_tabular_tokens_without_means_and_with_metrics_stop_the_run_in_setup(tmp_path):
    # Removing a feature needs a value to put in its place: without means every step's metrics would fail.
    x, y, train, val, names = breast_cancer()
    trainer = make_trainer(tmp_path, [GAECallback(num_samples=2, modality=TabularTokens(names))])
    with pytest.raises(ValueError, match=r"GAECallback\(metrics=\['positive_perturbation_auc', 'negative_perturbation_auc'\]\) "
                                         r"removes features, but modality=TabularTokens\(30 features.*has no value.*"
                                         r"TabularTokens\(\.\.\.\)\.fit\(train_features\), or pass metrics=\(\)"):
        trainer.fit(FTTransformer(x.shape[1]), DataLoader(TensorDataset(x[train], y[train]), batch_size=32),
                    DataLoader(TensorDataset(x[val], y[val]), batch_size=64))
    assert trainer.global_step == 0
    # Without the metrics nothing removes a feature, and the run explains as before.
    GAECallback(modality=TabularTokens(names), metrics=()).setup(trainer, FTTransformer(x.shape[1]), "fit")
