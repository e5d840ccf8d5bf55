"""The base of the metrics whose value is a dict of named values (segmentation, rationales, stability)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor
from torchmetrics import Metric

__all__ = ["DictMetric"]


class DictMetric(Metric):
    """A metric whose value is a dict of named values, all higher-is-better."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def plot(self, val: dict[str, Tensor] | Sequence[dict[str, Tensor]] | None = None, ax: Any = None) -> Any:
        """Plot every value of the result (or of a sequence of results); returns ``(figure, axes)``."""
        return self._plot(val, ax)
