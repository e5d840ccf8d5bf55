import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_gae.engine.capture import (
    AttentionRecorder,
    explicit_multi_head_attention_forward,
    explicit_scaled_dot_product_attention,
)
from tests.helpers.models import TinyViT


def _nothing_installed() -> bool:
    mod = nn.modules.module
    return (
        torch._C._len_torch_function_stack() == 0
        and not mod._global_forward_hooks
        and not mod._global_forward_pre_hooks
    )


def _sdpa_cases():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=g)
    k = torch.randn(2, 3, 6, 8, generator=g)
    v = torch.randn(2, 3, 6, 4, generator=g)
    bool_mask = torch.rand(2, 1, 5, 6, generator=g) > 0.3
    bool_mask[0, 0, 2] = False  # a query with every key masked
    yield "plain", (q, k, v), {}
    yield "bool_mask", (q, k, v), {"attn_mask": bool_mask}
    yield "float_mask", (q, k, v), {"attn_mask": torch.randn(5, 6, generator=g)}
    yield "causal", (q, k, v), {"is_causal": True}
    yield "scale", (q, k, v), {"scale": 0.3}
    qg = torch.randn(2, 4, 5, 8, generator=g)
    kg = torch.randn(2, 2, 5, 8, generator=g)
    vg = torch.randn(2, 2, 5, 8, generator=g)
    yield "gqa", (qg, kg, vg), {"enable_gqa": True}
    yield "gqa_causal_scale", (qg, kg, vg), {"enable_gqa": True, "is_causal": True, "scale": 0.5}
    yield "three_dims", (q[0], k[0], v[0]), {}


@pytest.mark.parametrize("name,args,kwargs", list(_sdpa_cases()), ids=[c[0] for c in _sdpa_cases()])
def test_explicit_sdpa_matches_fused(name, args, kwargs):
    expected = F.scaled_dot_product_attention(*args, **kwargs)
    out, probs = explicit_scaled_dot_product_attention(*args, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert probs.shape == (*args[0].shape[:-1], args[1].shape[-2])
    assert not torch.isnan(probs).any()
    sums = probs.sum(-1)
    assert torch.all(((sums - 1).abs() < 1e-5) | (sums == 0))


def test_explicit_sdpa_is_what_the_recorder_runs():
    model = TinyViT().eval()
    x = torch.rand(3, 1, 8, 8)
    expected = model(x)
    with AttentionRecorder(model) as rec:
        got = model(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert [r.path for r in rec.records] == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
    assert [r.index for r in rec.records] == [0, 1, 2]
    assert all(r.source == "sdpa" and r.as_heads().shape == (3, 4, 17, 17) for r in rec.records)


MHA_VARIANTS = [{}, {"bias": False}, {"add_bias_kv": True}, {"add_zero_attn": True}, {"kdim": 6, "vdim": 5}]


@pytest.mark.parametrize("variant", MHA_VARIANTS, ids=lambda v: ",".join(v) or "default")
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_explicit_mha_matches_module(variant, need_weights, average):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True, **variant).eval()
    x = torch.randn(3, 5, 8)
    key = torch.randn(3, 4, variant.get("kdim", 8))
    value = torch.randn(3, 4, variant.get("vdim", 8))
    pad = torch.tensor([[False] * 4, [False, False, True, True], [False] * 3 + [True]])
    mask = torch.triu(torch.ones(5, 4, dtype=torch.bool), 1)
    kwargs = dict(key_padding_mask=pad, attn_mask=mask, need_weights=need_weights, average_attn_weights=average)
    expected = mha(x, key, value, **kwargs)
    with AttentionRecorder(mha) as rec:
        got = mha(x, key, value, **kwargs)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    if need_weights:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-6)
    else:
        assert got[1] is None
    (record,) = rec.records
    assert record.source == "mha" and record.self_attention is False
    extra = int("add_bias_kv" in variant or "add_zero_attn" in variant)
    assert record.as_heads().shape == (3, 2, 5, 4 + extra)


def test_explicit_mha_unbatched_and_float_masks():
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(8, 2).eval()
    x = torch.randn(5, 8)
    float_mask = torch.randn(5, 5)
    expected = mha(x, x, x, attn_mask=float_mask)
    (out, weights), probs = explicit_multi_head_attention_forward(
        x, x, x, 8, 2, mha.in_proj_weight, mha.in_proj_bias, None, None, False, 0.0,
        mha.out_proj.weight, mha.out_proj.bias, attn_mask=float_mask,
    )
    torch.testing.assert_close(out, expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights, expected[1], rtol=1e-5, atol=1e-6)
    assert probs.shape == (1, 2, 5, 5)


def test_transformer_encoder_records_self_attention_paths():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    expected = enc(x, src_key_padding_mask=pad)
    with AttentionRecorder(enc) as rec:
        got = enc(x, src_key_padding_mask=pad)
    torch.testing.assert_close(got[~pad], expected[~pad], rtol=1e-5, atol=1e-6)
    assert [(r.path, r.self_attention) for r in rec.records] == [("layers.0.self_attn", True), ("layers.1.self_attn", True)]
    # The padded keys receive exactly zero probability.
    assert rec.records[0].tensor[1, :, :, 3:].abs().max() == 0


