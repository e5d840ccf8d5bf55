"""One TensorBoard run per method, so that TensorBoard's charts give every method its own colour and name it.

TensorBoard colours a chart's lines by *run*: its Scalars cards and the Custom Scalars multi-line
charts (whose series are named ``<tag> (<run>)`` and coloured by the run parsed back out of that
name) draw every tag of one run in that run's colour. The loggers' ``<metric>/<method>`` scalars all
live in the Trainer's run, so a chart of several methods would be one colour. Each method therefore
also gets a run of its own, a folder ``methods/<method>`` inside the logger's, holding the method's
scalars under one tag per metric:

* ``gae_faithfulness/<metric>`` and ``gae_faithfulness/<metric>/stderr`` (``random`` and Captum
  baselines included), at the steps where the faithfulness subset was scored;
* ``gae_relevance/<scalar>`` for :data:`RELEVANCE_SCALARS`, at every explanation step.

A Scalars card or Custom Scalars chart of ``gae_faithfulness/<metric>`` then holds one line per
method, each in its run's colour, and TensorBoard's run list (and a Custom Scalars chart's list of
matches) is the legend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.utils.tensorboard.writer import FileWriter

__all__ = ["FAITHFULNESS_GROUP", "METHODS_FOLDER", "REGION_GROUP", "RELEVANCE_GROUP", "RELEVANCE_SCALARS", "MethodRuns",
           "is_faithfulness", "method_tag", "restart_event", "scalar_group"]

METHODS_FOLDER = "methods"
"""The folder, inside a logger's log dir, that holds one run per method."""
FAITHFULNESS_GROUP = "gae_faithfulness"
RELEVANCE_GROUP = "gae_relevance"

RELEVANCE_SCALARS = ("relevance_concentration", "relevance_stability_spearman", "relevance_stability_topk_overlap")
"""Scalars about the relevance itself (not faithfulness): charted in their own Custom Scalars category."""
REGION_GROUP = "gae_regions"
REGION_PREFIX = "region_"


def scalar_group(metric: str) -> str:
    """The group a ``<metric>/<method>`` scalar is charted in: relevance statistics, declared regions
    (``region_share_<region>``, ``region_recall_<region>``: plausibility, not faithfulness), or faithfulness."""
    if metric in RELEVANCE_SCALARS:
        return RELEVANCE_GROUP
    return REGION_GROUP if metric.startswith(REGION_PREFIX) else FAITHFULNESS_GROUP


def is_faithfulness(metric: str) -> bool:
    """Whether a ``<metric>/<method>`` scalar is a faithfulness score (ranked, tabled, on the GAE tab's curves)."""
    return scalar_group(metric) == FAITHFULNESS_GROUP


def method_tag(tag: str) -> tuple[str, str] | None:
    """``(method, tag in the method's run)`` of a logged scalar ``<metric>/<method>[/stderr]``; None for others."""
    parts = tag.split("/")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "stderr"):
        return None
    metric, method = parts[:2]
    return method, "/".join([scalar_group(metric), metric, *parts[2:]])


def _log_dir(writer: Any) -> str | None:
    get_logdir = getattr(writer, "get_logdir", None)
    folder = get_logdir() if callable(get_logdir) else getattr(writer, "logdir", None)
    return str(folder) if folder else None


def restart_event(step: int) -> Event:
    """What ``SummaryWriter(purge_step=step)`` writes: TensorBoard drops the events of the run it has read at ``step``
    and after, those a crashed fit logged past the checkpoint it is resumed from (the resumed fit logs them again)."""
    return Event(step=step, session_log=SessionLog(status=SessionLog.START))


class MethodRuns:
    """The per-method runs of every writer: ``write`` a step's scalars, ``close`` when a run (fit, validate) ends."""

    def __init__(self) -> None:
        self._writers: dict[tuple[str, str], FileWriter] = {}

    def write(self, writer: Any, step: int, scalars: Mapping[str, float]) -> None:
        """Each ``<metric>/<method>[/stderr]`` of ``scalars`` into ``<writer's log dir>/methods/<method>``, flushed."""
        folder = _log_dir(writer)
        if folder is None:
            return
        by_method: dict[str, list[Summary.Value]] = {}
        for tag, value in scalars.items():
            found = method_tag(tag)
            if found is not None:
                by_method.setdefault(found[0], []).append(Summary.Value(tag=found[1], simple_value=float(value)))
        for method, values in by_method.items():
            key = (folder, method)
            if key not in self._writers:
                self._writers[key] = FileWriter(os.path.join(folder, METHODS_FOLDER, method))
            self._writers[key].add_summary(Summary(value=values), step)
            self._writers[key].flush()

    def restart(self, writer: Any, step: int) -> None:
        """A fit resumed at ``step`` into the writer's run: each method's run that exists drops what the interrupted
        fit logged at ``step`` and after (:func:`restart_event`, in the file its next ``write`` goes to)."""
        folder = _log_dir(writer)
        if folder is None or not os.path.isdir(runs := os.path.join(folder, METHODS_FOLDER)):
            return
        for method in sorted(os.listdir(runs)):
            if os.path.isdir(os.path.join(runs, method)):
                key = (folder, method)
                if key not in self._writers:
                    self._writers[key] = FileWriter(os.path.join(runs, method))
                self._writers[key].add_event(restart_event(step))
                self._writers[key].flush()

    def close(self) -> None:
        """Close every event file (a later ``write`` opens a new one in the same run)."""
        for file_writer in self._writers.values():
            file_writer.close()
        self._writers.clear()
