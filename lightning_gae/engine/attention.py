"""Attention written out: scaled-dot-product and multi-head attention with their probabilities materialised.

What the capture records and the LRP modes propagate through is the same computation as PyTorch's fused
ops, spelled out so that the ``[B, H, Nq, Nk]`` probabilities exist as a tensor of the graph:
:func:`explicit_scaled_dot_product_attention` and :func:`explicit_multi_head_attention_forward` take the
arguments of ``F.scaled_dot_product_attention`` and ``F.multi_head_attention_forward``. Also here, what
every mode intercepting those ops needs: their argument names (:data:`SDPA_ARGS`, :data:`MHA_SIGNATURE`),
masks in additive form (:func:`additive_mask`), maps brought to ``[B, H, Nq, Nk]`` (:func:`as_heads`), and
a forward run eagerly under a ``TorchFunctionMode`` whatever was compiled (:func:`run_eagerly`).
"""

from __future__ import annotations

import inspect
import math
import sys
import warnings
from contextlib import ExitStack
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MHA_SIGNATURE", "SDPA_ARGS", "additive_mask", "as_heads", "attend", "explicit_multi_head_attention_forward",
           "explicit_scaled_dot_product_attention", "holds_compiled_module", "run_eagerly"]

SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
"""``F.scaled_dot_product_attention``'s arguments in their positional order."""
MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def as_heads(t: Tensor) -> Tensor:
    """An attention map (or its gradient) as ``[B, H, Nq, Nk]``: no batch or head dimension added, more folded into H."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    return t.reshape(t.shape[0], -1, t.shape[-2], t.shape[-1])


@overload
def additive_mask(mask: Tensor, dtype: torch.dtype, allowed_when_true: bool = True) -> Tensor: ...
@overload
def additive_mask(mask: None, dtype: torch.dtype, allowed_when_true: bool = True) -> None: ...
def additive_mask(mask: Tensor | None, dtype: torch.dtype, allowed_when_true: bool = True) -> Tensor | None:
    """A boolean mask as the bias added to the scores (0 where a key may be attended, -inf where not), in ``dtype``;
    a float mask, already additive, as it is. ``allowed_when_true=False`` for ``nn.MultiheadAttention``'s masks,
    which mark the *blocked* positions with True."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    blocked = ~mask if allowed_when_true else mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(blocked, -math.inf)


