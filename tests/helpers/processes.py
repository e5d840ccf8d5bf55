"""Other processes: Python scripts and commands in their own process group, a real ``tensorboard``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from recipes.tensorboard_screenshots import free_port, get_json, tensorboard_server

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "free_port", "get_json", "python_env", "run_python", "run_script", "tensorboard_server"]


def python_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH and one OpenMP thread per process."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def run_python(args: Sequence[str], cwd: str | Path, timeout: float = 240,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python *args`` in its own session; on a timeout every process it started is killed, then it raises."""
    proc = subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, env=dict(python_env() if env is None else env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_script(directory: Path, source: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``source`` (dedented) as ``directory/script.py directory`` from ``directory``; it must succeed."""
    script = directory / "script.py"
    script.write_text(textwrap.dedent(source))
    done = run_python([script, directory], cwd=directory, timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done
