"""GAE inside the backward pass: scaled-dot-product attention that keeps nothing ``N x N``.

Recording every layer's ``[B, H, N, N]`` probabilities for ``autograd.grad`` costs ``L·B·H·N²``
floats, far more than training's fused attention keeps. This module's attention runs the fused
kernel forward and, in backward, recomputes the probabilities chunk by chunk over queries (the way
fused kernels do), returns the exact gradients of ``q``, ``k``, ``v`` (and of an additive mask that
requires grad, such as T5's position bias), and meanwhile computes ``Ā = E_h[(∇A ⊙ A)⁺]`` (Eq. 5)
for that chunk, with ``∇A = dO · Vᵀ``. What happens to ``Ā`` is the :class:`LeanState`'s mode:

* ``"row"``: the row form of Eq. 6, ``r ← r + r·Ā``, applied at once. The backward pass visits
  the layers last first, which is the row form's order, so nothing per layer is kept;
* ``"store"``: ``Ā`` is kept (``[B, Nq, Nk]``, heads already averaged) for the matrix form of
  models with several token sets.

With ``LIGHTNING_GAE_KERNEL=triton`` in the environment (and Triton importable), the row form runs as one Triton
kernel per call instead of the chunks (:mod:`lightning_gae.engine.triton_gae`: tiles of queries and keys, nothing
``N x N``), where its masks allow (none, causal, or one additive bias per key); otherwise the chunks run.
``LIGHTNING_GAE_KERNEL=triton2`` runs the FlashAttention-2-shaped kernel instead (:mod:`lightning_gae.engine.triton_gae_fa2`:
the log-sum-exp from the fused CUDA forward, the lowest layer's update alone), which is also what CUDA tensors get
when nothing is asked (``triton_gae_fa2.DEFAULT_ON_CUDA``); ``chunks`` forces the chunks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_gae.engine.attention import additive_mask

__all__ = ["LeanState", "LeanCall", "lean_attention"]

# A chunk of queries holds at most this many float32 scores (B·H·chunk·Nk): 16 MiB per buffer, three
# buffers. Larger chunks gain little time and cost memory (at N = 2049, 2^24 took 3x a training step's peak).
CHUNK_ELEMENTS = 1 << 22
MIN_QUERIES = 128


@dataclass
class LeanCall:
    """One attention call made by :func:`lean_attention`: its place and what its keys can see."""

    index: int
    attended: Tensor | None = None  # [B, Nk] bool: keys some query may attend to (None: all)
    # [Nq] int: 1 + the last key any sample or head lets each query see (None: all). A causal mask's
    # chunk of queries then skips the keys after its last query, whose probabilities are exactly 0.
    key_limits: Tensor | None = None
    # Whether the additive mask is one value per key (the same for every query), as a Triton kernel takes it; None:
    # not asked (no kernel runs, or no mask).
    bias_per_key: bool | None = None


@dataclass
class LeanState:
    """What the backward pass does with each call's ``Ā``; shared by the calls of one forward."""

    mode: str = "store"
    row: Tensor | None = None
    abars: dict[int, Tensor] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    calls: set[int] | None = None  # the calls whose Ā is wanted (attention_modules may select some); None: all
    # The backward's chunk buffers, shared by the calls (their backwards run one after another): fresh
    # N x N-sized blocks per layer would be paged in again by every layer.
    workspace: list[Tensor] = field(default_factory=list)
    # The row form as a Triton kernel per call (see the module doc): LIGHTNING_GAE_KERNEL, read when made.
    kernel: str = field(default_factory=lambda: os.environ.get("LIGHTNING_GAE_KERNEL", ""))
    # What each mask tells (its key limits; whether it is one bias per key), found once per forward: the layers share
    # one mask, and each finding reads a GPU value back, a synchronisation that leaves the GPU idle while Python
    # catches up (a dozen per forward cost a fifth of a BERT-base explanation at batch 8 on an H200).
    mask_facts: list[tuple[Tensor, int, tuple, tuple]] = field(default_factory=list)

    def facts(self, mask: Tensor, key: tuple, find: Callable[[], tuple]) -> tuple:
        """``find()`` for ``mask`` and ``key``, computed once while ``mask`` is the same tensor, unchanged in place."""
        for held, version, held_key, found in self.mask_facts:
            if held is mask and version == mask._version and held_key == key:
                return found
        found = find()
        self.mask_facts.append((mask, mask._version, key, found))
        return found

    def buffers(self, size: int, dtype: torch.dtype, device: torch.device) -> list[Tensor]:
        """Three flat buffers of at least ``size`` elements, reused from the previous call when they fit."""
        fits = len(self.workspace) == 3 and all(
            w.numel() >= size and w.dtype == dtype and w.device == device for w in self.workspace)
        if not fits:
            self.workspace = []  # dropped before the new ones are made
            self.workspace = [torch.empty(size, dtype=dtype, device=device) for _ in range(3)]
        return self.workspace


