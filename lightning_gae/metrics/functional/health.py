r"""Whether an explanation still says something: pure checks on relevance and on metric values with their errors.

"Health" as in a health check: none of these scores an explanation, they tell when a score should not be
trusted or when two scores cannot be told apart.

- GAE's relevance row is :math:`e_q^\top (I + \bar A_L) \cdots (I + \bar A_1)`: the read-out token :math:`q`
  holds the identity's 1, everything else comes from the layers' :math:`\bar A`. When those terms vanish beside
  the identity (a saturated, confidently trained model; GAE_SPEC section 11), the relevance outside :math:`q`
  is noise around 0 and every ranking of it is meaningless: :func:`beside_identity`, :func:`identity_dominated`.
- A method that does not beat random relevance beyond the standard error is not shown to be faithful:
  :func:`not_better_than_random`.
- Methods whose values the standard errors do not tell apart are tied: :func:`tied_groups`.
- How much of a map's (positive) relevance its top tokens hold, a share in [0, 1] for signed relevance too:
  :func:`relevance_concentration`.

The standard-error rule is the project's (README, "Faithfulness over training"): two values differ at ~95%
when their difference exceeds :data:`STDERR_FACTOR` times the standard error of the difference,
:math:`|a - b| > 2 \sqrt{\mathrm{se}_a^2 + \mathrm{se}_b^2}`, which is the README's
:math:`2 \sqrt 2\, \mathrm{se} \approx 2.8\, \mathrm{se}` for equal errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

__all__ = [
    "IDENTITY_TOLERANCE",
    "STDERR_FACTOR",
    "beside_identity",
    "differs_beyond_stderr",
    "identity_dominated",
    "not_better_than_random",
    "relevance_concentration",
    "tied_groups",
]

STDERR_FACTOR: float = 2.0
"""Two values differ when ``|a - b| > STDERR_FACTOR * sqrt(se_a**2 + se_b**2)`` (~95% for normal errors)."""

IDENTITY_TOLERANCE: float = 1e-5
"""Relevance outside the read-out token below this fraction of the identity's 1 is negligible. Measured largest
relevance beside the identity, per sample: float32 round-off of ``1 + x`` is ~6e-8; GAE_SPEC section 11's saturated
BERT ~1e-6 (or exactly 0); the untrained recipe models 8e-5..5e-3 (their logits are small, and GAE's terms scale
with the score's gradient); the trained reviews encoder 3e-3..5e-2, the trained digits ViT 0.04..0.2. An untrained
model is small, not dead: its ranking is still its gradients', so the tolerance sits between the two."""


def beside_identity(relevance: Tensor, query: int | Tensor | None = None) -> Tensor:
    r"""The largest relevance outside the read-out token, in units of the identity's 1 that the token holds.

    .. math:: m = \max_{n \ne q} |r_n|

    For methods whose row starts from the identity (``gae``, ``transformer_attribution``: the read-out token's
    own entry is :math:`1 + \dots`), :math:`m \ll 1` means the layers added almost nothing and the row is
    the identity alone. :class:`~lightning_gae.Explanation`'s ``tokens`` already hold 0 at the read-out token
    (the identity removed), so ``query=None`` takes the maximum over all tokens.

    Args:
        relevance: ``[B, N]`` relevance rows.
        query: the read-out token (an index, or one per sample ``[B]``) whose entry is left out; None when
            the rows already hold 0 there (``explain(...).tokens``).

    Returns:
        float32 ``[B]``; NaN for a row with a non-finite value.

    >>> import torch
    >>> beside_identity(torch.tensor([[0.0, 2e-7, -1e-6], [0.0, 0.3, 0.1]]))
    tensor([1.0000e-06, 3.0000e-01])
    >>> beside_identity(torch.tensor([[1.0, 0.02, 0.01]]), query=0)     # a row with its identity entry
    tensor([0.0200])
    """
    if relevance.dim() != 2:
        raise ValueError(f"relevance must be rows [B, N]; got shape {tuple(relevance.shape)}")
    rows = relevance.detach().float().abs()
    finite = torch.isfinite(rows).all(dim=1)       # the read-out entry too: a NaN there is a broken row
    if query is not None:
        index = torch.as_tensor(query, dtype=torch.long, device=rows.device).reshape(-1).expand(rows.shape[0])
        rows = rows.clone()
        rows[torch.arange(rows.shape[0], device=rows.device), index] = 0.0
    largest = rows.amax(dim=1)
    return torch.where(finite, largest, torch.nan)


def identity_dominated(relevance: Tensor, query: int | Tensor | None = None,
                       tolerance: float = IDENTITY_TOLERANCE) -> Tensor:
    """bool ``[B]``: the rows whose relevance outside the read-out token is negligible beside the identity,
    :func:`beside_identity` below ``tolerance`` (a NaN row is not: it is broken, not dominated).

    GAECallback flags a method when a quarter of its rows are (``identity_dominated(exp.tokens).float().mean() >=
    0.25``): the ranking of the other tokens is round-off on those samples.

    >>> import torch
    >>> identity_dominated(torch.tensor([[0.0, 1e-6, 0.0], [0.0, 0.0, 0.0], [0.0, 0.2, 0.05]]))
    tensor([ True,  True, False])
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0 (a fraction of the identity's 1, e.g. 1e-5); got {tolerance}")
    return beside_identity(relevance, query) < tolerance


def differs_beyond_stderr(value: float, stderr: float, other: float, other_stderr: float,
                          factor: float = STDERR_FACTOR) -> bool:
    r"""Whether two values with their standard errors differ beyond those errors (the project's rule).

    .. math:: |a - b| > \mathrm{factor} \cdot \sqrt{\mathrm{se}_a^2 + \mathrm{se}_b^2}

    A NaN anywhere (one sample has no standard error) tells nothing apart: False.

    >>> differs_beyond_stderr(35.2, 1.4, 47.8, 1.2), differs_beyond_stderr(35.2, 1.4, 38.0, 1.2)
    (True, False)
    """
    if factor < 0:
        raise ValueError(f"factor must be >= 0 (standard errors of the difference); got {factor}")
    gap, spread = abs(value - other), factor * math.hypot(stderr, other_stderr)
    return bool(gap > spread) if not (math.isnan(gap) or math.isnan(spread)) else False


def not_better_than_random(value: float, stderr: float, random_value: float, random_stderr: float,
                           higher_is_better: bool, factor: float = STDERR_FACTOR) -> bool:
    r"""Whether a method's faithfulness is *not* shown better than the random-relevance floor.

    Better means on the good side of random by more than the errors allow:
    :math:`s\,(v - v_{\mathrm{random}}) > \mathrm{factor}\sqrt{\mathrm{se}^2 + \mathrm{se}_{\mathrm{random}}^2}`
    with :math:`s = +1` when higher is better, :math:`-1` otherwise. Anything else (worse, within the
    errors, or NaN) is not better: True.

    Args:
        value: the method's value (e.g. its positive perturbation AUC) and ``stderr`` its standard error.
        random_value: the same metric for random relevance, and ``random_stderr`` its standard error.
        higher_is_better: the metric's direction (``Metric.higher_is_better``).
        factor: standard errors of the difference that count as a difference.

    >>> not_better_than_random(37.5, 1.4, 40.1, 1.5, higher_is_better=False)   # 2.6 < 2 * 2.05
    True
    >>> not_better_than_random(30.0, 1.4, 40.1, 1.5, higher_is_better=False)
    False
    """
    sign = 1.0 if higher_is_better else -1.0
    better = sign * (value - random_value) > 0 and differs_beyond_stderr(value, stderr, random_value, random_stderr, factor)
    return not better


def tied_groups(values: Mapping[str, float], stderrs: Mapping[str, float], higher_is_better: bool,
                factor: float = STDERR_FACTOR) -> list[list[str]]:
    """Methods best first, in groups the standard errors do not tell apart (a rank table's ties).

    Walking the methods from best to worst value, a method joins the current group when it does not differ
    from the group's first (best) method beyond the errors (:func:`differs_beyond_stderr`), else it starts
    the next group. "Not told apart" is not transitive (a ~ b and b ~ c with a, c apart); anchoring each group
    at its best method keeps the groups in value order and every member tied with that method. Methods with
    a NaN value come last, each alone; equal values keep the order of ``values``.

    Args:
        values: method -> value.
        stderrs: method -> standard error (every method of ``values``).
        higher_is_better: the metric's direction.
        factor: as :func:`differs_beyond_stderr`.

    Returns:
        groups of method names; the rank of a method is its group's index + 1.

    >>> tied_groups({"gae": 35.2, "rollout": 36.0, "raw": 48.0, "random": 47.5},
    ...             {"gae": 1.4, "rollout": 1.5, "raw": 1.2, "random": 1.3}, higher_is_better=False)
    [['gae', 'rollout'], ['random', 'raw']]
    """
    missing = [name for name in values if name not in stderrs]
    if missing:
        raise ValueError(f"stderrs has no standard error for {missing}; give one per method of values")
    known = [name for name in values if not math.isnan(values[name])]
    known.sort(key=lambda name: -values[name] if higher_is_better else values[name])
    groups: list[list[str]] = []
    for name in known:
        if groups and not differs_beyond_stderr(values[groups[-1][0]], stderrs[groups[-1][0]], values[name],
                                                stderrs[name], factor):
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups + [[name] for name in values if math.isnan(values[name])]


def relevance_concentration(tokens: Tensor, top_fraction: float) -> Tensor:
    r"""Per sample, the share of its positive relevance that its top ``top_fraction`` of tokens hold, in [0, 1].

    .. math:: c = \frac{\sum_{n \in \mathrm{top}_k} r_n^+}{\sum_n r_n^+}, \qquad r^+ = \max(r, 0),
        \quad k = \max(1, \mathrm{round}(\mathrm{top\_fraction} \cdot N))

    Signed relevance (AttnLRP, gradients) has a total near 0 on some samples, and a share of it is then no share;
    the positive part is what speaks for the explained class, and its share is one (the region shares are defined
    the same way). A sample without positive relevance (all zero, or all negative) has no share: NaN.

    Args:
        tokens: ``[B, N]`` relevance.
        top_fraction: the share of the tokens counted as the top, in (0, 1].

    >>> import torch
    >>> relevance_concentration(torch.tensor([[4.0, -3.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]), 0.25)
    tensor([0.8000,    nan])
    """
    positive = tokens.detach().float().clamp(min=0)
    k = max(1, round(top_fraction * positive.shape[1]))
    total = positive.sum(dim=1)
    top = positive.topk(k, dim=1).values.sum(dim=1)
    return torch.where(total > 0, top / total.clamp(min=torch.finfo(total.dtype).tiny), torch.nan).clamp(max=1.0)
