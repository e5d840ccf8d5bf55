"""Attention flow (Abnar & Zuidema, 2020): each token's maximum flow into the readout token through the layered graph
of ``rownorm(0.5·I + 0.5·E_h A_l)``. One token set, one readout token; one max flow per token and sample, so a call
estimated above :data:`ATTENTION_FLOW_MAX_SECONDS` is refused unless it runs inside
:func:`allow_slow_attention_flow`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from lightning_gae.engine import rules
from lightning_gae.engine.forward import RecordedForward
from lightning_gae.methods.registry import Method, register_method

__all__ = ["ATTENTION_FLOW", "ATTENTION_FLOW_MAX_SECONDS", "ATTENTION_FLOW_SECONDS_PER_EDGE",
           "ATTENTION_FLOW_SECONDS_PER_FLOW", "allow_slow_attention_flow", "attention_flow", "attention_flow_seconds",
           "check_cost"]

# Attention flow's cost: one max-flow per (sample, input token) on a graph of about L·N² edges.
# Measured on the project's shared 2-core CPU (random-init ViT, SciPy's Dinic, the flows alone): per
# sample 3-5 ms at N = 17, 60-100 ms at N = 65 and 1.4 s / 2.5 s at N = 257 tokens with 4 / 6 layers
# (rollout: under 1 ms), i.e. about 3e-8 s per edge plus 2e-4 s per max-flow. Above ATTENTION_FLOW_MAX_SECONDS estimated
# for one call, explain() refuses unless the call runs inside allow_slow_attention_flow().
ATTENTION_FLOW_SECONDS_PER_EDGE = 3e-8
ATTENTION_FLOW_SECONDS_PER_FLOW = 2e-4
ATTENTION_FLOW_MAX_SECONDS = 60.0
_SLOW_FLOW_ALLOWED: ContextVar[bool] = ContextVar("lightning_gae_slow_attention_flow", default=False)


@contextmanager
def allow_slow_attention_flow() -> Iterator[None]:
    """Let ``method="attention_flow"`` run on any size inside the block (by default a call estimated
    above :data:`ATTENTION_FLOW_MAX_SECONDS` raises a ``ValueError`` instead of running for minutes).

    It covers every ``explain`` call made in the block, also those made by ``compare`` and the
    callback::

        from lightning_gae import allow_slow_attention_flow

        with allow_slow_attention_flow():
            exp = lightning_gae.explain(model, inputs, method="attention_flow")
    """
    token = _SLOW_FLOW_ALLOWED.set(True)
    try:
        yield
    finally:
        _SLOW_FLOW_ALLOWED.reset(token)


def attention_flow_seconds(samples: int, tokens: int, layers: int) -> float:
    """The estimated seconds of attention flow for ``samples`` sequences of ``tokens`` tokens and ``layers``
    attention layers: ``samples·tokens`` max-flows of ``(layers-1)·tokens² + tokens`` edges each."""
    edges = (layers - 1) * tokens**2 + tokens
    return samples * tokens * (edges * ATTENTION_FLOW_SECONDS_PER_EDGE + ATTENTION_FLOW_SECONDS_PER_FLOW)


def check_cost(run: RecordedForward) -> None:
    """Refuse, unless :func:`allow_slow_attention_flow` is active, a call estimated to take minutes."""
    batch = run.query.shape[0]
    tokens, layers = run.sets.sizes[run.query_set], len(run.records)
    seconds = attention_flow_seconds(batch, tokens, layers)
    if seconds > ATTENTION_FLOW_MAX_SECONDS and not _SLOW_FLOW_ALLOWED.get():
        edges = (layers - 1) * tokens**2 + tokens
        raise ValueError(
            f"method='attention_flow' on {tokens} tokens x {layers} layers x {batch} samples is {batch * tokens} "
            f"max-flow problems on graphs of {layers * tokens + 1} nodes and {edges} edges, about {seconds:.0f} s "
            f"(estimated at {ATTENTION_FLOW_SECONDS_PER_EDGE:g} s per edge and max-flow; the limit is "
            f"{ATTENTION_FLOW_MAX_SECONDS:g} s). Use method='rollout', its cheap approximation, explain fewer samples "
            "per call, or run it anyway inside `with allow_slow_attention_flow():` "
            "(`from lightning_gae import allow_slow_attention_flow`)"
        )


def attention_flow(run: RecordedForward) -> Tensor:
    """Every real token's max flow into the readout (:func:`~lightning_gae.engine.rules.attention_flow_row`)."""
    # Padded tokens send nothing past their own node and the query's own entry is dropped: not solved.
    own = torch.nn.functional.one_hot(run.query, run.keep.shape[1]).bool()
    return rules.attention_flow_row(run.attentions(), run.query, sources=run.keep & ~own)


ATTENTION_FLOW = register_method(Method(
    name="attention_flow",
    kind="attention",
    rule=attention_flow,
    label="Attention flow",
    token_sets="one",
    one_set="the layered graph of one sequence's self-attention",
    instead="Use 'rollout' (attention flow's path-sum approximation, which follows the calls across token sets) or "
            "'gae'",
    readout_token=True,
    one_token="is a max flow into one readout token, and query='mean' reads none; pass a token index (or 'last'), or "
              "use 'rollout' for a mean-pooled model",
    check=check_cost,
))
