"""Token sets: encoder-decoders, two towers and co-attention against the dense float64 oracle (Eq. 6-11)."""

import copy

import pytest
import torch
from torch import nn

import lightning_gae as lg
from tests.helpers.models import (
    TinyBlock,
    TinyCoAttention,
    TinyCrossAttention,
    TinySeq2Seq,
    TinyViT,
    coattention_reference,
    seq2seq_reference,
    tiny_clip,
    vit_reference,
)
from tests.helpers.oracle import gae_token_sets, relative_error, rollout_token_sets, token_set_readout

transformers = pytest.importorskip("transformers")

TOL = 1e-4


def assert_sets_match(exp, refs, sizes, query_set, queries, names=None, lengths=None, oracle=gae_token_sets):
    """Every set's row equals the oracle's (Eq. 6-11 from the recorded probabilities), sample by sample."""
    names = names or {s: s for s in sizes}
    largest = 0.0
    for b, steps in enumerate(refs):
        n = sizes if lengths is None else lengths[b]
        rel = oracle(steps, n)
        expected = token_set_readout(rel, query_set, queries[b], list(n))
        for oracle_name, row in expected.items():
            got = exp.relevance[names[oracle_name]][b, : row.shape[0]]
            largest = max(largest, row.abs().max().item())
            err = relative_error(got, row) if row.abs().max() > 0 else got.abs().max().item()
            assert err < TOL, f"sample {b}, set {oracle_name}: relative error {err:.2e}"
    assert largest > 0


# --- our own SDPA encoder-decoder with a causal decoder ----------------------------------------


@pytest.mark.parametrize("src_len,tgt_len", [(6, 6), (7, 4)])
def test_own_seq2seq_matches_oracle_at_equal_and_unequal_lengths(src_len, tgt_len):
    torch.manual_seed(0)
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (3, src_len)), torch.randint(0, 11, (3, tgt_len))
    j = tgt_len - 2
    exp = lg.explain(model, (src, tgt), query=j)
    assert exp.query_set == "decoder" and set(exp.relevance) == {"encoder", "decoder"}
    assert exp.relevance["encoder"].shape == (3, src_len) and torch.equal(exp.tokens, exp.relevance["decoder"])
    refs = seq2seq_reference(model, src, tgt, lambda logits, b: logits[0, j, int(exp.target[b])])
    assert_sets_match(exp, refs, {"encoder": src_len, "decoder": tgt_len}, "decoder", [j] * 3)
    # The causal decoder cannot see later target tokens.
    assert torch.all(exp.relevance["decoder"][:, j + 1 :] == 0)


@pytest.mark.parametrize("src_len,tgt_len", [(6, 6), (7, 4)])
def test_rollout_on_seq2seq_is_rollout_on_the_graph_of_all_tokens(src_len, tgt_len):
    """Cross-attention is a rollout step whose keys are the encoder's tokens; rows stay bounded."""
    torch.manual_seed(0)
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (3, src_len)), torch.randint(0, 11, (3, tgt_len))
    j = tgt_len - 2
    exp = lg.explain(model, (src, tgt), query=j, method="rollout")
    refs = seq2seq_reference(model, src, tgt, lambda logits, b: logits[0, j, 0])
    assert_sets_match(exp, refs, {"encoder": src_len, "decoder": tgt_len}, "decoder", [j] * 3, oracle=rollout_token_sets)
    # A rollout row is a distribution over all tokens: with the query's own entry, it sums to 1.
    own = rollout_token_sets(refs[0], {"encoder": src_len, "decoder": tgt_len})[("decoder", "decoder")][j, j]
    total = exp.relevance["encoder"][0].sum() + exp.relevance["decoder"][0].sum() + own
    assert abs(total.item() - 1.0) < 1e-5
    assert exp.relevance["encoder"].min() >= 0 and exp.relevance["encoder"].max() <= 1


