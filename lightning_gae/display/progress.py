"""Progress on a terminal: ``lightning-gae compare``'s bar per attribution method."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

__all__ = ["MethodBars"]


class MethodBars:
    """``compare``'s progress (:data:`lightning_gae.compare.Progress`) as one tqdm bar per method on stderr: samples
    scored, their rate and the time left; remembers which methods finished."""

    def __init__(self, methods: Sequence[str]) -> None:
        self.methods = list(methods)
        self.finished: list[str] = []
        self.writing = False
        self._bar: Any = None

    def __call__(self, method: str, done: int, total: int) -> None:
        if done == 0:
            self.close()
            where = f"[{self.methods.index(method) + 1}/{len(self.methods)}]"
            self._bar = tqdm(total=total, desc=f"{method} {where}", unit="sample", file=sys.stderr, dynamic_ncols=True)
        self._bar.update(done - self._bar.n)
        if done == total:
            self.finished.append(method)
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
