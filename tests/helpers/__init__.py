"""Helpers shared by the tests; no test module imports another test module.

- ``models``: small models with an independent reading of their attention, and the small recipe models;
- ``oracle``: the dense float64 GAE reference (GAE_SPEC.md), one sample at a time;
- ``metric_oracle``: plain-loop float64 references of every metric; ``metric_harness``: each metric class against its
  functional form and that reference, in one process and under DDP;
- ``explain``: comparing an explanation with the oracle;
- ``trainer``: the one Trainer factory of the callback tests, and what those tests check around a fit;
- ``events``: TensorBoard event files read back with TensorBoard's own reader;
- ``processes``: scripts and commands in their own process group, a real ``tensorboard`` server;
- ``pictures``: pictures searched pixel for pixel (the display tests);
- ``lxt_reference``, ``chefer_vit``, ``tiled_attention``: the outside references of AttnLRP, Transformer Attribution and
  the fused attention step;
- ``ci``: what a test does when an outside environment it needs cannot be built (skip here, fail under ``CI=true``);
- ``private``: every private name of lightning_gae a test uses, imported in this one place.
"""
