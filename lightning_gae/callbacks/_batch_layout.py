"""How the tracked samples meet the module's ``forward`` when no ``BatchOptions(inputs=...)`` reader is given.

A mapping batch is called as ``module(**inputs)`` when the forward takes its keys by name (a Hugging Face batch less
its labels); keys the forward does not take (an index, file names) are left out; a forward that takes the batch
itself (``forward(self, batch)``) is called as ``module(inputs)``. Where the forward's signature cannot tell, the run
stops at its start with a reader that works when passed, built from the batch's keys and the forward's parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

__all__ = ["fit_to_forward", "forward_hint"]

# A forward's only parameter by one of these names (or annotated as a mapping) takes the batch itself.
_BATCH_NAMES = ("batch", "inputs", "sample", "samples", "data")


def _forward_parameters(module: nn.Module) -> list[inspect.Parameter] | None:
    """The forward's parameters (``self`` left out), or None when its signature cannot be read."""
    try:
        return list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None


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
        the batch mapping itself.

    Raises:
        ValueError: a mapping the forward's parameters do not tell how to pass; the message names
            ``batches=BatchOptions(inputs=...)`` with readers that work when passed.
    """
    parameters = _forward_parameters(module)
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
    raise ValueError(_refusal(module, inputs, required or names[:1]))


def _refusal(module: nn.Module, inputs: Mapping[str, Any], wanted: list[str]) -> str:
    keys, tensors = list(inputs), [k for k, v in inputs.items() if isinstance(v, Tensor)]
    forward = f"{type(module).__name__}.forward({', '.join(wanted)})"
    if len(wanted) == 1:
        by_key = " or ".join(f"batches=BatchOptions(inputs=lambda batch: batch[{k!r}])" for k in tensors[:2])
        return (f"GAECallback: the validation batches are mappings with the keys {keys}, and {forward} takes none of "
                f"them by name, so how to call it cannot be told. Pass {by_key} if {wanted[0]} is that tensor, or "
                "batches=BatchOptions(inputs=lambda batch: (batch,)) if forward takes the batch mapping itself")
    example = ", ".join(f"{name!r}: batch[...]" for name in wanted)
    return (f"GAECallback: the validation batches are mappings with the keys {keys}, and {forward} does not take "
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
