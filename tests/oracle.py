"""The slow, obviously-correct reference: GAE_SPEC.md sections 2-4 and 7 for ONE sample, dense, float64.

Nothing here imports lightning_gae. ``attns`` and ``grads`` are lists (first layer first) of
``[H, N, N]`` tensors for a single sample.
"""

from __future__ import annotations

import torch


def _eye(n: int) -> torch.Tensor:
    return torch.eye(n, dtype=torch.float64)


def head_average(attn: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Eq. 5, one head at a time."""
    heads = attn.shape[0]
    total = torch.zeros(attn.shape[1:], dtype=torch.float64)
    for h in range(heads):
        total += torch.clamp(grad[h].double() * attn[h].double(), min=0)
    return total / heads


def gae_matrix(attns: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    """Section 3-4: R = I, then R <- R + Abar @ R for every layer in order."""
    n = attns[0].shape[-1]
    relevance = _eye(n)
    for attn, grad in zip(attns, grads):
        relevance = relevance + head_average(attn, grad) @ relevance
    return relevance


def rollout_matrix(attns: list[torch.Tensor]) -> torch.Tensor:
    """Section 7: product of rownorm(0.5 I + 0.5 mean_h A), last layer on the left."""
    n = attns[0].shape[-1]
    result = _eye(n)
    for attn in attns:
        a_hat = 0.5 * _eye(n) + 0.5 * attn.double().mean(dim=0)
        a_hat = a_hat / a_hat.sum(dim=-1, keepdim=True)
        result = a_hat @ result
    return result


def raw_attention_matrix(attns: list[torch.Tensor]) -> torch.Tensor:
    return attns[-1].double().mean(dim=0)


def gradcam_matrix(attns: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    attn, grad = attns[-1].double(), grads[-1].double()
    heads = attn.shape[0]
    cam = torch.zeros(attn.shape[1:], dtype=torch.float64)
    for h in range(heads):
        cam += grad[h].mean() * attn[h]
    return torch.clamp(cam / heads, min=0)


def readout(matrix: torch.Tensor, query: int) -> torch.Tensor:
    row = matrix[query].clone()
    row[query] = 0.0
    return row


def reference_row(method: str, attns: list[torch.Tensor], grads: list[torch.Tensor], query: int) -> torch.Tensor:
    matrices = {
        "gae": lambda: gae_matrix(attns, grads),
        "rollout": lambda: rollout_matrix(attns),
        "raw_attention": lambda: raw_attention_matrix(attns),
        "attn_gradcam": lambda: gradcam_matrix(attns, grads),
    }
    return readout(matrices[method](), query)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|."""
    expected = expected.double()
    scale = expected.abs().max().clamp(min=1e-30)
    return ((actual.double() - expected).abs().max() / scale).item()
