"""lightning_gae.metrics: hand-computed small cases, known evidence, torchmetrics plumbing and DDP."""

import doctest
import math
import os
import socket

import matplotlib
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.wrappers import MetricTracker

from lightning_gae import ImageTokens, TabularTokens, TextTokens
from lightning_gae.metrics import (
    AOPC,
    Comprehensiveness,
    DeletionAUC,
    ExplanationStability,
    PERTURBATION_METRICS,
    InsertionAUC,
    NegativePerturbationAUC,
    PerturbationAUC,
    PositivePerturbationAUC,
    RationaleAgreement,
    RelevanceSegmentation,
    Sufficiency,
    functional,
    perturbation,
    segmentation,
    stability,
    perturbation_metric,
    random_attribution,
)
from lightning_gae.metrics.functional.perturbation import perturbed_scores

matplotlib.use("Agg")


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


class SumModel(nn.Module):
    """Two classes: logit 0 is a constant, logit 1 the sum of the features (or of an image region)."""

    def __init__(self, threshold=1.9, region=None):
        super().__init__()
        self.threshold, self.region = threshold, region
        self.calls = []

    def forward(self, x):
        self.calls.append(x.shape[0])
        if x.dim() == 4:
            rows, cols = self.region
            x = x[:, :, rows, cols]
        total = x.flatten(1).sum(dim=1)
        return torch.stack([torch.full_like(total, self.threshold), total], dim=1)


FEATURES = torch.tensor([[2.0, 1.0, 0.5, 0.25]])
TAB = TabularTokens(["a", "b", "c", "d"], prefix_tokens=0, means=[0.0, 0.0, 0.0, 0.0])


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


def test_a_metric_collection_keeps_every_metric_apart():
    # The first batch sits at the removal value: nothing any metric removes changes the model, so
    # positive and negative curves, deletion and insertion, and the three ERASER means start equal.
    # torchmetrics merges metrics whose states are equal after the first update into one compute
    # group and from then on updates only its first member.
    blind, target = torch.zeros(3, 4), torch.tensor([1, 1, 0])
    updates = [(blind, torch.rand(3, 4, generator=torch.Generator().manual_seed(0)), target),
               (FEATURES, FEATURES.clone(), 1)]
    collection = MetricCollection({name: perturbation_metric(name, SumModel(), TAB) for name in PERTURBATION_METRICS})
    for update in updates:
        collection.update(*update)
    together = {k: v.item() for k, v in collection.compute().items()}
    assert len(collection.compute_groups) == len(PERTURBATION_METRICS)
    for name in PERTURBATION_METRICS:
        alone = perturbation_metric(name, SumModel(), TAB)
        for update in updates:
            alone.update(*update)
        assert together[name] == pytest.approx(alone.compute().item(), abs=1e-6), name
    assert together["positive_perturbation_auc"] != pytest.approx(together["negative_perturbation_auc"])
    assert together["deletion_auc"] != pytest.approx(together["insertion_auc"])
    # Class attributes, as torchmetrics declares them; PerturbationAUC(order=...) builds the right class.
    assert (PositivePerturbationAUC.higher_is_better, NegativePerturbationAUC.higher_is_better) == (False, True)
    assert type(PerturbationAUC(SumModel(), TAB, order="negative")) is NegativePerturbationAUC
    # Same order, another score or protocol: other state names, never one group.
    pair = MetricCollection({"accuracy": PositivePerturbationAUC(SumModel(), TAB),
                             "probability": PositivePerturbationAUC(SumModel(), TAB, score="probability"),
                             "predicted": PositivePerturbationAUC(SumModel(), TAB, protocol="predicted")})
    pair.update(*updates[0])
    assert len(pair.compute_groups) == 3


