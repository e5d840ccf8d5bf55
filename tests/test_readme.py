"""The README's quickstart is what CI runs: the marked commands must be the ones users see; the first installs only
what the main job needs, the second installs the test extras itself."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _commands():
    text = README.read_text()
    install = re.search(r"^<!-- ci:install -->(.+)$", text, re.M).group(1)
    tests = re.search(r"^<!-- ci:test -->(.+)$", text, re.M).group(1)
    block = text.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    return install, tests, block


def test_ci_commands_are_the_quickstart_commands():
    install, tests, block = _commands()
    assert len(block) == 2, "the quickstart is exactly two commands"
    assert block[0].startswith(install + " && lightning-gae fit --config configs/vit_digits.yaml")
    assert block[1] == tests
    assert "-c constraints.txt" in install
    # .ci/run reads both markers and runs the test command's install before ruff and mypy, its pytest last.
    ci = (ROOT / ".ci" / "run").read_text()
    assert "s/^<!-- ci:install -->//p" in ci and "s/^<!-- ci:test -->//p" in ci
    assert ci.index('eval "$test_install"') < ci.index("\nruff check") < ci.index("\nmypy") < ci.index('eval "$test_run"')


def test_the_first_command_installs_the_main_job_only_and_the_second_the_test_extras():
    # The quickstart's install was the dev extra (wandb, mlflow, comet-ml, triton, transformers: about 6 minutes).
    install, tests, _ = _commands()
    extras = re.fullmatch(r'pip install -c constraints\.txt -e "\.\[([a-z,]+)\]"', install).group(1).split(",")
    assert extras == ["recipes"], extras
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    recipes = project["optional-dependencies"]["recipes"]
    assert [re.split(r"[<>=]", r)[0] for r in recipes] == ["scikit-learn"], recipes
    test_install, _, test_run = tests.rpartition(" && ")
    assert test_install == 'pip install -q -c constraints.txt -e ".[dev]"' and test_run == "python -m pytest -q"
    dev = {re.split(r"[<>=;\[ ]", r)[0] for r in project["optional-dependencies"]["dev"]}
    assert {"pytest", "ruff", "mypy", "scikit-learn"} <= dev, dev
