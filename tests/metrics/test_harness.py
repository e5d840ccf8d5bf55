"""Every torchmetrics class of lightning_gae.metrics through the harness (tests/helpers/metric_harness.py): updated
over several batches it equals its functional form on all samples and a dense per-sample oracle; synced
across two DDP processes (gloo, CPU) it equals the single-process value."""

import pytest
from torchmetrics import Metric

from lightning_gae import metrics
from tests.helpers.metric_harness import CASES, assert_values_equal, check_class_functional_oracle, run_ddp, single_process


def test_every_metric_class_has_a_case():
    classes = {name for name in metrics.__all__
               if isinstance(getattr(metrics, name), type) and issubclass(getattr(metrics, name), Metric)}
    # PerturbationAUC builds one of its two subclasses, which are the cases.
    assert classes - {"PerturbationAUC"} <= set(CASES) | {"NegativePerturbationAUC", "PositivePerturbationAUC"}
    assert {"PositivePerturbationAUC", "NegativePerturbationAUC"} <= set(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_class_over_batches_equals_functional_equals_oracle(name):
    check_class_functional_oracle(CASES[name]())


@pytest.fixture(scope="module")
def ddp_values(tmp_path_factory):
    """One spawn of two processes computes every case (starting processes is the slow part)."""
    return run_ddp(list(CASES), tmp_path_factory.mktemp("ddp"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_ddp_synced_value_equals_the_single_process_value(name, ddp_values):
    expected = single_process(CASES[name]())
    for rank, values in enumerate(ddp_values):
        assert_values_equal(values[name], expected, f"rank {rank} after the sync")