def test_clones_share_the_model_and_keep_their_own_states():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    metric = NegativePerturbationAUC(model, TAB, score="probability")
    tracker = MetricTracker(metric)
    tracker.increment()
    clones = [metric.clone(), MetricCollection({"m": metric}).clone()["m"], tracker[-1]]
    x = torch.rand(3, 4, generator=torch.Generator().manual_seed(1))
    metric.update(x, x)
    for clone in clones:
        assert clone.forward_fn is model
        assert {id(p) for p in clone.forward_fn.parameters()} == {id(p) for p in model.parameters()}
        assert type(clone) is NegativePerturbationAUC and clone.score == "probability"
        clone.update(x, x)
        assert clone.compute().item() == pytest.approx(metric.compute().item())
    clones[0].update(x, x)
    assert clones[0].negative_probability_target_count.item() == 6
    assert metric.negative_probability_target_count.item() == 3


@pytest.mark.parametrize("name", sorted(PERTURBATION_METRICS))
def test_per_sample_states_are_each_samples_own_update_and_the_auc_is_linear(name):
    # Standard errors over samples need each sample's own states; per_sample_states gets them from one
    # batched pass, which must equal one update per sample and sum to the batch's update.
    from lightning_gae.metrics._stderr import value_and_stderr as _value_and_stderr

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(12, 4, generator=generator)
    attributions = torch.rand(12, 4, generator=generator)
    labels = torch.randint(0, 3, (12,), generator=generator)
    metric = perturbation_metric(name, model, TAB, protocol="predicted", max_batch=7)
    states = metric.per_sample_states(x, attributions, labels)
    assert all(torch.equal(v, metric.metric_state[k]) for k, v in metric._defaults.items()), "the metric is unchanged"
    assert set(states) == set(metric.metric_state) and all(v.shape[0] == 12 for v in states.values())
    for i in range(12):
        metric.reset()
        metric.update(x[i : i + 1], attributions[i : i + 1], labels[i : i + 1])
        for state, value in metric.metric_state.items():
            torch.testing.assert_close(states[state][i], value, rtol=0, atol=1e-6)
    metric.reset()
    metric.update(x, attributions, labels)
    for state, value in metric.metric_state.items():
        torch.testing.assert_close(states[state].sum(dim=0), value, rtol=0, atol=1e-5)
    # The value is a mean over samples of each sample's own score: for a curve metric, the area of
    # each sample's curve (trapezoid in float64) averages to the area of the mean curve.
    if hasattr(metric, "curve"):
        curves = states[metric._sum_name].double()
        scale = 100.0 if isinstance(metric, PerturbationAUC) else 1.0
        own = torch.trapezoid(curves, torch.tensor(metric.fractions, dtype=torch.float64), dim=1) * scale
    else:
        own = states[metric._total_name].double()
    assert own.mean().item() == pytest.approx(metric.compute().item(), abs=1e-5)
    # The jackknife over these states is the sample standard deviation of the own scores over sqrt(n).
    value, stderr = _value_and_stderr(metric, [{k: v[i] for k, v in states.items()} for i in range(12)])
    assert value[""] == pytest.approx(own.mean().item(), abs=1e-5)
    assert stderr[""] == pytest.approx((own.std() / math.sqrt(12)).item(), rel=1e-4, abs=1e-6)
    assert stderr[""] > 0
    if hasattr(metric, "per_sample_values"):
        # The closed form equals the jackknife written out: compute() with each sample left out.
        total = {k: v.sum(dim=0) for k, v in states.items()}
        thetas = []
        for i in range(12):
            for k, v in total.items():
                setattr(metric, k, v - states[k][i])
            thetas.append(type(metric).compute(metric).double())
        thetas = torch.stack(thetas)
        jackknife = math.sqrt(11 / 12 * float(((thetas - thetas.mean()) ** 2).sum()))
        assert stderr[""] == pytest.approx(jackknife, rel=1e-4)
        metric.reset()


