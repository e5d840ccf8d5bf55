"""How the tracked samples meet the module's ``forward`` when no ``BatchOptions(inputs=...)`` reader is given.

A mapping batch is called as ``module(**inputs)`` when the forward takes its keys by name (a Hugging Face batch less
its labels); keys the forward does not take (an index, file names) are left out; a forward that takes the batch
itself (``forward(self, batch)``) is called as ``module(inputs)``. A dataclass batch is read the same way through its
fields (labels and ground truth left out), except that a forward taking the batch itself gets the dataclass whole, as
its training step does. Where the forward's signature cannot tell, the run stops at its start with a reader that
works when passed, built from the batch's keys (or fields) and the forward's parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from lightning_gae._structures import batch_fields
from lightning_gae.callbacks.samples import default_batch_inputs

__all__ = ["LayoutUnclear", "fit_to_forward", "forward_hint"]

# A forward's only parameter by one of these names (or annotated as a mapping) takes the batch itself.
_BATCH_NAMES = ("batch", "inputs", "sample", "samples", "data")


class LayoutUnclear(ValueError):
    """The forward's signature cannot tell how to pass the batches (the message names readers that work when passed):
    the command catches it to put that advice as its own ``--inputs``."""


def _forward_parameters(module: nn.Module) -> list[inspect.Parameter] | None:
    """The forward's parameters (``self`` left out), or None when its signature cannot be read."""
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None


def _takes_dataclass(parameter: inspect.Parameter, kind: type) -> bool:
    annotation = parameter.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return parameter.name in _BATCH_NAMES or annotation is kind or kind.__name__ in str(text).split(".")[-1:]


def _takes_mapping(parameter: inspect.Parameter) -> bool:
    annotation = parameter.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return parameter.name in _BATCH_NAMES or any(word in str(text) for word in ("dict", "Dict", "Mapping"))


def _named(parameters: list[inspect.Parameter]) -> list[inspect.Parameter]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p for p in parameters if p.kind in kinds]


def _required(parameters: list[inspect.Parameter]) -> list[str]:
    return [p.name for p in parameters if p.default is inspect.Parameter.empty and p.kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]


def fit_to_forward(module: nn.Module, inputs: Any) -> Any:
    """``inputs`` (read by the default reader) laid out as ``module``'s forward takes them.

    Returns:
        ``inputs`` unchanged (a tensor, a tuple, or a mapping whose keys the forward takes, or a forward with
        ``**kwargs``); a mapping without the keys the forward does not take; ``(inputs,)`` for a forward that takes
        the batch mapping itself. A dataclass batch: the mapping of its fields that the forward takes (labels and
        ground truth left out), or ``(inputs,)`` for a forward that takes the batch itself.

    Raises:
        LayoutUnclear: a mapping or dataclass the forward's parameters do not tell how to pass; the message names
            ``batches=BatchOptions(inputs=...)`` with readers that work when passed.
    """
    parameters = _forward_parameters(module)
    fields = batch_fields(inputs)
    if fields is not None and parameters is not None:
        return _fit_dataclass(module, inputs, default_batch_inputs(fields), parameters)
    if not isinstance(inputs, Mapping) or parameters is None:
        return inputs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return inputs
    names = [p.name for p in _named(parameters)]
    required = _required(parameters)
    if all(key in names for key in inputs):
        return inputs
    taken = {k: v for k, v in inputs.items() if k in names}
    if taken and all(name in taken for name in required):
        return taken
    if len(required) == 1 and not taken and _takes_mapping(next(p for p in parameters if p.name == required[0])):
        return (inputs,)
    raise LayoutUnclear(_refusal(module, inputs, required or names[:1]))


def _fit_dataclass(module: nn.Module, batch: Any, fields: Mapping[str, Any],
                   parameters: list[inspect.Parameter]) -> Any:
    """A dataclass batch as the forward takes it: its ``fields`` (labels and ground truth left out) by name, or the
    batch itself."""
    names = [p.name for p in _named(parameters)]
    required = _required(parameters)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters) or (fields and all(k in names for k in fields)):
        return dict(fields)
    taken = {k: v for k, v in fields.items() if k in names}
    if taken and all(name in taken for name in required):
        return taken
    if len(required) == 1 and not taken and _takes_dataclass(next(p for p in parameters if p.name == required[0]),
                                                              type(batch)):
        return (batch,)
    raise LayoutUnclear(_refusal(module, fields, required or names[:1], kind=type(batch).__name__))


def _refusal(module: nn.Module, inputs: Mapping[str, Any], wanted: list[str], kind: str | None = None) -> str:
    """Why the forward cannot be called on the batch, with readers that work when passed; ``kind``: the class of a
    dataclass batch (its fields are read as attributes), None for a mapping."""
    keys, tensors = list(inputs), [k for k, v in inputs.items() if isinstance(v, Tensor)]
    forward = f"{type(module).__name__}.forward({', '.join(wanted)})"
    batches = f"mappings with the keys {keys}" if kind is None else f"{kind} dataclasses with the fields {keys}"
    read = (lambda key: f"batch[{key!r}]") if kind is None else (lambda key: f"batch.{key}")
    itself = "the batch mapping" if kind is None else f"the {kind}"
    if len(wanted) == 1:
        by_key = " or ".join(f"batches=BatchOptions(inputs=lambda batch: {read(k)})" for k in tensors[:2])
        return (f"GAECallback: the validation batches are {batches}, and {forward} takes none of "
                f"them by name, so how to call it cannot be told. Pass {by_key} if {wanted[0]} is that tensor, or "
                f"batches=BatchOptions(inputs=lambda batch: (batch,)) if forward takes {itself} itself")
    example = ", ".join(f"{name!r}: {'batch[...]' if kind is None else 'batch.<field>'}" for name in wanted)
    return (f"GAECallback: the validation batches are {batches}, and {forward} does not take "
            f"them by name; pass batches=BatchOptions(inputs=lambda batch: {{{example}}}) that gives each parameter "
            "its tensor")


def forward_hint(module: nn.Module, inputs: Any, error: BaseException) -> str:
    """What to pass when calling the module on the samples raised ``error`` (empty when it is not a call mismatch)."""
    if not isinstance(error, TypeError):
        return ""
    parameters = _forward_parameters(module) or []
    required = _required(parameters)
    if isinstance(inputs, Mapping):
        return (f" The model is called as model(**inputs) with the batch keys {list(inputs)}; pass "
                "batches=BatchOptions(inputs=lambda batch: {...}) that keeps only the keys its forward takes, or "
                "batches=BatchOptions(inputs=lambda batch: (batch,)) if its forward takes the batch itself.")
    if isinstance(inputs, Tensor) and len(required) > 1:
        positions = ", ".join(f"batch[{i}]" for i in range(len(required)))
        return (f" The model is called as model(batch[0]), but {type(module).__name__}.forward takes "
                f"{', '.join(required)}: pass batches=BatchOptions(inputs=lambda batch: ({positions}), "
                f"labels=lambda batch: batch[{len(required)}]) to give it the batch's first {len(required)} items.")
    return ""
