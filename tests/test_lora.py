"""A LoRA fine-tune (peft) explained as it is equals its merged model: the adapters' extra matmuls are linear maps."""

from __future__ import annotations

import copy

import pytest
import torch

import lightning_gae as lg

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def lora_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, initializer_range=0.2,
                                        tie_word_embeddings=False, pad_token_id=0))
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
    model = peft.get_peft_model(base, config)
    # Fresh adapters are zero (B = 0); move them so the fine-tune changes the model.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def batch():
    ids = torch.randint(1, 80, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("method", ["gae", "rollout", "attnlrp"])
def test_a_lora_model_equals_its_merged_model(method):
    model = lora_llama()
    merged = copy.deepcopy(model).merge_and_unload().eval()
    inputs = batch()
    with torch.no_grad():
        tuned = model(**inputs).logits
        with model.disable_adapter():
            assert not torch.allclose(tuned, model(**inputs).logits, atol=1e-3), "the adapters change the logits"
        assert torch.allclose(tuned, merged(**inputs).logits, atol=1e-5)
    exp = lg.explain(model, inputs, target=5, query="last", method=method)
    ref = lg.explain(merged, inputs, target=5, query="last", method=method)
    assert exp.query.tolist() == [8, 5, 8] and torch.allclose(exp.score, ref.score, atol=1e-5)
    assert torch.allclose(exp.tokens, ref.tokens, atol=1e-5), (exp.tokens - ref.tokens).abs().max()
    assert torch.all(exp.tokens[1, 6:] == 0)


def test_the_adapters_change_the_explanation():
    model = lora_llama()
    inputs = batch()
    tuned = lg.explain(model, inputs, target=5, query="last")
    with model.disable_adapter():
        base = lg.explain(model, inputs, target=5, query="last")
    assert not torch.allclose(tuned.tokens, base.tokens, atol=1e-3)
    # The model is left as found: adapters on, eval mode, no parameter gradient.
    assert all(p.grad is None for p in model.parameters())
