"""AttnLRP (Achtibat et al., ICML 2024) on unmodified models, in gradient form.

While :class:`LRPCapture` is active, the operations of a model's forward are swapped, through the
same ``TorchFunctionMode`` mechanism as :mod:`lightning_gae.engine.capture`, for ones whose backward pass
propagates relevance: the relevance of a tensor ``x`` is ``x * grad(x)`` where ``grad`` is the
modified gradient of the explained score. The choices are LXT's (the reference implementation,
``lxt.efficient``, v2.1):

* linear maps (``F.linear``, convolutions, ``addmm``, products with a constant or a weight,
  batch norm with running statistics) and sums (residuals, biases): the plain gradient, i.e.
  epsilon-LRP with epsilon = 0, the biases absorbing their share (``lxt/efficient/patches.py``
  has no patch for ``nn.Linear``);
* LayerNorm and RMSNorm: the standard deviation held constant (detached), the gradient still
  flowing through the mean (``layer_norm_forward`` / ``rms_norm_forward``). A hand-written norm is
  covered by holding every ``sqrt`` / ``rsqrt`` / ``std`` of a relevance-carrying tensor constant;
* elementwise activations: the identity rule, ``grad_in = f(x) / x * grad_out``
  (``identity_rule_implicit``); an activation *module* (``nn.GELU``, Hugging Face's
  ``transformers.activations`` classes...) is one unit whatever it computes inside;
* a product of two relevance-carrying tensors (``Q Kᵀ``, ``A V``, the gated MLP's ``act(g) * u``):
  the uniform rule, half of the gradient to each side (``divide_gradient(., 2)`` after the
  product). Attention thus sends a quarter of the gradient to ``q`` and to ``k`` and half to ``v``
  (LXT's ``wrap_attention_forward``: ``divide_gradient(query, 4)``, ``(key, 4)``, ``(value, 2)``),
  applied to ``q``/``k`` after RoPE and before grouped key/value heads are repeated;
* softmax: its plain gradient (LXT applies no rule to it); scaling by constants, shape ops,
  dropout (eval mode) and dtype casts: unchanged.

Fused attention (``F.scaled_dot_product_attention``, ``F.multi_head_attention_forward``) gets the rule on its
inputs; past it, its plain gradient: SDPA runs as itself in float32/64 with no all-masked query (nothing
``N x N`` kept), else it and ``nn.MultiheadAttention`` are computed explicitly as in :mod:`lightning_gae.engine.capture`.

Which tensors carry relevance: the forward runs with the model's parameters detached
(``torch.func.functional_call``) and the word-embedding output made a leaf, so a tensor requires
grad exactly when it depends on the explained tokens. An operation with no rule whose output
carries relevance is let through in the forward but its backward raises :class:`UnsupportedOperation`
naming the operation and the module it ran in: it fires only when the operation lies on the path
from the inputs to the explained score (a norm's variance that is then held constant never does).
In-place operations without a rule raise at once. Outside the ``with`` block nothing is patched
or hooked, also when the forward raises.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode, resolve_name

from lightning_gae.lrp.fsdp1 import constant_gathered, fsdp1_units, managed_parameters
from lightning_gae.lrp.fsdp2 import constant_parameters, fsdp2_units, unit_parameters
from lightning_gae.lrp._ops import fused_applies, unbind
from lightning_gae.engine.attention import (
    MHA_SIGNATURE,
    SDPA_ARGS,
    explicit_multi_head_attention_forward,
    explicit_scaled_dot_product_attention,
    run_eagerly,
)

__all__ = ["LRPCapture", "RuleMode", "UnsupportedOperation", "identity_rule", "on_gradient", "scale_gradient", "word_embedding"]


class UnsupportedOperation(ValueError):
    """An operation on the path from the inputs to the explained score has no AttnLRP rule."""


# ---------------------------------------------------------------------------------------------
# Autograd functions: forward as the model's, backward with the rule.


class _OnGradient(torch.autograd.Function):
    """Identity forward; the backward returns ``rule(grad)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, rule: Callable[[Tensor], Tensor]) -> Tensor:
        ctx.rule = rule
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.rule(grad), None


