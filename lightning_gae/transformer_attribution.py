"""Transformer attribution (Chefer, Gur & Wolf, CVPR 2021) on unmodified models.

The authors' method (``generate_LRP(method="transformer_attribution")`` of their
``Transformer-Explainability`` repository): the LRP relevance ``R`` of every layer's attention
probabilities ``A``, times the plain gradient of the explained score at ``A``, negatives removed and
averaged over heads, ``Ā = E_h[(∇A ⊙ R_A)⁺]``; the layers are rolled out as
``(I + Ā_L) ... (I + Ā_1)`` and the query token's row read out (its own entry 0).

``R_A`` follows the authors' LRP rules (``modules/layers_ours.py``, ``baselines/ViT/ViT_LRP.py``),
propagated in gradient form through the model as it is (the mode of :mod:`lightning_gae.lrp`, a
second rule set): the relevance of a tensor ``x`` is ``x * g(x)`` with ``g`` the modified gradient.
The output relevance is 1 at the explained score (their one-hot), then

* linear layers (``F.linear``, ``x @ W``): alpha-beta with alpha=1, beta=0, the bias left out;
* LayerNorm / RMSNorm, elementwise activations (GELU...), softmax: relevance passed on unchanged
  (their ``RelProp.relprop`` is the identity);
* a sum of two relevance-carrying tensors (the residuals): their ``Add`` rule, the z-rule
  rescaled so that each operand keeps its share ``|ΣR_a| / (|ΣR_a| + |ΣR_b|)`` of the total,
  summed per sample (their code runs one sample). ``+`` a constant (an attention mask) passes the
  gradient: where the constant is 0 the relevance is unchanged, as their BERT code leaves the mask;
* a product of two relevance-carrying tensors (``Q Kᵀ``, ``A V``): the z-rule, halved for each side
  (their ``einsum`` rule and ``cam /= 2``); a product with a constant, shape ops, dropout (eval),
  copies and casts: unchanged (their ``Clone`` sums the copies' relevance, as autograd does);
* fused attention (SDPA, ``nn.MultiheadAttention``) computed explicitly under the same rules.

Anything else on the path from the attention to the score (a convolution, a mean, ``sub``...)
raises :class:`~lightning_gae.lrp.UnsupportedOperation` naming the operation and the module.
Two forwards are run: one under these rules, one plain for the gradients of the probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from lightning_gae import lrp
from lightning_gae.capture import explicit_multi_head_attention_forward, explicit_scaled_dot_product_attention

__all__ = ["TransformerAttributionCapture", "attribution_row"]

METHOD = "transformer_attribution"


def safe_divide(a: Tensor, b: Tensor) -> Tensor:
    """The authors' ``safe_divide``: ``a / b`` with ``|b| >= 1e-9`` and 0 where ``b == 0``."""
    den = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    den = den + den.eq(0).to(den.dtype) * 1e-9
    return a / den * b.ne(0).to(b.dtype)


class _AlphaBeta(torch.autograd.Function):
    """``F.linear`` forward; LRP alpha=1, beta=0 backward in gradient form (bias ignored)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        y = F.linear(x, weight, bias)
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        x, w, y = ctx.saved_tensors
        pw, nw = w.clamp(min=0), w.clamp(max=0)
        z = F.linear(x.clamp(min=0), pw) + F.linear(x.clamp(max=0), nw)
        s = safe_divide(y * grad, z)
        # R_x = x⁺ (S W⁺) + x⁻ (S W⁻), so g_x = R_x / x:
        return torch.where(x > 0, s @ pw, torch.where(x < 0, s @ nw, torch.zeros((), dtype=s.dtype))), None, None


def _per_sample(t: Tensor) -> Tensor:
    return t.sum(dim=tuple(range(1, t.dim())), keepdim=True) if t.dim() > 1 else t.sum()


class _AddRule(torch.autograd.Function):
    """``a + b`` forward; the authors' ``Add.relprop`` in gradient form, per sample."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor) -> Tensor:
        y = a + b
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b, y = ctx.saved_tensors
        ra, rb = _per_sample(a * grad), _per_sample(b * grad)
        total = _per_sample(y * grad)
        share = ra.abs() + rb.abs()
        # a' = a * (|Σa| / (|Σa| + |Σb|) * ΣR) / Σa, so g_a = g * that factor.
        out = [(grad * safe_divide(safe_divide(r.abs(), share) * total, r)).sum_to_size(x.shape) if needed else None
               for x, r, needed in ((a, ra, ctx.needs_input_grad[0]), (b, rb, ctx.needs_input_grad[1]))]
        return out[0], out[1]


# Routing, copies, casts, dropout (eval): relevance goes where the values go, unchanged.
_ROUTING = lrp._LINEAR - {"add", "sub", "neg", "sum", "mean", "cumsum", "embedding", "softmax"}
_MATMULS = {"matmul", "bmm", "einsum"}
_NORMS = {F.layer_norm, F.rms_norm}
_KEEPS_PROBS = {"dropout", "to", "type", "type_as", "float", "contiguous", "clone", "masked_fill"}


