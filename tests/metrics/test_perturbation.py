"""lightning_gae.metrics perturbation protocols: by-hand small cases, removal by the modality, known evidence."""

import math

import matplotlib
import pytest
import torch
from torchmetrics import MetricCollection

from lightning_gae import ImageTokens, TabularTokens, TextTokens
from lightning_gae.metrics import (
    AOPC,
    Comprehensiveness,
    DeletionAUC,
    InsertionAUC,
    PerturbationAUC,
    PositivePerturbationAUC,
    Sufficiency,
    functional,
    perturbation_metric,
    random_attribution,
)
from lightning_gae.metrics.functional.perturbation import perturbed_scores
from tests.helpers.models import FEATURES, TAB, SumModel

matplotlib.use("Agg")


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


# --- perturbation test, by hand ---------------------------------------------------------------------


def test_perturbation_auc_by_hand():
    # Attribution = the features: positive removes 2, then 1, ...; sums 3.75, 1.75, 0.75, 0.25 -> correct only at 0.
    fractions = (0.0, 0.25, 0.5, 0.75)
    positive = PerturbationAUC(SumModel(), TAB, order="positive", fractions=fractions)
    positive.update(FEATURES, FEATURES.clone(), target=1)
    assert positive.curve().tolist() == [1.0, 0.0, 0.0, 0.0]
    assert positive.compute().item() == pytest.approx(100 * 0.25 * 0.5)
    # Negative removes 0.25 first: 3.5, 3.0, 2.0 all stay above 1.9.
    negative = PerturbationAUC(SumModel(), TAB, order="negative", fractions=fractions)
    negative.update(FEATURES, FEATURES.clone(), target=1)
    assert negative.compute().item() == pytest.approx(75.0)
    assert negative.higher_is_better and not positive.higher_is_better
    # score="probability": softmax([1.9, s])[1] = sigmoid(s - 1.9), trapezoid by hand.
    prob = PerturbationAUC(SumModel(), TAB, fractions=fractions, score="probability")
    prob.update(FEATURES, FEATURES.clone(), target=1)
    curve = [sigmoid(s - 1.9) for s in (3.75, 1.75, 0.75, 0.25)]
    area = sum(0.25 * (a + b) / 2 for a, b in zip(curve, curve[1:]))
    assert prob.compute().item() == pytest.approx(100 * area, rel=1e-5)
    assert functional.perturbation_auc(SumModel(), TAB, FEATURES, FEATURES.clone(), 1, "positive", fractions).item() == \
        pytest.approx(12.5)


def test_protocols_score_the_prediction_or_the_target_against_the_label():
    fractions = (0.0, 0.25, 0.5, 0.75)
    # The model predicts 1 (sum 3.75 > 1.9); the label is 0. Removing the top features: 3.75, 1.75, 0.75, 0.25.
    def auc(protocol, target, score="accuracy"):
        metric = PositivePerturbationAUC(SumModel(), TAB, fractions=fractions, score=score, protocol=protocol)
        metric.update(FEATURES, FEATURES.clone(), target)
        return metric.curve().tolist(), metric.compute().item()

    # "predicted" with the label: accuracy against the label starts at the model's accuracy (0 here).
    assert auc("predicted", 0) == ([0.0, 1.0, 1.0, 1.0], pytest.approx(100 * (0.25 * 0.5 + 0.25 + 0.25)))
    # "predicted" without labels: accuracy against the unperturbed prediction.
    assert auc("predicted", None) == ([1.0, 0.0, 0.0, 0.0], pytest.approx(12.5))
    # "target": the label is the class scored, so the accuracy is the same, but its probability is scored.
    assert auc("target", 0)[0] == [0.0, 1.0, 1.0, 1.0]
    predicted_probability = [sigmoid(s - 1.9) for s in (3.75, 1.75, 0.75, 0.25)]
    assert auc("predicted", 0, "probability")[0] == pytest.approx(predicted_probability, rel=1e-5)
    assert auc("target", 0, "probability")[0] == pytest.approx([1 - p for p in predicted_probability], rel=1e-5)
    # Deletion and ERASER score the probability of the class the protocol names.
    deletion = {p: DeletionAUC(SumModel(), TAB, fractions=(0.0, 1.0), protocol=p) for p in ("predicted", "target")}
    for metric in deletion.values():
        metric.update(FEATURES, FEATURES.clone(), 0)
    assert deletion["predicted"].curve().tolist() == pytest.approx([sigmoid(3.75 - 1.9), sigmoid(-1.9)], rel=1e-5)
    assert deletion["target"].curve().tolist() == pytest.approx([sigmoid(1.9 - 3.75), sigmoid(1.9)], rel=1e-5)
    with pytest.raises(ValueError, match="protocol='label'.*'predicted'"):
        perturbation_metric("aopc", SumModel(), TAB, protocol="label")


