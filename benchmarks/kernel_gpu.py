"""Issue 35's kernel check on a CUDA GPU: the kernels' errors at two shapes, then each variant's backward time against
SDPA's own at the four attention shapes of ``python -m benchmarks.bench --sizes gpu``. Run by ``benchmarks/kernel_gpu.sh``
(which then runs the bench), or alone from the repository root: ``python3 benchmarks/kernel_gpu.py [--quick]``.
``--smoke`` runs every step on a CPU on tiny shapes under Triton's interpreter (tests/test_triton_gae_fa2.py does,
so that the script is known to run before a GPU is lent; its numbers mean nothing).

Errors: each output (dq, dk, dv, the row update) against a float64 reference computed here from the whole score
matrix, as the largest error over the largest value. Float32 variants are held to 1e-4 (plain tf32
is shown to miss it); bfloat16 to FlashAttention's rule: at most twice the error of PyTorch's eager bf16 attention plus
1e-5 of the largest value, and the update's Spearman rank correlation with float32's >= 0.99.

Times: the median of ``triton.testing.do_bench`` (milliseconds) of one attention call's backward, the wrapper's own
work included (dO·O, the live rows); the log-sum-exp comes from the fused forward, outside the timing. ``x sdpa`` is
against SDPA's float32 backward (the memory-efficient kernel) on the same shape. The variants tell the causes apart:
``v1 ieee 16x16`` (the first kernel as the lean path runs it) against ``v1 tf32x3 16x16`` (precision) against ``v1
tf32x3 64x64`` (tile size) against ``fa2 tf32x3 atomic`` (the shape, autotuned) against ``fa2 tf32x3 loop`` (atomics)
and ``fa2 ieee`` / ``fa2 tf32`` (precision), those three on the autotuned variant's tiles.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

if "--smoke" in sys.argv:  # Triton reads the switch when imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_gae.engine import triton_gae as v1  # noqa: E402
from lightning_gae.engine import triton_gae_fa2 as fa2  # noqa: E402
from lightning_gae.engine.lean import LeanCall, LeanState, lean_attention  # noqa: E402

# (name, B, H, N, E, causal): ViT-B/16 at batch 64, BERT-base at 512 (batch 8) and 4096, the Llama-style decoder at 8k.
SHAPES = [("vit", 64, 12, 197, 64, False), ("bert512", 8, 12, 512, 64, False), ("bert4096", 1, 12, 4096, 64, False),
          ("llama8k", 1, 16, 8192, 64, True)]
ERROR_SHAPES = {"B8 H12 N512 E64 padding": (8, 12, 512, 64, False, True),
                "B1 H16 N2048 E64 causal": (1, 16, 2048, 64, True, False)}
SMOKE_SHAPES = [("tiny", 2, 2, 40, 16, False), ("tiny causal", 1, 2, 70, 16, True)]
SMOKE_ERROR_SHAPES = {"B2 H4 N96 E32 padding": (2, 4, 96, 32, False, True), "B1 H2 N70 E16 causal": (1, 2, 70, 16, True, False)}
DEVICE = torch.device("cuda")


def reference(q, k, v, dout, row, key_bias, causal, scale):
    """``(out, lse, dq, dk, dv, update)`` in float64 from the whole score matrix (autograd for the gradients)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-2, -1) * scale
    if key_bias is not None:
        s = s + key_bias.double()[:, None, None, :]
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    a = torch.softmax(s, dim=-1)
    out = a @ v
    lse = torch.logsumexp(s.detach(), dim=-1)
    do = dout.double()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    grad_a = do @ v.detach().transpose(-2, -1)
    update = torch.einsum("bq,bhqk->bk", row.double(), (grad_a * a.detach()).clamp(min=0)) / q.shape[1]
    return out.detach(), lse, dq, dk, dv, update


