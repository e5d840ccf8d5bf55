"""explain_generation: every generated token of a causal LM explained over what came before it, batched."""

from __future__ import annotations

import pytest
import torch

import lightning_gae as lg
from lightning_gae.language.generation import explain_generation

transformers = pytest.importorskip("transformers")

LLAMA = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=64, initializer_range=0.2, tie_word_embeddings=False,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)


def llama(impl: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA, attn_implementation=impl)).eval()
    # No row stops early in these tests unless one sets an end-of-sequence token.
    model.generation_config.eos_token_id = None
    return model


def left_padded(lengths=(7, 4, 6), seed=3):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, width - n:] = torch.randint(3, 60, (n,), generator=g)
        mask[b, width - n:] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("method", ["gae", "rollout", "attnlrp"])
def test_each_generated_token_equals_explaining_its_position_alone(method):
    model, inputs = llama(), left_padded()
    out = explain_generation(model, inputs, max_new_tokens=4, method=method, max_batch=5)
    expected = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert torch.equal(out.sequences, expected) and out.generated.shape == (3, 4)
    assert out.relevance.shape == (3, 4, 7 + 4) and out.finished.all()
    for b in range(3):
        for j in range(4):
            pos = int(out.positions[b, j])
            one = {"input_ids": out.sequences[b : b + 1], "attention_mask": out.attention_mask[b : b + 1],
                   "position_ids": (out.attention_mask[b : b + 1].cumsum(-1) - 1).clamp(min=0)}
            alone = lg.explain(model, one, target=out.generated[b, j : j + 1], query=pos, method=method)
            assert torch.allclose(out.relevance[b, j], alone.tokens[0], atol=1e-5), (b, j)
            # Nothing after the readout position, nothing on padding.
            assert torch.all(out.relevance[b, j, pos + 1 :] == 0)
            assert torch.all(out.relevance[b, j][out.attention_mask[b] == 0] == 0)
            # The explained logit is the one that produced the token (greedy: the largest).
            logits = model(**one).logits[0, pos]
            assert int(logits.argmax()) == int(out.generated[b, j])
            assert torch.allclose(out.scores[b, j], logits.max(), atol=1e-4)


def test_padded_prompts_equal_one_prompt_at_a_time():
    model, inputs = llama("eager"), left_padded()
    batched = explain_generation(model, inputs, max_new_tokens=3)
    width = inputs["input_ids"].shape[1]
    for b in range(3):
        real = inputs["attention_mask"][b].bool()
        one = {"input_ids": inputs["input_ids"][b : b + 1, real], "attention_mask": torch.ones(1, int(real.sum()), dtype=torch.long)}
        alone = explain_generation(model, one, max_new_tokens=3)
        assert torch.equal(alone.generated[0], batched.generated[b])
        pad = width - int(real.sum())
        assert torch.allclose(batched.relevance[b, :, pad:], alone.relevance[0], atol=1e-5)


def test_rows_after_the_end_of_sequence_are_not_explained():
    model, inputs = llama(), left_padded(lengths=(5, 5))
    first = model.generate(**inputs, max_new_tokens=1, do_sample=False)[:, -1]
    model.generation_config.eos_token_id = int(first[0])  # row 0's first generated token ends it
    model.generation_config.pad_token_id = 0
    out = explain_generation(model, inputs, max_new_tokens=3)
    assert out.finished[0].tolist() == [True, False, False]
    assert torch.all(out.relevance[0, 1:] == 0) and out.relevance[0, 0].abs().sum() > 0
    assert torch.all(out.attention_mask[0, -2:] == 0)


def test_bad_inputs_say_what_to_do():
    model = llama()
    right = left_padded()
    right = {k: v.flip(1) for k, v in right.items()}
    with pytest.raises(ValueError, match="padding_side = 'left'"):
        explain_generation(model, right, max_new_tokens=2)
    with pytest.raises(ValueError, match="needs a mapping with 'input_ids'"):
        explain_generation(model, {"pixel_values": torch.randn(1, 3, 4, 4)}, max_new_tokens=2)
    with pytest.raises(ValueError, match="no generate"):
        explain_generation(torch.nn.Linear(2, 2), left_padded(), max_new_tokens=2)
    with pytest.raises(ValueError, match="method='lrp'"):
        explain_generation(model, left_padded(), max_new_tokens=2, method="lrp")


# --- issue 34 item 5: the edges of the arguments ---------------------------------------------------------------


@pytest.mark.parametrize("inputs, max_new_tokens, message", [
    ({"input_ids": torch.ones(0, 5, dtype=torch.long)}, 2, r"the inputs hold no sample \(a batch of 0"),
    ({"input_ids": torch.ones(2, 0, dtype=torch.long)}, 2, r"the prompts hold no token \(input_ids \[2, 0\]\).*BOS"),
    (torch.ones(2, 5, dtype=torch.long), 2, r"needs a mapping with 'input_ids' \[B, P\].*got Tensor"),
    ({"input_ids": [[3, 4]]}, 2, r"needs a mapping with 'input_ids'.*got list"),
    (None, 1.5, r"max_new_tokens=1\.5\): pass an int >= 1"),
    (None, "2", r"max_new_tokens='2'\): pass an int >= 1"),
    (None, 0, r"max_new_tokens \(0\) and max_batch \(64\) must be >= 1"),
    (None, -1, r"max_new_tokens \(-1\)"),
])
def test_arguments_that_cannot_be_explained_say_what_to_pass(inputs, max_new_tokens, message):
    # Before: a reshape RuntimeError (0 prompts), an IndexError (prompts of 0 tokens), an AttributeError (a tensor),
    # a TypeError ('2'), and 1.5 generated and explained as if it were 1.
    with pytest.raises(ValueError, match=message):
        explain_generation(llama(), left_padded() if inputs is None else inputs, max_new_tokens=max_new_tokens)


def test_a_model_on_meta_or_without_a_generation_config_is_refused_before_generate():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    with pytest.raises(ValueError, match="the model's parameters are on the meta device"):
        explain_generation(model, left_padded(), max_new_tokens=2)  # a RuntimeError of generate() before
    model = llama()
    model.generation_config = None
    with pytest.raises(ValueError, match=r"generation_config is None.*GenerationConfig\.from_model_config"):
        explain_generation(model, left_padded(), max_new_tokens=2)  # an AttributeError of generate() before


def test_all_padding_a_diverged_model_and_one_token_prompts():
    mask = left_padded()["attention_mask"].clone()
    mask[1] = 0
    with pytest.raises(ValueError, match=r"prompts \[1\] end in padding"):
        explain_generation(llama(), {**left_padded(), "attention_mask": mask}, max_new_tokens=2)
    model = llama()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="the model has diverged"):
        explain_generation(model, left_padded(), max_new_tokens=2)
    one = explain_generation(llama(), {"input_ids": torch.tensor([[5]])}, max_new_tokens=2)
    assert one.relevance.shape == (1, 2, 3) and one.relevance.isfinite().all()


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_inside_no_grad_and_inference_mode_equals_outside(context):
    # Under inference_mode it raised "Inference tensors cannot be saved for backward" before.
    model, inputs = llama(), left_padded()
    outside = explain_generation(model, inputs, max_new_tokens=2)
    with context():
        inside = explain_generation(model, inputs, max_new_tokens=2)
    torch.testing.assert_close(inside.relevance, outside.relevance)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_explained_with_finite_relevance(dtype):
    model = llama().to(dtype)
    out = explain_generation(model, left_padded(), max_new_tokens=2)
    assert out.relevance.dtype == torch.float32 and out.relevance.isfinite().all() and out.relevance.abs().sum() > 0
