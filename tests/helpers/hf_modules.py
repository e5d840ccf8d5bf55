"""Hugging Face classifiers built from tiny configs, in a LightningModule trained on their own mapping batches, and
the datasets of such batches: what the callback tests run as users of ``transformers`` do."""

from __future__ import annotations

import torch
import transformers
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.utils.data import Dataset


class Batches(Dataset):
    """16 samples, each ``make(i)``: a mapping or a tuple, as a DataLoader collates them."""

    def __init__(self, make, n: int = 16) -> None:
        self.make, self.n = make, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.make(i)


def images(i: int) -> Tensor:
    return torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(i))


def ids_and_mask(i: int) -> tuple[Tensor, Tensor]:
    ids = torch.randint(5, 50, (8,), generator=torch.Generator().manual_seed(i))
    ids[0] = 2
    mask = torch.ones(8, dtype=torch.long)
    if i % 2:
        ids[6:], mask[6:] = 0, 0
    return ids, mask


def tiny_vit() -> nn.Module:
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        num_labels=3))


def tiny_bert(kind: type = transformers.BertForSequenceClassification, **config) -> nn.Module:
    """A 2-layer BERT with hidden size 32 (``config`` over that, e.g. ``initializer_range=0.5`` for logits that
    depend on the tokens at initialisation)."""
    return kind(transformers.BertConfig(**{
        "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 16, "num_labels": 2, **config}))


class HFModule(LightningModule):
    """A Hugging Face classifier trained on its own batches (``model(**batch).loss``); ``forward`` as the test sets it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(**batch).loss)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TextByName(HFModule):
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits
