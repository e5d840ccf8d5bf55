"""attn_gradcam_vit_row: the ViT baseline's attention Grad-CAM against a dense per-sample float64 oracle."""

import doctest

import pytest
import torch

from lightning_gae.engine import rules
from lightning_gae.engine.rules import attn_gradcam_vit_row
from lightning_gae.engine.capture import AttentionRecorder
from recipes.vit import ViTClassifier


def vit_gradcam_oracle(attn, grad, query, keep):
    """One sample ``[H, N, N]``: each head weighted by its gradient's mean over the query row's other real keys."""
    heads, tokens = attn.shape[0], attn.shape[-1]
    keys = [k for k in range(tokens) if k != query and keep[k]]
    cam = torch.zeros(tokens, dtype=torch.float64)
    for h in range(heads):
        weight = sum(grad[h, query, k].double() for k in keys) / len(keys)
        for k in keys:
            cam[k] += weight * attn[h, query, k].double()
    return torch.clamp(cam / heads, min=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_vit_variant_matches_the_dense_oracle_with_any_query_and_padding(dtype):
    generator = torch.Generator().manual_seed(0)
    batch, heads, tokens = 3, 4, 7
    attn = torch.rand(batch, heads, tokens, tokens, generator=generator, dtype=dtype).softmax(dim=-1)
    grad = torch.randn(batch, heads, tokens, tokens, generator=generator, dtype=dtype)
    query = torch.tensor([0, 3, 6])
    keep = torch.ones(batch, tokens, dtype=torch.bool)
    keep[1, 5:] = False
    out = attn_gradcam_vit_row(attn, grad, query, keep)
    assert out.dtype == dtype and out.shape == (batch, tokens)
    for b in range(batch):
        expected = vit_gradcam_oracle(attn[b], grad[b], int(query[b]), keep[b])
        torch.testing.assert_close(out[b].double(), expected, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-7)
    assert (out[1, 5:] == 0).all() and (out[torch.arange(batch), query] == 0).all()
    # Without keep every other key counts.
    full = attn_gradcam_vit_row(attn, grad, query)
    torch.testing.assert_close(full[1].double(), vit_gradcam_oracle(attn[1], grad[1], 3, torch.ones(tokens, dtype=torch.bool)),
                               rtol=1e-5, atol=1e-7)
    # The matrix variant averages the whole map's gradient: another weighting, another row ...
    matrix = rules.attn_gradcam_row(attn, grad, query)
    matrix[torch.arange(batch), query] = 0
    assert not torch.allclose(matrix, full, rtol=1e-3)
    # ... unless every head's gradient is constant, when the two weightings agree.
    flat = grad.mean(dim=(-2, -1), keepdim=True).expand_as(grad)
    matrix = rules.attn_gradcam_row(attn, flat, query)
    matrix[torch.arange(batch), query] = 0
    torch.testing.assert_close(attn_gradcam_vit_row(attn, flat, query), matrix)


def test_vit_variant_on_a_real_vit_is_the_authors_cls_row_formula():
    torch.manual_seed(1)
    model = ViTClassifier(dim=32, depth=2, heads=4, dropout=0.0).eval()
    images = torch.rand(2, 1, 8, 8)
    with AttentionRecorder(model) as recorder:
        logits = model(images)
    last = recorder.records[-1]
    score = logits.gather(1, logits.argmax(dim=1, keepdim=True)).sum()
    (grad,) = torch.autograd.grad(score, [last.tensor])
    attn, grad = last.as_heads().detach(), last.as_heads(grad)
    assert attn.shape == (2, 4, 17, 17)
    out = attn_gradcam_vit_row(attn, grad, torch.zeros(2, dtype=torch.long))
    for b in range(2):
        # The baseline's code for one image: cam = attn[h, 0, 1:], grad = grad[h, 0, 1:].mean(), mean over heads, clamp.
        weights = grad[b, :, 0, 1:].double().mean(dim=1, keepdim=True)
        expected = (attn[b, :, 0, 1:].double() * weights).mean(dim=0).clamp(min=0)
        torch.testing.assert_close(out[b, 1:].double(), expected, rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(out[b, 1:].double(), vit_gradcam_oracle(attn[b], grad[b], 0, torch.ones(17, dtype=torch.bool))[1:],
                                   rtol=1e-5, atol=1e-8)
    assert out[:, 0].eq(0).all() and out.max() > 0


def test_bad_shapes_name_the_arguments():
    with pytest.raises(ValueError, match=r"attn and grad must both be \[B, H, N, N\]"):
        attn_gradcam_vit_row(torch.rand(1, 2, 3, 3), torch.rand(1, 2, 3, 4), torch.tensor([0]))


def test_docstring_example_computes_what_it_says():
    result = doctest.testmod(rules)
    assert result.attempted > 0 and result.failed == 0
