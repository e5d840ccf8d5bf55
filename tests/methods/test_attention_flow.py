"""method="attention_flow" against a plain Edmonds-Karp oracle, its properties, and its refusals.

The oracle is written here and shares nothing with the library: the library solves integer
capacities with SciPy's Dinic on a graph without the unused top nodes; the oracle runs Edmonds-Karp
in float64 on the dense capacity matrix of the whole layered graph, one sample and one token at a
time, from attention read in float64 through the models' own explicit paths (tests/helpers/models.py).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import lightning_gae as lg
from lightning_gae.engine import rules
from lightning_gae.methods.attention_flow import allow_slow_attention_flow, attention_flow_seconds
from tests.helpers.explain import padded_ids
from tests.helpers.models import TinySeq2Seq, TinyViT, hf_reference, vit_reference
from tests.helpers.oracle import flow_row, max_flow

# The library's capacities are rounded to 2**-30; a flow moves by at most that per edge of a minimum cut.
TOL = 1e-6


def test_the_oracle_on_a_textbook_network():
    # CLRS figure 26.1: maximum flow 23.
    c = np.zeros((6, 6))
    for u, v, cap in [(0, 1, 16), (0, 2, 13), (1, 3, 12), (2, 1, 4), (2, 4, 14), (3, 2, 9), (3, 5, 20), (4, 3, 7), (4, 5, 4)]:
        c[u, v] = cap
    assert max_flow(c, 0, 5) == pytest.approx(23.0)


def assert_rows_match(exp, refs, queries, lengths=None):
    largest, worst = 0.0, 0.0
    for b, attns in enumerate(refs):
        expected = flow_row(attns, queries[b])
        n = expected.shape[0] if lengths is None else lengths[b]
        assert expected.shape[0] == n
        worst = max(worst, (exp.tokens[b, :n].double() - expected).abs().max().item())
        largest = max(largest, expected.abs().max().item())
        assert torch.all(exp.tokens[b, n:] == 0), "padding gets 0"
    assert largest > 0.1, "references of (near) zeros would prove nothing"
    assert worst < TOL, f"max abs error {worst:.2e}"
    return worst


# --- explain() against the oracle ------------------------------------------------------------------


@pytest.mark.parametrize("query", [None, "last", [0, 5, 16]])
def test_vit_equals_the_oracle(query):
    torch.manual_seed(0)
    model = TinyViT(depth=4, heads=4).eval()
    x = torch.rand(3, 1, 8, 8)
    exp = lg.explain(model, x, method="attention_flow", query=query)
    assert exp.method == "attention_flow" and exp.tokens.shape == (3, 17) and exp.tokens.dtype == torch.float32
    assert exp.layers == [f"blocks.{i}.attn" for i in range(4)], "every layer, like rollout"
    queries = [0, 0, 0] if query is None else [16, 16, 16] if query == "last" else query
    assert exp.query.tolist() == queries
    refs = [attns for attns, _ in vit_reference(model, x, lambda logits, b: logits[0, 0])]
    worst = assert_rows_match(exp, refs, queries)
    print(f"ViT, query={query}: max abs error {worst:.2e}")
    # Not rollout under another name: the flows are capped by cuts, rollout's path sums are not.
    rollout = lg.explain(model, x, method="rollout", query=query).tokens
    assert not torch.allclose(exp.tokens, rollout, atol=1e-2)


def _bert(layers=4):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(3)
    config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=3,
                                     initializer_range=0.2)
    sdpa = transformers.BertForSequenceClassification._from_config(config, attn_implementation="sdpa").eval()
    eager = transformers.BertForSequenceClassification._from_config(config, attn_implementation="eager").eval()
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


def test_padded_text_batch_equals_the_oracle_on_each_unpadded_sample():
    model, eager = _bert()
    lengths = [7, 4, 6]
    ids, mask = padded_ids(lengths)
    exp = lg.explain(model, {"input_ids": ids, "attention_mask": mask}, method="attention_flow")
    samples = [{"input_ids": ids[b : b + 1, :n], "attention_mask": mask[b : b + 1, :n]} for b, n in enumerate(lengths)]
    refs = [attns for attns, _ in hf_reference(eager, samples, lambda out, b: out.logits[0, 0])]
    worst = assert_rows_match(exp, refs, [0, 0, 0], lengths=lengths)
    print(f"padded BERT: max abs error {worst:.2e}")


def test_padded_keys_get_no_flow_before_any_masking():
    """A padded key has zero attention, so its node sends nothing past itself: flow 0 even when solved for."""
    model, _ = _bert(layers=3)
    lengths = [7, 3]
    ids, mask = padded_ids(lengths)
    from lightning_gae.engine.capture import AttentionRecorder

    with torch.no_grad(), AttentionRecorder(model) as recorder:
        model(input_ids=ids, attention_mask=mask)
    attns = [rec.as_heads() for rec in recorder.records]
    row = rules.attention_flow_row(attns, torch.tensor([0, 0]))  # every token solved, nothing masked
    assert torch.all(row[1, 3:] == 0) and torch.all(row[1, 1:3] > 0)
    assert torch.all(row[0, 1:] > 0)


def test_batched_equals_one_sample_at_a_time():
    torch.manual_seed(1)
    model = TinyViT(depth=5, heads=2).eval()
    x = torch.rand(4, 1, 8, 8)
    batch = lg.explain(model, x, method="attention_flow", query=[0, 3, 7, 16])
    for b, q in enumerate([0, 3, 7, 16]):
        alone = lg.explain(model, x[b : b + 1], method="attention_flow", query=q)
        torch.testing.assert_close(batch.tokens[b], alone.tokens[0], rtol=0, atol=TOL)
    model, _ = _bert()
    lengths = [7, 4, 6]
    ids, mask = padded_ids(lengths, seed=4)
    batch = lg.explain(model, {"input_ids": ids, "attention_mask": mask}, method="attention_flow", query="last")
    for b, n in enumerate(lengths):
        alone = lg.explain(model, {"input_ids": ids[b : b + 1, :n], "attention_mask": mask[b : b + 1, :n]},
                           method="attention_flow", query="last")
        torch.testing.assert_close(batch.tokens[b, :n], alone.tokens[0], rtol=0, atol=TOL)


def test_explain_methods_takes_it_with_the_others():
    from lightning_gae.methods import explain_methods

    torch.manual_seed(2)
    model, x = TinyViT().eval(), torch.rand(2, 1, 8, 8)
    together = explain_methods(model, x, ("gae", "attention_flow", "rollout"))
    torch.testing.assert_close(together["attention_flow"].tokens, lg.explain(model, x, method="attention_flow").tokens)


# --- properties that could fail --------------------------------------------------------------------


def _random_attention(batch, heads, n, layers, seed, sharp=4.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, heads, n, n, generator=g, dtype=torch.float64) * sharp).softmax(dim=-1)
            for _ in range(layers)]


def test_one_layer_is_the_readout_rows_capacity_and_two_layers_the_sum_of_two_hop_bottlenecks():
    # One layer: a single edge from (0, j) to (1, q).
    attns = _random_attention(2, 3, 6, 1, seed=0)
    query = torch.tensor([0, 4])
    caps = rules.attention_flow_capacities(attns)
    flows = rules.attention_flow_row(attns, query)
    torch.testing.assert_close(flows, caps[torch.arange(2), 0, query], rtol=0, atol=TOL)
    # Two layers: the paths (0, j) -> (1, i) -> (2, q) share no edge, so the flow is sum_i min(Â1[i, j], Â2[q, i]).
    attns = _random_attention(2, 3, 6, 2, seed=1)
    caps = rules.attention_flow_capacities(attns)
    flows = rules.attention_flow_row(attns, query)
    for b in range(2):
        a1, a2q = caps[b, 0], caps[b, 1, int(query[b])]
        expected = torch.minimum(a1, a2q[:, None]).sum(dim=0)  # [j]: sum over i of min(Â1[i, j], Â2[q, i])
        torch.testing.assert_close(flows[b], expected, rtol=0, atol=TOL)
    # ... which is not rollout's path sum (Â2 Â1)[q, j].
    rollout = torch.einsum("bi,bij->bj", caps[torch.arange(2), 1, query], caps[:, 0])
    assert (flows - rollout).abs().max() > 0.01


def test_flow_is_bounded_by_the_readouts_in_capacity_and_the_tokens_out_capacity():
    attns = _random_attention(3, 4, 9, 4, seed=2)
    query = torch.tensor([0, 3, 8])
    caps = rules.attention_flow_capacities(attns)
    flows = rules.attention_flow_row(attns, query)
    readout_in = caps[torch.arange(3), -1, query].sum(dim=-1)  # the readout node's in-capacity (1 after rownorm)
    token_out = caps[:, 0].sum(dim=1)  # [B, N]: what token j sends into layer 1 (a column sum)
    assert torch.all(flows <= readout_in[:, None] + TOL)
    assert torch.all(flows <= token_out + TOL)
    # Sharp attention leaves some tokens sending out less than 1: the bound binds there, and would not
    # hold if rows and columns were swapped (a row of Â sums to 1).
    assert (token_out < 0.9).any() and (flows < 0.9).any()
    # A lower bound as well: the token's own residual path (0, j) -> ... -> (L-1, j) -> (L, q) alone.
    own_path = torch.stack([caps[:, l].diagonal(dim1=-2, dim2=-1) for l in range(3)]).amin(dim=0)
    own_path = torch.minimum(own_path, caps[torch.arange(3), -1, query])
    assert torch.all(flows >= own_path - TOL)


def test_a_token_no_one_attends_to_has_no_flow():
    attns = _random_attention(1, 2, 7, 3, seed=3)
    for attn in attns:
        attn[..., 2] = 0.0  # no query attends to token 2 (its node keeps only the residual self-edge)
        attn /= attn.sum(dim=-1, keepdim=True)
    flows = rules.attention_flow_row(attns, torch.tensor([0]))
    assert flows[0, 2] == 0
    assert torch.all(flows[0, [1, 3, 4, 5, 6]] > 0)
    # Only in the first layer: the token reaches layer 1 through its own residual edge and flows on.
    attns = _random_attention(1, 2, 7, 3, seed=3)
    attns[0][..., 2] = 0.0
    assert rules.attention_flow_row(attns, torch.tensor([0]))[0, 2] > 0


# --- refusals and cost -----------------------------------------------------------------------------


def test_several_token_sets_are_refused_with_what_to_use():
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 5))
    with pytest.raises(ValueError, match=r"defined on one token set.*'rollout'"):
        lg.explain(model, (src, tgt), method="attention_flow", query=3)


def test_a_mean_readout_is_refused():
    model = TinyViT().eval()
    with pytest.raises(ValueError, match=r"query='mean'.*rollout"):
        lg.explain(model, torch.rand(2, 1, 8, 8), method="attention_flow", query="mean")


def test_a_size_that_would_take_minutes_is_refused_unless_allowed(monkeypatch):
    # 1025 tokens x 3 layers x 2 samples: 2050 max-flows on graphs of 2.1 million edges, minutes.
    model = TinyViT(image_size=32, patch=1, depth=3, heads=2, dim=8).eval()
    x = torch.rand(2, 1, 32, 32)
    assert attention_flow_seconds(2, 1025, 3) > 60
    with pytest.raises(ValueError, match=r"1025 tokens x 3 layers x 2 samples.*about \d+ s.*'rollout'.*allow_slow_attention_flow"):
        lg.explain(model, x, method="attention_flow")
    # The opt-in: under a lowered limit a small call is refused the same way, and runs inside the block.
    monkeypatch.setattr(importlib.import_module("lightning_gae.methods.attention_flow"), "ATTENTION_FLOW_MAX_SECONDS", 0.0)
    small, images = TinyViT().eval(), torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match=r"17 tokens x 3 layers x 2 samples"):
        lg.explain(small, images, method="attention_flow")
    with allow_slow_attention_flow():
        exp = lg.explain(small, images, method="attention_flow")
    assert exp.tokens.abs().sum() > 0
    with pytest.raises(ValueError, match="allow_slow_attention_flow"):
        lg.explain(small, images, method="attention_flow")  # the block is over
