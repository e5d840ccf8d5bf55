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
  that reaches the left side of a matmul with per-sample values is recorded at that matmul, also
  through dropout, dtype casts and reshapes that keep its last two dims (query x key);
* when the user names modules (``attention_modules``, glob patterns over module paths), they
  select what is recorded: see :class:`AttentionRecorder`.

Each record carries the path of the innermost module that was running when it was made (a module
call stack kept by forward hooks), its call order and its query/key lengths. Outside the ``with``
block nothing is patched or hooked, also when the forward raises.
"""

from __future__ import annotations

import fnmatch
import logging
import weakref
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode, resolve_name

from lightning_gae.engine.attention import (
    SDPA_ARGS,
    as_heads,
    explicit_multi_head_attention_forward,
    explicit_scaled_dot_product_attention,
    run_eagerly,
)
from lightning_gae.engine.lean import LeanCall, LeanState, lean_attention

__all__ = ["AttentionRecord", "AttentionRecorder"]

logger = logging.getLogger("lightning_gae")


@dataclass
class AttentionRecord:
    """One attention call: the probabilities multiplied with V, and where they came from.

    ``tensor`` is the recorded tensor itself (a node of the autograd graph, so ``autograd.grad``
    can reach it); :meth:`as_heads` brings it, or its gradient, to ``[B, H, Nq, Nk]``.
    ``query_input`` / ``key_input`` are the tensors the queries and keys were computed from (the
    projected ``q``/``k`` of SDPA, the ``query``/``key`` of multi-head attention, the values of a
    softmax -> matmul) and ``output`` is what the call returned: :mod:`lightning_gae.engine.token_sets` follows
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
        return as_heads(self.tensor if t is None else t)


_SOFTMAX = {F.softmax, torch.softmax, Tensor.softmax}
# Elementwise or dtype-only: the output is the same probabilities (dropout is the identity in eval mode).
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
# Reshapes that some models apply between the dropout and the matmul (BLOOM and DeBERTa-v2 fold the
# heads into the batch for a ``bmm``). They keep the probabilities only while the last two dims stay
# query x key; the record is then the tensor before the reshape, which still has one row per sample.
_RESHAPE = {
    Tensor.view,
    Tensor.reshape,
    torch.reshape,
    Tensor.view_as,
    Tensor.reshape_as,
    Tensor.flatten,
    torch.flatten,
    Tensor.unflatten,
    torch.unflatten,
    Tensor.squeeze,
    torch.squeeze,
    Tensor.unsqueeze,
    torch.unsqueeze,
}
_MATMUL = {torch.matmul, Tensor.matmul, Tensor.__matmul__, torch.bmm, Tensor.bmm}


def _softmax_dim(args: tuple, kwargs: dict) -> Any:
    if "dim" in kwargs:
        return kwargs["dim"]
    return args[1] if len(args) > 1 else None


def _not_attention(probs: Tensor, values: Tensor) -> str | None:
    """Why ``probs @ values`` is not attention, or None when it is.

    Attention multiplies per-sample, per-head query x key probabilities ``[B, (H,) Nq, Nk]`` with
    per-sample values ``[B, (H,) Nk, D]``; a softmax over a parameter (a prototype or mixture
    head, ``softmax(f @ P.T) @ M``) has no batch dimension on one side.
    """
    if probs.dim() < 3:
        return f"softmax output of shape {list(probs.shape)} has no [batch, query, key] layout"
    if values.dim() != probs.dim() or values.shape[-2] != probs.shape[-1]:
        return f"right operand of shape {list(values.shape)} is not values [B, (H,) {probs.shape[-1]}, D] for {list(probs.shape)}"
    if values.shape[0] != probs.shape[0] or any(v not in (1, p) for v, p in zip(values.shape[1:-2], probs.shape[1:-2])):
        return f"right operand of shape {list(values.shape)} is not per-sample values for probabilities {list(probs.shape)}"
    return None


