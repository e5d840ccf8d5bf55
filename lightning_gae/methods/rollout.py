"""Attention rollout (Abnar & Zuidema, 2020): the product over calls of the head-averaged attention with the
identity added, rows normalised; the readout token's row. Needs no gradient."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lightning_gae.engine import rules
from lightning_gae.engine.forward import RecordedForward
from lightning_gae.methods.registry import Method, register_method

__all__ = ["ROLLOUT", "rollout"]


def rollout(run: RecordedForward) -> Tensor | Mapping[str, Tensor]:
    """Rollout's rows: one token set's product, or the rules of several sets with rollout's step."""
    if run.single:
        return rules.rollout_row(run.attentions(), run.query)
    return run.set_rows(run.head_means(), "rollout")


ROLLOUT = register_method(Method(name="rollout", kind="attention", rule=rollout, label="Rollout", default=True))