def attend(query: Tensor, key: Tensor, value: Tensor, scale: float, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + bias) v with the probabilities in float32 (or wider).

    Rows whose every key is masked get probability 0, as PyTorch's SDPA does, instead of NaN.
    """
    dtype = torch.promote_types(query.dtype, torch.float32)
    # The scale goes into the queries (an N x E pass, not an N x N one), as the lean path and fused kernels do.
    scores = (query.to(dtype) * scale) @ key.to(dtype).transpose(-2, -1)
    if bias is not None:
        scores = scores + bias.to(dtype)
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
        probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    else:
        probs = torch.softmax(scores, dim=-1)
    if not probs.requires_grad and torch.is_grad_enabled():
        # A frozen model fed integer ids builds no graph; the probabilities become the leaves of one.
        probs.requires_grad_(True)
    out = probs.to(value.dtype) @ value
    return out, probs


def explicit_scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor]:
    """``F.scaled_dot_product_attention`` computed explicitly; returns ``(output, probabilities)``.

    Same semantics as the fused op: a boolean ``attn_mask`` marks the keys that may be attended
    (True), a float one is added to the scores; ``is_causal`` is the top-left aligned lower
    triangle; ``scale`` defaults to ``1/sqrt(E)``; ``enable_gqa`` repeats grouped key/value heads.
    ``dropout_p`` is ignored on purpose: an explanation is deterministic, as a model in eval mode is.
    """
    del dropout_p
    n_q, n_k = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa and query.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    dtype = torch.promote_types(query.dtype, torch.float32)
    bias = additive_mask(attn_mask, dtype)
    if is_causal:
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril()
        causal_bias = additive_mask(causal, dtype)
        bias = causal_bias if bias is None else bias + causal_bias
    return attend(query, key, value, scale, bias)


def explicit_multi_head_attention_forward(*args: Any, **kwargs: Any) -> tuple[tuple[Tensor, Tensor | None], Tensor]:
    """``F.multi_head_attention_forward`` computed explicitly, in eval semantics (no dropout).

    Takes exactly the arguments of the PyTorch function (sequence-first ``[L, B, E]`` or unbatched
    ``[L, E]`` inputs) and returns ``((output, weights), probabilities)`` where ``probabilities`` is
    the per-head ``[B, H, L, S]`` tensor multiplied with V and ``weights`` is what PyTorch would
    return (head-averaged unless ``average_attn_weights=False``; None unless ``need_weights``).
    """
    a = MHA_SIGNATURE.bind(*args, **kwargs)
    a.apply_defaults()
    p = a.arguments
    query, key, value = p["query"], p["key"], p["value"]
    num_heads = p["num_heads"]
    key_padding_mask, attn_mask = p["key_padding_mask"], p["attn_mask"]
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    n_q, batch, embed = query.shape
    head_dim = embed // num_heads

    if p["use_separate_proj_weight"]:
        w_q, w_k, w_v = p["q_proj_weight"], p["k_proj_weight"], p["v_proj_weight"]
    else:
        w_q, w_k, w_v = p["in_proj_weight"].chunk(3)
    b_q = b_k = b_v = None
    if p["in_proj_bias"] is not None:
        b_q, b_k, b_v = p["in_proj_bias"].chunk(3)
    q = F.linear(query, w_q, b_q)
    k = F.linear(key, w_k, b_k)
    v = F.linear(value, w_v, b_v)

    dtype = torch.promote_types(query.dtype, torch.float32)
    # Both masks of nn.MultiheadAttention mark *blocked* positions with True.
    mask = additive_mask(attn_mask, dtype, allowed_when_true=False)
    pad = additive_mask(key_padding_mask, dtype, allowed_when_true=False)
    if p["bias_k"] is not None and p["bias_v"] is not None:
        k = torch.cat([k, p["bias_k"].repeat(1, batch, 1)])
        v = torch.cat([v, p["bias_v"].repeat(1, batch, 1)])
        mask = None if mask is None else F.pad(mask, (0, 1))
        pad = None if pad is None else F.pad(pad, (0, 1))

    q = q.reshape(n_q, batch * num_heads, head_dim).transpose(0, 1)
    k = k.reshape(k.shape[0], batch * num_heads, head_dim).transpose(0, 1) if p["static_k"] is None else p["static_k"]
    v = v.reshape(v.shape[0], batch * num_heads, head_dim).transpose(0, 1) if p["static_v"] is None else p["static_v"]
    if p["add_zero_attn"]:
        k = torch.cat([k, k.new_zeros(k.shape[0], 1, head_dim)], dim=1)
        v = torch.cat([v, v.new_zeros(v.shape[0], 1, head_dim)], dim=1)
        mask = None if mask is None else F.pad(mask, (0, 1))
        pad = None if pad is None else F.pad(pad, (0, 1))
    n_k = k.shape[1]
    q, k, v = (t.reshape(batch, num_heads, t.shape[1], head_dim) for t in (q, k, v))

    bias = None
    if mask is not None:
        bias = mask.reshape(batch, num_heads, n_q, n_k) if mask.dim() == 3 else mask.reshape(1, 1, n_q, n_k)
    if pad is not None:
        pad = pad.reshape(batch, 1, 1, n_k)
        bias = pad if bias is None else bias + pad
    out, probs = attend(q, k, v, 1.0 / math.sqrt(head_dim), bias)
    out = out.permute(2, 0, 1, 3).reshape(n_q, batch, embed)
    out = F.linear(out, p["out_proj_weight"], p["out_proj_bias"])

    weights = None
    if p["need_weights"]:
        weights = probs.to(query.dtype)
        if p["average_attn_weights"]:
            weights = weights.mean(dim=1)
    if unbatched:
        out = out.squeeze(1)
        weights = None if weights is None else weights.squeeze(0)
    return (out, weights), probs


def holds_compiled_module(model: nn.Module) -> bool:
    """Whether ``model`` is or holds a ``torch.compile(module)`` wrapper (``OptimizedModule``)."""
    if "torch._dynamo" not in sys.modules:
        return False
    from torch._dynamo.eval_frame import OptimizedModule

    return any(isinstance(m, OptimizedModule) for m in model.modules())


def run_eagerly(stack: ExitStack, model: nn.Module) -> None:
    """Enter on ``stack`` what a forward under a ``TorchFunctionMode`` and global module hooks needs to see every
    operation: ``torch.compile``'d submodules run eagerly (Dynamo would trace the hooks and the mode), and their
    wrapper's warning that global hooks also fire for it is silenced (only when one is compiled: changing the
    warning filters makes Python show again every warning it had shown once)."""
    if "torch._dynamo" in sys.modules:
        stack.enter_context(torch.compiler.set_stance("force_eager"))
    if holds_compiled_module(model):
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