def test_chaining_the_sets_would_differ():
    """The old single-stream engine chained all six calls; the token-set result is not that."""
    torch.manual_seed(0)
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 6))
    exp = lg.explain(model, (src, tgt), query=3)
    refs = seq2seq_reference(model, src, tgt, lambda logits, b: logits[0, 3, int(exp.target[b])])
    chained = [gae_token_sets([("x", "x", a, g) for _, _, a, g in steps], {"x": 6})[("x", "x")][3] for steps in refs]
    assert max(relative_error(exp.relevance["decoder"][b], chained[b]) for b in range(2)) > 1e-2


def test_batch_equals_one_by_one_on_seq2seq():
    torch.manual_seed(1)
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (4, 5)), torch.randint(0, 11, (4, 5))
    batch = lg.explain(model, (src, tgt), query=2, target=torch.arange(4))
    for b in range(4):
        alone = lg.explain(model, (src[b : b + 1], tgt[b : b + 1]), query=2, target=b)
        for s in ("encoder", "decoder"):
            torch.testing.assert_close(batch.relevance[s][b], alone.relevance[s][0], rtol=1e-5, atol=1e-7)


def test_declared_streams_give_the_same_answer_with_other_names():
    torch.manual_seed(2)
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))
    streams = lg.Streams(
        self_attention={"source": ["enc.*"], "target": ["dec_self.*"]},
        cross_attention={"dec_cross.*": ("target", "source")},
        query_set="target",
    )
    declared = lg.explain(model, (src, tgt), query=1, streams=streams)
    inferred = lg.explain(model, (src, tgt), query=1)
    torch.testing.assert_close(declared.relevance["source"], inferred.relevance["encoder"])
    torch.testing.assert_close(declared.relevance["target"], inferred.relevance["decoder"])


def test_a_call_no_declared_glob_matches_raises():
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (1, 5)), torch.randint(0, 11, (1, 5))
    streams = lg.Streams(self_attention={"source": ["enc.*"], "target": ["dec_self.*"]})
    with pytest.raises(ValueError, match=r"attention at 'dec_cross.0' matches none of the declared streams"):
        lg.explain(model, (src, tgt), streams=streams)


# --- LXMERT-style co-attention ------------------------------------------------------------------


@pytest.mark.parametrize("n_text,n_image", [(5, 5), (4, 7)])
def test_coattention_matches_oracle(n_text, n_image):
    torch.manual_seed(3)
    model = TinyCoAttention().eval()
    ids, feats = torch.randint(0, 13, (3, n_text)), torch.randn(3, n_image, 5)
    exp = lg.explain(model, (ids, feats))
    refs = coattention_reference(model, ids, feats, lambda logits, b: logits[0, int(exp.target[b])])
    names = {"text": "text_self", "image": "image_self"}
    assert exp.query_set == "text_self"
    assert_sets_match(exp, refs, {"text": n_text, "image": n_image}, "text", [0] * 3, names=names)
    rolled = lg.explain(model, (ids, feats), method="rollout")
    assert_sets_match(rolled, refs, {"text": n_text, "image": n_image}, "text", [0] * 3, names=names,
                      oracle=rollout_token_sets)
    batch = exp
    for b in range(3):
        alone = lg.explain(model, (ids[b : b + 1], feats[b : b + 1]), target=int(exp.target[b]))
        torch.testing.assert_close(batch.relevance["image_self"][b], alone.relevance["image_self"][0], rtol=1e-5, atol=1e-7)


# --- nn.MultiheadAttention self-attention with equal values, nn.Transformer ------------------------


class PosMHA(nn.Module):
    """Self-attention called as mha(x + pos, x + pos, x) and mha(norm(x), norm(x), norm(x))."""

    def __init__(self, dim=8, n=6, style="pos"):
        super().__init__()
        self.style = style
        self.pos = nn.Parameter(torch.randn(1, n, dim))
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(nn.MultiheadAttention(dim, 2, batch_first=True) for _ in range(2))
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        for mha in self.layers:
            if self.style == "pos":
                x = x + mha(x + self.pos, x + self.pos, x)[0]
            else:
                x = x + mha(self.norm(x), self.norm(x), self.norm(x))[0]
        return self.head(x[:, 0])


