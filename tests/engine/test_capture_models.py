"""The capture on real models it used to miss or misread, and its refusals (issue 10, items 10-17).

Explanations are checked against the dense per-sample float64 oracle (``tests/helpers/explain.py``).
"""

import logging
import warnings

import pytest
import torch
from torch import nn

import lightning_gae as lg
from lightning_gae.engine.capture import AttentionRecord, AttentionRecorder
from tests.helpers.explain import METHODS, assert_matches_reference, logit_score, padded_ids, recorded_rows
from tests.helpers.models import PrototypeViT, TinyViT, hf_reference, vit_reference
from lightning_gae.engine.forward import attended_keys

transformers = pytest.importorskip("transformers")


# --- item 10: softmax -> dropout -> view -> bmm (BLOOM, DeBERTa-v2 eager) ----------------------


def _bloom():
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(11)
    # A wider init than the default 0.02 gives attention far from uniform, so the maps differ per token.
    config = BloomConfig(vocab_size=50, hidden_size=32, n_layer=3, n_head=4, initializer_range=0.5)
    return BloomForCausalLM._from_config(config, attn_implementation="eager").eval()


def _deberta():
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    torch.manual_seed(12)
    config = DebertaV2Config(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=32, num_labels=3, initializer_range=0.3)
    return DebertaV2ForSequenceClassification._from_config(config, attn_implementation="eager").eval()


@pytest.mark.parametrize("build,heads_path", [(_bloom, "transformer.h.{}.self_attention"),
                                              (_deberta, "deberta.encoder.layer.{}.attention.self")], ids=["bloom", "deberta"])
def test_recorded_tensor_is_the_per_sample_one_multiplied_with_values(build, heads_path):
    model = build()
    ids, mask = padded_ids([6, 4], vocab=50, seed=2)
    with AttentionRecorder(model) as rec:
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert [r.path for r in rec.records] == [heads_path.format(i) for i in range(3)]
    # Before the view that folds the heads into the bmm's batch: [B, H, N, N], the probabilities
    # the model itself returns (after its dropout, which is what the bmm multiplies with V).
    for record, returned in zip(rec.records, out.attentions):
        assert record.tensor.shape == (2, 4, 6, 6)
        assert record.tensor is returned


@pytest.mark.parametrize("method", METHODS)
def test_bloom_eager_with_alibi(method):
    model = _bloom()
    lengths = [6, 4, 5]
    ids, mask = padded_ids(lengths, vocab=50, seed=3)
    exp = lg.explain(model, {"input_ids": ids, "attention_mask": mask}, query="last", method=method)
    assert exp.query.tolist() == [5, 3, 4]
    samples = [{"input_ids": ids[b : b + 1, :n]} for b, n in enumerate(lengths)]
    refs = hf_reference(model, samples, lambda out, b: out.logits[0, lengths[b] - 1, int(exp.target[b])])
    assert_matches_reference(exp, refs, method, lengths=lengths)


@pytest.mark.parametrize("method", METHODS)
def test_deberta_v2_eager_with_disentangled_attention(method):
    model = _deberta()
    lengths = [7, 4, 6]
    ids, mask = padded_ids(lengths, vocab=50, seed=4)
    exp = lg.explain(model, {"input_ids": ids, "attention_mask": mask}, method=method)
    assert len(exp.layers) == (3 if method in ("gae", "rollout", "attention_flow") else 1)
    samples = [{"input_ids": ids[b : b + 1, :n], "attention_mask": mask[b : b + 1, :n]} for b, n in enumerate(lengths)]
    refs = hf_reference(model, samples, lambda out, b: out.logits[0, int(exp.target[b])])
    assert_matches_reference(exp, refs, method, lengths=lengths)


@pytest.mark.parametrize("build", [_bloom, _deberta], ids=["bloom", "deberta"])
def test_frozen_models_give_the_same_explanation(build):
    # Frozen weights and integer ids build no graph: the gradient must still reach the probabilities
    # through the reshape that follows them.
    model = build()
    ids, mask = padded_ids([6, 4], vocab=50, seed=5)
    inputs = {"input_ids": ids, "attention_mask": mask}
    expected = lg.explain(model, inputs, query="last").tokens
    model.requires_grad_(False)
    got = lg.explain(model, inputs, query="last").tokens
    assert got.abs().max() > 0
    torch.testing.assert_close(got, expected)


def test_a_reshape_that_breaks_query_by_key_is_not_followed():
    class Flattened(nn.Module):
        def forward(self, q, v):
            probs = (q @ q.transpose(-2, -1)).softmax(dim=-1)  # [B, N, N]
            return probs.reshape(q.shape[0], 1, -1) @ v  # [B, 1, N*N] @ [B, N*N, D]: no query x key left

    q, v = torch.randn(2, 3, 4), torch.randn(2, 9, 4)
    with AttentionRecorder(Flattened()) as rec:
        Flattened()(q, v)
    assert rec.records == []


