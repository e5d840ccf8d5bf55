"""Operations the LRP modes (:mod:`lightning_gae.lrp`, :mod:`lightning_gae.lrp.transformer_attribution`) run in
a cheaper form than PyTorch's own, with the same values and gradients."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["fused_applies", "unbind"]


class _Unbind(torch.autograd.Function):
    """``x.unbind(dim)``; backward: the slices' gradients written into one tensor laid out as ``x`` is.

    PyTorch's own backward stacks them (a copy) in a contiguous tensor, which the shape ops back to
    ``x``'s base then copy again when ``x`` was a permuted view (``qkv.reshape(...).permute(2, 0, 3, 1, 4)``
    of a fused q/k/v projection): laid out as ``x``, the permutation back is contiguous, one copy in all.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int) -> tuple[Tensor, ...]:
        ctx.dim, ctx.like = dim, torch.empty_like(x, device="meta")  # x's layout, when it is dense
        ctx.where = x.device
        return x.unbind(dim)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor, None]:
        like = ctx.like
        out = torch.empty_strided(like.shape, like.stride(), dtype=like.dtype, device=ctx.where)
        for i, g in enumerate(grads):
            part = out.select(ctx.dim, i)
            part.zero_() if g is None else part.copy_(g)
        return out, None


def unbind(args: tuple, kwargs: dict) -> tuple[Tensor, ...]:
    """``torch.unbind`` of a relevance-carrying tensor through :class:`_Unbind` (same values, same gradient)."""
    x = args[0] if args else kwargs["input"]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return _Unbind.apply(x, dim % x.dim())


def fused_applies(p: dict) -> bool:
    """Whether ``F.scaled_dot_product_attention`` itself computes what the explicit form does: float32 or
    wider operands (the explicit form's dtype) and no query whose every key is masked (explicit: 0)."""
    query, key, value, mask = p["query"], p["key"], p["value"], p.get("attn_mask")
    if any(not isinstance(t, Tensor) or t.dtype not in (torch.float32, torch.float64) or t.dtype != query.dtype
           for t in (query, key, value)):
        return False
    if mask is None:
        return True
    if p.get("is_causal") or (mask.dtype != torch.bool and mask.dtype != query.dtype):
        return False
    dead = ~mask.any(dim=-1) if mask.dtype == torch.bool else torch.isneginf(mask).all(dim=-1)
    return not bool(dead.any())
