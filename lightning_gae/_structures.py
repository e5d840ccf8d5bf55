"""Batch plumbing every layer shares: walking nested inputs, calling a model, reading its logits, picking rows.

Inputs are whatever a model takes: a tensor (``model(x)``), a tuple (``model(*x)``) or a mapping of
keyword arguments (``model(**x)``, Hugging Face style), possibly nested; a dataclass instance is walked
through its fields (as Lightning moves such a batch to the device) and rebuilt with the same class.
Everything here works on that shape without knowing the model. No other module of the package is imported: every layer
builds on this one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Union

import torch
from torch import Tensor, nn

ClassTarget = Union[None, int, Sequence[int], Tensor]
"""A class to explain or score: None (the prediction), one int, or one class per sample."""
Target = Union[ClassTarget, Callable[[Any], Tensor]]
"""A :data:`ClassTarget`, or a callable ``output -> Tensor[B]`` (any scalar per sample)."""

# The tensor a person looks at among keyword inputs, in order of preference.
_DISPLAY_KEYS = ("pixel_values", "input_ids", "x")


def model_logits(output: Any) -> Tensor | None:
    """The logits of a model output: a tensor, a mapping or object with ``logits``, or a tuple's first tensor (its
    second when the first is a 0-dim loss, as Hugging Face models return ``(loss, logits, ...)`` without a dict)."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        return output["logits"]
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        # Hugging Face with return_dict=False and labels returns (loss, logits, ...): a 0-dim loss is no logits.
        if output[0].dim() == 0 and len(output) > 1 and isinstance(output[1], Tensor) and output[1].dim() > 0:
            return output[1]
        return output[0]
    return None


def batch_fields(x: Any) -> dict[str, Any] | None:
    """The fields of a dataclass instance set by its ``__init__``, by name (the values themselves); None for
    anything else, and for a dataclass that is also a mapping (Hugging Face's ``ModelOutput``), read by its keys."""
    if not dataclasses.is_dataclass(x) or isinstance(x, (type, Mapping)):
        return None
    return {f.name: getattr(x, f.name) for f in dataclasses.fields(x) if f.init}


def with_fields(x: Any, values: Mapping[str, Any]) -> Any:
    """A mapping or dataclass instance ``x`` with the entries ``values`` replaced, the rest and the type kept.

    A dataclass is rebuilt through its ``__init__`` (``dataclasses.replace``), so a frozen one works too.
    """
    if batch_fields(x) is not None:
        return dataclasses.replace(x, **values)
    return {**x, **values}