def test_random_attribution_is_seeded():
    like = torch.zeros(3, 17)
    assert torch.equal(random_attribution(like, 1), random_attribution(like, 1))
    assert not torch.equal(random_attribution(like, 1), random_attribution(like, 2))


# --- agreement with ground truth and stability, by hand ---------------------------------------------


def test_relevance_segmentation_by_hand():
    maps = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]]])
    masks = torch.tensor([[[1, 0], [0, 0]], [[1, 0], [0, 0]]])
    metric = RelevanceSegmentation()
    metric.update(maps[:1], masks[:1])
    first = metric.compute()
    assert first["pixel_accuracy"] == 1.0 and first["miou"] == 1.0 and first["mean_ap"] == 1.0
    metric.update(maps[1:], masks[1:])
    out = metric.compute()
    # Over both: TP 1, FP 1, FN 1, TN 5. AP of the second map, both channels in one ranking: at 1
    # the foreground pixel 1 and background pixel 0 (negatives) tie with background pixels 2 and 3
    # (positives): precision 1/2 at recall 1/2; then everything: 4/8 at recall 1.
    assert out["pixel_accuracy"].item() == pytest.approx(6 / 8)
    assert out["miou"].item() == pytest.approx((1 / 3 + 5 / 7) / 2)
    assert out["mean_ap"].item() == pytest.approx((1.0 + 0.5) / 2)
    assert functional.relevance_segmentation(maps, masks)["miou"].item() == pytest.approx(out["miou"].item())
    # Token relevance through the modality: the CLS token dropped, 2x2 patches of a 4x4 mask.
    tokens = torch.tensor([[5.0, 1.0, 0.0, 0.0, 0.0]])
    mask = torch.zeros(1, 4, 4)
    mask[0, :2, :2] = 1
    seg = RelevanceSegmentation(ImageTokens(patch_size=2))
    seg.update(tokens, mask)
    assert seg.compute()["mean_ap"].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="modality=ImageTokens"):
        RelevanceSegmentation().update(tokens, mask)


def average_precision_oracle(scores, labels):
    """Sum over the distinct thresholds, high to low, of the recall gained times the precision there."""
    positives, ap, recalled = sum(labels), 0.0, 0.0
    for threshold in sorted(set(scores), reverse=True):
        chosen = [label for score, label in zip(scores, labels) if score >= threshold]
        recall = sum(chosen) / positives
        ap += (recall - recalled) * sum(chosen) / len(chosen)
        recalled = recall
    return ap


def segmentation_ap_oracle(relevance, mask):
    """One sample, float64: min-max, then the background channel 1 - m and the foreground channel m ranked together."""
    m = relevance.double().flatten()
    m = ((m - m.min()) / (m.max() - m.min())).tolist()
    foreground = (mask.flatten() != 0).tolist()
    return average_precision_oracle([1 - v for v in m] + m, [not f for f in foreground] + foreground)


@pytest.mark.parametrize("scale, offset", [(1e3, 5e3), (1e-7, 0.0)], ids=["large", "tiny-signed"])
def test_average_precision_ranks_maps_of_any_scale(scale, offset):
    # Maps far outside [0, 1]: torchmetrics would put them through a sigmoid, which saturates large
    # values to 1.0 and rounds tiny signed ones to 0.5, tying every pixel.
    generator = torch.Generator().manual_seed(3)
    masks = torch.zeros(4, 8, 8)
    masks[:, 2:6, 1:5] = 1
    signal = masks + 0.8 * torch.randn(4, 8, 8, generator=generator)
    maps = offset + scale * signal
    out = functional.relevance_segmentation(maps, masks)
    expected = sum(segmentation_ap_oracle(m, t) for m, t in zip(signal, masks)) / 4
    assert 0.6 < expected < 0.99
    assert out["mean_ap"].item() == pytest.approx(expected, abs=1e-5)
    # The threshold at the mean and the ranking do not depend on the scale.
    unscaled = functional.relevance_segmentation(signal, masks)
    assert {k: v.item() for k, v in out.items()} == pytest.approx({k: v.item() for k, v in unscaled.items()}, abs=1e-5)
    # Rationale AUPRC: the same ranking of the valid tokens, whatever their scale.
    tokens, rationale = maps.flatten(1)[:, :20], masks.flatten(1)[:, :20].long()
    rationale[:, 3] = 1
    valid = torch.ones_like(rationale, dtype=torch.bool)
    valid[:, -2:] = False
    expected = sum(average_precision_oracle(s[v].double().tolist(), r[v].tolist())
                   for s, r, v in zip(tokens, rationale, valid)) / 4
    assert functional.rationale_agreement(tokens, rationale, valid)["auprc"].item() == pytest.approx(expected, abs=1e-5)