class _TAMode(TorchFunctionMode):
    """The authors' LRP rules (``rules=True``) or the plain forward; both record the attention probabilities."""

    supported = ("linear layers (alpha-beta), residual sums (Add rule), LayerNorm/RMSNorm, elementwise activations and "
                 "softmax (identity), attention products Q·Kᵀ and A·V (z-rule halved), fused attention (SDPA, "
                 "nn.MultiheadAttention), products with constants and shape ops (lightning_gae.transformer_attribution).")

    def __init__(self, capture: TransformerAttributionCapture) -> None:
        super().__init__()
        self.capture = capture
        self.rules = capture.rules

    # lrp._LRPMode's messages, with this rule set's list of what is supported.
    _no_rule = lrp._LRPMode._no_rule
    _refuse = lrp._LRPMode._refuse

    def _tag(self, out: Any) -> Any:
        if isinstance(out, Tensor):
            self.capture._probs[id(out)] = out
        return out

    def _is_probs(self, t: Any) -> bool:
        return isinstance(t, Tensor) and self.capture._probs.get(id(t)) is t

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        cap = self.capture
        if cap._in_unit:
            return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention or func is F.multi_head_attention_forward:
            if not any(lrp._live(t) for t in lrp._flat_tensors(args, kwargs)):
                return func(*args, **kwargs)
            # Computed explicitly, its own operations again under this mode (a fresh one: this one is off here).
            with _TAMode(cap):
                if func is F.scaled_dot_product_attention:
                    return explicit_scaled_dot_product_attention(*args, **kwargs)[0].to(args[2].dtype if len(args) > 2 else kwargs["value"].dtype)
                return explicit_multi_head_attention_forward(*args, **kwargs)[0]
        live = [t for t in lrp._flat_tensors(args, kwargs) if t.requires_grad]
        if not live:
            return func(*args, **kwargs)
        name = lrp._op_name(func)
        inplace = name.endswith("_") and not name.startswith("_")
        base = name[:-1] if inplace else name
        if base in _MATMULS:
            operands = lrp._LRPMode._product_operands(base, args, kwargs)
            if sum(lrp._live(t) for t in operands) == 2 and not inplace:
                if self._is_probs(operands[0]):
                    cap._record(operands[0])
                out = func(*args, **kwargs)
                return lrp._Scale.apply(out, 0.5) if self.rules else out
            if self.rules and base == "matmul" and lrp._live(operands[0]) and isinstance(operands[1], Tensor) \
                    and operands[1].dim() == 2 and not inplace:
                return _AlphaBeta.apply(operands[0], operands[1].T, None)  # x @ W: a linear layer
        if not self.rules:
            out = func(*args, **kwargs)
            if base == "softmax" or (base in _KEEPS_PROBS and args and self._is_probs(args[0])):
                self._tag(out)
            return out
        if base in lrp._ACTIVATIONS and (kwargs.get("inplace") is True or any(a is True for a in args[1:])):
            inplace = True
        if func in _NORMS or base == "softmax" or (base in lrp._ACTIVATIONS and not inplace):
            x = args[0] if args else kwargs.get("input")
            out = func(*args, **kwargs)
            out = lrp.identity_rule(x, out) if lrp._live(x) else out
            return self._tag(out) if base == "softmax" else out
        if base == "linear" and not inplace:
            x = args[0] if args else kwargs.get("input")
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if lrp._live(weight) or lrp._live(bias) or not lrp._live(x):
                return self._refuse(func, inplace, args, kwargs)
            return _AlphaBeta.apply(x, weight, bias)
        if base == "add" and not inplace and len(args) == 2 and not kwargs:
            a, b = args
            if not (lrp._live(a) and lrp._live(b)):
                return func(*args, **kwargs)  # a constant (an attention mask, a bias): the gradient passes
            return _AddRule.apply(a, b)
        if base in ("mul", "div") and not inplace:
            other = args[1] if len(args) > 1 else kwargs.get("other")
            first = args[0] if args else kwargs.get("input")
            if not (lrp._live(other) and lrp._live(first)) and not (base == "div" and lrp._live(other)):
                return func(*args, **kwargs)  # a product with a constant: relevance unchanged
        if (base in _ROUTING and not inplace) or name in ("detach", "requires_grad_"):
            out = func(*args, **kwargs)
            if base in _KEEPS_PROBS and args and self._is_probs(args[0]):
                self._tag(out)
            return out
        return self._refuse(func, inplace, args, kwargs)


