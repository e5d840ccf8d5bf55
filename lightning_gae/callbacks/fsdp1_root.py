"""GAECallback under Lightning's ``FSDPStrategy`` (FSDP1): explanations through the root unit, FSDP1 kept in order.

Lightning wraps the LightningModule itself in the root ``FullyShardedDataParallel`` unit (and what its
``auto_wrap_policy`` names in units of their own, inside the module). The root's forward all-gathers the parameters
the module holds outside the inner units (an embedding, a head, norms) and then calls the module; a call of the
module itself, which is what the explanations make, would find them sharded. :meth:`FSDP1.explaining` sends every
call of the module through the root for the length of the callback's block, so each explanation's forwards and
backwards all-gather one unit at a time as the training step's do. (``summon_full_params`` would instead gather the
whole model on every rank at once, and FSDP1 forbids forwards and backwards inside it.)

An explanation reads gradients of attention maps with ``torch.autograd.grad``: FSDP1's pre-backward hooks run
(and gather), its post-backward hooks, which only fire when a parameter receives a gradient, do not. Two things
follow, both handled here. FSDP's pre-backward hook sets aside the sharded gradients the training step left, and its
post-backward callback drops them when no post-backward hook ran: they are put back when the block ends (with
gradient accumulation, a validation between two micro-batches would otherwise lose the first one's gradients). And
a block that failed halfway (one rank raised, the others stopped at the next agreement) never reached that callback,
which is what puts every unit back to idle, resharded, with its hooks ready for the next iteration: :meth:`reset`
runs it by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from lightning_gae.lrp.fsdp1 import through_root

__all__ = ["FSDP1"]


class _Agreement(torch.autograd.Function):
    """Identity in the forward; in the backward, ``agree()`` before the gradient reaches the unit's output (where
    FSDP1's pre-backward hook all-gathers the unit's parameters)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, agree: Callable[[], None]) -> Tensor:
        ctx.agree = agree
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        ctx.agree()
        return grad, None


_MISSING = object()


def _kept_grad(param: Tensor) -> Callable[[], None]:
    """What puts ``param.grad`` back, if the block replaced it (the same tensor is not assigned again: between
    micro-batches a flat parameter's gradient is unsharded while the parameter is sharded)."""
    grad = param.grad

    def restore() -> None:
        if param.grad is not grad:
            param.grad = grad

    return restore


def _kept_flat(flat: Any) -> Callable[[], None]:
    """What puts back a flat parameter's gradient and FSDP1's bookkeeping of it."""
    restore_grad = _kept_grad(flat)
    saved = getattr(flat, "_saved_grad_shard", _MISSING)
    called = flat._post_backward_called

    def restore() -> None:
        restore_grad()
        if saved is _MISSING:
            if hasattr(flat, "_saved_grad_shard"):
                delattr(flat, "_saved_grad_shard")
        else:
            flat._saved_grad_shard = saved
        flat._post_backward_called = called

    return restore


