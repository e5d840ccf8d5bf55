"""ABPC (area between perturbation curves): the existing AUC classes, a dense oracle, batching, one pass."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import lightning_gae as lg
from lightning_gae import ImageTokens, TabularTokens
from lightning_gae.metrics import (
    ABPC,
    PERTURBATION_METRICS,
    NegativePerturbationAUC,
    PositivePerturbationAUC,
    functional,
    perturbation_metric,
)
from lightning_gae.metrics.functional import PERTURBATION_FRACTIONS, abpc, perturbation_auc
from tests.helpers.models import TinyViT

FEATURES = 7
MEANS = [0.1 * k - 0.3 for k in range(FEATURES)]
TAB = TabularTokens([f"f{k}" for k in range(FEATURES)], prefix_tokens=0, means=MEANS)


class CountingMLP(nn.Module):
    """Three classes from seven features; records the batch size of every forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 3))
        self.calls = []

    def forward(self, x):
        self.calls.append(x.shape[0])
        return self.net(x)


def _data(n=12, seed=1, model=None):
    """Features, labels and attributions: noise, or with ``model`` input x gradient of the predicted
    logit (informative, so the two curves part)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    attributions = torch.rand(n, FEATURES, generator=g)
    labels = torch.randint(0, 3, (n,), generator=g)
    if model is not None:
        inputs = x.clone().requires_grad_(True)
        logits = model.net(inputs)
        grad, = torch.autograd.grad(logits.gather(1, logits.argmax(1, keepdim=True)).sum(), inputs)
        attributions = (x - torch.tensor(MEANS)) * grad  # relative to the removal value
    return x, attributions, labels


# --- the dense oracle: one sample, one fraction, one forward at a time ------------------------------


def oracle_abpc(model, x, attributions, fractions, score, target=None):
    """Per sample and fraction, remove floor(f * n) features by hand (most / least relevant first,
    replaced by their mean), run the model on that one input, score it; trapezoid of the difference
    of the mean curves, x100."""
    model = model.eval()
    with torch.no_grad():
        curves = {"negative": [], "positive": []}
        for order in curves:
            for f in fractions:
                total = 0.0
                for b in range(x.shape[0]):
                    clean = model(x[b : b + 1])[0].double()
                    cls = int(clean.argmax()) if target is None else int(target[b])
                    relevance = [float(v) for v in attributions[b]]
                    ranking = sorted(range(FEATURES), key=lambda k: relevance[k], reverse=order == "positive")
                    removed = ranking[: math.floor(f * FEATURES + 1e-6)]
                    perturbed = x[b].clone()
                    for k in removed:
                        perturbed[k] = MEANS[k]
                    logits = model(perturbed[None])[0].double()
                    if score == "accuracy":
                        total += float(int(logits.argmax()) == cls)
                    else:
                        total += float(logits.softmax(dim=0)[cls])
                curves[order].append(total / x.shape[0])
    area = 0.0
    for s in range(len(fractions) - 1):
        diff_s = curves["negative"][s] - curves["positive"][s]
        diff_next = curves["negative"][s + 1] - curves["positive"][s + 1]
        area += 0.5 * (diff_s + diff_next) * (fractions[s + 1] - fractions[s])
    return 100.0 * area


@pytest.mark.parametrize("score", ["accuracy", "probability"])
def test_equals_the_dense_oracle(score):
    model = CountingMLP()
    x, attributions, labels = _data(model=model)
    expected = oracle_abpc(model, x, attributions, PERTURBATION_FRACTIONS, score, target=labels)
    got = abpc(model, TAB, x, attributions, target=labels, score=score)
    assert got.item() == pytest.approx(expected, abs=1e-4)
    # The class too, and the oracle with the unperturbed prediction as the class.
    metric = ABPC(model, TAB, score=score)
    metric.update(x, attributions)
    assert metric.compute().item() == pytest.approx(oracle_abpc(model, x, attributions, PERTURBATION_FRACTIONS, score),
                                                    abs=1e-4)
    assert abs(expected) > 1.0, "an ABPC of zero would prove nothing"


def test_equals_negative_minus_positive_auc_of_the_existing_classes():
    model = CountingMLP()
    x, attributions, labels = _data(seed=3, model=model)
    for kwargs in ({}, {"score": "probability"}, {"protocol": "predicted"}, {"fractions": (0, 0.25, 0.5, 1.0)}):
        target = labels if kwargs.get("protocol") == "predicted" else None
        negative, positive = NegativePerturbationAUC(model, TAB, **kwargs), PositivePerturbationAUC(model, TAB, **kwargs)
        between = ABPC(model, TAB, **kwargs)
        for metric in (negative, positive, between):
            metric.update(x, attributions, target)
        neg, pos = negative.compute().item(), positive.compute().item()
        assert neg != pytest.approx(pos), "equal curves would prove nothing"
        assert between.compute().item() == pytest.approx(neg - pos, abs=1e-4), kwargs
        # The functional forms agree with each other the same way.
        fractions = kwargs.get("fractions", PERTURBATION_FRACTIONS)
        common = dict(target=target, fractions=fractions, score=kwargs.get("score", "accuracy"),
                      protocol=kwargs.get("protocol", "target"))
        assert abpc(model, TAB, x, attributions, **common).item() == pytest.approx(
            (perturbation_auc(model, TAB, x, attributions, order="negative", **common)
             - perturbation_auc(model, TAB, x, attributions, order="positive", **common)).item(), abs=1e-4)


def test_a_vit_with_gae_relevance_on_images():
    torch.manual_seed(0)
    vit = TinyViT().eval()
    images = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    tokens = lg.explain(vit, images).tokens
    modality = ImageTokens(2)
    kwargs = dict(score="probability")
    negative, positive, between = (NegativePerturbationAUC(vit, modality, **kwargs),
                                   PositivePerturbationAUC(vit, modality, **kwargs), ABPC(vit, modality, **kwargs))
    for metric in (negative, positive, between):
        metric.update(images, tokens)
    assert between.compute().item() == pytest.approx(negative.compute().item() - positive.compute().item(), abs=1e-4)
    assert abpc(vit, modality, images, tokens, **kwargs).item() == pytest.approx(between.compute().item(), abs=1e-4)


def test_several_batches_equal_the_function_on_all():
    model = CountingMLP()
    x, attributions, labels = _data(n=12, seed=5)
    metric = ABPC(model, TAB, protocol="predicted")
    for part in (slice(0, 5), slice(5, 9), slice(9, 12)):
        metric.update(x[part], attributions[part], labels[part])
    whole = abpc(model, TAB, x, attributions, labels, protocol="predicted")
    assert metric.compute().item() == pytest.approx(whole.item(), abs=1e-5)
    assert metric.abpc_accuracy_predicted_count.item() == 12
    # Each sample's own value (what the standard error is computed from) averages to the metric.
    states = metric.per_sample_states(x, attributions, labels)
    own = metric.per_sample_values(states)
    assert own.shape == (12,) and own.mean().item() == pytest.approx(whole.item(), abs=1e-5)
    assert own.std() > 0


def test_both_orders_run_in_one_pass_of_the_engine():
    # Of 7 features, 0% and 10% remove none: those steps of both orders are the clean input, scored
    # from the one clean forward; the 2 x 8 x 12 perturbed inputs share ceil(192 / 100) chunks.
    model = CountingMLP()
    x, attributions, _ = _data(n=12)
    abpc(model, TAB, x, attributions, max_batch=100)
    assert model.calls == [12, 100, 92]
    # Each AUC alone is one such pass of 96: together they would be [12, 96] twice.
    model.calls.clear()
    perturbation_auc(model, TAB, x, attributions, order="negative", max_batch=100)
    assert model.calls == [12, 96]


def test_registered_and_exported():
    assert PERTURBATION_METRICS["abpc"] is ABPC
    assert functional.abpc is abpc
    metric = perturbation_metric("abpc", CountingMLP(), TAB, protocol="predicted", score="probability")
    assert type(metric) is ABPC and metric.higher_is_better is True
    assert (metric.protocol, metric.score) == ("predicted", "probability")
    assert (ABPC.plot_lower_bound, ABPC.plot_upper_bound) == (-100.0, 100.0)
    with pytest.raises(ValueError, match="score="):
        ABPC(CountingMLP(), TAB, score="logit")
    with pytest.raises(ValueError, match="fractions"):
        ABPC(CountingMLP(), TAB, fractions=(0.5, 0.2))