# --- item 11: attention_modules keeps fused attention visible ---------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "manual", "einsum"])
def test_the_readme_attention_modules_example_on_every_attention_implementation(impl):
    torch.manual_seed(20)
    model = TinyViT(impl=impl).eval()
    x = torch.rand(3, 1, 8, 8)
    exp = lg.explain(model, x, target=4, attention_modules=["blocks.*.attn.attn_drop"])
    for block in model.blocks:
        block.attn.probs = None  # the manual path keeps a graph tensor, which deepcopy refuses
    assert_matches_reference(exp, vit_reference(model, x, logit_score(exp)), "gae")


# --- item 12: refusals that say what is unsupported; hints that work ---------------------------


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_swin_windowed_attention_is_refused_plainly(impl):
    from transformers import SwinConfig, SwinForImageClassification

    torch.manual_seed(13)
    config = SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                        window_size=4, num_labels=3)
    model = SwinForImageClassification._from_config(config, attn_implementation=impl).eval()
    with pytest.raises(ValueError) as info:
        lg.explain(model, {"pixel_values": torch.randn(2, 3, 32, 32)})
    message = str(info.value)
    assert "attention at 'swin.encoder.layers.0.blocks.0.attention' has leading dimension 8 = 2 x 4 for a batch of 2" in message
    assert "windowed and batch-folded attention are not supported" in message
    assert "attention_modules" not in message, "no module of Swin holds per-sample attention: no hint may suggest one"


def _bert_eager():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(14)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3)
    return BertForSequenceClassification._from_config(config, attn_implementation="eager").eval()


@pytest.mark.parametrize("pattern", ["bert.encoder.layer.*.attention.self.dropout", "bert.encoder.layer.*.attention.self"])
def test_hugging_face_attention_modules_that_return_no_probabilities_still_select(pattern):
    # Transformers 5 computes eager attention in eager_attention_forward with F.dropout: the
    # self-attention module's nn.Dropout never runs and the module returns a tuple.
    model = _bert_eager()
    ids, mask = padded_ids([7, 5])
    batch = {"input_ids": ids, "attention_mask": mask}
    expected = lg.explain(model, batch)
    got = lg.explain(model, batch, attention_modules=pattern)
    assert got.layers == expected.layers == [f"bert.encoder.layer.{i}.attention.self" for i in range(3)]
    assert torch.equal(got.tokens, expected.tokens)


def test_attention_modules_selects_one_tower_of_an_encoder_decoder():
    torch.manual_seed(21)
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16,
                           batch_first=True).eval()
    inputs = (torch.randn(2, 5, 8), torch.randn(2, 3, 8))
    both = lg.explain(model, inputs, target=lambda out: out[:, 0, 0])
    assert set(both.relevance) == {"encoder", "decoder"}
    # nn.MultiheadAttention returns a tuple: naming it selects the attention recorded inside it.
    exp = lg.explain(model, inputs, target=lambda out: out[:, 0, 0], attention_modules="encoder.layers.*.self_attn")
    assert exp.layers == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    assert exp.tokens.shape == (2, 5) and exp.tokens.abs().max() > 0


def test_the_no_attention_error_says_what_was_seen_and_its_hint_works():
    torch.manual_seed(15)
    model = TinyViT(impl="einsum").eval()
    x = torch.rand(3, 1, 8, 8)
    with pytest.raises(ValueError) as info:
        lg.explain(model, x, target=4)
    message = str(info.value)
    assert "F.scaled_dot_product_attention 0 time(s) and F.multi_head_attention_forward 0 time(s)" in message
    assert "softmax over the last dim in 'blocks.0.attn', 'blocks.1.attn', 'blocks.2.attn'" in message
    assert "passed to torch.functional.einsum" in message
    hint = "pass attention_modules=['blocks.*.attn.attn_drop']"
    assert hint in message
    exp = lg.explain(model, x, target=4, attention_modules=["blocks.*.attn.attn_drop"])
    assert_matches_reference(exp, vit_reference(model, x, logit_score(exp)), "gae")


def test_the_no_attention_error_of_a_model_without_softmax_attention():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"no attention was recorded from Sequential: .* 0 time\(s\); it took no softmax "
                                         r"over the last dim\. No module of this model outputs the softmax probabilities"):
        lg.explain(mlp, torch.randn(2, 4))


# --- item 13: a softmax -> matmul that is not attention ----------------------------------------


