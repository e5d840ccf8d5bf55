"""lightning_gae.metrics against ground truth and against itself: segmentation, rationales, stability, by hand."""

import math

import matplotlib
import pytest
import torch

from lightning_gae import ImageTokens
from lightning_gae.metrics import ExplanationStability, RationaleAgreement, RationaleRecall, RelevanceSegmentation, functional
from tests.helpers.metric_oracle import average_precision_oracle, rationale_recall_oracle, segmentation_ap_oracle

matplotlib.use("Agg")


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



@pytest.mark.parametrize("k", [None, 1, 3])
def test_rationale_recall_equals_oracle_over_batches(k):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(40, 12, generator=g)
    rationales = (torch.rand(40, 12, generator=g) < 0.2).long()
    valid = torch.rand(40, 12, generator=g) < 0.85
    scores[3] = -scores[3].abs() - 0.1    # no positive relevance: mass 0
    expected = rationale_recall_oracle(scores, rationales, valid, k)
    out = functional.rationale_recall(scores, rationales, valid, k)
    assert {key: v.item() for key, v in out.items()} == pytest.approx(expected, abs=1e-6)
    metric = RationaleRecall(k=k)
    for part in range(0, 40, 16):
        metric.update(scores[part:part + 16], rationales[part:part + 16], valid[part:part + 16])
    assert {key: v.item() for key, v in metric.compute().items()} == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="k must be >= 1"):
        RationaleRecall(k=0)
