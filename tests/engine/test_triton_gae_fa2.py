"""The FlashAttention-2-shaped kernel of GAE's attention step (lightning_gae/engine/triton_gae_fa2.py, issue 35).

Held against an independent dense oracle written here (float64, one sample at a time, autograd for the gradients)
and the tiled reference (tests/helpers/tiled_attention.py): its variants (``dQ`` by atomics, ``dQ`` by a second loop,
the update alone) x masks (none, padding, a query that sees no key, causal) x shapes (a slab partly filled, the head
dimension padded, batch == heads, exact multiples of the tiles); a ``dO`` with one non-zero row (the skipped slabs),
a log-sum-exp padded with +inf as PyTorch's efficient forward returns it, bit-identical repeat runs, bfloat16 held to
FlashAttention's rule, and the lean path running it (``LIGHTNING_GAE_KERNEL=triton2``).

On a GPU it runs compiled; elsewhere under Triton's CPU interpreter (tests/conftest.py sets TRITON_INTERPRET=1),
where every product runs in numpy's float32: ``tf32x3`` against plain ``tf32`` is told apart only on CUDA (the tests
marked so skip elsewhere). Where Triton is not installed it is skipped.
"""

import math

import pytest
import torch

from tests.helpers.models import tiny_hf_bert

pytest.importorskip("triton", reason="Triton is not installed: it ships with CUDA builds of torch; "
                                     "`pip install triton` runs this test under its CPU interpreter")

from lightning_gae.engine import triton_gae_fa2 as fa2  # noqa: E402
from lightning_gae.engine.triton_gae_fa2 import gae_attention_backward_fa2  # noqa: E402
from tests.helpers.tiled_attention import tiled_backward  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="precision of tf32x3 / the fused forward: CUDA only "
                                                                "(the interpreter multiplies in float32 whatever asked)")
# (dq mode, grads): dQ by relaxed atomics, dQ by the second loop, the update alone (the lowest layer's).
VARIANTS = {"atomic": ("atomic", True), "loop": ("loop", True), "update": ("atomic", False)}
BOUND = 1e-4  # of the largest value: tf32x3's promise on a GPU, far above float32's rounding under the interpreter


def dense_oracle(q, k, v, dout, row, keep, causal, scale):
    """``(out, lse, dq, dk, dv, update)`` in float64, one sample at a time, from the whole score matrix: ``keep``
    ``[B, N_q, N_k]`` says which keys each query sees (a query with none: probabilities 0, log-sum-exp -inf)."""
    results = []
    for i in range(q.shape[0]):
        qi, ki, vi = (t[i].detach().double().requires_grad_() for t in (q, k, v))
        n_q, n_k = qi.shape[-2], ki.shape[-2]
        sees = keep[i].clone()
        if causal:
            sees &= torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        s = qi @ ki.transpose(-2, -1) * scale
        blind = ~sees.any(dim=-1)  # [N_q]
        lse = torch.logsumexp(s.detach().masked_fill(~sees, -math.inf), dim=-1)
        # Blind rows get finite scores then a 0 factor, so autograd sees no -inf - -inf.
        filled = s.masked_fill(~sees, -math.inf).masked_fill(blind[:, None], 0.0)
        a = torch.softmax(filled, dim=-1) * (~blind)[:, None]
        out = a @ vi
        do = dout[i].double()
        dq, dk, dv = torch.autograd.grad(out, (qi, ki, vi), do)
        grad_a = do @ vi.detach().transpose(-2, -1)
        update = row[i].double() @ (grad_a * a.detach()).clamp(min=0).mean(dim=0)
        results.append((out.detach(), lse, dq, dk, dv, update))
    return [torch.stack(parts) for parts in zip(*results)]


