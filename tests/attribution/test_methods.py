"""lightning_gae.attribution.attribute and compare refuse what explain() refuses (an empty batch, NaN inputs) for every
method, Captum's included, instead of failing inside Captum or attributing NaN inputs silently."""

import pytest
import torch

from lightning_gae.attribution import attribute
from tests.helpers.models import TinyViT


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "gae"])
def test_attribute_refuses_an_empty_batch_and_nan_inputs_for_captums_methods_as_for_the_others(method):
    torch.manual_seed(0)
    model, x = TinyViT().eval(), torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match="hold no sample"):
        attribute(method, model, x[:0])
    x[1, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or inf values \(1 in inputs\)"):
        attribute(method, model, x)


def test_compare_refuses_an_empty_batch_with_what_to_pass():
    from lightning_gae.compare import compare

    with pytest.raises(ValueError, match="hold no sample"):
        compare(TinyViT().eval(), torch.rand(0, 1, 8, 8), methods=("gae",))