@pytest.mark.parametrize("style", ["pos", "norm"])
def test_mha_self_attention_with_equal_values_is_one_set(style):
    torch.manual_seed(4)
    model = PosMHA(style=style).eval()
    exp = lg.explain(model, torch.randn(2, 6, 8))
    assert list(exp.relevance) == ["tokens"] and exp.tokens.shape == (2, 6) and exp.tokens.abs().sum() > 0


class TorchSeq2Seq(nn.Module):
    def __init__(self, vocab=9, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.transformer = nn.Transformer(dim, 2, 2, 2, 16, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.head(self.transformer(self.embed(src), self.embed(tgt), tgt_mask=mask, tgt_is_causal=True))


def torch_seq2seq_reference(model, src, tgt, j, target):
    """A hand-written dense forward of nn.Transformer (post-norm) from its weights, one sample at a time."""
    import math

    m = copy.deepcopy(model).double().eval()
    tr = m.transformer

    def attention(mha, x, mem, mask=None):
        heads, dim = mha.num_heads, x.shape[-1]
        hd = dim // heads
        w_q, w_k, w_v = mha.in_proj_weight.chunk(3)
        b_q, b_k, b_v = mha.in_proj_bias.chunk(3)
        q, k, v = x @ w_q.T + b_q, mem @ w_k.T + b_k, mem @ w_v.T + b_v
        outs, probs = [], []
        for h in range(heads):
            s = slice(h * hd, (h + 1) * hd)
            scores = q[:, s] @ k[:, s].T / math.sqrt(hd)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            p = torch.softmax(scores, dim=-1)
            probs.append(p)
            outs.append(p @ v[:, s])
        return torch.cat(outs, -1) @ mha.out_proj.weight.T + mha.out_proj.bias, probs

    out = []
    for b in range(src.shape[0]):
        steps, flat = [], []
        h = m.embed(src[b])
        for layer in tr.encoder.layers:
            a, p = attention(layer.self_attn, h, h)
            steps.append(("encoder", "encoder", p))
            h = layer.norm1(h + a)
            h = layer.norm2(h + layer.linear2(torch.relu(layer.linear1(h))))
        memory = tr.encoder.norm(h)
        y = m.embed(tgt[b])
        causal = torch.ones(len(y), len(y), dtype=torch.bool).tril()
        for layer in tr.decoder.layers:
            a, p = attention(layer.self_attn, y, y, causal)
            steps.append(("decoder", "decoder", p))
            y = layer.norm1(y + a)
            a, p = attention(layer.multihead_attn, y, memory)
            steps.append(("decoder", "encoder", p))
            y = layer.norm2(y + a)
            y = layer.norm3(y + layer.linear2(torch.relu(layer.linear1(y))))
        logits = m.head(tr.decoder.norm(y))
        flat = [p for _, _, ps in steps for p in ps]
        grads = torch.autograd.grad(logits[j, target[b]], flat)
        heads = len(steps[0][2])
        out.append([(q, k, torch.stack([p.detach() for p in ps]), torch.stack(grads[i * heads : (i + 1) * heads]))
                    for i, (q, k, ps) in enumerate(steps)])
    return out


@pytest.mark.parametrize("src_len,tgt_len", [(5, 5), (6, 3)])
def test_nn_transformer_matches_oracle(src_len, tgt_len):
    torch.manual_seed(5)
    model = TorchSeq2Seq().eval()
    src, tgt = torch.randint(0, 9, (2, src_len)), torch.randint(0, 9, (2, tgt_len))
    j = tgt_len - 1
    exp = lg.explain(model, (src, tgt), query=j)
    assert exp.query_set == "decoder"
    refs = torch_seq2seq_reference(model, src, tgt, j, exp.target)
    assert_sets_match(exp, refs, {"encoder": src_len, "decoder": tgt_len}, "decoder", [j] * 2)


# --- Hugging Face T5 and BART, sdpa and eager ----------------------------------------------------


def _t5(impl):
    config = transformers.T5Config(vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2,
                                   num_heads=2, decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(6)
    return transformers.T5ForConditionalGeneration(config).eval(), impl


def _bart(impl):
    config = transformers.BartConfig(vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32)
    torch.manual_seed(7)
    return transformers.BartForConditionalGeneration(config).eval(), impl


def hf_seq2seq_reference(model, kwargs, j, target):
    m = copy.deepcopy(model).double().eval()
    m.set_attn_implementation("eager")
    out = []
    batch = kwargs["input_ids"].shape[0]
    for b in range(batch):
        one = {k: v[b : b + 1] for k, v in kwargs.items()}
        o = m(**one, output_attentions=True)
        enc, dec, cross = list(o.encoder_attentions), list(o.decoder_attentions), list(o.cross_attentions)
        order = [("encoder", "encoder", a) for a in enc]
        for d, c in zip(dec, cross):
            order += [("decoder", "decoder", d), ("decoder", "encoder", c)]
        grads = torch.autograd.grad(o.logits[0, j, target[b]], [a for _, _, a in order], allow_unused=True)
        out.append([(q, k, a[0].detach(), torch.zeros_like(a[0]) if g is None else g[0]) for (q, k, a), g in zip(order, grads)])
    return out


@pytest.mark.parametrize("family", [_t5, _bart])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("src_len,tgt_len", [(6, 6), (7, 4)])
def test_hf_encoder_decoders_match_oracle(family, impl, src_len, tgt_len):
    model, impl = family(impl)
    model.set_attn_implementation(impl)
    g = torch.Generator().manual_seed(8)
    kwargs = {"input_ids": torch.randint(3, 40, (2, src_len), generator=g),
              "decoder_input_ids": torch.randint(3, 40, (2, tgt_len), generator=g)}
    j = tgt_len - 1
    exp = lg.explain(model, kwargs, query=j)
    assert exp.query_set == "decoder" and set(exp.relevance) == {"encoder", "decoder"}
    refs = hf_seq2seq_reference(model, kwargs, j, exp.target)
    assert_sets_match(exp, refs, {"encoder": src_len, "decoder": tgt_len}, "decoder", [j] * 2)


def test_bart_given_only_input_ids_is_two_sets():
    model, _ = _bart("sdpa")
    ids = torch.randint(3, 40, (2, 6))
    exp = lg.explain(model, {"input_ids": ids}, query=2)
    assert set(exp.relevance) == {"encoder", "decoder"}
    assert exp.layers == [f"model.encoder.layers.{i}.self_attn" for i in range(2)] + [
        p for i in range(2) for p in (f"model.decoder.layers.{i}.self_attn", f"model.decoder.layers.{i}.encoder_attn")]


def test_bart_sequence_classification_reads_the_decoder_at_the_last_eos():
    config = transformers.BartConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32, num_labels=3)
    torch.manual_seed(9)
    model = transformers.BartForSequenceClassification(config).eval()
    ids = torch.tensor([[0, 5, 6, 7, 2, 1, 1], [0, 8, 9, 10, 11, 12, 2]])
    exp = lg.explain(model, {"input_ids": ids, "attention_mask": (ids != 1).long()})
    assert exp.query.tolist() == [4, 6]
    assert set(exp.relevance) == {"encoder", "decoder"}
    assert torch.all(exp.relevance["encoder"][0, 5:] == 0)


# --- Hugging Face CLIP: two towers with equal token counts -----------------------------------------


def clip_similarity(out):
    return out.logits_per_image.diagonal()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_clip_with_equal_token_counts_keeps_towers_apart(impl):
    model = tiny_clip()
    model.set_attn_implementation(impl)
    # 4 patches + CLS = 5 image tokens, and 5 text tokens: equal counts, the case that used to chain.
    ids = torch.tensor([[3, 4, 49, 0, 0], [5, 6, 7, 8, 49]])
    mask = (torch.arange(5)[None] <= torch.tensor([[2], [4]])).long()
    pixels = torch.randn(2, 3, 8, 8)
    kwargs = {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}
    exp = lg.explain(model, kwargs, target=clip_similarity)
    assert set(exp.relevance) == {"text", "image"} and exp.query_set == "image"
    # Padding of the text does not zero image patches.
    assert torch.all(exp.relevance["image"][0, 1:] != 0)
    assert torch.all(exp.relevance["text"][0, 3:] == 0)

    eager = copy.deepcopy(model).double()
    eager.set_attn_implementation("eager")
    for b in range(2):
        one = {k: v[b : b + 1].double() if v.is_floating_point() else v[b : b + 1] for k, v in kwargs.items()}
        o = eager(**one, output_attentions=True)
        n_text = int(mask[b].sum())
        text_att = list(o.text_model_output.attentions)
        image_att = list(o.vision_model_output.attentions)
        grads = torch.autograd.grad(o.logits_per_image[0, 0], text_att + image_att)
        eos = int((ids[b] == 49).nonzero()[0])
        text_steps = [("text", "text", a[0].detach(), g[0]) for a, g in zip(text_att, grads[: len(text_att)])]
        image_steps = [("image", "image", a[0].detach(), g[0]) for a, g in zip(image_att, grads[len(text_att):])]
        rel_t = gae_token_sets(text_steps, {"text": 5})
        rel_i = gae_token_sets(image_steps, {"image": 5})
        want_t = token_set_readout(rel_t, "text", eos, ["text"])["text"][:n_text]
        want_i = token_set_readout(rel_i, "image", 0, ["image"])["image"]
        assert relative_error(exp.relevance["text"][b, :n_text], want_t) < TOL
        assert relative_error(exp.relevance["image"][b], want_i) < TOL


class Holder(nn.Module):
    """A user's module around a known family (the way a LightningModule holds CLIP or BART)."""

    def __init__(self, inner):
        super().__init__()
        self.net = nn.ModuleDict({"inner": inner})

    def forward(self, **kwargs):
        return self.net["inner"](**kwargs)


def test_presets_apply_to_a_known_family_held_inside_another_module():
    clip = tiny_clip()
    ids = torch.tensor([[3, 4, 49, 0, 0], [5, 6, 7, 8, 49]])
    kwargs = {"input_ids": ids, "attention_mask": (ids != 0).long(), "pixel_values": torch.randn(2, 3, 8, 8)}
    alone = lg.explain(clip, kwargs, target=clip_similarity)
    held = lg.explain(Holder(clip), kwargs, target=clip_similarity)
    assert set(held.relevance) == {"text", "image"}
    for x in ("text", "image"):
        torch.testing.assert_close(held.relevance[x], alone.relevance[x])

    bart, _ = _bart("eager")
    src = {"input_ids": torch.randint(3, 40, (2, 6)), "decoder_input_ids": torch.randint(3, 40, (2, 6))}
    alone = lg.explain(bart, src, query=4)
    held = lg.explain(Holder(bart), src, query=4)
    assert held.layers == [f"net.inner.{p}" for p in alone.layers]
    for x in ("encoder", "decoder"):
        torch.testing.assert_close(held.relevance[x], alone.relevance[x])


# --- the same module run twice in one forward: a bi-encoder ------------------------------------------


class BiEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=16)
        torch.manual_seed(11)
        self.bert = transformers.BertModel(config, add_pooling_layer=False)

    def forward(self, a, b):
        return (self.bert(a).last_hidden_state[:, 0] * self.bert(b).last_hidden_state[:, 0]).sum(-1)


def test_bi_encoder_calling_one_bert_twice_gives_two_sets():
    model = BiEncoder().eval()
    a, b = torch.randint(1, 30, (2, 5)), torch.randint(1, 30, (2, 5))
    exp = lg.explain(model, (a, b), target=lambda out: out)
    assert sorted(exp.relevance) == ["bert", "bert#1"]
    # Each tower is what explaining the score through that tower alone gives: compare with the oracle
    # on bert's own attention, tower by tower.
    eager = copy.deepcopy(model).double()
    eager.bert.set_attn_implementation("eager")
    for s in range(2):
        oa = eager.bert(a[s : s + 1], output_attentions=True)
        ob = eager.bert(b[s : s + 1], output_attentions=True)
        score = (oa.last_hidden_state[:, 0] * ob.last_hidden_state[:, 0]).sum()
        atts = list(oa.attentions) + list(ob.attentions)
        grads = torch.autograd.grad(score, atts)
        for name, part, gpart in (("bert", atts[:2], grads[:2]), ("bert#1", atts[2:], grads[2:])):
            rel = gae_token_sets([("x", "x", t[0].detach(), g[0]) for t, g in zip(part, gpart)], {"x": 5})
            want = token_set_readout(rel, "x", 0, ["x"])["x"]
            assert relative_error(exp.relevance[name][s], want) < TOL


# --- readouts ------------------------------------------------------------------------------------


def test_query_mean_is_the_mean_of_the_real_rows():
    """For mean-pooled models: the mean of R's rows over the real tokens, the identity part removed."""
    from lightning_gae.engine import rules

    torch.manual_seed(12)
    model = TinyViT().eval()
    x = torch.rand(2, 1, 8, 8)
    exp = lg.explain(model, x, query="mean", target=1)
    assert exp.query is None
    refs = [gae_token_sets([("x", "x", a, g) for a, g in zip(*ref)], {"x": 17})[("x", "x")]
            for ref in vit_reference(model, x, lambda logits, b: logits[0, 1])]
    for b, matrix in enumerate(refs):
        want = matrix.mean(dim=0) - torch.full((17,), 1 / 17, dtype=torch.float64)
        assert relative_error(exp.tokens[b], want) < TOL
    assert rules.start_rows(torch.ones(2, 17) / 17, 17).shape == (2, 17)


def test_query_on_a_padded_position_raises():
    config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.tensor([[2, 5, 6, 0, 0]])
    with pytest.raises(ValueError, match=r"query \[4\] lands on a padded position in samples \[0\]"):
        lg.explain(model, {"input_ids": ids, "attention_mask": (ids != 0).long()}, query=4)


# --- what cannot be assigned raises ------------------------------------------------------------------


def test_kv_cache_decode_step_raises_and_says_what_to_do():
    config = transformers.GPT2Config(vocab_size=30, n_embd=16, n_layer=2, n_head=2, n_positions=16)
    torch.manual_seed(13)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 30, (1, 5))
    with torch.no_grad():
        past = model(ids, use_cache=True).past_key_values
    with pytest.raises(ValueError, match=r"KV cache.*use_cache=False"):
        lg.explain(model, {"input_ids": ids[:, -1:], "past_key_values": past, "use_cache": True}, query="last")


