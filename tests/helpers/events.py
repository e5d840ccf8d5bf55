"""TensorBoard event files read back with TensorBoard's own readers."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

# 0: keep every event of the kind, not a reservoir sample of them.
EVERYTHING = {"images": 0, "scalars": 0, "histograms": 0, "tensors": 0}


class Events:
    """An ``EventAccumulator`` over a run's directory, loaded; its methods (``Tags``, ``Images``,
    ``Scalars``, ``Tensors``, ...) are this object's, with the shortcuts the tests use beside them."""

    def __init__(self, logdir: str | Path) -> None:
        self.accumulator = EventAccumulator(str(logdir), size_guidance=EVERYTHING)
        self.accumulator.Reload()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.accumulator, name)

    def image_steps(self, tag: str) -> list[int]:
        return [e.step for e in self.accumulator.Images(tag)]

    def scalar_steps(self, tag: str) -> list[int]:
        return [e.step for e in self.accumulator.Scalars(tag)]

    def scalar_values(self) -> dict[str, list[float]]:
        """``{tag: [value, ...]}`` for every scalar tag."""
        return {tag: [e.value for e in self.accumulator.Scalars(tag)] for tag in self.accumulator.Tags()["scalars"]}

    def scalar_events(self, prefix: str = "") -> dict[str, list[tuple[int, float]]]:
        """``{tag: [(step, value), ...]}`` for the scalar tags starting with ``prefix``."""
        return {t: [(e.step, e.value) for e in self.accumulator.Scalars(t)]
                for t in self.accumulator.Tags()["scalars"] if t.startswith(prefix)}

    def picture(self, tag: str, mode: str | None = None) -> np.ndarray:
        """The last image logged under ``tag``, decoded from its PNG (converted to ``mode`` if given)."""
        image = Image.open(io.BytesIO(self.accumulator.Images(tag)[-1].encoded_image_string))
        return np.asarray(image if mode is None else image.convert(mode))

    def tensor(self, tag: str) -> np.ndarray:
        """The last tensor logged under ``tag``."""
        return tensor_util.make_ndarray(self.accumulator.Tensors(tag)[-1].tensor_proto)


def read_events(logdir: str | Path) -> Events:
    """Every image, scalar, histogram and tensor event of the run in ``logdir``."""
    return Events(logdir)


def read_plugin_events(logdir: str | Path) -> plugin_event_accumulator.EventAccumulator:
    """The tensors as TensorBoard's plugins see them (with their plugin metadata)."""
    acc = plugin_event_accumulator.EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc
