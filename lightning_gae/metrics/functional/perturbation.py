"""Perturbation protocols as functions: remove input units in relevance order, watch the model.

Every protocol here runs the same engine: an attribution scores the modality's units (pixels,
patches, tokens, features, see :meth:`~lightning_gae.Modality.unit_scores`), the units are ranked,
and for every step of a curve the top (or bottom) share of each sample's removable units is
removed by the modality. All (step, sample) pairs go through ``forward_fn`` in chunks of at most
``max_batch`` inputs, without gradients and in eval mode.

Each protocol is a ``_<name>_update`` returning sums over samples (the states of the metric class),
a ``_<name>_compute`` turning them into the value, and the public function doing both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Literal, Union

import torch
from torch import Tensor, nn

from lightning_gae.explain import _call_args, eval_mode, map_tensors, model_logits
from lightning_gae.modalities import Modality

__all__ = [
    "ERASER_BINS",
    "PERTURBATION_FRACTIONS",
    "PROTOCOLS",
    "RISE_FRACTIONS",
    "abpc",
    "aopc",
    "comprehensiveness",
    "deletion_auc",
    "insertion_auc",
    "perturbation_auc",
    "perturbation_curve",
    "random_attribution",
    "sufficiency",
]

Target = Union[None, int, Sequence[int], Tensor]
Order = Literal["positive", "negative"]
Score = Literal["accuracy", "probability"]
Protocol = Literal["target", "predicted"]
PROTOCOLS: tuple[str, ...] = ("target", "predicted")
"""Which class a perturbation test explains and scores (Chefer et al., CVPR 2021, Table 1):

- ``"target"``: ``target`` is the class explained and scored (None: each sample's unperturbed
  prediction); a perturbed input counts as correct while the model still predicts it. Given the
  labels, this is the paper's *target* column.
- ``"predicted"``: the class explained and scored is each sample's unperturbed prediction, and
  ``target`` holds the labels a perturbed prediction is checked against (None: the prediction
  itself). Given the labels, this is the paper's *predicted* column, whose 0% step is the model's
  accuracy.
"""

PERTURBATION_FRACTIONS: tuple[float, ...] = tuple(round(0.1 * k, 1) for k in range(10))
"""Chefer et al.: 0%, 10%, ..., 90% of the units removed."""
RISE_FRACTIONS: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(21))
"""Deletion / insertion: 0%, 5%, ..., 100%."""
ERASER_BINS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)
"""DeYoung et al. (ERASER): the top 1, 5, 10, 20 and 50% of the tokens."""


def random_attribution(like: Tensor, seed: int = 0) -> Tensor:
    """Seeded uniform noise shaped like ``like`` (token relevance or a map): the floor every method must beat.

    The same seed gives the same values on every device (drawn on the CPU, then moved).
    """
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(like.shape, generator=generator).to(like.device)


def _check_fractions(fractions: Sequence[float], name: str) -> Tensor:
    values = torch.tensor([float(f) for f in fractions], dtype=torch.float64)
    if values.numel() < 1 or (values < 0).any() or (values > 1).any() or (values.diff() <= 0).any():
        raise ValueError(f"{name} must be increasing fractions in [0, 1]; got {list(fractions)}")
    return values


def removal_counts(fractions: Sequence[float], removable: Tensor, at_least_one: bool = False) -> Tensor:
    """``[S, B]`` how many units each step removes: ``floor(f * n_b)`` of a sample's ``n_b`` removable units.

    ``at_least_one`` (ERASER's bins) removes one unit for any positive fraction.
    """
    # float64 on the CPU: float32 misrounds f * n for large n, and MPS has no float64.
    n = removable.sum(dim=1).to("cpu", torch.float64)
    f = torch.tensor([float(x) for x in fractions], dtype=torch.float64)
    # The epsilon keeps 0.3 * 10 = 3.0000000000000004 and 0.7 * 10 from rounding the wrong way.
    counts = torch.floor(f[:, None] * n[None, :] + 1e-6).long()
    if at_least_one:
        counts = torch.where((f[:, None] > 0) & (n[None, :] > 0), counts.clamp(min=1), counts)
    return counts.to(removable.device)


def ranked_masks(scores: Tensor, removable: Tensor, counts: Tensor, order: Order = "positive") -> Tensor:
    """``[S, B, U]`` bool: for step ``s``, the ``counts[s, b]`` top-ranked removable units of sample ``b``.

    ``positive`` ranks the most relevant first, ``negative`` the least relevant first; units that
    are not removable are never chosen; ties keep index order (a stable sort).
    """
    if order not in ("positive", "negative"):
        raise ValueError(f"order={order!r}; use 'positive' (most relevant removed first) or 'negative'")
    key = scores.float() if order == "negative" else -scores.float()
    key = key.masked_fill(~removable, math.inf)
    ranks = torch.empty_like(key, dtype=torch.long)
    positions = torch.arange(key.shape[1], device=key.device).expand_as(key)
    ranks.scatter_(1, key.argsort(dim=1, stable=True), positions)
    return (ranks[None] < counts[:, :, None]) & removable[None]


def _forward_logits(forward_fn: Callable[..., Any], inputs: Any) -> Tensor:
    args, kwargs = _call_args(inputs)
    logits = model_logits(forward_fn(*args, **kwargs))
    if logits is None or logits.dim() != 2:
        shape = None if logits is None else tuple(logits.shape)
        raise ValueError(f"forward_fn must return class logits [B, C] (a tensor, a tuple or .logits); got {shape}")
    return logits.float()


def _select(inputs: Any, index: Tensor, batch: int) -> Any:
    return map_tensors(inputs, lambda t: t[index.to(t.device)] if t.dim() and t.shape[0] == batch else t)


def _class_index(target: Target, batch: int, device: torch.device, num_classes: int | None = None) -> Tensor:
    """``[B]`` class indices from an int or one class per sample (list or tensor)."""
    index = torch.as_tensor(target, device=device).long().reshape(-1)
    if index.numel() == 1:
        index = index.expand(batch)
    out_of_range = num_classes is not None and bool(((index < 0) | (index >= num_classes)).any())
    if index.shape != (batch,) or out_of_range:
        classes = "" if num_classes is None else f" in [0, {num_classes})"
        raise ValueError(f"target must be None, an int or one class per sample{classes} for {batch} samples; "
                         f"got {index.tolist()}")
    return index


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}; use 'target' (score the class given as target, the prediction "
                         "for None) or 'predicted' (score the prediction, checked against the labels given as target)")


def _scored_classes(target: Target, logits: Tensor, protocol: Protocol) -> tuple[Tensor, Tensor]:
    """``(explained [B], reference [B])``: the class whose probability is scored, and the class a
    perturbed prediction must equal to count as correct (see :data:`PROTOCOLS`)."""
    _check_protocol(protocol)
    predicted = logits.argmax(dim=1)
    given = None if target is None else _class_index(target, logits.shape[0], logits.device, logits.shape[1])
    if protocol == "predicted":
        return predicted, predicted if given is None else given
    explained = predicted if given is None else given
    return explained, explained


def _score(logits: Tensor, explained: Tensor, reference: Tensor, score: Score) -> Tensor:
    if score == "accuracy":
        return (logits.argmax(dim=1) == reference).float()
    if score == "probability":
        return logits.softmax(dim=1).gather(1, explained[:, None]).squeeze(1)
    raise ValueError(f"score={score!r}; use 'accuracy' or 'probability'")


def perturbed_scores(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    masks: Tensor,
    target: Target = None,
    score: Score = "probability",
    fill: Any = None,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> tuple[Tensor, Tensor]:
    """The model's score of every sample with every mask's units removed.

    Args:
        forward_fn: the model (or any callable) giving logits ``[B, C]``; called like ``explain``
            calls the model: ``f(x)``, ``f(*x)`` for a tuple, ``f(**x)`` for a mapping.
        modality: removes the units (:meth:`~lightning_gae.Modality.remove`).
        inputs: one batch of ``B`` samples.
        masks: bool ``[S, B, U]``, True for the units removed at step ``s``.
        target: None, an int, or one class per sample: the class scored, or the labels (``protocol``).
        score: ``"accuracy"`` (1 while the prediction is still the reference class) or the scored
            class's ``"probability"``.
        fill: inputs whose units replace removed ones (default: the modality's removal value).
        max_batch: at most this many perturbed inputs per forward pass.
        protocol: ``"target"`` or ``"predicted"`` (:data:`PROTOCOLS`).

    Returns:
        ``scores [S, B]`` float32 and ``clean [B]``, the scored class's unperturbed probability.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1; got {max_batch}")
    steps, batch = masks.shape[:2]
    if fill is None:
        fill = modality.remove(inputs, modality.removable(inputs))
    # A plain function has no modes to switch; a module runs in eval mode and gets its own flags back.
    modes = eval_mode(forward_fn) if isinstance(forward_fn, nn.Module) else nullcontext()
    with torch.inference_mode(), modes:
        logits = torch.cat([_forward_logits(forward_fn, _select(inputs, idx, batch))
                            for idx in torch.arange(batch).split(max_batch)])
        explained, reference = _scored_classes(target, logits, protocol)
        clean = _score(logits, explained, reference, "probability")
        out = torch.empty(steps * batch, device=logits.device)
        # A pair that removes nothing (the 0% step) is the unperturbed input: its score is the clean one.
        removes = masks.reshape(steps * batch, -1).any(dim=1).cpu()
        untouched = torch.nonzero(~removes).flatten()
        sample_of = untouched % batch
        out[untouched.to(out.device)] = _score(logits[sample_of.to(logits.device)], explained[sample_of.to(explained.device)],
                                               reference[sample_of.to(reference.device)], score)
        # Step-major pairs, so one chunk mixes steps and samples and the count of forwards is ceil(S*B / max_batch).
        for pairs in torch.nonzero(removes).flatten().split(max_batch):
            step, sample = pairs // batch, pairs % batch
            chunk = modality.remove(_select(inputs, sample, batch), masks[step, sample], _select(fill, sample, batch))
            index = sample.to(logits.device)
            out[pairs.to(out.device)] = _score(_forward_logits(forward_fn, chunk), explained[index], reference[index], score)
    # Cloned outside inference mode: callers may update the scores in place or keep them in metric states.
    return out.reshape(steps, batch).clone(), clean.clone()


def _units(modality: Modality, inputs: Any, attributions: Tensor) -> tuple[Tensor, Tensor]:
    scores = modality.unit_scores(attributions.detach(), inputs)
    removable = modality.removable(inputs).to(scores.device)
    if scores.shape != removable.shape:
        raise ValueError(f"{type(modality).__name__} scored {tuple(scores.shape)} units but has {tuple(removable.shape)}")
    return scores, removable


# --- perturbation test (Chefer et al.) ------------------------------------------------------------


def _perturbation_auc_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(curve_sum [S], count)``: the per-step score summed over the batch's samples."""
    curves = _perturbation_curves(forward_fn, modality, inputs, attributions, target, order, fractions, score,
                                  max_batch, protocol)
    return curves.sum(dim=0), curves.shape[0]


def _perturbation_curves(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B, S]``: each sample's own score at every step (what ``_perturbation_auc_update`` sums)."""
    return _ordered_curves(forward_fn, modality, inputs, attributions, target, (order,), fractions, score, max_batch,
                           protocol)[0]


def _ordered_curves(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target,
    orders: Sequence[Order],
    fractions: Sequence[float],
    score: Score,
    max_batch: int,
    protocol: Protocol,
) -> Tensor:
    """``[O, B, S]``: each sample's curve for every removal order, all in one pass of the engine.

    The orders' masks are stacked along the steps, so their perturbed inputs share the forward
    chunks and the unperturbed (0%) steps are scored once, from the clean forward.
    """
    _check_fractions(fractions, "fractions")
    scores, removable = _units(modality, inputs, attributions)
    counts = removal_counts(fractions, removable)
    masks = torch.cat([ranked_masks(scores, removable, counts, order) for order in orders])
    curves, _ = perturbed_scores(forward_fn, modality, inputs, masks, target, score, max_batch=max_batch,
                                 protocol=protocol)
    return curves.reshape(len(orders), len(fractions), -1).transpose(1, 2)


def _perturbation_auc_compute(curve_sum: Tensor, count: Tensor | int, fractions: Sequence[float], scale: float = 100.0) -> Tensor:
    """Trapezoid area under the mean curve over ``fractions`` (the 0 step included), times ``scale``."""
    curve = curve_sum / count
    x = torch.tensor([float(f) for f in fractions], dtype=curve.dtype, device=curve.device)
    return torch.trapezoid(curve, x) * scale


def perturbation_curve(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """The mean score ``[S]`` after removing each fraction of units (see :func:`perturbation_auc`)."""
    curve_sum, count = _perturbation_auc_update(forward_fn, modality, inputs, attributions, target, order,
                                                fractions, score, max_batch, protocol)
    return curve_sum / count


def perturbation_auc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""Perturbation test of Chefer et al.: area under the score curve as units are removed.

    For each fraction :math:`f_s` the top :math:`\lfloor f_s n_b \rfloor` of sample :math:`b`'s
    :math:`n_b` removable units are removed, most relevant first (``order="positive"``, lower is
    better) or least relevant first (``"negative"``, higher is better), and the model scores the
    result; with :math:`c_s` the mean score over samples,

    .. math:: \mathrm{AUC} = 100 \sum_s \tfrac{1}{2}(c_s + c_{s+1})(f_{s+1} - f_s).

    Args:
        forward_fn: the model, or a callable giving logits ``[B, C]``.
        modality: which units exist and how they are removed (e.g. ``ImageTokens`` sets pixels black).
        inputs: a batch (tensor, tuple or mapping, as for ``explain``).
        attributions: token relevance ``[B, N]`` or an input-shaped map.
        target: with ``protocol="target"`` the class explained and scored (None: the unperturbed
            prediction); with ``"predicted"`` the labels the prediction is checked against.
        order: ``"positive"`` or ``"negative"``.
        fractions: increasing fractions in [0, 1]; default 0, 0.1, ..., 0.9.
        score: ``"accuracy"`` (the paper) or ``"probability"`` of the scored class.
        max_batch: at most this many perturbed inputs per forward pass.
        protocol: ``"target"`` or ``"predicted"`` (:data:`PROTOCOLS`).

    Returns:
        A scalar tensor; with the default fractions, in [0, 90].

    Example (class 1 while the features sum above 0.9; removing the top third already flips it):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[1.0, 0.5, 0.25]])
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> perturbation_curve(model, modality, x, x, fractions=(0, 1 / 3, 2 / 3))
    tensor([1., 0., 0.])
    >>> round(perturbation_auc(model, modality, x, x, fractions=(0, 1 / 3, 2 / 3)).item(), 2)
    16.67
    >>> round(perturbation_auc(model, modality, x, x, order="negative", fractions=(0, 1 / 3, 2 / 3)).item(), 2)
    66.67
    """
    curve_sum, count = _perturbation_auc_update(forward_fn, modality, inputs, attributions, target, order,
                                                fractions, score, max_batch, protocol)
    return _perturbation_auc_compute(curve_sum, count, fractions)


def _abpc_per_sample(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B]`` float64: each sample's own ABPC, the area between its negative and positive curves (×100)."""
    negative, positive = _ordered_curves(forward_fn, modality, inputs, attributions, target, ("negative", "positive"),
                                         fractions, score, max_batch, protocol).double()
    x = torch.tensor([float(f) for f in fractions], dtype=torch.float64, device=negative.device)
    return torch.trapezoid(negative - positive, x, dim=-1) * 100.0


def _abpc_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(sum, count)`` over the batch's samples of their own ABPC."""
    per_sample = _abpc_per_sample(forward_fn, modality, inputs, attributions, target, fractions, score, max_batch,
                                  protocol)
    return per_sample.sum(), per_sample.numel()


def abpc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""ABPC, the area between the perturbation curves (the figure AttnLRP, Achtibat et al. 2024, reports).

    With :math:`c^-_s` the mean score after removing the least relevant :math:`\lfloor f_s n_b
    \rfloor` units first and :math:`c^+_s` after removing the most relevant first (the curves of
    :func:`perturbation_auc` with ``order="negative"`` and ``"positive"``),

    .. math:: \mathrm{ABPC} = 100 \sum_s \tfrac{1}{2}\big[(c^-_s - c^+_s) + (c^-_{s+1} - c^+_{s+1})\big](f_{s+1} - f_s)
              = \mathrm{AUC}^- - \mathrm{AUC}^+.

    Higher is better: a faithful explanation keeps the score while its least relevant units go and
    loses it fast while its most relevant go. Both curves come from one pass of the engine over
    ``2 x (len(fractions) - 1) x B`` perturbed inputs. Arguments as in :func:`perturbation_auc`
    (``inputs`` a batch of ``B``; ``attributions`` ``[B, N]`` or input-shaped).

    Returns:
        A scalar tensor (float64), the mean over samples; with the default fractions and
        ``score="accuracy"``, in [-90, 90].

    Example (class 1 while the features sum above 0.9; the most relevant feature alone decides it):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[1.0, 0.5, 0.25]])
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> round(abpc(model, modality, x, x, fractions=(0, 1 / 3, 2 / 3)).item(), 2)  # 66.67 - 16.67
    50.0
    >>> round(abpc(model, modality, x, -x, fractions=(0, 1 / 3, 2 / 3)).item(), 2)  # relevance reversed
    -50.0
    """
    total, count = _abpc_update(forward_fn, modality, inputs, attributions, target, fractions, score, max_batch,
                                protocol)
    return _mean_compute(total, count)


# --- deletion / insertion (RISE) -------------------------------------------------------------------


def _deletion_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    insertion: bool = False,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(curve_sum [S], count)`` of the scored class's probability as units are deleted (or inserted)."""
    curves = _deletion_curves(forward_fn, modality, inputs, attributions, target, fractions, max_batch, insertion,
                              protocol)
    return curves.sum(dim=0), curves.shape[0]


def _deletion_curves(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    insertion: bool = False,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B, S]``: each sample's own probability at every step (what ``_deletion_update`` sums)."""
    _check_fractions(fractions, "fractions")
    scores, removable = _units(modality, inputs, attributions)
    chosen = ranked_masks(scores, removable, removal_counts(fractions, removable), "positive")
    if insertion:
        # Inserting the top k into the blurred image = removing everything else, with blur as the fill.
        curves, _ = perturbed_scores(forward_fn, modality, inputs, removable[None] & ~chosen, target, "probability",
                                     fill=modality.blurred(inputs), max_batch=max_batch, protocol=protocol)
    else:
        curves, _ = perturbed_scores(forward_fn, modality, inputs, chosen, target, "probability", max_batch=max_batch,
                                     protocol=protocol)
    return curves.T


def deletion_auc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""Deletion (RISE): area under the scored class's probability as the most relevant units are removed first.

    With :math:`p_s` the mean probability after removing the top :math:`\lfloor f_s n_b \rfloor`
    units the modality's way (black pixels, mask ids, feature means),
    :math:`\sum_s \tfrac{1}{2}(p_s + p_{s+1})(f_{s+1} - f_s)` over ``fractions`` (default 0, 0.05,
    ..., 1), so it lies in [0, 1]. Lower is better. Arguments as in :func:`perturbation_auc`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> # p(class 1) = sigmoid(3) at 0%, sigmoid(0) = 0.5 once "a" is gone: 0.5 * (0.953 + 0.5) / 2 + 0.5 * 0.5
    >>> round(deletion_auc(model, modality, x, x, target=1, fractions=(0, 0.5, 1)).item(), 3)
    0.613
    """
    curve_sum, count = _deletion_update(forward_fn, modality, inputs, attributions, target, fractions, max_batch,
                                        protocol=protocol)
    return _perturbation_auc_compute(curve_sum, count, fractions, scale=1.0)


def insertion_auc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    fractions: Sequence[float] = RISE_FRACTIONS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""Insertion (RISE): area under the scored class's probability as the most relevant units are put back first.

    The curve starts from :meth:`~lightning_gae.Modality.blurred` (a Gaussian blur of an image;
    every removable token or feature removed otherwise), puts the top :math:`\lfloor f_s n_b
    \rfloor` units back at step :math:`s` and ends at the input; the area is the trapezoid as in
    :func:`deletion_auc`. Higher is better. Arguments as in :func:`perturbation_auc`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> # sigmoid(0) = 0.5 from nothing, sigmoid(3) = 0.953 once "a" is back: 0.5 * (0.5 + 0.953) / 2 + 0.5 * 0.953
    >>> round(insertion_auc(model, modality, x, x, target=1, fractions=(0, 0.5, 1)).item(), 3)
    0.839
    """
    curve_sum, count = _deletion_update(forward_fn, modality, inputs, attributions, target, fractions, max_batch,
                                        insertion=True, protocol=protocol)
    return _perturbation_auc_compute(curve_sum, count, fractions, scale=1.0)