# --- attention pooling with one learned query (timm global_pool="map", SigLIP's head) ---------------


class MapPooled(nn.Module):
    """Self-attention blocks, then one learned probe token attending to all tokens: the readout."""

    def __init__(self, impl="sdpa"):
        super().__init__()
        self.blocks = nn.ModuleList(TinyBlock(16, 2, impl) for _ in range(2))
        self.probe = nn.Parameter(torch.randn(1, 1, 16))
        self.pool = TinyCrossAttention(16, 2, impl)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.pool(self.probe.expand(x.shape[0], -1, -1), x)[:, 0])


def test_attention_pooling_probe_is_read_as_the_readout():
    torch.manual_seed(14)
    model = MapPooled().eval()
    x = torch.randn(2, 6, 16)
    exp = lg.explain(model, x, target=1)
    assert list(exp.relevance) == ["tokens"] and exp.tokens.shape == (2, 6)
    ref = copy.deepcopy(model).double()
    for m in ref.modules():
        if hasattr(m, "impl"):
            m.impl = "manual"
    for b in range(2):
        logits = ref(x[b : b + 1].double())
        probs = [blk.attn.probs for blk in ref.blocks] + [ref.pool.probs]
        grads = torch.autograd.grad(logits[0, 1], probs)
        steps = [("x", "x", p[0].detach(), g[0]) for p, g in zip(probs[:-1], grads[:-1])]
        steps.append(("p", "x", probs[-1][0].detach(), grads[-1][0]))
        rel = gae_token_sets(steps, {"x": 6, "p": 1})
        assert relative_error(exp.tokens[b], rel[("p", "x")][0]) < TOL


