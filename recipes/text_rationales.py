"""Generated reviews whose label is decided by planted words, and two small BERT-style classifiers.

Each review is ``[CLS] words [SEP]`` padded to ``max_length``: filler words that say nothing about
the label (``"the"``, ``"plot"``, ``"actors"``, ...) with one to three sentiment words planted at
random positions, all of the label's polarity (``"excellent"`` for positive, ``"dreadful"`` for
negative). The planted words are the rationale: nothing else decides the label, so an explanation
is right when its relevance sits on them. Batches carry them as ``rationales`` and the callback
logs rationale agreement (``rationale_{token_f1,auprc}``).

The words are the ids: :data:`VOCAB` is a fixed word list, so no tokenizer is needed, and
:class:`ReviewTokens` is the ``TextTokens`` that draws and removes them.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy

from lightning_gae.modalities import TextTokens
from recipes.common import TensorDictDataset, adamw_one_cycle
from recipes.vit import _init_weights

__all__ = [
    "NEGATIVE",
    "POSITIVE",
    "VOCAB",
    "BertReviewClassifier",
    "ReviewClassifier",
    "ReviewEncoder",
    "ReviewTokens",
    "ReviewsDataModule",
    "make_reviews",
]

SPECIALS: tuple[str, ...] = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, CLS_ID, SEP_ID, MASK_ID = range(4)
POSITIVE: tuple[str, ...] = ("excellent", "wonderful", "superb", "brilliant", "delightful", "moving")
NEGATIVE: tuple[str, ...] = ("terrible", "awful", "dreadful", "boring", "tedious", "clumsy")
FILLERS: tuple[str, ...] = (
    "the", "a", "this", "that", "movie", "film", "plot", "story", "actors", "cast", "director", "scene",
    "music", "ending", "script", "was", "is", "were", "and", "but", "with", "of", "in", "it", "i", "we",
    "saw", "watched", "thought", "felt", "about", "very", "quite", "really", "at", "times", "overall",
    "character", "camera", "dialogue", "pace", "friday", "cinema", "seats", "popcorn", "long", "short",
)
VOCAB: tuple[str, ...] = SPECIALS + POSITIVE + NEGATIVE + FILLERS
"""Every word; a word's id is its index."""
CLASS_NAMES: tuple[str, ...] = ("negative", "positive")


