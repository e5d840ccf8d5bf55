"""Explaining a causal LM's answer tokens: rows per answer token, batched == one position at a time."""

from __future__ import annotations

import pytest
import torch

import lightning_gae as lg
from lightning_gae.language.answers import NextTokenLogits, answer_rows, explain_answers
from recipes.causal_lm_recall import PAD_ID, RecallLM, make_recall


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    model = RecallLM(hidden_size=32, intermediate_size=64).model.eval()
    with torch.no_grad():
        # Larger weights than the 0.02 initialisation, whose next-token logits are so flat that attention Grad-CAM's
        # values (~1e-5) are float noise between two batch shapes.
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.25)
    return model


@pytest.fixture(scope="module")
def batch():
    return make_recall(5, generator=torch.Generator().manual_seed(3))


def _inputs(batch):
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


@pytest.mark.parametrize("method", ["gae", "rollout", "attn_gradcam", "attnlrp"])
def test_each_answer_row_equals_explaining_its_position_alone(llama, batch, method):
    out = explain_answers(llama, _inputs(batch), batch["labels"], method=method, max_batch=4)
    labels = batch["labels"]
    rows = 0
    for b in range(labels.shape[0]):
        answers = [t for t in range(1, labels.shape[1]) if labels[b, t] != -100]
        assert out.valid[b].sum().item() == len(answers)
        for j, t in enumerate(answers):
            # Sample b alone, cut before its answer token, read at its last position t - 1.
            cut = {"input_ids": batch["input_ids"][b:b + 1, :t], "attention_mask": batch["attention_mask"][b:b + 1, :t]}
            expected = lg.explain(llama, cut, method=method, query=t - 1, target=labels[b, t:t + 1])
            if method != "attn_gradcam":
                # A causal model's later tokens change nothing, so the whole sequence read at t - 1 gives the same
                # (Grad-CAM's head weights are a mean over every real token pair: they do depend on the later tokens).
                whole = {"input_ids": batch["input_ids"][b:b + 1], "attention_mask": batch["attention_mask"][b:b + 1]}
                also = lg.explain(llama, whole, method=method, query=t - 1, target=labels[b, t:t + 1])
                torch.testing.assert_close(also.tokens[0, :t], expected.tokens[0], atol=1e-5 * float(
                    expected.tokens.abs().max()) + 1e-7, rtol=0)
            expected_row = torch.zeros(labels.shape[1])
            expected_row[:t] = expected.tokens[0].float()
            assert out.positions[b, j] == t - 1 and out.answers[b, j] == labels[b, t]
            torch.testing.assert_close(out.relevance[b, j], expected_row, atol=1e-5 * float(
                expected.tokens.abs().max()) + 1e-7, rtol=0)
            assert out.scores[b, j].item() == pytest.approx(expected.score.item(), abs=1e-4)
            # Nothing from the answer token on.
            assert out.relevance[b, j, t:].abs().max() == 0
            rows += 1
        assert not out.relevance[b, len(answers):].any() and not out.valid[b, len(answers):].any()
    assert rows == int(((labels[:, 1:] != -100)).sum())


def test_padded_batch_equals_each_prompt_alone_and_pred_target(llama, batch):
    together = explain_answers(llama, _inputs(batch), batch["labels"], method="gae", target="pred")
    for b in range(batch["input_ids"].shape[0]):
        real = int(batch["attention_mask"][b].sum())
        alone = explain_answers(llama, {k: v[b:b + 1, :real] for k, v in _inputs(batch).items()},
                                batch["labels"][b:b + 1, :real], method="gae", target="pred")
        width = alone.relevance.shape[1]
        torch.testing.assert_close(together.relevance[b, :width, :real], alone.relevance[0], atol=1e-6, rtol=1e-5)
        assert together.relevance[b, :, real:].abs().max() == 0
    # target="pred" explains the model's own next token at the readout.
    logits = llama(**_inputs(batch)).logits
    valid = together.valid
    predicted = logits.argmax(-1).gather(1, together.positions.clamp(min=0))
    assert torch.equal(together.target[valid], predicted[valid])


