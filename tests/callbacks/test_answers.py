"""GAECallback on a causal LM: each answer token explained over the prompt before it, and scored for recall."""

from __future__ import annotations

import html
import math
import statistics

import pytest
import torch
from lightning.pytorch import seed_everything

from lightning_gae.language.answers import explain_answers
from lightning_gae.callbacks import EngineOptions, FaithfulnessOptions, GAECallback
from lightning_gae.callbacks.answer_samples import keep_readout
from lightning_gae.tensorboard import metadata
from recipes.causal_lm_recall import SPECIALS, VOCAB, RecallDataModule, RecallLM, RecallTokens
from tests.helpers.events import read_events
from tests.helpers.trainer import make_trainer


def _recall_oracle(rows, rationales, ids, masks):
    """top1 / hit@|R| / positive mass per row, one row at a time over the real non-special tokens before the readout."""
    top1, hit, mass = [], [], []
    for row, truth, sample_ids, mask in zip(rows, rationales, ids, masks):
        readout = max(t for t in range(len(mask)) if mask[t])
        keep = [t for t in range(readout) if mask[t] and sample_ids[t] >= len(SPECIALS)]
        ranked = sorted(keep, key=lambda t: -row[t])
        wanted = [t for t in keep if truth[t]]
        top1.append(float(truth[ranked[0]] == 1))
        hit.append(float(any(truth[t] for t in ranked[: len(wanted)])))
        positive = sum(max(row[t], 0.0) for t in keep)
        mass.append(sum(max(row[t], 0.0) for t in wanted) / positive if positive > 0 else 0.0)
    return {"top1": top1, "hit_at_k": hit, "mass": mass}


def _grouped_stderr(values, groups):
    """The delete-a-group jackknife of a mean, written out: each prompt's rows left out together."""
    labels = sorted(set(groups))
    left_out = [statistics.fmean(v for v, g in zip(values, groups) if g != label) for label in labels]
    centre = statistics.fmean(left_out)
    return math.sqrt((len(labels) - 1) / len(labels) * sum((t - centre) ** 2 for t in left_out))


@pytest.mark.slow
def test_each_answer_token_is_a_row_logged_and_scored_for_recall(tmp_path):
    seed_everything(0)
    data = RecallDataModule(num_train=96, num_val=24, batch_size=12)
    model = RecallLM(hidden_size=32, intermediate_size=64)
    callback = GAECallback(num_samples=3, methods=("gae", "attnlrp"), modality=RecallTokens(), print_summary=False,
                           faithfulness=FaithfulnessOptions(samples=0, metrics=("positive_perturbation_auc",)))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=2, limit_val_batches=2)
    trainer.fit(model, data)

    prompts = callback.sample_indices
    assert len(prompts) == 3
    batch = {k: torch.stack([data.val_set[i][k] for i in prompts]) for k in ("input_ids", "attention_mask", "labels",
                                                                             "rationales")}
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    events = read_events(tmp_path / "tb" / "version_0")
    tags = events.Tags()["tensors"]
    scalars = events.scalar_values()
    for method in ("gae", "attnlrp"):
        expected = explain_answers(model, inputs, batch["labels"], method=method, target="pred")
        rows, truths, ids, masks, groups = [], [], [], [], []
        for b, prompt in enumerate(prompts):
            for j in range(int(expected.valid[b].sum())):
                name = f"val_{prompt}/answer_{j + 1}"
                logged = events.tensor(f"{metadata.TAG_PREFIX}/relevance/{method}/{name}")
                torch.testing.assert_close(torch.as_tensor(logged).float(), expected.relevance[b, j],
                                           atol=1e-5 * float(expected.relevance[b].abs().max()), rtol=0)
                if method == "gae":
                    # The Text tab's table of the row: the answer token is its label.
                    table = html.unescape(events.tensor(f"gae_tokens/{name}").item().decode().replace("\\", ""))  # as shown
                    answer = int(expected.answers[b, j])
                    assert f"label {answer} ({VOCAB[answer]})" in table
                rows.append(expected.relevance[b, j].tolist())
                groups.append(prompt)
                truths.append(batch["rationales"][b].tolist())
                ids.append(batch["input_ids"][b].tolist())
                position = int(expected.positions[b, j])
                masks.append([1 if t <= position else 0 for t in range(batch["input_ids"].shape[1])])
            assert not any(t.startswith(f"{metadata.TAG_PREFIX}/relevance/{method}/val_{prompt}/answer_"
                                        f"{int(expected.valid[b].sum()) + 1}") for t in tags)
        oracle = _recall_oracle(rows, truths, ids, masks)
        for key, values in oracle.items():
            assert scalars[f"recall_{key}/{method}"][-1] == pytest.approx(statistics.fmean(values), abs=1e-5)
            # The standard error is over prompts: a prompt's answer tokens are left out together.
            if len(set(values)) > 1:
                assert scalars[f"recall_{key}/{method}/stderr"][-1] == pytest.approx(_grouped_stderr(values, groups),
                                                                                      abs=1e-5)
        assert math.isfinite(scalars[f"positive_perturbation_auc/{method}"][-1])


def test_readout_token_is_never_removed():
    modality = keep_readout(RecallTokens())
    assert keep_readout(modality) is modality and isinstance(modality, RecallTokens)
    ids = torch.tensor([[1, 5, 21, 6, 3, 5, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    plain = RecallTokens().removable({"input_ids": ids, "attention_mask": mask})
    kept = modality.removable({"input_ids": ids, "attention_mask": mask})
    assert plain[0].tolist() == [False, True, True, True, False, True, False, False]
    assert kept[0].tolist() == [False, True, True, True, False, False, False, False]


def test_answer_tokens_true_needs_lm_labels(tmp_path):
    from recipes.text_rationales import BertReviewClassifier, ReviewsDataModule, ReviewTokens

    callback = GAECallback(num_samples=2, modality=ReviewTokens(), print_summary=False,
                           faithfulness=FaithfulnessOptions(metrics=()), engine=EngineOptions(answer_tokens=True))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    model = BertReviewClassifier(max_length=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32)
    with pytest.raises(ValueError, match=r"answer_tokens=True.*labels \[B, T\].*-100"):
        trainer.fit(model, ReviewsDataModule(num_train=32, num_val=16, max_length=16, batch_size=8))
