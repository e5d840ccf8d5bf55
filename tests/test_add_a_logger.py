"""docs/guides/add-a-logger.md runs as it is: its Python blocks, in order, in one namespace (their asserts are the
checks: a logger of the reader's own gets the scalars and the pictures of a real fit)."""

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "add-a-logger.md"


def blocks() -> list[str]:
    """The guide's Python blocks, each padded with blank lines to its place in the page (a failure names its line)."""
    text = GUIDE.read_text()
    return ["\n" * text[:found.start(1)].count("\n") + found.group(1)
            for found in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)]


def test_the_guide_has_its_three_blocks():
    assert [b.lstrip("\n").splitlines()[0] for b in blocks()] == ["from typing import Any", "import warnings",
                                                     "steps = [step for step, _ in logger.scalars[\"positive_perturbation_auc/gae\"]]"]


@pytest.mark.slow  # a fit with the callback
def test_the_guide_runs(tmp_path, monkeypatch):
    pytest.importorskip("sklearn")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "add_a_logger"}
    for block in blocks():
        exec(compile(block, str(GUIDE), "exec"), namespace)
    assert namespace["logger"].scalars
