import json

import pytest
import torch

from benchmarks import bench
from lightning_gae import explain
from tests.helpers.models import TinyViT


@pytest.mark.slow  # every case runs in processes of its own: about two minutes
def test_quick_bench_writes_every_case_and_method(tmp_path, capsys):
    output = tmp_path / "bench.json"
    bench.main(["--quick", "--output", str(output)])
    rows = json.loads(output.read_text())["results"]
    for row in rows:
        assert set(row) == {"case", "method", "batch", "tokens", "seconds", "peak_memory_mb", "cpu_seconds"}
        assert isinstance(row["case"], str) and isinstance(row["method"], str)
        assert isinstance(row["batch"], int) and isinstance(row["tokens"], int)
        assert row["batch"] > 0 and row["tokens"] > 0
        assert row["seconds"] > 0 and row["peak_memory_mb"] > 0 and row["cpu_seconds"] > 0
    expected = {(c.name, m) for c in bench.quick_cases() for m in c.methods}
    assert {(r["case"], r["method"]) for r in rows} == expected
    assert len(rows) == len(expected)
    assert {"vit", "bert", "flow", "llama", "main_job"} == {name for name, _ in expected}
    # The main job's shape comes from its config: 8x8 digits in 2x2 patches plus CLS, batch 64.
    assert {(r["batch"], r["tokens"]) for r in rows if r["case"] == "main_job"} == {(64, 17)}
    table = capsys.readouterr().out
    for label in ("gae / saliency", "integrated_gradients / gae", "per_sample_loop / gae",
                  "peak memory gae / forward_backward", "fit_with_callback / fit_without_callback",
                  "attention_flow / gae", "attnlrp / gae", "transformer_attribution / gae", "attnlrp / gae (vit batch 2, N=17)",
                  "transformer_attribution / gae (vit batch 2, N=17)", "llama gae / forward_backward (batch 1, N=64)",
                  "llama peak memory gae / forward_backward (batch 1, N=64)"):
        assert label in table


def test_gae_matrix_rows_are_explains_gae_rows():
    torch.manual_seed(0)
    model = TinyViT()
    x = torch.rand(3, 1, 8, 8)
    exp = explain(model, x)
    rows = bench.gae_matrix_rows(model, x, exp.target)
    # explain hides the query's own identity entry; the matrix row keeps it.
    assert torch.allclose(rows[:, 1:], exp.tokens[:, 1:], atol=1e-6)
    assert torch.all(rows[:, 0] >= 1)


def test_peak_memory_counts_what_a_call_allocates_and_not_what_was_freed_before():
    memory = bench._PeakMemory(torch.device("cpu"))
    big = torch.ones(64, 2**20)  # 256 MiB, freed before the baseline
    del big
    memory.reset()
    small = torch.ones(2**18)
    assert memory.peak_mb() < 64
    del small
    memory.reset()
    big = torch.ones(64, 2**20)
    assert memory.peak_mb() > 240
    del big


def test_ratio_report_reads_targets_in_their_direction():
    def rows(case, batch, tokens, **seconds):
        return [{"case": case, "method": m, "batch": batch, "tokens": tokens, "seconds": s,
                 "peak_memory_mb": 100.0 * s} for m, s in seconds.items()]

    model = dict(forward_backward=1.0, gae=2.0, gae_matrix=3.0, per_sample_loop=8.0, rollout=1.0,
                 saliency=4.0, integrated_gradients=40.0)
    report = bench.ratio_report(rows("vit", 64, 257, **model) + rows("bert", 1, 2049, **model)
                                + [{**row, "cpu_seconds": {"fit_without_callback": 20.0}.get(row["method"], 23.0)}
                                   for row in rows("main_job", 64, 17, fit_without_callback=10.0, fit_with_callback=10.8)])
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines()}
    assert "| 0.50 | <= 1.0 | yes |" in lines["gae / saliency (vit batch 64, N=257)"]
    assert "| 2.00 | <= 1.2 | no |" in lines["gae / forward_backward (vit batch 64, N=257)"]
    assert "| 20.00 | >= 35 | no |" in lines["integrated_gradients / gae (vit batch 64, N=257)"]
    assert "| 4.00 | >= 3 | yes |" in lines["per_sample_loop / gae (vit batch 64, N=257)"]
    assert "| 2.00 | <= 1.5 | no |" in lines["peak memory gae / forward_backward (bert batch 1, N=2049)"]
    # CPU seconds where the rows have them (the main job's here): the same ratio in the last column, else "-".
    assert "| 1.08 | <= 1.10 | yes | 1.15 |" in lines["main_job fit_with_callback / fit_without_callback"]
    assert "| 0.50 | <= 1.0 | yes | - |" in lines["gae / saliency (vit batch 64, N=257)"]
    assert "| vit | 64 | 257 | 1 s / 100 MB | 2.00x / 2.00x |" in report