def test_target_none_scores_the_unperturbed_prediction_and_states_accumulate():
    metric = PerturbationAUC(SumModel(), TAB, fractions=(0.0, 0.5))
    metric.update(FEATURES, FEATURES.clone())          # predicted class 1; removing 2 of 4 -> 0.75 -> class 0
    metric.update(torch.zeros(1, 4), torch.tensor([[4.0, 3, 2, 1]]))   # predicted 0; stays 0
    assert metric.curve().tolist() == [1.0, 0.5]
    assert metric.compute().item() == pytest.approx(100 * 0.5 * (1.0 + 0.5) / 2)
    metric.reset()
    metric.update(torch.zeros(1, 4), torch.tensor([[4.0, 3, 2, 1]]))
    assert metric.compute().item() == pytest.approx(50.0)


def test_deletion_and_insertion_by_hand():
    fractions = (0.0, 0.5, 1.0)
    deletion = DeletionAUC(SumModel(), TAB, fractions=fractions)
    deletion.update(FEATURES, FEATURES.clone(), target=1)
    c = [sigmoid(s - 1.9) for s in (3.75, 0.75, 0.0)]
    assert deletion.compute().item() == pytest.approx(0.5 * (c[0] + c[1]) / 2 + 0.5 * (c[1] + c[2]) / 2, rel=1e-5)
    # Insertion starts from every feature at its mean (0) and puts the most relevant back first.
    insertion = InsertionAUC(SumModel(), TAB, fractions=fractions)
    insertion.update(FEATURES, FEATURES.clone(), target=1)
    c = [sigmoid(s - 1.9) for s in (0.0, 3.0, 3.75)]
    assert insertion.compute().item() == pytest.approx(0.5 * (c[0] + c[1]) / 2 + 0.5 * (c[1] + c[2]) / 2, rel=1e-5)
    assert insertion.higher_is_better and not deletion.higher_is_better


def test_eraser_metrics_by_hand():
    bins = (0.25, 0.5)
    p0 = sigmoid(3.75 - 1.9)
    without = [sigmoid(s - 1.9) for s in (1.75, 0.75)]   # top 1, top 2 removed
    only = [sigmoid(s - 1.9) for s in (2.0, 3.0)]        # only top 1, top 2 kept
    expected = {
        Comprehensiveness: sum(p0 - p for p in without) / 2,
        Sufficiency: sum(p0 - p for p in only) / 2,
        AOPC: sum(p0 - p for p in without) / 3,
    }
    for cls, value in expected.items():
        metric = cls(SumModel(), TAB, bins=bins)
        metric.update(FEATURES, FEATURES.clone(), target=1)
        assert metric.compute().item() == pytest.approx(value, rel=1e-5), cls.__name__
    # At least one unit per bin: 1% of 4 features still removes the top one.
    metric = Comprehensiveness(SumModel(), TAB, bins=(0.01,))
    metric.update(FEATURES, FEATURES.clone(), target=1)
    assert metric.compute().item() == pytest.approx(p0 - without[0], rel=1e-5)


def test_chunking_changes_nothing_and_counts_forwards():
    torch.manual_seed(0)
    x = torch.rand(5, 4) * 2
    attributions = torch.rand(5, 4)
    values = []
    for max_batch in (1, 7, 256):
        model = SumModel(threshold=2.0)
        metric = PerturbationAUC(model, TAB, fractions=(0.0, 0.25, 0.5, 0.75), score="probability", max_batch=max_batch)
        metric.update(x, attributions)
        values.append(metric.compute().item())
        # One clean pass for the targets, then every (step, sample) pair that removes something in
        # chunks of max_batch: the 0% step is the clean pass's own score, not a forward of its own.
        assert len(model.calls) == math.ceil(5 / max_batch) + math.ceil(3 * 5 / max_batch)
        assert max(model.calls) <= max_batch
    assert values[0] == pytest.approx(values[1]) == pytest.approx(values[2])
    # The forwards run under inference_mode; what comes back is an ordinary tensor a caller may change.
    scores, clean = perturbed_scores(SumModel(threshold=2.0), TAB, x, torch.zeros(2, 5, 4, dtype=torch.bool))
    scores += 1
    assert not scores.is_inference() and not clean.is_inference()


