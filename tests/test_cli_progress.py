"""What ``lightning-gae compare`` and ``python -m benchmarks.bench`` show while they run (a bar per method / case, on stderr, with the time
left) and how Ctrl-C stops them (one line saying what was done and written, exit code 130), run as a user runs them."""

import signal

import pytest
import torch
import yaml

from tests.helpers.processes import ROOT, interrupt_python, run_python

CONFIG = ROOT / "configs" / "vit_digits.yaml"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint of the main job's model as its config builds it (untrained: compare only needs its weights)."""
    from recipes.vit import ViTClassifier

    torch.manual_seed(0)
    model = ViTClassifier(**yaml.safe_load(CONFIG.read_text())["model"]["init_args"])
    path = tmp_path_factory.mktemp("checkpoint") / "model.ckpt"
    torch.save({"state_dict": model.state_dict()}, path)
    return path


def compare_args(checkpoint, output, *options):
    return ["-m", "lightning_gae.cli", "compare", "--config", CONFIG, "--ckpt_path", checkpoint, "--output", output,
            *options]


@pytest.mark.slow
def test_compare_draws_a_bar_per_method_on_stderr(checkpoint, tmp_path):
    done = run_python(compare_args(checkpoint, tmp_path / "out", "--num_samples", "24", "--batch_size", "8",
                                   "--methods", "gae", "rollout", "random", "--metrics", "deletion_auc"), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    # tqdm redraws a bar in place with carriage returns: the last drawing of each is what the terminal keeps.
    drawn = [part.strip() for part in done.stderr.replace("\n", "\r").split("\r") if "sample" in part]
    for position, method in enumerate(("gae", "rollout", "random"), start=1):
        mine = [bar for bar in drawn if bar.startswith(f"{method} [{position}/3]")]
        assert mine and mine[0].startswith(f"{method} [{position}/3]:   0%|") and " 0/24 [" in mine[0]
        assert "100%|" in mine[-1] and " 24/24 [" in mine[-1], mine[-1]
        # elapsed<remaining, then the rate.
        assert "<00:00, " in mine[-1] and ("sample/s]" in mine[-1] or "s/sample]" in mine[-1]), mine[-1]
    assert "%|" not in done.stdout, "the bars are on stderr; stdout is the table"
    assert "| gae |" in done.stdout and (tmp_path / "out" / "comparison.json").exists()


@pytest.mark.slow
def test_ctrl_c_stops_compare_with_one_line_and_exit_code_130(checkpoint, tmp_path):
    output = tmp_path / "out"
    done = interrupt_python(compare_args(checkpoint, output, "--num_samples", "256", "--batch_size", "8",
                                         "--methods", "gae", "integrated_gradients", "--metrics", "deletion_auc"),
                            cwd=ROOT, when="integrated_gradients [2/2]")
    assert done.returncode == 128 + signal.SIGINT == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last == (f"lightning-gae compare: interrupted; 1 of 2 methods scored (gae); nothing was written to {output} "
                    "(the files are written once every method is scored)")
    assert list(output.iterdir()) == []


@pytest.mark.slow  # each case runs in processes of its own
def test_bench_draws_a_bar_per_case_and_ctrl_c_stops_it_with_one_line(tmp_path):
    output = tmp_path / "bench.json"
    done = interrupt_python(["-m", "benchmarks.bench", "--quick", "--cases", "vit", "bert", "--output", output],
                            cwd=ROOT, when="[2/2] bert batch=2 tokens=33:")
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    drawn = [part.strip() for part in done.stderr.replace("\n", "\r").split("\r")]
    # The first case's bar counts its calls (each of its methods: a warm-up and one repeat) with the time left...
    from benchmarks.bench import quick_cases

    calls = 2 * len(next(c for c in quick_cases() if c.name == "vit").methods)
    first = [bar for bar in drawn if bar.startswith("[1/2] vit batch=2 tokens=17:")]
    assert first[0].startswith("[1/2] vit batch=2 tokens=17:   0%|") and f" 0/{calls} [" in first[0]
    assert any(f" {calls - 1}/{calls} [" in bar and ("call/s]" in bar or "s/call]" in bar) for bar in first), first
    # ...then its line of results; the second case was stopped.
    assert any(line.startswith("[1/2] vit batch=2 tokens=17 in ") for line in done.stderr.splitlines())
    assert done.stderr.rstrip().splitlines()[-1] == (
        "python -m benchmarks.bench: interrupted in [2/2] bert batch=2 tokens=33; 1 of 2 cases measured before it (their lines "
        "are above); nothing was written and no table printed (they wait for every case)")
    assert not output.exists() and done.stdout == ""