class FSDP1:
    """The FSDP1 units of a run under ``FSDPStrategy``; :meth:`find` returns None for any other strategy.

    Example::

        fsdp = FSDP1.find(trainer.strategy.model, pl_module)
        with fsdp.explaining():
            explain(pl_module, inputs)
    """

    def __init__(self, module: nn.Module, root: nn.Module | None, units: Sequence[nn.Module]) -> None:
        self.module = module
        # The unit that wraps the module itself (Lightning's wrapping), or None (units wrapped in configure_model).
        self.root = root
        self.units = units

    @classmethod
    def find(cls, model: nn.Module | None, module: nn.Module) -> FSDP1 | None:
        """The FSDP1 units of ``model`` (the strategy's model, which wraps ``module``), or None when it has none."""
        if model is None or not torch.distributed.is_available():
            return None
        from torch.distributed.fsdp import FullyShardedDataParallel

        units = FullyShardedDataParallel.fsdp_modules(model)
        if not units:
            return None
        root = model if isinstance(model, FullyShardedDataParallel) and model.module is module else None
        return cls(module, root, units)

    @property
    def outermost(self) -> list[nn.Module]:
        """The units inside no other one: FSDP1's roots once it has run a forward."""
        inner = {id(m) for unit in self.units for m in unit.modules() if m is not unit}
        return [unit for unit in self.units if id(unit) not in inner]

    @contextmanager
    def explaining(self) -> Iterator[None]:
        """Calls of the module go through the root unit; FSDP1's gradients are as before when the block ends.

        Restored last: after :meth:`reset`, which a failing block runs inside this one.
        """
        kept = self._keep_gradients()
        # Before each unit's forward (prepended: before FSDP1's, which writes back changed parameters).
        handles = [unit.register_forward_pre_hook(lambda unit, args: self._register_parameters([unit]), prepend=True)
                   for unit in self.units]
        try:
            with self._through_root():
                yield
        finally:
            for hook in handles:
                hook.remove()
            self._register_parameters(self.units)
            for restore in kept:
                restore()

    @staticmethod
    def _register_parameters(units: Sequence[Any]) -> None:
        """Without sharding (``NO_SHARD``, which FSDP1 switches to on one process), the original parameters of idle
        units registered on their modules again, as the post-backward hook that no explanation fires would have done.

        A unit's pre-backward sets plain-tensor views into the flat parameter on its modules in their place. A
        sharded unit's reshard puts the parameters back, and FSDP1's end of backward reshards every unit the block
        left gathered, but it takes an unsharded flat parameter for resharded already. The next forward of the unit
        (the block's next, or the training step's) then took each view for a parameter the user replaced and
        adopted it for good (``_writeback_orig_params``): the optimizer's parameters received no gradient again.
        """
        for unit in units:
            handle: Any = unit._handle  # FSDP's flat-parameter handle (private, untyped)
            if handle is not None and not handle.uses_sharded_strategy and unit.training_state.name == "IDLE":
                handle._use_sharded_views()  # without sharding: the unsharded views, as parameters

    def _keep_gradients(self) -> list[Callable[[], None]]:
        """What restores, for every flat parameter, its sharded gradient (or, between two micro-batches of gradient
        accumulation, the unsharded one FSDP1's ``no_sync`` accumulates), the sharded gradient FSDP's pre-backward
        hook sets aside, and whether a post-backward hook ran since the last optimizer step; and each original
        parameter's ``.grad`` (``use_orig_params=True``: a view into the flat one)."""
        kept = []
        for unit in self.units:
            handle: Any = unit._handle  # FSDP's flat-parameter handle (private, untyped)
            if handle is None:
                continue
            flat = handle.flat_param
            kept.append(_kept_flat(flat))
            # Inside the block no post-backward hook runs: FSDP's end of backward must not take one to have run
            # (it would look for a sharded gradient to hand to the optimizer, and assert there is one).
            flat._post_backward_called = False
            kept += [_kept_grad(p) for p in (flat._params or [])]
        return kept

    @contextmanager
    def _through_root(self) -> Iterator[None]:
        if self.root is None:
            yield
            return
        module, root = self.module, self.root
        inside = False

        def call(*args: Any, **kwargs: Any) -> Any:
            # nn.Module.__call__ runs self._call_impl: this instance attribute takes the class's place. The first
            # call enters the root, whose forward gathers and calls the module again: that call is the module's own.
            nonlocal inside
            if inside:
                return type(module)._call_impl(module, *args, **kwargs)
            inside = True
            try:
                return root(*args, **kwargs)
            finally:
                inside = False

        module._call_impl = call  # type: ignore[method-assign]  # this instance's calls go through the root, for the block
        try:
            with through_root(root):
                yield
        finally:
            del module._call_impl

    def guard(self, enter: Callable[[nn.Module, Any], None], agree: Callable[[], None]) -> list[RemovableHandle]:
        """Hooks that call ``enter`` before each unit's forward (its all-gather) and ``agree`` before its backward's.

        FSDP1 gathers inside the unit's forward, after the forward pre-hooks; it registers its pre-backward hooks on
        the forward's outputs before any forward hook runs, so the backward's agreement is a node in front of them.
        """
        from torch.distributed.utils import _apply_to_tensors  # what FSDP1 registers its pre-backward hooks with

        def through_agreement(module: nn.Module, args: Any, output: Any) -> Any:
            if not torch.is_grad_enabled():
                return output
            return _apply_to_tensors(lambda t: _Agreement.apply(t, agree) if t.requires_grad else t, output)

        handles = []
        for unit in self.units:
            handles.append(unit.register_forward_pre_hook(enter, prepend=True))
            handles.append(unit.register_forward_hook(through_agreement))
        return handles

    def reset(self) -> None:
        """After a block that failed halfway: what FSDP1's post-backward callback does at the end of a backward.

        Every unit resharded (those whose forward or backward stopped with their parameters gathered), back to idle,
        its post-backward hooks removed (the next training forward registers them anew), the iteration's order
        cleared, and the callback ready to be queued by the next backward. Does nothing before the first forward.
        """
        from torch.distributed.fsdp._runtime_utils import _post_backward_final_callback

        for root in self.outermost:
            if root._is_root:
                _post_backward_final_callback(root, root)
