"""The package as a user installs it: a wheel, outside the checkout, run from an empty directory."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """The wheel built from this checkout, installed with no dependencies into a folder of its own."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root),
                    str(REPO)], check=True, capture_output=True)
    wheel = next(root.glob("lightning_gae-*.whl"))
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    return wheel, site


@pytest.mark.slow
def test_the_wheel_ships_the_library_only(installed_wheel):
    wheel, _ = installed_wheel
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "lightning_gae" in tops
    assert not tops & {"benchmarks", "recipes", "configs", "tests"}
    assert not any(name.startswith("lightning_gae/bench") for name in zipfile.ZipFile(wheel).namelist())


@pytest.mark.slow
def test_the_installed_command_needs_no_checkout(installed_wheel, tmp_path):
    # The bench measures the repository's recipes and is its script (python -m benchmarks.bench); the installed
    # command offers only what runs from anywhere.
    _, site = installed_wheel
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    # The installed copy, not the checkout's: the console script of the wheel, from a directory with nothing in it.
    where = subprocess.run([sys.executable, "-c", "import lightning_gae; print(lightning_gae.__file__)"], cwd=empty,
                           env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site))
    done = subprocess.run([str(site / "bin" / "lightning-gae"), "--help"], cwd=empty, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    assert listed == {"fit", "validate", "test", "predict", "compare"}