def test_softmax_matmul_attention_is_recorded_at_the_matmul():
    model = TinyViT(impl="manual").eval()
    with AttentionRecorder(model) as rec:
        model(torch.rand(2, 1, 8, 8))
    assert [(r.path, r.source) for r in rec.records] == [(f"blocks.{i}.attn", "softmax") for i in range(3)]
    # The recorded tensor is the very one the model multiplied with V.
    assert all(r.tensor is blk.attn.probs for r, blk in zip(rec.records, model.blocks))


def test_a_softmax_that_never_meets_a_matmul_is_not_attention():
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x).softmax(dim=-1) * 2

    with AttentionRecorder(Classifier()) as rec:
        Classifier()(torch.randn(2, 4))
    assert rec.records == []


def test_attention_modules_hooks_only_the_named_modules():
    model = TinyViT(impl="einsum").eval()
    with AttentionRecorder(model, attention_modules="blocks.*.attn.attn_drop") as rec:
        model(torch.rand(2, 1, 8, 8))
    assert [(r.path, r.source) for r in rec.records] == [(f"blocks.{i}.attn.attn_drop", "hook") for i in range(3)]
    assert _nothing_installed()
    assert all(not blk.attn.attn_drop._forward_hooks for blk in model.blocks)


def test_attention_modules_pattern_that_matches_nothing():
    with pytest.raises(ValueError, match=r"attention_modules pattern 'blocks\.\*\.nope'.*module paths look like"):
        AttentionRecorder(TinyViT(), attention_modules=["blocks.*.nope"])


def test_attention_modules_on_a_fused_model_select_the_sdpa_calls_that_replaced_them():
    # timm's fused path calls F.scaled_dot_product_attention and never runs attn_drop: the README's
    # example pattern selects the attention of attn_drop's parent module.
    model = TinyViT(impl="sdpa").eval()
    x = torch.rand(2, 1, 8, 8)
    with AttentionRecorder(model, attention_modules="blocks.*.attn.attn_drop") as rec:
        model(x)
    assert [(r.path, r.source) for r in rec.records] == [(f"blocks.{i}.attn", "sdpa") for i in range(3)]
    with AttentionRecorder(model, attention_modules="blocks.1.attn.attn_drop") as rec:
        model(x)
    assert [r.path for r in rec.records] == ["blocks.1.attn"]
    assert _nothing_installed()


def test_attention_modules_naming_a_module_that_computes_attention():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    # nn.MultiheadAttention returns a tuple: the attention recorded inside it is what it selects.
    with AttentionRecorder(enc, attention_modules="layers.0.self_attn") as rec:
        enc(torch.randn(2, 5, 8))
    assert [(r.path, r.source) for r in rec.records] == [("layers.0.self_attn", "mha")]
    assert _nothing_installed()


def test_attention_module_without_probabilities_or_attention_inside():
    class Pair(nn.Module):
        def forward(self, x):
            return x, x.sum()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = Pair()
            self.vit = TinyViT()

        def forward(self, x):
            return self.vit(self.pair(x)[0])

    model = Model().eval()
    with pytest.raises(ValueError, match=r"attention module 'pair' \(Pair\) returned tuple and no attention was recorded inside it"):
        with AttentionRecorder(model, attention_modules="pair"):
            model(torch.rand(2, 1, 8, 8))
    assert _nothing_installed()


@pytest.mark.parametrize("attention_modules", [None, "blocks.*.attn.attn_drop"])
def test_nothing_is_left_installed_when_the_forward_raises(attention_modules):
    model = TinyViT(impl="einsum").eval()
    with pytest.raises(RuntimeError):
        with AttentionRecorder(model, attention_modules=attention_modules):
            model(torch.rand(2, 3, 8, 8))  # wrong channel count
    assert _nothing_installed()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())



def shown_once(call) -> bool:
    """Whether a warning shown once before ``call()`` stays silent after it (Python shows a warning once per place
    by default, unless the warning filters change in between, which makes it show every such warning again)."""
    import warnings

    def warn() -> None:
        warnings.warn("deprecated once", FutureWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        warnings.simplefilter("default")
        warn()
        call()
        warn()
    return [str(w.message) for w in shown if "deprecated once" in str(w.message)] == ["deprecated once"]


def test_explaining_does_not_show_a_warning_twice():
    """A capture that changed the warning filters for every model made Lightning's deprecation warning print twice
    in each fit; only a model holding a torch.compile wrapper needs them changed."""
    import torch._dynamo  # noqa: F401 - the capture's compiled-model path is taken whenever Dynamo is loaded

    from lightning_gae import explain

    assert shown_once(lambda: explain(TinyViT().eval(), torch.rand(2, 1, 8, 8)))


def test_the_lean_calls_take_a_token_made_on_their_own_device():
    # A token on the host would be copied to a GPU by every attention call and its gradient copied back, each copy
    # waiting for the GPU; the recorder makes one per device the calls run on (meta stands in for a GPU here).
    with torch.device("meta"):
        model = TinyViT()
    with AttentionRecorder(model, lean=True) as recorder:
        assert recorder.lean_tokens == {}
        model(torch.randn(2, 1, 8, 8, device="meta"))
    assert len(recorder.records) == 3
    assert [(d.type, t.device.type, t.requires_grad) for d, t in recorder.lean_tokens.items()] == [("meta", "meta", True)]