def test_llama_targets_are_read_at_every_prompt_length():
    llama = {1024: dict(forward_backward=1.0, gae=1.4, rollout=2.0, attnlrp=3.0),
             4096: dict(forward_backward=1.0, gae=1.6, rollout=2.0, attnlrp=3.0)}
    report = bench.ratio_report([{"case": "llama", "method": m, "batch": 1, "tokens": n, "seconds": t, "peak_memory_mb": 100.0}
                                 for n, methods in llama.items() for m, t in methods.items()])
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines()}
    assert "| 1.40 | <= 1.5 | yes |" in lines["llama gae / forward_backward (batch 1, N=1024)"]
    assert "| 1.60 | <= 1.5 | no |" in lines["llama gae / forward_backward (batch 1, N=4096)"]


def test_tokens_selects_settings_and_names_a_missing_one(capsys):
    chosen = bench.select_cases(bench.full_cases(), ["llama"], [1024, 4096])
    assert [(c.name, c.tokens) for c in chosen] == [("llama", 1024), ("llama", 4096)]
    assert {c.tokens for c in bench.select_cases(bench.full_cases(), ["vit"])} == {65, 257}
    with pytest.raises(SystemExit):
        bench.main(["--cases", "llama", "--tokens", "999"])
    assert "no llama case has N in [999]" in capsys.readouterr().err


def test_integrated_gradients_runs_in_internal_batches_of_about_64x257_tokens():
    # 2 samples of 1025 tokens: 16 rows (8 steps of the batch) fit 64 x 257 tokens, so 50 steps take 7 forwards.
    case = bench.Case("vit", 2, 1025, {"dim": 8, "depth": 1, "heads": 1})
    torch.manual_seed(0)
    subject = bench._vit(case, torch.device("cpu"))
    rows = []
    subject.model.register_forward_hook(lambda module, args, output: rows.append(args[0].shape[0]))
    target = torch.zeros(2, dtype=torch.long)
    bench._model_methods(subject, target)["integrated_gradients"]()
    assert max(rows) * case.tokens <= 64 * 257
    assert sum(rows) == 2 * 50 and len(rows) == 7


def test_methods_selects_what_the_model_cases_measure_besides_the_floors():
    chosen = bench.select_cases(bench.full_cases(), ["llama", "main_job"], None, ["rollout"])
    llama = [c for c in chosen if c.name == "llama"]
    assert llama and all(c.methods == ("forward_backward", "gae", "rollout") for c in llama)
    # The main job's fits are not model methods: unchanged.
    assert [c.methods for c in chosen if c.name == "main_job"] == [bench.FIT_METHODS]
    # A method left out reads "-" in the tables, and the targets that need it are left out, not failed.
    report = bench.ratio_report([{"case": "llama", "method": m, "batch": 1, "tokens": 8192, "seconds": t, "peak_memory_mb": 100.0}
                                 for m, t in (("forward_backward", 2.0), ("gae", 2.5), ("rollout", 9.0))]
                                + [{"case": "vit", "method": m, "batch": 64, "tokens": 257, "seconds": t, "peak_memory_mb": 100.0}
                                   for m, t in (("forward_backward", 1.0), ("gae", 0.9))])
    assert "| llama | 1 | 8192 | 1.25x, 1.00x | 4.50x | - |" in report
    assert "| vit | 64 | 257 | 1 s / 100 MB | 0.90x / 1.00x | - | - | - | - | - |" in report
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines()}
    assert "| 1.25 | <= 1.5 | yes |" in lines["llama gae / forward_backward (batch 1, N=8192)"]
    assert "| 0.90 | <= 1.2 | yes |" in lines["gae / forward_backward (vit batch 64, N=257)"]
    assert not any(label.startswith("gae / saliency") for label in lines)


