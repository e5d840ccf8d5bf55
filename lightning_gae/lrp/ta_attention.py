"""Transformer Attribution's fused attention (:mod:`lightning_gae.lrp.transformer_attribution`): SDPA under the
authors' rules as one autograd function, both backward passes of it, and the layer's ``Ā`` they leave."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lightning_gae.engine.attention import SDPA_ARGS, as_heads
from lightning_gae.lrp import mode

__all__ = ["FusedAttention", "Layer", "fused_attention", "layer_abar"]


class Layer:
    """One fused attention's part of the explanation, filled by :class:`FusedAttention`'s backward passes:
    ``relevance`` (``probs ⊙`` the relevance gradient at them, ``[rows, queries, Nk]`` over the flattened
    leading dimensions, at the queries ``relevance_at``, None: all) by the rules' pass, then ``abar``
    (``E_h[(relevance ⊙ ∇A)⁺]``, ``[B, Nq, Nk]``) by the plain one; ``inputs`` are q, k, v, where the
    passes are asked for gradients so that they run through this attention. ``deepest``: no gradient
    is wanted below it (the model's first attention), so q, k, v get none."""

    def __init__(self, inputs: tuple[Tensor, ...]) -> None:
        self.inputs = inputs
        self.relevance: Tensor | None = None
        self.relevance_at: Tensor | None = None
        self.abar: Tensor | None = None
        self.deepest = False


def _used_queries(g: Tensor) -> Tensor | None:
    """The query rows of ``g`` ``[rows, Nq, E]`` with a non-zero gradient, where they are at most half
    (past the last attention only the readout token's: a class token's, a decoder's last); None: use all."""
    if g.shape[1] < 2 or (bool(g[:, 0].any()) and bool(g[:, -1].any())):
        return None
    used = g.abs().amax(dim=(0, 2)).nonzero().squeeze(1)
    return used if used.numel() * 2 <= g.shape[1] else None


def _at_all(t: Tensor, at: Tensor | None, queries: int) -> Tensor:
    """``t`` ``[rows, len(at), Nk]`` placed at the query rows ``at`` of ``[rows, queries, Nk]`` zeros (``at`` None: ``t``)."""
    return t if at is None else t.new_zeros(t.shape[0], queries, t.shape[2]).index_copy_(1, at, t)


def layer_abar(layer: Layer, da: Tensor, at: Tensor | None, shape: torch.Size) -> Tensor:
    """``E_h[(R ⊙ ∇A)⁺]`` ``[B, Nq, Nk]`` from the rules' pass's ``R`` and the plain pass's ``∇A``, each on
    its own query rows (the product in ``R``'s memory where both cover the same)."""
    r, r_at = layer.relevance, layer.relevance_at
    assert r is not None  # the rules' pass has run
    queries = shape[-2]
    if r_at is not None and at is not None and torch.equal(r_at, at):
        rows = r.mul_(da).clamp_(min=0)
        return _at_all(as_heads(rows.view(*shape[:-2], *rows.shape[-2:])).mean(dim=1), at, queries)
    product = _at_all(r, r_at, queries).mul_(_at_all(da, at, queries)).clamp_(min=0)
    return as_heads(product.view(shape)).mean(dim=1)


class FusedAttention(torch.autograd.Function):
    """``softmax(q kᵀ · scale + bias) v`` of fused attention, the rules of its operations in one function
    (the same as op by op: the z-rule halved on ``A v`` and on ``q kᵀ``, the identity rule on the softmax;
    or their plain gradients). The gradient at the probabilities ``A`` is never returned: the rules'
    pass keeps ``A ⊙`` it in the memory of the identity rule's quotient, used only there; the plain pass
    reduces it with that to the layer's ``Ā`` at once. No ``N x N`` temporaries beyond the scores and
    the probabilities, the rest in the capture's scratch buffers. Where only some queries have
    a gradient (the readout's, past the last attention) both passes run on those rows alone; the
    deepest attention returns no gradient for q, k, v."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float,
                capture: Any, layer: Layer) -> Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        # The scale goes into the queries, as in the explicit path (lightning_gae.engine.capture).
        # (Written contiguous: the product keeps the layout of a strided q, which every matmul would copy.)
        q = torch.mul(q, scale, out=torch.empty(q.shape, dtype=dtype, device=q.device))
        k, v = k.to(dtype).contiguous(), v.to(dtype).contiguous()
        scores = torch.matmul(q, k.transpose(-2, -1))
        if bias is not None:
            scores.add_(bias.to(dtype))
            dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
            probs = torch.softmax(scores.masked_fill_(dead, 0.0), dim=-1).masked_fill_(dead, 0.0)
        else:
            probs = torch.softmax(scores, dim=-1)
        # The identity rule's out / x, in the scores' own memory; 0 where a score is 0.
        ratio = torch.div(probs, scores, out=scores)
        if not torch.isfinite(ratio.sum()):
            ratio.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        ctx.scale, ctx.capture, ctx.layer = scale, capture, layer
        ctx.ratio = ratio  # (changed in place by the rules' pass: not a saved tensor, whose version is checked)
        ctx.save_for_backward(q, k, v, probs)
        capture.record(probs)
        return torch.matmul(probs, v)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None, None]:
        q, k, v, probs = ctx.saved_tensors  # (q scaled)
        scratch, plain, layer = ctx.capture.scratch, ctx.capture.plain, ctx.layer
        rows, queries, keys = probs.shape[:-2].numel(), probs.shape[-2], probs.shape[-1]
        dtype, device = probs.dtype, probs.device
        if not grad.is_contiguous() or grad.dtype != dtype:  # (the usual heads' transpose of the output)
            grad = scratch(1, grad.numel(), dtype, device).view(grad.shape).copy_(grad)
        g3 = grad.reshape(rows, queries, grad.shape[-1])
        q3, k3, v3 = (t.reshape(rows, *t.shape[-2:]) for t in (q, k, v))
        p3 = probs.reshape(rows, queries, keys)
        at = _used_queries(g3)
        if at is not None:
            g3, p3, q3 = g3.index_select(1, at), p3.index_select(1, at), q3.index_select(1, at)
        used = g3.shape[1]
        # ∇A = g vᵀ; the rules' pass halves the output gradient (A v's z-rule), for A and for v.
        da = torch.bmm(g3, v3.transpose(-2, -1), out=scratch(0, rows * used * keys, dtype, device).view(rows, used, keys))
        dscores = scratch(2, rows * used * keys, dtype, device).view(rows, used, keys)
        wanted = not layer.deepest  # (q, k, v's gradients)
        # (Before the rules' pass writes the relevance into the selected rows of the probabilities.)
        dv = torch.bmm(p3.transpose(-2, -1), g3) if wanted else None
        if plain:
            if wanted:
                torch.ops.aten._softmax_backward_data.out(da, p3, -1, dtype, grad_input=dscores)
            if layer.relevance is not None:
                layer.abar = layer_abar(layer, da, at, probs.shape)
                layer.relevance = layer.relevance_at = ctx.ratio = None
        else:
            da.mul_(0.5)
            ratio = ctx.ratio.view(rows, queries, keys)
            if wanted:
                torch.mul(ratio if at is None else ratio.index_select(1, at), da, out=dscores)
            # In the quotient's memory (not read again), or in the selected rows' own copy.
            layer.relevance = torch.mul(p3, da, out=ratio) if at is None else p3.mul_(da)
            layer.relevance_at = at
        if not wanted:
            return None, None, None, None, None, None, None
        assert dv is not None
        half = 1.0 if plain else 0.5
        dq = torch.bmm(dscores, k3).mul_(half * ctx.scale)
        dk = torch.bmm(dscores.transpose(-2, -1), q3)
        if half != 1.0:
            dv.mul_(half)
            dk.mul_(half)
        # (q's gradient back at every query row, 0 where none was selected)
        return _at_all(dq, at, queries).view(q.shape), dk.view(k.shape), dv.view(v.shape), None, None, None, None




def _blocked(blocked: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(blocked, -math.inf)


def fused_attention(capture: Any, args: tuple, kwargs: dict) -> Tensor | None:
    """``F.scaled_dot_product_attention`` under the rules with :class:`FusedAttention`; None where it does not apply
    (an operand without relevance, a bias that carries some, broadcast batch dimensions): op by op then."""
    p = dict(zip(SDPA_ARGS, args))
    p.update(kwargs)
    query, key, value, mask = p["query"], p["key"], p["value"], p.get("attn_mask")
    if not all(mode.carries_relevance(t) for t in (query, key, value)) or mode.carries_relevance(mask) or query.dim() < 3:
        return None
    if p.get("enable_gqa") and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    if query.shape[:-2] != key.shape[:-2]:
        return None
    scale = p.get("scale")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    dtype = torch.promote_types(query.dtype, torch.float32)
    # SDPA's masks: a boolean one marks the keys that may be attended, a float one is added; is_causal is the
    # top-left aligned lower triangle.
    bias = None if mask is None else _blocked(~mask, dtype) if mask.dtype == torch.bool else mask.to(dtype)
    if p.get("is_causal"):
        causal = _blocked(torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).triu(1), dtype)
        bias = causal if bias is None else bias + causal
    layer = Layer((query, key, value))
    capture.layers[len(capture.probs)] = layer
    return FusedAttention.apply(query, key, value, bias, scale, capture, layer).to(value.dtype)
