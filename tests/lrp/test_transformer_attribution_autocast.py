"""Transformer Attribution inside a user's ``torch.autocast`` region runs with autocast off (it refused there
before, on a float32 buffer that autocast's bfloat16 product could not fill; and its alpha-beta rule loses most of
its digits in bfloat16): the relevance of the float32 model, and the region is still the user's afterwards."""

import torch

from lightning_gae import explain
from tests.helpers.models import TinyViT


def _bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        attn_implementation="sdpa", num_labels=2)
    ids = torch.randint(1, 50, (4, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 6, [1] * 5 + [0]])
    return BertForSequenceClassification(config).eval(), {"input_ids": ids, "attention_mask": mask}


def test_transformer_attribution_runs_under_autocast_and_agrees_with_float32():
    torch.manual_seed(0)
    for model, inputs in (_bert(), (TinyViT().eval(), torch.randn(4, 1, 8, 8))):
        reference = explain(model, inputs, method="transformer_attribution").tokens
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = explain(model, inputs, method="transformer_attribution").tokens
        assert under.dtype == torch.float32 and torch.isfinite(under).all()
        torch.testing.assert_close(under, reference)  # autocast is off inside: the float32 model's relevance
        # The autocast region is the user's: it is still on after the explanation, and off after it.
        with torch.autocast("cpu", dtype=torch.bfloat16):
            explain(model, inputs, method="transformer_attribution")
            assert torch.is_autocast_enabled("cpu")
        assert not torch.is_autocast_enabled("cpu")


def test_transformer_attribution_of_a_float64_model_equals_its_float32_twin():
    model, inputs = _bert()
    reference = explain(model, inputs, method="transformer_attribution").tokens
    doubled = explain(model.double(), inputs, method="transformer_attribution").tokens
    assert doubled.dtype == torch.float32
    torch.testing.assert_close(doubled, reference, rtol=1e-3, atol=1e-3 * reference.abs().max().item())