class _IdentityRule(torch.autograd.Function):
    """``y = f(x)`` in the forward (``y`` given, detached); ``grad_x = y / x * grad_y`` (0 where ``x`` is 0),
    so ``x * grad_x = y * grad_y``. ``y`` itself is the output (``mark_dirty``: the op's own graph is
    never run backward, so its version count does not matter), unless it shares ``x``'s memory."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor) -> Tensor:
        ratio = y / x
        if not torch.isfinite(ratio.sum()):
            ratio.masked_fill_(x == 0, 0.0)
        ctx.save_for_backward(ratio)
        if y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            return y.clone()
        ctx.mark_dirty(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return (ratio * grad).to(grad.dtype), None


def on_gradient(x: Tensor, rule: Callable[[Tensor], Tensor]) -> Tensor:
    """``x`` as it is in the forward; in the backward, the gradient that reaches ``x`` becomes ``rule(grad)``
    (a rule's share of it, a choice made when the backward runs, or a refusal that raises)."""
    return _OnGradient.apply(x, rule)


def _no_rule(message: str) -> Callable[[Tensor], Tensor]:
    """The backward of an operation without a rule: it raises once the operation lies on the explained path."""
    def refuse(grad: Tensor) -> Tensor:
        raise UnsupportedOperation(message)
    return refuse


def _half(grad: Tensor) -> Tensor:
    return grad * 0.5


def identity_rule(x: Tensor, y: Tensor) -> Tensor:
    return _IdentityRule.apply(x, y.detach())


def scale_gradient(x: Tensor, factor: float) -> Tensor:
    return on_gradient(x, lambda grad: grad * factor) if isinstance(x, Tensor) and x.requires_grad else x


# ---------------------------------------------------------------------------------------------
# Which operation is which.

# Linear in every relevance-carrying operand, shape ops and casts: the plain gradient is the rule.
LINEAR_OPS = {
    "add", "sub", "neg", "sum", "mean", "cumsum", "embedding", "softmax",
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
    "contiguous", "clone", "to", "type", "type_as", "float", "half", "bfloat16", "double", "cpu", "cuda",
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose",
    "swapaxes", "swapdims", "t", "T", "mT", "permute", "movedim", "moveaxis", "expand", "expand_as", "repeat",
    "repeat_interleave", "tile", "narrow", "select", "getitem", "setitem", "index_select", "gather",
    "take_along_dim", "split", "split_with_sizes", "chunk", "tensor_split", "unbind", "cat", "concat",
    "concatenate", "stack", "hstack", "vstack", "roll", "flip", "pad", "masked_fill", "tril", "triu", "where",
    "unfold", "diagonal",
}
# Products: linear when one operand carries relevance, the uniform rule when two do.
PRODUCT_OPS = {"mul", "matmul", "bmm", "mm", "einsum"}
# Linear in each operand, but bilinear when the input and the weight both carry relevance (no rule then):
# the positions of the multiplied operands.
WEIGHTED_OPS = {"linear": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2), "conv1d": (0, 1),
             "conv2d": (0, 1), "conv3d": (0, 1), "conv_transpose1d": (0, 1), "conv_transpose2d": (0, 1),
             "conv_transpose3d": (0, 1), "bilinear": (0, 1)}
# Elementwise activations: the identity rule.
ACTIVATION_OPS = {
    "gelu", "silu", "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "mish", "softplus", "hardswish",
    "hardsigmoid", "hardtanh", "tanh", "sigmoid",
}
# A norm's standard deviation (or its inverse): held constant.
_NORM_STATISTICS = {"sqrt", "rsqrt", "std"}
_DUNDER = {
    "__add__": "add", "__radd__": "add", "__iadd__": "add_", "__sub__": "sub", "__rsub__": "sub",
    "__isub__": "sub_", "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_", "__truediv__": "div",
    "__itruediv__": "div_", "__rtruediv__": "rdiv", "__matmul__": "matmul", "__rmatmul__": "matmul",
    "__neg__": "neg", "__getitem__": "getitem", "__setitem__": "setitem", "__pow__": "pow", "__rpow__": "rpow",
}
_ACTIVATION_MODULES_EXCLUDED = (nn.Softmax, nn.Softmin, nn.LogSoftmax, nn.Softmax2d, nn.MultiheadAttention, nn.GLU)


