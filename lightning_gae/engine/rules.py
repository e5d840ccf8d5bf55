"""The paper's maths on plain batched tensors (Chefer, Gur & Wolf, ICCV 2021; GAE_SPEC.md).

Shapes: ``attn`` and ``grad`` are ``[B, H, Nq, Nk]`` (post-softmax probabilities and
``∂y_t/∂attn``); an aggregated map ``Ā`` is ``[B, Nq, Nk]``; a relevance matrix ``R`` is
``[B, N, N]`` and a relevance row ``r`` is ``[B, N]``. Everything is computed in float32 (or wider)
whatever the dtype it arrives in. Lists of layers are in call order, first layer first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "avg_heads",
    "apply_self_attention_rules",
    "apply_self_attention_rules_row",
    "gae_relevance",
    "gae_relevance_row",
    "handle_residual",
    "apply_mm_attention_rules",
    "token_set_relevance",
    "row_normalize",
    "rollout_map",
    "rollout_row",
    "raw_attention_row",
    "attn_gradcam_map",
    "attn_gradcam_row",
    "attn_gradcam_vit_row",
    "attention_flow_capacities",
    "attention_flow_row",
    "one_hot_rows",
    "query_rows",
    "start_rows",
]


def _f32(t: Tensor) -> Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _common(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Both in their common float32-or-wider dtype: a float32 start row meets float64 attention."""
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    return a.to(dtype), b.to(dtype)


def avg_heads(attn: Tensor, grad: Tensor) -> Tensor:
    """Eq. 5: ``Ā = E_h[(∇A ⊙ A)⁺]``, negatives removed before the mean over heads. ``[B, Nq, Nk]``."""
    return (_f32(grad) * _f32(attn)).clamp_(min=0).mean(dim=1)


def apply_self_attention_rules(relevance: Tensor, abar: Tensor) -> Tensor:
    """Eq. 6-7: ``R^{ss} ← R^{ss} + Ā · R^{ss}`` (and ``R^{sq} ← R^{sq} + Ā · R^{sq}``).

    ``relevance`` is ``[B, Ns, M]`` (``M`` = ``Ns`` for ``R^{ss}``, the other set's size for ``R^{sq}``).
    """
    relevance, abar = _common(relevance, abar)
    return relevance + torch.bmm(abar, relevance)


def apply_self_attention_rules_row(row: Tensor, abar: Tensor) -> Tensor:
    """Row form of Eq. 6 for one relevance row, applied from the last layer to the first: ``r ← r + r · Ā``."""
    row, abar = _common(row, abar)
    return row + torch.bmm(row.unsqueeze(1), abar).squeeze(1)


def one_hot_rows(query: Tensor, num_tokens: int) -> Tensor:
    """``e_q^T`` for every sample: ``[B, N]`` float32 with a 1 at each sample's query index."""
    return torch.nn.functional.one_hot(query, num_tokens).to(torch.float32)


def gae_relevance(abars: Sequence[Tensor]) -> Tensor:
    """Matrix form: ``R = (I + Ā_L) ⋯ (I + Ā_1)``, Eq. 6 applied layer after layer from ``R = I`` (section 3)."""
    batch, n, _ = abars[0].shape
    relevance = torch.eye(n, dtype=torch.float32, device=abars[0].device).expand(batch, n, n).clone()
    for abar in abars:
        relevance = apply_self_attention_rules(relevance, _f32(abar))
    return relevance


def start_rows(query: Tensor, num_tokens: int) -> Tensor:
    """The readout's start vector: ``e_q^T`` for indices ``[B]``, or ``query`` itself when it is
    already a float ``[B, N]`` row (e.g. the mean of the real tokens' rows for mean-pooled models)."""
    return query.to(torch.float32) if query.is_floating_point() else one_hot_rows(query, num_tokens)