def _case(kind, shape, seed=0, dtype=torch.float32):
    """Inputs of one case: ``q, k, v, dout, row`` and ``key_bias, keep, causal`` for ``kind``."""
    b, h, n, e = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(b, h, n, e, generator=g).to(DEVICE, dtype) for _ in range(4))
    row = torch.rand(b, n, generator=g).to(DEVICE)
    keep = torch.ones(b, n, n, dtype=torch.bool, device=DEVICE)
    key_bias = None
    if kind in ("padding", "blind"):
        open_keys = torch.ones(b, n, dtype=torch.bool, device=DEVICE)
        open_keys[-1, -7:] = False  # the last sample's last 7 tokens are padding
        key_bias = torch.zeros(b, n, device=DEVICE).masked_fill(~open_keys, -math.inf)
        keep &= open_keys[:, None, :]
        if kind == "blind":
            keep[0, 3] = False  # query 3 of the first sample sees no key (the kernel learns it from its lse)
    return q, k, v, dout, row, key_bias, keep, kind == "causal"


def _max_err(got, want):
    return (got.double() - want.double()).abs().max().item()


SHAPES = [(2, 3, 37, 8),  # 37 tokens: the last slab of queries and the last block of keys partly filled; E padded
          (3, 3, 70, 16),  # batch == heads
          (1, 2, 128, 32)]  # whole tiles only


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("kind", ["none", "padding", "blind", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=["ragged", "batch_eq_heads", "whole"])
def test_the_fa2_kernel_equals_the_dense_oracle(variant, kind, shape):
    dq_mode, grads = VARIANTS[variant]
    q, k, v, dout, row, key_bias, keep, causal = _case(kind, shape)
    scale = 0.7 / math.sqrt(shape[-1])
    out, lse, *want = dense_oracle(q, k, v, dout, row, keep, causal, scale)
    got = gae_attention_backward_fa2(q, k, v, out.float(), lse.float(), dout, row, key_bias, causal, scale,
                                     grads=grads, dq=dq_mode)
    names = ("dq", "dk", "dv", "update")
    for name, ours, ref in zip(names, got, want):
        if ours is None:
            assert not grads and name != "update", name
            continue
        assert _max_err(ours, ref) < BOUND * ref.abs().max().item(), name
    assert want[3].abs().max() > 1e-3  # something to compare
    if kind == "blind":  # the blind query adds nothing; its gradient is 0
        assert got[0] is None or got[0][0, :, 3].abs().max() == 0


def test_the_oracle_and_the_tiled_reference_agree_with_the_kernel_on_blocks_that_divide_nothing():
    """Odd tiles (16 queries x 64 keys over 50 tokens) and the existing tiled reference as a second oracle."""
    q, k, v, dout, row, key_bias, keep, causal = _case("padding", (2, 2, 50, 20), seed=1)
    scale = 1 / math.sqrt(20)
    out, lse, *want = dense_oracle(q, k, v, dout, row, keep, causal, scale)
    bias = key_bias.double()[:, None, None, :]
    tiled = tiled_backward(*(t.double() for t in (q, k, v, out, lse, dout, row)), bias, causal, scale)
    got = gae_attention_backward_fa2(q, k, v, out.float(), lse.float(), dout, row, key_bias, causal, scale,
                                     block_q=16, block_k=64)
    for ours, ref, ref2 in zip(got, want, tiled):
        top = ref.abs().max().item()
        assert _max_err(ours, ref) < BOUND * top and _max_err(ref2, ref) < 1e-10 * top


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_slabs_whose_do_is_zero_are_skipped(variant):
    """Row mode's top layer: one non-zero row of dO. Its slab alone is visited: the other slabs' queries and relevance
    are NaN in the kernel's input, and the result is still the oracle's (a visited NaN slab poisons dK or the update)."""
    dq_mode, grads = VARIANTS[variant]
    q, k, v, dout, row, key_bias, keep, causal = _case("none", (2, 2, 100, 16), seed=2)
    dout.zero_()
    dout[:, :, 40] = torch.randn(2, 2, 16, device=DEVICE)  # query 40 alone: slab [32, 64) of 32-query slabs
    out, lse, *want = dense_oracle(q, k, v, dout, row, keep, causal, 0.25)
    poisoned = q.clone()
    poisoned[:, :, :32] = math.nan
    poisoned[:, :, 64:] = math.nan
    bad_row = row.clone()
    bad_row[:, :32] = math.nan
    bad_row[:, 64:] = math.nan
    got = gae_attention_backward_fa2(poisoned, k, v, out.float(), lse.float(), dout, bad_row, key_bias, causal, 0.25,
                                     grads=grads, dq=dq_mode, block_q=32, block_k=64)
    for ours, ref in zip(got, want):
        if ours is not None:
            assert _max_err(ours, ref) < BOUND * ref.abs().max().item()
    # And without the skip the NaN slabs are visited: the poison shows (the test can fail).
    unskipped = gae_attention_backward_fa2(poisoned, k, v, out.float(), lse.float(), dout, bad_row, key_bias, causal,
                                           0.25, grads=grads, dq=dq_mode, block_q=32, block_k=64, skip_dead=False)
    assert torch.isnan(unskipped[3]).any() and (not grads or torch.isnan(unskipped[1]).any())


def test_the_update_alone_skips_the_queries_without_relevance():
    q, k, v, dout, row, key_bias, keep, causal = _case("causal", (1, 2, 96, 16), seed=3)
    row[:, 32:] = 0.0  # relevance only on the first slab
    out, lse, *want = dense_oracle(q, k, v, dout, row, keep, causal, 0.25)
    poisoned = q.clone()
    poisoned[:, :, 32:] = math.nan
    got = gae_attention_backward_fa2(poisoned, k, v, out.float(), lse.float(), dout, row, key_bias, causal, 0.25,
                                     grads=False, block_q=32, block_k=64)
    assert got[:3] == (None, None, None)
    assert _max_err(got[3], want[3]) < BOUND * want[3].abs().max().item()


@pytest.mark.parametrize("blind_lse", [-math.inf, math.inf, math.nan])
def test_a_padded_log_sum_exp_and_any_non_finite_entry(blind_lse):
    """PyTorch's efficient forward returns ``[B, H, ceil(N/32)·32]`` padded with +inf; a query that sees no key may
    come as -inf, +inf or NaN, with a NaN output row: all read as 'sees no key'."""
    q, k, v, dout, row, key_bias, keep, causal = _case("blind", (2, 3, 37, 8), seed=4)
    out, lse, *want = dense_oracle(q, k, v, dout, row, keep, causal, 0.3)
    padded = torch.full((2, 3, 64), math.inf, device=DEVICE)
    padded[..., :37] = lse
    padded[0, :, 3] = blind_lse
    nan_out = out.float().clone()
    nan_out[0, :, 3] = math.nan  # some fused forwards leave NaN in a blind row: D must read it as 0
    for variant in VARIANTS.values():
        got = gae_attention_backward_fa2(q, k, v, nan_out, padded, dout, row, key_bias, causal, 0.3,
                                         grads=variant[1], dq=variant[0])
        for ours, ref in zip(got, want):
            if ours is not None:
                assert _max_err(ours, ref) < BOUND * ref.abs().max().item()


def test_two_runs_give_the_same_bits():
    q, k, v, dout, row, key_bias, keep, _ = _case("padding", (2, 4, 130, 16), seed=5)
    out, lse, *_ = dense_oracle(q, k, v, dout, row, keep, False, 0.25)
    for dq_mode in ("atomic", "loop"):
        first = gae_attention_backward_fa2(q, k, v, out.float(), lse.float(), dout, row, key_bias, False, 0.25, dq=dq_mode)
        second = gae_attention_backward_fa2(q, k, v, out.float(), lse.float(), dout, row, key_bias, False, 0.25, dq=dq_mode)
        assert torch.equal(first[3], second[3])  # the update: per head, no atomics, summed by PyTorch
        assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])
        if dq_mode == "loop" or not q.is_cuda:  # the atomics' order varies on a GPU
            assert torch.equal(first[0], second[0])