def _reduce_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """Sum a broadcast gradient back to ``shape`` (an additive mask broadcast over batch or heads)."""
    while grad.dim() > len(shape):
        grad = grad.sum(dim=0)
    dims = [i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1]
    return grad.sum(dim=dims, keepdim=True) if dims else grad


def query_chunks(heads: int, n_q: int, n_k: int, limits: Tensor | None) -> list[tuple[int, int, int]]:
    """``(first query, end, keys)`` of each chunk of queries the backward pass takes at once.

    A chunk holds at most :data:`CHUNK_ELEMENTS` scores (``heads · queries · keys``), or :data:`MIN_QUERIES` queries' worth. With
    ``limits`` (each query's last visible key + 1, a causal mask's) a chunk's keys end at its queries'
    largest limit, so the early chunks of a causal mask take more queries: fewer, larger operations.
    """
    # At least MIN_QUERIES queries per chunk (past N ~ 4096 keys that is more than CHUNK_ELEMENTS): a chunk's
    # dozen and a half operations cost the same whatever its size, and they add up over thousands of chunks.
    budget = max(CHUNK_ELEMENTS, heads * n_k * MIN_QUERIES)
    base = max(1, min(n_q, budget // max(1, heads * n_k)))
    spans = []
    start = 0
    while start < n_q:
        rows = min(base, n_q - start)
        if limits is not None:
            while start + rows < n_q:
                grow = min(n_q - start, 2 * rows)
                if heads * grow * int(limits[start:start + grow].max()) > budget:
                    break
                rows = grow
        stop = start + rows
        spans.append((start, stop, n_k if limits is None else max(1, int(limits[start:stop].max()))))
        start = stop
    return spans


def _causal_above(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A causal mask without a bias tensor, ``[size, size]``: -inf above the diagonal, which only a chunk's own block
    of keys (from its first query on) has; the keys before it are open to every query."""
    return torch.zeros(size, size, dtype=dtype, device=device).masked_fill_(
        torch.ones(size, size, dtype=torch.bool, device=device).triu_(1), -math.inf)


def _causal_block(above: Tensor, rows: int, width: int) -> Tensor:
    """The causal mask of a chunk of ``rows`` queries over its own block of ``width`` keys."""
    if width <= above.shape[1]:
        return above[:rows, :width]
    return torch.zeros(rows, width, dtype=above.dtype, device=above.device).masked_fill_(
        torch.ones(rows, width, dtype=torch.bool, device=above.device).triu_(1), -math.inf)


def _add_bias_grad(dbias: Tensor, ds4: Tensor, bias: Tensor, sl: slice, n_q: int, nk: int) -> None:
    """A chunk's score gradient ``ds4`` ``[B, H, rows, nk]`` (queries ``sl``) added to the bias's own, reduced to the
    bias's broadcast shape."""
    if bias.shape[-2] == n_q:
        dbias[..., sl, :nk] += _reduce_to(ds4, bias[..., sl, :nk].shape)
    else:
        dbias[..., :nk] += _reduce_to(ds4, bias[..., :nk].shape)


def _rows(bias: Tensor | None, sl: slice, n_q: int) -> Tensor | None:
    if bias is None:
        return None
    return bias if bias.shape[-2] == 1 or bias.shape[-2] != n_q else bias[..., sl, :]


class LeanAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, token, scale, state, call, causal):  # type: ignore[override]
        del token  # only there so that autograd.grad(score, token) runs every call's backward
        fused = None
        if _kernel_name(state, q) == "triton2":
            # The second kernel reads each query's log-sum-exp from CUDA's fused forward (None elsewhere). Kept whatever
            # the mode: the row form is chosen after the forward (explain sets it before its backward).
            from lightning_gae.engine.triton_gae_fa2 import forward_with_lse

            fused = forward_with_lse(q, k, v, bias, causal, scale)
        out, ctx.lse = fused if fused is not None else (
            F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, is_causal=causal), None)
        ctx.save_for_backward(q, k, v, bias, out)
        ctx.scale, ctx.state, ctx.call, ctx.causal = scale, state, call, causal
        ctx.bias_grad = bias is not None and bias.requires_grad
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, bias, out = ctx.saved_tensors
        state: LeanState = ctx.state
        scale = ctx.scale
        kernel = _kernel_name(state, q) if state.mode == "row" else None
        if kernel and (state.calls is None or ctx.call.index in state.calls):
            done = _kernel_backward(ctx, q, k, v, bias, out, dout, kernel)
            if done is not None:
                return done
        dtype = torch.promote_types(q.dtype, torch.float32)
        b, h, n_q, e = q.shape
        n_k, e_v = k.shape[-2], v.shape[-1]
        # Batched matrices [B·H, N, E], contiguous once per call: a strided operand (q, k, v are often
        # views of one qkv projection) would otherwise be copied by every chunk's product.
        # The scale goes into the queries once (an [N, E] pass, not an N x N one); dK = scale·Qᵀ·dS takes it from there.
        qf = (q.to(dtype) * scale).reshape(b * h, n_q, e)
        kf = k.to(dtype).reshape(b * h, n_k, e)
        vf = v.to(dtype).reshape(b * h, n_k, e_v)
        do = dout.to(dtype).reshape(b * h, n_q, e_v)
        # rowsum(∇A ⊙ A) = dO · O per query (O = A V), as fused kernels take it: softmax's backward is then
        # ∇A ⊙ A − A · rowsum, from the product Eq. 5 needs anyway. Only where O is as precise as the chunks.
        rowsum = None
        if out.dtype == dtype:
            rowsum = (do * out.reshape(b * h, n_q, e_v)).sum(dim=-1).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        dq = torch.empty(b * h, n_q, e, dtype=dtype, device=q.device)
        # dK and dV accumulate transposed (Qᵀ·dS, dOᵀ·A): the chunk's N x N factor is then read in its
        # own layout, which a CPU's BLAS does markedly faster than a transposed one.
        dkt = torch.zeros(b * h, e, n_k, dtype=dtype, device=k.device)
        dvt = torch.zeros(b * h, e_v, n_k, dtype=dtype, device=v.device)
        dbias = torch.zeros(bias.shape, dtype=dtype, device=bias.device) if ctx.bias_grad else None
        row = state.row if state.mode == "row" else None
        wanted = state.calls is None or ctx.call.index in state.calls
        update = None if row is None or not wanted else torch.zeros_like(row)
        abar = None if row is not None or not wanted else torch.empty(b, n_q, n_k, dtype=torch.float32, device=q.device)
        limits = ctx.call.key_limits
        spans = query_chunks(b * h, n_q, n_k, limits)
        # Three chunk-sized buffers reused by every chunk and call (ops write into them): fresh N x N-sized
        # temporaries per chunk cost more in page faults than the arithmetic on a CPU.
        buffers = state.buffers(max(b * h * (stop - start) * nk for start, stop, nk in spans), dtype, q.device)
        kt, vt = kf.transpose(1, 2), vf.transpose(1, 2)
        acc = torch.empty(b * h * max(e, e_v) * max(nk for _, _, nk in spans), dtype=dtype, device=q.device)
        above = _causal_above(max(stop - start for start, stop, _ in spans), dtype, q.device) if ctx.causal else None
        # The row form's r·Ā with the mean over heads folded into one product per head: r repeated per head.
        row_h = None if update is None else row.to(dtype)[:, None, None, :].expand(b, h, 1, n_q).reshape(b * h, 1, n_q)
        for start, stop, nk in spans:
            sl = slice(start, stop)
            rows = stop - start
            probs, grads, spare = (buf[: b * h * rows * nk].view(b * h, rows, nk) for buf in buffers)
            qc, doc = qf[:, sl], do[:, sl]
            torch.bmm(qc, kt[:, :, :nk], out=spare)  # the scores
            bc = _rows(bias, sl, n_q)
            if bc is not None:
                spare.view(b, h, rows, nk).add_(bc[..., :nk].to(dtype))
            if above is not None and nk > start:
                spare[:, :, start:].add_(_causal_block(above, rows, nk - start))
            torch.ops.aten._softmax.out(spare, -1, False, out=probs)
            if bc is not None:
                # A row whose keys are all masked (-inf) gets probability 0 (softmax gives NaN there).
                probs.masked_fill_(torch.isneginf(spare.amax(dim=-1, keepdim=True)), 0.0)
            torch.bmm(doc, vt[:, :, :nk], out=grads)  # ∇A for these queries
            # (bmm, then add: an accumulating baddbmm_ into this slice runs as one small GEMM per head on a CPU,
            # many times slower with two threads.)
            dvt[:, :, :nk].add_(torch.bmm(doc.transpose(1, 2), probs, out=acc[: b * h * e_v * nk].view(b * h, e_v, nk)))
            if rowsum is not None:
                product = torch.mul(grads, probs, out=spare)
                positive = torch.clamp(product, min=0, out=grads) if wanted else None
            else:
                positive = torch.mul(grads, probs, out=spare).clamp_(min=0) if wanted else None
            if wanted:
                # Eq. 5 for these queries: E_h[(∇A ⊙ A)⁺], the mean left to the row update in row mode.
                if update is not None:
                    update[:, :nk] += torch.bmm(row_h[:, :, sl], positive).view(b, h, nk).sum(dim=1).div_(h).to(update.dtype)
                elif abar is not None:
                    abar[:, sl, :nk] = positive.view(b, h, rows, nk).mean(dim=1)
                    if nk < n_k:
                        abar[:, sl, nk:] = 0.0
            # dS = A ⊙ (∇A − rowsum(∇A ⊙ A)): from the product, or softmax's own backward kernel.
            if rowsum is not None:
                dscores = product.addcmul_(probs, rowsum[:, sl, None], value=-1.0)
            else:
                dscores = torch.ops.aten._softmax_backward_data.out(grads, probs, -1, dtype, grad_input=spare)
            dq[:, sl] = torch.bmm(dscores, kf[:, :nk])
            dkt[:, :, :nk].add_(torch.bmm(qc.transpose(1, 2), dscores, out=acc[: b * h * e * nk].view(b * h, e, nk)))
            if dbias is not None:
                _add_bias_grad(dbias, dscores.view(b, h, rows, nk), bias, sl, n_q, nk)
        if update is not None:
            state.row = row + update
        elif abar is not None:
            state.abars[ctx.call.index] = abar
        if wanted:
            state.order.append(ctx.call.index)
        dq = dq.mul_(scale).view(b, h, n_q, e)
        dk = dkt.transpose(1, 2).reshape(b, h, n_k, e)
        dv = dvt.transpose(1, 2).reshape(b, h, n_k, e_v)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                None if dbias is None else dbias.to(bias.dtype), None, None, None, None, None)