def gae_relevance_row(abars: Sequence[Tensor], query: Tensor) -> Tensor:
    """Row form: ``e_q^T (I + Ā_L) ⋯ (I + Ā_1)`` in ``O(L·N²)``, the last layer first. ``[B, N]``.

    ``query`` is ``[B]`` token indices or a float ``[B, N]`` start row (:func:`start_rows`).
    """
    row = start_rows(query, abars[0].shape[-1])
    for abar in reversed(abars):
        row = apply_self_attention_rules_row(row, _f32(abar))
    return row


def row_normalize(x: Tensor) -> Tensor:
    """Each row divided by its sum; an all-zero row stays zero (0/0 gives 0, never NaN)."""
    total = x.sum(dim=-1, keepdim=True)
    return torch.where(total == 0, torch.zeros_like(x), x / torch.where(total == 0, torch.ones_like(total), total))


def handle_residual(self_relevance: Tensor) -> Tensor:
    """Eq. 8-9: ``R̄^{xx} = rownorm(R^{xx} − I) + I``, the normalisation used inside the bi-modal rules."""
    eye = torch.eye(self_relevance.shape[-1], dtype=self_relevance.dtype, device=self_relevance.device)
    return row_normalize(self_relevance - eye) + eye


def apply_mm_attention_rules(r_ss: Tensor, r_qq: Tensor, r_sq: Tensor, r_qs: Tensor, abar: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 10-11 for an attention call with queries from set ``s`` and keys from set ``q``.

    ``abar`` is ``[B, Ns, Nq]``. Returns ``(R^{sq}, R^{ss})`` updated from the old values:
    ``R^{sq} + (R̄^{ss})ᵀ · Ā · R̄^{qq}`` and ``R^{ss} + Ā · R^{qs}``, with ``R̄`` from
    :func:`handle_residual` (Eq. 8-9).
    """
    r_ss, abar = _common(r_ss, abar)
    r_qq, r_sq, r_qs = (t.to(r_ss.dtype) for t in (r_qq, r_sq, r_qs))
    new_sq = r_sq + handle_residual(r_ss).transpose(-2, -1) @ abar @ handle_residual(r_qq)
    new_ss = r_ss + abar @ r_qs
    return new_sq, new_ss


def _bar_from_hat(hat: Tensor) -> Tensor:
    """``R̄ = rownorm(R − I) + I`` given ``R̂ = R − I`` itself (Eq. 8-9 without forming ``I + R̂``)."""
    eye = torch.eye(hat.shape[-1], dtype=hat.dtype, device=hat.device)
    return row_normalize(hat) + eye


def token_set_relevance(
    steps: Sequence[tuple[str, str, Tensor]], sizes: dict[str, int], rollout: bool = False
) -> dict[tuple[str, str], Tensor]:
    """Every relevance matrix of a model with several token sets, matrix form.

    ``steps`` are ``(query set, key set, map)`` in call order, the map ``[B, Nq, Nk]``: ``Ā``
    (Eq. 5) for GAE. Section 3: ``R^{xx} = I``, ``R^{xy} = 0``. A call with equal sets applies
    Eq. 6-7 to every ``R^{s·}``; a call across sets applies Eq. 10-11 (both from the old values).

    Returns ``R^{xy}`` for ``x != y`` (missing pairs are zero) and, for ``x == y``, ``R̂^{xx} = R^{xx} − I``:
    the identity is kept apart because the attention terms can be far below float32's resolution
    around 1, and Eq. 8-9 subtract it again.

    With ``rollout=True`` the maps are head-mean attention and every call is rollout's step on the
    graph of all tokens: a call with queries ``s`` replaces the rows of ``s`` by ``rownorm(I + A)``
    times the old rows, where ``A`` lives on the key set's columns (``I`` on ``s``'s own), and leaves
    the other sets' rows alone. Within a set this is ``R^{s·} ← rownorm(I + A)·R^{s·}``; across sets
    it is ``R^{s·} ← D·R^{s·} + D·A·R^{q·}`` with ``D = 1 / (1 + rowsum A)``. Eq. 8-9 do not apply:
    rollout's rows already sum to 1, so ``R − I`` has rows summing to 0.
    """
    batch = steps[0][2].shape[0]
    device = steps[0][2].device
    rel: dict[tuple[str, str], Tensor] = {
        (x, x): torch.zeros(batch, n, n, dtype=torch.float32, device=device) for x, n in sizes.items()
    }

    def full(x: str, y: str) -> Tensor | None:
        """``R^{xy}`` with the identity put back on the diagonal pairs."""
        found = rel.get((x, y))
        if found is None or x != y:
            return found
        return found + torch.eye(sizes[x], dtype=found.dtype, device=found.device)

    for s, q, amap in steps:
        amap = _f32(amap)
        if rollout and s != q:
            scale = 1.0 / (1.0 + amap.sum(dim=-1, keepdim=True))
            targets = {y for (x, y) in rel if x in (s, q)}
            updated = {}
            for y in targets:
                own, keys = full(s, y), full(q, y)
                new = scale * own if own is not None else 0.0
                if keys is not None:
                    new = new + scale * torch.bmm(amap, keys)
                assert isinstance(new, Tensor)  # y came from a pair of s or q: one of own, keys is there
                updated[y] = new - torch.eye(sizes[s], dtype=new.dtype, device=new.device) if y == s else new
            for y, value in updated.items():
                rel[(s, y)] = value
            continue
        if s == q:
            step = _rollout_step_mean(amap) if rollout else None
            for (x, y), r in list(rel.items()):
                if x != s:
                    continue
                if rollout:
                    assert step is not None
                    eye = torch.eye(sizes[s], dtype=step.dtype, device=step.device)
                    # (Â − I) + Â·R̂ for the diagonal pair, Â·R otherwise.
                    rel[(x, y)] = (step - eye) + torch.bmm(step, r) if x == y else torch.bmm(step, r)
                else:
                    # R̂ + Ā(I + R̂) for the diagonal pair, R + Ā·R otherwise.
                    rel[(x, y)] = r + amap + torch.bmm(amap, r) if x == y else apply_self_attention_rules(r, amap)
            continue
        hat_ss, hat_qq = rel[(s, s)], rel[(q, q)]
        old_sq, old_qs = rel.get((s, q)), full(q, s)
        add_sq = _bar_from_hat(hat_ss).transpose(-2, -1) @ amap @ _bar_from_hat(hat_qq)
        rel[(s, q)] = add_sq if old_sq is None else old_sq + add_sq
        if old_qs is not None:
            rel[(s, s)] = hat_ss + amap @ old_qs
    return rel


def _rollout_step_mean(mean: Tensor) -> Tensor:
    eye = torch.eye(mean.shape[-1], dtype=mean.dtype, device=mean.device)
    return row_normalize(mean + eye)


def _rollout_step(attn: Tensor) -> Tensor:
    return _rollout_step_mean(_f32(attn).mean(dim=1))


def rollout_map(attns: Sequence[Tensor]) -> Tensor:
    """Rollout (Abnar & Zuidema 2020), matrix form: ``Â_L ⋯ Â_1`` with ``Â_l = rownorm(I + E_h A_l)``."""
    result = _rollout_step(attns[0])
    for attn in attns[1:]:
        result = torch.bmm(_rollout_step(attn), result)
    return result


def rollout_row(attns: Sequence[Tensor], query: Tensor) -> Tensor:
    """Row form of rollout: ``e_q^T Â_L ⋯ Â_1``, the last layer first. ``[B, N]``."""
    row = start_rows(query, attns[0].shape[-1])
    for attn in reversed(attns):
        row, step = _common(row, _rollout_step(attn))
        row = torch.bmm(row.unsqueeze(1), step).squeeze(1)
    return row


# Attention flow's capacities (at most 1) as integers for SciPy's max-flow: 2**30 units per 1. A max
# flow is at most the readout node's in-capacity, 1 (2**30 units, < 2**31), so nothing overflows int32;
# rounding moves a capacity by at most 2**-31 and a flow by that times the edges of a minimum cut.
_FLOW_UNITS = 2**30


def attention_flow_capacities(attns: Sequence[Tensor]) -> Tensor:
    """``[B, L, N, N]`` float64: ``Â_l = rownorm(0.5·I + 0.5·E_h A_l)``, rollout's step, the edge capacities of attention flow."""
    return torch.stack([_rollout_step_mean(_f32(attn).double().mean(dim=1)) for attn in attns], dim=1)