def test_rationale_agreement_by_hand():
    scores = torch.tensor([[0.9, 0.1, 0.8, 0.2], [0.1, 0.2, 0.3, 0.4]])
    rationales = torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0]])   # the second has no rationale: not counted
    metric = RationaleAgreement()
    metric.update(scores, rationales)
    out = metric.compute()
    assert out["token_f1"].item() == pytest.approx(0.5)                    # top 2 = {0, 2}, one hit
    assert out["auprc"].item() == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)  # hits at ranks 1 and 3
    # Invalid tokens are out of the ranking: without token 2 the top 2 are exactly the rationale.
    valid = torch.tensor([[True, True, False, True], [True] * 4])
    assert functional.rationale_agreement(scores, rationales, valid)["token_f1"].item() == pytest.approx(1.0)
    assert functional.rationale_agreement(scores, rationales, k=1)["token_f1"].item() == pytest.approx(2 / 3)


def test_explanation_stability_by_hand():
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    b = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    metric = ExplanationStability(top_fraction=0.5)
    metric.update(a, b)
    out = metric.compute()
    assert out["spearman"].item() == pytest.approx(0.0)          # (1 + -1) / 2
    assert out["topk_iou"].item() == pytest.approx(0.5)          # {2,3} vs {2,3}: 1; vs {0,1}: 0
    assert out["topk_overlap"].item() == pytest.approx(0.5)
    # A constant explanation (first or second) has no rank correlation: it is left out of the mean,
    # not counted as 0; the top-k scores still count it.
    agreeing = ExplanationStability(top_fraction=0.5)
    agreeing.update(a[:1], a[:1] * 2)
    agreeing.update(torch.ones(1, 4), a[:1])
    agreeing.update(a[:1], torch.zeros(1, 4))
    out = agreeing.compute()
    assert out["spearman"].item() == pytest.approx(1.0, abs=1e-5)
    assert agreeing.spearman_count.item() == 1 and agreeing.count.item() == 3
    only_constant = functional.explanation_stability(torch.ones(2, 4), a)
    assert math.isnan(only_constant["spearman"].item())


# --- torchmetrics plumbing ------------------------------------------------------------------------


@pytest.mark.parametrize("module", [functional.perturbation, functional.segmentation, functional.stability,
                                    perturbation, segmentation, stability], ids=lambda m: m.__name__)
def test_docstring_examples_compute_what_they_say(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_metrics_plot_and_keep_the_model_out_of_their_state():
    model = SumModel()
    model.extra = nn.Linear(2, 2)
    metric = PerturbationAUC(model, TAB)
    metric.update(FEATURES, FEATURES.clone(), 1)
    assert list(metric.parameters()) == [] and "extra.weight" not in metric.state_dict()
    fig, ax = metric.plot()
    assert fig is not None and ax is not None
    stability = ExplanationStability()
    stability.update(torch.rand(3, 8), torch.rand(3, 8))
    fig, ax = stability.plot()
    assert len(ax.get_lines()) + len(ax.collections) >= 1


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="order"):
        PerturbationAUC(SumModel(), TAB, order="up")
    with pytest.raises(ValueError, match="modality"):
        PerturbationAUC(SumModel(), "pixels")
    with pytest.raises(ValueError, match="fractions"):
        PerturbationAUC(SumModel(), TAB, fractions=(0.5, 0.1))
    with pytest.raises(ValueError, match="do not fit"):
        PerturbationAUC(SumModel(), ImageTokens(2)).update(torch.rand(2, 1, 8, 8), torch.rand(2, 3, 3))


