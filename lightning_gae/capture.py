"""Recording post-softmax attention probabilities from unmodified models.

GAE needs, for every attention layer, the probability tensor that is multiplied with V and its
gradient. Fused kernels never materialise that tensor, so while an :class:`AttentionRecorder` is
active:

* ``F.scaled_dot_product_attention`` is intercepted by a ``TorchFunctionMode`` and computed
  explicitly with the same semantics (boolean/additive masks, ``is_causal``, ``scale``,
  ``enable_gqa``), so the probabilities exist and are recorded;
* ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``, ``nn.Transformer*``) is computed
  explicitly too, per head, on the same explicit attention;
* hand-written attention (``softmax`` followed by a matmul with V, as in Hugging Face's "eager"
  implementations and timm's non-fused path) is recognised: a softmax output over the last dim
  that reaches the left side of a matmul is recorded at that matmul;
* or, when the user names modules (``attention_modules``, glob patterns over module paths), only
  the outputs of those modules are recorded, by forward hooks.

Each record carries the path of the innermost module that was running when it was made (a module
call stack kept by forward hooks), its call order and its query/key lengths. Outside the ``with``
block nothing is patched or hooked, also when the forward raises.
"""

from __future__ import annotations

import fnmatch
import inspect
import math
import weakref
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from lightning_gae.lean import LeanCall, LeanState, lean_attention

__all__ = [
    "AttentionRecord",
    "AttentionRecorder",
    "explicit_scaled_dot_product_attention",
    "explicit_multi_head_attention_forward",
]


@dataclass
class AttentionRecord:
    """One attention call: the probabilities multiplied with V, and where they came from.

    ``tensor`` is the recorded tensor itself (a node of the autograd graph, so ``autograd.grad``
    can reach it); :meth:`as_heads` brings it, or its gradient, to ``[B, H, Nq, Nk]``.
    ``query_input`` / ``key_input`` are the tensors the queries and keys were computed from (the
    projected ``q``/``k`` of SDPA, the ``query``/``key`` of multi-head attention, the values of a
    softmax -> matmul) and ``output`` is what the call returned: :mod:`lightning_gae.streams` follows
    the autograd graph between them to tell which token set each side belongs to. ``run`` counts
    how many times the module at ``path`` had already run in this forward (a bi-encoder calls one
    encoder twice).
    """

    path: str
    index: int
    tensor: Tensor
    source: str
    self_attention: bool | None = None
    query_input: Tensor | None = None
    key_input: Tensor | None = None
    output: Tensor | None = None
    run: int = 0
    lean: LeanCall | None = None

    @property
    def num_queries(self) -> int:
        return self.tensor.shape[-2]

    @property
    def num_keys(self) -> int:
        return self.tensor.shape[-1]

    @property
    def batch_size(self) -> int:
        return self.tensor.shape[0] if self.tensor.dim() >= 3 else 1

    def as_heads(self, t: Tensor | None = None) -> Tensor:
        """``t`` (default: the record itself) reshaped to ``[B, H, Nq, Nk]``."""
        t = self.tensor if t is None else t
        if t.dim() == 2:
            return t[None, None]
        if t.dim() == 3:
            return t[:, None]
        return t.reshape(t.shape[0], -1, t.shape[-2], t.shape[-1])


