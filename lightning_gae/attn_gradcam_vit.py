"""Attention Grad-CAM as the ViT baseline behind the CVPR 2021 table computes it (GAE_SPEC section 7).

Two variants of attention Grad-CAM exist in the authors' code. Both take the last layer's
attention :math:`A_h` and its gradient :math:`\\nabla A_h`, weight each head by a mean of its
gradient, average the weighted attention over heads and remove negatives; they differ in which
gradient entries the weight averages:

- the *matrix* variant (the LXMERT/GAE code, :func:`lightning_gae.rules.attn_gradcam_row`): all
  :math:`N \\times N` entries;
- the *ViT* variant (here): only the readout row, the query's attention to the other tokens,
  ``grad[:, h, query, others]``.

With :math:`q` the query (the CLS token) and :math:`K` the other (real) tokens,

.. math:: w_h = \\frac{1}{|K|} \\sum_{k \\in K} \\nabla A_h[q, k], \\qquad
          r_k = \\Big(\\frac{1}{H} \\sum_h w_h\\, A_h[q, k]\\Big)^+ \\ (k \\in K), \\qquad r_q = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["attn_gradcam_vit_row"]


def attn_gradcam_vit_row(attn: Tensor, grad: Tensor, query: Tensor, keep: Tensor | None = None) -> Tensor:
    """Attention Grad-CAM, ViT variant: heads weighted by their gradient's mean over the readout row.

    Args:
        attn: the last layer's attention probabilities ``[B, H, N, N]``.
        grad: its gradient ``[B, H, N, N]``.
        query: ``[B]`` the readout token of each sample (0 for a CLS token).
        keep: ``[B, N]`` bool, True for real tokens; padded keys are left out of the gradient mean
            and get 0, so a padded batch explains each sample as it would be explained alone.

    Returns:
        ``[B, N]`` in the promoted float32-or-wider dtype; the query's own entry is 0 (the
        authors' code drops it: ``attn[:, h, 0, 1:]``).

    >>> import torch
    >>> attn = torch.tensor([[[[0.2, 0.5, 0.3], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
    ...                       [[0.2, 0.2, 0.6], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]]])
    >>> grad = torch.tensor([[[[9.0, 1.0, 3.0], [9.0, 9.0, 9.0], [9.0, 9.0, 9.0]],
    ...                       [[9.0, -1.0, -1.0], [9.0, 9.0, 9.0], [9.0, 9.0, 9.0]]]])
    >>> # w = (2, -1): token 1: (2 * 0.5 - 1 * 0.2) / 2 = 0.4; token 2: (2 * 0.3 - 1 * 0.6) / 2 = 0
    >>> attn_gradcam_vit_row(attn, grad, torch.tensor([0]))
    tensor([[0.0000, 0.4000, 0.0000]])
    """
    if attn.dim() != 4 or attn.shape != grad.shape or attn.shape[-2] != attn.shape[-1]:
        raise ValueError(f"attn and grad must both be [B, H, N, N]; got {tuple(attn.shape)} and {tuple(grad.shape)}")
    dtype = torch.promote_types(torch.promote_types(attn.dtype, grad.dtype), torch.float32)
    batch, _, tokens, _ = attn.shape
    rows = torch.arange(batch, device=attn.device)
    # The readout row of every head: [B, H, N].
    attn_row = attn[rows, :, query].to(dtype)
    grad_row = grad[rows, :, query].to(dtype)
    others = torch.ones(batch, tokens, dtype=torch.bool, device=attn.device)
    others[rows, query] = False
    if keep is not None:
        others &= keep.to(attn.device).bool()
    counted = others[:, None].to(dtype)
    weights = (grad_row * counted).sum(dim=-1, keepdim=True) / counted.sum(dim=-1, keepdim=True)
    return ((weights * attn_row).mean(dim=1).clamp(min=0) * others).to(dtype)
