"""lightning_gae.engine.readout: inputs with NaN or inf are refused (explain() says how many and where) instead of
returning NaN relevance."""

import pytest
import torch

import lightning_gae as lg
from tests.helpers.models import TinyViT


def test_nan_pixels_are_refused_with_their_count_and_input():
    model = TinyViT().eval()
    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(lg.explain(model, x).tokens).all()
    x[1, 0, 2, 3] = float("nan")
    x[2, 0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"NaN or inf values \(2 in inputs\)"):
        lg.explain(model, x)


def test_the_message_names_the_keyword_input():
    model = TinyViT().eval()

    class Keyword(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, pixel_values, scale):
            return self.inner(pixel_values * scale)

    x = torch.rand(2, 1, 8, 8)
    scale = torch.ones(2, 1, 1, 1)
    scale[0] = float("-inf")
    with pytest.raises(ValueError, match=r"1 in inputs\['scale'\]"):
        lg.explain(Keyword(), {"pixel_values": x, "scale": scale})
    # Integer inputs (token ids) are never NaN and are not checked.
    assert torch.isfinite(lg.explain(Keyword(), {"pixel_values": x, "scale": torch.ones(2, 1, 1, 1)}).tokens).all()
