"""Data with a shortcut the model can learn instead of the task: a watermark on digits, a spurious word in reviews.

Each data module has ``shortcut: bool`` and ``seed``. With ``shortcut=True`` the training set carries a cue that
agrees with the label in ``correlation`` of its samples (95% by default); with ``shortcut=False`` the same cue
is there but drawn independently of the label, so the two variants differ only in what the cue says. The
validation set is shortcut-free in both: the cue is drawn independently of the label, so a model that learned
it loses validation accuracy where it trusts the cue over the evidence.

- :class:`WatermarkedDigitsDataModule`: scikit-learn's digits with a 2x2 square in the top-left corner whose
  grey level names a class (``(c + 1) / 10``). The corner is blank in almost every digit, and the square is
  exactly one patch of the recipe's ViT (``patch_size=2``).
- :class:`SpuriousReviewsDataModule`: the generated reviews of :mod:`recipes.text_rationales` with the word
  ``"friday"`` in most positive reviews and few negative ones (``shortcut=True``). ``"friday"`` is one of the
  fillers: its natural occurrences are replaced, so it appears only where the module puts it. The planted
  sentiment words disagree with the label in ``sentiment_noise`` of the training reviews (the label flipped),
  which makes the cue the better predictor in training, as a shortcut is.

Both expose their cue as a :class:`~lightning_gae.modalities.regions.Region` (``region``, kind ``"suspect"``) and in plain
form (``watermark_mask``, ``spurious_id``), so a config or a test can declare it.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from lightning_gae.modalities.regions import Region
from recipes.common import TensorDictDataset
from recipes.digits import DigitsDataModule
from recipes.text_rationales import FILLERS, NEGATIVE, POSITIVE, VOCAB, ReviewsDataModule, make_reviews

__all__ = [
    "SPURIOUS_WORD",
    "SpuriousReviewsDataModule",
    "WatermarkedDigitsDataModule",
    "add_spurious_word",
    "add_watermark",
    "watermark_mask",
]

SPURIOUS_WORD: str = "friday"
"""The word that predicts the label in the shortcut reviews (a filler: it says nothing about a film)."""


def watermark_mask(image_size: int = 8, size: int = 2) -> Tensor:
    """bool ``[image_size, image_size]``: the ``size x size`` square in the top-left corner."""
    mask = torch.zeros(image_size, image_size, dtype=torch.bool)
    mask[:size, :size] = True
    return mask


def _cue_classes(labels: Tensor, num_classes: int, correlation: float | None, generator: torch.Generator) -> Tensor:
    """The class each sample's cue names: its label with probability ``correlation``, else a uniformly drawn class
    (None: always drawn, independent of the label)."""
    drawn = torch.randint(num_classes, labels.shape, generator=generator)
    if correlation is None:
        return drawn
    agree = torch.rand(labels.shape, generator=generator) < correlation
    return torch.where(agree, labels, drawn)


def add_watermark(images: Tensor, labels: Tensor, correlation: float | None, generator: torch.Generator,
                  num_classes: int = 10, size: int = 2) -> Tensor:
    """Images ``[B, 1, H, W]`` in [0, 1] with the corner square set to the grey level ``(c + 1) / num_classes`` of
    class ``c``: the label's with probability ``correlation``, else a random class's (None: always random).

    >>> images = add_watermark(torch.zeros(2, 1, 8, 8), torch.tensor([0, 9]), 1.0, torch.Generator().manual_seed(0))
    >>> images[:, 0, 0, 0].tolist(), images[:, 0, 2:, 2:].abs().sum().item()
    ([0.10000000149011612, 1.0], 0.0)
    """
    cue = _cue_classes(labels, num_classes, correlation, generator)
    out = images.clone()
    out[:, :, :size, :size] = ((cue + 1).float() / num_classes).view(-1, 1, 1, 1)
    return out


class WatermarkedDigitsDataModule(DigitsDataModule):
    """scikit-learn's digits (:class:`~recipes.digits.DigitsDataModule`'s split) with a class-coded corner square.

    Args:
        shortcut: True: the training square names the label in ``correlation`` of the images; False: it names a
            random class. The validation square is random in both (the shortcut-free set).
        correlation: how often the training square names the label when ``shortcut`` (the rest: a random class).
        batch_size, val_fraction, seed, num_workers, persistent_workers: as :class:`~recipes.digits.DigitsDataModule`;
            ``seed`` also draws the squares.

    Attributes:
        watermark_mask: bool ``[8, 8]``, the square's pixels.
        region: the square as a suspect :class:`~lightning_gae.modalities.regions.Region` named ``"watermark"``.
    """

    def __init__(self, shortcut: bool = True, correlation: float = 0.95, batch_size: int = 64,
                 val_fraction: float = 0.2, seed: int = 0, num_workers: int = 0, persistent_workers: bool = False) -> None:
        if not 0.0 <= correlation <= 1.0:
            raise ValueError(f"correlation must be in [0, 1] (how often the square names the label); got {correlation}")
        super().__init__(batch_size=batch_size, val_fraction=val_fraction, seed=seed, num_workers=num_workers,
                         persistent_workers=persistent_workers)
        self.save_hyperparameters()
        self.shortcut = shortcut
        self.correlation = correlation
        self.watermark_mask = watermark_mask()
        self.region = Region("watermark", "suspect", mask=self.watermark_mask)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        super().setup(stage)
        generator = torch.Generator().manual_seed(self.seed)
        x, y = self.train_set.tensors
        self.train_set = TensorDataset(add_watermark(x, y, self.correlation if self.shortcut else None, generator), y)
        x, y = self.val_set.tensors
        self.val_set = TensorDataset(add_watermark(x, y, None, generator), y)


def add_spurious_word(batch: dict[str, Tensor], p_positive: float, p_negative: float, generator: torch.Generator,
                      word: str = SPURIOUS_WORD) -> dict[str, Tensor]:
    """Reviews of :func:`~recipes.text_rationales.make_reviews` where ``word`` appears once in a positive review with
    probability ``p_positive`` and in a negative one with ``p_negative``, in place of a filler, and nowhere else.

    >>> g = torch.Generator().manual_seed(0)
    >>> batch = add_spurious_word(make_reviews(64, generator=g), 1.0, 0.0, g)
    >>> present = (batch["input_ids"] == VOCAB.index(SPURIOUS_WORD)).sum(dim=1)
    >>> present.tolist() == batch["labels"].tolist()
    True
    """
    ids, labels = batch["input_ids"].clone(), batch["labels"]
    spurious = VOCAB.index(word)
    others = torch.tensor([VOCAB.index(w) for w in FILLERS if w != word])
    # Its natural occurrences (a filler drawn at random) become other fillers: it appears only where put.
    natural = ids == spurious
    ids[natural] = others[torch.randint(len(others), (int(natural.sum()),), generator=generator)]
    fillers = torch.isin(ids, others)
    chance = torch.where(labels == 1, p_positive, p_negative)
    present = torch.rand(labels.shape, generator=generator) < chance
    # One filler per chosen review, uniformly among its fillers.
    keys = torch.rand(ids.shape, generator=generator).masked_fill(~fillers, 2.0)
    position = keys.argmin(dim=1)
    rows = torch.nonzero(present & fillers.any(dim=1)).flatten()
    ids[rows, position[rows]] = spurious
    return {**batch, "input_ids": ids}


def _flip_sentiment(batch: dict[str, Tensor], noise: float, generator: torch.Generator) -> dict[str, Tensor]:
    """Reviews whose planted words take the other polarity in ``noise`` of them; the label stays, so the words
    predict it in ``1 - noise`` of the reviews."""
    ids, labels = batch["input_ids"].clone(), batch["labels"]
    flip = torch.rand(labels.shape, generator=generator) < noise
    for source, target in ((POSITIVE, NEGATIVE), (NEGATIVE, POSITIVE)):
        for a, b in zip(source, target):
            swap = flip[:, None] & (batch["input_ids"] == VOCAB.index(a))
            ids[swap] = VOCAB.index(b)
    return {**batch, "input_ids": ids}


class SpuriousReviewsDataModule(ReviewsDataModule):
    """Generated reviews (:mod:`recipes.text_rationales`) with a word that predicts the label in training only.

    Args:
        shortcut: True: ``"friday"`` is in ``correlation`` of the positive training reviews and ``1 - correlation``
            of the negative ones; False: in half of each. Validation: half of each in both (shortcut-free).
        correlation: how strongly the word goes with the positive label when ``shortcut``.
        sentiment_noise: the share of training reviews whose planted sentiment words have the polarity opposite
            to their label (both variants; validation has none).
        num_train, num_val, max_length, batch_size, seed, num_workers: as
            :class:`~recipes.text_rationales.ReviewsDataModule`.

    Attributes:
        spurious_id: the word's id in :data:`~recipes.text_rationales.VOCAB`.
        region: the word as a suspect :class:`~lightning_gae.modalities.regions.Region` named ``"spurious_word"``.
    """

    def __init__(self, shortcut: bool = True, correlation: float = 0.95, sentiment_noise: float = 0.2,
                 num_train: int = 4000, num_val: int = 512, max_length: int = 32, batch_size: int = 64, seed: int = 0,
                 num_workers: int = 0) -> None:
        for name, value in (("correlation", correlation), ("sentiment_noise", sentiment_noise)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]; got {value}")
        super().__init__(num_train, num_val, max_length, batch_size, seed, num_workers)
        self.save_hyperparameters()  # this class's arguments too: its setup reads them
        self.spurious_id = VOCAB.index(SPURIOUS_WORD)
        self.region = Region("spurious_word", "suspect", token_ids=[self.spurious_id])

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        h = self.hparams
        generator = torch.Generator().manual_seed(h.seed)
        train = make_reviews(h.num_train, h.max_length, generator=generator)
        p = (h.correlation, 1.0 - h.correlation) if h.shortcut else (0.5, 0.5)
        train = _flip_sentiment(add_spurious_word(train, *p, generator), h.sentiment_noise, generator)
        # The rationales of a flipped review still mark its planted words, which now argue for the other class.
        self.train_set = TensorDictDataset(train)
        val = make_reviews(h.num_val, h.max_length, generator=torch.Generator().manual_seed(h.seed + 1))
        self.val_set = TensorDictDataset(add_spurious_word(val, 0.5, 0.5, generator))