def make_reviews(
    num_samples: int,
    max_length: int = 32,
    min_words: int = 8,
    max_planted: int = 3,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Generate reviews whose label is the polarity of the planted sentiment words.

    Args:
        num_samples: how many reviews.
        max_length: length with ``[CLS]`` and ``[SEP]``, padded with ``[PAD]``.
        min_words: the fewest words between ``[CLS]`` and ``[SEP]`` (at most ``max_length - 2``).
        max_planted: each review has 1..max_planted sentiment words of its label's polarity.
        generator: the random source (seed it for the same reviews every time).

    Returns:
        ``input_ids [N, max_length]``, ``attention_mask [N, max_length]`` (1 = token),
        ``rationales [N, max_length]`` (1 at the planted words) and ``labels [N]`` (1 = positive),
        all int64.

    >>> batch = make_reviews(2, max_length=12, generator=torch.Generator().manual_seed(0))
    >>> words = [VOCAB[i] for i in batch["input_ids"][0].tolist()]
    >>> planted = [w for w, r in zip(words, batch["rationales"][0].tolist()) if r]
    >>> all(w in (POSITIVE if batch["labels"][0] else NEGATIVE) for w in planted) and len(planted) >= 1
    True
    """
    if not 1 <= max_planted <= min_words <= max_length - 2:
        raise ValueError(f"need 1 <= max_planted ({max_planted}) <= min_words ({min_words}) <= max_length - 2 "
                         f"({max_length - 2})")
    n, g = num_samples, generator
    labels = torch.randint(2, (n,), generator=g)
    length = torch.randint(min_words, max_length - 1, (n,), generator=g)  # words between [CLS] and [SEP]
    planted = torch.randint(1, max_planted + 1, (n,), generator=g)
    fillers = torch.tensor([VOCAB.index(w) for w in FILLERS])
    words = fillers[torch.randint(len(FILLERS), (n, max_length - 2), generator=g)]
    # The planted positions: the first `planted` of a random permutation of the review's own words.
    position = torch.arange(max_length - 2)
    keys = torch.rand(n, max_length - 2, generator=g).masked_fill(position >= length[:, None], 2.0)
    rank = keys.argsort(dim=1).argsort(dim=1)
    is_planted = rank < planted[:, None]
    sentiment = torch.stack([torch.tensor([VOCAB.index(w) for w in NEGATIVE]),
                             torch.tensor([VOCAB.index(w) for w in POSITIVE])])
    chosen = sentiment[labels[:, None], torch.randint(len(POSITIVE), (n, max_length - 2), generator=g)]
    words = torch.where(is_planted, chosen, words)
    words = torch.where(position < length[:, None], words, torch.where(position == length[:, None], SEP_ID, PAD_ID))
    input_ids = torch.cat([torch.full((n, 1), CLS_ID), words, torch.full((n, 1), PAD_ID)], dim=1)
    # A review of max_length - 2 words ends with [SEP] in the last column.
    input_ids[:, -1] = torch.where(length == max_length - 2, SEP_ID, PAD_ID)
    rationales = torch.cat([torch.zeros(n, 1, dtype=torch.long), is_planted.long(), torch.zeros(n, 1, dtype=torch.long)], 1)
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD_ID).long(),
        "rationales": rationales,
        "labels": labels,
    }


class ReviewsDataModule(pl.LightningDataModule):
    """Reviews of :func:`make_reviews`, generated once from ``seed``; validation from a different stream.

    Batches are dicts of ``input_ids``, ``attention_mask`` (the model's inputs), ``labels`` and
    ``rationales``. ``test_dataloader`` serves the validation set.
    """

    def __init__(self, num_train: int = 4000, num_val: int = 512, max_length: int = 32, batch_size: int = 64,
                 seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.class_names = list(CLASS_NAMES)
        self.train_set: TensorDictDataset | None = None
        self.val_set: TensorDictDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        h = self.hparams
        self.train_set = TensorDictDataset(make_reviews(h.num_train, h.max_length, generator=torch.Generator().manual_seed(h.seed)))
        self.val_set = TensorDictDataset(make_reviews(h.num_val, h.max_length, generator=torch.Generator().manual_seed(h.seed + 1)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


class ReviewTokens(TextTokens):
    """:class:`~lightning_gae.TextTokens` of the recipe's :data:`VOCAB`: removed words become ``[MASK]``
    (or leave the attention mask, ``removal="attention"``); ``[CLS]``/``[SEP]`` are never removed."""

    def __init__(self, removal: str = "replace", cmap: str | None = None) -> None:
        super().__init__(vocab=VOCAB, special_ids=(PAD_ID, CLS_ID, SEP_ID, MASK_ID), pad_id=PAD_ID, mask_id=MASK_ID,
                         removal=removal, cmap=cmap)


class _EncoderLayer(nn.Module):
    """BERT's post-norm layer: ``norm1(x + attention(x))`` then ``norm2(x + mlp(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))
        self.norm2 = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, keep: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        # Looked up on F at call time, so lightning-gae's capture sees the attention probabilities.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :],
                                             dropout_p=self.dropout if self.training else 0.0)
        x = self.norm1(x + self.drop(self.proj(out.transpose(1, 2).reshape(b, n, d))))
        return self.norm2(x + self.drop(self.mlp(x)))


class ReviewEncoder(nn.Module):
    """A small BERT-style encoder: word and position embeddings, post-norm layers, a linear head on ``[CLS]``."""

    def __init__(self, vocab_size: int = len(VOCAB), max_length: int = 32, dim: int = 64, depth: int = 2,
                 heads: int = 4, mlp_ratio: float = 2.0, dropout: float = 0.1, num_classes: int = 2) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.words = nn.Embedding(vocab_size, dim)
        self.word_pos = nn.Parameter(torch.zeros(1, max_length, dim))
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(_EncoderLayer(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.word_pos, std=0.02)
        self.apply(_init_weights)
        nn.init.normal_(self.words.weight, std=0.02)

    def get_input_embeddings(self) -> nn.Embedding:
        """The word embedding, where Captum's methods attribute token ids (the Hugging Face name)."""
        return self.words

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits ``[B, num_classes]`` of ids ``[B, T]`` (``attention_mask`` 1 = token, 0 = padding)."""
        keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        x = self.norm(self.words(input_ids) + self.word_pos[:, : input_ids.shape[1]])
        for layer in self.layers:
            x = layer(x, keep)
        return self.head(x[:, 0])


class _ReviewModule(pl.LightningModule):
    """Cross-entropy on ``labels``, AdamW with a one-cycle schedule (norms, biases, ``*_pos`` not decayed); ``self.model(input_ids, attention_mask)`` gives logits."""

    model: nn.Module

    def __init__(self) -> None:
        super().__init__()
        self.val_acc = MulticlassAccuracy(num_classes=2, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=2, average="micro")

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits ``[B, 2]`` (0 = negative, 1 = positive)."""
        return self._logits(self.model(input_ids=input_ids, attention_mask=attention_mask))

    @staticmethod
    def _logits(output: Any) -> Tensor:
        return output if isinstance(output, Tensor) else output.logits

    def _step(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        logits = self(batch["input_ids"], batch["attention_mask"])
        return logits, F.cross_entropy(logits, batch["labels"])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        _, loss = self._step(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits, loss = self._step(batch)
        self.val_acc(logits, batch["labels"])
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits, loss = self._step(batch)
        self.test_acc(logits, batch["labels"])
        self.log("test_loss", loss)
        self.log("test_acc", self.test_acc, prog_bar=True)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        return adamw_one_cycle(self, self.hparams.lr, self.hparams.weight_decay)


class ReviewClassifier(_ReviewModule):
    """The recipe's own encoder (:class:`ReviewEncoder`, fused SDPA attention) as a LightningModule."""

    def __init__(self, max_length: int = 32, dim: int = 64, depth: int = 2, heads: int = 4, mlp_ratio: float = 2.0,
                 dropout: float = 0.1, lr: float = 3e-3, weight_decay: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = ReviewEncoder(len(VOCAB), max_length, dim, depth, heads, mlp_ratio, dropout)


class BertReviewClassifier(_ReviewModule):
    """Hugging Face ``BertForSequenceClassification`` built from a small ``BertConfig`` (no download)."""

    def __init__(self, max_length: int = 32, hidden_size: int = 64, num_hidden_layers: int = 2,
                 num_attention_heads: int = 4, intermediate_size: int = 128, dropout: float = 0.1,
                 attn_implementation: str = "sdpa", lr: float = 3e-3, weight_decay: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        # Optional dependency of the library; this recipe needs it.
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(vocab_size=len(VOCAB), hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                            num_attention_heads=num_attention_heads, intermediate_size=intermediate_size,
                            max_position_embeddings=max_length, hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout, pad_token_id=PAD_ID, num_labels=2)
        self.model = BertForSequenceClassification._from_config(config, attn_implementation=attn_implementation)
