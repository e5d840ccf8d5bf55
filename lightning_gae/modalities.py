"""From token relevance back to the input, and how to draw it: images, text, tabular features.

``explain()`` returns relevance per *token* (``Explanation.tokens``, ``[B, N]``). A modality knows
how the model made its tokens from the input, maps that relevance onto the input (pixels, token
ids, features) and renders one sample for a human. The classes are plain, with typed
``__init__`` arguments, so LightningCLI can build them from YAML::

    modality:
      class_path: lightning_gae.modalities.ImageTokens
      init_args: {patch_size: 2, prefix_tokens: 1}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_gae import visualize

__all__ = ["ImageTokens", "Modality", "TabularTokens", "TextTokens"]


def _check_cmap(cmap: str) -> None:
    # Fail when the config is read, not at the first rendering many steps into training.
    if cmap not in matplotlib.colormaps:
        raise ValueError(f"cmap={cmap!r} is not a matplotlib colormap; e.g. 'jet', 'viridis', 'Reds'")


def _check_tokens(tokens: Tensor, batch: int) -> None:
    if tokens.dim() != 2 or tokens.shape[0] != batch:
        raise ValueError(f"tokens must be [B, N] with B={batch} as in the inputs; got shape {tuple(tokens.shape)}")


class Modality(ABC):
    """How a model's tokens relate to its input, for mapping relevance back and drawing it."""

    @abstractmethod
    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Token relevance ``[B, N]`` mapped onto the input space of ``inputs`` (one batch), float32."""

    @abstractmethod
    def render(self, x: Tensor, relevance: Tensor | None, title: str) -> np.ndarray:
        """One sample ``x`` with its input-space relevance (or alone, for None) as uint8 ``[h, w, 3]``."""


class ImageTokens(Modality):
    """ViT-style images: ``prefix_tokens`` (CLS, distillation, ...) then one token per patch, row-major.

    Args:
        patch_size: side of a square patch in pixels.
        prefix_tokens: tokens before the patches (1 for a CLS token, 0 for none, 2 for DeiT).
        mean: per-channel mean used to normalise the inputs, undone for display.
        std: per-channel standard deviation used to normalise the inputs, undone for display.
        cmap: matplotlib colormap of the heatmap.
        alpha: weight of the heatmap over the image.

    Example::

        modality = ImageTokens(patch_size=16, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
        pixels = modality.to_input(explain(vit, images).tokens, images)   # [B, H, W]
    """

    def __init__(
        self,
        patch_size: int,
        prefix_tokens: int = 1,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        cmap: str = "jet",
        alpha: float = 0.5,
    ) -> None:
        if patch_size < 1 or prefix_tokens < 0:
            raise ValueError(f"patch_size must be >= 1 and prefix_tokens >= 0; got {patch_size} and {prefix_tokens}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1]; got {alpha}")
        _check_cmap(cmap)
        self.patch_size = patch_size
        self.prefix_tokens = prefix_tokens
        self.mean = None if mean is None else tuple(float(m) for m in mean)
        self.std = None if std is None else tuple(float(s) for s in std)
        self.cmap = cmap
        self.alpha = alpha

    def __repr__(self) -> str:
        return f"ImageTokens(patch_size={self.patch_size}, prefix_tokens={self.prefix_tokens})"

    def to_input(self, tokens: Tensor, inputs: Tensor) -> Tensor:
        """Patch relevance upsampled to pixels.

        Args:
            tokens: ``[B, N]`` token relevance, ``N = prefix_tokens + (H // p) * (W // p)``.
            inputs: ``[B, C, H, W]`` the images the tokens came from (only the shape is used).

        Returns:
            float32 ``[B, H, W]``: the patch grid (row-major), bilinearly upsampled; not normalised.

        Raises:
            ValueError: if the token count does not fit ``patch_size`` and ``prefix_tokens``.
        """
        if not isinstance(inputs, Tensor) or inputs.dim() != 4:
            raise ValueError(f"ImageTokens needs images [B, C, H, W]; got {getattr(inputs, 'shape', type(inputs).__name__)}")
        _check_tokens(tokens, inputs.shape[0])
        height, width = inputs.shape[-2:]
        rows, cols = height // self.patch_size, width // self.patch_size
        if tokens.shape[1] - self.prefix_tokens != rows * cols:
            guess = ImageTokens.infer(inputs, tokens.shape[1])
            hint = f"; patch_size={guess.patch_size}, prefix_tokens={guess.prefix_tokens} would fit" if guess else ""
            raise ValueError(
                f"{tokens.shape[1]} tokens do not fit {height}x{width} images with patch_size={self.patch_size} and "
                f"prefix_tokens={self.prefix_tokens}, which give {self.prefix_tokens} + {rows}x{cols} = "
                f"{self.prefix_tokens + rows * cols} tokens{hint}"
            )
        grid = tokens[:, self.prefix_tokens :].float().reshape(-1, 1, rows, cols)
        return F.interpolate(grid, size=(height, width), mode="bilinear", align_corners=False)[:, 0]

    def display_image(self, x: Tensor) -> Tensor:
        """One image ``[C, H, W]`` (C = 1 or 3) as displayable RGB ``[H, W, 3]`` in [0, 1], normalisation undone."""
        if x.dim() != 3 or x.shape[0] not in (1, 3):
            raise ValueError(f"display_image needs one grey or RGB image [C, H, W] with C in (1, 3); got {tuple(x.shape)}")
        image = x.detach().float().cpu()
        for stats, name in ((self.std, "std"), (self.mean, "mean")):
            if stats is not None and len(stats) not in (1, image.shape[0]):
                raise ValueError(f"{name} has {len(stats)} entries for an image with {image.shape[0]} channels")
        if self.std is not None:
            image = image * torch.tensor(self.std).view(-1, 1, 1)
        if self.mean is not None:
            image = image + torch.tensor(self.mean).view(-1, 1, 1)
        return image.clamp(0.0, 1.0).expand(3, -1, -1).permute(1, 2, 0).contiguous()

    def render(self, x: Tensor, relevance: Tensor | None, title: str) -> np.ndarray:
        """The image ``[C, H, W]`` under its relevance ``[H, W]`` (min-max normalised; None: the image alone), titled.

        Returns:
            uint8 ``[h, w, 3]``, tiny images enlarged to about 128 px.
        """
        image = self.display_image(x)
        if relevance is not None:
            image = visualize.overlay(image, relevance.detach().float().cpu(), cmap=self.cmap, alpha=self.alpha)
        return visualize.titled_image(image, title)

    @classmethod
    def infer(cls, inputs: object, num_tokens: int) -> ImageTokens | None:
        """Guess the patching from the input shape and the token count, or None.

        ``inputs`` must be a floating ``[B, C, H, H]`` tensor; the guess is the patch size ``p`` and prefix
        count ``k`` (tried in the order 1, 0, 2) with ``num_tokens == k + (H // p) ** 2`` and ``p`` dividing ``H``.
        """
        if not (isinstance(inputs, Tensor) and inputs.dim() == 4 and inputs.is_floating_point()):
            return None
        side = inputs.shape[-1]
        if inputs.shape[-2] != side:
            return None
        for prefix in (1, 0, 2):
            cells = num_tokens - prefix
            rows = round(cells**0.5) if cells > 0 else 0
            if rows > 0 and rows * rows == cells and side % rows == 0:
                return cls(side // rows, prefix)
        return None


class TextTokens(Modality):
    """Text: one token per input id, so relevance is already aligned with ``input_ids``.

    Args:
        tokenizer: a Hugging Face tokenizer (or a name/path to load one with ``AutoTokenizer``) that
            turns ids into strings; also the default source of ``special_ids`` and ``pad_id``.
        vocab: id -> string, used when there is no tokenizer.
        special_ids: ids drawn grey and left out of the colour scale (``[CLS]``, ``[SEP]``, which
            otherwise often take most of the relevance); None means the tokenizer's special ids.
        pad_id: padding id, omitted from the drawing and zeroed when no ``attention_mask`` is given;
            None means the tokenizer's.
        cmap: matplotlib colormap of the token backgrounds.

    Example::

        modality = TextTokens(tokenizer)
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        per_id = modality.to_input(explain(bert, batch).tokens, batch)   # [B, T]
    """

    def __init__(
        self,
        tokenizer: Any = None,
        vocab: Sequence[str] | None = None,
        special_ids: Sequence[int] | None = None,
        pad_id: int | None = None,
        cmap: str = "Reds",
    ) -> None:
        _check_cmap(cmap)
        if isinstance(tokenizer, str):
            # Optional dependency: only a tokenizer given by name needs transformers here.
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self.vocab = None if vocab is None else list(vocab)
        if special_ids is None:
            special_ids = getattr(tokenizer, "all_special_ids", ())
        self.special_ids = frozenset(int(i) for i in special_ids)
        self.pad_id = getattr(tokenizer, "pad_token_id", None) if pad_id is None else pad_id
        self.cmap = cmap

    def __repr__(self) -> str:
        source = type(self.tokenizer).__name__ if self.tokenizer is not None else ("vocab" if self.vocab else "ids")
        return f"TextTokens({source}, pad_id={self.pad_id})"

    @staticmethod
    def _input_ids(inputs: Any) -> Tensor:
        ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            raise ValueError("TextTokens needs input_ids [B, T]: a tensor, or a mapping (a tokenizer's output) with 'input_ids'")
        return ids

    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Relevance per input id.

        Args:
            tokens: ``[B, T]`` token relevance.
            inputs: ``input_ids [B, T]``, or a mapping with ``input_ids`` (and optionally ``attention_mask``).

        Returns:
            float32 ``[B, T]``: the same values in place (special tokens kept), padding 0.
        """
        ids = self._input_ids(inputs)
        _check_tokens(tokens, ids.shape[0])
        if tokens.shape[1] != ids.shape[1]:
            raise ValueError(f"{tokens.shape[1]} token relevances for {ids.shape[1]} input ids; TextTokens expects one per id")
        mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
        if isinstance(mask, Tensor) and mask.shape == ids.shape:
            keep = mask != 0
        elif self.pad_id is not None:
            keep = ids != self.pad_id
        else:
            return tokens.float().clone()
        return tokens.float().masked_fill(~keep.to(tokens.device), 0.0)

    def token_strings(self, ids: Sequence[int] | Tensor) -> list[str]:
        """Display strings of ``ids``: the tokenizer's tokens, else ``vocab`` entries, else the ids."""
        values = ids.tolist() if isinstance(ids, Tensor) else [int(i) for i in ids]
        if self.tokenizer is not None:
            return list(self.tokenizer.convert_ids_to_tokens(values))
        if self.vocab is not None:
            return [self.vocab[i] for i in values]
        return [str(i) for i in values]

    def render(self, ids: Tensor, relevance: Tensor | None, title: str) -> np.ndarray:
        """A strip of the tokens ``[T]`` coloured by relevance ``[T]`` (None: uncoloured), padding omitted.

        Returns:
            uint8 ``[h, w, 3]``; lines wrap at 720 px.
        """
        ids = ids.detach().cpu().reshape(-1)
        values = torch.zeros(ids.shape) if relevance is None else relevance.detach().float().cpu().reshape(-1)
        if values.shape != ids.shape:
            raise ValueError(f"render got {ids.numel()} ids and {values.numel()} relevance values")
        if self.pad_id is not None:
            keep = ids != self.pad_id
            ids, values = ids[keep], values[keep]
        muted = [i in self.special_ids for i in ids.tolist()]
        return visualize.token_strip(self.token_strings(ids), values, title, cmap=self.cmap, muted=muted)


class TabularTokens(Modality):
    """Tabular data, FT-Transformer style: ``prefix_tokens`` then one token per feature.

    Args:
        feature_names: one name per feature, in token order.
        prefix_tokens: tokens before the features (1 for a CLS token).

    Example::

        modality = TabularTokens(["age", "income", "height"])
        per_feature = modality.to_input(explain(ft_transformer, x).tokens, x)   # [B, 3]
    """

    def __init__(self, feature_names: Sequence[str], prefix_tokens: int = 1) -> None:
        if prefix_tokens < 0:
            raise ValueError(f"prefix_tokens must be >= 0; got {prefix_tokens}")
        self.feature_names = list(feature_names)
        self.prefix_tokens = prefix_tokens

    def __repr__(self) -> str:
        return f"TabularTokens({len(self.feature_names)} features, prefix_tokens={self.prefix_tokens})"

    def to_input(self, tokens: Tensor, inputs: Any = None) -> Tensor:
        """Relevance per feature.

        Args:
            tokens: ``[B, N]`` token relevance, ``N = prefix_tokens + F``.
            inputs: the features (not needed to map; accepted so every modality is called alike).

        Returns:
            float32 ``[B, F]``.
        """
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, N]; got shape {tuple(tokens.shape)}")
        count = tokens.shape[1] - self.prefix_tokens
        if count != len(self.feature_names):
            raise ValueError(
                f"{tokens.shape[1]} tokens minus prefix_tokens={self.prefix_tokens} leave {count} features, but "
                f"feature_names has {len(self.feature_names)}: {self.feature_names}"
            )
        return tokens[:, self.prefix_tokens :].float()

    def render(self, x: Tensor | None, relevance: Tensor | None, title: str) -> np.ndarray:
        """Bars of relevance ``[F]`` per feature (None: no bars), labelled ``name = value`` from ``x [F]`` (or None).

        Returns:
            uint8 ``[h, w, 3]``.
        """
        values = None if x is None else x.detach().float().cpu().reshape(-1)
        lengths = torch.zeros(len(self.feature_names)) if relevance is None else relevance.detach().float().cpu()
        return visualize.feature_bars(self.feature_names, lengths, title, values=values)