def _per_key(bias: Tensor) -> bool:
    """Whether ``bias`` is one additive value per key: ``[B, 1, 1 or N_q, N_k]`` with every query's row the same (a
    padding mask expanded over the queries, as Hugging Face passes it). Reads the answer back from the device."""
    if bias.dim() != 4 or bias.shape[1] != 1:
        return False
    if bias.shape[2] == 1:
        return True
    with torch.no_grad():
        return all(bool((bias[:, :, i:i + 256] == bias[:, :, :1]).all()) for i in range(0, bias.shape[2], 256))


def _key_bias(bias: Tensor | None, batch: int, n_k: int, per_key: bool | None = None) -> Tensor | Literal[False] | None:
    """``bias`` as one additive value per key ``[B, N_k]`` (None for no bias), or False where it varies by head or
    query. ``per_key``: :func:`_per_key`'s answer where the forward found it already."""
    if bias is None:
        return None
    if not (_per_key(bias) if per_key is None else per_key):
        return False
    return bias[:, 0, 0, :].expand(batch, n_k)


def log_sum_exp(q: Tensor, k: Tensor, key_bias: Tensor | None, causal: bool, scale: float) -> Tensor:
    """Each query's log-sum-exp of its scores ``[B, H, N_q]`` (what a fused forward keeps), a chunk of queries at a time."""
    b, h, n_q, _ = q.shape
    n_k = k.shape[-2]
    lse = torch.empty(b, h, n_q, dtype=torch.float32, device=q.device)
    step = max(1, CHUNK_ELEMENTS // max(1, b * h * n_k))
    for start in range(0, n_q, step):
        stop = min(n_q, start + step)
        s = torch.matmul(q[:, :, start:stop].float() * scale, k.float().transpose(-2, -1))
        if key_bias is not None:
            s = s + key_bias.float()[:, None, None, :]
        if causal:
            rows = torch.arange(start, stop, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(n_k, device=q.device)[None, :] > rows, -math.inf)
        lse[:, :, start:stop] = torch.logsumexp(s, dim=-1)
    return lse


def _kernel_name(state: LeanState, q: Tensor) -> str | None:
    """The Triton kernel the row form runs (``"triton"``, ``"triton2"``), or None for the chunks."""
    if state.kernel in ("triton", "triton2"):
        return state.kernel
    if state.kernel == "" and q.is_cuda:  # not asked: CUDA's default (the kernel, where DEFAULT_ON_CUDA)
        from lightning_gae.engine.triton_gae_fa2 import DEFAULT_ON_CUDA, available

        return "triton2" if available() and DEFAULT_ON_CUDA else None
    return None


def _grads_wanted(*tensors: Tensor) -> bool:
    """Whether this backward's gradients of q, k, v reach anything the running ``autograd.grad`` asks for. The lowest
    layer's do not (GAE asks for the token every call takes): its kernel then computes the row update alone."""
    for t in tensors:
        if not t.requires_grad:
            continue
        if t.grad_fn is None:
            return True  # a leaf: its gradient may be what is asked for
        try:
            if torch._C._will_engine_execute_node(t.grad_fn):
                return True
        except (AttributeError, RuntimeError):  # not inside the engine, or an older torch: keep them
            return True
    return False


def _kernel_backward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, out: Tensor, dout: Tensor,
                     kernel: str = "triton") -> tuple | None:
    """The row form's backward as a Triton kernel, or None where it does not apply (then the chunks run)."""
    # Imported here, at call time: Triton's import is slow, and only a kernel's backward needs it.
    from lightning_gae.engine.triton_gae import available, gae_attention_backward
    from lightning_gae.engine.triton_gae_fa2 import gae_attention_backward_fa2

    key_bias = _key_bias(bias, q.shape[0], k.shape[-2], ctx.call.bias_per_key)
    if (not available() or key_bias is False or ctx.bias_grad or v.shape[-1] != q.shape[-1]
            or q.shape[-2] != k.shape[-2]):
        return None
    state: LeanState = ctx.state
    assert state.row is not None  # a kernel runs in row mode only
    lse = ctx.lse if kernel == "triton2" and ctx.lse is not None else log_sum_exp(q, k, key_bias, ctx.causal, ctx.scale)
    if kernel == "triton2":
        wanted = _grads_wanted(q, k, v)
        # dQ by atomics varies in its last bits from run to run on a GPU, and reaches the lower layers' relevance:
        # torch.use_deterministic_algorithms(True) gets the second loop instead.
        dq_mode = "loop" if torch.are_deterministic_algorithms_enabled() else "atomic"
        dq, dk, dv, update = gae_attention_backward_fa2(q, k, v, out, lse, dout, state.row, key_bias, ctx.causal,
                                                        ctx.scale, grads=wanted, dq=dq_mode)
    else:
        dq, dk, dv, update = gae_attention_backward(q, k, v, out, lse, dout, state.row, key_bias, ctx.causal, ctx.scale)
    state.row = state.row + update.to(state.row.dtype)
    state.order.append(ctx.call.index)
    grads = tuple(None if g is None else g.to(t.dtype) for g, t in ((dq, q), (dk, k), (dv, v)))
    return (*grads, None, None, None, None, None, None)


