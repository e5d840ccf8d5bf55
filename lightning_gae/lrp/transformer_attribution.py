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
* fused attention (SDPA, ``nn.MultiheadAttention``) computed explicitly under the same rules (SDPA as one
  function, :class:`FusedAttention`, which reduces its probabilities' two gradients to ``Ā`` itself).

Anything else on the path from the attention to the score (a convolution, a mean, ``sub``...)
raises :class:`~lightning_gae.lrp.UnsupportedOperation` naming the operation and the module.
One forward runs under these rules; its graph has two backward passes, one with the rules (the relevance
at the probabilities) and one with each rule's plain gradient (the attention gradients), selected by
the capture's ``plain`` flag: the plain gradient of the model, with no second forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_gae._structures import first_tensor, map_tensors, model_logits
from lightning_gae.engine.attention import (
    as_heads,
    explicit_multi_head_attention_forward,
    explicit_scaled_dot_product_attention,
)
from lightning_gae.engine.readout import Explanation, explaining, hide_own, keep_mask, readout_query, target_scores
from lightning_gae.engine.rules import start_rows
from lightning_gae.lrp import mode
from lightning_gae.lrp.fsdp1 import fsdp1_units, gather_again
from lightning_gae.lrp._ops import unbind
from lightning_gae.lrp.ta_attention import Layer, fused_attention

__all__ = ["TransformerAttributionCapture", "attribution_row"]

METHOD = "transformer_attribution"


def safe_divide(a: Tensor, b: Tensor) -> Tensor:
    """The authors' ``safe_divide``: ``a / b`` with ``|b| >= 1e-9`` and 0 where ``b == 0``."""
    den = b.clamp(min=1e-9) + b.clamp(max=1e-9)
    den = den + den.eq(0).to(den.dtype) * 1e-9
    return a / den * b.ne(0).to(b.dtype)


class _AlphaBeta(torch.autograd.Function):
    """``F.linear`` forward; backward: the plain gradient, or LRP alpha=1, beta=0 in gradient form (bias ignored)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, capture: TransformerAttributionCapture) -> Tensor:
        y = F.linear(x, weight, bias)
        ctx.capture = capture
        ctx.save_for_backward(x, weight, y, bias)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        x, w, y, bias = ctx.saved_tensors
        scratch = ctx.capture.scratch
        if ctx.capture.plain:
            return _on_used_rows(lambda x, y, g: _linear_gradient(g, w, scratch), x, y, grad), None, None, None
        rule = lambda x, y, g: _alpha_beta_gradient(x, w, y, g, scratch, bias)  # noqa: E731
        return _on_used_rows(rule, x, y, grad), None, None, None


def _linear_gradient(grad: Tensor, w: Tensor, scratch: Callable[..., Tensor]) -> Tensor:
    """``grad @ w``; a strided ``grad`` (from a reshape of q, k, v, say) is first copied into a scratch buffer."""
    if grad.dim() > 1 and not grad.is_contiguous() and grad.dtype == w.dtype:
        grad = scratch(0, grad.numel(), grad.dtype, grad.device).view(grad.shape).copy_(grad)
    return grad @ w


def _on_used_rows(backward: Callable[[Tensor, Tensor, Tensor], Tensor], x: Tensor, y: Tensor, grad: Tensor) -> Tensor:
    """``backward(x, y, grad)`` on the rows (tokens) whose gradient is not all 0, the others' result 0:
    past a model's last attention only its readout token's rows carry any (a class token's, say)."""
    if grad.dim() < 2 or grad.numel() < 2 * grad.shape[-1] or bool(grad[(-1,) * (grad.dim() - 1)].any()):
        return backward(x, y, grad)
    g = grad.reshape(-1, grad.shape[-1])
    used = g.any(dim=1).nonzero().squeeze(1)
    if used.numel() * 2 > g.shape[0]:
        return backward(x, y, grad)
    x2, y2 = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
    part = backward(x2.index_select(0, used), y2.index_select(0, used), g.index_select(0, used))
    return part.new_zeros(x2.shape).index_copy_(0, used, part).view(x.shape)


def _alpha_beta_gradient(x: Tensor, w: Tensor, y: Tensor, grad: Tensor, scratch: Callable[..., Tensor],
                         bias: Tensor | None = None) -> Tensor:
    """``g_x = R_x / x`` with ``R_x = x⁺ (S W⁺) + x⁻ (S W⁻)``, ``S = safe_divide(y * g, z)``, ``z = x⁺ W⁺ᵀ + x⁻ W⁻ᵀ``.

    ``z`` is ``(x Wᵀ + |x| |W|ᵀ) / 2`` (each ``x_i W_ji`` counted in it when it is positive), and ``x Wᵀ`` is
    the forward's ``y`` less the bias: one matrix product instead of two. Its terms are >= 0, so
    :func:`safe_divide` is ``R / (z + 1e-9)`` with 0 where ``z`` is 0; where the true ``z`` is 0 (no
    positive term) rounding can leave ``± ulp`` instead, clamped at 0: ``S`` there meets only zeros
    of ``W⁺``/``W⁻`` at the ``x`` it would reach, as it does in the two-product form. ``g_x`` is ``S W⁺``
    where ``x > 0``, ``S W⁻`` where ``x < 0``, 0 where ``x == 0`` (picked with ``lerp`` by a 0/1 weight,
    exact, which a CPU runs several times faster than ``where``). On flattened ``[M, features]``
    matrices, the intermediates in ``scratch`` buffers reused by every linear layer of the backward pass
    (fresh ones cost a CPU more in page faults than their arithmetic).
    """
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    dtype = torch.promote_types(torch.promote_types(x.dtype, w.dtype), torch.promote_types(y.dtype, grad.dtype))
    x, w = x.to(dtype), w.to(dtype)
    rows, n_in, n_out = x.shape[0], x.shape[1], w.shape[0]
    part = scratch(0, rows * n_in, dtype, x.device).view(rows, n_in)
    magnitude = torch.abs(x, out=part)
    has_zero = bool(magnitude.amin() == 0)
    z = scratch(1, rows * n_out, dtype, x.device).view(rows, n_out)
    if bias is None:
        z.copy_(y.reshape(rows, n_out))
    else:
        torch.sub(y.reshape(rows, n_out), bias.to(dtype), out=z)
    z.addmm_(magnitude, w.abs().T, beta=0.5, alpha=0.5).clamp_(min=0)
    # (A strided grad, the q, k, v projection's, is read in place, not copied by a reshape.)
    s = torch.mul(y, grad, out=scratch(2, rows * n_out, dtype, x.device).view(y.shape)).view(rows, n_out)
    empty = z == 0 if bool(z.amin() == 0) else None
    s.div_(z.add_(1e-9))
    if empty is not None:
        s.masked_fill_(empty, 0.0)
    positive = torch.gt(x, 0, out=scratch(3, rows * n_in, dtype, x.device).view(rows, n_in))
    g = torch.lerp(torch.mm(s, w.clamp(max=0), out=part), torch.mm(s, w.clamp(min=0), out=scratch(4, rows * n_in, dtype, x.device).view(rows, n_in)), positive)
    if has_zero:
        g.masked_fill_(x == 0, 0.0)
    return g.view(shape).to(grad.dtype)


def _half_unless_plain(capture: TransformerAttributionCapture) -> Callable[[Tensor], Tensor]:
    """The backward of a product of two relevance-carrying tensors: the plain gradient, or half of it (the
    z-rule's share of each operand, the authors' ``cam /= 2``), as the capture's pass is when it runs."""
    return lambda grad: grad if capture.plain else grad * 0.5


class _Identity(torch.autograd.Function):
    """``out = f(x)`` as the model computed it (``out`` keeps its own graph); backward: the plain
    gradient through that graph, or the identity rule ``g_x = out / x * g`` (0 where ``x`` is 0).

    ``out`` itself comes back, its history extended by this function (``mark_dirty``), when nothing of
    its graph keeps ``out`` for its own backward (GELU and LayerNorm keep their inputs; tanh, softmax
    keep their outputs, and the version count ``mark_dirty`` raises would fail them): no copy of it.
    Else a view (``view=True``: the caller never changes it in place) or a copy.

    The quotient is made in the rules' pass from ``x`` and ``out``, which the layers beside it keep
    anyway (a linear layer its input and output, a residual sum its operands): no tensor of the
    activation's size held per layer from the forward on. Where the model writes into either before
    its forward ends (``h[:, 0] = ...``, the one in-place change the rules let through), the capture
    makes the quotient first (:meth:`TransformerAttributionCapture._before_change`).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, out: Tensor, capture: TransformerAttributionCapture, view: bool) -> Tensor:
        ctx.capture, ctx.path, ctx.ratio = capture, capture.current_path, None
        if _extendable(x, out):
            ctx.mark_dirty(out)
            result = out
        else:
            result = out.view_as(out) if view else out.clone()
        ctx.save_for_backward(x, out)
        capture._watch(ctx, x, out)
        return result

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        if ctx.capture.plain:
            return None, grad, None, None
        ratio = ctx.ratio
        if ratio is None:
            try:
                x, out = ctx.saved_tensors
            except RuntimeError as error:  # changed in place where the mode does not see it (inside an activation module)
                raise mode.UnsupportedOperation(
                    f"method={METHOD!r}: the input or output of the identity rule in module {ctx.path or '<model>'!r} was "
                    "changed in place by an operation the rules do not see; compute it out of place "
                    "(lightning_gae.lrp.transformer_attribution)") from error
            ratio = _ratio(out, x)
        if ratio.dtype == grad.dtype and ratio.shape == grad.shape:
            # The quotient is read once (the plain pass does not): the gradient goes into its memory.
            return ratio.mul_(grad), None, None, None
        return (ratio * grad).to(grad.dtype), None, None, None


def _extendable(x: Tensor, out: Tensor) -> bool:
    """Whether ``out`` can be returned marked dirty: its own tensor, made by a node that does not keep it."""
    node = out.grad_fn
    if node is None or out is x or out._base is not None or isinstance(node, torch.autograd.function.BackwardCFunction):
        return False
    ptr = out.untyped_storage().data_ptr()
    for name in dir(node):
        if name.startswith("_saved_"):
            saved = getattr(node, name)
            if isinstance(saved, Tensor) and saved.untyped_storage().data_ptr() == ptr:
                return False
    return True


def _ratio(out: Tensor, x: Tensor) -> Tensor:
    """``out / x``, 0 where ``x`` is 0 (looked for only when the quotient has a non-finite value)."""
    ratio = out / x
    if not torch.isfinite(ratio.sum()):
        ratio.masked_fill_(x == 0, 0.0)
    return ratio


def _per_sample(t: Tensor) -> Tensor:
    return t.sum(dim=tuple(range(1, t.dim())), keepdim=True) if t.dim() > 1 else t.sum()


class _AddRule(torch.autograd.Function):
    """``a + b`` forward; backward: the plain gradient, or the authors' ``Add.relprop`` in gradient form, per sample."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, capture: TransformerAttributionCapture) -> Tensor:
        ctx.capture = capture
        ctx.save_for_backward(a, b)
        return a + b

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        a, b = ctx.saved_tensors
        needed = ctx.needs_input_grad[:2]
        if ctx.capture.plain:
            ga, gb = (grad.sum_to_size(x.shape) if n else None for x, n in zip((a, b), needed))
            return ga, gb, None
        ra, rb = (_per_sample_dot(x, grad, ctx.capture.scratch) for x in (a, b))
        # ΣR of the sum, R = (a + b) * g, is ra + rb.
        total, share = ra + rb, ra.abs() + rb.abs()
        # a' = a * (|Σa| / (|Σa| + |Σb|) * ΣR) / Σa, so g_a = g * that factor.
        out = [(grad * safe_divide(safe_divide(r.abs(), share) * total, r)).sum_to_size(x.shape) if n else None
               for x, r, n in zip((a, b), (ra, rb), needed)]
        return out[0], out[1], None


def _per_sample_dot(x: Tensor, grad: Tensor, scratch: Callable[..., Tensor]) -> Tensor:
    """``_per_sample(x * grad)``, the product in a scratch buffer."""
    if x.shape != grad.shape or x.dtype != grad.dtype:
        return _per_sample(x * grad)
    return _per_sample(torch.mul(x, grad, out=scratch(0, x.numel(), x.dtype, x.device).view(x.shape)))


# Routing, copies, casts, dropout (eval): relevance goes where the values go, unchanged.
_ROUTING = mode.LINEAR_OPS - {"add", "sub", "neg", "sum", "mean", "cumsum", "embedding", "softmax"}
_MATMULS = {"matmul", "bmm", "einsum"}
_NORMS = {F.layer_norm, F.rms_norm}
_KEEPS_PROBS = {"dropout", "to", "type", "type_as", "float", "contiguous", "clone", "masked_fill"}


class _TAMode(mode.RuleMode):
    """The authors' LRP rules, each with the plain gradient as its second backward; records the attention probabilities."""

    supported = ("linear layers (alpha-beta), residual sums (Add rule), LayerNorm/RMSNorm, elementwise activations and "
                 "softmax (identity), attention products Q·Kᵀ and A·V (z-rule halved), fused attention (SDPA, "
                 "nn.MultiheadAttention), products with constants and shape ops (lightning_gae.lrp.transformer_attribution).")

    capture: TransformerAttributionCapture

    def _tag(self, out: Any) -> Any:
        if isinstance(out, Tensor):
            self.capture._probs[id(out)] = out
        return out

    def _is_probs(self, t: Any) -> bool:
        return isinstance(t, Tensor) and self.capture._probs.get(id(t)) is t

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        cap = self.capture
        if cap.in_unit:
            return func(*args, **kwargs)
        if func is Tensor.__setitem__ and cap._watched and args and isinstance(args[0], Tensor):
            cap._before_change(args[0])
        if func is F.scaled_dot_product_attention or func is F.multi_head_attention_forward:
            if not any(mode.carries_relevance(t) for t in mode.flat_tensors(args, kwargs)):
                return func(*args, **kwargs)
            if func is F.scaled_dot_product_attention:
                out = fused_attention(cap, args, kwargs)
                if out is not None:
                    return out
            # Computed explicitly, its own operations again under this mode (a fresh one: this one is off here).
            with _TAMode(cap):
                if func is F.scaled_dot_product_attention:
                    return explicit_scaled_dot_product_attention(*args, **kwargs)[0].to(args[2].dtype if len(args) > 2 else kwargs["value"].dtype)
                return explicit_multi_head_attention_forward(*args, **kwargs)[0]
        live = [t for t in mode.flat_tensors(args, kwargs) if t.requires_grad]
        if not live:
            return func(*args, **kwargs)
        name = mode.op_name(func)
        inplace = name.endswith("_") and not name.startswith("_")
        base = name[:-1] if inplace else name
        if base in _MATMULS:
            operands = mode.LRPMode.product_operands(base, args, kwargs)
            if sum(mode.carries_relevance(t) for t in operands) == 2 and not inplace:
                if self._is_probs(operands[0]):
                    cap.record(operands[0])
                return mode.on_gradient(func(*args, **kwargs), _half_unless_plain(cap))
            if base == "matmul" and mode.carries_relevance(operands[0]) and isinstance(operands[1], Tensor) \
                    and operands[1].dim() == 2 and not inplace:
                return _AlphaBeta.apply(operands[0], operands[1].T, None, cap)  # x @ W: a linear layer
        if base in mode.ACTIVATION_OPS and (kwargs.get("inplace") is True or any(a is True for a in args[1:])):
            inplace = True
        if func in _NORMS or base == "softmax" or (base in mode.ACTIVATION_OPS and not inplace):
            x = args[0] if args else kwargs.get("input")
            out = func(*args, **kwargs)
            if not mode.carries_relevance(x):
                return out
            # The probabilities are never changed in place (the mode refuses that): no copy for the N x N maps.
            out = _Identity.apply(x, out, cap, base == "softmax")
            return self._tag(out) if base == "softmax" else out
        if base == "linear" and not inplace:
            x = args[0] if args else kwargs.get("input")
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if mode.carries_relevance(weight) or mode.carries_relevance(bias) or not mode.carries_relevance(x):
                return self.refuse(func, inplace, args, kwargs)
            return _AlphaBeta.apply(x, weight, bias, cap)
        if base == "add" and not inplace and len(args) == 2 and not kwargs:
            a, b = args
            if not (mode.carries_relevance(a) and mode.carries_relevance(b)):
                return func(*args, **kwargs)  # a constant (an attention mask, a bias): the gradient passes
            return _AddRule.apply(a, b, cap)
        if base in ("mul", "div") and not inplace:
            other = args[1] if len(args) > 1 else kwargs.get("other")
            first = args[0] if args else kwargs.get("input")
            if not (mode.carries_relevance(other) and mode.carries_relevance(first)) and not (base == "div" and mode.carries_relevance(other)):
                return func(*args, **kwargs)  # a product with a constant: relevance unchanged
        if base == "unbind" and not inplace and mode.carries_relevance(args[0] if args else kwargs.get("input")):
            return unbind(args, kwargs)
        if (base in _ROUTING and not inplace) or name in ("detach", "requires_grad_"):
            out = func(*args, **kwargs)
            if base in _KEEPS_PROBS and args and self._is_probs(args[0]):
                self._tag(out)
            return out
        return self.refuse(func, inplace, args, kwargs)


class TransformerAttributionCapture(mode.LRPCapture):
    """:class:`~lightning_gae.lrp.LRPCapture` with the authors' rules; records in ``probs`` the attention
    probabilities (a softmax output multiplied with values) in call order. The forward's graph has two
    backward passes: the LRP relevance while ``plain`` is False, the plain gradient while it is True."""

    method = METHOD
    mode_class = _TAMode

    def __init__(self, model: nn.Module, embedding_layer: nn.Module | str | None | bool = False) -> None:
        super().__init__(model, embedding_layer=embedding_layer)
        self.plain = False
        self.probs: list[Tensor] = []
        self.paths: list[str] = []
        self._probs: dict[int, Tensor] = {}
        self._watched: dict[int, list[tuple[Any, Tensor, Tensor]]] = {}  # storage -> identity rules reading it
        self.layers: dict[int, Layer] = {}  # fused attentions, by their place in probs
        self._scratch: dict[int, Tensor] = {}

    def scratch(self, slot: int, size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """A flat buffer of ``size`` elements for intermediates of one backward step, reused by the next."""
        buf = self._scratch.get(slot)
        if buf is None or buf.numel() < size or buf.dtype != dtype or buf.device != device:
            self._scratch.pop(slot, None)  # dropped before the new one is made
            buf = self._scratch[slot] = torch.empty(size, dtype=dtype, device=device)
        return buf[:size]

    def record(self, probs: Tensor) -> None:
        self.probs.append(probs)
        self.paths.append(self.current_path)

    def unit_rule(self, x: Tensor, output: Tensor) -> Tensor:
        return _Identity.apply(x, output, self, False)

    def _watch(self, ctx: Any, x: Tensor, out: Tensor) -> None:
        """Until the forward ends, an in-place write into ``x``'s or ``out``'s memory first makes ``ctx``'s quotient."""
        entry = (ctx, x, out)
        for t in (x, out):
            self._watched.setdefault(t.untyped_storage().data_ptr(), []).append(entry)

    def _before_change(self, t: Tensor) -> None:
        for ctx, x, out in self._watched.pop(t.untyped_storage().data_ptr(), ()):
            if ctx.ratio is None:
                ctx.ratio = _ratio(out, x)

    def __exit__(self, *exc: Any) -> None:
        self._probs, self._watched = {}, {}
        super().__exit__(*exc)


def _abar(p: Tensor, r: Tensor, g: Tensor) -> Tensor:
    """``mean_h((g ⊙ p ⊙ r)⁺)``, the product in ``r``'s memory (the relevance gradient, used once) where it fits."""
    same = r.shape == p.shape == g.shape and r.dtype == torch.promote_types(torch.promote_types(p.dtype, g.dtype), r.dtype)
    return (r.mul_(p) if same else p * r).mul_(g).clamp_(min=0).mean(dim=1)


def _rolled_out(abars: list[Tensor], start: Tensor) -> Tensor:
    row = start
    for abar in reversed(abars):
        row = row.to(torch.promote_types(row.dtype, abar.dtype))  # a float64 model's maps: the row follows them
        row = row + torch.einsum("bn,bnm->bm", row, abar.to(row.dtype))
    return row


def attribution_row(probs: list[Tensor], lrp_grads: list[Tensor], grads: list[Tensor], start: Tensor) -> Tensor:
    """``start [B, N] @ (I + Ā_L) ... (I + Ā_1)`` with ``Ā = mean_h((grad ⊙ R)⁺)``, ``R = probs ⊙ lrp_grad``
    (the relevance of the probabilities in gradient form); inputs ``[B, H, N, N]``. ``lrp_grads`` are
    overwritten (each holds its layer's product)."""
    return _rolled_out([_abar(p, r, g) for p, r, g in zip(probs, lrp_grads, grads)], start)


def explain(model: nn.Module, inputs: Any, target: Any, query: Any,
            embedding_layer: nn.Module | str | None = None) -> Explanation:
    """``method="transformer_attribution"``: one forward under the authors' rules, two backward passes
    of its graph (the LRP relevance and the plain gradient at each attention map). Inside an autocast region
    it runs with autocast off: the alpha-beta rule's sums of positive and negative parts lose most of their digits
    in half precision, so the relevance is that of the float32 model."""
    first = first_tensor(inputs)
    device = first.device.type if first is not None else "cpu"
    with torch.autocast(device, enabled=False) if device in ("cpu", "cuda") else contextlib.nullcontext():
        return _explain(model, inputs, target, query, embedding_layer)


def _explain(model: nn.Module, inputs: Any, target: Any, query: Any, embedding_layer: nn.Module | str | None) -> Explanation:
    if isinstance(query, dict):
        raise ValueError(f"method={METHOD!r} explains one token set; query={{set: ...}} is for models with several")
    floats: list[bool] = []

    def note(t: Tensor) -> Tensor:
        floats.append(t.is_floating_point())
        return t

    map_tensors(inputs, note)
    # Float inputs (pixels) are the leaves: a tensor carries relevance when it depends on them. Token ids are
    # not: the word embedding's output is, then.
    leaf = False if any(floats) else embedding_layer
    with explaining(model, inputs, float_leaves=True) as (args, kwargs):
        capture = TransformerAttributionCapture(model, embedding_layer=leaf)
        with capture:
            output = capture.forward(*args, **kwargs)
        if not capture.probs:
            raise ValueError(f"method={METHOD!r} found no attention (softmax -> matmul with values, SDPA or "
                             f"nn.MultiheadAttention) depending on the inputs of {type(model).__name__}")
        probs = [as_heads(p) for p in capture.probs]
        batch, num_tokens = probs[0].shape[0], probs[0].shape[-1]
        other = next((i for i, p in enumerate(probs) if p.shape[-2:] != (num_tokens, num_tokens)), None)
        if other is not None:
            raise ValueError(
                f"method={METHOD!r} explains one token set, one sequence's self-attention over {num_tokens} tokens; "
                f"attention at {capture.paths[other] or '<model>'!r} reads {probs[other].shape[-2]} queries over "
                f"{probs[other].shape[-1]} keys (a cross-attention or a second token set). Use method='gae' for "
                "encoder-decoders, two towers and co-attention (docs/troubleshooting.md#lrp-several-token-sets)")
        logits = model_logits(output)
        keep = keep_mask(kwargs, batch, num_tokens, args)
        keep = torch.ones(batch, num_tokens, dtype=torch.bool, device=probs[0].device) if keep is None else keep.to(probs[0].device)
        query_index = readout_query(0 if query is None else query, batch, num_tokens, keep, probs[0].device)
        score, target_index = target_scores(output, logits, target, query_index, batch)
        if not score.requires_grad:
            raise ValueError("the explained score does not depend on the attention (no gradient path); check target")
        # Where the passes' gradients are asked for: the probabilities written out, a fused attention's q, k, v
        # (it reduces its own to Ā in the plain pass).
        targets = [t for i, p in enumerate(capture.probs) for t in (capture.layers[i].inputs if i in capture.layers else (p,))]
        if 0 in capture.layers:
            capture.layers[0].deepest = True  # the first attention: nothing below it is asked for
        found = []
        # The authors' one-hot relevance at the score: gradient 1/score in gradient form; plain: gradient 1.
        for plain, seed in ((False, safe_divide(torch.ones_like(score), score.detach())), (True, torch.ones_like(score))):
            capture.plain = plain
            if plain:
                gather_again(fsdp1_units(model))  # FSDP1 resharded its units at the end of the first pass
            grads = iter(torch.autograd.grad(score, targets, grad_outputs=seed, allow_unused=True, retain_graph=not plain))
            per_layer: list[Tensor | None] = []
            for i in range(len(capture.probs)):
                if i in capture.layers:
                    for _ in capture.layers[i].inputs:
                        next(grads)  # (q, k, v's gradients: not needed)
                    per_layer.append(None)
                else:
                    per_layer.append(next(grads))
            found.append(per_layer)
        lrp_grads, plain_grads = found
        with torch.no_grad():
            abars = []
            for i, (p, r, g) in enumerate(zip(probs, lrp_grads, plain_grads)):
                if i in capture.layers:
                    abar = capture.layers[i].abar
                    abars.append(torch.zeros(p.shape[0], *p.shape[-2:], dtype=p.dtype, device=p.device) if abar is None else abar)
                else:
                    zero = torch.zeros_like(p)
                    abars.append(_abar(p.detach(), zero if r is None else as_heads(r), zero if g is None else as_heads(g)))
            row = _rolled_out(abars, start_rows(query_index, num_tokens))
            tokens = hide_own(row, query_index).masked_fill(~keep, 0.0).to(torch.float32)
    return Explanation(tokens=tokens, logits=None if logits is None else logits.detach(), target=target_index,
                       score=score.detach(), method=METHOD, layers=capture.paths,
                       query=None if query_index.is_floating_point() else query_index, relevance={"tokens": tokens})
