"""lightning_gae.metrics.functional.health: the identity check, the random floor and ties, against plain loops."""

import math
import random

import pytest
import torch

from lightning_gae.metrics.functional.health import (
    STDERR_FACTOR,
    beside_identity,
    differs_beyond_stderr,
    identity_dominated,
    not_better_than_random,
    relevance_concentration,
    tied_groups,
)


def beside_loop(row, query):
    if not all(math.isfinite(v) for v in row):
        return math.nan
    return max((abs(v) for n, v in enumerate(row) if n != query), default=0.0)


def test_beside_identity_is_the_plain_loop():
    relevance = torch.tensor([
        [0.0, 1e-6, -3e-6, 0.0],
        [1.4, 0.2, -0.5, 0.1],           # a row with its identity entry (query 0)
        [0.0, 0.0, 0.0, 0.0],
        [0.1, float("nan"), 0.0, 0.0],
    ])
    got = beside_identity(relevance).tolist()
    expected = [beside_loop(r, None) for r in relevance.tolist()]
    for query in (0, torch.tensor([0, 0, 3, 1])):
        q = [query] * 4 if isinstance(query, int) else query.tolist()
        with_query = beside_identity(relevance, query).tolist()
        for a, e in zip(with_query, [beside_loop(r, qq) for r, qq in zip(relevance.tolist(), q)]):
            assert (math.isnan(a) and math.isnan(e)) or a == pytest.approx(e)
    for a, e in zip(got, expected):
        assert (math.isnan(a) and math.isnan(e)) or a == pytest.approx(e)
    assert beside_identity(relevance, 0)[1].item() == pytest.approx(0.5)     # the 1.4 left out


def test_identity_dominated_rows_are_those_below_the_tolerance_and_never_broken_ones():
    relevance = torch.tensor([[0.0, 1e-6, 0.0], [0.0, 0.0, 0.0], [0.0, 0.2, 0.0], [0.0, float("inf"), 0.0]])
    assert identity_dominated(relevance).tolist() == [True, True, False, False]
    assert identity_dominated(relevance, tolerance=0.5).tolist() == [True, True, True, False]
    with pytest.raises(ValueError, match="tolerance must be > 0"):
        identity_dominated(relevance, tolerance=0)


def differs_loop(a, se_a, b, se_b):
    """The README's rule: a difference beyond 2 standard errors of the difference (2 * sqrt(2) * se for equal se)."""
    if any(math.isnan(v) for v in (a, se_a, b, se_b)):
        return False
    return abs(a - b) > 2 * math.sqrt(se_a**2 + se_b**2)


def test_differs_beyond_stderr_is_the_readmes_rule():
    assert STDERR_FACTOR == 2.0
    rng = random.Random(0)
    for _ in range(500):
        a, b = rng.uniform(0, 10), rng.uniform(0, 10)
        se_a, se_b = rng.uniform(0, 3), rng.uniform(0, 3)
        assert differs_beyond_stderr(a, se_a, b, se_b) == differs_loop(a, se_a, b, se_b)
    # Equal errors: about 2.8 of them, as the README says.
    assert differs_beyond_stderr(0.0, 1.0, 2.9, 1.0) and not differs_beyond_stderr(0.0, 1.0, 2.8, 1.0)
    assert not differs_beyond_stderr(0.0, math.nan, 100.0, 1.0)


def test_not_better_than_random_in_both_directions():
    # Higher is better (negative perturbation AUC): better means above random beyond the errors.
    assert not not_better_than_random(50.0, 1.0, 40.0, 1.0, higher_is_better=True)
    assert not_better_than_random(42.0, 1.0, 40.0, 1.0, higher_is_better=True)      # within the errors
    assert not_better_than_random(30.0, 1.0, 40.0, 1.0, higher_is_better=True)      # worse, far
    # Lower is better (positive perturbation AUC): the 6th issue's GAE, worse than random, is flagged.
    assert not_better_than_random(45.0, 1.0, 40.0, 1.0, higher_is_better=False)
    assert not not_better_than_random(30.0, 1.0, 40.0, 1.0, higher_is_better=False)
    assert not_better_than_random(30.0, math.nan, 40.0, 1.0, higher_is_better=False)   # one sample: not shown
    rng = random.Random(1)
    for _ in range(500):
        v, r, se, se_r, hib = rng.uniform(0, 10), rng.uniform(0, 10), rng.uniform(0, 2), rng.uniform(0, 2), rng.random() < 0.5
        better = (v > r if hib else v < r) and differs_loop(v, se, r, se_r)
        assert not_better_than_random(v, se, r, se_r, hib) == (not better)


