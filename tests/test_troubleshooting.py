"""Each entry of the troubleshooting page about the inputs and the model quotes what the library says: the quote of
its "What happens" line is part of the message raised by the case its "When" line describes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import lightning_gae as lg
from tests.helpers.models import TinyViT
from tests.helpers.private import _fit_to_forward as fit_to_forward

PAGE = Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md"


def _quoted(anchor: str) -> str:
    """The message an entry quotes, without its ``ValueError: `` prefix."""
    entry = PAGE.read_text().split(f"({anchor})=", 1)[1]
    (quote,) = re.findall(r"\*\*What happens:\*\* `(?:ValueError: )?([^`]+)`", entry.split("\n(", 1)[0])
    return quote


def _vit() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyViT().eval(), torch.rand(2, 1, 8, 8)


def _diverged():
    model, x = _vit()
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    lg.explain(model, x)


def _nan_inputs():
    model, x = _vit()
    x[0, 0, 1, 1] = float("nan")
    lg.explain(model, x)


def _empty():
    model, x = _vit()
    lg.explain(model, x[:0])


def _meta():
    with torch.device("meta"):
        model = TinyViT()
    lg.explain(model.eval(), torch.rand(2, 1, 8, 8))


class Classifier(nn.Module):
    def forward(self, x):
        return x


def _batch_layout():
    fit_to_forward(Classifier(), {"image": torch.rand(2, 3), "label": torch.tensor([0, 1])})


CASES = {"diverged-model": _diverged, "non-finite-inputs": _nan_inputs, "empty-batch": _empty, "meta-device": _meta,
         "batch-layout": _batch_layout}


@pytest.mark.parametrize("anchor", CASES)
def test_the_entry_quotes_what_the_case_raises(anchor):
    with pytest.raises(ValueError) as raised:
        CASES[anchor]()
    assert _quoted(anchor) in str(raised.value), (anchor, str(raised.value))


def test_every_entry_of_the_section_is_tested():
    section = PAGE.read_text().split("## The inputs and the model", 1)[1]
    assert re.findall(r"^\(([\w-]+)\)=$", section, re.M) == list(CASES)
