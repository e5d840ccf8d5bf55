"""Generated images of one coloured shape on grey clutter, with captions, shape masks and content words.

Each image is ``3 x image_size x image_size`` in [0, 1]: a grey background with noise, a few grey
bars (clutter, no colour), and one filled shape (circle, square, triangle or cross) in one
saturated colour. The caption names it, ``"a red circle"``, among filler words that say nothing
about the image (``"look here is a red circle in this picture"``). So the ground truth of an
explanation is known: the shape's pixel mask and the positions of the colour and shape words.

Text needs no tokenizer: :data:`VOCAB` is a fixed word list and the ids are its indices.
"""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_gae.modalities import TextTokens
from recipes.common import TensorDictDataset

__all__ = [
    "COLOURS",
    "SHAPES",
    "VOCAB",
    "CaptionTokens",
    "ShapesDataModule",
    "caption_ids",
    "decode",
    "make_shapes",
    "render_shapes",
]

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.95, 0.1, 0.1),
    "green": (0.1, 0.85, 0.1),
    "blue": (0.15, 0.25, 0.95),
    "yellow": (0.95, 0.9, 0.1),
    "purple": (0.7, 0.1, 0.9),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
FILLERS: tuple[str, ...] = (
    "look", "here", "is", "this", "picture", "shows", "there", "we", "see", "in", "the", "image",
    "of", "with", "some", "noise", "on", "it", "photo", "just",
)
SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<mask>", "<eos>")
VOCAB: tuple[str, ...] = SPECIALS + ("a",) + tuple(COLOURS) + SHAPES + FILLERS
"""Every word, its id is its index. ``<eos>`` is not id 2: Hugging Face CLIP treats ``eos_token_id == 2``
as a legacy config and pools at the largest id instead of at the EOS."""
PAD_ID, BOS_ID, MASK_ID, EOS_ID = range(4)
_IDS = {word: i for i, word in enumerate(VOCAB)}


class CaptionTokens(TextTokens):
    """:class:`~lightning_gae.TextTokens` of the captions' :data:`VOCAB`; ``<pad> <bos> <mask> <eos>`` are special,
    a removed word becomes ``<mask>``."""

    def __init__(self, cmap: str | None = None) -> None:
        super().__init__(vocab=VOCAB, special_ids=(PAD_ID, BOS_ID, MASK_ID, EOS_ID), pad_id=PAD_ID, mask_id=MASK_ID,
                         cmap=cmap)


def caption_ids(words: list[str]) -> list[int]:
    """``<bos> words <eos>`` as ids (no padding)."""
    unknown = [w for w in words if w not in _IDS]
    if unknown:
        raise ValueError(f"words {unknown} are not in the recipe's VOCAB")
    return [BOS_ID, *(_IDS[w] for w in words), EOS_ID]


def decode(ids: Tensor) -> list[str]:
    """The words of one id sequence, padding dropped."""
    return [VOCAB[i] for i in ids.tolist() if i != PAD_ID]


def _shape_masks(dy: Tensor, dx: Tensor, r: Tensor) -> dict[str, Tensor]:
    arm = 0.3 * r
    return {
        "circle": dy**2 + dx**2 <= r**2,
        "square": (dy.abs() <= 0.8 * r) & (dx.abs() <= 0.8 * r),
        "diamond": dy.abs() + dx.abs() <= r,
        # Apex up: the half-width grows linearly from 0 at the top (y = -r) to r at the base (y = +r).
        "triangle": (dy >= -r) & (dy <= r) & (dx.abs() <= (dy + r) / 2),
        "cross": ((dy.abs() <= arm) & (dx.abs() <= r)) | ((dx.abs() <= arm) & (dy.abs() <= r)),
        "bar": (dy.abs() <= 0.35 * r) & (dx.abs() <= r),
        "pillar": (dx.abs() <= 0.35 * r) & (dy.abs() <= r),
    }


def render_shapes(shape: Tensor, centre: Tensor, radius: Tensor, image_size: int) -> Tensor:
    """Boolean masks ``[N, H, W]`` of filled shapes (indices into :data:`SHAPES`), centres ``[N, 2]`` (y, x)
    and radii ``[N]`` in pixels."""
    coords = torch.arange(image_size, dtype=torch.float32) + 0.5
    dy = coords.view(1, -1, 1) - centre[:, 0].view(-1, 1, 1)
    dx = coords.view(1, 1, -1) - centre[:, 1].view(-1, 1, 1)
    every = _shape_masks(dy, dx, radius.view(-1, 1, 1))
    masks = torch.stack([every[name] for name in SHAPES], dim=1)
    return masks[torch.arange(len(shape)), shape]


