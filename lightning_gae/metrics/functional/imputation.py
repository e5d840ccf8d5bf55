"""Noisy linear imputation (ROAD, Rong et al., ICML 2022): removed pixels inferred from their neighbours.

Every removed pixel is the weighted mean of its eight neighbours (direct ones weigh 1/6, diagonal ones 1/12;
neighbours outside the image are left out and the remaining weights are not renormalised beyond dropping theirs),
kept neighbours with their values and removed ones with their own unknowns. That is one sparse linear system per
image and channel; its matrix is a principal block of a graph Laplacian, symmetric and positive definite whenever a
pixel is kept, and all of them are solved together by conjugate gradients on the 3 x 3 stencil.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["NEIGHBOUR_WEIGHTS", "noisy_linear_imputation"]

NEIGHBOUR_WEIGHTS: tuple[tuple[float, float, float], ...] = (
    (1 / 12, 1 / 6, 1 / 12),
    (1 / 6, 0.0, 1 / 6),
    (1 / 12, 1 / 6, 1 / 12),
)
"""The weight of each neighbour of a pixel (the centre is the pixel itself): ROAD's and Quantus' weights."""

_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-6}
"""CG stops once every residual is below this share of the system's right-hand side (float32 on MPS only)."""


def _stencil(x: Tensor) -> Tensor:
    """The weighted sum of every pixel's in-image neighbours (``NEIGHBOUR_WEIGHTS``), ``x [N, H, W]``: shifted
    sums of the zero-padded image (on the CPU a float64 convolution is several times slower)."""
    height, width = x.shape[-2:]
    p = F.pad(x, (1, 1, 1, 1))
    direct = p[:, :height, 1 : width + 1] + p[:, 2:, 1 : width + 1] + p[:, 1 : height + 1, :width] + p[:, 1 : height + 1, 2:]
    diagonal = p[:, :height, :width] + p[:, :height, 2:] + p[:, 2:, :width] + p[:, 2:, 2:]
    return direct.mul_(NEIGHBOUR_WEIGHTS[0][1]).add_(diagonal, alpha=NEIGHBOUR_WEIGHTS[0][0])


def _solve(known: Tensor, removed: Tensor) -> Tensor:
    """``[N, H, W]``: ``known`` with its ``removed`` pixels replaced by the solution of the imputation system.

    For a removed pixel ``i`` with in-image neighbour weights summing to ``s_i``:
    ``s_i x_i - sum_{j removed} w_ij x_j = sum_{j kept} w_ij v_j``, solved by Jacobi-preconditioned CG.
    """
    mask = removed.to(known.dtype)
    kept = known * (1 - mask)
    degree = _stencil(torch.ones_like(known[:1]))  # s_i: the weights of a pixel's in-image neighbours
    rhs = mask * _stencil(kept)

    def apply(x: Tensor) -> Tensor:
        return mask * (degree * x - _stencil(mask * x))

    def dot(a: Tensor, b: Tensor) -> Tensor:
        return (a * b).sum(dim=(-2, -1), keepdim=True)

    # Start from the weighted mean of the kept neighbours (0 where none is kept): most removed pixels are near one.
    weight = _stencil(1 - mask)
    x = mask * rhs / weight.clamp(min=1e-12)
    r = rhs - apply(x)
    scale = mask / degree  # the Jacobi preconditioner on the removed pixels, 0 elsewhere
    z = scale * r
    p = z
    rz = dot(r, z)
    limit = _TOLERANCE[known.dtype] * rhs.abs().amax(dim=(-2, -1), keepdim=True).clamp(min=1.0)
    steps = 20 * (known.shape[-1] + known.shape[-2]) + 100
    for step in range(steps):
        if step % 10 == 0 and bool((r.abs().amax(dim=(-2, -1), keepdim=True) <= limit).all()):
            break
        q = apply(p)
        pq = dot(p, q)
        alpha = torch.where(pq > 0, rz / pq.clamp(min=torch.finfo(pq.dtype).tiny), torch.zeros_like(pq))
        x = x + alpha * p
        r = r - alpha * q
        z = scale * r
        rz_next = dot(r, z)
        beta = torch.where(rz > 0, rz_next / rz.clamp(min=torch.finfo(rz.dtype).tiny), torch.zeros_like(rz))
        p = z + beta * p
        rz = rz_next
    return kept + mask * x