def test_text_model_through_a_mapping_input():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(5, 30, (4, 8))
    ids[:, 0], ids[:, -1] = 1, 2
    ids[3, 5:] = 0
    batch = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    modality = TextTokens(vocab=[str(i) for i in range(30)], special_ids=[1, 2], pad_id=0, mask_id=3)
    metric = PerturbationAUC(model, modality, score="probability", max_batch=5)
    metric.update(batch, torch.rand(4, 8))
    assert 0.0 < metric.compute().item() < 90.0
    assert model.training is False


# --- DDP: synced values equal the single-process value ------------------------------------------------


def _ddp_worker(rank, world, port, x, attributions, masks, result):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        part = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
        model = SumModel(threshold=4.0, region=(slice(0, 4), slice(0, 4)))
        metrics = _ddp_metrics(model)
        metrics["auc"].update(x[part], attributions[part], 1)
        metrics["seg"].update(attributions[part], masks[part])
        metrics["stab"].update(attributions[part].flatten(1), x[part].flatten(1))
        out = {"auc": metrics["auc"].compute(), **metrics["seg"].compute(), **metrics["stab"].compute()}
        # curve() after compute(): compute's sync is undone, so curve must sync by itself.
        curve = metrics["auc"].curve().tolist()
        if rank == 0:
            result.update({k: float(v) for k, v in out.items()})
            result["curve"] = curve
            # The states stay local, so accumulation goes on after a synced curve.
            result["local_count"] = int(metrics["auc"].positive_probability_target_count)
    finally:
        dist.destroy_process_group()


def _ddp_metrics(model):
    return {"auc": PerturbationAUC(model, ImageTokens(patch_size=2), score="probability"),
            "seg": RelevanceSegmentation(), "stab": ExplanationStability()}


def test_ddp_synced_values_equal_the_single_process_value():
    torch.manual_seed(0)
    x = torch.rand(8, 1, 8, 8)
    attributions = torch.rand(8, 1, 8, 8)
    masks = torch.zeros(8, 8, 8)
    masks[:, :4, :4] = 1
    single = _ddp_metrics(SumModel(threshold=4.0, region=(slice(0, 4), slice(0, 4))))
    single["auc"].update(x, attributions, 1)
    single["seg"].update(attributions, masks)
    single["stab"].update(attributions.flatten(1), x.flatten(1))
    expected = {"auc": float(single["auc"].compute()), **{k: float(v) for k, v in single["seg"].compute().items()},
                **{k: float(v) for k, v in single["stab"].compute().items()}}
    expected_curve = single["auc"].curve()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(_ddp_worker, args=(2, port, x, attributions, masks, result), nprocs=2)
        synced = dict(result)
    curve, local_count = synced.pop("curve"), synced.pop("local_count")
    assert synced.keys() == expected.keys()
    # Rank 0 alone (its half) would give another value: the equality below needs the sync.
    half = _ddp_metrics(SumModel(threshold=4.0, region=(slice(0, 4), slice(0, 4))))["auc"]
    half.update(x[:4], attributions[:4], 1)
    assert float(half.compute()) != pytest.approx(expected["auc"], rel=1e-3)
    assert not torch.allclose(half.curve(), expected_curve, rtol=1e-3)
    torch.testing.assert_close(torch.tensor(curve), expected_curve, rtol=1e-5, atol=1e-6)
    assert local_count == 4
    for key, value in expected.items():
        assert synced[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
