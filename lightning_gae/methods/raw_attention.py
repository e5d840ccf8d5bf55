"""Raw attention: the last attention call's head-averaged attention, the readout token's row. Needs no gradient."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lightning_gae.engine import rules
from lightning_gae.engine.forward import RecordedForward
from lightning_gae.methods.registry import Method, register_method

__all__ = ["RAW_ATTENTION", "raw_attention"]


def raw_attention(run: RecordedForward) -> Tensor | Mapping[str, Tensor]:
    """The last call's head mean, read at the readout (per set: the last call from its reading set to it)."""
    if run.single:
        return rules.raw_attention_row(run.attentions(last_only=True)[-1], run.query)
    return run.set_rows(run.head_means(), "last")


RAW_ATTENTION = register_method(Method(name="raw_attention", kind="attention", rule=raw_attention,
                                       label="Raw attention", last_layer_only=True, default=True))