# --- a batch explains each sample as it would be explained alone ---------------------------------


def _batch_cases():
    def t5():
        model, _ = _t5("sdpa")
        g = torch.Generator().manual_seed(15)
        return model, {"input_ids": torch.randint(3, 40, (3, 5), generator=g),
                       "decoder_input_ids": torch.randint(3, 40, (3, 4), generator=g)}, 2, None

    def bart():
        model, _ = _bart("eager")
        model.set_attn_implementation("eager")
        g = torch.Generator().manual_seed(16)
        return model, {"input_ids": torch.randint(3, 40, (3, 6), generator=g),
                       "decoder_input_ids": torch.randint(3, 40, (3, 6), generator=g)}, 3, None

    def clip():
        ids = torch.tensor([[3, 4, 49, 0, 0], [5, 6, 7, 8, 49], [9, 49, 0, 0, 0]])
        return tiny_clip(), {"input_ids": ids, "attention_mask": (ids != 0).long(),
                         "pixel_values": torch.randn(3, 3, 8, 8)}, None, clip_similarity

    def torch_transformer():
        torch.manual_seed(17)
        return TorchSeq2Seq().eval(), (torch.randint(0, 9, (3, 5)), torch.randint(0, 9, (3, 4))), 3, None

    return {"t5": t5, "bart": bart, "clip": clip, "nn_transformer": torch_transformer}


