"""The memory-lean GAE path: exact gradients, Ā in the backward pass, nothing N x N kept."""

import pytest
import torch

from lightning_gae.engine import lean, rules
from lightning_gae.engine.attention import explicit_scaled_dot_product_attention
from lightning_gae.engine.capture import AttentionRecorder
from lightning_gae.engine.lean import LeanAttention, LeanCall, LeanState, lean_attention, query_chunks
from tests.helpers.explain import explain_gae
from tests.helpers.models import TinySeq2Seq, TinyViT

CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "bool_mask": {"attn_mask": "bool"},
    "float_mask_with_grad": {"attn_mask": "float_grad"},
    "broadcast_mask": {"attn_mask": "broadcast"},
    "scale": {"scale": 0.3},
    "dead_row": {"attn_mask": "dead"},
}


def _inputs(case, gqa=False):
    g = torch.Generator().manual_seed(0)
    b, h, n, e = 2, 4, 6, 5
    q = torch.randn(b, h, n, e, generator=g, dtype=torch.float64, requires_grad=True)
    kv_heads = 2 if gqa else h
    k = torch.randn(b, kv_heads, n, e, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, kv_heads, n, e, generator=g, dtype=torch.float64, requires_grad=True)
    kwargs = dict(CASES[case])
    mask = kwargs.pop("attn_mask", None)
    if mask == "bool":
        kwargs["attn_mask"] = torch.rand(b, 1, n, n, generator=g) > 0.3
        kwargs["attn_mask"][..., 0] = True
    elif mask == "float_grad":
        kwargs["attn_mask"] = torch.randn(1, h, n, n, generator=g, dtype=torch.float64, requires_grad=True)
    elif mask == "broadcast":
        kwargs["attn_mask"] = torch.where(torch.arange(n) < 4, 0.0, float("-inf")).double().expand(b, 1, 1, n)
    elif mask == "dead":
        m = torch.ones(b, 1, n, n, dtype=torch.bool)
        m[:, :, 2] = False
        kwargs["attn_mask"] = m
    return q, k, v, kwargs


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("chunk_queries", [None, 4], ids=["one_chunk", "chunks_of_4_and_2"])
def test_lean_attention_gradients_and_abar_equal_the_explicit_ones(case, gqa, chunk_queries, monkeypatch):
    if chunk_queries is not None:
        # b * h * chunk * n_k scores per chunk: 6 queries go as 4 then 2, through the reused buffers.
        monkeypatch.setattr(lean, "CHUNK_ELEMENTS", 2 * 4 * chunk_queries * 6)
        monkeypatch.setattr(lean, "MIN_QUERIES", 1)
    q, k, v, kwargs = _inputs(case, gqa)
    if gqa:
        kwargs["enable_gqa"] = True
    dout = torch.randn(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    out, probs = explicit_scaled_dot_product_attention(q, k, v, **kwargs)
    leaves = [t for t in (q, k, v, kwargs.get("attn_mask")) if isinstance(t, torch.Tensor) and t.requires_grad]
    want = torch.autograd.grad(out, leaves + [probs], dout)
    want_abar = rules.avg_heads(probs.detach(), want[-1])

    state, token, call = LeanState(), torch.zeros((), requires_grad=True), LeanCall(index=7)
    lean_out = lean_attention(q, k, v, state, token, call, **kwargs)
    torch.testing.assert_close(lean_out, out.to(lean_out.dtype))
    got = torch.autograd.grad(lean_out, leaves + [token], dout, allow_unused=True)
    for w, g in zip(want[:-1], got[:-1]):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.abars[7], want_abar.float(), rtol=1e-5, atol=1e-7)
    assert state.order == [7]


def test_explain_takes_the_lean_path_for_sdpa_models_and_keeps_nothing_quadratic():
    """Saved-for-backward bytes of the lean forward do not grow with L·B·H·N² as recorded probabilities do."""
    torch.manual_seed(0)
    model = TinyViT(image_size=32, patch=2, dim=32, depth=4, heads=4).eval()   # 257 tokens
    x = torch.rand(2, 1, 32, 32)

    def saved_bytes(lean):
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size() if t.layout == torch.strided else 0
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with AttentionRecorder(model, lean=lean) as rec:
                model(x)
        return total[0], rec.records

    lean_bytes, records = saved_bytes(True)
    full_bytes, _ = saved_bytes(False)
    assert all(r.lean is not None for r in records)
    probs_bytes = 4 * 2 * 4 * 257 * 257 * 4   # layers x batch x heads x N x N x float32
    assert full_bytes - lean_bytes > 0.9 * probs_bytes
    assert lean_bytes < full_bytes / 3


@pytest.mark.parametrize("model_and_inputs", ["vit", "seq2seq"])
def test_lean_and_recorded_paths_agree(model_and_inputs):
    torch.manual_seed(1)
    if model_and_inputs == "vit":
        model, inputs, query = TinyViT().eval(), torch.rand(3, 1, 8, 8), 0
    else:
        model, inputs, query = TinySeq2Seq().eval(), (torch.randint(0, 11, (3, 6)), torch.randint(0, 11, (3, 5))), 3
    lean = explain_gae(model, inputs, query, lean=True)
    full = explain_gae(model, inputs, query, lean=False)
    for name in full.relevance:
        torch.testing.assert_close(lean.relevance[name], full.relevance[name], rtol=1e-4, atol=1e-7)
    assert full.tokens.abs().sum() > 0


