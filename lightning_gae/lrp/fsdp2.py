"""The LRP forwards on a model sharded with FSDP2 (``fully_shard``): its parameters held constant.

The LRP modes (:mod:`lightning_gae.lrp`, :mod:`lightning_gae.lrp.transformer_attribution`) tell which tensors carry
relevance by ``requires_grad``, so their forward runs on detached parameters: ``torch.func.functional_call`` swaps
each module's parameters for detached ones. Inside an FSDP2 unit that swap does not hold, and breaks the unit:

* the unit's pre-forward hook all-gathers its parameters and sets the gathered ones on its modules
  (``FSDPParam.to_unsharded``), over whatever ``functional_call`` put there, so they carry relevance again;
* the first forward of a unit initializes it lazily (``FSDPParamGroup.lazy_init`` ->
  ``FSDPParam.reset_sharded_param``), which adopts the parameter it finds on the module as the sharded parameter
  for good: under ``functional_call`` the detached one. From then on the gathered parameters copy its
  ``requires_grad=False`` (``to_unsharded``: ``set_requires_grad_if_needed``) and no gradient reaches the
  optimizer's parameters: the next training step's ``loss.backward()`` raises "element 0 of tensors does not require
  grad and does not have a grad_fn".

So under FSDP2, :func:`constant_parameters` leaves the units' parameters to them and swaps the gathered parameters for
detached ones (the same memory, FSDP2 re-gathers into it for the backward) between the unit's pre-forward hook
and its post-forward hook; ``functional_call`` still detaches the parameters outside the units (:func:`unit_parameters`
names those it must leave alone).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import nn

__all__ = ["constant_parameters", "fsdp2_units", "unit_parameters"]


def fsdp2_units(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that ``fully_shard`` made FSDP2 units."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: no module was sharded with it
    unit = getattr(fsdp, "FSDPModule", None)
    return [] if unit is None else [m for m in model.modules() if isinstance(m, unit)]


def _unit_modules(unit: nn.Module, units: set[int]) -> list[nn.Module]:
    """The modules whose parameters ``unit`` gathers: its own and its submodules', nested units' excepted."""
    found, stack = [], [unit]
    while stack:
        module = stack.pop()
        found.append(module)
        stack.extend(child for child in module.children() if id(child) not in units)
    return found


class _Detached:
    """The hooks on one unit: detach its gathered parameters after its pre-forward, put them back before its
    post-forward (FSDP2's reshard sets the sharded ones; the root unit, which keeps its gathered parameters after
    the forward, needs its own back)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules
        self.swapped: list[list[tuple[nn.Module, str, nn.Parameter]]] = []

    def pre(self, unit: nn.Module, args: Any) -> None:
        swapped = []
        for module in self.modules:
            for name, param in module._parameters.items():
                if param is not None and param.requires_grad:
                    swapped.append((module, name, param))
                    # A plain tensor in the parameter's place for the forward (put back after it).
                    module._parameters[name] = param.detach()  # type: ignore[assignment]
        self.swapped.append(swapped)

    def post(self, unit: nn.Module, args: Any, output: Any) -> None:
        if self.swapped:
            for module, name, param in reversed(self.swapped.pop()):
                module._parameters[name] = param


def unit_parameters(units: list[nn.Module]) -> set[int]:
    """The ids of the parameters the units gather (``functional_call`` must leave them alone)."""
    ids = {id(u) for u in units}
    return {id(p) for unit in units for module in _unit_modules(unit, ids) for p in module._parameters.values()
            if p is not None}


@contextmanager
def constant_parameters(units: list[nn.Module]) -> Iterator[None]:
    """Inside: each FSDP2 unit's forward runs on its gathered parameters detached (see the module docstring)."""
    ids = {id(u) for u in units}
    with ExitStack() as stack:
        for unit in units:
            hooks = _Detached(_unit_modules(unit, ids))
            # Appended: after FSDP2's pre-forward (prepended), which gathers. Prepended: before its post-forward.
            stack.enter_context(unit.register_forward_pre_hook(hooks.pre))
            stack.enter_context(unit.register_forward_hook(hooks.post, prepend=True, always_call=True))
        yield
