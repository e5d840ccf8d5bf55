"""GAE's attention step as a FlashAttention-2-shaped Triton backward, beside :mod:`.triton_gae` for an A/B.

The same quantities as the first kernel: the gradients of ``q``, ``k``, ``v`` of ``softmax(scale · q kᵀ + key_bias) v``
and GAE's row update ``u = r · E_h[(∇A ⊙ A)⁺]`` (Eq. 5-6 in row form, ``∇A = dO · Vᵀ``), from the forward's per-query
log-sum-exp, nothing ``N x N`` stored. What differs is the shape of the work:

* one program per block of 64-128 keys and one (batch, head); it loads its keys and values once and loops over slabs
  of queries on transposed tiles (``Sᵀ = K Qᵀ``), so ``dK``, ``dV`` and the keys' update stay in registers and are
  written once;
* ``dQ`` by relaxed atomic adds into a float32 buffer (``dq="atomic"``), or by a second kernel that loops over keys
  per block of queries (``dq="loop"``: no atomics, and bit-identical ``dQ`` from run to run);
* a causal mask starts each program's loop at the diagonal; only the diagonal tiles and the ragged last slab of
  queries are masked (keys past the end, and padding, are a ``-inf`` per key, added once per tile);
* a slab whose ``dO`` is all zero is skipped (row mode's top layer has one non-zero row, the read-out's);
* ``grads=False``: the update alone (the lowest layer's ``dQ``, ``dK``, ``dV`` are never used), which also skips the
  slabs whose relevance is zero;
* the update is written per head without atomics and summed over heads by PyTorch: two runs give the same bits;
* 64-bit offsets; block sizes autotuned on a GPU, keyed on (token count rounded up to a power of two, head
  dimension, causal, precision, gradients or not, dQ mode, dtypes), ``dQ`` reset to zero between trials.

Determinism: the update of one call is the same bits from run to run; ``dQ`` by atomics is not on a GPU (the adds'
order varies), and through the layers of a model it reaches the lower layers' ``dO`` and so their updates.
``dq="loop"`` makes the whole backward deterministic.

Precision: float32 operands multiply as ``tf32x3`` (three TF32 products, about float32's accuracy) with float32
accumulation; bfloat16 / float16 operands stay in their dtype with float32 accumulation, and the probabilities and
``dS`` are rounded to it before their products, as FlashAttention does. Under Triton's CPU interpreter every product
runs in numpy's float32 (``input_precision`` is not emulated), and bfloat16 operands are widened to float32 before
the product (the interpreter's own bfloat16 product multiplies the raw bits, Triton 3.9): exact products of the
rounded operands, which is what a tensor core computes too. The precision of ``tf32x3`` is therefore checked only on
a GPU (tests/test_triton_gae_fa2.py, ``benchmarks/kernel_gpu.py``).

A query whose log-sum-exp is not finite (``-inf``, ``+inf``, NaN) sees no key: its probabilities are 0. The
log-sum-exp may be padded past ``N_q`` (PyTorch's memory-efficient forward returns ``[B, H, ceil(N/32)·32]``).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of torch; a CPU build has none, and nothing here is used then.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None

__all__ = ["available", "gae_attention_backward_fa2", "forward_with_lse", "DEFAULT_ON_CUDA"]

DEFAULT_ON_CUDA = True
"""Whether :mod:`lightning_gae.engine.lean`'s row form runs this kernel on CUDA without being asked
(``LIGHTNING_GAE_KERNEL=chunks`` forces the chunks then): on, since it is faster than the chunks at every size measured
on an H200 (ViT-B/16 at batch 64, BERT-base at 512 and 4,096 tokens, a Llama-style decoder at 8,192)."""

_LOG2E = 1.4426950408889634


def available() -> bool:
    """Whether Triton can be imported here."""
    return triton is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if triton is not None:

    @triton.jit
    def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        # UPCAST (the CPU interpreter only): half-precision operands widened first, their products exact in float32.
        if UPCAST:
            c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        elif PRECISION == "default":
            c = tl.dot(a, b)
        else:
            c = tl.dot(a, b, input_precision=PRECISION)
        return c

    @triton.jit
    def _block(start, n, bh, E, BLOCK: tl.constexpr, E_PAD: tl.constexpr):
        """Rows ``start .. start + BLOCK`` of a ``[B*H, n, E]`` tensor: their indices, the feature indices, which rows
        exist, the load/store mask and the 64-bit offsets."""
        offs = start + tl.arange(0, BLOCK)
        offs_e = tl.arange(0, E_PAD)
        inside = offs < n
        mask = inside[:, None] & (offs_e[None, :] < E)
        rows = bh * n * E + offs[:, None] * E + offs_e[None, :]
        return offs, offs_e, inside, mask, rows

    @triton.jit
    def _key_block(K, V, KEY_BIAS, b, n_k, offs_k, k_in, kv_mask, kv_rows, HAS_KEY_BIAS: tl.constexpr):
        """A block of keys and values, and per key the bias in log2 units: -inf past the last key and on padding,
        so that no tile needs a key mask."""
        k = tl.load(K + kv_rows, mask=kv_mask, other=0.0)
        v = tl.load(V + kv_rows, mask=kv_mask, other=0.0)
        kb = tl.where(k_in, 0.0, float("-inf"))
        if HAS_KEY_BIAS:
            kb += tl.load(KEY_BIAS + b * n_k + offs_k, mask=k_in, other=0.0) * 1.4426950408889634
        return k, v, kb

    @triton.jit
    def _key_slab(dk, dv, u, k, v, kb, offs_k, start, bh, b, Q, DO, LSE, D, ROW, LIVE, DQ,
                  n_q, lse_stride, qk_scale, scale,
                  MASK_Q: tl.constexpr, MASK_CAUSAL: tl.constexpr, NEED_GRADS: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                  BLOCK_Q: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, PRECISION: tl.constexpr,
                  UPCAST: tl.constexpr):
        """One slab of queries against the program's keys: the transposed tile ``[BLOCK_K, BLOCK_Q]``."""
        offs_q = start + tl.arange(0, BLOCK_Q)
        offs_e = tl.arange(0, E_PAD)
        q_in = offs_q < n_q
        if MASK_Q:
            live = tl.load(LIVE + bh * n_q + offs_q, mask=q_in, other=0)
        else:
            live = tl.load(LIVE + bh * n_q + offs_q)
        if tl.max(live, axis=0) != 0:
            qe = q_in[:, None] & (offs_e[None, :] < E)
            rows = bh * n_q * E + offs_q[:, None] * E + offs_e[None, :]
            if MASK_Q or E != E_PAD:
                q = tl.load(Q + rows, mask=qe, other=0.0)
                do = tl.load(DO + rows, mask=qe, other=0.0)
            else:
                q = tl.load(Q + rows)
                do = tl.load(DO + rows)
            if MASK_Q:
                lse = tl.load(LSE + bh * lse_stride + offs_q, mask=q_in, other=float("inf"))
                r = tl.load(ROW + b * n_q + offs_q, mask=q_in, other=0.0)
            else:
                lse = tl.load(LSE + bh * lse_stride + offs_q)
                r = tl.load(ROW + b * n_q + offs_q)
            # Not finite: the query sees no key (+inf gives probabilities exp2(s - inf) = 0).
            lse = tl.where((lse > float("-inf")) & (lse < float("inf")), lse * 1.4426950408889634, float("inf"))
            st = _dot(k, tl.trans(q), PRECISION, UPCAST) * qk_scale + kb[:, None]
            if MASK_CAUSAL:
                st = tl.where(offs_k[:, None] <= offs_q[None, :], st, float("-inf"))
            pt = tl.exp2(st - lse[None, :])
            dpt = _dot(v, tl.trans(do), PRECISION, UPCAST)  # ∇Aᵀ
            u += tl.sum(tl.maximum(dpt * pt, 0.0) * r[None, :], axis=1)
            if NEED_GRADS:
                if MASK_Q:
                    d = tl.load(D + bh * n_q + offs_q, mask=q_in, other=0.0)
                else:
                    d = tl.load(D + bh * n_q + offs_q)
                dv += _dot(pt.to(do.dtype), do, PRECISION, UPCAST)
                dst = pt * (dpt - d[None, :])
                dk += _dot(dst.to(q.dtype), q, PRECISION, UPCAST)
                if DQ_ATOMIC:
                    dq = _dot(tl.trans(dst).to(k.dtype), k, PRECISION, UPCAST) * scale
                    if MASK_Q or E != E_PAD:
                        tl.atomic_add(DQ + rows, dq, mask=qe, sem="relaxed")
                    else:
                        tl.atomic_add(DQ + rows, dq, sem="relaxed")
        return dk, dv, u

    @triton.jit
    def _fa2_kernel(Q, K, V, DO, LSE, D, ROW, LIVE, KEY_BIAS, DQ, DK, DV, UPD,
                    heads, n_q, n_k, lse_stride, scale, n_bucket,
                    HAS_KEY_BIAS: tl.constexpr, CAUSAL: tl.constexpr, NEED_GRADS: tl.constexpr,
                    DQ_ATOMIC: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, E: tl.constexpr,
                    E_PAD: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        pid_k = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)  # every offset below is 64-bit from here
        b = bh // heads
        k0 = pid_k * BLOCK_K
        offs_k, offs_e, k_in, kv_mask, kv_rows = _block(k0, n_k, bh, E, BLOCK_K, E_PAD)
        k, v, kb = _key_block(K, V, KEY_BIAS, b, n_k, offs_k, k_in, kv_mask, kv_rows, HAS_KEY_BIAS)
        qk_scale = scale * 1.4426950408889634
        dk = tl.zeros([BLOCK_K, E_PAD], dtype=tl.float32)
        dv = tl.zeros([BLOCK_K, E_PAD], dtype=tl.float32)
        u = tl.zeros([BLOCK_K], dtype=tl.float32)
        full_end = (n_q // BLOCK_Q) * BLOCK_Q  # the slabs before it are full
        lo = 0
        if CAUSAL:
            # Queries before the block's first key see none of its keys: start at the diagonal's slab. The slabs whose
            # first query comes before the block's last key straddle the diagonal: masked.
            lo = (k0 // BLOCK_Q) * BLOCK_Q
            diag_end = tl.minimum(tl.cdiv(k0 + BLOCK_K - 1, BLOCK_Q) * BLOCK_Q, full_end)
            for start in range(lo, diag_end, BLOCK_Q):
                dk, dv, u = _key_slab(dk, dv, u, k, v, kb, offs_k, start, bh, b, Q, DO, LSE, D, ROW, LIVE, DQ,
                                      n_q, lse_stride, qk_scale, scale, False, True, NEED_GRADS, DQ_ATOMIC,
                                      BLOCK_Q, E, E_PAD, PRECISION, UPCAST)
            lo = tl.maximum(diag_end, lo)
        for start in range(lo, full_end, BLOCK_Q):
            dk, dv, u = _key_slab(dk, dv, u, k, v, kb, offs_k, start, bh, b, Q, DO, LSE, D, ROW, LIVE, DQ,
                                  n_q, lse_stride, qk_scale, scale, False, False, NEED_GRADS, DQ_ATOMIC,
                                  BLOCK_Q, E, E_PAD, PRECISION, UPCAST)
        if full_end < n_q:  # the ragged last slab (at or after the diagonal's: lo <= full_end)
            dk, dv, u = _key_slab(dk, dv, u, k, v, kb, offs_k, full_end, bh, b, Q, DO, LSE, D, ROW, LIVE, DQ,
                                  n_q, lse_stride, qk_scale, scale, True, CAUSAL, NEED_GRADS, DQ_ATOMIC,
                                  BLOCK_Q, E, E_PAD, PRECISION, UPCAST)
        if NEED_GRADS:
            tl.store(DK + kv_rows, dk * scale, mask=kv_mask)
            tl.store(DV + kv_rows, dv, mask=kv_mask)
        # This head's share, written once; the host sums the heads (no atomics: the same bits every run).
        tl.store(UPD + bh * n_k + offs_k, u, mask=k_in)

    @triton.jit
    def _dq_kernel(Q, K, V, DO, LSE, D, LIVE, KEY_BIAS, DQ,
                   heads, n_q, n_k, lse_stride, scale, n_bucket,
                   HAS_KEY_BIAS: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                   E: tl.constexpr, E_PAD: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        """``dQ`` without atomics: one program per block of queries, looping over the keys (the second-loop variant)."""
        pid_q = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        b = bh // heads
        q0 = pid_q * BLOCK_Q
        offs_q, offs_e, q_in, qe, rows = _block(q0, n_q, bh, E, BLOCK_Q, E_PAD)
        dq = tl.zeros([BLOCK_Q, E_PAD], dtype=tl.float32)
        live = tl.load(LIVE + bh * n_q + offs_q, mask=q_in, other=0)
        if tl.max(live, axis=0) != 0:
            q = tl.load(Q + rows, mask=qe, other=0.0)
            do = tl.load(DO + rows, mask=qe, other=0.0)
            lse = tl.load(LSE + bh * lse_stride + offs_q, mask=q_in, other=float("inf"))
            lse = tl.where((lse > float("-inf")) & (lse < float("inf")), lse * 1.4426950408889634, float("inf"))
            d = tl.load(D + bh * n_q + offs_q, mask=q_in, other=0.0)
            qk_scale = scale * 1.4426950408889634
            hi = n_k
            if CAUSAL:
                hi = tl.minimum(n_k, q0 + BLOCK_Q)
            for start in range(0, hi, BLOCK_K):
                offs_k, _, k_in, kv_mask, kv_rows = _block(start, n_k, bh, E, BLOCK_K, E_PAD)
                k, v, kb = _key_block(K, V, KEY_BIAS, b, n_k, offs_k, k_in, kv_mask, kv_rows, HAS_KEY_BIAS)
                s = _dot(q, tl.trans(k), PRECISION, UPCAST) * qk_scale + kb[None, :]
                if CAUSAL:
                    s = tl.where(offs_k[None, :] <= offs_q[:, None], s, float("-inf"))
                p = tl.exp2(s - lse[:, None])
                dp = _dot(do, tl.trans(v), PRECISION, UPCAST)
                ds = p * (dp - d[:, None])
                dq += _dot(ds.to(k.dtype), k, PRECISION, UPCAST)
        tl.store(DQ + rows, dq * scale, mask=qe)

    def _configs(names: tuple[str, str], pairs: list[tuple[int, int, int, int]]) -> list:
        return [triton.Config({names[0]: a, names[1]: c}, num_warps=w, num_stages=s) for a, c, w, s in pairs]

    # (BLOCK_Q, BLOCK_K, warps, stages): keys in blocks of 64-128, slabs of 16-64 queries.
    # Few, since each is compiled per variant on first use (a GPU check's minutes go there). Compiled for sm_90
    # without a GPU (Triton 3.9, E = 64, float32 tf32x3, causal, dQ by atomics), every one of these runs out of
    # registers (ptxas stack 776-1056 bytes; 1216 for 32 x 64 with 4 warps, 1920 for 64 x 128): tf32x3 splits the
    # operands (plain tf32: 208). Eight warps spill least; bfloat16 far less (248 at 64 x 128).
    _KEY_CONFIGS = [(16, 64, 4, 2), (16, 128, 8, 2), (32, 64, 8, 2), (32, 128, 8, 2), (64, 64, 8, 2)]
    _DQ_CONFIGS = [(64, 32, 4, 2), (64, 64, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2)]
    _AUTOTUNE_KEY = ["n_bucket", "E", "CAUSAL", "PRECISION"]  # (and the tensors' dtypes, which Triton adds)
    fa2_tuned = triton.autotune(_configs(("BLOCK_Q", "BLOCK_K"), _KEY_CONFIGS),
                                 key=[*_AUTOTUNE_KEY, "NEED_GRADS", "DQ_ATOMIC"], reset_to_zero=["DQ"])(_fa2_kernel)
    _dq_tuned = triton.autotune(_configs(("BLOCK_Q", "BLOCK_K"), _DQ_CONFIGS), key=_AUTOTUNE_KEY)(_dq_kernel)


_HALF = (torch.float16, torch.bfloat16)


def gae_attention_backward_fa2(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, row: Tensor,
                               key_bias: Tensor | None = None, causal: bool = False, scale: float | None = None,
                               grads: bool = True, dq: str = "atomic", precision: str | None = None,
                               block_q: int | None = None, block_k: int | None = None,
                               num_warps: int | None = None, num_stages: int | None = None,
                               skip_dead: bool = True) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor]:
    """``(dq, dk, dv, update)`` of attention ``softmax(scale · q kᵀ + key_bias) v`` (``[B, H, N, E]``, one head
    dimension for q, k and v), given its output ``out``, each query's log-sum-exp ``lse [B, H, L]`` (``L >= N_q``;
    natural log; a non-finite entry: the query sees no key), the output's gradient ``dout`` and the relevance row
    ``row [B, N_q]``; ``update [B, N_k]`` is ``row · E_h[(∇A ⊙ A)⁺]``. ``key_bias [B, N_k]`` is added to every query's
    scores (-inf: padding); ``causal`` hides the keys after each query (top-left aligned).

    ``grads=False``: the update alone (``dq``, ``dk``, ``dv`` are None). ``dq``: ``"atomic"`` (relaxed atomic adds)
    or ``"loop"`` (a second kernel, no atomics). ``precision``: Triton's ``input_precision`` for float32 operands
    (default ``"tf32x3"``; ``"ieee"``, ``"tf32"`` for comparisons); half-precision operands keep their dtype.
    ``block_q``/``block_k`` (and ``num_warps``, ``num_stages``): fixed tiles (default: autotuned on a GPU, 32 x 64
    under the interpreter).
    ``skip_dead=False`` visits the slabs whose ``dO`` is zero too (for the A/B). Results in float32.
    """
    if triton is None:
        raise RuntimeError("gae_attention_backward_fa2 needs Triton (it ships with CUDA builds of torch; "
                           "`pip install triton` elsewhere, with TRITON_INTERPRET=1 to run it on a CPU)")
    if dq not in ("atomic", "loop"):
        raise ValueError(f"dq is 'atomic' or 'loop'; got {dq!r}")
    b, h, n_q, e = q.shape
    n_k = k.shape[-2]
    if v.shape[-1] != e or k.shape[-1] != e:
        raise ValueError(f"gae_attention_backward_fa2 takes one head dimension for q, k and v; got {e}, {k.shape[-1]}, {v.shape[-1]}")
    if lse.shape[:2] != (b, h) or lse.shape[-1] < n_q:
        raise ValueError(f"lse must be [B, H, >= N_q] = [{b}, {h}, >= {n_q}]; got {list(lse.shape)}")
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    half = q.dtype in _HALF
    operand = q.dtype if half else torch.float32
    if precision is None:
        precision = "default" if half else "tf32x3"
    qc, kc, vc, doc = (t.to(operand).contiguous() for t in (q, k, v, dout))
    lse_c = lse.float().contiguous()
    dev = q.device
    # Zero where a query sees no key (its output is 0, or NaN from some fused forwards): that row's dS is then 0.
    d = (dout.float() * out.float()).sum(dim=-1).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).contiguous()
    live = (dout != 0).any(dim=-1) if skip_dead else torch.ones(b, h, n_q, dtype=torch.bool, device=dev)
    if not grads:  # the update alone: a query whose relevance is 0 adds nothing
        live = live & (row != 0)[:, None, :]
    live = live.to(torch.int8).contiguous()
    rowc = row.float().contiguous()
    bias = key_bias.float().contiguous() if key_bias is not None else torch.zeros(1, dtype=torch.float32, device=dev)
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    dq_buf = dk_buf = dv_buf = None
    if grads:
        dq_buf = torch.zeros(b, h, n_q, e, dtype=torch.float32, device=dev) if dq == "atomic" else \
            torch.empty(b, h, n_q, e, dtype=torch.float32, device=dev)
        dk_buf = torch.empty(b, h, n_k, e, dtype=torch.float32, device=dev)
        dv_buf = torch.empty(b, h, n_k, e, dtype=torch.float32, device=dev)
    upd = torch.empty(b, h, n_k, dtype=torch.float32, device=dev)
    interp = _interpreting()
    e_pad = max(16, triton.next_power_of_2(e))
    bucket = triton.next_power_of_2(max(n_q, n_k))
    common = dict(HAS_KEY_BIAS=key_bias is not None, CAUSAL=causal, E=e, E_PAD=e_pad, PRECISION=precision,
                  UPCAST=interp and half)
    fixed = block_q is not None or block_k is not None or interp or not q.is_cuda
    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    args = (qc, kc, vc, doc, lse_c, d, rowc, live, bias, dq_buf if dq_buf is not None and dq == "atomic" else dummy,
            dk_buf if grads else dummy, dv_buf if grads else dummy, upd, h, n_q, n_k, lse_c.shape[-1], scale, bucket)
    flags = dict(NEED_GRADS=grads, DQ_ATOMIC=grads and dq == "atomic", **common)
    if fixed:
        bq, bk = block_q or 32, block_k or 64
        _fa2_kernel[(triton.cdiv(n_k, bk), b * h)](*args, BLOCK_Q=bq, BLOCK_K=bk, **flags, **launch)
    else:
        fa2_tuned[lambda meta: (triton.cdiv(n_k, meta["BLOCK_K"]), b * h)](*args, **flags)
    if grads and dq == "loop":
        dq_args = (qc, kc, vc, doc, lse_c, d, live, bias, dq_buf, h, n_q, n_k, lse_c.shape[-1], scale, bucket)
        if fixed:
            bq, bk = block_q or 32, block_k or 64
            _dq_kernel[(triton.cdiv(n_q, bq), b * h)](*dq_args, BLOCK_Q=bq, BLOCK_K=bk, **common, **launch)
        else:
            _dq_tuned[lambda meta: (triton.cdiv(n_q, meta["BLOCK_Q"]), b * h)](*dq_args, **common)
    update = upd.sum(dim=1).div_(h)
    return dq_buf, dk_buf, dv_buf, update


def forward_with_lse(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool,
                     scale: float) -> tuple[Tensor, Tensor] | None:
    """Attention's output and each query's log-sum-exp ``[B, H, L >= N_q]`` (float32, natural log) from PyTorch's
    fused CUDA forwards: flash attention for half precision without a bias, the memory-efficient kernel otherwise
    (its log-sum-exp padded to a multiple of 32 with +inf). None where neither applies (not CUDA, a shape or dtype
    they refuse): the caller then runs its own forward and a log-sum-exp pass."""
    if not q.is_cuda:
        return None
    try:
        if q.dtype in _HALF and bias is None:
            res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
            return res[0], res[1]
        attn_bias = None
        if bias is not None:
            n_k = k.shape[-2]
            bias = bias.to(q.dtype)
            # The efficient kernel wants the bias's rows aligned to 16 elements (as SDPA's own wrapper pads them).
            pad = (-n_k) % 16
            if pad:
                bias = torch.nn.functional.pad(bias, (0, pad))[..., :n_k]
            attn_bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], n_k)
        res = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, attn_bias, True, 0.0, causal, scale=scale)
        return res[0], res[1]
    except (RuntimeError, NotImplementedError):
        return None