def test_causal_without_a_mask_takes_no_bias_and_equals_the_explicit_attention(monkeypatch):
    """is_causal alone: no N x N bias is built (the fused kernel and the chunks skip what it hides), also
    for fewer queries than keys (top-left aligned), chunk by chunk."""
    monkeypatch.setattr(lean, "CHUNK_ELEMENTS", 2 * 4 * 2 * 6)   # two queries of six keys per chunk at most
    monkeypatch.setattr(lean, "MIN_QUERIES", 1)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 4, 6, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    dout = torch.randn(2, 4, 4, 5, generator=g, dtype=torch.float64)
    out, probs = explicit_scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch.autograd.grad(out, [q, k, v, probs], dout)
    state, token, call = LeanState(), torch.zeros((), requires_grad=True), LeanCall(index=0)
    built = []
    monkeypatch.setattr(lean, "additive_mask", lambda *a: built.append(a) or None)
    lean_out = lean_attention(q, k, v, state, token, call, is_causal=True)
    assert not built
    assert call.key_limits.tolist() == [1, 2, 3, 4]
    assert call.attended.tolist() == [[True] * 4 + [False] * 2] * 2   # keys 4, 5: no query sees them
    torch.testing.assert_close(lean_out, out)
    got = torch.autograd.grad(lean_out, [q, k, v, token], dout, allow_unused=True)
    for w, g_ in zip(want[:3], got[:3]):
        torch.testing.assert_close(g_, w, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.abars[0], rules.avg_heads(probs.detach(), want[3]).float(), rtol=1e-5, atol=1e-7)


def test_causal_lm_lean_equals_recorded(monkeypatch):
    """A Llama at batch 1 without a mask (Hugging Face passes is_causal to SDPA), its last position
    explained: the lean path, in causal chunks of a few queries, equals the recorded probabilities' GAE."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(lean, "CHUNK_ELEMENTS", 4 * 3 * 11)   # chunks of 3 queries at most
    monkeypatch.setattr(lean, "MIN_QUERIES", 1)
    causal = []
    apply = LeanAttention.apply
    monkeypatch.setattr(LeanAttention, "apply", lambda *a: causal.append(a[-1]) or apply(*a))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, initializer_range=0.3,
                                      attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 40, (1, 11), generator=torch.Generator().manual_seed(1))
    lean_exp = explain_gae(model, {"input_ids": ids}, "last", lean=True)
    assert causal == [True, True]   # the mask-free causal path, in both layers
    full = explain_gae(model, {"input_ids": ids}, "last", lean=False)
    torch.testing.assert_close(lean_exp.tokens, full.tokens, rtol=1e-4, atol=1e-7)
    assert full.tokens.abs().sum() > 0


@pytest.mark.parametrize("n", [1024, 4096, 8192])
def test_causal_chunks_cover_every_query_once_within_their_budget(n):
    """The backward's plan for 8 heads: chunks follow each other, hold no more scores than allowed, end their keys
    at their last query, and a causal mask's plan needs fewer chunks than the keys-for-all plan."""
    limits = torch.arange(1, n + 1)
    spans = query_chunks(8, n, n, limits)
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    budget = max(lean.CHUNK_ELEMENTS, 8 * n * lean.MIN_QUERIES)
    assert all(8 * (stop - start) * keys <= budget and keys == stop for start, stop, keys in spans)
    uniform = query_chunks(8, n, n, None)
    assert all(keys == n for _, _, keys in uniform)
    assert len(spans) < len(uniform) if n >= 4096 else len(spans) <= len(uniform)


def test_a_mask_shared_by_the_layers_is_read_once_per_forward_and_again_when_it_changes():
    # Each reading of a mask's facts (its key limits, whether it is one bias per key) copies a value from the device;
    # the layers of one forward share the caller's mask, so one reading serves them all, unless the mask changed.
    torch.manual_seed(0)
    b, h, n, e = 2, 2, 6, 4
    q, k, v = (torch.randn(b, h, n, e) for _ in range(3))
    mask = torch.ones(b, 1, n, n, dtype=torch.bool)
    mask[..., -1] = False  # the last key is padding in every sample: the chunks may stop before it
    state, token = LeanState(mode="row", kernel="triton2"), torch.zeros((), requires_grad=True)
    calls = [LeanCall(index=i) for i in range(3)]
    for call in calls[:2]:
        lean_attention(q, k, v, state, token, call, attn_mask=mask)
    assert len(state.mask_facts) == 1
    fresh = LeanCall(index=0)
    lean_attention(q, k, v, LeanState(mode="row", kernel="triton2"), token, fresh, attn_mask=mask)
    for call in calls[:2]:
        assert torch.equal(call.key_limits, fresh.key_limits) and call.key_limits.tolist() == [n - 1] * n
        assert call.bias_per_key is True
    # Changed in place so that it varies by query: read again, and no longer one bias per key.
    mask[:, :, 0, 1] = False
    lean_attention(q, k, v, state, token, calls[2], attn_mask=mask)
    assert len(state.mask_facts) == 2 and calls[2].bias_per_key is False
    # Another tensor with the same values: read for itself (identity, not content, is the key), same facts.
    other = LeanCall(index=3)
    lean_attention(q, k, v, state, token, other, attn_mask=mask.clone())
    assert len(state.mask_facts) == 3 and other.bias_per_key is False
    # Without a kernel asked for, whether the mask is one bias per key is not read at all.
    plain = LeanCall(index=0)
    lean_attention(q, k, v, LeanState(mode="row", kernel="chunks"), token, plain, attn_mask=mask)
    assert plain.bias_per_key is None