def eager(q, k, v, dout, row, key_bias, causal, scale):
    """PyTorch's eager attention in the inputs' dtype: FlashAttention's yardstick for half precision."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-2, -1) * scale
    if key_bias is not None:
        s = s + key_bias.to(s.dtype)[:, None, None, :]
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    a = torch.softmax(s, dim=-1)
    out = a @ v
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    grad_a = dout @ v.detach().transpose(-2, -1)
    update = torch.einsum("bq,bhqk->bk", row.to(q.dtype), (grad_a * a.detach()).clamp(min=0)) / q.shape[1]
    return dq, dk, dv, update


def spearman(a, b):
    ra, rb = (t.argsort(dim=-1).argsort(dim=-1).double() for t in (a, b))
    ra, rb = ra - ra.mean(dim=-1, keepdim=True), rb - rb.mean(dim=-1, keepdim=True)
    return ((ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))).min().item()


def inputs(b, h, n, e, padding, dtype=torch.float32, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v, dout = (torch.randn(b, h, n, e, device=DEVICE, generator=g).to(dtype) for _ in range(4))
    row = torch.rand(b, n, device=DEVICE, generator=g)
    key_bias = None
    if padding:
        key_bias = torch.zeros(b, n, device=DEVICE)
        key_bias[-1, -n // 5:] = -math.inf  # the last sample's last fifth is padding
    return q, k, v, dout, row, key_bias


def with_lse(q, k, v, key_bias, causal, scale, reference_out, reference_lse):
    """``(out, lse)`` from the fused CUDA forward, or the reference's (a CPU's smoke run)."""
    bias = None if key_bias is None else key_bias.to(q.dtype)[:, None, None, :].expand(*q.shape[:3], k.shape[-2])
    fused = fa2.forward_with_lse(q, k, v, bias, causal, scale)
    return fused if fused is not None else (reference_out.to(q.dtype), reference_lse.float())


def errors_at(failures: list[str], name: str, b: int, h: int, n: int, e: int, causal: bool, padding: bool) -> None:
    """One row per variant of :func:`errors`' table for one shape."""
    q, k, v, dout, row, key_bias = inputs(b, h, n, e, padding)
    scale = 1 / math.sqrt(e)
    out, lse, *want = reference(q, k, v, dout, row, key_bias, causal, scale)
    tops = [w.abs().max().item() for w in want]
    fused = fa2.forward_with_lse(q, k, v, None if key_bias is None else key_bias[:, None, None, :].expand(b, h, n, n),
                                 causal, scale)
    if fused is None:
        if DEVICE.type == "cuda":
            failures.append(f"{name}: forward_with_lse gave None (no fused forward)")
    else:
        lse_err = (fused[1][..., :n].double() - lse).abs().max().item()
        print(f"<!-- {name}: fused forward's log-sum-exp against float64: {lse_err:.2e}, shape {list(fused[1].shape)} -->")
    variants = {
        "v1 ieee 16x16": lambda: v1.gae_attention_backward(q, k, v, out.float(), lse.float(), dout, row, key_bias, causal, scale),
        "v1 tf32 16x16": lambda: v1.gae_attention_backward(q, k, v, out.float(), lse.float(), dout, row, key_bias, causal, scale,
                                                           precision="tf32"),
        "v1 tf32x3 16x16": lambda: v1.gae_attention_backward(q, k, v, out.float(), lse.float(), dout, row, key_bias, causal,
                                                             scale, precision="tf32x3"),
    }
    for label, kw in {"fa2 tf32x3 atomic": {}, "fa2 tf32x3 loop": {"dq": "loop"}, "fa2 tf32x3 update": {"grads": False},
                      "fa2 ieee atomic": {"precision": "ieee"}, "fa2 tf32 atomic": {"precision": "tf32"}}.items():
        # Fixed 32 x 64 tiles: one compile per variant (the errors hardly depend on the tiles; the times do).
        variants[label] = lambda kw=kw: fa2.gae_attention_backward_fa2(q, k, v, out.float(), lse.float(), dout, row,
                                                                      key_bias, causal, scale, block_q=32,
                                                                      block_k=64, **kw)
    for label, run in variants.items():
        got = run()
        errs = [float("nan") if g is None else (g.double() - w).abs().max().item() / t for g, w, t in zip(got, want, tops)]
        plain_tf32 = "tf32 " in label
        met = all(x < 1e-4 for x in errs if x == x)
        if not plain_tf32 and not met:
            failures.append(f"{name} {label}: {errs}")
        print(f"| {name} | {label} | " + " | ".join("-" if x != x else f"{x:.1e}" for x in errs)
              + f" | 1e-4{' (expected to miss)' if plain_tf32 else ''} | {'yes' if met else 'no'} |")
    # bfloat16: FlashAttention's rule against the float32 inputs' reference.
    qh, kh, vh, doh = (t.to(torch.bfloat16) for t in (q, k, v, dout))
    out_h, lse_h, *want_h = reference(qh, kh, vh, doh, row, key_bias, causal, scale)
    theirs = eager(qh, kh, vh, doh, row, key_bias, causal, scale)
    fused_h = fa2.forward_with_lse(qh, kh, vh, None if key_bias is None else
                                   key_bias.to(torch.bfloat16)[:, None, None, :].expand(b, h, n, n), causal, scale)
    lse_used = fused_h[1] if fused_h is not None else lse_h.float()
    if fused_h is None and DEVICE.type == "cuda":
        failures.append(f"{name}: forward_with_lse gave None for bfloat16")
    ours = fa2.gae_attention_backward_fa2(qh, kh, vh, out_h.to(torch.bfloat16), lse_used, doh, row, key_bias, causal,
                                          scale, block_q=32, block_k=64)
    ok = []
    cells = []
    for g, w, t in zip(ours, want_h, theirs):
        top = w.abs().max().item()
        mine, eager_err = (g.double() - w).abs().max().item(), (t.double() - w).abs().max().item()
        ok.append(mine <= 2 * eager_err + 1e-5 * top)
        cells.append(f"{mine / top:.1e} (eager {eager_err / top:.1e})")
    rank = spearman(ours[3], want_h[3])
    met = all(ok) and rank >= 0.99
    if not met:
        failures.append(f"{name} fa2 bf16: {cells}, spearman {rank:.4f}")
    print(f"| {name} | fa2 bf16 (lse from {'flash/efficient' if fused_h else 'float64'}) | " + " | ".join(cells)
          + f" | 2x eager + 1e-5, Spearman {rank:.4f} >= 0.99 | {'yes' if met else 'no'} |")


