"""When GAECallback scores its faithfulness subset during ``fit``, and on which of its samples.

Scoring is the callback's expensive part: every perturbation metric runs 9 forward passes per sample
and scored method. So ``fit`` scores a fixed part of the subset at the scheduled explanation steps
(the first and every ``FaithfulnessOptions.every_n_explanations``-th after it) and on its final weights, and
``validate``/``test`` score the whole subset. The part is the same samples at every point of fit's
curve, so two points differ by the weights, not by the samples (the curve has no jump at its end); each
point is an honest score of the samples it was scored on, logged with its standard error and their
number (``faithfulness_samples``).
"""

from __future__ import annotations

from lightning.pytorch import Trainer

from lightning_gae.callbacks.samples import Samples, balanced_choice

__all__ = ["epoch_due", "final_explanation", "fit_part", "interim_part", "step_due", "subset_due"]


def epoch_due(trainer: Trainer, every_n_epochs: int | None, log_sanity_check: bool) -> bool:
    """Whether the validation epoch that ends explains: every ``every_n_epochs``-th of ``fit`` (None: none), every one
    of ``validate``/``test``, and the sanity check's with ``log_sanity_check``."""
    if trainer.sanity_checking:
        return log_sanity_check
    if trainer.state.fn != "fit":
        return True
    return every_n_epochs is not None and (trainer.current_epoch + 1) % every_n_epochs == 0


def step_due(global_step: int, every_n_train_steps: int | None) -> bool:
    """Whether the optimizer step ``global_step`` explains: every ``every_n_train_steps``-th (None: none)."""
    n = every_n_train_steps
    return n is not None and global_step > 0 and global_step % n == 0


def interim_part(subset: Samples, size: int, seed: int) -> Samples | None:
    """``size`` samples of ``subset`` (seeded, stratified by class when it has labels), in its order; None when
    that is all of them (the whole subset is scored at every scheduled step)."""
    if size <= 0 or size >= len(subset):
        return None
    return subset.subset(sorted(balanced_choice(subset.labels, len(subset), size, seed)))


def final_explanation(trainer: Trainer) -> bool:
    """Whether this explanation step of ``fit`` is its last: the last training batch of the last epoch, or
    ``max_steps`` reached. (A fit stopped early is found out when it ends, in ``on_train_end``.)"""
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step:
        return True
    epochs = trainer.max_epochs
    if epochs is None or epochs < 0 or trainer.current_epoch + 1 < epochs:
        return False
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return bool(progress.is_last_batch) or progress.current.ready >= trainer.num_training_batches


def subset_due(trainer: Trainer, count: int, every: int | None, subset: Samples,
               interim: Samples | None) -> Samples | None:
    """The samples the ``count``-th explanation step (from 0) scores, or None.

    ``validate``/``test`` score the whole ``subset`` at every explanation. ``fit`` scores :func:`fit_part` at the
    first explanation step and every ``every``-th after it (None: never), and at its last explanation step,
    whether scheduled or not.
    """
    if trainer.state.fn != "fit":
        return subset
    if final_explanation(trainer):
        return fit_part(subset, interim)
    if every is None or count % every:
        return None
    return fit_part(subset, interim)


def fit_part(subset: Samples, interim: Samples | None) -> Samples:
    """What ``fit`` scores: the part ``interim``, or the whole ``subset`` when there is no part."""
    return subset if interim is None else interim
