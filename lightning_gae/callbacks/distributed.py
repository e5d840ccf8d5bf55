"""GAECallback on several processes: which strategies it runs under, and how the ranks explain together.

With the whole model on every rank (DDP, DeepSpeed stage 1 and 2) rank zero explains the tracked samples
alone. With a sharded model every forward all-gathers each sharded unit's parameters from every rank, so
every rank runs each explanation's forwards and backwards, on the same samples: FSDP2
(``ModelParallelStrategy``, ``fully_shard`` in ``configure_model``), whose units sit inside the module, and
FSDP1 (``FSDPStrategy``), whose root unit wraps the module itself, so the explanations' calls of the module go
through that root (:mod:`._fsdp1`). Either way the faithfulness subset is split: each rank scores its contiguous
part, and the per-sample states are gathered with torchmetrics' sync (list states, ``dist_reduce_fx="cat"``),
so every rank ends with the states one process would have.

A failure on one rank must not leave the others waiting in a collective. :class:`Lockstep` runs the
callback's work as one block on every rank and agrees on the outcome: before each collective inside the
block (a sharded unit's forward or backward, the gather) the ranks all-reduce what each is about to do,
so a rank that failed is met at its next such point, every rank leaves the block together, FSDP's
per-iteration state is reset (FSDP2's ``reset_iter_state``; for FSDP1 its end-of-backward callback, run by
hand), and every rank raises (the failing one its own error, the others :class:`RankFailed`). What FSDP
does inside its own collectives (an allocation that fails on one rank only) is beyond this: such a rank
stops the run as a failing training step would.

A part of the block may fail without ending it (:func:`together`: a step's scoring, whose gather needs every
rank, while its pictures are still logged): the ranks agree on the part's outcome the same way, and when it
failed on one rank every rank leaves the part together, raising as above, and goes on with the block.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy, ModelParallelStrategy, Strategy
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from lightning_gae._structures import map_tensors
from lightning_gae.callbacks.fsdp1_root import FSDP1
from lightning_gae.metrics.stderr import SampleScores

__all__ = ["Lockstep", "RankFailed", "check_strategy", "from_rank_zero", "gather_scores", "random_rows", "subset_part",
           "together"]

T = TypeVar("T")

# What a rank says at an agreement: it failed or finished the block, failed or finished a part of it (:func:`together`),
# or is about to run a collective inside a part or outside one. The block's codes are the lowest and the highest, so
# the lowest and highest said tell whether any rank is outside the part (:meth:`Lockstep._stop`).
_FAILED, _DONE, _PART_FAILED, _PART_DONE, _RUN_IN_PART, _RUN = range(6)
_ACTIVE: ContextVar[Lockstep | None] = ContextVar("lightning_gae_lockstep", default=None)


def check_strategy(strategy: Strategy) -> None:
    """Refuse, naming what to use instead, the strategies the callback cannot explain under.

    Raises:
        ValueError: DeepSpeed stage 3 or ``ModelParallelStrategy`` with tensor parallelism. (The LRP ``methods``
            run under FSDP2 and FSDP1 on the gathered parameters held constant: :mod:`lightning_gae.lrp.fsdp2`,
            :mod:`lightning_gae.lrp.fsdp1`.)
    """
    if isinstance(strategy, DeepSpeedStrategy) and strategy.zero_stage_3:
        raise ValueError(
            "GAECallback cannot run with DeepSpeed ZeRO stage 3: its parameters are fetched by hooks on every "
            "submodule in an order DeepSpeed traces from the training steps, which an explanation's forwards and "
            "backwards do not follow, and it has no recovery from an explanation that fails halfway. Use DeepSpeed "
            "stage 1 or 2 (the whole model on every rank), FSDP2: ModelParallelStrategy(data_parallel_size="
            "<processes>, tensor_parallel_size=1) with fully_shard in configure_model(), or FSDPStrategy (FSDP1)."
        )
    if isinstance(strategy, ModelParallelStrategy):
        try:
            tensor_parallel = strategy.device_mesh["tensor_parallel"].size()
        except RuntimeError:  # the processes are not set up yet (the Trainer calls setup after they are)
            return
        if tensor_parallel > 1:
            raise ValueError(
                f"GAECallback cannot run with ModelParallelStrategy(tensor_parallel_size={tensor_parallel}): tensor "
                "parallelism splits every layer's computation across ranks, and the explanations read whole "
                "attention maps. Shard the parameters with FSDP2 alone: ModelParallelStrategy(data_parallel_size="
                f"{strategy.world_size}, tensor_parallel_size=1) with fully_shard in configure_model() (note that "
                "ModelParallelStrategy() with its defaults is tensor parallel across the processes of a node)."
            )


def _distributed(trainer: Trainer) -> bool:
    return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()


def _sharded_units(module: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def _roots(module: nn.Module, units: Sequence[nn.Module]) -> list[nn.Module]:
    """The sharded units inside no other one (FSDP2's roots: ``reset_iter_state`` is called on them)."""
    inner = {id(m) for unit in units for m in unit.modules() if m is not unit}
    return [unit for unit in units if id(unit) not in inner]


class RankFailed(RuntimeError):
    """What a rank raises when the block failed on another rank: that rank and its error (None for neither
    when no rank failed but they did not run the same forwards and gathers)."""

    def __init__(self, rank: int | None, error: BaseException | None) -> None:
        self.rank = rank
        if rank is None or error is None:
            message = "the ranks did not run the same forwards and gathers (one of them left the block early)"
        else:
            message = f"on rank {rank}: {type(error).__name__}: {error}"
        super().__init__(message)


class _Stopped(BaseException):
    """Raised at an agreement that another rank failed or left the block: unwinds this rank's part of it.

    A BaseException, so that no ``except Exception`` of the code in between turns it into a result and sends
    this rank on to a collective the others will never join.
    """


class _PartStopped(BaseException):
    """Raised at an agreement inside a part that another rank failed or left that part (every rank is in it):
    unwinds this rank's part, and the block goes on."""


def _portable(error: BaseException | None) -> BaseException | None:
    """``error`` if it pickles (it travels to the other ranks), else a RuntimeError with its message."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any exception may be raised by a model
        return RuntimeError(f"{type(error).__name__}: {error}")


class Lockstep:
    """The callback's work on every rank as one block whose outcome all ranks agree on.

    Example::

        Lockstep(trainer, pl_module).run(lambda: explain_and_score(), every_rank=True)
    """

    def __init__(self, trainer: Trainer, module: LightningModule) -> None:
        self.distributed = _distributed(trainer)
        self.rank = trainer.global_rank
        self.device = trainer.strategy.root_device
        self.units = _sharded_units(module) if self.distributed else []
        # FSDP1 (FSDPStrategy): its units wrap the module itself, so they are looked for in the strategy's model.
        self.fsdp1 = FSDP1.find(trainer.strategy.model, module)
        if self.units and not hasattr(self.units[0], "reset_iter_state"):
            raise ValueError(f"GAECallback under FSDP2 needs torch's FSDPModule.reset_iter_state() (torch "
                             f"{torch.__version__} has none), which restores the sharded model's state after an "
                             "explanation fails halfway; upgrade torch or train with strategy='ddp'")
        self.roots = _roots(module, self.units)
        # Whether a sharded unit's forward started in the block: FSDP (2 or 1) has state to reset only then.
        self._entered = False
        self._in_part = False

    @property
    def sharded(self) -> bool:
        """Whether the model has sharded units, whose forwards need every rank."""
        return bool(self.units) or (self.distributed and self.fsdp1 is not None)

    def _agree(self, code: int) -> tuple[int, int]:
        """The lowest and highest code the ranks said."""
        said = torch.tensor([code, -code], device=self.device)
        dist.all_reduce(said, op=dist.ReduceOp.MIN)
        return int(said[0]), -int(said[1])

    def guard(self) -> None:
        """Before a collective inside the block: go on only if every rank is about to run one too."""
        code = _RUN_IN_PART if self._in_part else _RUN
        low, high = self._agree(code)
        if not low == high == code:
            self._stop(low, high)

    def _stop(self, low: int, high: int) -> NoReturn:
        """Leave where the codes said send every rank: the part, when every rank is in it, else the block."""
        if self._in_part and low >= _PART_FAILED and high <= _RUN_IN_PART:
            raise _PartStopped
        raise _Stopped

    @contextmanager
    def part(self) -> Iterator[None]:
        """Inside :meth:`run` (``every_rank``): a part of the block that every rank runs, whose failure on any rank
        every rank raises when it leaves the part (the failing rank its own error, the others :class:`RankFailed`),
        while the block goes on. A rank that failed outside the part still ends the whole block."""
        self._in_part = True
        error: BaseException | None = None
        try:
            try:
                yield
            except Exception as err:  # noqa: BLE001 - raised below, after the other ranks know
                error = err
            low, high = self._agree(_PART_FAILED if error is not None else _PART_DONE)
            if low == high == _PART_DONE:
                return
            self._stop(low, high)
        except _PartStopped:  # at this rank's agreement or at a collective inside the part
            pass
        finally:
            self._in_part = False
        self._raise_together(error)

    def run(self, work: Callable[[], T], every_rank: bool) -> T:
        """``work()`` on this rank; with ``every_rank``, on every rank as one block (every rank must call it then).

        Raises:
            Exception: ``work``'s own error on the rank it failed on; :class:`RankFailed` on the other ranks.
        """
        if self.fsdp1 is None:
            return self._run(work, every_rank)
        with self.fsdp1.explaining():
            return self._run(work, every_rank)

    def _run(self, work: Callable[[], T], every_rank: bool) -> T:
        if not (self.distributed and every_rank):
            try:
                return work()
            except BaseException:
                if self.fsdp1 is not None:
                    self.fsdp1.reset()
                raise
        token = _ACTIVE.set(self)
        self._entered = False
        error: BaseException | None = None
        stopped = False
        try:
            with self._guarded_units():
                result = work()
        except _Stopped:
            stopped = True
        except Exception as err:  # noqa: BLE001 - re-raised below, after the other ranks know
            error = err
        finally:
            _ACTIVE.reset(token)
        if not stopped:
            low, high = self._agree(_FAILED if error is not None else _DONE)
            if low == high == _DONE:
                return result
        self._raise_together(error)

    def _raise_together(self, error: BaseException | None) -> NoReturn:
        """Every rank gets here after the same agreement: learn who failed, put FSDP back in order, raise."""
        errors: list[BaseException | None] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, _portable(error))
        if self._entered:
            for root in self.roots:
                root.reset_iter_state()  # type: ignore[operator]  # FSDP2's FSDPModule method (a class made at run time)
            if self.fsdp1 is not None:
                self.fsdp1.reset()
        if error is not None:
            raise error
        rank = next((r for r, e in enumerate(errors) if e is not None), None)
        raise RankFailed(rank, None if rank is None else errors[rank])

    @contextmanager
    def _guarded_units(self) -> Iterator[None]:
        """An agreement before each sharded unit's forward (its all-gather) and before its backward's."""
        handles = []
        for unit in self.units:
            # prepend: before FSDP's own hooks, which all-gather in the forward and register the backward's.
            handles.append(unit.register_forward_pre_hook(self._enter_unit, prepend=True))
            handles.append(unit.register_forward_hook(self._guard_backward, prepend=True))
        if self.distributed and self.fsdp1 is not None:
            handles += self.fsdp1.guard(self._enter_unit, self.guard)
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _enter_unit(self, module: nn.Module, args: Any) -> None:
        self.guard()
        self._entered = True

    def _guard_backward(self, module: nn.Module, args: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return

        def hook(t: Tensor) -> Tensor:
            # Registered before FSDP's pre-backward hook on the same tensor, so it runs first.
            if t.requires_grad:
                t.register_hook(lambda grad: self.guard())
            return t

        map_tensors(output, hook)


def together() -> AbstractContextManager[None]:
    """A part of the block :meth:`Lockstep.run` runs on every rank (:meth:`Lockstep.part`); on one rank, or
    outside such a block, there is nothing to agree on."""
    active = _ACTIVE.get()
    return nullcontext() if active is None else active.part()


def guard_collective() -> None:
    """Inside :meth:`Lockstep.run`: wait until every rank is about to run the same collective."""
    active = _ACTIVE.get()
    if active is not None:
        active.guard()


def from_rank_zero(trainer: Trainer, read: Callable[[], None], owner: Any, names: Sequence[str]) -> None:
    """``read()`` on rank zero, then ``owner``'s attributes ``names`` copied to every rank.

    Every rank then tracks and scores the same samples (each rank's loader may hold another shard, and a
    sharded forward needs the same samples on every rank). A failure of ``read`` is raised on every rank.
    """
    if not _distributed(trainer):
        read()
        return
    guard_collective()
    error: BaseException | None = None
    values: dict[str, Any] | None = None
    if trainer.is_global_zero:
        try:
            read()
            values = {name: getattr(owner, name) for name in names}
        except Exception as err:  # noqa: BLE001 - raised on every rank below
            error = err
    shared_error, values = trainer.strategy.broadcast((_portable(error), values), src=0)
    if error is not None:
        raise error
    if shared_error is not None:
        raise shared_error
    assert values is not None  # rank zero read them without an error
    for name, value in values.items():
        setattr(owner, name, value)


def subset_part(total: int, world: int, rank: int) -> tuple[list[int], Tensor]:
    """This rank's contiguous part of a subset of ``total`` samples: the rows to score and their positions.

    Every rank gets ``ceil(total / world)`` rows, so that the ranks run the same number of forwards (a
    sharded forward needs them all); the rows past the subset's end repeat its last sample and have
    position -1 (they are scored and then dropped).
    """
    size = -(-total // world)
    positions = torch.arange(rank * size, (rank + 1) * size)
    positions[positions >= total] = -1
    rows = [int(p) if p >= 0 else total - 1 for p in positions]
    return rows, positions


def random_rows(like: Tensor, positions: Sequence[int], seed: int, batch: int, total: int) -> Tensor:
    """The random baseline of the subset's samples at ``positions``: the rows one process draws for them.

    One process draws ``random_attribution`` per batch of ``batch`` samples, seeded by the batch's start;
    each row here is that draw's row, so a sample's random ranking does not depend on the ranks.
    """
    out = torch.empty(like.shape)
    starts = [p // batch * batch for p in positions]
    for start in dict.fromkeys(starts):
        size = min(batch, total - start)
        draw = torch.rand((size, *like.shape[1:]), generator=torch.Generator().manual_seed(seed + start))
        for i, (p, s) in enumerate(zip(positions, starts)):
            if s == start:
                out[i] = draw[p - start]
    return out.to(like.device)


class _PerSample(Metric):
    """Per-sample states kept apart: on ``compute``, every rank's rows in order of position, padding dropped."""

    position: list[Tensor]
    full_state_update = False

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.add_state("position", default=[], dist_reduce_fx="cat")
        for i in range(count):
            self.add_state(f"state_{i}", default=[], dist_reduce_fx="cat")

    def update(self, position: Tensor, rows: Sequence[Tensor]) -> None:
        self.position.append(position)
        for i, value in enumerate(rows):
            getattr(self, f"state_{i}").append(value)

    def compute(self) -> list[Tensor]:
        position = dim_zero_cat(self.position)
        order = position.argsort()
        order = order[position[order] >= 0]
        return [dim_zero_cat(getattr(self, f"state_{i}"))[order] for i in range(self.count)]


def gather_scores(scores: SampleScores, total: int) -> SampleScores:
    """Every rank's per-sample states of its :func:`subset_part`, gathered into ``scores`` in the subset's order.

    Must run on every rank (inside :meth:`Lockstep.run`); one process returns ``scores`` as they are.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return scores
    rows = scores.rows()
    names = [(key, state) for key, states in rows.items() for state in states]
    if not names:
        return scores
    guard_collective()
    _, positions = subset_part(total, dist.get_world_size(), dist.get_rank())
    first = rows[names[0][0]][names[0][1]]
    per_sample = _PerSample(len(names)).to(first.device)
    per_sample.update(positions.to(first.device), [rows[key][state] for key, state in names])
    gathered = per_sample.compute()
    merged: dict[tuple[str, str], dict[str, Tensor]] = {}
    for (key, state), value in zip(names, gathered):
        merged.setdefault(key, {})[state] = value
    scores.set_rows(merged)
    return scores
