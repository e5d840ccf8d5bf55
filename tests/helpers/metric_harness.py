"""The metric test harness, after torchmetrics' own tester: for every ``torchmetrics.Metric`` of
lightning_gae.metrics, the class updated batch by batch equals the functional form on every sample at
once, which equals a dense per-sample oracle (tests/helpers/metric_oracle.py); and under DDP (2 CPU processes,
gloo, ``torch.multiprocessing.spawn``) each rank updating on its share of the batches computes, after
the sync, the single-process value.

Every case is built by a function from fixed seeds, so a spawned process rebuilds the same model and
batches from the case's name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_gae import TabularTokens
from lightning_gae.metrics import (
    ABPC,
    AOPC,
    AlignmentAccuracy,
    Comprehensiveness,
    DeletionAUC,
    ExplanationStability,
    InsertionAUC,
    NegativePerturbationAUC,
    PositivePerturbationAUC,
    RationaleAgreement,
    RationaleRecall,
    RelevanceSegmentation,
    RegionRecall,
    RegionShare,
    ROAD,
    ROADLeRF,
    Sufficiency,
    functional,
)
from lightning_gae.metrics.functional import ERASER_BINS, PERTURBATION_FRACTIONS, RISE_FRACTIONS
from tests.helpers.processes import free_port
from tests.helpers import metric_oracle as oracle

# Uneven batches; with two processes each rank updates on two of them.
BATCH_SIZES = (3, 5, 2, 4)


@dataclass
class Case:
    """One metric: a fresh instance, its functional form and its oracle (both called with the batches'
    arguments concatenated), and the ``update`` arguments batch by batch."""

    metric: Callable[[], Metric]
    functional: Callable[..., Any]
    oracle: Callable[..., Any]
    batches: list[tuple]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- perturbation metrics: a small MLP on 20 tabular features, removed features take fixed means ----------

FEATURES = 20  # every default fraction and bin is a whole number of these


def _tabular_setting(seed: int, with_labels: bool):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 3)).eval()
    g = _generator(seed + 1)
    means = (0.1 * torch.randn(FEATURES, generator=g)).tolist()
    modality = TabularTokens([f"f{i}" for i in range(FEATURES)], prefix_tokens=0, means=means)
    batches = []
    for n in BATCH_SIZES:
        x = torch.randn(n, FEATURES, generator=g)
        # Large features ranked first more often: removing them moves the logits, so the curves are not flat.
        attributions = x.abs() * torch.rand(n, FEATURES, generator=g)
        labels = torch.randint(0, 3, (n,), generator=g)
        batches.append((x, attributions, labels if with_labels else None))
    return model, modality, means, batches


def _curve_case(cls, function, seed, with_labels, fractions, insertion=False, scale=1.0, **options) -> Case:
    model, modality, means, batches = _tabular_setting(seed, with_labels)
    protocol = options.get("protocol", "target")
    oracle_options = dict(fractions=fractions, protocol=protocol, insertion=insertion, scale=scale,
                          order=getattr(cls, "order", "positive"), score=options.get("score", "probability"))
    return Case(
        metric=lambda: cls(model, modality, **options),
        functional=lambda x, a, t: function(model, modality, x, a, t, **options),
        oracle=lambda x, a, t: oracle.curve_oracle(model, means, x, a, t, **oracle_options),
        batches=batches,
    )


def _eraser_case(cls, function, seed, with_labels, keep_only=False, with_zero=False, **options) -> Case:
    model, modality, means, batches = _tabular_setting(seed, with_labels)
    protocol = options.get("protocol", "target")
    return Case(
        metric=lambda: cls(model, modality, **options),
        functional=lambda x, a, t: function(model, modality, x, a, t, **options),
        oracle=lambda x, a, t: oracle.eraser_oracle(model, means, x, a, t, ERASER_BINS, protocol=protocol,
                                                    keep_only=keep_only, with_zero=with_zero),
        batches=batches,
    )


def positive_perturbation_auc() -> Case:
    return _curve_case(PositivePerturbationAUC,
                       lambda *a, **o: functional.perturbation_auc(*a, order="positive", **o), seed=0, with_labels=True,
                       fractions=PERTURBATION_FRACTIONS, scale=100.0, score="accuracy", protocol="target")


def negative_perturbation_auc() -> Case:
    return _curve_case(NegativePerturbationAUC,
                       lambda *a, **o: functional.perturbation_auc(*a, order="negative", **o), seed=1, with_labels=True,
                       fractions=PERTURBATION_FRACTIONS, scale=100.0, score="probability", protocol="predicted")


def abpc() -> Case:
    # The area between the curves is linear in them: the oracle is the negative curve's area minus the positive's.
    model, modality, means, batches = _tabular_setting(8, True)
    options = dict(fractions=PERTURBATION_FRACTIONS, scale=100.0, score="probability", protocol="predicted")
    return Case(
        metric=lambda: ABPC(model, modality, score="probability", protocol="predicted"),
        functional=lambda x, a, t: functional.abpc(model, modality, x, a, t, score="probability", protocol="predicted"),
        oracle=lambda x, a, t: (oracle.curve_oracle(model, means, x, a, t, order="negative", **options)
                                - oracle.curve_oracle(model, means, x, a, t, order="positive", **options)),
        batches=batches,
    )


def road() -> Case:
    # On a table ROAD removes features as the perturbation test does: the same oracle (images: tests/metrics/test_road.py).
    return _curve_case(ROAD, lambda *a, **o: functional.road_auc(*a, order="positive", **o), seed=14, with_labels=True,
                       fractions=PERTURBATION_FRACTIONS, scale=100.0, score="probability", protocol="predicted")


def road_lerf() -> Case:
    return _curve_case(ROADLeRF, lambda *a, **o: functional.road_auc(*a, order="negative", **o), seed=15,
                       with_labels=False, fractions=PERTURBATION_FRACTIONS, scale=100.0, score="accuracy",
                       protocol="target")


def deletion_auc() -> Case:
    return _curve_case(DeletionAUC, functional.deletion_auc, seed=2, with_labels=True, fractions=RISE_FRACTIONS)


def insertion_auc() -> Case:
    return _curve_case(InsertionAUC, functional.insertion_auc, seed=3, with_labels=False, fractions=RISE_FRACTIONS,
                       insertion=True, protocol="predicted")


def comprehensiveness() -> Case:
    return _eraser_case(Comprehensiveness, functional.comprehensiveness, seed=4, with_labels=True)


def sufficiency() -> Case:
    return _eraser_case(Sufficiency, functional.sufficiency, seed=5, with_labels=True, keep_only=True,
                        protocol="predicted")


def aopc() -> Case:
    return _eraser_case(AOPC, functional.aopc, seed=6, with_labels=False, with_zero=True)


# --- agreement with ground truth, alignment, stability ------------------------------------------------


def relevance_segmentation() -> Case:
    g = _generator(7)
    batches = []
    for n in BATCH_SIZES:
        masks = torch.zeros(n, 6, 6)
        for i in range(n):
            r, c = (int(v) for v in torch.randint(0, 3, (2,), generator=g))
            masks[i, r : r + 3, c : c + 3] = 1
        batches.append((masks + 0.8 * torch.randn(n, 6, 6, generator=g), masks))
    return Case(metric=RelevanceSegmentation, functional=functional.relevance_segmentation,
                oracle=oracle.relevance_segmentation_oracle, batches=batches)


def rationale_agreement() -> Case:
    g = _generator(8)
    batches = []
    for n in BATCH_SIZES:
        rationales = (torch.rand(n, 12, generator=g) < 0.25).long()
        rationales[0] = 0  # a sample without a rationale is not counted
        valid = torch.rand(n, 12, generator=g) > 0.15
        batches.append((torch.randn(n, 12, generator=g), rationales, valid))
    return Case(metric=RationaleAgreement, functional=functional.rationale_agreement,
                oracle=oracle.rationale_agreement_oracle, batches=batches)


def rationale_recall() -> Case:
    g = _generator(11)
    batches = []
    for n in BATCH_SIZES:
        rationales = (torch.rand(n, 12, generator=g) < 0.25).long()
        rationales[0] = 0  # a sample without a rationale is not counted
        valid = torch.rand(n, 12, generator=g) > 0.15
        scores = torch.randn(n, 12, generator=g)
        scores[-1] = -scores[-1].abs() - 0.1  # no positive relevance: mass 0
        batches.append((scores, rationales, valid))
    return Case(metric=RationaleRecall, functional=functional.rationale_recall,
                oracle=oracle.rationale_recall_oracle, batches=batches)


def alignment_accuracy() -> Case:
    g = _generator(9)
    batches = []
    for n in BATCH_SIZES:
        relevance = torch.rand(n, 4, 7, generator=g)
        alignment = torch.randint(-1, 7, (n, 4), generator=g)
        # Plant the aligned maximum in some pairs, so that both hits and misses are counted.
        planted = torch.rand(n, 4, generator=g) < 0.5
        relevance = torch.where(planted[..., None], relevance.scatter(-1, alignment.clamp(min=0)[..., None], 2.0), relevance)
        batches.append((relevance, alignment, torch.rand(n, 7, generator=g) > 0.1))
    return Case(metric=AlignmentAccuracy, functional=functional.alignment_accuracy,
                oracle=oracle.alignment_accuracy_oracle, batches=batches)


def explanation_stability() -> Case:
    g = _generator(10)
    batches = []
    for n in BATCH_SIZES:
        first = torch.rand(n, 17, generator=g)
        second = first + 0.3 * torch.randn(n, 17, generator=g)
        # No constant row here: its top-k set would be a tie broken any way (the by-hand test covers constant rows).
        batches.append((first, second))
    return Case(metric=lambda: ExplanationStability(top_fraction=0.2),
                functional=lambda a, b: functional.explanation_stability(a, b, top_fraction=0.2),
                oracle=lambda a, b: oracle.explanation_stability_oracle(a, b, top_fraction=0.2), batches=batches)


def _region_batches(seed: int, empty_region: bool) -> list[tuple]:
    g = _generator(seed)
    batches = []
    for n in BATCH_SIZES:
        scores = torch.randn(n, 14, generator=g)
        mask = torch.rand(n, 14, generator=g) < 0.3
        valid = torch.rand(n, 14, generator=g) > 0.15
        scores[0] = -scores[0].abs() - 0.1  # no positive relevance: no share
        if empty_region:
            mask[-1] = False                 # no region: no recall
        batches.append((scores, mask, valid))
    return batches


def region_share() -> Case:
    return Case(metric=RegionShare, functional=lambda *a: functional.region_share(*a).nanmean(),
                oracle=oracle.region_share_oracle, batches=_region_batches(12, empty_region=False))


def region_recall() -> Case:
    return Case(metric=lambda: RegionRecall(k=3),
                functional=lambda s, m, v: functional.region_recall(s, m, 3, v).nanmean(),
                oracle=lambda s, m, v: oracle.region_recall_oracle(s, m, v, k=3),
                batches=_region_batches(13, empty_region=True))


CASES: dict[str, Callable[[], Case]] = {
    "PositivePerturbationAUC": positive_perturbation_auc,
    "NegativePerturbationAUC": negative_perturbation_auc,
    "ABPC": abpc,
    "ROAD": road,
    "ROADLeRF": road_lerf,
    "DeletionAUC": deletion_auc,
    "InsertionAUC": insertion_auc,
    "Comprehensiveness": comprehensiveness,
    "Sufficiency": sufficiency,
    "AOPC": aopc,
    "RelevanceSegmentation": relevance_segmentation,
    "RationaleAgreement": rationale_agreement,
    "RationaleRecall": rationale_recall,
    "AlignmentAccuracy": alignment_accuracy,
    "ExplanationStability": explanation_stability,
    "RegionShare": region_share,
    "RegionRecall": region_recall,
}


# --- the checks ------------------------------------------------------------------------------------------


def concatenate(batches: list[tuple]) -> tuple:
    """The batches' ``update`` arguments joined along the sample dimension (None stays None)."""
    joined = []
    for values in zip(*batches):
        if all(v is None for v in values):
            joined.append(None)
        else:
            joined.append(torch.cat(values))
    return tuple(joined)


