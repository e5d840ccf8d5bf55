"""ViT-style images: a patch grid of tokens, drawn as heatmaps over the image, removed pixel by pixel or patch by patch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_gae import display
from lightning_gae._structures import input_tensor, replace_input
from lightning_gae.modalities.regions import PATCH_SHARE, Region
from lightning_gae.modalities.tokens import InterpolateMode, MethodMap, Modality, check_cmap, check_tokens

__all__ = ["ImageTokens"]

_EVOLUTION_PX = 128
"""The side of a cell of the ``gae_evolution`` strip."""


def _images(inputs: Any) -> Tensor:
    """The images among ``inputs``: a tensor, or ``pixel_values`` (the shown input) among keyword or tuple inputs."""
    images = input_tensor(inputs)
    if not isinstance(images, Tensor) or images.dim() != 4:
        raise ValueError(f"ImageTokens needs images [B, C, H, W] (a tensor, or 'pixel_values' among keyword inputs); got "
                         f"{getattr(images, 'shape', type(images).__name__)}")
    return images


class ImageTokens(Modality):
    """ViT-style images: ``prefix_tokens`` (CLS, distillation, ...) then one token per patch, row-major.

    Args:
        patch_size: side of a square patch in pixels.
        prefix_tokens: tokens before the patches (1 for a CLS token, 0 for none, 2 for DeiT).
        mean: per-channel mean used to normalise the inputs, undone for display.
        std: per-channel standard deviation used to normalise the inputs, undone for display.
        cmap: matplotlib colormap of :meth:`render`'s heatmaps (``comparison_grid``); None: the package's convention,
            :func:`~lightning_gae.display.colormap_for` the method's ``signed`` fact (``inferno`` for non-negative
            methods, ``RdBu_r`` white at 0 for signed ones such as Captum's gradient maps).
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

    # Samples may carry object masks [B, H, W]: the relevance is scored as a segmentation of them.
    ground_truth = "segmentation"

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
            check_cmap(cmap)
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
        check_tokens(tokens, inputs.shape[0])
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

    def _pixel_mask(self, drop: Tensor, images: Tensor) -> Tensor:
        """bool ``[B, 1, H, W]``: the pixels of the units where ``drop [B, U]`` is True."""
        batch, _, height, width = images.shape
        if self.removal == "patch":
            rows, cols = height // self.patch_size, width // self.patch_size
            cells = drop.reshape(batch, 1, rows, cols)
            mask = cells.repeat_interleave(self.patch_size, 2).repeat_interleave(self.patch_size, 3)
            mask = F.pad(mask, (0, width - mask.shape[-1], 0, height - mask.shape[-2]))
        else:
            mask = drop.reshape(batch, 1, height, width)
        return mask.to(images.device)

    def remove(self, inputs: Any, drop: Tensor, fill: Any = None) -> Any:
        """Images with the dropped pixels (or patches) black, or taken from ``fill``, in the structure of ``inputs``."""
        images = _images(inputs)
        replacement = self._black(images.shape[1], images) if fill is None else _images(fill)
        return replace_input(inputs, images, torch.where(self._pixel_mask(drop, images), replacement, images))

    def impute(self, inputs: Any, drop: Tensor, imputation: Callable[[Tensor, Tensor], Tensor]) -> Any:
        """Images with the dropped pixels (or patches) imputed from the kept ones by ``imputation`` in [0, 1] space
        (``mean``/``std`` undone first and applied again after, as ROAD imputes before normalising)."""
        images = _images(inputs)
        channels = images.shape[1]
        mean = torch.tensor(self.mean or (0.0,) * channels).to(images).view(1, channels, 1, 1)
        std = torch.tensor(self.std or (1.0,) * channels).to(images).view(1, channels, 1, 1)
        mask = self._pixel_mask(drop, images)
        filled = imputation(images * std + mean, mask[:, 0])
        return replace_input(inputs, images, torch.where(mask, (filled - mean) / std, images))

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

    def render(self, x: Tensor, relevance: Tensor | None, title: str, *, signed: bool | None = None) -> np.ndarray:
        """The image ``[C, H, W]`` in grey under its relevance ``[H, W]`` above a colorbar (None: the image alone), titled.

        The colours span ``(0, max)`` for a non-negative method and ``(-m, m)`` around 0 for a signed one
        (:func:`lightning_gae.display.value_range`, ``signed`` as :meth:`Modality.render`), on
        :func:`~lightning_gae.display.colormap_for` it unless ``cmap`` was given: a flat map stays flat instead of
        being stretched, and a signed method keeps its diverging colormap on a map without a negative value.

        Returns:
            uint8 ``[h, w, 3]``, images enlarged to at least 128 px.
        """
        image = self.display_image(x)
        size = max(128, *image.shape[:2])
        if relevance is None:
            return display.titled_image(display.enlarge(image, size), title)
        heat = relevance.detach().float().cpu()
        vmin, vmax = display.value_range(heat, signed)
        cmap = self.cmap or display.colormap_for(vmin < 0)
        panel = display.heatmap_panel(image, heat, size=size, vrange=(vmin, vmax), cmap=cmap, alpha=self.alpha)
        bar = display.colorbar(vmin, vmax, panel.shape[1], cmap=cmap)
        return display.titled_image(display.stack([panel, bar], axis=0, gap=2), title)

    def matches_input(self, x: Tensor, num_tokens: int) -> bool:
        return x.dim() == 4 and x.is_floating_point() and self.prefix_tokens + (
            x.shape[-2] // self.patch_size) * (x.shape[-1] // self.patch_size) == num_tokens

    # --- what the rest of the package asks (Modality's hooks) -----------------------------------

    @property
    def first_token_is_input(self) -> bool:
        """Without a prefix token, token 0 is the top-left patch."""
        return self.prefix_tokens == 0

    def input_map(self, attributions: Tensor, shown: Tensor, inputs: Any) -> Tensor:
        """Pixels ``[B, H, W]`` (:meth:`pixel_map`)."""
        return self.pixel_map(attributions, shown)

    def token_map(self, tokens: Tensor, shown: Tensor, inputs: Any) -> Tensor:
        """The patch grid ``[B, rows, cols]``, one cell per token, the prefix dropped."""
        rows, cols = shown.shape[-2] // self.patch_size, shown.shape[-1] // self.patch_size
        if tokens.shape[1] != self.prefix_tokens + rows * cols:
            # A reshape alone would accept any multiple of the grid and draw other samples' patches.
            raise ValueError(f"{tokens.shape[1]} tokens do not fit {self!r} on {shown.shape[-2]}x"
                             f"{shown.shape[-1]} images ({self.prefix_tokens} + {rows}x{cols} patches)")
        return tokens[:, self.prefix_tokens :].reshape(-1, rows, cols)

    def relevance_on(self, x: Tensor, tokens: Tensor, mode: InterpolateMode = "nearest") -> Tensor | None:
        """Patch relevance on every channel of images ``x [B, C, H, W]``: each patch's value on its pixels
        (``"nearest"``), or the display's bilinear upsampling; None when ``x`` is not images."""
        if not (x.dim() == 4 and x.is_floating_point()):
            return None
        rows, cols = x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size
        if mode == "bilinear" or tokens.shape[1] != self.prefix_tokens + rows * cols:
            # The modality's display upsampling, which also explains a token count that does not fit.
            pixels = self.to_input(tokens, x)
        else:
            grid = tokens[:, self.prefix_tokens :].float().reshape(-1, 1, rows, cols)
            pixels = F.interpolate(grid, tuple(x.shape[-2:]), mode=mode)[:, 0]
        return pixels[:, None].expand(x.shape)

    def token_relevance(self, attributions: Tensor, inputs: Any, tokens: int) -> Tensor | None:
        """Token relevance is kept; an image map (``[B, C, H, W]`` or ``[B, H, W]``) becomes its mean per patch, the
        prefix tokens 0; None for anything else."""
        found = attributions.detach().float().cpu()
        if found.dim() == 2 and found.shape[1] == tokens:
            return found
        try:
            pixels = self.pixel_map(found, inputs)
        except ValueError:  # not a map of these images
            return None
        p = self.patch_size
        rows, cols = pixels.shape[-2] // p, pixels.shape[-1] // p
        found = F.avg_pool2d(pixels[:, None, : rows * p, : cols * p], p)[:, 0].flatten(1)
        found = torch.cat([torch.zeros(found.shape[0], self.prefix_tokens), found], dim=1)
        return found if found.shape[1] == tokens else None

    def removable_tokens(self, inputs: Any) -> Tensor:
        """The patch tokens (every patch is removable), not the prefix."""
        inputs = _images(inputs)
        batch, _, height, width = inputs.shape
        cells = (height // self.patch_size) * (width // self.patch_size)
        patches = torch.ones(batch, cells, dtype=torch.bool, device=inputs.device)
        return torch.cat([torch.zeros(batch, self.prefix_tokens, dtype=torch.bool, device=inputs.device), patches], 1)

    def token_units(self, tokens: Tensor, inputs: Any) -> Tensor:
        """A patch token is its patch (``removal="patch"``) or all its pixels (``"pixel"``), nearest, never
        blended: :meth:`to_input` upsamples bilinearly, which spills a patch onto its neighbours."""
        height, width = _images(inputs).shape[-2:]
        p = self.patch_size
        rows, cols = height // p, width // p
        grid = tokens[..., self.prefix_tokens :].reshape(*tokens.shape[:2], rows, cols)
        if self.removal == "patch":
            return grid.flatten(2)
        pixels = torch.zeros(*tokens.shape[:2], height, width, dtype=torch.bool, device=tokens.device)
        pixels[..., : rows * p, : cols * p] = grid.repeat_interleave(p, dim=2).repeat_interleave(p, dim=3)
        return pixels.flatten(2)

    def region_tokens(self, region: Region, inputs: Any) -> Tensor:
        """A pixel ``mask`` ``[H, W]`` or ``[B, H, W]``: a patch token is in the region when at least
        :data:`~lightning_gae.modalities.regions.PATCH_SHARE` of its pixels are."""
        if region.mask is None:
            raise region.mismatch(self, "mask= (pixels [H, W] or [B, H, W])")
        images = _images(inputs)  # a tensor, or Hugging Face's pixel_values among keyword inputs
        batch, height, width = images.shape[0], *images.shape[-2:]
        mask = region.mask
        if tuple(mask.shape[-2:]) != (height, width) or (mask.dim() == 3 and mask.shape[0] != batch):
            raise ValueError(f"Region {region.name!r}: mask of shape {tuple(mask.shape)} does not fit images "
                             f"{tuple(images.shape)}; give [{height}, {width}] or [{batch}, {height}, {width}]")
        # The patch grid as the tokens are made: row-major, pixels past the last whole patch belong to none.
        p = self.patch_size
        rows, cols = height // p, width // p
        pixels = (mask != 0).float().to(images.device).expand(batch, height, width)[:, None, : rows * p, : cols * p]
        inside = F.avg_pool2d(pixels, p)[:, 0].flatten(1) >= PATCH_SHARE
        prefix = torch.zeros(batch, self.prefix_tokens, dtype=torch.bool, device=images.device)
        return torch.cat([prefix, inside], dim=1)

    def panels(self, x: Tensor, maps: Sequence[MethodMap], flags: tuple[np.ndarray, np.ndarray] | None,
               panel_px: int, alpha: float) -> tuple[np.ndarray, list[np.ndarray]]:
        """The image, and each method's heatmap over it in grey above its colour bar."""
        image = self.display_image(x).numpy()
        cells = []
        for m in maps:
            vmin, vmax = m.vrange
            heat = display.heatmap_panel(image, m.values, panel_px, (vmin, vmax), alpha=alpha)
            bar = display.colorbar(vmin, vmax, heat.shape[1], saturated=m.saturated)
            cells.append(display.stack([heat, bar], axis=0, gap=3))
        return display.enlarge(image, panel_px), cells

    def evolution_cells(self, x: Tensor, maps: Sequence[MethodMap], alpha: float) -> list[np.ndarray] | None:
        """Each method's heatmap, 128 px."""
        image = self.display_image(x).numpy()
        return [display.heatmap_panel(image, m.values, _EVOLUTION_PX, m.vrange, alpha=alpha) for m in maps]

    def dashboard_input(self, x: Tensor, flags: tuple[np.ndarray, np.ndarray] | None,
                        count: int) -> tuple[dict[str, Any], np.ndarray]:
        """The pixels (uint8 ``[H, W, 3]``) and the patch grid."""
        pixels = (self.display_image(x).numpy() * 255.0 + 0.5).astype(np.uint8)
        rows, cols = x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size
        fields = {"modality": "image", "prefix_tokens": self.prefix_tokens, "grid": [rows, cols],
                  "patch_size": self.patch_size}
        return fields, pixels

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