def _resolved(func: Callable) -> str | None:
    """``torch.overrides.resolve_name``, once per function: it resets Python's warning filters on every call
    (so once-shown warnings would show again) and it runs for every operation of an LRP forward."""
    try:
        return _RESOLVED[func]
    except KeyError:
        name = _RESOLVED[func] = resolve_name(func)
        return name
    except TypeError:  # an unhashable callable
        return resolve_name(func)


_RESOLVED: dict[Callable, str | None] = {}


def op_name(func: Callable) -> str:
    full = _resolved(func) or getattr(func, "__name__", None) or repr(func)
    parts = full.split(".")
    name = parts[-2] if parts[-1] == "__get__" and len(parts) > 1 else parts[-1]
    name = _DUNDER.get(name, name)
    if name in ("true_divide", "divide"):
        name = "div"
    return name


def _full_name(func: Callable) -> str:
    return _resolved(func) or getattr(func, "__qualname__", None) or repr(func)


def flat_tensors(args: Sequence[Any], kwargs: dict) -> list[Tensor]:
    found = []
    for a in [*args, *kwargs.values()]:
        if isinstance(a, Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(t for t in a if isinstance(t, Tensor))
    return found


def carries_relevance(t: Any) -> TypeGuard[Tensor]:
    return isinstance(t, Tensor) and t.requires_grad


def _is_activation_module(module: nn.Module) -> bool:
    if isinstance(module, _ACTIVATION_MODULES_EXCLUDED):
        return False
    cls = type(module)
    return cls.__module__ in ("torch.nn.modules.activation", "transformers.activations")


def _layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
                bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """LXT's ``layer_norm_forward``: ``(x - mean) / std`` with ``std`` detached."""
    dims = tuple(range(-len(normalized_shape), 0))
    mean = input.mean(dim=dims, keepdim=True)
    var = ((input - mean) ** 2).mean(dim=dims, keepdim=True)
    y = (input - mean) / (var + eps).sqrt().detach()
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
              eps: float | None = None) -> Tensor:
    """LXT's ``rms_norm_forward``: ``x * rsqrt(mean(x²) + eps)`` with the factor detached."""
    dims = tuple(range(-len(normalized_shape), 0))
    eps = torch.finfo(input.dtype).eps if eps is None else eps
    y = input * torch.rsqrt(input.pow(2).mean(dim=dims, keepdim=True) + eps).detach()
    return y if weight is None else y * weight


_LN_SIGNATURE = inspect.signature(F.layer_norm)
_RMS_SIGNATURE = inspect.signature(F.rms_norm)


class RuleMode(TorchFunctionMode):
    """A rule set's mode over one capture: what every rule set does with an operation it has no rule for
    (:meth:`no_rule`, :meth:`refuse`), naming its own ``supported`` operations; its ``__torch_function__`` applies
    the rules."""

    supported = ""

    def __init__(self, capture: LRPCapture) -> None:
        super().__init__()
        self.capture = capture

    def no_rule(self, func: Callable, out: Any) -> Any:
        where = self.capture.current_path or "<model>"
        module = self.capture.current_type
        message = (
            f"method={self.capture.method!r} has no relevance rule for {_full_name(func)} (in module {where!r}"
            f"{f', {module}' if module else ''}), which lies on the path from the inputs to the explained score; "
            "its plain gradient would give a silently wrong map. Supported: " + self.supported
        )
        if isinstance(out, Tensor):
            return on_gradient(out, _no_rule(message)) if out.requires_grad else out
        if isinstance(out, (tuple, list)):
            return type(out)(on_gradient(t, _no_rule(message)) if carries_relevance(t) else t for t in out)
        return out

    def refuse(self, func: Callable, inplace: bool, args: tuple, kwargs: dict) -> Any:
        if inplace:
            where = self.capture.current_path or "<model>"
            module = self.capture.current_type
            raise UnsupportedOperation(
                f"method={self.capture.method!r} has no relevance rule for the in-place {_full_name(func)} on a relevance-carrying "
                f"tensor (in module {where!r}{f', {module}' if module else ''}); an in-place operation cannot be given "
                "one afterwards (lightning_gae.lrp)"
            )
        return self.no_rule(func, func(*args, **kwargs))