def map_tensors(x: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``fn`` applied to every tensor of a nested tuple/list/namedtuple/mapping/dataclass, the structure kept."""
    if isinstance(x, Tensor):
        return fn(x)
    fields = batch_fields(x)
    if fields is not None:
        return with_fields(x, {k: map_tensors(v, fn) for k, v in fields.items()})
    if isinstance(x, Mapping):
        return {k: map_tensors(v, fn) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        items = [map_tensors(v, fn) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` for the block; afterwards every module gets back its own flag (not just the root's)."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training


def call_args(inputs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of ``model(*args, **kwargs)`` for a tensor, a tuple or a mapping of inputs."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, tuple):
        return inputs, {}
    return (inputs,), {}


def forward_logits(forward_fn: Callable[..., Any], inputs: Any) -> Tensor:
    """Float class logits ``[B, C]`` of ``forward_fn`` on ``inputs``; anything else raises with what was returned."""
    args, kwargs = call_args(inputs)
    logits = model_logits(forward_fn(*args, **kwargs))
    if logits is None or logits.dim() != 2:
        shape = None if logits is None else tuple(logits.shape)
        raise ValueError(f"forward_fn must return class logits [B, C] (a tensor, a tuple or .logits); got {shape}")
    return logits.float()


def select_rows(inputs: Any, index: Tensor, batch: int) -> Any:
    """The samples ``index`` of every tensor whose dim 0 is the batch (``batch`` samples); other tensors as they are."""
    return map_tensors(inputs, lambda t: t[index.to(t.device)] if t.dim() and t.shape[0] == batch else t)


def take(inputs: Any, start: int, stop: int, batch: int) -> Any:
    """Samples ``start:stop`` of every tensor whose dim 0 is the batch (``batch`` samples)."""
    return map_tensors(inputs, lambda t: t[start:stop] if t.dim() and t.shape[0] == batch else t)


def first_tensor(inputs: Any) -> Tensor:
    """The first tensor of nested inputs (its dim 0 is the batch)."""
    found: list[Tensor] = []

    def keep(t: Tensor) -> Tensor:
        found.append(t)
        return t

    map_tensors(inputs, keep)
    if not found:
        raise TypeError(f"inputs hold no tensor; got {type(inputs).__name__}")
    return found[0]


def display_input(inputs: Any) -> Tensor:
    """The tensor a person looks at: images (``pixel_values``), token ids (``input_ids``) or features, among the
    keys of a mapping or the fields of a dataclass; inside a tuple, its first item's (``(batch,)`` for a module
    whose forward takes the batch itself)."""
    inputs = _as_mapping(inputs)
    if isinstance(inputs, Mapping):
        for key in _DISPLAY_KEYS:
            if key in inputs:
                return inputs[key]
        return next(v for v in inputs.values() if isinstance(v, Tensor))
    if isinstance(inputs, (tuple, list)):
        return display_input(inputs[0])
    return inputs


def input_tensor(inputs: Any) -> Any:
    """``inputs`` itself when it is a tensor, else its :func:`display_input`; inputs that hold none come back as they are."""
    if isinstance(inputs, Tensor):
        return inputs
    try:
        return display_input(inputs)
    except (StopIteration, IndexError, KeyError):
        return inputs


def _as_mapping(inputs: Any) -> Any:
    """A dataclass instance as the mapping of its fields; anything else as it is."""
    fields = batch_fields(inputs)
    return inputs if fields is None else fields


def keyword_inputs(inputs: Any) -> Mapping[str, Any] | None:
    """The mapping of keyword inputs (``model(**inputs)``), also inside a one-item tuple (``model(batch)``); a
    dataclass batch's fields by name (the batch's own tensors, so :func:`replace_input` finds them); else None."""
    if isinstance(inputs, (tuple, list)) and len(inputs) == 1:
        inputs = inputs[0]
    inputs = _as_mapping(inputs)
    return inputs if isinstance(inputs, Mapping) else None


def replace_input(inputs: Any, old: Tensor, new: Tensor) -> Any:
    """``inputs`` with the tensor ``old`` (that very object, wherever it sits) replaced by ``new``, the structure kept."""
    return map_tensors(inputs, lambda t: new if t is old else t)


def concat(parts: list[Any]) -> Any:
    """Concatenate per-batch structures along dim 0, right-padding sequences of unequal length with 0."""
    first = parts[0]
    if isinstance(first, Tensor):
        if first.dim() >= 2 and len({p.shape[1:] for p in parts}) > 1:
            length = max(p.shape[1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, 0) * (p.dim() - 2) + (0, length - p.shape[1])) for p in parts]
        return torch.cat(parts)
    fields = batch_fields(first)
    if fields is not None:
        return with_fields(first, {k: concat([getattr(p, k) for p in parts]) for k in fields})
    if isinstance(first, Mapping):
        return {k: concat([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(concat(list(group)) for group in zip(*parts))
    return first


def nonfinite_inputs(inputs: Any) -> dict[str, int]:
    """Where nested inputs hold NaN or inf: ``{"input", "input[1]", "input['pixel_values']", ...: count}``, floats only."""
    found: dict[str, int] = {}

    def walk(x: Any, where: str) -> None:
        fields = batch_fields(x)
        if fields is not None:
            for name, value in fields.items():
                walk(value, f"{where}.{name}")
        elif isinstance(x, Tensor):
            if x.is_floating_point() or x.is_complex():
                count = int((~torch.isfinite(x)).sum())
                if count:
                    found[where] = count
        elif isinstance(x, Mapping):
            for key, value in x.items():
                walk(value, f"{where}[{key!r}]")
        elif isinstance(x, (tuple, list)):
            for i, value in enumerate(x):
                walk(value, f"{where}[{i}]")

    walk(inputs, "inputs")
    return found


def class_index(target: ClassTarget, batch: int, device: torch.device, num_classes: int | None = None) -> Tensor:
    """``[B]`` class indices from an int or one class per sample (list or tensor)."""
    index = torch.as_tensor(target, device=device).long().reshape(-1)
    if index.numel() == 1:
        index = index.expand(batch)
    out_of_range = num_classes is not None and bool(((index < 0) | (index >= num_classes)).any())
    if index.shape != (batch,) or out_of_range:
        classes = "" if num_classes is None else f" in [0, {num_classes})"
        raise ValueError(f"target must be None, an int or one class per sample{classes} for {batch} samples; "
                         f"got {index.tolist()}")
    return index
