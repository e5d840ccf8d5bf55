"""An ``nn.Transformer`` encoder-decoder on a copy task whose source-target alignment is known.

Each source is ``source_length`` symbols: ``copy_length`` distinct *content* symbols at random
positions among *distractor* symbols. The target is the content symbols in reverse order of
appearance, then ``EOS``. Output position ``j`` therefore copies exactly one known source position,
``alignment[j]`` (``-1`` for ``EOS``, which copies nothing), and the position differs from sample to
sample, so an explanation can only find it by reading the sample.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy

from lightning_gae.modalities import TextTokens
from recipes.common import TensorDictDataset, adamw_one_cycle

__all__ = ["BOS", "EOS", "NO_ALIGNMENT", "PAD", "CopyTaskDataModule", "CopyTokens", "Seq2SeqCopier", "make_copy_task"]

PAD, BOS, EOS = 0, 1, 2
NUM_SPECIAL = 3
NO_ALIGNMENT = -1
"""``alignment`` of a target token that copies no source position (``EOS``)."""


def make_copy_task(
    num_samples: int,
    source_length: int = 16,
    copy_length: int = 6,
    num_symbols: int = 20,
    num_distractors: int = 8,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Generate the copy task.

    Token ids: ``PAD=0``, ``BOS=1``, ``EOS=2``, content symbols ``3 .. 3+num_symbols-1``, distractors
    after them.

    Returns:
        ``{"src": [N, S], "tgt_in": [N, K+1], "labels": [N, K+1], "alignment": [N, K+1]}`` (int64):
        ``tgt_in`` is ``BOS`` then the labels shifted right; ``labels[:, j] == src[:, alignment[:, j]]``
        for ``j < K`` and ``labels[:, K] == EOS`` with ``alignment == -1``.
    """
    if not 0 < copy_length <= min(source_length, num_symbols):
        raise ValueError(f"copy_length ({copy_length}) must be in 1..min(source_length={source_length}, num_symbols={num_symbols})")
    if num_distractors < 1 and copy_length < source_length:
        raise ValueError("num_distractors must be >= 1 when copy_length < source_length")
    n, s, k = num_samples, source_length, copy_length
    # Distinct content symbols: a symbol appears at most once, so its source position is unambiguous.
    symbols = torch.rand(n, num_symbols, generator=generator).argsort(dim=1)[:, :k] + NUM_SPECIAL
    positions = torch.rand(n, s, generator=generator).argsort(dim=1)[:, :k].sort(dim=1).values
    src = NUM_SPECIAL + num_symbols + torch.randint(0, max(num_distractors, 1), (n, s), generator=generator)
    src.scatter_(1, positions, symbols)
    alignment = torch.cat([positions.flip(1), torch.full((n, 1), NO_ALIGNMENT)], dim=1)
    labels = torch.cat([symbols.flip(1), torch.full((n, 1), EOS)], dim=1)
    tgt_in = torch.cat([torch.full((n, 1), BOS), labels[:, :-1]], dim=1)
    return {"src": src, "tgt_in": tgt_in, "labels": labels, "alignment": alignment}


class CopyTokens(TextTokens):
    """:class:`~lightning_gae.TextTokens` of the copy task's ids: ``<pad> <bos> <eos>``, content symbols
    ``s0 s1 ...`` and distractors ``d0 d1 ...`` (the same counts as :func:`make_copy_task`'s)."""

    def __init__(self, num_symbols: int = 20, num_distractors: int = 8) -> None:
        vocab = ["<pad>", "<bos>", "<eos>", *(f"s{i}" for i in range(num_symbols)), *(f"d{i}" for i in range(num_distractors))]
        super().__init__(vocab=vocab, special_ids=(PAD, BOS, EOS), pad_id=PAD)


class CopyTaskDataModule(pl.LightningDataModule):
    """The copy task (:func:`make_copy_task`) as train/val sets generated once from ``seed``.

    Batches are dicts ``{"src", "tgt_in", "labels", "alignment"}``; ``test_dataloader`` serves the
    validation set.
    """

    def __init__(
        self,
        num_train: int = 16384,
        num_val: int = 1024,
        source_length: int = 16,
        copy_length: int = 6,
        num_symbols: int = 20,
        num_distractors: int = 8,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.train_set: TensorDictDataset | None = None
        self.val_set: TensorDictDataset | None = None

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + self.hparams.num_symbols + self.hparams.num_distractors

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        generator = torch.Generator().manual_seed(hp.seed)
        data = make_copy_task(hp.num_train + hp.num_val, hp.source_length, hp.copy_length, hp.num_symbols,
                              hp.num_distractors, generator)
        self.train_set = TensorDictDataset({k: v[: hp.num_train] for k, v in data.items()})
        self.val_set = TensorDictDataset({k: v[hp.num_train:] for k, v in data.items()})

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


class Seq2SeqCopier(pl.LightningModule):
    """``nn.Transformer`` (pre-norm, batch first) with learned token and position embeddings.

    ``forward(src, tgt_in)`` applies the causal decoder mask itself and returns logits
    ``[B, T, vocab_size]``, so ``explain(model, (src, tgt_in), query=j)`` explains the token
    predicted at decoder position ``j``. Trained with teacher forcing.
    """

    def __init__(
        self,
        vocab_size: int = 31,
        max_source_length: int = 16,
        max_target_length: int = 16,
        d_model: int = 64,
        nhead: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        dim_feedforward: int = 128,
        dropout: float = 0.0,
        lr: float = 3e-3,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.src_embed = nn.Embedding(vocab_size, d_model)
        self.tgt_embed = nn.Embedding(vocab_size, d_model)
        self.src_pos = nn.Parameter(torch.randn(1, max_source_length, d_model) * 0.02)
        self.tgt_pos = nn.Parameter(torch.randn(1, max_target_length, d_model) * 0.02)
        self.transformer = nn.Transformer(
            d_model=d_model,
            nhead=nhead,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            dim_feedforward=dim_feedforward,
            dropout=dropout,
            batch_first=True,
            norm_first=True,
        )
        self.head = nn.Linear(d_model, vocab_size)
        self.val_acc = MulticlassAccuracy(num_classes=vocab_size, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=vocab_size, average="micro")

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits ``[B, T, vocab_size]`` for sources ``[B, S]`` and decoder inputs ``[B, T]`` (int64)."""
        s, t = src.shape[1], tgt_in.shape[1]
        if s > self.src_pos.shape[1] or t > self.tgt_pos.shape[1]:
            raise ValueError(f"src length {s} / tgt_in length {t} exceed max_source_length={self.src_pos.shape[1]} "
                             f"/ max_target_length={self.tgt_pos.shape[1]}; build the model with larger maxima")
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=tgt_in.device)
        hidden = self.transformer(
            self.src_embed(src) + self.src_pos[:, :s],
            self.tgt_embed(tgt_in) + self.tgt_pos[:, :t],
            tgt_mask=causal,
            tgt_is_causal=True,
        )
        return self.head(hidden)

    def _loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        logits = self(batch["src"], batch["tgt_in"])
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()), logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, _ = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        loss, logits = self._loss(batch)
        self.val_acc(logits.flatten(0, 1), batch["labels"].flatten())
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        loss, logits = self._loss(batch)
        self.test_acc(logits.flatten(0, 1), batch["labels"].flatten())
        self.log("test_loss", loss)
        self.log("test_acc", self.test_acc, prog_bar=True)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        return adamw_one_cycle(self, self.hparams.lr, self.hparams.weight_decay)

