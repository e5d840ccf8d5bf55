"""The ViT baseline's attention Grad-CAM (the CVPR 2021 table): the last call's heads weighted by the mean gradient
of the readout's row, positive part, the readout token's row. One token set, one readout token."""

from __future__ import annotations

from torch import Tensor

from lightning_gae.engine import rules
from lightning_gae.engine.forward import RecordedForward
from lightning_gae.methods.registry import Method, register_method

__all__ = ["ATTN_GRADCAM_VIT", "attn_gradcam_vit"]


def attn_gradcam_vit(run: RecordedForward) -> Tensor:
    """The readout row of the last call's gradient-weighted heads
    (:func:`~lightning_gae.engine.rules.attn_gradcam_vit_row`)."""
    return rules.attn_gradcam_vit_row(run.attentions(last_only=True)[-1], run.attention_gradients(last_only=True)[-1],
                                      run.query, run.keep)


ATTN_GRADCAM_VIT = register_method(Method(
    name="attn_gradcam_vit",
    kind="attention",
    rule=attn_gradcam_vit,
    label="Attention Grad-CAM (ViT)",
    needs_gradients=True,
    last_layer_only=True,
    token_sets="one",
    one_set="the ViT baseline",
    instead="Use 'attn_gradcam', its form for several sets",
    readout_token=True,
    one_token="weighs heads by the gradient of one query row; pass a token index, not query='mean'",
    all_zero="all zero: no positive gradient-weighted attention at the last layer (Grad-CAM keeps only positive "
             "values)",
    default=True,
))
