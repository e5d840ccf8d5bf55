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


@pytest.mark.slow
def test_callback_on_a_lora_fine_tune_of_the_recall_model(tmp_path):
    """GAECallback on the recall recipe's Llama with LoRA adapters (only they train): each answer token is logged,
    equal to the merged model's explanation of it."""
    from lightning.pytorch import seed_everything

    from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
    from lightning_gae.tensorboard import metadata
    from recipes.causal_lm_recall import RecallDataModule, RecallLM, RecallTokens
    from tests.helpers.events import read_events
    from tests.helpers.trainer import make_trainer

    class LoraRecall(RecallLM):
        def __init__(self) -> None:
            super().__init__(hidden_size=32, intermediate_size=64)
            config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
            self.model = peft.get_peft_model(self.model, config)

    seed_everything(0)
    module = LoraRecall()
    frozen = {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" not in n}
    callback = GAECallback(num_samples=2, methods=("gae", "attnlrp"), modality=RecallTokens(), print_summary=False,
                           faithfulness=FaithfulnessOptions(samples=0, metrics=()))
    data = RecallDataModule(num_train=48, num_val=16, batch_size=8)
    make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=3, limit_val_batches=1).fit(module, data)
    # Only the adapters trained (the base weights are the ones the merged model folds the adapters into).
    assert all(torch.equal(p, frozen[n]) for n, p in module.named_parameters() if n in frozen)
    assert any(not torch.all(p == 0) for n, p in module.named_parameters() if "lora_B" in n)

    merged = copy.deepcopy(module.model).merge_and_unload().eval()
    events = read_events(tmp_path / "tb" / "version_0")
    prompts = callback.sample_indices
    ids = torch.stack([data.val_set[i]["input_ids"] for i in prompts])
    inputs = {"input_ids": ids, "attention_mask": torch.stack([data.val_set[i]["attention_mask"] for i in prompts])}
    labels = torch.stack([data.val_set[i]["labels"] for i in prompts])
    for method in ("gae", "attnlrp"):
        expected = lg.explain_answers(merged, inputs, labels, method=method, target="pred")
        for b, prompt in enumerate(prompts):
            for j in range(int(expected.valid[b].sum())):
                logged = events.tensor(f"{metadata.TAG_PREFIX}/relevance/{method}/val_{prompt}/answer_{j + 1}")
                torch.testing.assert_close(torch.as_tensor(logged).float(), expected.relevance[b, j],
                                           atol=1e-5 * float(expected.relevance[b].abs().max()), rtol=0)