class LRPMode(RuleMode):
    """Swaps each operation of the forward for its AttnLRP form (see the module docstring)."""

    supported = ("linear maps, sums, LayerNorm/RMSNorm, elementwise activations, products (uniform rule), softmax, "
                 "attention (SDPA, nn.MultiheadAttention, softmax -> matmul) and shape ops (lightning_gae.lrp).")

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.capture.in_unit:
            # Inside an activation module: its output is replaced by the identity rule as one unit.
            return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            return self._sdpa(args, kwargs)
        if func is F.multi_head_attention_forward:
            return self._mha(args, kwargs)
        live = [t for t in flat_tensors(args, kwargs) if t.requires_grad]
        if not live:
            return func(*args, **kwargs)
        name = op_name(func)
        inplace = name.endswith("_") and not name.startswith("_")
        base = name[:-1] if inplace else name
        if base in ACTIVATION_OPS and (kwargs.get("inplace") is True or any(a is True for a in args[1:])):
            inplace = True  # F.relu(x, inplace=True): x's own value is gone before a rule could use it
        if func is F.layer_norm:
            b = _LN_SIGNATURE.bind(*args, **kwargs)
            return _layer_norm(**b.arguments)
        if func is F.rms_norm:
            b = _RMS_SIGNATURE.bind(*args, **kwargs)
            return _rms_norm(**b.arguments)
        if base in _NORM_STATISTICS and not inplace:
            return func(*args, **kwargs).detach()
        if base in ACTIVATION_OPS and not inplace:
            x = args[0] if args else kwargs.get("input")
            out = func(*args, **kwargs)
            return identity_rule(x, out) if carries_relevance(x) else out
        if base in PRODUCT_OPS or base == "div":
            operands = self.product_operands(base, args, kwargs)
            carrying = sum(carries_relevance(t) for t in operands)
            if base == "div":
                divisor = args[1] if len(args) > 1 else kwargs.get("other")
                if carries_relevance(divisor):
                    return self.refuse(func, inplace, args, kwargs)
                return func(*args, **kwargs)
            if carrying <= 1:
                return func(*args, **kwargs)
            if inplace or carrying > 2:
                return self.refuse(func, inplace, args, kwargs)
            out = func(*args, **kwargs)
            self.capture._note_product(func, out)
            return on_gradient(out, _half)
        if base in WEIGHTED_OPS:
            multiplied = [args[i] for i in WEIGHTED_OPS[base] if i < len(args)]
            if base == "bilinear" or sum(carries_relevance(t) for t in multiplied) > 1:
                return self.refuse(func, inplace, args, kwargs)
            return func(*args, **kwargs)
        if base == "batch_norm":
            training = kwargs.get("training", args[5] if len(args) > 5 else False)
            # With running statistics (eval mode) it is an affine map per channel.
            return self.refuse(func, inplace, args, kwargs) if training else func(*args, **kwargs)
        if base == "unbind" and not inplace and carries_relevance(args[0] if args else kwargs.get("input")):
            return unbind(args, kwargs)
        if base in LINEAR_OPS or name in ("detach", "requires_grad_"):
            return func(*args, **kwargs)
        return self.refuse(func, inplace, args, kwargs)

    @staticmethod
    def product_operands(base: str, args: tuple, kwargs: dict) -> list[Any]:
        if base == "einsum":
            rest = list(args[1:])
            return list(rest[0]) if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest
        lhs = args[0] if args else kwargs.get("input")
        rhs = args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
        return [lhs, rhs]

    def _sdpa(self, args: tuple, kwargs: dict) -> Tensor:
        p = dict(zip(SDPA_ARGS, args))
        p.update(kwargs)
        if not any(carries_relevance(p.get(n)) for n in ("query", "key", "value")):
            return F.scaled_dot_product_attention(*args, **kwargs)
        # LXT's wrap_attention_forward: a quarter of the gradient to q and to k, half to v.
        p["query"], p["key"], p["value"] = (scale_gradient(p[n], f) for n, f in (("query", 0.25), ("key", 0.25), ("value", 0.5)))
        self.capture._note_attention("sdpa", p["key"].shape[-2])
        if fused_applies(p):
            # Past the split the rule is the fused op's own backward (dropout left out, as explicitly).
            return F.scaled_dot_product_attention(**{**p, "dropout_p": 0.0})
        out, _ = explicit_scaled_dot_product_attention(**p)
        return out.to(p["value"].dtype)

    def _mha(self, args: tuple, kwargs: dict) -> Any:
        b = MHA_SIGNATURE.bind(*args, **kwargs)
        if not any(carries_relevance(b.arguments.get(n)) for n in ("query", "key", "value")):
            return F.multi_head_attention_forward(*args, **kwargs)
        # The projections are linear, so splitting the gradient of their inputs splits that of q, k, v.
        for n, f in (("query", 0.25), ("key", 0.25), ("value", 0.5)):
            b.arguments[n] = scale_gradient(b.arguments[n], f)
        self.capture._note_attention("mha", b.arguments["key"].shape[0])
        result, _ = explicit_multi_head_attention_forward(*b.args, **b.kwargs)
        return result