def groups_loop(values, stderrs, higher_is_better):
    """Best first; a new group whenever a method differs from the first method of the group it would join."""
    order = sorted((n for n in values if not math.isnan(values[n])),
                   key=lambda n: values[n], reverse=higher_is_better)
    groups = []
    for name in order:
        if groups and not differs_loop(values[groups[-1][0]], stderrs[groups[-1][0]], values[name], stderrs[name]):
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups + [[n] for n in values if math.isnan(values[n])]


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_tied_groups_is_the_plain_loop_and_every_member_is_tied_with_its_head(higher_is_better):
    rng = random.Random(2)
    for _ in range(200):
        names = [f"m{i}" for i in range(rng.randint(1, 7))]
        values = {n: rng.choice([math.nan] + [rng.uniform(0, 10)] * 6) for n in names}
        stderrs = {n: rng.uniform(0, 2) for n in names}
        groups = tied_groups(values, stderrs, higher_is_better)
        assert groups == groups_loop(values, stderrs, higher_is_better)
        assert sorted(n for g in groups for n in g) == sorted(names)
        for group in groups:
            head = group[0]
            assert all(not differs_beyond_stderr(values[head], stderrs[head], values[n], stderrs[n]) for n in group[1:])


def test_tied_groups_by_hand_and_its_checks():
    # gae and rollout are not told apart; raw and random are not; the two pairs are.
    values = {"raw": 48.0, "gae": 35.2, "random": 47.5, "rollout": 36.0}
    stderrs = {"raw": 1.2, "gae": 1.4, "random": 1.3, "rollout": 1.5}
    assert tied_groups(values, stderrs, higher_is_better=False) == [["gae", "rollout"], ["random", "raw"]]
    assert tied_groups(values, stderrs, higher_is_better=True) == [["raw", "random"], ["rollout", "gae"]]
    with pytest.raises(ValueError, match=r"no standard error for \['gae'\]"):
        tied_groups({"gae": 1.0}, {}, higher_is_better=True)


def test_a_gae_row_that_shrank_to_the_identity_is_flagged_and_a_live_one_is_not():
    # GAE's terms scale with the explained score's gradient (GAE_SPEC section 11): the same ViT with its head
    # scaled down by 1e-6 explains with relevance ~1e-6 of the identity, as a saturated model does.
    import lightning_gae as lg
    from recipes.vit import ViT

    torch.manual_seed(0)
    model = ViT(dim=32, depth=2, heads=2, dropout=0.0).eval()
    images = torch.rand(4, 1, 8, 8)
    live = lg.explain(model, images, target=0).tokens
    with torch.no_grad():
        model.head.weight.mul_(1e-6)
        model.head.bias.mul_(1e-6)
    shrunk = lg.explain(model, images, target=0).tokens
    assert not identity_dominated(live).any() and identity_dominated(shrunk).all()
    torch.testing.assert_close(beside_identity(shrunk), 1e-6 * beside_identity(live), rtol=1e-2, atol=0)


def test_relevance_concentration_is_a_share_for_every_registered_method():
    # A tiny Hugging Face BERT (seed 1): AttnLRP's signed relevance sums to ~4e-4 on one sentence, and the share of a
    # signed total reached 2.5e6 there; the share of the positive part always lies in [0, 1].
    from transformers import BertConfig, BertForSequenceClassification

    from lightning_gae.attribution import attribute
    from lightning_gae.methods.registry import method_names

    torch.manual_seed(1)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, num_labels=2)).eval()
    ids = torch.randint(5, 50, (16, 12))
    ids[:, 0] = 1
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for method in method_names():
        relevance = attribute(method, model, inputs).reshape(16, -1)
        shares = relevance_concentration(relevance, 0.1)
        assert not shares.isnan().all(), method
        assert 0.0 <= shares.nanmean().item() <= 1.0, (method, shares)
        assert ((shares >= 0) & (shares <= 1) | shares.isnan()).all(), (method, shares)
    # No positive relevance, no share: NaN.
    assert relevance_concentration(torch.tensor([[0.0, 0.0], [-1.0, -2.0]]), 0.5).isnan().all()