def _attend(query: Tensor, key: Tensor, value: Tensor, scale: float, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + bias) v with the probabilities in float32 (or wider).

    Rows whose every key is masked get probability 0, as PyTorch's SDPA does, instead of NaN.
    """
    dtype = torch.promote_types(query.dtype, torch.float32)
    scores = (query.to(dtype) @ key.to(dtype).transpose(-2, -1)) * scale
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


def _additive(mask: Tensor | None, dtype: torch.dtype, allowed_when_true: bool) -> Tensor | None:
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        blocked = ~mask if allowed_when_true else mask
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(blocked, -math.inf)
    return mask.to(dtype)


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
    bias = _additive(attn_mask, dtype, allowed_when_true=True)
    if is_causal:
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=query.device).tril()
        causal_bias = _additive(causal, dtype, allowed_when_true=True)
        bias = causal_bias if bias is None else bias + causal_bias
    return _attend(query, key, value, scale, bias)


_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


def explicit_multi_head_attention_forward(*args: Any, **kwargs: Any) -> tuple[tuple[Tensor, Tensor | None], Tensor]:
    """``F.multi_head_attention_forward`` computed explicitly, in eval semantics (no dropout).

    Takes exactly the arguments of the PyTorch function (sequence-first ``[L, B, E]`` or unbatched
    ``[L, E]`` inputs) and returns ``((output, weights), probabilities)`` where ``probabilities`` is
    the per-head ``[B, H, L, S]`` tensor multiplied with V and ``weights`` is what PyTorch would
    return (head-averaged unless ``average_attn_weights=False``; None unless ``need_weights``).
    """
    a = _MHA_SIGNATURE.bind(*args, **kwargs)
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
    mask = _additive(attn_mask, dtype, allowed_when_true=False)
    pad = _additive(key_padding_mask, dtype, allowed_when_true=False)
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
    out, probs = _attend(q, k, v, 1.0 / math.sqrt(head_dim), bias)
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


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SOFTMAX = {F.softmax, torch.softmax, Tensor.softmax}
_PASS_THROUGH = {
    F.dropout,
    torch.dropout,
    Tensor.to,
    Tensor.type,
    Tensor.type_as,
    Tensor.float,
    Tensor.half,
    Tensor.bfloat16,
    Tensor.double,
    Tensor.contiguous,
}
_MATMUL = {torch.matmul, Tensor.matmul, Tensor.__matmul__, torch.bmm, Tensor.bmm}


def _softmax_dim(args: tuple, kwargs: dict) -> Any:
    if "dim" in kwargs:
        return kwargs["dim"]
    return args[1] if len(args) > 1 else None


class _CaptureMode(TorchFunctionMode):
    """Recomputes fused attention explicitly and spots softmax→matmul attention."""

    def __init__(self, recorder: AttentionRecorder) -> None:
        super().__init__()
        self.recorder = recorder
        # Softmax outputs seen so far (by id, checked for identity), waiting to meet a matmul.
        self._probs: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()

    def _is_probs(self, t: Any) -> bool:
        return isinstance(t, Tensor) and self._probs.get(id(t)) is t

    def _tag(self, t: Tensor) -> None:
        self._probs[id(t)] = t

    def _lean_sdpa(self, args: tuple, kwargs: dict) -> Tensor | None:
        """SDPA through :func:`lean_attention`; None when the call does not fit it (not ``[B, H, N, E]``)."""
        p = dict(zip(_SDPA_ARGS, args))
        p.update(kwargs)
        q, k, v = p["query"], p["key"], p["value"]
        if not all(isinstance(t, Tensor) and t.dim() == 4 for t in (q, k, v)) or not torch.is_grad_enabled():
            return None
        state, token = self.recorder.lean
        call = LeanCall(index=len(self.recorder.records))
        out = lean_attention(q, k, v, state, token.to(q.device), call, attn_mask=p.get("attn_mask"),
                             is_causal=p.get("is_causal", False), scale=p.get("scale"), enable_gqa=p.get("enable_gqa", False))
        # A stand-in with the probabilities' shape and no storage: nothing N x N is kept.
        shape = (q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
        stand_in = torch.zeros((), dtype=torch.float32, device=q.device).expand(shape)
        self.recorder._add(stand_in, "sdpa", query_input=q, key_input=k, output=out)
        self.recorder.records[-1].lean = call
        return out

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            if self.recorder.lean is not None:
                lean = self._lean_sdpa(args, kwargs)
                if lean is not None:
                    return lean
            out, probs = explicit_scaled_dot_product_attention(*args, **kwargs)
            query = kwargs.get("query", args[0] if args else None)
            key = kwargs.get("key", args[1] if len(args) > 1 else None)
            self.recorder._add(probs, "sdpa", query_input=query, key_input=key, output=out)
            return out
        if func is F.multi_head_attention_forward:
            result, probs = explicit_multi_head_attention_forward(*args, **kwargs)
            query = kwargs.get("query", args[0] if args else None)
            key = kwargs.get("key", args[1] if len(args) > 1 else None)
            # mha(x + pos, x + pos, x) and mha(norm(x), norm(x), norm(x)) pass equal values as
            # different tensor objects: that is self-attention too.
            same = query is key or (query.shape == key.shape and torch.equal(query, key))
            self.recorder._add(probs, "mha", self_attention=same, query_input=query, key_input=key, output=result[0])
            return result
        if func in _MATMUL:
            lhs = args[0] if args else kwargs.get("input")
            rhs = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
            if self._is_probs(lhs) and isinstance(rhs, Tensor) and rhs.dim() >= 2 and rhs.shape[-2] == lhs.shape[-1]:
                if not lhs.requires_grad and torch.is_grad_enabled():
                    lhs.requires_grad_(True)
                out = func(*args, **kwargs)
                # The values stand for the keys' side: the queries only reach the probabilities.
                self.recorder._add(lhs, "softmax", key_input=rhs, output=out)
                return out
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if func in _SOFTMAX and isinstance(out, Tensor) and out.dim() >= 2:
            dim = _softmax_dim(args, kwargs)
            if dim is not None and dim in (-1, out.dim() - 1):
                self._tag(out)
        elif func in _PASS_THROUGH and args and self._is_probs(args[0]) and isinstance(out, Tensor):
            self._tag(out)
        return out


class AttentionRecorder:
    """Context manager that records every attention probability tensor of ``model``'s forward.

    Args:
        model: the module whose forward runs inside the ``with`` block.
        attention_modules: glob patterns over module paths (``"blocks.*.attn.attn_drop"``); when
            given, only the outputs of the matching modules are recorded (forward hooks) and no
            function is intercepted.

    Raises:
        ValueError: a pattern in ``attention_modules`` matches no module of ``model``.

    Example::

        with AttentionRecorder(model) as rec:
            logits = model(x)
        [r.path for r in rec.records]   # ['blocks.0.attn', 'blocks.1.attn', ...]
    """

    def __init__(self, model: nn.Module, attention_modules: Sequence[str] | str | None = None, lean: bool = False) -> None:
        self.model = model
        # lean=True: SDPA calls keep no probabilities; their Ā is made in the backward pass
        # (lightning_gae.lean), driven by ``lean_state`` once ``lean_token``'s gradient is asked for.
        self.lean_state = LeanState() if lean else None
        self.lean_token = torch.zeros((), requires_grad=True) if lean else None
        if isinstance(attention_modules, str):
            attention_modules = [attention_modules]
        self.attention_modules = list(attention_modules) if attention_modules else None
        self.records: list[AttentionRecord] = []
        self._names = {m: n for n, m in model.named_modules(remove_duplicate=False)}
        self._stack: list[str] = []
        self._runs: dict[str, int] = {}
        self._exit: ExitStack | None = None
        if self.attention_modules is not None:
            self._targets = self._match(self.attention_modules)

    def _match(self, patterns: list[str]) -> list[tuple[str, nn.Module]]:
        targets: list[tuple[str, nn.Module]] = []
        for pattern in patterns:
            found = [(n, m) for n, m in self.model.named_modules() if fnmatch.fnmatchcase(n, pattern)]
            if not found:
                sample = [n for n, _ in self.model.named_modules() if n][:8]
                raise ValueError(
                    f"attention_modules pattern {pattern!r} matches no module of "
                    f"{type(self.model).__name__}; module paths look like {sample}. Name the modules "
                    "that receive the post-softmax attention probabilities (e.g. 'blocks.*.attn.attn_drop')."
                )
            targets.extend(t for t in found if t not in targets)
        return targets

    @property
    def lean(self) -> tuple[LeanState, Tensor] | None:
        return None if self.lean_state is None else (self.lean_state, self.lean_token)

    @property
    def current_path(self) -> str:
        return self._stack[-1] if self._stack else ""

    def _add(self, tensor: Tensor, source: str, self_attention: bool | None = None, path: str | None = None,
             query_input: Tensor | None = None, key_input: Tensor | None = None, output: Tensor | None = None) -> None:
        path = self.current_path if path is None else path
        self.records.append(
            AttentionRecord(
                path=path,
                index=len(self.records),
                tensor=tensor,
                source=source,
                self_attention=self_attention,
                query_input=query_input,
                key_input=key_input,
                output=output,
                run=max(self._runs.get(path, 1) - 1, 0),
            )
        )

    def _push(self, module: nn.Module, *_: Any) -> None:
        name = self._names.get(module)
        if name is not None:
            self._stack.append(name)
            self._runs[name] = self._runs.get(name, 0) + 1

    def _pop(self, module: nn.Module, *_: Any) -> None:
        if module in self._names and self._stack:
            self._stack.pop()

    def _hook_output(self, name: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not isinstance(output, Tensor):
                raise ValueError(
                    f"attention module {name!r} ({type(module).__name__}) returned {type(output).__name__}; "
                    "attention_modules must name modules whose output is the probability tensor itself "
                    "(e.g. the dropout applied to the softmax)."
                )
            if not output.requires_grad and torch.is_grad_enabled():
                output.requires_grad_(True)
            self._runs[name] = self._runs.get(name, 0) + 1
            self._add(output, "hook", path=name, output=output)

        return hook

    def __enter__(self) -> AttentionRecorder:
        self.records = []
        self._stack = []
        self._runs = {}
        with ExitStack() as stack:
            if self.attention_modules is not None:
                for name, module in self._targets:
                    stack.enter_context(module.register_forward_hook(self._hook_output(name)))
            else:
                stack.enter_context(nn.modules.module.register_module_forward_pre_hook(self._push))
                stack.enter_context(nn.modules.module.register_module_forward_hook(self._pop, always_call=True))
                stack.enter_context(_CaptureMode(self))
            self._exit = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        exit_stack, self._exit = self._exit, None
        self._stack = []
        if exit_stack is not None:
            exit_stack.close()
