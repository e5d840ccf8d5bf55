"""A decoder explained position by position: each target position's row over every token set.

When a model's output is a sequence ``[B, T, C]`` over its query set (an encoder-decoder's decoder),
every position ``t`` is explained on its own (``query=t``): :func:`last_positions` finds each sample's
last real position and :func:`sequence_rows` stacks the rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lightning_gae.engine.readout import Explanation
from lightning_gae.methods import explain

__all__ = ["is_sequence_output", "last_positions", "sequence_rows"]


def is_sequence_output(explanation: Explanation, target: Any = None) -> bool:
    """Whether each position of the query set is explained on its own: sequence logits ``[B, T, C]`` over the
    query set (a decoder) and a class target (a callable target is one scalar per sample)."""
    logits = explanation.logits
    return (not callable(target) and logits is not None and logits.dim() == 3
            and logits.shape[1] == explanation.tokens.shape[1])


def last_positions(model: nn.Module, inputs: Any, **options: Any) -> Tensor:
    """``[B]`` the last real position of the query set (a decoder) per sample, as ``explain(query="last")`` reads it.

    ``options``: ``attention_modules`` or ``streams`` of :func:`~lightning_gae.explain`.
    """
    query = explain(model, inputs, method="raw_attention", query="last", **options).query
    assert query is not None  # None only for query="mean"
    return query


def sequence_rows(model: nn.Module, inputs: Any, method: str, last: Tensor, labels: Tensor | None = None,
                  **options: Any) -> dict[str, Tensor]:
    """Set -> ``[B, T, N_set]``: row ``t`` is ``explain(..., query=t)``'s relevance of the set, for sequence outputs.

    One explanation per position ``t`` over the whole batch, of the prediction made at ``t`` (the
    argmax, or ``labels[:, t]``). A sample whose last real position (``last``) is before ``t`` is
    read at that last position and its row ``t`` is zeroed: nothing is predicted there.

    Args:
        model: a model whose logits are ``[B, T, C]`` over the query set (an encoder-decoder).
        inputs: its inputs.
        method: a method of :func:`~lightning_gae.explain`.
        last: ``[B]`` from :func:`last_positions`.
        labels: ``[B, T]`` classes to explain per position; None: the predictions.
        options: ``attention_modules`` or ``streams`` of :func:`~lightning_gae.explain`.
    """
    rows: dict[str, list[Tensor]] = {}
    for t in range(int(last.max()) + 1):
        query = torch.clamp(last, max=t)
        beyond = (last < t).cpu()
        target = None if labels is None else labels.gather(1, query.to(labels.device)[:, None])[:, 0]
        exp = explain(model, inputs, target=target, method=method, query=query, **options)
        for x, row in exp.relevance.items():
            rows.setdefault(x, []).append(row.detach().float().cpu().masked_fill(beyond[:, None], 0.0))
    return {x: torch.stack(found, dim=1) for x, found in rows.items()}
