"""``lightning-gae bench``: the cost of an explanation relative to one training step's forward+backward.

Speed targets are read from this benchmark, never from timed assertions in tests. It reports
ratios measured in one process on one batch (absolute seconds depend on the machine):
``explain(method) / (forward + backward)`` for each method, and the peak memory ratio on CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from lightning_gae.explain import METHODS, explain


def _median_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up: allocator, lazy init
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(
    batch_size: int = 64,
    image_size: int = 32,
    patch_size: int = 4,
    dim: int = 192,
    depth: int = 6,
    heads: int = 3,
    methods: Sequence[str] = METHODS,
    repeats: int = 5,
    device: str = "cpu",
) -> dict:
    """Time ``explain`` against forward+backward of the same batch on a small ViT (``recipes.vit.ViT``)."""
    from recipes.vit import ViT

    torch.manual_seed(0)
    model = ViT(image_size=image_size, patch_size=patch_size, in_chans=3, num_classes=10, dim=dim,
                depth=depth, heads=heads, dropout=0.0).to(device)
    x = torch.rand(batch_size, 3, image_size, image_size, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def train_step() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    result: dict = {
        "model": {"image_size": image_size, "patch_size": patch_size, "tokens": (image_size // patch_size) ** 2 + 1,
                  "dim": dim, "depth": depth, "heads": heads},
        "batch_size": batch_size,
        "device": device,
        "torch": torch.__version__,
    }
    base = _median_seconds(train_step, repeats, sync)
    model.zero_grad(set_to_none=True)
    result["ratio_to_forward_backward"] = {
        m: round(_median_seconds(lambda m=m: explain(model, x, method=m), repeats, sync) / base, 3) for m in methods
    }
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        train_step()
        step_peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        explain(model, x)
        result["gae_peak_memory_ratio"] = round(torch.cuda.max_memory_allocated() / step_peak, 3)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lightning-gae bench", description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--dim", type=int, default=192)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    print(json.dumps(run(**{k: v for k, v in vars(args).items()}), indent=2))