def _spearman(a, b):
    ra = a.argsort(dim=-1).argsort(dim=-1).double()
    rb = b.argsort(dim=-1).argsort(dim=-1).double()
    ra, rb = ra - ra.mean(dim=-1, keepdim=True), rb - rb.mean(dim=-1, keepdim=True)
    return (ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))


def _eager(q, k, v, dout, row, keep, causal, scale):
    """PyTorch's eager attention in the inputs' dtype (what FlashAttention's rule measures against)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    sees = keep[:, None] & (torch.ones_like(keep[0]).tril() if causal else True)
    s = (q @ k.transpose(-2, -1) * scale).masked_fill(~sees, -math.inf)
    a = torch.softmax(s, dim=-1)
    out = a @ v
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    grad_a = dout @ v.detach().transpose(-2, -1)
    update = torch.einsum("bq,bhqk->bk", row.to(q.dtype), (grad_a * a.detach()).clamp(min=0)) / q.shape[1]
    return dq, dk, dv, update


@pytest.mark.parametrize("kind", ["padding", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_flash_attentions_rule(kind, dtype):
    """bf16/fp16 operands, fp32 accumulation: the error against the fp32 reference at most twice eager attention's in
    the same dtype plus 1e-5 of the largest value, and the token relevance ranked as in fp32 (Spearman >= 0.99). Under
    the interpreter the half operands are widened before each product (exact products, as on a tensor core)."""
    q, k, v, dout, row, key_bias, keep, causal = _case(kind, (2, 4, 96, 32), seed=6, dtype=dtype)
    scale = 1 / math.sqrt(32)
    out, lse, *want = dense_oracle(q, k, v, dout, row, keep, causal, scale)  # from the half inputs, in float64
    eager = _eager(q, k, v, dout, row, keep, causal, scale)
    got = gae_attention_backward_fa2(q, k, v, out.to(dtype), lse.float(), dout, row, key_bias, causal, scale)
    for name, ours, ref, theirs in zip(("dq", "dk", "dv", "update"), got, want, eager):
        assert _max_err(ours, ref) <= 2 * _max_err(theirs, ref) + 1e-5 * ref.abs().max().item(), name
    assert _spearman(got[3], want[3]).min() >= 0.99


@CUDA
def test_tf32x3_holds_the_bound_that_plain_tf32_misses():
    """On CUDA: ``tf32x3`` (the default) within 1e-4 of the largest value of the float64 oracle; plain ``tf32`` on the
    same inputs is not, so a silent fall-back to tf32 would fail this test."""
    q, k, v, dout, row, key_bias, keep, causal = _case("padding", (2, 4, 512, 64), seed=7)
    q, k = q * 3, k * 3  # peaked probabilities: tf32's 10-bit mantissa shows in the scores
    out, lse, *want = dense_oracle(q, k, v, dout, row, keep, causal, 0.125)
    errors = {}
    for precision in ("tf32x3", "tf32"):
        got = gae_attention_backward_fa2(q, k, v, out.float(), lse.float(), dout, row, key_bias, causal, 0.125,
                                         precision=precision)
        errors[precision] = max(_max_err(o, r) / r.abs().max().item() for o, r in zip(got, want))
    assert errors["tf32x3"] < BOUND < errors["tf32"], errors


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_the_fused_forward_gives_the_log_sum_exp(dtype, causal):
    q, k, v, *_ = _case("none", (2, 4, 100, 64), seed=8, dtype=dtype)
    res = fa2.forward_with_lse(q, k, v, None, causal, 0.125)
    assert res is not None
    out, lse = res
    keep = torch.ones(2, 100, 100, dtype=torch.bool, device=DEVICE)
    ref_out, ref_lse, *_ = dense_oracle(q, k, v, torch.zeros_like(q), torch.zeros(2, 100, device=DEVICE), keep,
                                        causal, 0.125)
    assert lse.dtype == torch.float32 and lse.shape[-1] >= 100
    assert _max_err(lse[..., :100], ref_lse) < 1e-2
    assert _max_err(out, ref_out) < 2e-2


def _bert(device):
    return tiny_hf_bert(device, layers=3)


def test_explain_runs_the_fa2_kernel_when_asked_the_lowest_layer_for_its_update_alone(monkeypatch):
    import lightning_gae as lg
    from recipes.vit import ViTClassifier

    calls = []
    kernel = fa2.gae_attention_backward_fa2
    monkeypatch.setattr(fa2, "gae_attention_backward_fa2", lambda *a, **kw: calls.append(kw["grads"]) or kernel(*a, **kw))
    # Made CUDA's default (item 6, once a GPU run shows it winning), the kernel still runs on a CPU only when asked.
    monkeypatch.setattr(fa2, "DEFAULT_ON_CUDA", True)
    torch.manual_seed(0)
    vit = ViTClassifier(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=3, heads=2).to(DEVICE).eval()
    images = torch.randn(4, 1, 8, 8, device=DEVICE)
    bert, tokens = _bert(DEVICE)
    for model, inputs in ((vit, images), (bert, tokens)):
        for forced in ("chunks", None):  # chunks asked for, or nothing asked (on a CPU: the chunks too)
            monkeypatch.delenv("LIGHTNING_GAE_KERNEL", raising=False)
            if forced:
                monkeypatch.setenv("LIGHTNING_GAE_KERNEL", forced)
            result = lg.explain(model, inputs, method="gae")
            if forced:
                chunks = result
                assert calls == []
            elif DEVICE.type == "cuda":  # the default there
                assert calls == [True, True, False]
                calls.clear()
            else:
                assert calls == []
        monkeypatch.setenv("LIGHTNING_GAE_KERNEL", "triton2")
        fused = lg.explain(model, inputs, method="gae")
        # One kernel call per attention layer, last first; the lowest one's q, k, v gradients are never used.
        assert calls == [True, True, False]
        calls.clear()
        top = chunks.tokens.abs().max().item()
        assert (fused.tokens - chunks.tokens).abs().max().item() < 1e-4 * top


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script itself is the check (bash benchmarks/kernel_gpu.sh)")
def test_the_gpu_script_runs_every_step_on_a_cpu(capsys):
    """benchmarks/kernel_gpu.py --smoke: tiny shapes under the interpreter, so the one GPU call it is prepared for does
    not fail on a typo. Every error row is printed and met (it exits 1 otherwise); the times mean nothing here."""
    from benchmarks import kernel_gpu

    kernel_gpu.main(["--smoke"])
    out = capsys.readouterr().out
    assert out.count("| yes |") == 2 * 9 and "| no |" not in out  # 8 fp32 variants and bf16, at two shapes
    for variant, rows in (("v1 ieee 16x16", 4), ("fa2 tf32x3 loop", 2), ("fa2 tf32x3 loop (same tiles)", 2),
                          ("fa2 tf32x3 update only (lowest layer)", 2),
                          ("lean chunks", 2), ("sdpa fp32 (efficient)", 2)):
        assert out.count(f"| {variant} |") == rows, variant  # the errors' table and the times' (two shapes each)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel is compiled by every other test")
@pytest.mark.parametrize("dtype, precision, causal, grads", [("fp32", "tf32x3", True, True), ("bf16", "default", False, False)])
def test_the_kernel_compiles_for_a_hopper_gpu_without_one(dtype, precision, causal, grads):
    """Triton's own compiler (not the interpreter, which runs Python and accepts more) builds the kernel for sm_90 with
    the ptxas its wheel carries: a GPU session's minutes are not lost to a construct only the compiler refuses."""
    import os
    import subprocess
    import sys

    source = f'''
import os
os.environ.pop("TRITON_INTERPRET", None)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from lightning_gae.engine import triton_gae_fa2 as fa2
consts = dict(HAS_KEY_BIAS=True, CAUSAL={causal}, NEED_GRADS={grads}, DQ_ATOMIC={grads}, BLOCK_Q=32, BLOCK_K=128, E=64,
              E_PAD=64, PRECISION="{precision}", UPCAST=False)
types = dict(Q="*{dtype}", K="*{dtype}", V="*{dtype}", DO="*{dtype}", LIVE="*i8", heads="i32", n_q="i32", n_k="i32",
             lse_stride="i32", n_bucket="i32", scale="fp32")
fn = fa2._fa2_kernel
signature = {{n: "constexpr" if n in consts else types.get(n, "*fp32") for n in fn.arg_names}}
kernel = compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32), options={{"num_warps": 8}})
assert kernel.asm["cubin"]
print("compiled", kernel.metadata.shared)
'''
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=300)
    if "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("this Triton wheel carries no ptxas")
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


