"""From token relevance back to the input, and how to draw it: images, text, tabular features.

``explain()`` returns relevance per *token* (``Explanation.tokens``, ``[B, N]``). A modality knows
how the model made its tokens from the input, maps that relevance onto the input (pixels, token
ids, features), renders one sample for a human, and removes parts of the input for the
faithfulness metrics (:mod:`lightning_gae.metrics`): black pixels or patches, mask/pad ids or a
zeroed attention mask, feature means. The classes are plain, with typed
``__init__`` arguments, so LightningCLI can build them from YAML::

    modality:
      class_path: lightning_gae.modalities.ImageTokens
      init_args: {patch_size: 2, prefix_tokens: 1}
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_gae import display
from lightning_gae._structures import input_tensor, keyword_inputs, replace_input

__all__ = ["ImageTokens", "Modality", "TabularTokens", "TextTokens"]


def _check_cmap(cmap: str) -> None:
    # Fail when the config is read, not at the first rendering many steps into training.
    if cmap not in matplotlib.colormaps:
        raise ValueError(f"cmap={cmap!r} is not a matplotlib colormap; e.g. 'jet', 'viridis', 'Reds'")


def _images(inputs: Any) -> Tensor:
    """The images among ``inputs``: a tensor, or ``pixel_values`` (the shown input) among keyword or tuple inputs."""
    images = input_tensor(inputs)
    if not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError(f"ImageTokens needs images [B, C, H, W] (a tensor, or 'pixel_values' among keyword inputs); got "
                         f"{getattr(images, 'shape', type(images).__name__)}")
    return images


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

    @abstractmethod
    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """An attribution as one score per removal unit (pixel, patch, token, feature).

        Args:
            attributions: token relevance ``[B, N]`` (an :class:`~lightning_gae.Explanation`'s
                ``tokens``) or an input-shaped map (Captum's convention).
            inputs: the batch the attributions explain.

        Returns:
            float32 ``[B, U]``.
        """

    @abstractmethod
    def removable(self, inputs: Any) -> Tensor:
        """bool ``[B, U]``: the units removal may touch (False for special and padded tokens)."""

    @abstractmethod
    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """A copy of ``inputs`` with the units where ``drop [B, U]`` is True removed.

        ``fill``: inputs of the same structure whose units replace the removed ones (the blurred
        start of an insertion curve); None means the modality's own removal value.
        """

    def blurred(self, inputs: Any) -> Any:
        """The start of an insertion curve: every removable unit removed (images: a blurred copy)."""
        return self.remove(inputs, self.removable(inputs))

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        """Whether the input tensor ``x`` is laid out like ``num_tokens`` tokens of this modality."""
        return False


class ImageTokens(Modality):
    """ViT-style images: ``prefix_tokens`` (CLS, distillation, ...) then one token per patch, row-major.

    Args:
        patch_size: side of a square patch in pixels.
        prefix_tokens: tokens before the patches (1 for a CLS token, 0 for none, 2 for DeiT).
        mean: per-channel mean used to normalise the inputs, undone for display.
        std: per-channel standard deviation used to normalise the inputs, undone for display.
        cmap: matplotlib colormap of the heatmap; None: ``inferno`` for non-negative maps, ``RdBu_r``
            centred on 0 for signed ones (Captum's gradient maps).
        alpha: weight of the heatmap over the (grey) image.
        removal: what the faithfulness metrics remove: ``"pixel"``, single pixels (set to black in [0, 1]
            space, then normalised with ``mean``/``std``), or ``"patch"``, whole patches.
        blur_sigma: standard deviation in pixels of the Gaussian blur an insertion curve starts
            from; None: 2.5% of the image side, at least 1.

    Example:
        Token relevance ``[B, 1 + 16]`` of 8 x 8 images in 2 x 2 patches back to pixels:

        >>> import torch
        >>> modality = ImageTokens(patch_size=2)
        >>> modality.to_input(torch.rand(3, 17), torch.rand(3, 1, 8, 8)).shape
        torch.Size([3, 8, 8])

        For an ImageNet ViT: ``ImageTokens(patch_size=16, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))``.
    """

    def __init__(
        self,
        patch_size: int,
        prefix_tokens: int = 1,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        cmap: str | None = None,
        alpha: float = 0.7,
        removal: Literal["pixel", "patch"] = "pixel",
        blur_sigma: float | None = None,
    ) -> None:
        if removal not in ("pixel", "patch"):
            raise ValueError(f"removal={removal!r}; use 'pixel' or 'patch'")
        if blur_sigma is not None and blur_sigma <= 0:
            raise ValueError(f"blur_sigma must be positive (or None for 2.5% of the image side); got {blur_sigma}")
        if patch_size < 1 or prefix_tokens < 0:
            raise ValueError(f"patch_size must be >= 1 and prefix_tokens >= 0; got {patch_size} and {prefix_tokens}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1]; got {alpha}")
        if cmap is not None:
            _check_cmap(cmap)
        self.patch_size = patch_size
        self.prefix_tokens = prefix_tokens
        self.mean = None if mean is None else tuple(float(m) for m in mean)
        self.std = None if std is None else tuple(float(s) for s in std)
        self.cmap = cmap
        self.alpha = alpha
        self.removal = removal
        self.blur_sigma = blur_sigma

    def __repr__(self) -> str:
        return f"ImageTokens(patch_size={self.patch_size}, prefix_tokens={self.prefix_tokens})"

    def to_input(self, tokens: Tensor, inputs: Any) -> Tensor:
        """Patch relevance upsampled to pixels.

        Args:
            tokens: ``[B, N]`` token relevance, ``N = prefix_tokens + (H // p) * (W // p)``.
            inputs: ``[B, C, H, W]`` the images the tokens came from (only the shape is used).

        Returns:
            float32 ``[B, H, W]``: the patch grid (row-major), bilinearly upsampled; not normalised.

        Raises:
            ValueError: if the token count does not fit ``patch_size`` and ``prefix_tokens``.
        """
        grid = self._patch_grid(tokens, inputs)[:, None]
        return F.interpolate(grid, size=tuple(_images(inputs).shape[-2:]), mode="bilinear", align_corners=False)[:, 0]

    def _patch_grid(self, tokens: Tensor, inputs: Any) -> Tensor:
        """The patch tokens' relevance as float32 ``[B, rows, cols]``, the prefix dropped."""
        inputs = _images(inputs)
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
        return tokens[:, self.prefix_tokens :].float().reshape(-1, rows, cols)

    def pixel_map(self, attributions: Tensor, inputs: Any) -> Tensor:
        """Any attribution of ``inputs [B, C, H, W]`` as float32 ``[B, H, W]``.

        Token relevance ``[B, N]`` goes through :meth:`to_input`; a pixel map ``[B, H, W]`` is kept;
        an input-shaped map ``[B, C, H, W]`` (Captum's) is summed over channels.
        """
        inputs = _images(inputs)
        if attributions.dim() == 2:
            return self.to_input(attributions, inputs)
        if attributions.dim() == 4 and attributions.shape == inputs.shape:
            return attributions.float().sum(dim=1)
        if attributions.dim() == 3 and attributions.shape == (inputs.shape[0], *inputs.shape[-2:]):
            return attributions.float()
        raise ValueError(
            f"attributions of shape {tuple(attributions.shape)} do not fit images {tuple(inputs.shape)}: pass token "
            "relevance [B, N], a pixel map [B, H, W] or an input-shaped map [B, C, H, W]"
        )

    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """Pixels ``[B, H*W]`` (row-major) or, with ``removal="patch"``, patches ``[B, rows*cols]``.

        Patches are ranked by their own token's relevance (token relevance ``[B, N]``), or by the
        mean of a pixel map's patch (Captum's maps): the bilinear upsampling of :meth:`to_input`
        blends neighbouring tokens and could reorder the patches.
        """
        if self.removal == "patch" and attributions.dim() == 2:
            return self._patch_grid(attributions, inputs).flatten(1)
        pixels = self.pixel_map(attributions, _images(inputs))
        if self.removal == "patch":
            rows, cols = pixels.shape[-2] // self.patch_size, pixels.shape[-1] // self.patch_size
            cropped = pixels[:, None, : rows * self.patch_size, : cols * self.patch_size]
            pixels = F.avg_pool2d(cropped, self.patch_size)[:, 0]
        return pixels.flatten(1)

    def removable(self, inputs: Any) -> Tensor:
        """Every pixel (or patch)."""
        inputs = _images(inputs)
        batch, _, height, width = inputs.shape
        units = (height // self.patch_size) * (width // self.patch_size) if self.removal == "patch" else height * width
        return torch.ones(batch, units, dtype=torch.bool, device=inputs.device)

    def _black(self, channels: int, like: Tensor) -> Tensor:
        """Black (0 in [0, 1] space) as the model sees it: ``(0 - mean) / std`` per channel."""
        value = torch.zeros(channels)
        if self.mean is not None:
            value = value - torch.tensor(self.mean)
        if self.std is not None:
            value = value / torch.tensor(self.std)
        return value.to(like).view(1, channels, 1, 1)

    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """Images with the dropped pixels (or patches) black, or taken from ``fill``, in the structure of ``inputs``."""
        images = _images(inputs)
        batch, channels, height, width = images.shape
        if self.removal == "patch":
            rows, cols = height // self.patch_size, width // self.patch_size
            cells = drop.reshape(batch, 1, rows, cols)
            mask = cells.repeat_interleave(self.patch_size, 2).repeat_interleave(self.patch_size, 3)
            mask = F.pad(mask, (0, width - mask.shape[-1], 0, height - mask.shape[-2]))
        else:
            mask = drop.reshape(batch, 1, height, width)
        replacement = self._black(channels, images) if fill is None else _images(fill)
        return replace_input(inputs, images, torch.where(mask.to(images.device), replacement, images))

    def blurred(self, inputs: Any) -> Any:
        """A Gaussian blur of each channel (reflect padding), the start of an insertion curve (RISE)."""
        source, inputs = inputs, _images(inputs)
        sigma = self.blur_sigma or max(1.0, 0.025 * max(inputs.shape[-2:]))
        radius = max(1, min(int(3 * sigma), min(inputs.shape[-2:]) - 1))
        offsets = torch.arange(-radius, radius + 1, dtype=torch.float32)
        kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
        kernel = (kernel / kernel.sum()).to(inputs)
        channels = inputs.shape[1]
        out = F.pad(inputs, (radius, radius, radius, radius), mode="reflect")
        # Separable: a row pass, then a column pass, one channel at a time (groups=C).
        out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)
        out = F.conv2d(out, kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels)
        return replace_input(source, inputs, out)

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
        """The image ``[C, H, W]`` in grey under its relevance ``[H, W]`` above a colorbar (None: the image alone), titled.

        The colours span ``(0, max)`` for a non-negative map and ``(-m, m)`` around 0 for a signed one
        (:func:`lightning_gae.display.value_range`): a flat map stays flat instead of being stretched.

        Returns:
            uint8 ``[h, w, 3]``, images enlarged to at least 128 px.
        """
        image = self.display_image(x)
        size = max(128, *image.shape[:2])
        if relevance is None:
            return display.titled_image(display.enlarge(image, size), title)
        heat = relevance.detach().float().cpu()
        vmin, vmax = display.value_range(heat)
        panel = display.heatmap_panel(image, heat, size=size, vrange=(vmin, vmax), cmap=self.cmap, alpha=self.alpha)
        bar = display.colorbar(vmin, vmax, panel.shape[1], cmap=self.cmap)
        return display.titled_image(display.stack([panel, bar], axis=0, gap=2), title)

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        return x.dim() == 4 and x.is_floating_point() and self.prefix_tokens + (
            x.shape[-2] // self.patch_size) * (x.shape[-1] // self.patch_size) == num_tokens

    @classmethod
    def infer(cls, inputs: object, num_tokens: int) -> ImageTokens | None:
        """Guess the patching from the input shape and the token count, or None.

        ``inputs`` must be (or show, as ``pixel_values``) a floating ``[B, C, H, H]`` tensor; the guess is the patch size ``p`` and prefix
        count ``k`` (tried in the order 1, 0, 2) with ``num_tokens == k + (H // p) ** 2`` and ``p`` dividing ``H``.
        """
        inputs = input_tensor(inputs)
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
        pad_id: padding id, omitted from the drawing and zeroed when no ``attention_mask`` is given; None: the tokenizer's.
        cmap: matplotlib colormap of the token backgrounds.
        mask_id: the id a removed token becomes; None means the tokenizer's mask token, else ``pad_id``.
        removal: how the faithfulness metrics remove a token: ``"replace"`` its id by ``mask_id``, or drop it from the
            ``"attention"`` mask (the inputs must then be a mapping with one). Special and padded tokens are never removed.

    Example (a character vocabulary instead of a tokenizer: ``[CLS]`` is special, ``_`` pads, its relevance is 0):

    >>> import torch
    >>> modality = TextTokens(vocab=["_", "[CLS]", *"abc"], special_ids=[1], pad_id=0)
    >>> ids = torch.tensor([[1, 2, 3, 0]])
    >>> modality.token_strings(ids[0]), modality.to_input(torch.tensor([[0.5, 0.2, 0.3, 0.9]]), ids)
    (['[CLS]', 'a', 'b', '_'], tensor([[0.5000, 0.2000, 0.3000, 0.0000]]))
    """

    def __init__(
        self,
        tokenizer: Any = None,
        vocab: Sequence[str] | None = None,
        special_ids: Sequence[int] | None = None,
        pad_id: int | None = None,
        cmap: str = "Reds",
        mask_id: int | None = None,
        removal: Literal["replace", "attention"] = "replace",
    ) -> None:
        _check_cmap(cmap)
        if removal not in ("replace", "attention"):
            raise ValueError(f"removal={removal!r}; use 'replace' (by mask_id) or 'attention' (zero the attention mask)")
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
        self.mask_id = getattr(tokenizer, "mask_token_id", None) if mask_id is None else mask_id
        self.removal = removal

    def __repr__(self) -> str:
        source = type(self.tokenizer).__name__ if self.tokenizer is not None else ("vocab" if self.vocab else "ids")
        return f"TextTokens({source}, pad_id={self.pad_id})"

    @staticmethod
    def _input_ids(inputs: Any) -> Tensor:
        keywords = keyword_inputs(inputs)
        ids = input_tensor(inputs) if keywords is None else keywords.get("input_ids")
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
        return tokens.float().masked_fill(~self.real_tokens(inputs).to(tokens.device), 0.0)

    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """One score per input id ``[B, T]``; embeddings-shaped maps ``[B, T, D]`` are summed over D."""
        ids = self._input_ids(inputs)
        scores = attributions.float().sum(dim=-1) if attributions.dim() == 3 else attributions.float()
        if scores.shape != ids.shape:
            raise ValueError(f"attributions of shape {tuple(attributions.shape)} do not fit input_ids {tuple(ids.shape)}: "
                             "pass one value per token [B, T] (or [B, T, D] for embeddings)")
        return scores

    def removable(self, inputs: Any) -> Tensor:
        """Real tokens that are not special (``special_ids``), by the attention mask or ``pad_id``."""
        return self.real_tokens(inputs) & ~self.special_tokens(inputs)

    def real_tokens(self, inputs: Any) -> Tensor:
        """bool ``[B, T]``: the tokens that are not padding, by the ``attention_mask`` (when the inputs carry one of
        their shape), else by ``pad_id``; all of them when neither says."""
        ids = self._input_ids(inputs)
        mask = (keyword_inputs(inputs) or {}).get("attention_mask")
        if isinstance(mask, Tensor) and mask.shape == ids.shape:
            return mask != 0
        if self.pad_id is not None:
            return ids != self.pad_id
        return torch.ones_like(ids, dtype=torch.bool)

    def special_tokens(self, inputs: Any) -> Tensor:
        """bool ``[B, T]``: the tokens whose id is one of ``special_ids`` (CLS, SEP, ...)."""
        ids = self._input_ids(inputs)
        return torch.isin(ids, torch.tensor(sorted(self.special_ids), dtype=ids.dtype, device=ids.device))

    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """Dropped tokens become ``mask_id`` (or ``fill``'s ids), or leave the attention mask."""
        ids = self._input_ids(inputs)
        drop = drop.to(ids.device) & self.removable(inputs)
        if self.removal == "attention":
            mask = (keyword_inputs(inputs) or {}).get("attention_mask")
            if not isinstance(mask, Tensor) or mask.shape != ids.shape:
                raise ValueError("TextTokens(removal='attention') needs inputs as a mapping with an attention_mask [B, T]")
            return replace_input(inputs, mask, mask.masked_fill(drop, 0))
        if fill is not None:
            replacement = self._input_ids(fill)
        elif self.mask_id is not None or self.pad_id is not None:
            replacement = torch.full_like(ids, self.mask_id if self.mask_id is not None else self.pad_id)
        else:
            raise ValueError("TextTokens cannot remove tokens without an id to put in their place: pass mask_id= "
                             "(or pad_id=, or a tokenizer with a mask or pad token), or use removal='attention'")
        return replace_input(inputs, ids, torch.where(drop, replacement, ids))

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        return x.dim() == 2 and not x.is_floating_point() and x.shape[1] == num_tokens

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
        return display.token_strip(self.token_strings(ids), values, title, cmap=self.cmap, muted=muted)


class TabularTokens(Modality):
    """Tabular data, FT-Transformer style: ``prefix_tokens`` then one token per feature.

    Args:
        feature_names: one name per feature, in token order.
        prefix_tokens: tokens before the features (1 for a CLS token).
        means: the value a removed feature takes, one per feature: its mean over the training
            data, in the scale the model sees (:meth:`fit` computes them). Without it, mapping
            and drawing work, but the faithfulness metrics cannot remove features.

    Example:
        >>> import torch
        >>> train_features = torch.tensor([[30.0, 1.0, 170.0], [50.0, 3.0, 180.0]])
        >>> modality = TabularTokens(["age", "income", "height"]).fit(train_features)
        >>> modality.means
        (40.0, 2.0, 175.0)
        >>> modality.to_input(torch.rand(2, 1 + 3), train_features).shape   # token relevance -> one per feature
        torch.Size([2, 3])
    """

    def __init__(self, feature_names: Sequence[str], prefix_tokens: int = 1, means: Sequence[float] | None = None) -> None:
        if prefix_tokens < 0:
            raise ValueError(f"prefix_tokens must be >= 0; got {prefix_tokens}")
        if means is not None and len(means) != len(feature_names):
            raise ValueError(f"means has {len(means)} values for {len(feature_names)} feature_names")
        self.feature_names = list(feature_names)
        self.prefix_tokens = prefix_tokens
        self.means = None if means is None else tuple(float(m) for m in means)

    def __repr__(self) -> str:
        return f"TabularTokens({len(self.feature_names)} features, prefix_tokens={self.prefix_tokens})"

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        return x.dim() == 2 and x.shape[1] == len(self.feature_names) == num_tokens - self.prefix_tokens

    def fit(self, features: Tensor) -> TabularTokens:
        """Set ``means`` to the column means of the training features ``[n, F]`` (as the model sees them); returns self.

        A fixed fill makes a removed feature mean the same in every batch: the batch's own mean
        would leave a batch of one unperturbed and make scores depend on the batch size.
        """
        features = self._features(features)
        self.means = tuple(float(m) for m in features.detach().cpu().double().mean(dim=0))
        return self

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
        if inputs is not None:
            self._features(inputs)
        count = tokens.shape[1] - self.prefix_tokens
        if count != len(self.feature_names):
            raise ValueError(
                f"{tokens.shape[1]} tokens minus prefix_tokens={self.prefix_tokens} leave {count} features, but "
                f"feature_names has {len(self.feature_names)}: {self.feature_names}"
            )
        return tokens[:, self.prefix_tokens :].float()

    def _features(self, inputs: Any) -> Tensor:
        """The features among ``inputs``: the tensor itself, or the one a person looks at among keyword or tuple inputs."""
        features = input_tensor(inputs)
        count = len(self.feature_names)
        if isinstance(features, Tensor) and features.dim() > 2 and features.shape[1] == count:
            raise ValueError(f"TabularTokens({count} feature_names) draws and removes one value per feature, so it needs "
                             f"features [B, {count}]; got {list(features.shape)}. Give the model one value per feature "
                             "(make each feature's vector inside its forward), or write a lightning_gae.Modality of your own")
        if not isinstance(features, Tensor) or features.dim() != 2 or features.shape[1] != count:
            raise ValueError(f"TabularTokens needs features [B, {count}] (a tensor, or the first among keyword or "
                             f"tuple inputs); got {list(getattr(features, 'shape', [])) or type(features).__name__}")
        return features

    def unit_scores(self, attributions: Tensor, inputs: Any) -> Tensor:
        """One score per feature ``[B, F]``, from token relevance ``[B, prefix + F]`` or a map ``[B, F]``."""
        features = self._features(inputs)
        if attributions.shape == features.shape:
            return attributions.float()
        return self.to_input(attributions, inputs)

    def removable(self, inputs: Any) -> Tensor:
        """Every feature."""
        return torch.ones_like(self._features(inputs), dtype=torch.bool)

    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """Dropped features take ``means`` (or ``fill``'s values).

        Raises:
            ValueError: without ``means`` or ``fill`` (the message says how to give them).
        """
        features, fill = self._features(inputs), None if fill is None else self._features(fill)
        if fill is None:
            if self.means is None:
                raise ValueError("TabularTokens has no value to put in place of a removed feature: pass "
                                 "means=[...] (the training set's feature means, in the scale the model sees) "
                                 "or call modality.fit(train_features)")
            fill = torch.tensor(self.means).to(features)
        return replace_input(inputs, features, torch.where(drop.to(features.device), fill, features))

    def render(self, x: Tensor | None, relevance: Tensor | None, title: str) -> np.ndarray:
        """Bars of relevance ``[F]`` per feature (None: no bars), labelled ``name = value`` from ``x [F]`` (or None).

        Returns:
            uint8 ``[h, w, 3]``.
        """
        values = None if x is None else x.detach().float().cpu().reshape(-1)
        if values is not None and values.numel() != len(self.feature_names):
            raise ValueError(f"TabularTokens({len(self.feature_names)} feature_names) draws one value per feature; got {list(x.shape)}")
        lengths = torch.zeros(len(self.feature_names)) if relevance is None else relevance.detach().float().cpu()
        return display.feature_bars(self.feature_names, lengths, title, values=values)
