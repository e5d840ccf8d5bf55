"""Fixtures for the whole suite. The helpers they hand out live in ``tests/helpers/`` (importable too,
for module-level code and parametrisation); this file only exposes them.

``-m "not slow"`` leaves out the tests marked ``slow`` (a model fitted or run with a Trainer, several processes, a
browser, a real ``tensorboard`` server, the CLI); a plain ``pytest`` runs everything.
"""

import os

# Triton kernels (lightning_gae/engine/triton_gae.py) run under Triton's CPU interpreter where there is no NVIDIA GPU. The
# switch is read when Triton is imported, which importing torch may already do, so it is set before anything else.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tests.helpers import events, processes, trainer  # noqa: E402


@pytest.fixture(scope="session")
def make_trainer():
    """``make_trainer(root, callbacks, **overrides)``: a quiet CPU Trainer logging to TensorBoard (tests/helpers/trainer.py)."""
    return trainer.make_trainer


@pytest.fixture(scope="session")
def read_events():
    """``read_events(logdir)``: every event of a run, read with TensorBoard's own reader (tests/helpers/events.py)."""
    return events.read_events


@pytest.fixture(scope="session")
def read_plugin_events():
    """``read_plugin_events(logdir)``: the tensors with their plugin metadata, as TensorBoard's plugins read them."""
    return events.read_plugin_events


@pytest.fixture(scope="session")
def run_python():
    """``run_python(args, cwd, timeout=240, env=None)``: ``python *args`` in its own process group (tests/helpers/processes.py)."""
    return processes.run_python


@pytest.fixture
def run_script(tmp_path):
    """``run_script(source, timeout=240)``: ``source`` as a script run from ``tmp_path``, which it gets as argv[1]; must succeed."""
    return lambda source, timeout=240: processes.run_script(tmp_path, source, timeout)
