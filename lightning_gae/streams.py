"""Which recorded attention call is self-attention on which token set.

A pure self-attention model (ViT, BERT, GPT-2, FT-Transformer, single-stream multimodal models)
has one token set: every call attends from ``N`` queries to the same ``N`` keys. That is the case
``explain`` propagates; calls that do not fit it (cross-attention, windowed or batch-folded
attention, token sets that change size) are reported with the module path that produced them.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_gae.capture import AttentionRecord

__all__ = ["single_stream"]


def single_stream(records: Sequence[AttentionRecord], batch_size: int) -> list[AttentionRecord]:
    """The records of a single-stream self-attention model, in call order.

    Raises:
        ValueError: a record's batch dimension differs from the model output's, a record attends
            across two token sets (``Nq != Nk`` or ``self_attention`` known to be False), or the
            layers do not all attend over the same number of tokens.
    """
    if not records:
        raise ValueError("no attention was recorded")
    for rec in records:
        if rec.batch_size != batch_size:
            raise ValueError(
                f"attention at {rec.path or '<model>'!r} has batch dimension {rec.batch_size}, the model output "
                f"has {batch_size}: windowed or batch-folded attention (e.g. Swin windows, [B*H, N, N] bmm) "
                "cannot be aligned with samples. Name the per-sample [B, H, N, N] probability modules "
                "with attention_modules=..."
            )
        if rec.num_queries != rec.num_keys or rec.self_attention is False:
            raise ValueError(
                f"attention at {rec.path or '<model>'!r} attends from {rec.num_queries} queries to "
                f"{rec.num_keys} keys of another token set (cross-attention); explain() propagates "
                "self-attention over one token set, encoder-decoder and co-attention models are not "
                "supported yet. To explain one stream only, name its modules with attention_modules=..."
            )
    n = records[0].num_queries
    other = next((r for r in records if r.num_queries != n), None)
    if other is not None:
        raise ValueError(
            f"attention layers disagree on the token count: {records[0].path or '<model>'!r} attends over "
            f"{n} tokens, {other.path or '<model>'!r} over {other.num_queries}. Models that merge, drop or "
            "add tokens between layers, or run two separate towers, need attention_modules=... naming one "
            "token set's layers."
        )
    return list(records)
