"""Transformer Attribution (Chefer, Gur & Wolf, CVPR 2021): the authors' LRP relevance at each attention map times
its gradient, rolled out over the layers (:mod:`lightning_gae.lrp.transformer_attribution`); its own forward and two
backward passes, on one token set."""

from __future__ import annotations

from lightning_gae.lrp import transformer_attribution
from lightning_gae.methods.registry import Method, register_method

__all__ = ["TRANSFORMER_ATTRIBUTION"]

TRANSFORMER_ATTRIBUTION = register_method(Method(
    name="transformer_attribution",
    kind="lrp",
    rule=transformer_attribution.explain,
    label="Transformer Attribution",
    token_sets="one",
    one_set="one sequence's self-attention",
    instead="Use 'gae' for encoder-decoders, two towers and co-attention",
    beside_identity=True,
))
