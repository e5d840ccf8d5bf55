"""What GAECallback does in ``trainer.validate()`` and ``trainer.test()``: the step they log at, and test's tags.

``validate`` explains the tracked validation samples and scores the whole faithfulness subset, under the tags a fit
logs, so that its points join the fit's curves. ``test`` reads its samples from the test data (chosen the same
seeded way, never kept as the tracked validation samples) and scores the whole faithfulness subset of them, logged
under ``test_<tag>`` (``test_<metric>/<method>``, ``test_faithfulness_samples``) so that test numbers never mix into
the validation curves; it draws no pictures (their tags name validation samples).

Both log at the step the module's own ``self.log`` uses, except on a Trainer that has not trained: a validation or
test of a checkpoint there logs at the checkpoint's step (what its fit's ``self.log`` used when it was saved), so that
scoring a fit's checkpoint afterwards lands at that fit's step, not at 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer

from lightning_gae.callbacks._state import RunState

__all__ = ["TEST_PREFIX", "checkpoint_step", "continue_fit_steps", "logged_step", "scorable", "test_scalars"]

TEST_PREFIX = "test_"


def checkpoint_step(checkpoint: Mapping[str, Any]) -> int | None:
    """The step a fit logs its checkpoint's weights at when it ends (its final faithfulness point), as a resume from it
    would log next: ``global_step``; or the fit loop's batches that stepped + 1 where that is less (several optimizers
    step several times a batch; a checkpoint is saved before that count is raised); None when it holds neither."""
    step = checkpoint.get("global_step")
    try:
        stepped = int(checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"]) + 1
    except (KeyError, TypeError, ValueError):
        return None if step is None else int(step)
    return stepped if step is None else min(stepped, int(step))


def continue_fit_steps(trainer: Trainer, ckpt_path: Any) -> None:
    """The fit loop's counters as the checkpoint at ``ckpt_path`` holds them, and the logging step at the fit's last
    (where it logged its final faithfulness): what ``lightning-gae validate``/``test`` of a run's own config logs
    lands there, not at 0."""
    if not ckpt_path or not Path(str(ckpt_path)).is_file():
        return
    checkpoint = torch.load(str(ckpt_path), map_location="cpu", weights_only=True, mmap=True)
    loop, step = (checkpoint.get("loops") or {}).get("fit_loop"), checkpoint_step(checkpoint)
    if loop and step is not None:
        loop["epoch_loop.state_dict"] = {**loop.get("epoch_loop.state_dict", {}), "_batches_that_stepped": step}
        trainer.fit_loop.load_state_dict(loop)


def logged_step(trainer: Trainer, loaded: int | None) -> int:
    """The step to log at now: the module's ``self.log`` step, or in a validation or test on a Trainer that has not
    trained, the step of the checkpoint it loaded (``loaded``; None: none loaded)."""
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    if trainer.state.fn != "fit" and step == 0 and loaded:
        return loaded
    return step


def test_scalars(scalars: Mapping[str, float]) -> dict[str, float]:
    """``scalars`` under the tags ``test()`` logs them with."""
    return {f"{TEST_PREFIX}{tag}": value for tag, value in scalars.items()}


def scorable(run: RunState, metrics: Sequence[str]) -> bool:
    """Whether ``run``'s faithfulness subset is scored when a fit ends and in a test: it has one, of a model with one
    token set, and there is something to score it by (a metric, or ground truth)."""
    return run.scored is not None and run.sets is None and (bool(metrics) or run.scored.truth is not None)