def word_embedding(model: nn.Module, embedding_layer: nn.Module | str | None = None) -> nn.Module:
    """The word embedding: ``embedding_layer`` (a module or a module path) or the Hugging Face
    ``get_input_embeddings()`` of the model or its first submodule that has one."""
    if isinstance(embedding_layer, str):
        try:
            return model.get_submodule(embedding_layer)
        except AttributeError as err:
            raise ValueError(f"embedding_layer={embedding_layer!r} is no module of {type(model).__name__}") from err
    if isinstance(embedding_layer, nn.Module):
        if not any(m is embedding_layer for m in model.modules()):
            raise ValueError(f"embedding_layer ({type(embedding_layer).__name__}) is not a module of {type(model).__name__}")
        return embedding_layer
    if embedding_layer is not None:
        raise ValueError(f"embedding_layer must be a module or a module path, got {type(embedding_layer).__name__}")
    # Hugging Face models say where their token embeddings are, also inside a LightningModule or a wrapper.
    for module in model.modules():
        getter = getattr(module, "get_input_embeddings", None)
        if not callable(getter):
            continue
        try:
            found = getter()
        except (NotImplementedError, AttributeError):
            continue
        if isinstance(found, nn.Module):
            return found
    raise ValueError(
        f"relevance is read at the word embeddings, and neither {type(model).__name__} nor a submodule has a Hugging "
        "Face get_input_embeddings(): pass embedding_layer= (the module, or its path such as 'embed.tokens') whose "
        "output is one vector per token"
    )


