"""The Triton kernel of GAE's attention step (lightning_gae/engine/triton_gae.py) against the lean CPU path and the tiled
reference: the same gradients of q, k, v and the same row update ``r · E_h[(∇A ⊙ A)⁺]`` (< 1e-3 of the largest
value in float32, issue 24's agreement target), with padding keys, a sample whose queries see no key, causal masks
and token counts that are no multiple of the blocks. On a GPU it runs compiled; elsewhere under Triton's
interpreter (TRITON_INTERPRET=1). Where Triton is not installed (a CPU build of torch has none) it is skipped."""

import math

import pytest
import torch

from tests.helpers.models import tiny_hf_bert

# (tests/conftest.py switches Triton to its interpreter where there is no NVIDIA GPU, before torch is imported.)
pytest.importorskip("triton", reason="Triton is not installed: it ships with CUDA builds of torch; "
                                     "`pip install triton` runs this test under its CPU interpreter")

from lightning_gae.engine.triton_gae import gae_attention_backward  # noqa: E402
from lightning_gae.engine.lean import LeanCall, LeanState, lean_attention  # noqa: E402
from tests.helpers.tiled_attention import tiled_backward, tiled_forward  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("kind", ["none", "padding", "no_keys", "causal"])
@pytest.mark.parametrize("shape", [(2, 3, 37, 8), (2, 2, 50, 20)])
def test_the_kernel_equals_the_lean_backward(kind, shape):
    b, h, n, e = shape
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, e, device=DEVICE, requires_grad=True) for _ in range(3))
    dout, row = torch.randn(b, h, n, e, device=DEVICE), torch.rand(b, n, device=DEVICE)
    key_bias, mask, causal = None, None, kind == "causal"
    if kind in ("padding", "no_keys"):
        keep = torch.ones(b, n, dtype=torch.bool, device=DEVICE)
        keep[-1, -7:] = False  # the last sample's last 7 tokens are padding
        if kind == "no_keys":
            keep[0] = False  # the first sample's queries see no key at all: probabilities 0
        key_bias = torch.zeros(b, n, device=DEVICE).masked_fill(~keep, -math.inf)
        mask = keep[:, None, None, :]
    state = LeanState(mode="row", row=row.clone())
    out = lean_attention(q, k, v, state, torch.zeros(1, device=DEVICE, requires_grad=True), LeanCall(index=0),
                         attn_mask=mask, is_causal=causal)
    expected = (*torch.autograd.grad(out, (q, k, v), dout), state.row - row)

    with torch.no_grad():
        bias = None if key_bias is None else key_bias[:, None, None, :]
        _, lse = tiled_forward(q, k, v, bias, causal)  # the per-query log-sum-exp a fused forward returns
        got = gae_attention_backward(q, k, v, out.detach(), lse, dout, row, key_bias, causal)
        tiled = tiled_backward(q, k, v, out.detach(), lse, dout, row, bias, causal)
    for name, ours, lean, ref in zip(("dq", "dk", "dv", "update"), got, expected, tiled):
        top = max(1.0, lean.abs().max().item())
        assert (ours - lean).abs().max().item() < 1e-3 * top, name
        assert (ours - ref).abs().max().item() < 1e-3 * top, name
    assert got[3].abs().max() > 1e-3


def _bert(device):
    return tiny_hf_bert(device, layers=2)


def test_explain_runs_the_kernel_when_asked_and_gives_the_same_relevance(monkeypatch):
    import lightning_gae as lg
    from lightning_gae.engine import triton_gae
    from recipes.vit import ViTClassifier

    calls = []
    kernel = triton_gae.gae_attention_backward
    monkeypatch.setattr(triton_gae, "gae_attention_backward", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    torch.manual_seed(0)
    vit = ViTClassifier(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=2).to(DEVICE).eval()
    images = torch.randn(4, 1, 8, 8, device=DEVICE)
    bert, tokens = _bert(DEVICE)
    for model, inputs in ((vit, images), (bert, tokens)):
        monkeypatch.delenv("LIGHTNING_GAE_KERNEL", raising=False)
        chunks = lg.explain(model, inputs, method="gae")
        before = len(calls)
        monkeypatch.setenv("LIGHTNING_GAE_KERNEL", "triton")
        fused = lg.explain(model, inputs, method="gae")
        # One kernel call per attention layer, and the same relevance as the chunked backward.
        assert len(calls) - before == 2
        top = chunks.tokens.abs().max().item()
        assert (fused.tokens - chunks.tokens).abs().max().item() < 1e-4 * top
