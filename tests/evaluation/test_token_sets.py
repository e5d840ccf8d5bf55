"""Ground truth per token set, as compare and the callback both score it (lightning_gae.evaluation.token_sets)."""

from types import SimpleNamespace

import pytest
import torch

from lightning_gae import ImageTokens, TextTokens
from lightning_gae.evaluation import score_sets, set_scorers, set_truths
from lightning_gae.metrics.stderr import SampleScores

VOCAB = [str(i) for i in range(8)]


def test_the_alignment_never_points_at_padding():
    # Sample 0's source ends in padding (id 0) where the row's relevance is highest; its aligned position is 1.
    text = TextTokens(vocab=VOCAB, pad_id=0)
    src, tgt = torch.tensor([[3, 4, 0], [5, 6, 7]]), torch.tensor([[1, 2], [1, 2]])
    rows = torch.tensor([[[0.1, 0.5, 0.9], [0.7, 0.2, 0.1]], [[0.1, 0.2, 0.9], [0.8, 0.1, 0.1]]])
    alignment = torch.tensor([[1, 0], [2, 0]])
    layout = {"encoder": (text, 0), "decoder": (text, 1)}
    probe = SimpleNamespace(query_set="decoder", logits=None)
    scorers = set_scorers({"alignment": alignment}, {"encoder": 3, "decoder": 2}, layout, True, probe, 2)
    assert list(scorers) == ["alignment"] and scorers["alignment"][0] == "encoder/alignment_accuracy"
    scores = SampleScores()
    score_sets(scores, "gae", scorers, lambda name, build: build(), (src, tgt), {"encoder": rows},
               {"alignment": alignment})
    # Every pair is a hit once the padded position is left out (it would be a miss for sample 0's first row).
    found = scores.columns()["gae"]["encoder/alignment_accuracy"]
    assert (found.value, found.count) == (1.0, 2)


def test_each_ground_truth_needs_the_one_set_it_scores():
    probe = SimpleNamespace(query_set="text", logits=None)
    sizes = {"text": 4, "image": 5}
    two_texts = {"text": (TextTokens(vocab=VOCAB), "input_ids"), "image": (TextTokens(vocab=VOCAB), "pixel_values")}
    with pytest.raises(ValueError, match=r"ground_truth\['rationales'\] scores the one set whose modality scores 'rationale' ground truth"):
        set_scorers({"rationales": torch.zeros(2, 4)}, sizes, two_texts, False, probe, 2)
    with pytest.raises(ValueError, match=r"ground_truth\['alignment'\] scores a source set per target position"):
        set_scorers({"alignment": torch.zeros(2, 4)}, sizes, two_texts, False, probe, 2)
    layout = {"text": (TextTokens(vocab=VOCAB), "input_ids"), "image": (ImageTokens(patch_size=2), "pixel_values")}
    masks = set_scorers({"masks": torch.zeros(2, 4, 4)}, sizes, layout, False, probe, 2)
    assert masks["masks"][0] == "image/segmentation"
    with pytest.raises(ValueError, match=r"has 3 samples for 2 inputs"):
        set_scorers({"masks": torch.zeros(3, 4, 4)}, sizes, layout, False, probe, 2)


def test_what_a_model_with_several_token_sets_is_refused():
    sizes = {"text": 4, "image": 5}
    with pytest.raises(ValueError, match=r"cannot apply to a model with the token sets \['text', 'image'\]"):
        set_truths(("positive_perturbation_auc",), None, None, sizes)
    with pytest.raises(ValueError, match="pass one per set"):
        set_truths((), TextTokens(vocab=VOCAB), None, sizes)
    with pytest.raises(ValueError, match=r"ground_truth keys \['labels'\]"):
        set_truths((), None, {"labels": torch.zeros(2)}, sizes)
    assert set(set_truths((), None, {"masks": torch.zeros(2, 4, 4)}, sizes)) == {"masks"}
