"""Where ``gae``'s time goes next to Captum's ``saliency`` on a GPU: ``python3 benchmarks/profile_gpu.py`` from the
repository root (``bash benchmarks/kernel_gpu.sh profile`` brings Captum where it is missing).

For BERT-base at N = 512 (batch 8) and N = 4096 (batch 1), as ``python -m benchmarks.bench --sizes gpu`` builds them: each
method's wall time per call, then ``torch.profiler``'s tables of one call (by GPU time, and by host time, where the
host's waits for the GPU show as ``cudaStreamSynchronize``). When the GPU time of ``gae`` and ``saliency`` is close
and the wall time is not, the difference is on the host: launches, Python, or copies that wait for the GPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench import Case, _bert, _logits, _model_methods  # noqa: E402


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/profile_gpu.py needs a CUDA GPU")
    device = torch.device("cuda")
    for batch, tokens in ((8, 512), (1, 4096)):
        torch.manual_seed(0)
        subject = _bert(Case("bert", batch, tokens, {"hidden": 768, "layers": 12, "heads": 12}), device)
        with torch.no_grad():
            subject.model.eval()
            target = _logits(subject.model, subject.inputs).argmax(-1)
        runs = _model_methods(subject, target)
        for method in ("saliency", "gae", "gae_chunks", "forward_backward"):
            run = runs[method]
            for _ in range(3):
                run()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(5):
                run()
            torch.cuda.synchronize()
            print(f"### bert batch {batch} N={tokens} {method}: {1e3 * (time.perf_counter() - start) / 5:.2f} ms per call",
                  flush=True)
            if method in ("saliency", "gae"):
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    run()
                    torch.cuda.synchronize()
                averages = prof.key_averages()
                print(averages.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60))
                print(averages.table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