def errors(failures: list[str], shapes: dict) -> None:
    print("## Errors against float64 (largest error / largest value)\n")
    print("| shape | variant | dq | dk | dv | update | bound | met |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for name, (b, h, n, e, causal, padding) in shapes.items():
        # One shape per call: its tensors, and the closures over them, are freed before the next shape.
        errors_at(failures, name, b, h, n, e, causal, padding)
        torch.cuda.empty_cache()
    print()


def timings_at(do_bench: Callable[[Callable[[], object]], float], name: str, b: int, h: int, n: int, e: int,
               causal: bool) -> None:
    """One row per variant of :func:`timings`' table for one shape."""
    q, k, v, dout, row, _ = inputs(b, h, n, e, False)
    scale = 1 / math.sqrt(e)
    times = {}

    def sdpa_backward(dtype, backend):
        qs, ks, vs = (t.to(dtype).requires_grad_() for t in (q, k, v))
        with sdpa_kernel(backend if DEVICE.type == "cuda" else SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)
        d = dout.to(dtype)
        return lambda: torch.autograd.grad(o, (qs, ks, vs), d, retain_graph=True)

    times["sdpa fp32 (efficient)"] = do_bench(sdpa_backward(torch.float32, SDPBackend.EFFICIENT_ATTENTION))
    times["sdpa bf16 (flash)"] = do_bench(sdpa_backward(torch.bfloat16, SDPBackend.FLASH_ATTENTION))
    ref_out, ref_lse, *_ = reference(q, k, v, dout, row, None, causal, scale) if DEVICE.type == "cpu" else (None, None)
    out, lse = with_lse(q, k, v, None, causal, scale, ref_out, ref_lse)
    qh, kh, vh, doh = (t.to(torch.bfloat16) for t in (q, k, v, dout))
    out_h, lse_h = with_lse(qh, kh, vh, None, causal, scale, ref_out, ref_lse)
    top_only = torch.zeros_like(dout)
    top_only[:, :, 0] = dout[:, :, 0]  # row mode's top layer: dO non-zero in the read-out row alone
    # Autotuned: the float32 kernel as the lean path runs it, and bfloat16. The other float32 variants run at the
    # float32 kernel's chosen tiles (one compile each instead of one per config): precision, atomics and the
    # update alone are then told apart on the same tiles.
    tuned = {
        "fa2 tf32x3 atomic": lambda: fa2.gae_attention_backward_fa2(q, k, v, out, lse, dout, row, None, causal, scale),
        "fa2 bf16 atomic": lambda: fa2.gae_attention_backward_fa2(qh, kh, vh, out_h, lse_h, doh, row, None, causal, scale),
    }
    for label, run in tuned.items():
        times[label] = do_bench(run)
        if label == "fa2 tf32x3 atomic" and DEVICE.type == "cuda":
            best = fa2.fa2_tuned.best_config
            at = dict(block_q=best.kwargs["BLOCK_Q"], block_k=best.kwargs["BLOCK_K"], num_warps=best.num_warps,
                      num_stages=best.num_stages)
            print(f"<!-- {name}: float32 tf32x3 tiles chosen: {at} -->")
        elif DEVICE.type != "cuda":
            at = dict(block_q=32, block_k=64)
    runs = {
        "v1 ieee 16x16": lambda: v1.gae_attention_backward(q, k, v, out, lse, dout, row, None, causal, scale),
        "v1 tf32x3 16x16": lambda: v1.gae_attention_backward(q, k, v, out, lse, dout, row, None, causal, scale,
                                                             precision="tf32x3"),
        "v1 tf32x3 64x64": lambda: v1.gae_attention_backward(q, k, v, out, lse, dout, row, None, causal, scale,
                                                             block_q=64, block_k=64, precision="tf32x3"),
        "fa2 ieee atomic (same tiles)": lambda: fa2.gae_attention_backward_fa2(
            q, k, v, out, lse, dout, row, None, causal, scale, precision="ieee", **at),
        "fa2 tf32 atomic (same tiles)": lambda: fa2.gae_attention_backward_fa2(
            q, k, v, out, lse, dout, row, None, causal, scale, precision="tf32", **at),
        "fa2 tf32x3 loop (same tiles)": lambda: fa2.gae_attention_backward_fa2(
            q, k, v, out, lse, dout, row, None, causal, scale, dq="loop", **at),
        "fa2 tf32x3 update only (lowest layer)": lambda: fa2.gae_attention_backward_fa2(
            q, k, v, out, lse, dout, row, None, causal, scale, grads=False, **at),
        "fa2 tf32x3 atomic, dO in one row (top layer)": lambda: fa2.gae_attention_backward_fa2(
            q, k, v, out, lse, top_only, row, None, causal, scale),
    }

    def chunks():
        state = LeanState(mode="row", row=row.clone(), kernel="chunks")
        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        o = lean_attention(qs, ks, vs, state, torch.zeros(1, device=DEVICE, requires_grad=True), LeanCall(index=0),
                           is_causal=causal, scale=scale)
        return lambda: torch.autograd.grad(o, (qs, ks, vs), dout, retain_graph=True)

    runs["lean chunks"] = chunks()
    for label, run in runs.items():
        try:
            times[label] = do_bench(run)
        except Exception as err:  # noqa: BLE001 - one variant failing must not hide the others' numbers
            times[label] = float("nan")
            print(f"<!-- {name} {label}: {type(err).__name__}: {err} -->")
    base = times["sdpa fp32 (efficient)"]
    for label, ms in times.items():
        print(f"| {name} B{b} H{h} N{n}{' causal' if causal else ''} | {label} | {ms:.3f} | {ms / base:.2f}x |")


def timings(shapes: list) -> None:
    import time

    if DEVICE.type == "cuda":
        from triton.testing import do_bench
    else:  # the smoke run: one call each, its time meaningless
        def do_bench(fn):
            start = time.perf_counter()
            fn()
            return 1e3 * (time.perf_counter() - start)

    print("## Backward time per attention call (ms, median of triton.testing.do_bench)\n")
    print("| shape | variant | ms | x sdpa fp32 bwd |")
    print("| --- | --- | ---: | ---: |")
    for name, b, h, n, e, causal in shapes:
        # One shape per call: its tensors, and the closures over them, are freed before the next shape.
        timings_at(do_bench, name, b, h, n, e, causal)
        torch.cuda.empty_cache()
    print()


def main(argv: list[str] | None = None) -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the errors and the two smaller shapes' times only")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on a CPU under Triton's interpreter")
    parser.add_argument("--shapes", nargs="+", choices=[s[0] for s in SHAPES], help="time these shapes only")
    parser.add_argument("--no-errors", action="store_true", help="the times only (a second call on the same machine)")
    args = parser.parse_args(argv)
    import triton

    if args.smoke:
        DEVICE = torch.device("cpu")
        error_shapes, shapes = SMOKE_ERROR_SHAPES, SMOKE_SHAPES
    else:
        if not torch.cuda.is_available():
            raise SystemExit("benchmarks/kernel_gpu.py needs a CUDA GPU (--smoke: a CPU run of tiny shapes)")
        error_shapes, shapes = ERROR_SHAPES, SHAPES[:2] if args.quick else SHAPES
        if args.shapes:
            shapes = [s for s in SHAPES if s[0] in args.shapes]
        print(f"<!-- {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__} -->\n")
    failures: list[str] = []
    if not args.no_errors:
        errors(failures, error_shapes)
    timings(shapes)
    if failures:
        print("ERROR BOUNDS MISSED:\n" + "\n".join(failures))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
