"""What GAECallback prints when a fit ends: the run's metrics, each method's faithfulness, where the logs are.

Plain text, the same on every terminal and in a log file: the faithfulness rows are the Text tab's
``gae_faithfulness`` table (:func:`lightning_gae.tensorboard.summary.faithfulness_rows`), from the same scalars.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightning_gae.metrics import PERTURBATION_METRICS
from lightning_gae.tensorboard.summary import faithfulness_rows

__all__ = ["fit_report", "text_table"]


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
               stage: str = "fit") -> str:
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
    """
    lines = ["", f"GAECallback: {_ENDED.get(stage, f'the {stage} ended')}"]
    if metrics:
        lines += ["metrics (trainer.callback_metrics):",
                  *text_table(["name", "value"], [[name, f"{value:.4g}"] for name, value in sorted(metrics.items())])]
    else:
        lines.append("metrics: the module logged none (trainer.callback_metrics is empty)")
    found = None if scores is None else faithfulness_rows(scores)
    if found is None:
        lines.append(f"faithfulness: not scored ({not_scored})")
    else:
        names, rows = found
        floor = "; random is the floor" if any(row[0] == "random" for row in rows) else ""
        lines += [f"faithfulness ({scored_on}; value ± standard error{floor}):",
                  *text_table(["method", *(name + _direction(name) for name in names)], rows), *after_scores]
    if logs:
        for log_dir, _ in logs:
            lines.append(f"event files: {log_dir}")
        for save_dir in dict.fromkeys(save_dir for _, save_dir in logs):
            lines.append(f"tensorboard --logdir {save_dir}")
    else:
        lines.append(f"event files: none ({no_logs})")
    return "\n".join(lines)