class TransformerAttributionCapture(lrp.LRPCapture):
    """:class:`~lightning_gae.lrp.LRPCapture` with the authors' rules (``rules=True``) or none; records
    in ``probs`` the attention probabilities (a softmax output multiplied with values) in call order."""

    method = METHOD
    mode_class = _TAMode

    def __init__(self, model: nn.Module, rules: bool, embedding_layer: nn.Module | str | None | bool = False) -> None:
        super().__init__(model, embedding_layer=embedding_layer)
        self.rules = rules
        self.probs: list[Tensor] = []
        self.paths: list[str] = []
        self._probs: dict[int, Tensor] = {}

    def _record(self, probs: Tensor) -> None:
        self.probs.append(probs)
        self.paths.append(self.current_path)

    def _push(self, module: nn.Module, args: Any) -> Any:
        if self.rules:
            return super()._push(module, args)
        self._stack.append(module)
        return None

    def _pop(self, module: nn.Module, args: Any, output: Any) -> Any:
        if self.rules:
            return super()._pop(module, args, output)
        if self._stack:
            self._stack.pop()
        return None

    def __exit__(self, *exc: Any) -> None:
        self._probs = {}
        super().__exit__(*exc)


def attribution_row(relevance: list[Tensor], grads: list[Tensor], start: Tensor) -> Tensor:
    """``start [B, N] @ (I + Ā_L) ... (I + Ā_1)`` with ``Ā = mean_h((grad * R)⁺)``; inputs ``[B, H, N, N]``."""
    row = start
    for r, g in zip(reversed(relevance), reversed(grads)):
        abar = (g * r).clamp(min=0).mean(dim=1)
        row = row + torch.einsum("bn,bnm->bm", row, abar)
    return row


def as_heads(t: Tensor) -> Tensor:
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    return t.reshape(t.shape[0], -1, t.shape[-2], t.shape[-1])


def explain(model: nn.Module, inputs: Any, target: Any, query: Any, embedding_layer: nn.Module | str | None = None) -> Any:
    """``method="transformer_attribution"``: a forward under the authors' rules and a plain one."""
    import sys

    from lightning_gae import rules

    ex = sys.modules["lightning_gae.explain"]  # (the package's name ``explain`` is the function)
    from lightning_gae._structures import call_args, eval_mode, map_tensors, model_logits

    ex._refuse_nonfinite(inputs)
    if isinstance(query, dict):
        raise ValueError(f"method={METHOD!r} explains one token set; query={{set: ...}} is for models with several")
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    runs = []
    floats = []
    map_tensors(inputs, lambda t: floats.append(t.is_floating_point()) or t)
    # Float inputs (pixels) are the leaves; token ids are not: the word embedding's output is, then.
    leaf = False if any(floats) else embedding_layer
    with eval_mode(model), torch.random.fork_rng(devices=cuda), torch.inference_mode(False), torch.enable_grad():
        for use_rules in (True, False):
            # The float inputs are the leaves: a tensor carries relevance when it depends on them.
            args, kwargs = call_args(map_tensors(inputs, lambda t: t.detach().clone().requires_grad_(t.is_floating_point())))
            capture = TransformerAttributionCapture(model, rules=use_rules, embedding_layer=leaf)
            with capture:
                output = capture.forward(*args, **kwargs)
            if not capture.probs:
                raise ValueError(f"method={METHOD!r} found no attention (softmax -> matmul with values, SDPA or "
                                 f"nn.MultiheadAttention) depending on the inputs of {type(model).__name__}")
            probs = [as_heads(p) for p in capture.probs]
            batch, num_tokens = probs[0].shape[0], probs[0].shape[-1]
            logits = model_logits(output)
            keep = ex._keep_mask(kwargs, batch, num_tokens)
            keep = torch.ones(batch, num_tokens, dtype=torch.bool, device=probs[0].device) if keep is None else keep.to(probs[0].device)
            query_index = ex._query_index(0 if query is None else query, batch, num_tokens, keep, probs[0].device)
            score, target_index = ex._target_scores(output, logits, target, query_index, batch)
            if not score.requires_grad:
                raise ValueError("the explained score does not depend on the attention (no gradient path); check target")
            # The authors' one-hot relevance at the score: gradient 1/score in gradient form; plain: gradient 1.
            seed = safe_divide(torch.ones_like(score), score.detach()) if use_rules else torch.ones_like(score)
            grads = torch.autograd.grad(score, capture.probs, grad_outputs=seed, allow_unused=True)
            grads = [as_heads(torch.zeros_like(p) if g is None else g) for p, g in zip(capture.probs, grads)]
            runs.append((probs, grads, capture.paths))
        (lrp_probs, lrp_grads, paths), (_, plain_grads, plain_paths) = runs
        if paths != plain_paths or any(a.shape != b.shape for a, b in zip(lrp_grads, plain_grads)):
            raise ValueError(f"method={METHOD!r}: the two forwards met different attention ({paths} vs {plain_paths})")
        with torch.no_grad():
            relevance = [p.detach() * g for p, g in zip(lrp_probs, lrp_grads)]
            row = attribution_row(relevance, plain_grads, rules.start_rows(query_index, num_tokens))
            tokens = ex._hide_own(row, query_index).masked_fill(~keep, 0.0).to(torch.float32)
    return ex.Explanation(tokens=tokens, logits=None if logits is None else logits.detach(), target=target_index,
                          score=score.detach(), method=METHOD, layers=paths,
                          query=None if query_index.is_floating_point() else query_index, relevance={"tokens": tokens})
