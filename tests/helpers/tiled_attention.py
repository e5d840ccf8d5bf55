"""What a fused GPU kernel for GAE's attention step computes, written tile by tile in plain PyTorch.

The reference semantics of the kernel issue 24 asks for: a flash-attention-style forward that keeps, per query, only
the output and the log-sum-exp of its scores, and a backward that revisits the scores one
``block_q x block_k`` tile at a time to give the gradients of ``q``, ``k``, ``v`` and, in the same pass, GAE's row
update ``u = r · E_h[(∇A ⊙ A)⁺]`` (Eq. 5 in row form, ``∇A = dO · Vᵀ``). Nothing larger than a tile of
scores exists at any time: that is what lets the kernel skip the ``N x N`` probabilities that fused attention never
stores. Slow (Python loops over tiles), obviously correct, and independent of :mod:`lightning_gae.engine.lean`, which
chunks over queries only and keeps every key of a chunk; the tests hold the two against each other.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["tiled_forward", "tiled_backward"]


def _tile_scores(q: Tensor, k: Tensor, bias: Tensor | None, causal: bool, qs: slice, ks: slice, scale: float) -> Tensor:
    """``[B, H, bq, bk]`` scores of one tile: ``scale · q kᵀ + bias``, -inf above the diagonal when causal."""
    s = torch.einsum("bhqe,bhke->bhqk", q[:, :, qs], k[:, :, ks]) * scale
    if bias is not None:
        s = s + bias[..., qs, ks]
    if causal:
        rows = torch.arange(qs.start, qs.stop, device=q.device)[:, None]
        cols = torch.arange(ks.start, ks.stop, device=q.device)[None, :]
        s = s.masked_fill(cols > rows, -math.inf)
    return s


def _spans(n: int, block: int) -> list[slice]:
    return [slice(i, min(i + block, n)) for i in range(0, n, block)]


def tiled_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, causal: bool = False,
                  scale: float | None = None, block_q: int = 16, block_k: int = 16) -> tuple[Tensor, Tensor]:
    """``(out, lse)``: attention's output ``[B, H, N, E]`` and each query's log-sum-exp of its scores ``[B, H, N]``
    (-inf for a query that sees no key, whose output is 0), by the online softmax, one tile at a time."""
    b, h, n_q, _ = q.shape
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if bias is not None:
        bias = bias.expand(b, h, n_q, n_k)
    out = torch.zeros(b, h, n_q, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((b, h, n_q), -math.inf, dtype=q.dtype, device=q.device)
    for qs in _spans(n_q, block_q):
        top = torch.full((b, h, qs.stop - qs.start), -math.inf, dtype=q.dtype, device=q.device)
        total = torch.zeros_like(top)
        acc = torch.zeros(b, h, qs.stop - qs.start, v.shape[-1], dtype=q.dtype, device=q.device)
        for ks in _spans(n_k, block_k):
            s = _tile_scores(q, k, bias, causal, qs, ks, scale)
            new_top = torch.maximum(top, s.amax(dim=-1))
            # A query that has seen only -inf so far keeps a 0 total; shifting by 0 avoids -inf - -inf.
            shift = torch.where(torch.isinf(new_top), torch.zeros_like(new_top), new_top)
            keep = torch.exp(top - shift).nan_to_num(nan=0.0)
            p = torch.exp(s - shift[..., None])
            total = total * keep + p.sum(dim=-1)
            acc = acc * keep[..., None] + p @ v[:, :, ks]
            top = new_top
        seen = total > 0
        out[:, :, qs] = torch.where(seen[..., None], acc / total.clamp(min=1e-30)[..., None], torch.zeros_like(acc))
        lse[:, :, qs] = torch.where(seen, top + torch.log(total.clamp(min=1e-30)), lse[:, :, qs])
    return out, lse


def tiled_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, row: Tensor,
                   bias: Tensor | None = None, causal: bool = False, scale: float | None = None,
                   block_q: int = 16, block_k: int = 16) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, update)``: the gradients and GAE's row update ``[B, N_k]`` for relevance row ``row [B, N_q]``.

    Per tile: ``A = exp(S - lse)`` from the saved log-sum-exp, ``∇A = dO Vᵀ``, ``D = rowsum(dO ⊙ O)`` (softmax's
    backward, ``dS = A ⊙ (∇A - D)``), and ``u += r · mean_h (∇A ⊙ A)⁺`` for the tile's keys.
    """
    b, h, n_q, _ = q.shape
    n_k = k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if bias is not None:
        bias = bias.expand(b, h, n_q, n_k)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    update = torch.zeros(b, n_k, dtype=q.dtype, device=q.device)
    d = (dout * out).sum(dim=-1)  # [B, H, N_q]
    for qs in _spans(n_q, block_q):
        for ks in _spans(n_k, block_k):
            s = _tile_scores(q, k, bias, causal, qs, ks, scale)
            shift = lse[:, :, qs, None]
            a = torch.where(torch.isinf(shift), torch.zeros_like(s), torch.exp(s - shift))
            grad_a = dout[:, :, qs] @ v[:, :, ks].transpose(-2, -1)
            update[:, ks] += torch.einsum("bq,bhqk->bk", row[:, qs], (grad_a * a).clamp(min=0)) / h
            ds = a * (grad_a - d[:, :, qs, None])
            dq[:, :, qs] += ds @ k[:, :, ks] * scale
            dk[:, :, ks] += ds.transpose(-2, -1) @ q[:, :, qs] * scale
            dv[:, :, ks] += a.transpose(-2, -1) @ dout[:, :, qs]
    return dq, dk, dv, update