# --- removal belongs to the modality ----------------------------------------------------------------


def test_image_removal_is_black_in_unit_space_then_normalised():
    modality = ImageTokens(patch_size=2, prefix_tokens=1, mean=(0.5,), std=(0.25,))
    x = torch.rand(2, 1, 4, 4)
    drop = torch.zeros(2, 16, dtype=torch.bool)
    drop[0, 5] = True
    out = modality.remove(x, drop)
    assert out[0, 0, 1, 1] == pytest.approx((0.0 - 0.5) / 0.25)
    changed = out != x
    assert changed.sum() == 1 and changed[0, 0, 1, 1]
    assert modality.display_image(out[0])[1, 1].tolist() == [0.0, 0.0, 0.0]
    # Patches: dropping patch (0, 1) blackens its 2x2 pixels only.
    patches = ImageTokens(patch_size=2, removal="patch")
    drop = torch.zeros(2, 4, dtype=torch.bool)
    drop[1, 1] = True
    out = patches.remove(x, drop)
    assert (out[1, 0, :2, 2:] == 0).all() and torch.equal(out[0], x[0])
    assert (out[1] != x[1]).sum() == 4
    # Patch scores are patch means of the pixel map; token relevance goes through to_input.
    pixel_map = torch.arange(16.0).reshape(1, 1, 4, 4).expand(2, 1, 4, 4)
    assert patches.unit_scores(pixel_map, x)[0].tolist() == [2.5, 4.5, 10.5, 12.5]
    assert modality.unit_scores(torch.rand(2, 5), x).shape == (2, 16)


def test_blur_keeps_a_constant_image_and_spreads_a_point():
    modality = ImageTokens(patch_size=4, blur_sigma=1.0)
    flat = torch.full((1, 3, 8, 8), 0.7)
    assert torch.allclose(modality.blurred(flat), flat)
    point = torch.zeros(1, 1, 9, 9)
    point[0, 0, 4, 4] = 1.0
    blurred = modality.blurred(point)
    assert blurred.shape == point.shape and blurred[0, 0, 4, 4] < 0.5
    assert blurred[0, 0, 4, 5] > 0 and blurred.sum().item() == pytest.approx(1.0, rel=1e-5)


