"""The README's quickstart is what CI runs: the marked commands must be the ones users see."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_ci_commands_are_the_quickstart_commands():
    text = README.read_text()
    install = re.search(r"^<!-- ci:install -->(.+)$", text, re.M).group(1)
    tests = re.search(r"^<!-- ci:test -->(.+)$", text, re.M).group(1)
    block = text.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2, "the quickstart is exactly two commands"
    assert block[0].startswith(install + " && ")
    assert block[1] == tests
    assert "-c constraints.txt" in install
