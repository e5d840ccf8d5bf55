"""AttnLRP (Achtibat et al., ICML 2024): relevance propagated by LRP rules through the unmodified model, read at the
word embeddings (:mod:`lightning_gae.lrp.attnlrp`); its own forward and backward."""

from __future__ import annotations

from lightning_gae.lrp import attnlrp
from lightning_gae.methods.registry import Method, register_method

__all__ = ["ATTNLRP"]

ATTNLRP = register_method(Method(name="attnlrp", kind="lrp", rule=attnlrp.explain, label="AttnLRP",
                                signed=True))