def _flow_graph(units: np.ndarray, query: int):
    """The layered graph of one sample as a SciPy CSR matrix of integer capacities.

    Node ``l·N + i`` is token ``i`` at layer boundary ``l`` (``l < L``); node ``L·N`` is the readout
    ``(L, q)``, the only node of the top boundary a flow can end in. Edge ``(l, j) -> (l+1, i)``
    carries ``Â_{l+1}[i, j]``, edge ``(L-1, j) -> (L, q)`` carries ``Â_L[q, j]``.
    """
    import numpy as np
    from scipy.sparse import csr_array

    layers, n, _ = units.shape
    source, target = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    rows = np.concatenate([l * n + source.ravel() for l in range(layers - 1)] + [(layers - 1) * n + np.arange(n)])
    cols = np.concatenate([(l + 1) * n + target.ravel() for l in range(layers - 1)] + [np.full(n, layers * n)])
    # Row j of Â_l.T is what token j sends to every token of the next boundary.
    caps = np.concatenate([units[l].T.ravel() for l in range(layers - 1)] + [units[-1, query]])
    used = caps > 0
    size = layers * n + 1
    return csr_array((caps[used].astype(np.int32), (rows[used], cols[used])), shape=(size, size))


def attention_flow_row(attns: Sequence[Tensor], query: Tensor, sources: Tensor | None = None) -> Tensor:
    r"""Attention flow (Abnar & Zuidema 2020): each input token's maximum flow into the readout token. ``[B, N]``.

    The graph has a node ``(l, i)`` for every token ``i`` at every layer boundary ``l = 0..L``; the
    edge ``(l-1, j) -> (l, i)`` has capacity ``Â_l[i, j]`` with ``Â_l = rownorm(0.5·I + 0.5·E_h A_l)``
    (rollout's step, :func:`attention_flow_capacities`). Token ``j``'s relevance is

    .. math:: r_j = \mathrm{maxflow}\bigl((0, j) \to (L, q)\bigr),

    one max-flow problem per input token, solved with SciPy's Dinic algorithm
    (:func:`scipy.sparse.csgraph.maximum_flow`) on capacities in units of ``2^{-30}``. Unlike
    rollout's path sum, a flow is capped by every cut between the token and the readout, so
    ``r_j <= sum_i Â_1[i, j]`` (what token ``j`` sends out) and ``r_j <= sum_j Â_L[q, j] = 1``.
    The authors' code divides the flows by their sum; this returns them unnormalised (the order of
    the tokens, all the perturbation metrics use, is the same).

    ``query`` is ``[B]`` token indices (a flow has one sink: there is no mean readout). ``sources``
    (``[B, N]`` bool) limits the tokens solved for, the others get 0: :func:`~lightning_gae.explain`
    skips padding (a key no query attends to sends nothing past its own node, so its flow is 0
    anyway) and the query's own entry. The cost is ``N`` max-flows on ``L·N + 1`` nodes and about
    ``L·N²`` edges per sample: on a 2-core CPU about 5 ms per sample at ``N = 17``, 0.1 s at 65 and
    2.5 s at 257 tokens (6 layers), where rollout takes under a millisecond.
    """
    import numpy as np
    from scipy.sparse.csgraph import maximum_flow

    if query.is_floating_point():
        raise ValueError("attention flow is a max flow into one readout token; pass token indices, not a mean start row")
    caps = attention_flow_capacities(attns).cpu().numpy()
    batch, layers, n, _ = caps.shape
    units = np.rint(caps * _FLOW_UNITS).astype(np.int64)
    wanted = np.ones((batch, n), dtype=bool) if sources is None else sources.cpu().numpy().astype(bool)
    out = np.zeros((batch, n), dtype=np.float64)
    for b in range(batch):
        graph = _flow_graph(units[b], int(query[b]))
        for j in np.flatnonzero(wanted[b]):
            out[b, j] = maximum_flow(graph, int(j), layers * n).flow_value / _FLOW_UNITS
    return torch.from_numpy(out).to(attns[0].device)


