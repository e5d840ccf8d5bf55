"""From token relevance to the input a person looks at (GAE_SPEC.md section 8), and its picture.

A modality knows how the model's tokens map onto its input: image patches plus prefix tokens,
token ids, or one token per tabular feature. ``to_input`` turns ``Explanation.tokens`` ``[B, N]``
into input-space relevance; ``render`` draws one sample with its relevance (or alone, with None).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_gae.visualize import feature_bars, overlay, titled_image, token_strip

__all__ = ["Modality", "ImageTokens", "TextTokens", "TabularTokens"]


class Modality(ABC):
    """How a model's token sequence maps onto its input."""

    @abstractmethod
    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Input-space relevance of a batch from token relevance ``[B, N]``."""

    @abstractmethod
    def render(self, sample: Tensor, relevance: Tensor | None, title: str) -> np.ndarray:
        """One sample (and its input-space relevance, if any) as a uint8 ``[h, w, 3]`` picture."""


class ImageTokens(Modality):
    """ViT-style images: ``prefix_tokens`` (CLS, distillation, registers) then a row-major patch grid.

    Args:
        patch_size: the side of a square patch, in pixels.
        prefix_tokens: tokens before the patches, dropped from the map.
        mean, std: the model's input normalisation, undone for display (inputs are shown as given
            when None).
        cmap, alpha: colormap and weight of the heatmap overlay.
    """

    def __init__(self, patch_size: int, prefix_tokens: int = 1, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, cmap: str = "jet", alpha: float = 0.5) -> None:
        self.patch_size = patch_size
        self.prefix_tokens = prefix_tokens
        self.mean = None if mean is None else list(mean)
        self.std = None if std is None else list(std)
        self.cmap = cmap
        self.alpha = alpha

    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """``[B, H, W]`` float32: patch relevance upsampled bilinearly to the image size."""
        height, width = inputs.shape[-2:]
        grid_h, grid_w = height // self.patch_size, width // self.patch_size
        patches = tokens[:, self.prefix_tokens :].float()
        if patches.shape[1] != grid_h * grid_w:
            raise ValueError(
                f"ImageTokens(patch_size={self.patch_size}, prefix_tokens={self.prefix_tokens}) expects "
                f"{self.prefix_tokens} + {grid_h}x{grid_w} tokens for {height}x{width} images, the model has "
                f"{tokens.shape[1]}; set patch_size and prefix_tokens to the model's"
            )
        grid = patches.reshape(-1, 1, grid_h, grid_w)
        return F.interpolate(grid, size=(height, width), mode="bilinear", align_corners=False)[:, 0]

    def display_image(self, x: Tensor) -> Tensor:
        """``[H, W, 3]`` in [0, 1] from one ``[C, H, W]`` input, normalisation undone."""
        x = x.detach().float().cpu()
        if self.mean is not None and self.std is not None:
            x = x * torch.tensor(self.std)[:, None, None] + torch.tensor(self.mean)[:, None, None]
        x = x.clamp(0, 1)
        if x.shape[0] == 1:
            x = x.expand(3, -1, -1)
        return x[:3].permute(1, 2, 0)

    def render(self, sample: Tensor, relevance: Tensor | None, title: str) -> np.ndarray:
        image = self.display_image(sample)
        if relevance is not None:
            image = overlay(image, relevance.detach().float().cpu(), cmap=self.cmap, alpha=self.alpha)
        return titled_image(image, title)

    @classmethod
    def infer(cls, inputs: Any, num_tokens: int) -> ImageTokens | None:
        """``ImageTokens`` for a ``[B, C, H, H]`` float batch whose ``num_tokens`` fit ``k + (H/p)²``."""
        if not isinstance(inputs, Tensor) or inputs.dim() != 4 or not inputs.is_floating_point():
            return None
        size = inputs.shape[-1]
        if inputs.shape[-2] != size:
            return None
        for prefix in (1, 0, 2):
            for patch in range(1, size + 1):
                if size % patch == 0 and prefix + (size // patch) ** 2 == num_tokens:
                    return cls(patch, prefix)
        return None


class TextTokens(Modality):
    """Token ids: one relevance value per id, special and padded tokens kept in place.

    Args:
        tokenizer: a Hugging Face tokenizer (``convert_ids_to_tokens``) for the token strings.
        vocab: the strings by id, when there is no tokenizer.
        special_ids: ids drawn muted (CLS, SEP, ...).
        pad_id: the padding id, left out of pictures.
        cmap: colormap of the token backgrounds.
    """

    def __init__(self, tokenizer: Any = None, vocab: Sequence[str] | None = None, special_ids: Sequence[int] = (),
                 pad_id: int | None = None, cmap: str = "Reds") -> None:
        self.tokenizer = tokenizer
        self.vocab = None if vocab is None else list(vocab)
        self.special_ids = set(special_ids)
        if tokenizer is not None:
            self.special_ids |= set(getattr(tokenizer, "all_special_ids", []))
            pad_id = getattr(tokenizer, "pad_token_id", None) if pad_id is None else pad_id
        self.pad_id = pad_id
        self.cmap = cmap

    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        ids = inputs["input_ids"] if isinstance(inputs, Mapping) else inputs
        if tokens.shape[1] != ids.shape[1]:
            raise ValueError(f"TextTokens: the model has {tokens.shape[1]} tokens for {ids.shape[1]} input ids")
        return tokens.float()

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        ids = [int(i) for i in ids]
        if self.tokenizer is not None:
            return list(self.tokenizer.convert_ids_to_tokens(ids))
        if self.vocab is not None:
            return [self.vocab[i] for i in ids]
        return [str(i) for i in ids]

    def render(self, sample: Tensor, relevance: Tensor | None, title: str) -> np.ndarray:
        ids = [int(i) for i in sample]
        keep = [i for i, t in enumerate(ids) if t != self.pad_id]
        values = np.zeros(len(ids)) if relevance is None else relevance.detach().float().cpu().numpy()
        return token_strip(
            [self.token_strings(ids)[i] for i in keep],
            values[keep],
            title,
            cmap=self.cmap,
            muted=[ids[i] in self.special_ids for i in keep],
        )


class TabularTokens(Modality):
    """FT-Transformer-style tabular inputs: ``prefix_tokens`` then one token per feature.

    Args:
        feature_names: one name per feature, in token order.
        prefix_tokens: tokens before the features (a CLS token), dropped.
    """

    def __init__(self, feature_names: Sequence[str], prefix_tokens: int = 1) -> None:
        self.feature_names = list(feature_names)
        self.prefix_tokens = prefix_tokens

    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        features = tokens[:, self.prefix_tokens :].float()
        if features.shape[1] != len(self.feature_names):
            raise ValueError(
                f"TabularTokens: the model has {tokens.shape[1]} tokens, {features.shape[1]} after "
                f"prefix_tokens={self.prefix_tokens}, but feature_names has {len(self.feature_names)}"
            )
        return features

    def render(self, sample: Tensor, relevance: Tensor | None, title: str) -> np.ndarray:
        values = sample.detach().float().cpu()
        shown = torch.zeros(len(self.feature_names)) if relevance is None else relevance.detach().float().cpu()
        return feature_bars(self.feature_names, shown, title, values=values)