def make_shapes(
    num_samples: int,
    image_size: int = 32,
    max_fillers: int = 5,
    max_length: int = 16,
    mismatch_fraction: float = 0.0,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Generate images, captions and their ground truth.

    Args:
        num_samples: how many.
        image_size: image height and width in pixels.
        max_fillers: each caption has 0..max_fillers filler words, split at random around "a colour shape".
        max_length: caption length with ``<bos>``/``<eos>``, padded with ``<pad>``.
        mismatch_fraction: this share of captions name another concept than the image shows (another
            colour, another shape, or both, one third each); 0 for captions that always match.

    Returns:
        ``pixel_values [N, 3, H, W]`` float32 in [0, 1]; ``masks [N, H, W]`` bool, the shape's pixels (with its outline);
        ``input_ids [N, max_length]``; ``attention_mask [N, max_length]`` (1 = token);
        ``rationales [N, max_length]`` (1 at the colour and shape words); ``colour``, ``shape``
        (the image's) and ``match`` (1 if the caption names the image's concept) ``[N]`` int64.
    """
    if max_length < 5 + max_fillers:
        raise ValueError(f"max_length ({max_length}) must be >= 5 + max_fillers ({max_fillers}): "
                         "<bos> a colour shape <eos> plus the fillers")
    if max_fillers < 0:
        raise ValueError(f"max_fillers must be >= 0; got {max_fillers}")
    if not 0.0 <= mismatch_fraction <= 1.0:
        raise ValueError(f"mismatch_fraction must be in [0, 1]; got {mismatch_fraction}")
    n, size = num_samples, image_size
    g = generator
    colour = torch.randint(len(COLOURS), (n,), generator=g)
    shape = torch.randint(len(SHAPES), (n,), generator=g)
    radius = size * (0.14 + 0.12 * torch.rand(n, generator=g))
    # One pixel of margin for the outline.
    centre = 1 + radius[:, None] + torch.rand(n, 2, generator=g) * (size - 2 - 2 * radius[:, None])
    filled = render_shapes(shape, centre, radius, size)

    background = 0.15 + 0.35 * torch.rand(n, 1, 1, 1, generator=g)
    grey = background + 0.06 * torch.randn(n, 1, size, size, generator=g)
    # Clutter: a few thin grey bars anywhere, so the shape is not the only structure in the image.
    num_bars = 4
    top = torch.randint(size, (n, num_bars, 1, 1), generator=g)
    left = torch.randint(size, (n, num_bars, 1, 1), generator=g)
    horizontal = torch.rand(n, num_bars, 1, 1, generator=g) < 0.5
    long_side = torch.randint(6, 16, (n, num_bars, 1, 1), generator=g)
    height = torch.where(horizontal, 2, long_side)
    width = torch.where(horizontal, long_side, 2)
    ys = torch.arange(size).view(1, 1, -1, 1)
    xs = torch.arange(size).view(1, 1, 1, -1)
    bars = (ys >= top) & (ys < top + height) & (xs >= left) & (xs < left + width)
    shade = 0.3 + 0.6 * torch.rand(n, num_bars, 1, 1, generator=g)
    grey = torch.where(bars.any(dim=1, keepdim=True), (bars * shade).amax(dim=1, keepdim=True), grey)
    rgb = torch.tensor(list(COLOURS.values()))[colour].view(n, 3, 1, 1)
    # A dark outline around the shape gives every colour the same edges, so that shape can be learned
    # apart from colour (without it small ViTs barely learn shape at all); the mask includes it.
    outlined = F.max_pool2d(filled[:, None].float(), kernel_size=3, stride=1, padding=1) > 0
    shape_rgb = torch.where(filled[:, None], rgb, 0.05)
    pixel_values = torch.where(outlined, shape_rgb, grey.expand(n, 3, size, size)).clamp(0.0, 1.0)
    masks = outlined[:, 0]

    mismatched = torch.rand(n, generator=g) < mismatch_fraction
    kind = torch.randint(3, (n,), generator=g)  # 0: colour differs, 1: shape differs, 2: both
    # A nonzero shift modulo the count always lands on another colour/shape.
    said_colour = torch.where(mismatched & (kind != 1),
                              (colour + torch.randint(1, len(COLOURS), (n,), generator=g)) % len(COLOURS), colour)
    said_shape = torch.where(mismatched & (kind != 0),
                             (shape + torch.randint(1, len(SHAPES), (n,), generator=g)) % len(SHAPES), shape)

    # Caption: <bos>, fillers[:before], "a", colour, shape, fillers[before:k], <eos>, padding.
    num_fillers = torch.randint(max_fillers + 1, (n, 1), generator=g)
    before = (torch.rand(n, 1, generator=g) * (num_fillers + 1)).long()
    slots = max(max_fillers, 1)  # one unused slot keeps the gather below valid when there are no fillers
    filler_ids = torch.tensor([_IDS[w] for w in FILLERS])[torch.randint(len(FILLERS), (n, slots), generator=g)]
    colour_ids = torch.tensor([_IDS[w] for w in COLOURS])[said_colour]
    shape_ids = torch.tensor([_IDS[w] for w in SHAPES])[said_shape]
    content = torch.stack([torch.full((n,), _IDS["a"]), colour_ids, shape_ids], dim=1)
    t = torch.arange(max_length - 1).view(1, -1)  # word index after <bos>
    in_content = (t >= before) & (t < before + 3)
    words = torch.where(in_content, content.gather(1, (t - before).clamp(0, 2)),
                        filler_ids.gather(1, torch.where(t < before, t, t - 3).clamp(0, slots - 1)))
    words = torch.where(t < num_fillers + 3, words, torch.where(t == num_fillers + 3, EOS_ID, PAD_ID))
    input_ids = torch.cat([torch.full((n, 1), BOS_ID), words], dim=1)
    rationales = torch.cat([torch.zeros(n, 1, dtype=torch.int64), (in_content & (t > before)).long()], dim=1)
    return {
        "pixel_values": pixel_values,
        "masks": masks,
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD_ID).long(),
        "rationales": rationales,
        "colour": colour,
        "shape": shape,
        "match": (~mismatched).long(),
    }


class ShapesDataModule(pl.LightningDataModule):
    """Shapes and captions (:func:`make_shapes`) generated once from ``seed``, for one of two tasks.

    Batches are dicts of the model inputs ``pixel_values``, ``input_ids``, ``attention_mask``, the
    ground truth ``masks`` (image) and ``rationales`` (caption), and ``labels``:

    * ``task="contrastive"`` (image-text models, CLIP-style): captions always match; ``labels`` is
      the concept id ``colour * len(SHAPES) + shape``, so a loss can treat pairs of the same concept
      in a batch as positives.
    * ``task="matching"``: half the captions name another concept (``mismatch_fraction``);
      ``labels`` is 1 for a matching caption, 0 otherwise.

    ``test_dataloader`` serves the validation set.
    """

    def __init__(
        self,
        task: Literal["contrastive", "matching"] = "contrastive",
        num_train: int = 8192,
        num_val: int = 1024,
        image_size: int = 32,
        max_fillers: int = 5,
        max_length: int = 16,
        mismatch_fraction: float = 0.5,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if task not in ("contrastive", "matching"):
            raise ValueError(f"task={task!r}; choose 'contrastive' or 'matching'")
        self.save_hyperparameters()
        self.train_set: TensorDictDataset | None = None
        self.val_set: TensorDictDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        mismatch = hp.mismatch_fraction if hp.task == "matching" else 0.0
        data = make_shapes(hp.num_train + hp.num_val, hp.image_size, hp.max_fillers, hp.max_length, mismatch,
                           torch.Generator().manual_seed(hp.seed))
        if hp.task == "contrastive":
            labels = data["colour"] * len(SHAPES) + data["shape"]
        else:
            labels = data["match"]
        keys = ("pixel_values", "input_ids", "attention_mask", "masks", "rationales")
        batch = {k: data[k] for k in keys} | {"labels": labels}
        self.train_set = TensorDictDataset({k: v[: hp.num_train] for k, v in batch.items()})
        self.val_set = TensorDictDataset({k: v[hp.num_train:] for k, v in batch.items()})

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()
