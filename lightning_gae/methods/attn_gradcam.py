"""Attention Grad-CAM, a baseline of Chefer et al.: the last call's heads weighted by their whole gradient map's mean,
``(E_h[mean(∇A_h) · A_h])⁺`` (the LXMERT/GAE code's form), the readout token's row."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from lightning_gae.engine import rules
from lightning_gae.engine.forward import RecordedForward
from lightning_gae.methods.registry import Method, register_method

__all__ = ["ATTN_GRADCAM", "attn_gradcam"]


def attn_gradcam(run: RecordedForward) -> Tensor | Mapping[str, Tensor]:
    """Grad-CAM's rows: on one token set the last call's; on several, each set's last call from its reading set."""
    if run.single:
        return rules.attn_gradcam_row(run.attentions(last_only=True)[-1], run.attention_gradients(last_only=True)[-1],
                                      run.query, run.keep)
    sets = run.sets
    maps = [rules.attn_gradcam_map(rec.as_heads().to(torch.float32), grad.to(torch.float32),
                                   run.keeps[sets.query_sets[i]], run.keeps[sets.key_sets[i]])
            for i, (rec, grad) in enumerate(zip(run.records, run.gradients))]
    return run.set_rows(maps, "last")


ATTN_GRADCAM = register_method(Method(
    name="attn_gradcam",
    kind="attention",
    rule=attn_gradcam,
    label="Attention Grad-CAM",
    needs_gradients=True,
    last_layer_only=True,
    all_zero="all zero: no positive gradient-weighted attention at the last layer (Attention Grad-CAM keeps only "
             "(mean gradient x attention) > 0)",
    default=True,
))