class _CaptureMode(TorchFunctionMode):
    """Recomputes fused attention explicitly and spots softmax→matmul attention."""

    def __init__(self, recorder: AttentionRecorder) -> None:
        super().__init__()
        self.recorder = recorder
        # Softmax outputs and the tensors derived from them, by id: (weak reference checked for
        # identity, the per-sample tensor to record or None for the tensor itself, softmax path).
        self._tags: dict[int, tuple[weakref.ref, Tensor | None, str]] = {}

    def lookup(self, t: Any) -> tuple[Tensor, str] | None:
        """``(tensor to record, path of its softmax)`` when ``t`` carries softmax probabilities."""
        if not isinstance(t, Tensor):
            return None
        tensor: Tensor = t
        entry = self._tags.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return None
        _, probs, path = entry
        return (tensor if probs is None else probs), path

    def _tag(self, t: Tensor, origin: Tensor | None, path: str) -> None:
        self._tags[id(t)] = (weakref.ref(t), None if origin is t else origin, path)

    def _matmul(self, func: Callable, args: tuple, kwargs: dict) -> Tensor | None:
        """The product, recorded as attention, when the left side carries probabilities; else None."""
        lhs = args[0] if args else kwargs.get("input")
        rhs = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
        found = self.lookup(lhs)
        if found is None or not isinstance(lhs, Tensor) or not isinstance(rhs, Tensor):
            return None
        reason = _not_attention(lhs, rhs)
        if reason is not None:
            self.recorder._ignore(reason)
            return None
        out = func(*args, **kwargs)
        # The values stand for the keys' side: the queries only reach the probabilities.
        self.recorder._add(found[0], "softmax", key_input=rhs, output=out)
        return out

    def _lean_sdpa(self, args: tuple, kwargs: dict) -> Tensor | None:
        """SDPA through :func:`lean_attention`; None when the call does not fit it (not ``[B, H, N, E]``)."""
        p = dict(zip(SDPA_ARGS, args))
        p.update(kwargs)
        q, k, v = p["query"], p["key"], p["value"]
        if not all(isinstance(t, Tensor) and t.dim() == 4 for t in (q, k, v)) or not torch.is_grad_enabled():
            return None
        state, token = self.recorder.lean_state, self.recorder.lean_token_on(q.device)
        assert state is not None  # only a recorder made with lean=True takes this path
        call = LeanCall(index=self.recorder._count)
        out = lean_attention(q, k, v, state, token, call, attn_mask=p.get("attn_mask"),
                             is_causal=p.get("is_causal", False), scale=p.get("scale"), enable_gqa=p.get("enable_gqa", False))
        # A stand-in with the probabilities' shape and no storage: nothing N x N is kept.
        shape = (q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
        stand_in = torch.zeros((), dtype=torch.float32, device=q.device).expand(shape)
        self.recorder._add(stand_in, "sdpa", query_input=q, key_input=k, output=out, lean=call)
        return out

    def _note_consumers(self, func: Callable, args: tuple, kwargs: dict) -> None:
        operands = [*args, *kwargs.values()]
        operands += [t for a in args if isinstance(a, (list, tuple)) for t in a]
        if any(self.lookup(t) is not None for t in operands):
            self.recorder._consumers[resolve_name(func) or repr(func)] = None

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            if self.recorder.lean_state is not None:
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
            assert isinstance(query, Tensor) and isinstance(key, Tensor)
            same = query is key or (query.shape == key.shape and torch.equal(query, key))
            self.recorder._add(probs, "mha", self_attention=same, query_input=query, key_input=key, output=result[0])
            return result
        if func in _MATMUL:
            recorded = self._matmul(func, args, kwargs)
            return func(*args, **kwargs) if recorded is None else recorded
        out = func(*args, **kwargs)
        if func in _SOFTMAX:
            dim = _softmax_dim(args, kwargs)
            if isinstance(out, Tensor) and out.dim() >= 2 and dim in (-1, out.dim() - 1):
                if not out.requires_grad and torch.is_grad_enabled():
                    # A frozen model fed integer ids builds no graph; the probabilities become its
                    # leaves here, before any reshape derives the tensor the matmul will take.
                    out.requires_grad_(True)
                self.recorder._softmax_paths[self.recorder.current_path] = None
                self._tag(out, out, self.recorder.current_path)
            return out
        found = self.lookup(args[0]) if args else None
        if found is not None and isinstance(out, Tensor):
            origin, path = found
            if func in _PASS_THROUGH:
                self._tag(out, out, path)
                return out
            if func in _RESHAPE and out.dim() >= 2 and out.shape[-2:] == args[0].shape[-2:]:
                # Keep the tensor with the most leading dims: [B, H, Nq, Nk] rather than [B*H, Nq, Nk].
                self._tag(out, out if out.dim() > origin.dim() else origin, path)
                return out
        if self._tags:
            self._note_consumers(func, args, kwargs)
        return out


def _within(path: str, scope: str) -> bool:
    return not scope or path == scope or path.startswith(scope + ".")


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _glob(paths: Sequence[str]) -> list[str]:
    """Module paths with their numeric parts (layer indices) as ``*``, each pattern once."""
    return list(dict.fromkeys(".".join("*" if p.isdigit() else p for p in path.split(".")) for path in paths))


def _listing(paths: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(repr(p or "<model>") for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


class AttentionRecorder:
    """Context manager that records every attention probability tensor of ``model``'s forward.

    Args:
        model: the module whose forward runs inside the ``with`` block.
        attention_modules: glob patterns over module paths that select the attention to record.
            A named module whose output is a tensor of probabilities (``"blocks.*.attn.attn_drop"``,
            or any tensor when nothing inside the module is recognised as attention) is recorded by
            a forward hook; a named module that computes attention (``"encoder.layer.*.attention"``)
            contributes the calls recorded inside it; a named module that never runs because a
            fused kernel replaced it (timm's ``attn_drop`` next to ``F.scaled_dot_product_attention``)
            contributes the calls recorded in its parent module.

    Raises:
        ValueError: a pattern in ``attention_modules`` matches no module of ``model``; at the end of
            the ``with`` block, a named module returned no tensor and no attention was recorded
            inside it.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from lightning_gae.engine.capture import AttentionRecorder
        >>> layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
        >>> encoder = nn.TransformerEncoder(layer, num_layers=2).eval()
        >>> with AttentionRecorder(encoder) as rec:
        ...     out = encoder(torch.randn(2, 5, 16))
        >>> [r.path for r in rec.records], rec.records[0].as_heads().shape     # [B, heads, N, N]
        (['layers.0.self_attn', 'layers.1.self_attn'], torch.Size([2, 2, 5, 5]))
    """

    def __init__(self, model: nn.Module, attention_modules: Sequence[str] | str | None = None, lean: bool = False) -> None:
        self.model = model
        # lean=True: SDPA calls keep no probabilities; their Ā is made in the backward pass
        # (lightning_gae.engine.lean), driven by ``lean_state`` once the gradient of ``lean_tokens`` is asked for.
        self.lean_state = LeanState() if lean else None
        self.lean_tokens: dict[torch.device, Tensor] = {}
        """One zero per device the lean calls ran on (see :meth:`lean_token_on`)."""
        if isinstance(attention_modules, str):
            attention_modules = [attention_modules]
        self.attention_modules = list(attention_modules) if attention_modules else None
        self.records: list[AttentionRecord] = []
        self.ignored: list[tuple[str, str]] = []
        """``(module path, reason)`` of every softmax→matmul product that was not taken for attention."""
        self._names = {m: n for n, m in model.named_modules(remove_duplicate=False)}
        self._stack: list[str] = []
        self._exit: ExitStack | None = None
        self._mode: _CaptureMode | None = None
        self._targets = self._match(self.attention_modules) if self.attention_modules is not None else []
        self._reset()

    def _reset(self) -> None:
        # Everything the automatic capture recorded; ``records`` unless attention_modules selects.
        self._auto: list[AttentionRecord] = []
        self.records = self._auto
        self.ignored = []
        self._stack = []
        self._runs: dict[str, int] = {}
        self._count = 0
        self._hooked: dict[str, list[AttentionRecord]] = {}
        self._returned: dict[str, str] = {}
        # Insertion-ordered sets (dicts with None values) of what the forward did, for describe().
        self._softmax_paths: dict[str, None] = {}
        self._consumers: dict[str, None] = {}
        self._prob_modules: dict[str, None] = {}

    def _match(self, patterns: list[str]) -> list[tuple[str, nn.Module]]:
        targets: list[tuple[str, nn.Module]] = []
        for pattern in patterns:
            found = [(n, m) for n, m in self.model.named_modules() if fnmatch.fnmatchcase(n, pattern)]
            if not found:
                sample = [n for n, _ in self.model.named_modules() if n][:8]
                raise ValueError(
                    f"attention_modules pattern {pattern!r} matches no module of "
                    f"{type(self.model).__name__}; module paths look like {sample}. Name the modules that "
                    "output the post-softmax attention probabilities, or the attention modules that compute them."
                )
            targets.extend(t for t in found if t not in targets)
        return targets

    def lean_token_on(self, device: torch.device) -> Tensor:
        """The zero that every lean call on ``device`` takes, so that asking for its gradient runs their backwards.
        Made on that device: a token on another would be copied there by every call, and its gradient back, each
        copy between a GPU and the host waiting for the GPU to catch up."""
        token = self.lean_tokens.get(device)
        if token is None:
            token = self.lean_tokens[device] = torch.zeros((), device=device, requires_grad=True)
        return token

    @property
    def current_path(self) -> str:
        return self._stack[-1] if self._stack else ""

    def _record(self, tensor: Tensor, source: str, self_attention: bool | None, path: str, **extra: Any) -> AttentionRecord:
        self._count += 1
        return AttentionRecord(path=path, index=self._count - 1, tensor=tensor, source=source, self_attention=self_attention,
                               run=max(self._runs.get(path, 1) - 1, 0), **extra)

    def _add(self, tensor: Tensor, source: str, self_attention: bool | None = None, path: str | None = None,
             **extra: Any) -> None:
        """Record one call; ``extra``: query_input, key_input, output, lean (see :class:`AttentionRecord`)."""
        self._auto.append(self._record(tensor, source, self_attention, self.current_path if path is None else path, **extra))

    def _ignore(self, reason: str) -> None:
        self.ignored.append((self.current_path, reason))
        logger.debug("not attention at %r: %s", self.current_path or "<model>", reason)

    def _push(self, module: nn.Module, *_: Any) -> None:
        name = self._names.get(module)
        if name is not None:
            self._stack.append(name)
            self._runs[name] = self._runs.get(name, 0) + 1

    def _pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if module in self._names and self._stack:
            path = self._stack.pop()
            if self._mode is not None and self._mode.lookup(output) is not None:
                self._prob_modules[path] = None

    def _hook_output(self, name: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            assert self._mode is not None  # the hooks are on while the capture's mode is
            self._returned[name] = "probabilities" if self._mode.lookup(output) is not None else type(output).__name__
            if isinstance(output, Tensor):
                if not output.requires_grad and torch.is_grad_enabled():
                    output.requires_grad_(True)
                self._hooked.setdefault(name, []).append(self._record(output, "hook", None, name, output=output))

        return hook

    def _selected(self) -> list[AttentionRecord]:
        """The records ``attention_modules`` selects (see the class docstring), in call order."""
        chosen: dict[int, AttentionRecord] = {}
        for name, module in self._targets:
            inside = [r for r in self._auto if _within(r.path, name)]
            returned = self._returned.get(name)
            if returned == "probabilities" or (name in self._hooked and not inside):
                picked = self._hooked[name]
            elif inside:
                picked = inside
            elif returned is None:
                picked = [r for r in self._auto if _within(r.path, _parent(name))]
                if picked:
                    logger.debug("attention module %r never ran; using the attention recorded in %r", name, _parent(name))
            else:
                hint = f" Modules of this model that output probabilities: {_glob(list(self._prob_modules))}." if self._prob_modules else ""
                raise ValueError(
                    f"attention module {name!r} ({type(module).__name__}) returned {returned} and no attention was "
                    "recorded inside it: attention_modules must name modules that output the attention probabilities "
                    f"[B, H, N, N] or that compute attention.{hint}"
                )
            chosen.update((r.index, r) for r in picked)
        return [chosen[i] for i in sorted(chosen)]

    def describe(self) -> str:
        """What the last forward did that looks like attention, and the fix: for error messages."""
        counts: dict[str, int] = {}
        for rec in self._auto:
            counts[rec.source] = counts.get(rec.source, 0) + 1
        seen = (
            f"the forward called F.scaled_dot_product_attention {counts.get('sdpa', 0)} time(s) and "
            f"F.multi_head_attention_forward {counts.get('mha', 0)} time(s)"
        )
        softmax = list(self._softmax_paths)
        if softmax:
            seen += f"; it took a softmax over the last dim in {_listing(softmax)}"
            if self.ignored:
                path, reason = self.ignored[0]
                seen += f", multiplied {len(self.ignored)} time(s) in a way that is not attention ({path or '<model>'}: {reason})"
            if self._consumers:
                seen += f", passed to {', '.join(list(self._consumers)[:4])}"
            if counts.get("softmax"):
                seen += f", and recorded {counts['softmax']} softmax→matmul attention call(s)"
        else:
            seen += "; it took no softmax over the last dim"
        if self._targets:
            status = [f"{name} ({self._returned.get(name, 'never ran')})" for name, _ in self._targets]
            seen += f". attention_modules named {_listing(status)}"
        if self._prob_modules:
            fix = (
                f"These modules output the softmax probabilities: pass attention_modules={_glob(list(self._prob_modules))}."
            )
        else:
            fix = (
                "No module of this model outputs the softmax probabilities. If the model computes attention without a "
                "softmax, pass attention_modules=[...] naming the modules whose output is the attention [B, H, N, N] "
                "multiplied with the values; otherwise its attention is not supported (docs/troubleshooting.md#no-attention-recorded)."
            )
        return f"{seen}. {fix}"

    def __enter__(self) -> AttentionRecorder:
        self._reset()
        with ExitStack() as stack:
            run_eagerly(stack, self.model)
            for name, module in self._targets:
                stack.enter_context(module.register_forward_hook(self._hook_output(name)))
            stack.enter_context(nn.modules.module.register_module_forward_pre_hook(self._push))
            stack.enter_context(nn.modules.module.register_module_forward_hook(self._pop, always_call=True))
            self._mode = stack.enter_context(_CaptureMode(self))
            self._exit = stack.pop_all()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        exit_stack, self._exit = self._exit, None
        self._stack = []
        if exit_stack is not None:
            exit_stack.close()
        self._mode = None
        if exc_type is None and self._targets:
            self.records = self._selected()
