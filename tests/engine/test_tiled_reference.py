"""The semantics of the fused GPU step (issue 24) held against the lean CPU path: a flash-attention-style forward and
backward that visits the scores one ``block_q x block_k`` tile at a time (tests/helpers/tiled_attention.py) gives
the same output, the same gradients of q, k, v and the same GAE row update ``r · E_h[(∇A ⊙ A)⁺]`` as
:func:`lightning_gae.engine.lean.lean_attention`'s backward in row mode, with tiles that do not divide the tokens, padding
masks, a query that sees no key, causal masks and an additive bias."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_gae.engine.lean import LeanCall, LeanState, lean_attention
from tests.helpers.tiled_attention import tiled_backward, tiled_forward

B, H, N, E = 2, 3, 37, 8


def _mask(kind: str) -> tuple[torch.Tensor | None, bool]:
    """``(attn_mask, is_causal)`` for SDPA and the lean path."""
    if kind == "none":
        return None, False
    if kind == "causal":
        return None, True
    if kind == "padding":
        keep = torch.ones(B, 1, 1, N, dtype=torch.bool)
        keep[1, ..., -10:] = False  # the second sample's last 10 tokens are padding
        return keep, False
    if kind == "blind_query":
        keep = torch.ones(B, 1, N, N, dtype=torch.bool)
        keep[0, 0, 3, :] = False  # query 3 of the first sample sees no key: its probabilities are 0
        return keep, False
    if kind == "bias_causal":
        return torch.randn(B, H, N, N, dtype=torch.float64), True
    raise AssertionError(kind)


def _additive(mask: torch.Tensor | None, causal: bool) -> torch.Tensor | None:
    """The tiled reference's additive bias for ``mask``; the causal triangle is the reference's own."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, -math.inf)


@pytest.mark.parametrize("kind", ["none", "padding", "blind_query", "causal", "bias_causal"])
@pytest.mark.parametrize("blocks", [(16, 8), (5, 37), (37, 3)])
def test_the_tiled_step_equals_the_lean_backward(kind, blocks):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, E, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, N, E, dtype=torch.float64)
    row = torch.rand(B, N, dtype=torch.float64)
    mask, causal = _mask(kind)
    scale = 0.3

    state = LeanState(mode="row", row=row.clone())
    out = lean_attention(q, k, v, state, torch.zeros(1, requires_grad=True), LeanCall(index=0), attn_mask=mask,
                         is_causal=causal, scale=scale)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    lean_update = state.row - row

    bias = _additive(mask, causal)
    with torch.no_grad():
        tiled_out, lse = tiled_forward(q, k, v, bias, causal, scale, *blocks)
        tq, tk, tv, update = tiled_backward(q, k, v, tiled_out, lse, dout, row, bias, causal, scale, *blocks)
        fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    # SDPA gives NaN for a query that sees no key; the lean path and the kernel give 0 there.
    torch.testing.assert_close(tiled_out, out.detach(), rtol=0, atol=1e-10)
    seen = ~torch.isinf(lse)
    torch.testing.assert_close(tiled_out[seen], fused[seen], rtol=0, atol=1e-10)
    for ours, theirs in ((tq, dq), (tk, dk), (tv, dv), (update, lean_update)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    # The update is not trivially zero (a check that could not fail otherwise).
    assert update.abs().max() > 1e-3


def test_the_tiled_step_in_float32_within_the_kernels_tolerance():
    # The kernel's agreement target: < 1e-3 in float32 against the lean path.
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, H, N, E, requires_grad=True) for _ in range(3))
    dout, row = torch.randn(B, H, N, E), torch.rand(B, N)
    state = LeanState(mode="row", row=row.clone())
    out = lean_attention(q, k, v, state, torch.zeros(1, requires_grad=True), LeanCall(index=0), is_causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    with torch.no_grad():
        tiled_out, lse = tiled_forward(q, k, v, causal=True)
        tq, tk, tv, update = tiled_backward(q, k, v, tiled_out, lse, dout, row, causal=True)
    for ours, theirs in ((tiled_out, out), (tq, dq), (tk, dk), (tv, dv), (update, state.row - row)):
        assert (ours - theirs).abs().max() < 1e-3 * max(1.0, theirs.abs().max().item())
