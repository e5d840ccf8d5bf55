"""The one Trainer factory of the callback tests, and what those tests check around a fit."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import FSDPStrategy

# Lightning logs at `_batches_that_stepped`, which a validation at the end of an epoch still sees one
# below global_step (it is incremented after the validation); self.log("val_loss") lands there, and so
# do the callback's explanations. Two epochs of 2 batches: global steps 2 and 4, logged at 1 and 3.
EPOCH_END_STEPS = [1, 3]


def make_trainer(root: str | Path, callbacks: Sequence[Callback], *, logger: Any = True, name: str = "tb",
                 max_epochs: int = 2, limit_train_batches: int = 2, limit_val_batches: int = 2, **kwargs: Any) -> Trainer:
    """A quiet CPU Trainer for a short fit: ``logger=True`` is a ``TensorBoardLogger(root, name=name)``.

    Checkpoints are written only when ``callbacks`` hold a ``ModelCheckpoint``; ``kwargs`` go to the Trainer.
    """
    if logger is True:
        logger = TensorBoardLogger(root, name=name)
    return Trainer(
        default_root_dir=root,
        max_epochs=max_epochs,
        limit_train_batches=limit_train_batches,
        limit_val_batches=limit_val_batches,
        logger=logger,
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        accelerator="cpu",
        **kwargs,
    )


@contextmanager
def no_skipped_explanation() -> Iterator[None]:
    """Fails if the callback reports a skipped explanation inside the block."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        yield
    skipped = [str(w.message) for w in records if "was skipped" in str(w.message)]
    assert not skipped, skipped


def heatmap_tag(sample: int) -> str:
    """The tag of a tracked sample's picture (the input and every method side by side)."""
    return f"gae_heatmaps/val_{sample}"


def weights(module) -> dict:
    """A detached copy of the module's state, to compare two runs bit for bit."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_heatmaps_at_steps(acc, callback, steps) -> None:
    """Every tracked sample's picture was logged at exactly ``steps`` (``acc``: tests.helpers.events.Events)."""
    for sample in callback.sample_indices:
        assert acc.image_steps(heatmap_tag(sample)) == steps


class ScoredRows(Callback):
    """How many samples went through the module's forward on this rank in each of the callback's steps that scored
    faithfulness: put ``rows`` before the GAECallback and ``rows.after`` behind it, so that each hook call of the
    callback is bracketed. ``calls`` lists, per such step, ``{"explained": n, "perturbed": m}``: the rows with
    gradients on (the explanations, tracked samples included) and without (the metrics' perturbed inputs)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, int]] = []
        self.after = _CloseCount(self)
        self._handle = None

    def _open(self, pl_module: Any) -> None:
        counts = {"explained": 0, "perturbed": 0}

        def count(module: Any, args: tuple) -> None:
            counts["explained" if torch.is_grad_enabled() else "perturbed"] += len(args[0])

        self._counts, self._handle = counts, pl_module.register_forward_pre_hook(count)

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
            if self._counts["perturbed"]:
                self.calls.append(self._counts)

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, *args: Any) -> None:
        self._open(pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
        self._open(pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        self._open(pl_module)


class _CloseCount(Callback):
    """The end of a :class:`ScoredRows` bracket."""

    def __init__(self, rows: ScoredRows) -> None:
        self.rows = rows

    def on_train_batch_end(self, *args: Any) -> None:
        self.rows._close()

    def on_validation_epoch_end(self, *args: Any) -> None:
        self.rows._close()

    def on_train_end(self, *args: Any) -> None:
        self.rows._close()


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` (FSDP1) on a CPU accelerator: Lightning refuses the exact class there, not a subclass.

    Lightning passes FSDP1 ``device_id=root_device.index``, None on a CPU, and torch then looks for an accelerator;
    this wraps the LightningModule as Lightning does (``auto_wrap_policy``, ``use_orig_params`` and the rest from the
    strategy's arguments) with ``device_id=torch.device("cpu")``, and leaves the remaining steps to Lightning.
    """

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)
        model = FullyShardedDataParallel(module=model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
                                         sharding_strategy=self.sharding_strategy, device_id=torch.device("cpu"), **self.kwargs)
        # Lightning's steps after wrapping; without the policy, which it would warn about on a wrapped model.
        kwargs, self.kwargs = self.kwargs, {k: v for k, v in self.kwargs.items() if k != "auto_wrap_policy"}
        try:
            return super()._setup_model(model)
        finally:
            self.kwargs = kwargs