def test_text_removal_never_touches_special_or_padded_tokens():
    modality = TextTokens(vocab=[f"t{i}" for i in range(10)], special_ids=[0, 1], pad_id=2, mask_id=3)
    ids = torch.tensor([[0, 5, 6, 7, 1], [0, 8, 1, 2, 2]])
    batch = {"input_ids": ids, "attention_mask": (ids != 2).long()}
    assert modality.removable(batch).tolist() == [[False, True, True, True, False], [False, True, False, False, False]]
    out = modality.remove(batch, torch.ones(2, 5, dtype=torch.bool))
    assert out["input_ids"].tolist() == [[0, 3, 3, 3, 1], [0, 3, 1, 2, 2]]
    assert torch.equal(batch["input_ids"], ids), "the inputs were modified in place"
    dropped = TextTokens(vocab=[str(i) for i in range(10)], special_ids=[0, 1], pad_id=2, removal="attention")
    out = dropped.remove(batch, torch.tensor([[True, True, False, False, True], [False] * 5]))
    assert out["attention_mask"].tolist() == [[1, 0, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert torch.equal(out["input_ids"], ids)
    with pytest.raises(ValueError, match="mask_id"):
        TextTokens(vocab=["a"]).remove(ids, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask"):
        dropped.remove(ids, torch.ones(2, 5, dtype=torch.bool))


def test_tabular_removal_uses_fixed_means_so_scores_do_not_depend_on_the_batch():
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    drop = torch.tensor([[True, False], [False, True]])
    assert TabularTokens(["a", "b"], means=[10.0, 20.0]).remove(x, drop).tolist() == [[10.0, 2.0], [3.0, 20.0]]
    # Token relevance [B, 1 + F] and a feature map [B, F] score the same features.
    tokens = torch.tensor([[9.0, 0.1, 0.2], [9.0, 0.3, 0.4]])
    assert torch.equal(TabularTokens(["a", "b"]).unit_scores(tokens, x), tokens[:, 1:])
    # Scored one at a time or all together, each sample's curve is the same, and a lone sample is perturbed.
    generator = torch.Generator().manual_seed(5)
    features = torch.rand(6, 4, generator=generator) * 2
    modality = TabularTokens(["a", "b", "c", "d"], prefix_tokens=0).fit(torch.rand(100, 4, generator=generator))
    attributions = torch.rand(6, 4, generator=generator)
    curve = functional.perturbation_curve(SumModel(threshold=2.0), modality, features, attributions, score="probability")
    alone = torch.stack([functional.perturbation_curve(SumModel(threshold=2.0), modality, features[i : i + 1],
                                                       attributions[i : i + 1], score="probability") for i in range(6)])
    torch.testing.assert_close(alone.mean(dim=0), curve)
    assert (alone[:, -1] < alone[:, 0] - 0.05).all()
    with pytest.raises(ValueError, match="fit"):
        functional.perturbation_auc(SumModel(), TabularTokens(["a", "b", "c", "d"], prefix_tokens=0), FEATURES, FEATURES)


def test_removal_counts_and_ranking():
    removable = torch.tensor([[True] * 10, [True, True, True, False, False, False, False, False, False, False]])
    counts = functional.perturbation.removal_counts((0.0, 0.3, 0.7), removable)
    assert counts.tolist() == [[0, 0], [3, 0], [7, 2]]
    scores = torch.arange(10.0).expand(2, 10)
    masks = functional.perturbation.ranked_masks(scores, removable, counts, "positive")
    assert masks[1, 0].nonzero().flatten().tolist() == [7, 8, 9]
    assert masks[2, 1].nonzero().flatten().tolist() == [1, 2]   # only removable units, most relevant first
    negative = functional.perturbation.ranked_masks(scores, removable, counts, "negative")
    assert negative[1, 0].nonzero().flatten().tolist() == [0, 1, 2]


# --- known evidence: the oracle beats random --------------------------------------------------------


def test_an_oracle_attribution_beats_random_where_the_evidence_is_known():
    torch.manual_seed(0)
    region = (slice(0, 4), slice(0, 4))                      # the logit is the sum of the top-left 4x4 pixels
    model = SumModel(threshold=4.0, region=region)
    x = torch.rand(64, 1, 8, 8) * 0.5 + 0.25                 # region sums around 8 > 4: class 1
    oracle = torch.zeros(64, 1, 8, 8)
    oracle[:, :, 0:4, 0:4] = 1.0
    oracle = oracle + 1e-3 * torch.rand_like(oracle)         # ties broken at random inside each region
    noise = random_attribution(oracle, seed=0)
    modality = ImageTokens(patch_size=2)
    scores = {}
    for name, attr in (("oracle", oracle), ("random", noise)):
        metrics = MetricCollection({
            "positive": PerturbationAUC(model, modality, order="positive"),
            "negative": PerturbationAUC(model, modality, order="negative"),
            "deletion": DeletionAUC(model, modality),
            "comprehensiveness": Comprehensiveness(model, modality),
        })
        metrics.update(x, attr, 1)
        scores[name] = {k: v.item() for k, v in metrics.compute().items()}
    oracle_s, random_s = scores["oracle"], scores["random"]
    assert oracle_s["positive"] < random_s["positive"] - 20
    assert oracle_s["negative"] > random_s["negative"] + 20
    assert oracle_s["deletion"] < random_s["deletion"]
    assert oracle_s["comprehensiveness"] > random_s["comprehensiveness"]
    # Removing the evidence first flips every prediction once half the region (12.5% of the image) is gone.
    positive = PerturbationAUC(model, modality, order="positive")
    positive.update(x, oracle, 1)
    assert positive.curve()[2:].max() == 0.0 and positive.curve()[0] == 1.0


def test_random_attribution_is_seeded():
    like = torch.zeros(3, 17)
    assert torch.equal(random_attribution(like, 1), random_attribution(like, 1))
    assert not torch.equal(random_attribution(like, 1), random_attribution(like, 2))
