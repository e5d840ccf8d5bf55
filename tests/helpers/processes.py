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

__all__ = ["ROOT", "free_port", "get_json", "interrupt_python", "leave_together", "python_env", "run_python", "run_script",
           "tensorboard_server"]


def python_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH and one OpenMP thread per process."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def leave_together() -> None:
    """The end of a multi-process script, on every rank: meet, tear the process group down, flush and exit at once,
    not through the interpreter's finalization.

    A gloo worker thread can still be releasing the last collectives it ran (a barrier holds the collectives before
    it, whose tensors have Python objects) when the main thread finalizes; the thread then waits for the GIL that
    Python has given up, is made to exit, and the process aborts: "terminate called without an active exception"
    (gdb on the core: ``ProcessGroupGloo::runLoop`` -> ``~AsyncBarrierWork`` -> ``~AsyncAllgatherWork`` -> Python
    decref -> ``take_gil`` -> ``pthread_exit`` -> ``std::terminate``). Seen in about one run of ten on a loaded
    machine, after the script's work was done. ``os._exit`` leaves before any of that runs.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def interrupt_python(args: Sequence[str], cwd: str | Path, when: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python *args`` in its own process group, given Ctrl-C (SIGINT to the whole group, as a terminal sends it) as
    soon as ``when`` appears on its stderr; fails if it ends before that. Returns what it printed and its exit code."""
    import threading
    import time

    # SIGINT as a terminal leaves it: a shell's background job (`pytest ... &`) starts with SIGINT ignored, which the
    # child would inherit, and Python installs no KeyboardInterrupt handler for an ignored signal.
    proc = subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, env=python_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out: list[bytes] = []
    err: list[bytes] = []
    seen = threading.Event()
    wanted = when.encode()

    def read_err() -> None:
        # Whole chunks as they come: a byte at a time fell behind a fast child's progress bars, which then had finished
        # by the time the line was seen. The line is looked for across the end of the previous chunk too.
        tail = b""
        while chunk := os.read(proc.stderr.fileno(), 1 << 16):
            err.append(chunk)
            tail = tail[-len(wanted):] + chunk
            if wanted in tail:
                seen.set()

    readers = [threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),
               threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        while not seen.wait(0.01):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{when!r} never appeared on stderr before it ended:\n"
                                     f"{b''.join(err).decode(errors='replace')[-3000:]}")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, b"".join(out).decode(errors="replace"),
                                       b"".join(err).decode(errors="replace"))


def run_script(directory: Path, source: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``source`` (dedented) as ``directory/script.py directory`` from ``directory``; it must succeed."""
    script = directory / "script.py"
    script.write_text(textwrap.dedent(source))
    done = run_python([script, directory], cwd=directory, timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done


# A Trainer on two CPU processes with tensor parallelism, which GAECallback refuses in setup; each rank writes what
# stopped it to rank_<r>.json in argv[1].
TENSOR_PARALLEL_SCRIPT = """
    import json, sys
    import torch
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import ModelParallelStrategy
    from lightning_gae.callbacks import GAECallback
    from recipes.digits import DigitsDataModule
    from tests.helpers.models import RankOneFails, small_vit

    trainer = Trainer(logger=False, callbacks=[GAECallback()], accelerator="cpu", devices=2, max_epochs=1,
                      strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    try:
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
        stopped = None
    except ValueError as err:
        stopped = str(err)
    with open(f"{sys.argv[1]}/rank_{trainer.global_rank}.json", "w") as f:
        json.dump({"stopped": stopped, "steps": trainer.global_step}, f)
"""