@pytest.mark.parametrize("per_token", [False, True], ids=["cls_feature", "every_token"])
def test_a_prototype_head_is_not_taken_for_attention(per_token, caplog):
    torch.manual_seed(16)
    model = PrototypeViT(per_token).eval()
    x = torch.rand(3, 1, 8, 8)
    with caplog.at_level(logging.DEBUG, logger="lightning_gae"):
        exp = lg.explain(model, x)
    assert exp.layers == [f"blocks.{i}.attn" for i in range(3)]
    assert_matches_reference(exp, vit_reference(model, x, logit_score(exp)), "gae")
    reason = "right operand of shape [6, 5] is not values" if per_token else "softmax output of shape [3, 6] has no [batch, query, key] layout"
    assert any(r.name == "lightning_gae" and "not attention at '<model>'" in r.getMessage() and reason in r.getMessage()
               for r in caplog.records)
    with AttentionRecorder(model) as rec:
        model(x)
    assert len(rec.records) == 3 and [path for path, _ in rec.ignored] == [""]


# --- item 14: torch.compile -------------------------------------------------------------------


class Wrapper(nn.Module):
    """A LightningModule-like owner of a compiled network."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_models_are_explained_as_the_original(backend):
    torch.manual_seed(17)
    model = TinyViT(dim=16, depth=2, heads=2).eval()
    x = torch.rand(2, 1, 8, 8)
    expected = lg.explain(model, x, target=1)
    compiled = torch.compile(model, backend=backend)
    compiled(x)  # compile before explaining, as a model compiled for training would be
    top = lg.explain(compiled, x, target=1)
    assert top.layers == expected.layers
    torch.testing.assert_close(top.tokens, expected.tokens, rtol=1e-5, atol=1e-7)
    owner = Wrapper(compiled)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nested = lg.explain(owner, x, target=1)
    assert nested.layers == [f"net._orig_mod.blocks.{i}.attn" for i in range(2)]
    torch.testing.assert_close(nested.tokens, expected.tokens, rtol=1e-5, atol=1e-7)
    # The compiler's stance is back: the compiled module still runs compiled, and gives the same logits.
    assert torch._dynamo.eval_frame._stance.stance == "default"
    torch.testing.assert_close(owner(x), model(x), rtol=1e-5, atol=1e-6)


# --- item 15: layers on different devices ------------------------------------------------------


# Attention flow solves its max flows on the attention's values with SciPy, which meta tensors do not have.
@pytest.mark.parametrize("method", [m for m in METHODS if m != "attention_flow"])
def test_layers_on_different_devices_meet_on_the_rows_device(method):
    # Only a CPU exists here; "meta" tensors stand for a second device (shapes only): a model split
    # with device_map records each layer, and its gradient, on that layer's device.
    g = torch.Generator().manual_seed(18)
    cpu = torch.rand(2, 3, 5, 5, generator=g).softmax(-1)
    meta = torch.empty(2, 3, 5, 5, device="meta")
    layers = [AttentionRecord("a", 0, cpu, "sdpa"), AttentionRecord("b", 1, meta, "sdpa")]
    grads = [torch.randn(2, 3, 5, 5, generator=g), torch.empty(2, 3, 5, 5, device="meta")]
    query = torch.zeros(2, dtype=torch.long, device="meta")
    keep = torch.ones(2, 5, dtype=torch.bool, device="meta")
    # GAE's Ā of each layer is made on that layer's device.
    row = recorded_rows(method, layers, grads, query, keep)
    assert row.device.type == "meta" and row.shape == (2, 5)
    # The keys attended anywhere, gathered on the first layer's device (data cannot leave "meta").
    assert attended_keys(layers[::-1]).device.type == "meta"


# --- item 17: models whose prediction is not read from a CLS token ------------------------------


def test_mean_pooled_hugging_face_model_warns_to_use_the_mean_query():
    from transformers import BeitConfig, BeitForImageClassification

    torch.manual_seed(19)
    config = BeitConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, num_labels=3)
    assert config.use_mean_pooling
    model = BeitForImageClassification._from_config(config).eval()
    x = {"pixel_values": torch.randn(2, 3, 16, 16)}
    with pytest.warns(UserWarning, match=r"BeitForImageClassification pools the mean of its tokens \(config\.use_mean_pooling=True\).*query=\"mean\""):
        exp = lg.explain(model, x)
    assert exp.tokens.shape == (2, 17)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lg.explain(model, x, query=3)  # an explicit other token is the user's choice


class AvgPoolViT(TinyViT):
    """timm's ``global_pool="avg"``: the head reads the mean of the patch tokens."""

    global_pool = "avg"

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 1:].mean(1))


def test_average_pooled_timm_like_model_warns():
    x = torch.rand(2, 1, 8, 8)
    with pytest.warns(UserWarning, match=r"AvgPoolViT pools its tokens \(global_pool='avg'\)"):
        lg.explain(AvgPoolViT().eval(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lg.explain(TinyViT().eval(), x)