def lean_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    state: LeanState,
    token: Tensor,
    call: LeanCall,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention`` (eval semantics) whose backward feeds ``state`` (see module doc).

    ``query``/``key``/``value`` are ``[B, H, N, E]``. Boolean masks mark allowed keys; ``is_causal``
    is the top-left aligned lower triangle, as in the fused op. ``call.attended`` is filled with the
    keys some query may attend to, which tells padding without materialising the probabilities.
    """
    n_q, n_k = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    if is_causal and attn_mask is None:
        # The fused kernel skips what the mask hides; nothing N x N is built. Query i sees keys 0..i.
        call.attended = (torch.arange(n_k, device=query.device) < n_q).expand(query.shape[0], n_k)
        last = torch.arange(1, n_q + 1).clamp_(max=n_k)
        call.key_limits = last if bool((last < n_k).any()) else None
        return LeanAttention.apply(query, key, value, None, token, scale, state, call, True)
    dtype = torch.promote_types(query.dtype, torch.float32)
    bias = additive_mask(attn_mask, dtype)
    if is_causal:
        causal = additive_mask(torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril(), dtype)
        bias = causal if bias is None else bias + causal
    if bias is not None:
        bias = bias.to(query.dtype) if not bias.requires_grad else bias
        with torch.no_grad():
            # Keys whose score is pushed to -inf (or to a dtype's min, as Hugging Face masks do) for
            # every query get probability 0: that is padding.
            open_ = (bias > torch.finfo(bias.dtype).min / 2).expand(*bias.shape[:-2], n_q, n_k)
            seen = open_.reshape(-1, *open_.shape[-3:]).any(dim=(-3, -2)) if open_.dim() >= 3 else open_.any(dim=-2)[None]
            call.attended = seen.expand(query.shape[0], n_k) if seen.shape[0] == 1 else seen
            if not bias.requires_grad:  # a learned bias (T5's) keeps every key: its gradient is wanted everywhere
                def find() -> tuple:
                    per_query = open_.reshape(-1, n_q, n_k).any(dim=0)
                    last = (per_query * torch.arange(1, n_k + 1, device=per_query.device)).amax(dim=-1)
                    per_key = _per_key(bias) if _kernel_name(state, query) else None
                    return (last.cpu() if bool((last < n_k).any()) else None), per_key

                # Keyed on the caller's mask, which the layers share (``bias`` is made anew per call).
                call.key_limits, call.bias_per_key = state.facts(attn_mask, (n_q, n_k, is_causal, bias.dtype), find) \
                    if attn_mask is not None else find()
    return LeanAttention.apply(query, key, value, bias, token, scale, state, call, False)