def _take(inputs, b):
    if isinstance(inputs, dict):
        return {k: v[b : b + 1] for k, v in inputs.items()}
    return tuple(t[b : b + 1] for t in inputs)


@pytest.mark.parametrize("case", ["t5", "bart", "clip", "nn_transformer"])
def test_batch_equals_one_by_one(case):
    model, inputs, query, target = _batch_cases()[case]()
    batch = lg.explain(model, inputs, query=query, target=target)
    for b in range(3):
        one = _take(inputs, b)
        if case == "clip":
            # A sample alone is unpadded: drop its padding to compare the real tokens.
            n = int(one["attention_mask"].sum())
            one = {"input_ids": one["input_ids"][:, :n], "attention_mask": one["attention_mask"][:, :n],
                   "pixel_values": one["pixel_values"]}
        alone = lg.explain(model, one, query=query, target=target if target else int(batch.target[b]))
        for name, rows in alone.relevance.items():
            n = rows.shape[1]
            torch.testing.assert_close(batch.relevance[name][b, :n], rows[0], rtol=1e-4, atol=1e-6)
            assert torch.all(batch.relevance[name][b, n:] == 0)


def test_a_frozen_model_named_by_attention_modules_stays_one_set():
    """Hook-recorded probabilities of a frozen model are leaves: later layers still descend from them."""
    torch.manual_seed(18)
    model = TinyViT(impl="einsum").eval().requires_grad_(False)
    x = torch.rand(2, 1, 8, 8)
    exp = lg.explain(model, x, attention_modules=["blocks.*.attn.attn_drop"])
    assert list(exp.relevance) == ["tokens"] and exp.layers == [f"blocks.{i}.attn.attn_drop" for i in range(3)]
    model.requires_grad_(True)
    torch.testing.assert_close(exp.tokens, lg.explain(model, x, attention_modules=["blocks.*.attn.attn_drop"]).tokens)