def test_gpu_sizes_and_the_kernels_table_and_targets():
    # --sizes gpu: issue 24's sizes; --methods gae_triton adds the kernel (only when named) to the model cases.
    cases = bench.select_cases(bench.gpu_cases(), ["vit", "bert", "llama"], None, ["gae_triton", "saliency"])
    assert [(c.name, c.batch, c.tokens) for c in cases] == [("vit", 64, 197), ("bert", 8, 512), ("bert", 1, 4096),
                                                            ("llama", 1, 8192)]
    assert cases[0].methods == ("forward_backward", "gae", "saliency", "gae_triton")
    assert "gae_triton" not in bench.select_cases(bench.gpu_cases(), ["vit"], None, None)[0].methods
    rows = [{"case": "vit", "method": m, "batch": 64, "tokens": 197, "seconds": t, "peak_memory_mb": mb}
            for m, t, mb in (("forward_backward", 1.0, 100.0), ("gae", 1.5, 120.0), ("saliency", 1.2, 110.0),
                             ("gae_triton", 1.1, 105.0))]
    rows += [{"case": "llama", "method": m, "batch": 1, "tokens": 8192, "seconds": t, "peak_memory_mb": mb}
             for m, t, mb in (("forward_backward", 2.0, 1000.0), ("gae", 2.4, 1400.0), ("gae_triton", 2.2, 1300.0))]
    report = bench.ratio_report(rows)
    assert "| vit | 64 | 197 | 0.73x, 0.88x | 1.10x, 1.05x | 0.92x |" in report
    assert "| llama | 1 | 8192 | 0.92x, 0.93x | 1.10x, 1.30x | - |" in report
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines()}
    assert "| 0.92 | <= 1.0 | yes |" in lines["gae_triton / saliency (vit batch 64, N=197)"]
    assert "| 1.30 | <= 1.2 | no |" in lines["peak memory gae_triton / forward_backward (llama batch 1, N=8192)"]
    assert "gae_triton / saliency (llama batch 1, N=8192)" not in lines  # no saliency measured there


def test_the_fa2_kernel_has_its_own_table_and_issue_35s_targets():
    cases = bench.select_cases(bench.gpu_cases(), ["vit", "llama"], None, ["gae_triton", "gae_triton2", "saliency"])
    assert cases[0].methods == ("forward_backward", "gae", "saliency", "gae_triton", "gae_triton2")
    rows = [{"case": "vit", "method": m, "batch": 64, "tokens": 197, "seconds": t, "peak_memory_mb": 100.0}
            for m, t in (("forward_backward", 1.0), ("gae", 1.5), ("saliency", 1.0), ("gae_triton2", 1.04))]
    rows += [{"case": "bert", "method": m, "batch": 1, "tokens": 4096, "seconds": t, "peak_memory_mb": 100.0}
             for m, t in (("forward_backward", 1.0), ("gae", 1.5), ("saliency", 1.0), ("gae_triton2", 1.08))]
    rows += [{"case": "llama", "method": m, "batch": 1, "tokens": 8192, "seconds": t, "peak_memory_mb": mb}
             for m, t, mb in (("forward_backward", 2.0, 1000.0), ("gae", 2.0, 1400.0), ("gae_triton2", 1.9, 1100.0))]
    report = bench.ratio_report(rows)
    assert "| the FA2-shaped kernel | batch | N | gae_triton2 / gae (time, memory) |" in report
    assert "| the Triton kernel |" not in report  # no first-kernel rows: no table for it
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines()}
    assert "| 1.04 | <= 1.05 | yes |" in lines["gae_triton2 / saliency (vit batch 64, N=197)"]
    assert "| 1.08 | <= 1.10 | yes |" in lines["gae_triton2 / saliency (bert batch 1, N=4096)"]
    assert "| 0.95 | <= 0.9 | no |" in lines["gae_triton2 / gae (llama batch 1, N=8192)"]
    assert "| 1.10 | <= 1.2 | yes |" in lines["peak memory gae_triton2 / forward_backward (llama batch 1, N=8192)"]


def test_the_gpu_profile_script_says_it_needs_a_gpu_where_there_is_none():
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the script would profile it")
    script = Path(bench.__file__).with_name("profile_gpu.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "needs a CUDA GPU" in done.stderr
