"""The LRP forwards on a model wrapped in FSDP1 (``FullyShardedDataParallel``): its parameters held constant.

As under FSDP2 (:mod:`lightning_gae.lrp.fsdp2`), the LRP modes tell which tensors carry relevance by ``requires_grad``,
and ``torch.func.functional_call``'s detached parameters do not hold inside an FSDP1 unit:

* the unit's forward first writes back any original parameter that is no longer the one it manages
  (``FlatParamHandle._writeback_orig_params``: an in-place copy into the flat parameter), then all-gathers the flat
  parameter and sets views into it on the modules (``_use_unsharded_views``), which carry relevance again: both run
  inside the forward, under the LRP mode, whose rules refuse the in-place copies (``UnsupportedOperation``);
* Lightning's root unit wraps the LightningModule itself, outside the explained model: the callback names it
  (:func:`through_root`).

So under FSDP1 the parameters the units manage are left to them (:func:`managed_parameters`), the LRP mode lets
every operation through while a unit's own code runs (its forward before and after the wrapped module's), and the
gathered views are detached between the two (the same memory, which FSDP1 re-gathers into for the backward).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from torch import nn

__all__ = ["constant_gathered", "fsdp1_units", "gather_again", "managed_parameters", "through_root"]

_ROOTS: ContextVar[tuple[nn.Module, ...]] = ContextVar("lightning_gae_fsdp1_roots", default=())


def _unit_class() -> type | None:
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: no module was wrapped with it
    return getattr(fsdp, "FullyShardedDataParallel", None)


@contextmanager
def through_root(root: nn.Module) -> Iterator[None]:
    """Inside: calls of the module ``root`` wraps go through ``root``, which the LRP forwards must know of."""
    token = _ROOTS.set((*_ROOTS.get(), root))
    try:
        yield
    finally:
        _ROOTS.reset(token)


def fsdp1_units(model: nn.Module) -> list[nn.Module]:
    """The FSDP1 units of ``model``, and the roots (:func:`through_root`) that wrap it."""
    unit = _unit_class()
    if unit is None:
        return []
    units = [m for m in model.modules() if isinstance(m, unit)]
    return [r for r in _ROOTS.get() if any(m is model for m in r.modules())] + units


def managed_parameters(units: list[nn.Module]) -> set[int]:
    """The ids of the parameters the units manage (``functional_call`` must leave them alone)."""
    return {id(p) for unit in units for p in nn.Module.parameters(unit)}


class _Gathered:
    """Global module hooks for one LRP forward: the mode suspended inside each unit's own code, its gathered views
    detached inside its wrapped module."""

    def __init__(self, capture: Any, unit: type) -> None:
        self.capture = capture
        self.unit = unit
        self.entered: list[list[Any]] = []  # [unit, swapped views or None while the wrapped module has not run]

    def pre(self, module: nn.Module, args: Any) -> None:
        if isinstance(module, self.unit):
            self.capture._suspended += 1
            self.entered.append([module, None])
        elif self.entered and self.entered[-1][1] is None and module is self.entered[-1][0]._fsdp_wrapped_module:
            self.entered[-1][1] = self._detach(self.entered[-1][0])
            self.capture._suspended -= 1

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.entered:
            return
        top = self.entered[-1]
        if module is top[0]:
            self.entered.pop()
            if top[1] is not None:  # the unit's forward raised inside the wrapped module's hooks
                self._restore(top[1])
            else:
                self.capture._suspended -= 1
        elif top[1] is not None and module is top[0]._fsdp_wrapped_module:
            self._restore(top[1])
            top[1] = None
            self.capture._suspended += 1

    @staticmethod
    def _detach(unit: nn.Module) -> list[tuple[nn.Module, str, Any, Any]]:
        handle: Any = unit._handle  # FSDP's flat-parameter handle (private, untyped)
        if handle is None:
            return []
        flat = handle.flat_param
        swapped = []
        for name, module in [info[:2] for info in flat._param_infos] + [info[:2] for info in flat._shared_param_infos]:
            registered = module._parameters.get(name)
            attribute = module.__dict__.get(name)
            swapped.append((module, name, registered, attribute))
            if registered is not None:
                module._parameters[name] = registered.detach()
            if attribute is not None:
                module.__dict__[name] = attribute.detach()
        return swapped

    @staticmethod
    def _restore(swapped: list[tuple[nn.Module, str, Any, Any]]) -> None:
        for module, name, registered, attribute in reversed(swapped):
            if registered is not None:
                module._parameters[name] = registered
            if attribute is not None:
                module.__dict__[name] = attribute


def gather_again(units: list[nn.Module]) -> None:
    """Before another backward over the same forward's graph (Transformer Attribution's second pass): each unit's
    pre-backward hook gathers its parameters again.

    FSDP1 arms that hook once per forward; the first backward's end resharded every unit, freeing the gathered memory
    the forward's saved views point into, and a second backward would read it unallocated. An unsharded unit
    (``NO_SHARD``) freed nothing: gathering it again would reset its views (``.data``), which the saved tensors of the
    first pass's graph see as an in-place change.
    """
    for unit in units:
        handle: Any = unit._handle  # FSDP's flat-parameter handle (private, untyped)
        if handle is not None and handle.uses_sharded_strategy:
            handle._needs_pre_backward_unshard = True
            handle._ran_pre_backward_hook = False
            handle._prefetched = False


@contextmanager
def constant_gathered(capture: Any, units: list[nn.Module]) -> Iterator[None]:
    """Inside: each FSDP1 unit's forward runs its own code outside the LRP mode, the wrapped module on its gathered
    parameters detached (see the module docstring). ``capture`` counts the suspensions in ``_suspended``."""
    unit = _unit_class()
    if not units or unit is None:
        yield
        return
    hooks = _Gathered(capture, unit)
    pre = nn.modules.module.register_module_forward_pre_hook(hooks.pre)
    post = nn.modules.module.register_module_forward_hook(hooks.post, always_call=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        while hooks.entered:
            top = hooks.entered.pop()
            if top[1] is not None:
                hooks._restore(top[1])
        capture._suspended = 0
