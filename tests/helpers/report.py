"""GAECallback's printed summary read back (tests/callbacks/test_report.py, the CLI's tests): its header, its aligned
tables, and its numbers against the logged ones."""

from __future__ import annotations

import math
import re

HEADER = "GAECallback: the fit ended"


def section(text: str, start: str) -> list[list[str]]:
    """The rows of the aligned table under the line starting with ``start`` (its header row first), split into cells."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    rows = []
    for line in lines[first + 1:]:
        if not line.startswith("  "):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def value_and_error(cell: str) -> tuple[float, float | None]:
    """A faithfulness cell's value and standard error, its rank (``#k``, ``#k=``) left out."""
    value, _, error = re.sub(r"\s+#\d+=?$", "", cell).partition(" ± ")
    return float(value), float(error) if error else None


def assert_printed_as_logged(printed: str, logged: float, digits: int) -> None:
    """``printed`` is ``logged`` to the ``digits`` significant digits it is printed with (the event file keeps float32)."""
    assert math.isclose(float(printed), logged, rel_tol=10 ** (1 - digits), abs_tol=1e-9), (printed, logged)