def as_floats(value: Tensor | dict | float) -> dict[str, float]:
    """A metric's value as ``{key: float}`` ("" for a single value)."""
    if isinstance(value, dict):
        return {k: float(v) for k, v in value.items()}
    return {"": float(value)}


def assert_values_equal(actual: dict[str, float], expected: dict[str, float], what: str, rel=1e-5, abs=1e-6) -> None:
    assert actual.keys() == expected.keys(), what
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, rel=rel, abs=abs), f"{what}: {key}"


def single_process(case: Case) -> dict[str, float]:
    """The class updated batch by batch, in this process."""
    metric = case.metric()
    for args in case.batches:
        metric.update(*args)
    return as_floats(metric.compute())


def check_class_functional_oracle(case: Case) -> None:
    """class over the batches == functional on everything == the oracle, and the batches are not all alike."""
    assert len(case.batches) >= 3
    from_class = single_process(case)
    everything = concatenate(case.batches)
    from_functional = as_floats(case.functional(*everything))
    assert_values_equal(from_class, from_functional, "class over batches vs functional on all samples")
    assert_values_equal(from_functional, as_floats(case.oracle(*everything)), "functional vs oracle", abs=1e-5)
    # The first batch alone scores otherwise: accumulating the later ones is what the equality checks.
    first = case.metric()
    first.update(*case.batches[0])
    assert as_floats(first.compute()) != pytest.approx(from_class, rel=1e-6), "the batches must differ"


def _ddp_worker(rank: int, world: int, port: int, names: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for name in names:
            case = CASES[name]()
            metric = case.metric()
            for args in case.batches[rank::world]:
                metric.update(*args)
            results[name] = as_floats(metric.compute())
        torch.save(results, Path(out) / f"rank_{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ddp(names: list[str], directory: Path, world: int = 2) -> list[dict[str, dict[str, float]]]:
    """Every rank's synced ``compute()`` of each named case, each rank having updated on batches ``rank::world``."""
    mp.spawn(_ddp_worker, args=(world, free_port(), list(names), str(directory)), nprocs=world)
    return [torch.load(directory / f"rank_{rank}.pt") for rank in range(world)]
