"""GAE's attention step as one Triton kernel: the attention backward that also emits the row update.

For each head, a flash-attention-style backward visits the scores one ``BLOCK_Q x BLOCK_K`` tile at a time from
the forward's per-query log-sum-exp, so nothing ``N x N`` is stored, and gives the gradients of ``q``, ``k``, ``v``
together with GAE's row form of Eq. 5-6, ``u = r · E_h[(∇A ⊙ A)⁺]`` with ``∇A = dO · Vᵀ``. One program per
(block of keys, batch x head) accumulates ``dK``, ``dV`` and its keys' share of ``u`` over every block of queries;
``dQ`` and ``u`` (a sum over heads) are added atomically.

Status: the kernel's semantics equal :mod:`lightning_gae.engine.lean`'s chunked backward (tests/test_triton_gae.py, run
under Triton's CPU interpreter, ``TRITON_INTERPRET=1``, where ``triton`` is installed). ``lean_attention``'s
row form runs it when asked (``LIGHTNING_GAE_KERNEL=triton``, :mod:`lightning_gae.engine.lean`); on CUDA the default
is the FlashAttention-2-shaped kernel (:mod:`.triton_gae_fa2`), and this one stays for comparison: its errors and
per-call times on a GPU are on the contributing page (the Triton kernel). Masks it takes: causal, and an additive
bias per key (padding); others stay on the lean path. Products in exact float32 by default (``precision="ieee"``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of torch; a CPU build has none, and nothing here is used then.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None

__all__ = ["available", "gae_attention_backward"]


def available() -> bool:
    """Whether Triton can be imported here."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _backward_kernel(Q, K, V, DO, LSE, D, ROW, KEY_BIAS, DQ, DK, DV, UPD,
                         heads, n_q, n_k, scale,
                         HAS_KEY_BIAS: tl.constexpr, CAUSAL: tl.constexpr,
                         BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
                         PRECISION: tl.constexpr):
        pid_k = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // heads
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        offs_e = tl.arange(0, E_PAD)
        k_in = offs_k < n_k
        e_in = offs_e < E
        kv_mask = k_in[:, None] & e_in[None, :]
        k = tl.load(K + bh * n_k * E + offs_k[:, None] * E + offs_e[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + bh * n_k * E + offs_k[:, None] * E + offs_e[None, :], mask=kv_mask, other=0.0)
        key_bias = tl.zeros([BLOCK_K], dtype=tl.float32)
        if HAS_KEY_BIAS:
            key_bias = tl.load(KEY_BIAS + b * n_k + offs_k, mask=k_in, other=0.0)
        dk = tl.zeros([BLOCK_K, E_PAD], dtype=tl.float32)
        dv = tl.zeros([BLOCK_K, E_PAD], dtype=tl.float32)
        upd = tl.zeros([BLOCK_K], dtype=tl.float32)
        for start in range(0, n_q, BLOCK_Q):
            offs_q = start + tl.arange(0, BLOCK_Q)
            q_in = offs_q < n_q
            qe_mask = q_in[:, None] & e_in[None, :]
            q = tl.load(Q + bh * n_q * E + offs_q[:, None] * E + offs_e[None, :], mask=qe_mask, other=0.0)
            do = tl.load(DO + bh * n_q * E + offs_q[:, None] * E + offs_e[None, :], mask=qe_mask, other=0.0)
            lse = tl.load(LSE + bh * n_q + offs_q, mask=q_in, other=float("inf"))
            d = tl.load(D + bh * n_q + offs_q, mask=q_in, other=0.0)
            r = tl.load(ROW + b * n_q + offs_q, mask=q_in, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale + key_bias[None, :]
            valid = q_in[:, None] & k_in[None, :] & (lse[:, None] != float("-inf"))
            if CAUSAL:
                valid = valid & (offs_k[None, :] <= offs_q[:, None])
            # A query that sees no key has lse -inf and probabilities 0; masked keys have scores -inf.
            p = tl.where(valid, tl.exp(s - tl.where(valid, lse[:, None], 0.0)), 0.0)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            upd += tl.sum(r[:, None] * tl.maximum(dp * p, 0.0), axis=0)
            ds = p * (dp - d[:, None])
            dv += tl.dot(tl.trans(p), do, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds), q, input_precision=PRECISION)
            dq = tl.dot(ds, k, input_precision=PRECISION) * scale
            tl.atomic_add(DQ + bh * n_q * E + offs_q[:, None] * E + offs_e[None, :], dq, mask=qe_mask)
        tl.store(DK + bh * n_k * E + offs_k[:, None] * E + offs_e[None, :], dk * scale, mask=kv_mask)
        tl.store(DV + bh * n_k * E + offs_k[:, None] * E + offs_e[None, :], dv, mask=kv_mask)
        tl.atomic_add(UPD + b * n_k + offs_k, upd / heads, mask=k_in)


def gae_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, row: Tensor,
                           key_bias: Tensor | None = None, causal: bool = False, scale: float | None = None,
                           block_q: int = 16, block_k: int = 16, precision: str = "ieee") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, update)`` of attention ``softmax(scale · q kᵀ + key_bias) v`` (``[B, H, N, E]``, one head
    dimension for q, k and v), given its output ``out``, each query's log-sum-exp ``lse [B, H, N_q]`` (-inf where a
    query sees no key), the output's gradient ``dout`` and the relevance row ``row [B, N_q]``; ``update [B, N_k]``
    is ``row · E_h[(∇A ⊙ A)⁺]``. ``key_bias [B, N_k]`` is added to every query's scores (-inf: padding); ``causal``
    hides the keys after each query. Float32 accumulation; results in float32. ``precision``: Triton's
    ``input_precision`` of the products, ``"ieee"`` (exact float32) or ``"tf32"`` (tensor cores, ~1e-3 relative).
    """
    if triton is None:
        raise RuntimeError("gae_attention_backward needs Triton (it ships with CUDA builds of torch; "
                           "`pip install triton` elsewhere, with TRITON_INTERPRET=1 to run it on a CPU)")
    b, h, n_q, e = q.shape
    n_k = k.shape[-2]
    if v.shape[-1] != e:
        raise ValueError(f"gae_attention_backward takes one head dimension for q, k and v; got {e} and {v.shape[-1]}")
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    f32 = [t.float().contiguous() for t in (q, k, v, dout)]
    qf, kf, vf, dof = f32
    d = (dof * out.float()).sum(dim=-1).contiguous()
    dq = torch.zeros_like(qf)
    dk, dv = torch.empty_like(kf), torch.empty_like(vf)
    update = torch.zeros(b, n_k, dtype=torch.float32, device=q.device)
    bias = key_bias.float().contiguous() if key_bias is not None else torch.zeros(1, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n_k, block_k), b * h)
    _backward_kernel[grid](qf, kf, vf, dof, lse.float().contiguous(), d, row.float().contiguous(), bias,
                           dq, dk, dv, update, h, n_q, n_k, scale,
                           HAS_KEY_BIAS=key_bias is not None, CAUSAL=causal, BLOCK_Q=block_q, BLOCK_K=block_k,
                           E=e, E_PAD=max(16, triton.next_power_of_2(e)), PRECISION=precision)
    return dq, dk, dv, update
