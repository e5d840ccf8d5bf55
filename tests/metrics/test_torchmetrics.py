"""lightning_gae.metrics as torchmetrics metrics: collections, clones, per-sample states, docstrings, plots,
argument checks, mapping inputs, and DDP."""

import doctest
import math
import statistics
import os

import matplotlib
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.wrappers import MetricTracker

from lightning_gae import ImageTokens, TextTokens
from lightning_gae.metrics import (
    ExplanationStability,
    NegativePerturbationAUC,
    PERTURBATION_METRICS,
    ROAD,
    PerturbationAUC,
    PositivePerturbationAUC,
    RelevanceSegmentation,
    functional,
    perturbation,
    perturbation_metric,
    segmentation,
    stability,
)
from lightning_gae.metrics.stderr import value_and_stderr
from tests.helpers.models import FEATURES, TAB, SumModel
from tests.helpers.processes import free_port

matplotlib.use("Agg")


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
        scale = 100.0 if isinstance(metric, (PerturbationAUC, ROAD)) else 1.0
        own = torch.trapezoid(curves, torch.tensor(metric.fractions, dtype=torch.float64), dim=1) * scale
    else:
        own = states[metric._total_name].double()
    assert own.mean().item() == pytest.approx(metric.compute().item(), abs=1e-5)
    # The jackknife over these states is the sample standard deviation of the own scores over sqrt(n).
    value, stderr = value_and_stderr(metric, [{k: v[i] for k, v in states.items()} for i in range(12)])
    assert value[""] == pytest.approx(own.mean().item(), abs=1e-5)
    assert stderr[""] == pytest.approx((own.std() / math.sqrt(12)).item(), rel=1e-4, abs=1e-6)
    assert stderr[""] > 0
    # Samples that are not independent (a prompt's answer tokens) share a group and are left out together: the
    # delete-a-group jackknife, written out over the own scores (the value stays the mean over all samples).
    groups = [0, 0, 1, 1, 1, 2, 3, 3, 4, 5, 5, 5]
    value, grouped = value_and_stderr(metric, [{k: v[i] for k, v in states.items()} for i in range(12)], groups)
    left_out = [statistics.fmean(float(own[i]) for i in range(12) if groups[i] != g) for g in range(6)]
    mean_left_out = statistics.fmean(left_out)
    assert value[""] == pytest.approx(own.mean().item(), abs=1e-5)
    assert grouped[""] == pytest.approx(math.sqrt(5 / 6 * sum((t - mean_left_out) ** 2 for t in left_out)), rel=1e-4)
    # One group per sample is the plain jackknife; a label too few is refused.
    alone = value_and_stderr(metric, [{k: v[i] for k, v in states.items()} for i in range(12)], list(range(12)))
    assert alone[1][""] == pytest.approx(stderr[""], rel=1e-6)
    with pytest.raises(ValueError, match="groups has 11 labels for 12 samples"):
        value_and_stderr(metric, [{k: v[i] for k, v in states.items()} for i in range(12)], groups[:-1])
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


@pytest.mark.slow
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
    port = free_port()
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