def query_rows(x: Tensor, query: Tensor) -> Tensor:
    """The query's row of each sample's map: ``x[b, query[b]]`` for ``x`` ``[B, N, N]`` and an index ``[B]``;
    for a float ``query`` ``[B, N]`` (weights over the rows, e.g. mean pooling) their weighted sum."""
    if query.is_floating_point():
        row, x = _common(query, x)
        return torch.bmm(row.unsqueeze(1), x).squeeze(1)
    return x[torch.arange(x.shape[0], device=x.device), query]


def raw_attention_row(attn: Tensor, query: Tensor) -> Tensor:
    """Raw attention: the last layer's ``E_h A``, the query's row. ``[B, Nk]``."""
    return query_rows(_f32(attn).mean(dim=1), query)


def attn_gradcam_map(attn: Tensor, grad: Tensor, keep: Tensor | None = None, key_keep: Tensor | None = None) -> Tensor:
    """Attention Grad-CAM's map of one attention call: head ``h`` weighted by the mean of its gradient,
    mean over heads, negatives removed: ``(E_h[mean(∇A_h) · A_h])⁺``. ``[B, Nq, Nk]``.

    ``keep`` (``[B, Nq]`` bool, True for real tokens) restricts the gradient mean to pairs of real
    tokens: ``∂y/∂A`` is not zero at padded keys, and a padded batch must explain each sample as it
    would be explained alone. ``key_keep`` (``[B, Nk]``) is the keys' own when they are another token
    set's (cross-attention); by default ``keep``. A sample without a pair of real tokens weighs its heads by 0.
    """
    grad = _f32(grad)
    if keep is None:
        weights = grad.mean(dim=(-2, -1), keepdim=True)
    else:
        key_keep = keep if key_keep is None else key_keep
        pairs = (keep[:, :, None] & key_keep[:, None, :])[:, None].to(grad.dtype)
        weights = (grad * pairs).sum(dim=(-2, -1), keepdim=True) / pairs.sum(dim=(-2, -1), keepdim=True).clamp(min=1)
    return (weights * _f32(attn)).mean(dim=1).clamp_(min=0)


