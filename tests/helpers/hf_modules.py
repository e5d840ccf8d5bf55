"""Hugging Face classifiers built from tiny configs, in a LightningModule trained on their own mapping batches, and
the datasets of such batches: what the callback tests run as users of ``transformers`` do; a plain-Trainer project of
such a ViT and its data module (mapping or dataclass batches), which ``lightning-gae compare`` builds by import path."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import transformers
from lightning.pytorch import LightningDataModule, LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset


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


# --- a plain-Trainer project on such batches, for `lightning-gae compare --model/--data` (built from a checkpoint) ---


@dataclasses.dataclass
class ImageBatch:
    """A batch as a dataclass (a ``collate_fn`` builds it), with a Hugging Face batch's names."""

    pixel_values: Tensor
    labels: Tensor


def image_batches(samples: list[dict]) -> ImageBatch:
    return ImageBatch(**{key: torch.stack([s[key] for s in samples]) for key in ("pixel_values", "labels")})


class ImageData(LightningDataModule):
    """24 images as ``{"pixel_values", "labels"}`` mappings (``as_dataclass=True``: :class:`ImageBatch`), 4 a batch."""

    def __init__(self, as_dataclass: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()

    def _loader(self) -> DataLoader:
        data = Batches(lambda i: {"pixel_values": images(i), "labels": torch.tensor(i % 3)}, n=24)
        return DataLoader(data, batch_size=4, collate_fn=image_batches if self.hparams.as_dataclass else None)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()


def pixels(batch) -> Tensor:
    """The images of a mapping or :class:`ImageBatch` batch (also a ``batches: inputs:`` reader)."""
    return batch["pixel_values"] if isinstance(batch, Mapping) else batch.pixel_values


class ViTTakesTheBatch(LightningModule):
    """The tiny ViT built from its saved hyper-parameters, trained on its batches; ``forward(self, batch)``."""

    def __init__(self, num_labels: int = 3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = tiny_vit()

    def forward(self, batch) -> Tensor:
        return self.model(pixel_values=pixels(batch)).logits

    def training_step(self, batch, batch_idx):
        labels = batch["labels"] if isinstance(batch, Mapping) else batch.labels
        return nn.functional.cross_entropy(self.model(pixel_values=pixels(batch)).logits, labels)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.training_step(batch, batch_idx))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class ViTByName(ViTTakesTheBatch):
    """The same module (same weights from the same checkpoint) with the images by name."""

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values=pixel_values).logits


class ViTImagesAsX(ViTTakesTheBatch):
    """``forward(x)`` with mapping batches: x may be the images or the batch, which the signature cannot tell."""

    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=x).logits
