"""The slow, obviously-correct reference: GAE_SPEC.md sections 2-4 and 7 for ONE sample, dense, float64.

Nothing here imports lightning_gae. ``attns`` and ``grads`` are lists (first layer first) of
``[H, N, N]`` tensors for a single sample.
"""

from __future__ import annotations

import numpy as np
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


def gradcam_vit_row(attns: list[torch.Tensor], grads: list[torch.Tensor], query: int) -> torch.Tensor:
    """The ViT baseline's Grad-CAM: head weight = mean gradient over the query's row, other tokens only."""
    attn, grad = attns[-1].double(), grads[-1].double()
    n = attn.shape[-1]
    others = [k for k in range(n) if k != query]
    row = torch.zeros(n, dtype=torch.float64)
    for h in range(attn.shape[0]):
        weight = sum(grad[h, query, k] for k in others) / len(others)
        for k in others:
            row[k] += weight * attn[h, query, k]
    return torch.clamp(row / attn.shape[0], min=0)


# --- attention flow (Abnar & Zuidema 2020): max flow through the layered attention graph --------------


def max_flow(capacity: np.ndarray, source: int, sink: int) -> float:
    """Edmonds-Karp: augment along shortest residual paths (BFS) until none is left. Dense float64."""
    residual = capacity.astype(np.float64).copy()
    n = residual.shape[0]
    total = 0.0
    while True:
        parent = np.full(n, -1)
        parent[source] = source
        frontier = [source]
        while frontier and parent[sink] < 0:
            following = []
            for u in frontier:
                for v in np.flatnonzero((residual[u] > 1e-13) & (parent < 0)):
                    parent[v] = u
                    following.append(int(v))
            frontier = following
        if parent[sink] < 0:
            return total
        path, v = [], sink
        while v != source:
            path.append((int(parent[v]), v))
            v = int(parent[v])
        push = min(residual[u, v] for u, v in path)
        for u, v in path:
            residual[u, v] -= push
            residual[v, u] += push
        total += push


def layered_capacities(attns: list[torch.Tensor]) -> np.ndarray:
    """Abnar & Zuidema's graph, every node kept: node ``l*N + i`` for l = 0..L; edge (l-1, j) -> (l, i)
    with capacity (0.5 mean_h A_l + 0.5 I)[i, j], each row divided by its sum."""
    n, layers = attns[0].shape[-1], len(attns)
    capacity = np.zeros(((layers + 1) * n, (layers + 1) * n))
    for l, attn in enumerate(attns, start=1):
        a_hat = 0.5 * attn.double().mean(dim=0).numpy() + 0.5 * np.eye(n)
        a_hat = a_hat / a_hat.sum(axis=1, keepdims=True)
        for i in range(n):
            for j in range(n):
                capacity[(l - 1) * n + j, l * n + i] = a_hat[i, j]
    return capacity


def flow_row(attns: list[torch.Tensor], query: int) -> torch.Tensor:
    """Each token's max flow into (L, query); the query's own entry 0."""
    n, layers = attns[0].shape[-1], len(attns)
    capacity = layered_capacities(attns)
    row = torch.zeros(n, dtype=torch.float64)
    for j in range(n):
        if j != query:
            row[j] = max_flow(capacity, j, layers * n + query)
    return row


def reference_row(method: str, attns: list[torch.Tensor], grads: list[torch.Tensor], query: int) -> torch.Tensor:
    if method == "attn_gradcam_vit":
        return gradcam_vit_row(attns, grads, query)
    if method == "attention_flow":
        return flow_row(attns, query)
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


# --- several token sets: GAE_SPEC.md sections 3-6, one sample, dense, float64 -----------------------


def residual_normalised(r: torch.Tensor) -> torch.Tensor:
    """Eq. 8-9 written out row by row: (R - I) with each row divided by its sum (0/0 -> 0), plus I."""
    n = r.shape[0]
    out = r.double() - _eye(n)
    for i in range(n):
        total = out[i].sum()
        out[i] = out[i] / total if total != 0 else torch.zeros(n, dtype=torch.float64)
    return out + _eye(n)


def gae_token_sets(steps, sizes: dict) -> dict:
    """``steps``: ``(query set, key set, attn [H, Nq, Nk], grad)`` in call order; returns every R^{xy}.

    R^{xx} = I and R^{xy} = 0 at the start; self-attention on s: R^{sy} += Abar R^{sy} for every y;
    cross-attention from s to q: R^{sq} += Rbar^{ss}^T Abar Rbar^{qq} and R^{ss} += Abar R^{qs},
    both computed from the old values.
    """
    rel = {}
    for x, nx in sizes.items():
        for y, ny in sizes.items():
            rel[(x, y)] = _eye(nx) if x == y else torch.zeros(nx, ny, dtype=torch.float64)
    for s, q, attn, grad in steps:
        abar = head_average(attn, grad)
        if s == q:
            for y in sizes:
                rel[(s, y)] = rel[(s, y)] + abar @ rel[(s, y)]
        else:
            add_sq = residual_normalised(rel[(s, s)]).T @ abar @ residual_normalised(rel[(q, q)])
            add_ss = abar @ rel[(q, s)]
            rel[(s, q)] = rel[(s, q)] + add_sq
            rel[(s, s)] = rel[(s, s)] + add_ss
    return rel


def token_set_readout(rel: dict, query_set: str, query: int, sets: list) -> dict:
    """Row ``query`` of R^{query_set, x} for each x; the query's own entry 0 in its own set."""
    out = {}
    for x in sets:
        row = rel[(query_set, x)][query].clone()
        if x == query_set:
            row[query] = 0.0
        out[x] = row
    return out


def rollout_token_sets(steps, sizes: dict) -> dict:
    """Rollout on the graph of all tokens, one sample, dense: every R^{xy} as blocks of one matrix.

    The tokens of all sets are laid side by side. Each call is a layer matrix L: the rows of the
    query set s are (I on s's own columns + the head-mean attention on the key set's columns), each
    row divided by its sum; every other row is the identity's. R = L_last ... L_1.
    """
    names = list(sizes)
    offsets, total = {}, 0
    for x in names:
        offsets[x] = total
        total += sizes[x]
    block = lambda x: slice(offsets[x], offsets[x] + sizes[x])  # noqa: E731
    r = _eye(total)
    for s, q, attn, _grad in steps:
        layer = _eye(total)
        mean = attn.double().mean(dim=0)
        rows = torch.zeros(sizes[s], total, dtype=torch.float64)
        rows[:, block(s)] = _eye(sizes[s])
        rows[:, block(q)] = rows[:, block(q)] + mean
        for i in range(sizes[s]):
            rows[i] = rows[i] / rows[i].sum()
        layer[block(s)] = rows
        r = layer @ r
    return {(x, y): r[block(x), block(y)] for x in names for y in names}