def noisy_linear_imputation(images: Tensor, mask: Tensor, noise: float = 0.01,
                            generator: torch.Generator | None = None) -> Tensor:
    r"""Removed pixels replaced by the linear imputation of ROAD (Rong et al., ICML 2022), plus Gaussian noise.

    Each removed pixel :math:`i` takes the value that makes it the weighted mean of its in-image neighbours
    :math:`N(i)` (weights ``NEIGHBOUR_WEIGHTS``: 1/6 for the four direct neighbours, 1/12 for the diagonal ones),
    kept neighbours counting with their values and removed ones with their own imputed values:

    .. math:: \Big(\sum_{j \in N(i)} w_{ij}\Big) x_i - \sum_{j \in N(i),\ \text{removed}} w_{ij} x_j
              = \sum_{j \in N(i),\ \text{kept}} w_{ij} v_j,

    one system per image and channel, solved together (conjugate gradients on the 3 x 3 stencil, in float64 except
    on MPS). Then ``noise`` times standard normal noise is added to every removed value. With ``noise=0`` this is
    Quantus 0.6's ``noisy_linear_imputation`` (and the ROAD authors' ``NoisyLinearImputer``) on the same image and
    pixels. ROAD imputes images in [0, 1] space, where its default noise 0.01 is 1% of the range.

    Args:
        images: float ``[B, C, H, W]``.
        mask: bool ``[B, H, W]``, True for the pixels removed (imputed), the same for every channel.
        noise: the standard deviation of the noise added to the imputed values (0: none).
        generator: the random generator the noise is drawn from (on the images' device); None: torch's global one.

    Returns:
        A new tensor like ``images``: kept pixels unchanged, removed ones imputed.

    Raises:
        ValueError: for a mask that does not fit the images or removes every pixel of an image (nothing to impute
            from), or a negative ``noise``.

    Example (one removed pixel in the middle of a 3 x 3 image is the weighted mean of its 8 neighbours):

    >>> import torch
    >>> image = torch.arange(9.0).reshape(1, 1, 3, 3)
    >>> mask = torch.zeros(1, 3, 3, dtype=torch.bool)
    >>> mask[0, 1, 1] = True
    >>> noisy_linear_imputation(image, mask, noise=0.0)[0, 0, 1, 1].item()
    4.0
    """
    if not isinstance(images, Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise ValueError(f"images must be a float tensor [B, C, H, W]; got {getattr(images, 'shape', type(images).__name__)}")
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (images.shape[0], *images.shape[-2:]):
        raise ValueError(f"mask must be a bool tensor [B, H, W] = {[images.shape[0], *images.shape[-2:]]} (True: removed); "
                         f"got {getattr(mask, 'dtype', type(mask).__name__)} {list(getattr(mask, 'shape', []))}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0 (the standard deviation of the noise on imputed pixels); got {noise}")
    full = mask.flatten(1).all(dim=1)
    if bool(full.any()):
        raise ValueError(f"mask removes every pixel of image(s) {torch.nonzero(full).flatten().tolist()}: the imputation "
                         "infers removed pixels from kept ones; keep at least one pixel per image")
    batch, channels, height, width = images.shape
    dtype = torch.float32 if images.device.type == "mps" else torch.float64
    removed = mask.to(images.device)[:, None].expand(batch, channels, height, width).reshape(-1, height, width)
    solved = _solve(images.to(dtype).reshape(-1, height, width), removed).reshape(images.shape)
    out = solved.to(images.dtype)
    if noise > 0:
        draws = torch.randn(images.shape, generator=generator, device=images.device, dtype=images.dtype)
        out = torch.where(mask.to(images.device)[:, None], out + noise * draws, out)
    return out