def test_rows_and_readout(llama, batch):
    rows = answer_rows(_inputs(batch), batch["labels"])
    readout = NextTokenLogits(llama)
    logits = llama(**_inputs(batch)).logits
    expected = logits[rows.sample, rows.position]
    torch.testing.assert_close(readout(**rows.inputs), expected, atol=1e-5, rtol=1e-5)
    # Each row's mask is its sequence's up to the readout, closed after it.
    for r in range(len(rows)):
        mask = rows.inputs["attention_mask"][r]
        assert mask[: rows.position[r] + 1].all() and not mask[rows.position[r] + 1:].any()
    assert rows.labels.tolist() == batch["labels"][rows.sample, rows.position + 1].tolist()


def test_bad_inputs_say_what_to_do(llama, batch):
    with pytest.raises(ValueError, match="mapping with 'input_ids'"):
        answer_rows(batch["input_ids"], batch["labels"])
    with pytest.raises(ValueError, match=r"labels must be integer \[B, T\]"):
        answer_rows(_inputs(batch), batch["labels"][:, :-1])
    labels = batch["labels"].clone()
    labels[0, -1] = 5                     # an answer label on padding
    assert batch["input_ids"][0, -1] == PAD_ID
    with pytest.raises(ValueError, match=r"samples \[0\] have answer labels on padded positions"):
        answer_rows(_inputs(batch), labels)
    with pytest.raises(ValueError, match="method="):
        explain_answers(llama, _inputs(batch), batch["labels"], method="nope")
    with pytest.raises(ValueError, match="target="):
        explain_answers(llama, _inputs(batch), batch["labels"], target="gold")


# --- issue 34 item 5: the edges of the arguments ---------------------------------------------------------------


def test_empty_batches_and_batches_without_answers_give_empty_rows(llama, batch):
    inputs, labels = _inputs(batch), batch["labels"]
    empty = explain_answers(llama, {k: v[:0] for k, v in inputs.items()}, labels[:0])
    assert empty.relevance.shape == (0, 0, labels.shape[1])
    none = explain_answers(llama, inputs, torch.full_like(labels, -100))
    assert none.relevance.shape == (labels.shape[0], 0, labels.shape[1]) and not none.valid.any()
    padding = explain_answers(llama, {**inputs, "attention_mask": torch.zeros_like(labels)}, torch.full_like(labels, -100))
    assert padding.relevance.numel() == 0


def test_wrong_types_say_what_to_pass(llama, batch):
    with pytest.raises(ValueError, match=r"labels must be integer \[B, T\].*got list"):
        explain_answers(llama, _inputs(batch), batch["labels"].tolist())
    with pytest.raises(ValueError, match=r"labels must be integer \[B, T\]"):
        explain_answers(llama, _inputs(batch), batch["labels"].float())
    with pytest.raises(ValueError, match=r"target=1; use 'label'"):
        explain_answers(llama, _inputs(batch), batch["labels"], target=1)
    with pytest.raises(ValueError, match=r"max_batch must be >= 1; got 0"):
        explain_answers(llama, _inputs(batch), batch["labels"], max_batch=0)
    with pytest.raises(ValueError, match=r"out of range for \d+ classes"):
        explain_answers(llama, _inputs(batch), torch.where(batch["labels"] >= 0, batch["labels"] + 10_000, -100))


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_inside_no_grad_and_inference_mode_equals_outside(llama, batch, context):
    # Under inference_mode the answer rows' labels were inference tensors, and explain() raised "Inference tensors
    # cannot be saved for backward" when it gathered the logits at them.
    outside = explain_answers(llama, _inputs(batch), batch["labels"])
    with context():
        inside = explain_answers(llama, _inputs(batch), batch["labels"])
    torch.testing.assert_close(inside.relevance, outside.relevance)


def test_meta_a_diverged_model_and_half_precision(llama, batch):
    import copy

    with torch.device("meta"):
        meta = RecallLM(hidden_size=32, intermediate_size=64).model
    with pytest.raises(ValueError, match="on the meta device"):
        explain_answers(meta, _inputs(batch), batch["labels"])
    broken = copy.deepcopy(llama)
    with torch.no_grad():
        next(p for p in broken.parameters() if p.dim() == 2)[0, 0] = float("nan")
    with pytest.raises(ValueError, match="the model has diverged"):
        explain_answers(broken, _inputs(batch), batch["labels"])
    half = explain_answers(copy.deepcopy(llama).to(torch.bfloat16), _inputs(batch), batch["labels"])
    assert half.relevance.dtype == torch.float32 and half.relevance.isfinite().all()
