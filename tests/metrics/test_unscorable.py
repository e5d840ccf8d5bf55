"""What the perturbation metrics do with relevance they cannot order (NaN, inf) and with an empty batch."""

import math

import pytest
import torch

from lightning_gae import ImageTokens
from lightning_gae.metrics import (
    ABPC,
    AOPC,
    Comprehensiveness,
    DeletionAUC,
    InsertionAUC,
    NegativePerturbationAUC,
    PositivePerturbationAUC,
    Sufficiency,
)
from lightning_gae.metrics.functional import comprehensiveness, deletion_auc, perturbation_auc
from tests.helpers.models import TinyViT

CLASSES = [PositivePerturbationAUC, NegativePerturbationAUC, DeletionAUC, InsertionAUC, ABPC, AOPC, Comprehensiveness,
           Sufficiency]


def _per_sample(metric, inputs, relevance, target):
    """Each sample's own value: the curve metrics integrate their per-sample states, the mean metrics' states are them."""
    states = metric.per_sample_states(inputs, relevance, target)
    if hasattr(metric, "per_sample_values"):
        return metric.per_sample_values(states)
    (total,) = [v for k, v in states.items() if k.endswith("_total")]
    return total


def _setup():
    torch.manual_seed(0)
    model = TinyViT().eval()
    # 17 tokens and a batch of 17 (shapes that coincide): the samples' axis must not be read as the tokens'.
    x = torch.randn(17, 1, 8, 8)
    target = torch.arange(17) % 5
    relevance = torch.rand(17, 17)
    return model, x, target, relevance


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_sample_with_unorderable_relevance_is_nan_and_the_others_keep_their_values(cls, bad):
    model, x, target, relevance = _setup()
    spoiled = relevance.clone()
    spoiled[3, 5] = bad  # one removable patch of sample 3
    metric = cls(model, ImageTokens(patch_size=2))
    values = _per_sample(metric, x, spoiled, target)
    keep = torch.arange(17) != 3
    alone = _per_sample(metric, x[keep], relevance[keep], target[keep])
    assert math.isnan(values[3])
    torch.testing.assert_close(values[keep], alone)
    metric.update(x, spoiled, target)
    assert math.isnan(metric.compute())  # a mean over samples shows the NaN instead of hiding it


def test_relevance_that_is_nan_only_where_nothing_is_removed_still_scores():
    # The CLS token's relevance (not a removable unit of an image) does not decide any removal order.
    model, x, target, relevance = _setup()
    spoiled = relevance.clone()
    spoiled[:, 0] = float("nan")
    metric = PositivePerturbationAUC(model, ImageTokens(patch_size=2))
    metric.update(x, spoiled, target)
    reference = PositivePerturbationAUC(model, ImageTokens(patch_size=2))
    reference.update(x, relevance, target)
    assert not math.isnan(metric.compute()) and metric.compute() == reference.compute()


@pytest.mark.parametrize("cls", CLASSES)
def test_an_empty_update_leaves_the_metric_as_it_was(cls):
    model, x, target, relevance = _setup()
    metric, reference = cls(model, ImageTokens(patch_size=2)), cls(model, ImageTokens(patch_size=2))
    metric.update(x[:0], relevance[:0], target[:0])
    metric.update(x[:4], relevance[:4], target[:4])
    metric.update(x[:0], relevance[:0], target[:0])
    reference.update(x[:4], relevance[:4], target[:4])
    torch.testing.assert_close(metric.compute(), reference.compute())


@pytest.mark.parametrize("fn", [perturbation_auc, deletion_auc, comprehensiveness])
def test_the_functions_refuse_an_empty_batch_with_what_to_pass(fn):
    model, x, target, relevance = _setup()
    with pytest.raises(ValueError, match="hold no sample: pass a batch of at least one"):
        fn(model, ImageTokens(patch_size=2), x[:0], relevance[:0], target[:0])
