"""Relevance propagated through the whole model: the LRP methods, in gradient form, on unmodified models.

:mod:`~lightning_gae.lrp.mode` swaps each operation of a forward for its rule (its operation tables and
:class:`~lightning_gae.lrp.mode.LRPCapture` are the interface both methods build on);
:mod:`~lightning_gae.lrp.attnlrp` reads AttnLRP's relevance at the input embedding;
:mod:`~lightning_gae.lrp.transformer_attribution` runs Transformer Attribution with the authors' rules;
:mod:`~lightning_gae.lrp.fsdp1` and :mod:`~lightning_gae.lrp.fsdp2` hold sharded parameters constant
during those forwards.
"""

from lightning_gae.lrp.mode import LRPCapture, UnsupportedOperation

__all__ = ["LRPCapture", "UnsupportedOperation"]
