import pytest
import torch

from lightning_gae.engine import rules
from tests.helpers.oracle import gae_matrix, gradcam_matrix, head_average, raw_attention_matrix, relative_error, rollout_matrix


def _layers(batch=3, heads=4, n=9, depth=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    attns = [torch.softmax(torch.randn(batch, heads, n, n, generator=g), dim=-1) for _ in range(depth)]
    grads = [torch.randn(batch, heads, n, n, generator=g) for _ in range(depth)]
    return attns, grads


def test_avg_heads_is_eq5_per_sample():
    attns, grads = _layers()
    abar = rules.avg_heads(attns[0], grads[0])
    assert abar.dtype == torch.float32 and abar.shape == (3, 9, 9)
    for b in range(3):
        assert relative_error(abar[b], head_average(attns[0][b], grads[0][b])) < 1e-6


def test_negatives_are_removed_before_the_head_mean():
    attn = torch.ones(1, 2, 1, 1)
    grad = torch.tensor([1.0, -3.0]).reshape(1, 2, 1, 1)
    # mean then clamp would give 0; clamp then mean gives 0.5.
    assert rules.avg_heads(attn, grad).item() == pytest.approx(0.5)


def test_gae_matrix_form_matches_the_oracle():
    attns, grads = _layers()
    abars = [rules.avg_heads(a, g) for a, g in zip(attns, grads)]
    relevance = rules.gae_relevance(abars)
    for b in range(3):
        expected = gae_matrix([a[b] for a in attns], [g[b] for g in grads])
        assert relative_error(relevance[b], expected) < 1e-5


@pytest.mark.parametrize("query", [0, 4, "per-sample"])
def test_row_form_equals_matrix_form(query):
    attns, grads = _layers(depth=6, n=13)
    abars = [rules.avg_heads(a, g) for a, g in zip(attns, grads)]
    q = torch.tensor([0, 7, 12]) if query == "per-sample" else torch.full((3,), query)
    matrix = rules.gae_relevance(abars)
    row = rules.gae_relevance_row(abars, q)
    for b in range(3):
        torch.testing.assert_close(row[b], matrix[b, q[b]], rtol=1e-5, atol=1e-6)


def test_rollout_row_and_matrix_match_the_oracle():
    attns, _ = _layers(depth=5)
    q = torch.tensor([0, 3, 8])
    matrix = rules.rollout_map(attns)
    row = rules.rollout_row(attns, q)
    for b in range(3):
        expected = rollout_matrix([a[b] for a in attns])
        assert relative_error(matrix[b], expected) < 1e-5
        assert relative_error(row[b], expected[q[b]]) < 1e-5


def test_raw_attention_and_gradcam_match_the_oracle():
    attns, grads = _layers()
    q = torch.tensor([0, 1, 2])
    raw = rules.raw_attention_row(attns[-1], q)
    cam = rules.attn_gradcam_row(attns[-1], grads[-1], q)
    for b in range(3):
        assert relative_error(raw[b], raw_attention_matrix([a[b] for a in attns])[q[b]]) < 1e-6
        assert relative_error(cam[b], gradcam_matrix([a[b] for a in attns], [g[b] for g in grads])[q[b]]) < 1e-4


def test_row_normalize_gives_zero_for_an_all_zero_row():
    x = torch.tensor([[[0.0, 0.0], [1.0, 3.0]]])
    out = rules.row_normalize(x)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, torch.tensor([[[0.0, 0.0], [0.25, 0.75]]]))


def test_handle_residual_is_eq8_9():
    r = torch.eye(3)[None].clone()
    r[0, 1] += torch.tensor([0.2, 0.0, 0.6])
    out = rules.handle_residual(r)
    expected = torch.eye(3)
    expected[1] += torch.tensor([0.25, 0.0, 0.75])
    torch.testing.assert_close(out[0], expected)
    # Rows with no attention yet stay the identity's rows.
    torch.testing.assert_close(out[0, 0], torch.tensor([1.0, 0.0, 0.0]))


def test_low_precision_inputs_are_computed_in_float32():
    attns, grads = _layers()
    abar = rules.avg_heads(attns[0].bfloat16(), grads[0].bfloat16())
    assert abar.dtype == torch.float32
    row = rules.gae_relevance_row([abar], torch.zeros(3, dtype=torch.long))
    assert row.dtype == torch.float32


def test_float64_attention_keeps_float64_through_the_row_products():
    # A model trained with precision="64-true" hands over float64 attention; the float32 start row must follow it.
    torch.manual_seed(0)
    attns = [torch.rand(2, 3, 5, 5, dtype=torch.float64).softmax(-1) for _ in range(2)]
    grads = [torch.randn(2, 3, 5, 5, dtype=torch.float64) for _ in range(2)]
    query = torch.tensor([0, 2])
    abars = [rules.avg_heads(a, g) for a, g in zip(attns, grads)]
    row = rules.gae_relevance_row(abars, query)
    assert row.dtype == torch.float64
    assert torch.allclose(row, rules.gae_relevance(abars)[torch.arange(2), query])
    assert rules.rollout_row(attns, query).dtype == torch.float64
    assert torch.allclose(rules.rollout_row(attns, query), rules.rollout_map(attns)[torch.arange(2), query])
