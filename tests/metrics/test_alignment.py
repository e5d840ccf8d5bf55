"""AlignmentAccuracy and alignment_accuracy: hand-worked cases, the plain-loop reference of tests/helpers/metric_oracle.py,
torchmetrics plumbing."""

import pytest
import torch
from torchmetrics import MetricCollection

from lightning_gae.metrics import AlignmentAccuracy
from lightning_gae.metrics.functional import alignment_accuracy
from tests.helpers.metric_oracle import alignment_accuracy_oracle


def test_hand_worked_cases():
    relevance = torch.tensor([
        [0.1, 0.7, 0.2, 0.0],   # aligned 1: hit
        [0.3, 0.3, 0.1, 0.0],   # aligned 0: tie with 1, a miss
        [0.0, 0.0, 0.0, 0.0],   # aligned 0: constant row, a miss (argmax alone would call it a hit)
        [0.9, 0.0, 0.0, 0.1],   # ignored
        [0.2, 0.1, 0.05, 0.6],  # aligned 2: miss
    ])
    alignment = torch.tensor([1, 0, 0, -1, 2])
    assert alignment_accuracy(relevance, alignment).item() == pytest.approx(1 / 4)


def test_valid_mask_keeps_padding_from_winning():
    relevance = torch.tensor([[0.2, 0.1, 0.0, 0.9]])  # position 3 is padding with (bad) relevance
    alignment = torch.tensor([0])
    assert alignment_accuracy(relevance, alignment).item() == 0.0
    assert alignment_accuracy(relevance, alignment, valid=torch.tensor([[True, True, True, False]])).item() == 1.0


def test_sequence_form_and_custom_ignore_index_match_the_reference():
    g = torch.Generator().manual_seed(0)
    relevance = torch.rand(6, 5, 9, generator=g)
    relevance[0, 0] = 0.0  # a tie row
    alignment = torch.randint(0, 9, (6, 5), generator=g)
    alignment[:, -1] = 99  # EOS with a custom ignore index
    valid = torch.rand(6, 9, generator=g) > 0.2
    got = alignment_accuracy(relevance, alignment, valid=valid, ignore_index=99)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(alignment_accuracy_oracle(relevance, alignment, valid, ignore_index=99))
    # Planting the maximum at the aligned position makes every counted pair a hit.
    planted = relevance.scatter(-1, alignment.clamp(max=8)[..., None], 2.0)
    assert alignment_accuracy(planted, alignment, ignore_index=99).item() == 1.0


def test_nothing_counted_is_nan():
    assert torch.isnan(alignment_accuracy(torch.rand(2, 3), torch.tensor([-1, -1])))
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(AlignmentAccuracy().compute())


@pytest.mark.parametrize(
    ("relevance", "alignment", "message"),
    [
        (torch.rand(2, 3), torch.tensor([0, 1, 2]), "disagree"),
        (torch.rand(2, 3), torch.tensor([[0], [1]]), "must be"),
        (torch.rand(2, 3), torch.tensor([0, 3]), "outside 0..2"),
        (torch.rand(2, 3), torch.tensor([0, -2]), "ignore_index=-1"),
    ],
)
def test_bad_input_is_named(relevance, alignment, message):
    with pytest.raises(ValueError, match=message):
        alignment_accuracy(relevance, alignment)


def test_metric_accumulates_batches_like_one_call():
    g = torch.Generator().manual_seed(1)
    relevance = torch.rand(10, 4, 7, generator=g)
    alignment = torch.randint(-1, 7, (10, 4), generator=g)
    metric = AlignmentAccuracy()
    metric.update(relevance[:3], alignment[:3])
    metric.update(relevance[3:], alignment[3:])
    assert metric.compute().item() == pytest.approx(alignment_accuracy(relevance, alignment).item())
    assert metric.compute().item() == pytest.approx(alignment_accuracy_oracle(relevance, alignment))
    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert torch.isnan(metric.compute())


def test_metric_in_a_collection():
    collection = MetricCollection({"alignment_accuracy": AlignmentAccuracy()}, prefix="val/")
    collection.update(torch.tensor([[0.1, 0.8, 0.1], [0.6, 0.3, 0.1]]), torch.tensor([1, 1]))
    assert collection.compute() == {"val/alignment_accuracy": pytest.approx(0.5)}
