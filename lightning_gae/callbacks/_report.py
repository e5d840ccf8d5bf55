"""What GAECallback prints when a run ends: the run's metrics, each method's faithfulness, where the logs are.

Plain text, the same on every terminal and in a log file: the faithfulness rows are the Text tab's
``gae_faithfulness`` table (:func:`lightning_gae.tensorboard.summary.faithfulness_rows`), from the same scalars, each
value with its rank (:func:`lightning_gae.tensorboard.ranks.rank_labels`: tied where the errors do not tell apart),
the number of samples behind the ranks, and why every method ties where they all do
(:func:`lightning_gae.tensorboard.ranks.tie_note`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from lightning.pytorch import Trainer
from torch import Tensor

from lightning_gae.callbacks._state import RunState
from lightning_gae.callbacks._loggers import event_logs, only_dummy_loggers
from lightning_gae.methods.random import RANDOM
from lightning_gae.metrics import PERTURBATION_METRICS
from lightning_gae.tensorboard.summary import faithfulness_rows
from lightning_gae.tensorboard.ranks import FAITHFULNESS_SAMPLES, Curves, rank_labels, tie_note

__all__ = ["fit_report", "run_summary", "text_table", "whole_subset_hint", "why_no_logs", "why_not_scored"]


def whole_subset_hint(trainer: Trainer, subset_size: int | None, scores: Mapping[str, float] | None,
                      logs: Sequence[tuple[str, str]]) -> list[str]:
    """How to score the whole faithfulness subset (``subset_size`` samples), when the fit's last faithfulness scored
    only its part. (Rank zero alone: ``trainer.log_dir`` would broadcast, so the loggers' own ``logs`` are read.)"""
    if subset_size is None or not scores or scores.get(FAITHFULNESS_SAMPLES, subset_size) >= subset_size:
        return []
    lines = [f"these are {int(scores[FAITHFULNESS_SAMPLES])} of the {subset_size} samples of the faithfulness "
             f"subset (FaithfulnessOptions.interim_samples); validating scores all of them:"]
    # The final weights (those the fit's last scores were of) where a last checkpoint was kept.
    saved = trainer.checkpoint_callback
    checkpoint = getattr(saved, "last_model_path", "") or getattr(saved, "best_model_path", "") or ""
    configs = [Path(log_dir, "config.yaml") for log_dir, _ in logs if Path(log_dir, "config.yaml").is_file()]
    if checkpoint and configs:
        # LightningCLI saved the run's config there; its validate subcommand reads it back.
        lines.append(f"  lightning-gae validate --config {configs[0]} --ckpt_path {checkpoint}")
    else:
        # The fit's own model and data, as the trainer holds them after fit (whatever the user's variables are named).
        data = "datamodule=trainer.datamodule" if trainer.datamodule is not None else "dataloaders=trainer.val_dataloaders"  # type: ignore[attr-defined]  # set by Lightning at run time
        lines.append(f"  trainer.validate(trainer.lightning_module, {data}"
                     f"{', ckpt_path=' + repr(checkpoint) if checkpoint else ''})")
    return lines


def why_not_scored(trainer: Trainer, failure: str | None, metrics: Sequence[str], has_truth: bool) -> str:
    """Why the run's summary shows no faithfulness (``failure``: the reason a scoring failed, if it did)."""
    if failure is not None:
        return failure
    if only_dummy_loggers(trainer):
        return "fast_dev_run replaces the loggers with no-op ones, so the callback explains nothing"
    if not metrics and not has_truth:
        return "FaithfulnessOptions(metrics=()) and the validation batches carry no ground truth"
    if trainer.state.fn != "fit":
        return "no explanation of this run scored the samples"
    return "no explanation step scored the samples and none was due when training ended"


def why_no_logs(trainer: Trainer) -> str:
    """Why the run's summary names no event files."""
    if not trainer.loggers:
        return "the Trainer has no logger"
    if only_dummy_loggers(trainer):
        return "fast_dev_run writes no logs"
    return "no logger writes TensorBoard event files; add lightning.pytorch.loggers.TensorBoardLogger"


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """``header`` and ``rows`` as aligned lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        return (indent + "  ".join(cells)).rstrip()

    return [line(header), *(line(row) for row in rows)]


_ENDED = {"fit": "the fit ended", "validate": "the validation ended", "test": "the test ended"}


def _direction(metric: str) -> str:
    higher = getattr(PERTURBATION_METRICS.get(metric), "higher_is_better", None)
    return "" if higher is None else (" ↑" if higher else " ↓")


def fit_report(metrics: Mapping[str, float], scores: Mapping[str, float] | None, scored_on: str,
               not_scored: str, logs: Sequence[tuple[str, str]], no_logs: str, after_scores: Sequence[str] = (),
               stage: str = "fit", elsewhere: Sequence[str] = (), curves: Curves | None = None) -> str:
    """The lines printed when a fit (or a validation, a test) ends.

    Args:
        metrics: name -> value, what ``trainer.callback_metrics`` holds.
        scores: the last faithfulness scalars logged (``<metric>/<method>`` and ``.../stderr``), or None.
        scored_on: what ``scores`` were scored on, e.g. ``"256 validation samples at step 689"``.
        not_scored: why there are no ``scores``.
        logs: ``(log_dir, save_dir)`` of every logger that writes TensorBoard event files.
        no_logs: why ``logs`` is empty.
        after_scores: lines printed under the faithfulness table (e.g. how to score more samples).
        stage: ``"fit"``, ``"validate"`` or ``"test"``: the run that ended.
        elsewhere: lines on what the loggers that are not TensorBoard got.
        curves: the perturbation metrics' mean curves of ``scores``, which tell why every method ties where they do
            (:func:`~lightning_gae.tensorboard.ranks.tie_note`).
    """
    lines = ["", f"GAECallback: {_ENDED.get(stage, f'the {stage} ended')}"]
    if metrics:
        lines += ["metrics (trainer.callback_metrics):",
                  *text_table(["name", "value"], [[name, f"{value:.4g}"] for name, value in sorted(metrics.items())])]
    else:
        lines.append("metrics: the module logged none (trainer.callback_metrics is empty)")
    found = None if scores is None else faithfulness_rows(scores)
    if found is None:
        # The flags and alerts of a run that scored no faithfulness are no less its findings.
        lines += [f"faithfulness: not scored ({not_scored})", *after_scores]
    else:
        names, rows = found
        assert scores is not None  # rows were found in them
        ranks = rank_labels(scores)
        rows = [[method, *(f"{cell} {ranks[name][method]}" if cell else cell for name, cell in zip(names, cells))]
                for method, *cells in rows]
        floor = "; random is the floor" if any(row[0] == RANDOM.name for row in rows) else ""
        count = scores.get(FAITHFULNESS_SAMPLES)
        over = "" if count is None else f" over {int(count)} samples"
        note = tie_note(scores, curves)
        lines += [f"faithfulness ({scored_on}; value ± standard error and rank, #k= where the errors{over} do not tell "
                  f"methods apart{floor}):",
                  *text_table(["method", *(name + _direction(name) for name in names)], rows),
                  *([] if note is None else [f"ties: {note}"]), *after_scores]
    if logs:
        for log_dir, _ in logs:
            lines.append(f"event files: {log_dir}")
        for save_dir in dict.fromkeys(save_dir for _, save_dir in logs):
            lines.append(f"tensorboard --logdir {save_dir}")
    else:
        lines.append(f"event files: none ({no_logs})")
    return "\n".join([*lines, *elsewhere])


def run_summary(trainer: Trainer, reported: tuple[str, Mapping[str, float]] | None, not_scored: str | None,
                run: RunState, metrics: Sequence[str], after: Sequence[str] = (), elsewhere: Sequence[str] = (),
                curves: Curves | None = None) -> str:
    """The summary of the run that ended (``trainer.state.fn``): the module's metrics, ``reported`` (what the last
    faithfulness scalars were scored on, and them) or why none (``not_scored``: a failure of the whole subset's
    scoring, else the run's latest scoring failure at an explanation step), where the logs are; after
    a fit whose last scores were a part of the subset, how to score all of it; then ``after``, what the loggers
    other than TensorBoard got (``elsewhere``) and the failures; ``curves``: the mean curves of ``reported``'s scores."""
    stage = trainer.state.fn.value  # type: ignore[union-attr]  # a hook runs inside a trainer call, which sets fn
    values = {name: float(value) for name, value in trainer.callback_metrics.items()
              if isinstance(value, Tensor) and value.numel() == 1}
    scored_on, scores = reported if reported is not None else ("", None)
    logs = event_logs(trainer)
    subset = None if run.scored is None else len(run.scored)
    hint = whole_subset_hint(trainer, subset, scores, logs) if stage == "fit" else []
    has_truth = run.truth is not None or bool(run.keyed)
    # A scoring that failed at an explanation step (a validation's) is why, as much as one of the whole subset.
    failure = not_scored if not_scored is not None else run.failures.last("scoring")
    return fit_report(values, scores, scored_on, why_not_scored(trainer, failure, metrics, has_truth), logs,
                      why_no_logs(trainer), [*hint, *after], stage, elsewhere, curves) + run.failures.summary()
