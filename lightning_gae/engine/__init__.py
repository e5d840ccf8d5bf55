"""The engine: one explanation from capture to readout.

:mod:`~lightning_gae.engine.capture` records every attention call of an unmodified model (or, on the
lean path, :mod:`~lightning_gae.engine.lean` computes GAE inside the attention backward);
:mod:`~lightning_gae.engine.token_sets` tells which token sets each call runs over;
:mod:`~lightning_gae.engine.rules` holds the paper's equations; :mod:`~lightning_gae.engine.readout`
what every method shares (the result type, the readout row, the explained score);
:mod:`~lightning_gae.engine.forward` runs the recorded forward and the one backward every attention method
shares, whose rules (:mod:`lightning_gae.methods`) read their relevance from it.

The public names are re-exported at the top of the package (``lightning_gae.explain``, ...); this package's
``__init__`` imports nothing, so that importing one of its modules never runs the others.
"""
