"""The perturbation engine every protocol of :mod:`lightning_gae.metrics.functional.perturbation` runs.

An attribution scores the modality's units (pixels, patches, tokens, features, see
:meth:`~lightning_gae.Modality.unit_scores`), the units are ranked, and for every step of a curve the
top (or bottom) share of each sample's removable units is removed by the modality. All (step,
sample) pairs go through ``forward_fn`` in chunks of at most ``max_batch`` inputs, without gradients
and in eval mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_gae._structures import ClassTarget as Target
from lightning_gae._structures import class_index, eval_mode, forward_logits, select_rows
from lightning_gae.methods.random import random_attribution
from lightning_gae.modalities.tokens import Modality

__all__ = [
    "PROTOCOLS",
    "Order",
    "Protocol",
    "Score",
    "check_fractions",
    "check_protocol",
    "perturbed_scores",
    "random_attribution",
    "ranked_masks",
    "removal_counts",
    "score_logits",
    "scored_classes",
    "unit_ranking",
    "unorderable",
]

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

def check_fractions(fractions: Sequence[float], name: str) -> Tensor:
    """``fractions`` as float64; raises, naming the argument, unless they increase within [0, 1]."""
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


def check_protocol(protocol: str) -> None:
    """Raise, naming both choices, unless ``protocol`` is one of :data:`PROTOCOLS`."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}; use 'target' (score the class given as target, the prediction "
                         "for None) or 'predicted' (score the prediction, checked against the labels given as target)")


def scored_classes(target: Target, logits: Tensor, protocol: Protocol) -> tuple[Tensor, Tensor]:
    """``(explained [B], reference [B])``: the class whose probability is scored, and the class a
    perturbed prediction must equal to count as correct (see :data:`PROTOCOLS`)."""
    check_protocol(protocol)
    predicted = logits.argmax(dim=1)
    given = None if target is None else class_index(target, logits.shape[0], logits.device, logits.shape[1])
    if protocol == "predicted":
        return predicted, predicted if given is None else given
    explained = predicted if given is None else given
    return explained, explained


def score_logits(logits: Tensor, explained: Tensor, reference: Tensor, score: Score) -> Tensor:
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
    removal: Callable[[Any, Tensor], Any] | None = None,
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
        removal: how a chunk of inputs loses the units a mask ``[b, U]`` holds, ``removal(inputs, drop) -> inputs``
            (ROAD's imputation); None: the modality's :meth:`~lightning_gae.Modality.remove` with ``fill``.

    Returns:
        ``scores [S, B]`` float32 and ``clean [B]``, the scored class's unperturbed probability.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1; got {max_batch}")
    steps, batch = masks.shape[:2]
    if fill is None and removal is None:
        fill = modality.remove(inputs, modality.removable(inputs))
    # A plain function has no modes to switch; a module runs in eval mode and gets its own flags back.
    modes = eval_mode(forward_fn) if isinstance(forward_fn, nn.Module) else nullcontext()
    with torch.inference_mode(), modes:
        logits = torch.cat([forward_logits(forward_fn, select_rows(inputs, idx, batch))
                            for idx in torch.arange(batch).split(max_batch)])
        explained, reference = scored_classes(target, logits, protocol)
        clean = score_logits(logits, explained, reference, "probability")
        out = torch.empty(steps * batch, device=logits.device)
        # A pair that removes nothing (the 0% step) is the unperturbed input: its score is the clean one.
        removes = masks.reshape(steps * batch, -1).any(dim=1).cpu()
        untouched = torch.nonzero(~removes).flatten()
        sample_of = untouched % batch
        out[untouched.to(out.device)] = score_logits(logits[sample_of.to(logits.device)], explained[sample_of.to(explained.device)],
                                               reference[sample_of.to(reference.device)], score)
        # Step-major pairs, so one chunk mixes steps and samples and the count of forwards is ceil(S*B / max_batch).
        for pairs in torch.nonzero(removes).flatten().split(max_batch):
            step, sample = pairs // batch, pairs % batch
            rows = select_rows(inputs, sample, batch)
            chunk = (modality.remove(rows, masks[step, sample], select_rows(fill, sample, batch)) if removal is None
                     else removal(rows, masks[step, sample]))
            index = sample.to(logits.device)
            out[pairs.to(out.device)] = score_logits(forward_logits(forward_fn, chunk), explained[index], reference[index], score)
    # Cloned outside inference mode: callers may update the scores in place or keep them in metric states.
    return out.reshape(steps, batch).clone(), clean.clone()


def unit_ranking(modality: Modality, inputs: Any, attributions: Tensor) -> tuple[Tensor, Tensor]:
    if attributions.dim() == 0 or attributions.shape[0] == 0:
        raise ValueError(f"attributions of shape {tuple(attributions.shape)} hold no sample: pass a batch of at least one "
                         "(a metric class's update() leaves the metric unchanged for an empty batch)")
    scores = modality.unit_scores(attributions.detach(), inputs)
    removable = modality.removable(inputs).to(scores.device)
    if scores.shape != removable.shape:
        raise ValueError(f"{type(modality).__name__} scored {tuple(scores.shape)} units but has {tuple(removable.shape)}")
    return scores, removable


def unorderable(scores: Tensor, removable: Tensor) -> Tensor:
    """``[B]`` bool: the samples whose relevance on some removable unit is NaN or infinite. No removal order follows
    from such relevance, so their scores are NaN (a NaN in a mean over samples then shows, where zeros would hide)."""
    return (removable & ~torch.isfinite(scores)).any(dim=-1)


# --- perturbation test (Chefer et al.) ------------------------------------------------------------