def attn_gradcam_row(attn: Tensor, grad: Tensor, query: Tensor, keep: Tensor | None = None) -> Tensor:
    """Attention Grad-CAM (:func:`attn_gradcam_map`) of the last layer, the query's row. ``[B, Nk]``."""
    return query_rows(attn_gradcam_map(attn, grad, keep), query)


def attn_gradcam_vit_row(attn: Tensor, grad: Tensor, query: Tensor, keep: Tensor | None = None) -> Tensor:
    """Attention Grad-CAM, ViT variant: heads weighted by their gradient's mean over the readout row.

    Two variants of attention Grad-CAM exist in the authors' code. Both take the last layer's
    attention :math:`A_h` and its gradient :math:`\\nabla A_h`, weight each head by a mean of its
    gradient, average the weighted attention over heads and remove negatives; they differ in which
    gradient entries the weight averages:

    - the *matrix* variant (the LXMERT/GAE code, :func:`attn_gradcam_row`): all
      :math:`N \\times N` entries;
    - the *ViT* variant (here): only the readout row, the query's attention to the other tokens,
      ``grad[:, h, query, others]``.

    With :math:`q` the query (the CLS token) and :math:`K` the other (real) tokens,

    .. math:: w_h = \\frac{1}{|K|} \\sum_{k \\in K} \\nabla A_h[q, k], \\qquad
              r_k = \\Big(\\frac{1}{H} \\sum_h w_h\\, A_h[q, k]\\Big)^+ \\ (k \\in K), \\qquad r_q = 0.


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