# --- ERASER: comprehensiveness, sufficiency; AOPC ------------------------------------------------


def _eraser_update(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    keep_only: bool = False,
    with_zero: bool = False,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> tuple[Tensor, int]:
    """``(sum, count)`` over samples of the mean probability drop over ``bins``."""
    per_sample = _eraser_per_sample(forward_fn, modality, inputs, attributions, target, bins, keep_only, with_zero,
                                    max_batch, protocol)
    return per_sample.sum(), per_sample.numel()


def _eraser_per_sample(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    keep_only: bool = False,
    with_zero: bool = False,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B]``: each sample's mean probability drop over ``bins`` (what ``_eraser_update`` sums)."""
    _check_fractions(bins, "bins")
    scores, removable = _units(modality, inputs, attributions)
    top = ranked_masks(scores, removable, removal_counts(bins, removable, at_least_one=True), "positive")
    masks = removable[None] & ~top if keep_only else top
    probs, clean = perturbed_scores(forward_fn, modality, inputs, masks, target, "probability", max_batch=max_batch,
                                    protocol=protocol)
    drops = clean[None] - probs
    # AOPC's k = 0 term (nothing removed) is a drop of exactly 0: it only adds to the denominator.
    return drops.sum(dim=0) / (len(bins) + 1) if with_zero else drops.mean(dim=0)


def _mean_compute(total: Tensor, count: Tensor | int) -> Tensor:
    return total / count


def comprehensiveness(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""ERASER comprehensiveness: :math:`\frac{1}{|K|}\sum_{k \in K} p(x) - p(x \setminus r_k)`, higher is better.

    :math:`r_k` is the top :math:`k` share of the removable units (at least one unit), ``bins``
    :math:`K` default to 1, 5, 10, 20 and 50%; :math:`p` is the scored class's probability.
    Arguments as in :func:`perturbation_auc`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> round(comprehensiveness(model, modality, x, x, target=1, bins=(0.5,)).item(), 3)  # sigmoid(3) - sigmoid(0)
    0.453
    """
    total, count = _eraser_update(forward_fn, modality, inputs, attributions, target, bins, max_batch=max_batch,
                                  protocol=protocol)
    return _mean_compute(total, count)


def sufficiency(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""ERASER sufficiency: :math:`\frac{1}{|K|}\sum_{k \in K} p(x) - p(r_k)`, only the top units kept; lower is better.

    Arguments as in :func:`comprehensiveness`.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> sufficiency(model, modality, x, x, target=1, bins=(0.5,)).item()  # "a" alone keeps all of it
    0.0
    """
    total, count = _eraser_update(forward_fn, modality, inputs, attributions, target, bins, keep_only=True,
                                  max_batch=max_batch, protocol=protocol)
    return _mean_compute(total, count)


def aopc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    bins: Sequence[float] = ERASER_BINS,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""AOPC (Samek et al.), most relevant first: :math:`\frac{1}{|K|+1}\sum_{k \in \{0\} \cup K} p(x) - p(x \setminus r_k)`.

    The average over the removal steps of the probability drop, the unperturbed step included, on
    ERASER's bins; equal to :func:`comprehensiveness` times :math:`|K| / (|K| + 1)`. Higher is better.

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.zeros(len(x)), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[3.0, 0.0]])
    >>> modality = TabularTokens(["a", "b"], prefix_tokens=0, means=[0.0, 0.0])
    >>> round(aopc(model, modality, x, x, target=1, bins=(0.5,)).item(), 4)  # (0 + 0.453) / 2
    0.2263
    """
    total, count = _eraser_update(forward_fn, modality, inputs, attributions, target, bins, with_zero=True,
                                  max_batch=max_batch, protocol=protocol)
    return _mean_compute(total, count)