def test_the_backward_reads_the_log_sum_exp_the_forward_kept(monkeypatch):
    """The row form is chosen after the forward, so the forward keeps the fused log-sum-exp whenever the second kernel
    is asked for, and the backward then runs no pass of its own. CUDA's fused forwards stand in for by PyTorch's CPU
    flash forward, its log-sum-exp padded with +inf to a multiple of 32 as the efficient kernel returns it."""
    import lightning_gae as lg
    from lightning_gae.engine import lean
    from recipes.vit import ViTClassifier

    kept, passes = [], []

    def cpu_fused(q, k, v, bias, causal, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias,
                                                                               scale=scale)
        padded = torch.full((*lse.shape[:2], -(-lse.shape[-1] // 32) * 32), math.inf)
        padded[..., :lse.shape[-1]] = lse
        kept.append(padded)
        return out, padded

    monkeypatch.setattr(fa2, "forward_with_lse", cpu_fused)
    extra_pass = lean.log_sum_exp
    monkeypatch.setattr(lean, "log_sum_exp", lambda *a: passes.append(1) or extra_pass(*a))
    torch.manual_seed(0)
    vit = ViTClassifier(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=3, heads=2).eval()
    images = torch.randn(4, 1, 8, 8)
    monkeypatch.setenv("LIGHTNING_GAE_KERNEL", "chunks")
    chunks = lg.explain(vit, images, method="gae")
    monkeypatch.setenv("LIGHTNING_GAE_KERNEL", "triton2")
    fused = lg.explain(vit, images, method="gae")
    assert len(kept) == 3 and passes == []
    assert (fused.tokens - chunks.tokens).abs().max().item() < 1e-4 * chunks.tokens.abs().max().item()


def test_deterministic_algorithms_get_the_dq_loop(monkeypatch):
    """torch.use_deterministic_algorithms(True): dQ by the second loop (atomics' order varies on a GPU), and two
    explanations give the same bits."""
    import lightning_gae as lg
    from recipes.vit import ViTClassifier

    modes = []
    kernel = fa2.gae_attention_backward_fa2
    monkeypatch.setattr(fa2, "gae_attention_backward_fa2", lambda *a, **kw: modes.append(kw["dq"]) or kernel(*a, **kw))
    monkeypatch.setenv("LIGHTNING_GAE_KERNEL", "triton2")
    torch.manual_seed(0)
    vit = ViTClassifier(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=2).to(DEVICE).eval()
    images = torch.randn(4, 1, 8, 8, device=DEVICE)
    lg.explain(vit, images, method="gae")
    assert modes == ["atomic", "atomic"]
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        first, second = (lg.explain(vit, images, method="gae").tokens for _ in range(2))
    finally:
        torch.use_deterministic_algorithms(before)
    assert modes[2:] == ["loop"] * 4
    assert torch.equal(first, second)