class LRPCapture:
    """Context manager: the forward of ``model`` inside it computes AttnLRP relevance in its backward.

    ``model`` must be called as ``capture.forward(*args, **kwargs)`` (the parameters are detached for
    the call, the model itself is untouched). After the forward, ``capture.embeddings`` is the word
    embedding's output (``[B, N, D]``, a leaf that requires grad) and ``capture.attention`` lists the
    module paths where attention ran with the AttnLRP rule.
    """

    method = "attnlrp"
    mode_class: type[RuleMode] = LRPMode

    def __init__(self, model: nn.Module, embedding_layer: nn.Module | str | None | bool = None) -> None:
        self.model = model
        # embedding_layer=False: no word-embedding leaf (the caller makes its float inputs require grad).
        # (True is no value a caller passes: the flag means only False.)
        self.embedding = None if embedding_layer is False else word_embedding(model, embedding_layer)  # type: ignore[arg-type]
        self._names = {m: n for n, m in model.named_modules(remove_duplicate=False)}
        self._stack: list[nn.Module] = []
        self._units = 0
        self._suspended = 0  # > 0 while an FSDP1 unit's own code runs: all let through (lightning_gae.lrp.fsdp1)
        self._unit_input: Tensor | None = None
        self._exit: ExitStack | None = None
        self.embeddings: list[Tensor] = []
        self.attention: list[str] = []
        self.num_tokens: int | None = None
        self.from_ids = False  # the embedding read token ids: its tokens are the explained ones (no prefix)

    @property
    def current_path(self) -> str:
        for module in reversed(self._stack):
            name = self._names.get(module)
            if name is not None:
                return name
        return ""

    @property
    def current_type(self) -> str:
        return type(self._stack[-1]).__name__ if self._stack else ""

    @property
    def in_unit(self) -> bool:
        """Whether an activation module (one unit under the identity rule) or an FSDP1 unit's own code is running:
        the modes then let every operation through without a rule."""
        return self._units > 0 or self._suspended > 0

    def _note_attention(self, kind: str, keys: int) -> None:
        # One entry per run of consecutive calls in a module (Q·Kᵀ and A·V of one eager attention are one).
        path = self.current_path
        if not self.attention or self.attention[-1] != path:
            self.attention.append(path)
            if self.num_tokens is None:
                self.num_tokens = int(keys)

    def _note_product(self, func: Callable, out: Tensor) -> None:
        # The first product of two relevance-carrying tensors in an attention module is Q·Kᵀ: [..., N, N].
        if op_name(func) in ("matmul", "bmm", "einsum", "baddbmm"):
            self._note_attention("matmul", out.shape[-1])

    def _push(self, module: nn.Module, args: Any) -> Any:
        self._stack.append(module)
        if self._units:
            self._units += 1
        elif _is_activation_module(module) and args and carries_relevance(args[0]):
            self._units = 1
            self._unit_input = args[0]
            if getattr(module, "inplace", False) is True:
                # nn.ReLU(inplace=True) would overwrite the input the identity rule divides by.
                return (args[0].clone(), *args[1:])
        return None

    def _pop(self, module: nn.Module, args: Any, output: Any) -> Any:
        if self._stack:
            self._stack.pop()
        if self._units:
            self._units -= 1
            x, self._unit_input = (self._unit_input, None) if self._units == 0 else (None, self._unit_input)
            if x is not None and isinstance(output, Tensor) and output.shape == x.shape:
                return self.unit_rule(x, output)
        return None

    def unit_rule(self, x: Tensor, output: Tensor) -> Tensor:
        """What replaces an activation module's output (its input ``x``): the identity rule."""
        return identity_rule(x, output)

    def _leaf(self, module: nn.Module, args: Any, output: Any) -> Tensor:
        if not isinstance(output, Tensor) or not output.is_floating_point():
            raise ValueError(f"the word embedding ({type(module).__name__}) returned {type(output).__name__}, not a float tensor")
        leaf = output.detach().requires_grad_(True)
        self.embeddings.append(leaf)
        self.from_ids = bool(args) and isinstance(args[0], Tensor) and not args[0].is_floating_point()
        return leaf

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        # The attribute paths functional_call swaps at, walked by nn.Module's own traversal: a wrapper that
        # reports its model's module names (the Captum classes' forward_func) keeps its real paths here.
        # FSDP2 units gather their own parameters in the forward: they are held constant there (lightning_gae.lrp.fsdp2).
        # FSDP1 units likewise, and the mode lets their own gathering through (lightning_gae.lrp.fsdp1).
        units, fsdp1 = fsdp2_units(self.model), fsdp1_units(self.model)
        params: dict[str, Tensor] = {}
        seen: set[int] = unit_parameters(units) | managed_parameters(fsdp1)
        for prefix, module in nn.Module.named_modules(self.model):
            for name, param in module.named_parameters(recurse=False):
                if id(param) not in seen:
                    seen.add(id(param))
                    params[f"{prefix}.{name}" if prefix else name] = param.detach()
        with constant_parameters(units), constant_gathered(self, fsdp1):
            return torch.func.functional_call(self.model, params, args, kwargs, strict=False)

    def __enter__(self) -> LRPCapture:
        self.embeddings, self.attention, self._stack, self._units, self.num_tokens = [], [], [], 0, None
        self.from_ids = False
        with ExitStack() as stack:
            run_eagerly(stack, self.model)
            if self.embedding is not None:
                stack.enter_context(self.embedding.register_forward_hook(self._leaf))
            stack.enter_context(nn.modules.module.register_module_forward_pre_hook(self._push))
            stack.enter_context(nn.modules.module.register_module_forward_hook(self._pop, always_call=True))
            # LRPMode or a rule set's own mode, on this capture.
            stack.enter_context(self.mode_class(self))
            self._exit = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        exit_stack, self._exit = self._exit, None
        self._stack, self._units, self._unit_input = [], 0, None
        if exit_stack is not None:
            exit_stack.close()
