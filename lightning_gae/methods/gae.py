"""GAE (Chefer, Gur & Wolf, ICCV 2021): ``Ā = E_h[(∇A ⊙ A)⁺]`` per attention call (Eq. 5), propagated through the
calls by the rules of Eq. 6-11, the readout token's row."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lightning_gae.engine import rules
from lightning_gae.engine.forward import RecordedForward, on_device
from lightning_gae.methods.registry import Method, register_method

__all__ = ["GAE", "gae"]


def gae(run: RecordedForward) -> Tensor | Mapping[str, Tensor]:
    """GAE's rows: the lean backward's row where it computed one, else Eq. 6 (one set) or Eq. 6-11 (several)."""
    if run.lean_row is not None:
        return run.lean_row
    abars = run.abars()
    if run.single:
        return rules.gae_relevance_row(on_device(abars, run.query.device), run.query)
    return run.set_rows(abars, "rules")


GAE = register_method(Method(
    name="gae",
    kind="attention",
    rule=gae,
    label="GAE",
    needs_gradients=True,
    beside_identity=True,
    default=True,
    lean=True,
))
