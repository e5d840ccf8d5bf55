"""Relevance against ground-truth masks and rationales, as functions (update / compute / public)."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.classification import binary_average_precision, binary_confusion_matrix

__all__ = ["min_max", "rationale_agreement", "rationale_recall", "relevance_segmentation"]


def min_max(scores: Tensor) -> Tensor:
    """Each row of ``[B, U]`` mapped onto [0, 1] by its own minimum and maximum (a constant row: 0).

    Rank-preserving, so it changes no ranking; torchmetrics' average precision needs it, because
    it passes scores outside [0, 1] through a sigmoid, which saturates large relevance to 1.0 and
    rounds tiny signed (Captum-scale) relevance to 0.5, tying everything.
    """
    low = scores.amin(dim=-1, keepdim=True)
    span = scores.amax(dim=-1, keepdim=True) - low
    return (scores - low) / torch.where(span > 0, span, torch.ones_like(span))


def _relevance_segmentation_update(maps: Tensor, masks: Tensor) -> tuple[Tensor, Tensor, int]:
    """``(confusion [2, 2], ap_sum, count)`` of maps ``[B, H, W]`` thresholded at each map's mean."""
    if maps.shape != masks.shape:
        raise ValueError(f"relevance maps {tuple(maps.shape)} and masks {tuple(masks.shape)} must have the same shape")
    maps = min_max(maps.detach().float().flatten(1))
    truth = masks.flatten(1) != 0
    predicted = (maps > maps.mean(dim=1, keepdim=True)).long()
    confusion = binary_confusion_matrix(predicted, truth.long())
    # Both channels in one ranking, as the authors' ImageNet-segmentation code scores them: the
    # background channel 1 - map against the background, the foreground channel map against the
    # foreground. Half the entries are positive, so every sample has a precision-recall curve.
    scores = torch.cat([1 - maps, maps], dim=1)
    labels = torch.cat([~truth, truth], dim=1).long()
    ap = torch.stack([binary_average_precision(s, t) for s, t in zip(scores, labels)])
    return confusion, ap.sum(), maps.shape[0]


def _relevance_segmentation_compute(confusion: Tensor, ap_sum: Tensor, ap_count: Tensor | int) -> dict[str, Tensor]:
    # Pixel counts exceed float32's exact integers on large sets; MPS has no float64.
    confusion = confusion.to(torch.float64 if confusion.device.type == "cpu" else torch.float32)
    hits = confusion.diagonal()
    iou = hits / (confusion.sum(dim=0) + confusion.sum(dim=1) - hits)
    return {
        "pixel_accuracy": hits.sum() / confusion.sum(),
        "miou": iou.nanmean(),
        "mean_ap": (ap_sum / ap_count).float() if ap_count else torch.tensor(float("nan")),
    }


def relevance_segmentation(maps: Tensor, masks: Tensor) -> dict[str, Tensor]:
    r"""Relevance maps as a segmentation of ground-truth masks, the ImageNet-segmentation way (Chefer et al.).

    Each map :math:`m` is min-max normalised per sample and thresholded at its own mean
    (foreground = above it). ``pixel_accuracy`` and the IoU of each class, :math:`TP / (TP + FP +
    FN)`, are computed over all pixels of all samples (a confusion matrix from torchmetrics);
    ``miou`` is the mean of the background and foreground IoUs. ``mean_ap`` is the mean over
    samples of the average precision (torchmetrics) of one ranking of :math:`2HW` scores: the
    background channel :math:`1 - m` labelled by the background and the foreground channel
    :math:`m` labelled by the foreground, as the authors' evaluation code scores them.

    Args:
        maps: relevance ``[B, H, W]`` (any scale and sign).
        masks: ground truth ``[B, H, W]``, nonzero = foreground.

    Returns:
        ``{"pixel_accuracy", "miou", "mean_ap"}``, scalar tensors in [0, 1].

    >>> import torch
    >>> maps = torch.tensor([[[9.0, 1.0], [2.0, 3.0]]])     # any scale: only the ranking matters
    >>> masks = torch.tensor([[[1, 0], [0, 0]]])
    >>> {k: round(v.item(), 4) for k, v in relevance_segmentation(maps, masks).items()}
    {'pixel_accuracy': 1.0, 'miou': 1.0, 'mean_ap': 1.0}
    """
    return _relevance_segmentation_compute(*_relevance_segmentation_update(maps, masks))


def _rationale_agreement_update(
    scores: Tensor, rationales: Tensor, valid: Tensor | None = None, k: int | None = None
) -> tuple[Tensor, Tensor, int]:
    """``(f1_sum, auprc_sum, count)`` over samples with at least one rationale token."""
    if scores.dim() == 3:
        scores = scores.sum(dim=-1)
    if scores.shape != rationales.shape:
        raise ValueError(f"token scores {tuple(scores.shape)} and rationales {tuple(rationales.shape)} must have the same shape")
    valid = torch.ones_like(rationales, dtype=torch.bool) if valid is None else valid.bool()
    truth = (rationales != 0) & valid
    f1_sum = torch.zeros((), device=scores.device)
    auprc_sum = torch.zeros((), device=scores.device)
    count = 0
    for s, t, v in zip(scores.detach().float(), truth, valid):
        s, t = s[v], t[v]
        wanted = int(t.sum())
        if wanted == 0:
            continue
        top = min(k if k is not None else wanted, s.numel())
        chosen = torch.zeros_like(t)
        chosen[s.topk(top).indices] = True
        hits = (chosen & t).sum()
        f1_sum += 2 * hits / (top + wanted)
        auprc_sum += binary_average_precision(min_max(s), t.long())
        count += 1
    return f1_sum, auprc_sum, count


def _rationale_agreement_compute(f1_sum: Tensor, auprc_sum: Tensor, count: Tensor | int) -> dict[str, Tensor]:
    return {"token_f1": f1_sum / count, "auprc": auprc_sum / count}


def rationale_agreement(
    scores: Tensor, rationales: Tensor, valid: Tensor | None = None, k: int | None = None
) -> dict[str, Tensor]:
    r"""Agreement of token relevance with ground-truth rationale tokens (ERASER).

    Token F1: the top-:math:`k` tokens :math:`P` (default: as many as the sample's rationale
    :math:`R` has) against the rationale, :math:`2|P \cap R| / (|P| + |R|)`; AUPRC: average
    precision (torchmetrics) of the scores of the valid tokens, min-max normalised per sample,
    :math:`\sum_n (R_n - R_{n-1}) P_n` over the distinct thresholds. Both are averaged over
    samples that have a rationale.

    Args:
        scores: token relevance ``[B, T]`` (or ``[B, T, D]``, summed over D).
        rationales: ``[B, T]``, nonzero = rationale token.
        valid: ``[B, T]`` bool, the tokens that count (e.g. not padding, not special); default all.
        k: how many top tokens are predicted; None: the rationale's length.

    Returns:
        ``{"token_f1", "auprc"}``.

    >>> import torch
    >>> scores = torch.tensor([[3e-9, -1e-9, 2e-9, 1e-9]])   # Captum-scale: the ranking is what counts
    >>> out = rationale_agreement(scores, torch.tensor([[1, 0, 0, 1]]))
    >>> round(out["token_f1"].item(), 4), round(out["auprc"].item(), 4)   # hits at ranks 1 and 3
    (0.5, 0.8333)
    """
    return _rationale_agreement_compute(*_rationale_agreement_update(scores, rationales, valid, k))


def _rationale_recall_update(
    scores: Tensor, rationales: Tensor, valid: Tensor | None = None, k: int | None = None
) -> tuple[Tensor, Tensor, Tensor, int]:
    """``(top1_sum, hit_sum, mass_sum, count)`` over samples with at least one rationale token."""
    if scores.dim() == 3:
        scores = scores.sum(dim=-1)
    if scores.shape != rationales.shape:
        raise ValueError(f"token scores {tuple(scores.shape)} and rationales {tuple(rationales.shape)} must have the same shape")
    valid = torch.ones_like(rationales, dtype=torch.bool) if valid is None else valid.to(rationales.device).bool()
    truth = (rationales != 0) & valid
    sums = torch.zeros(3, device=scores.device)
    count = 0
    for s, t, v in zip(scores.detach().float(), truth, valid):
        s, t = s[v], t[v].to(s.device)
        wanted = int(t.sum())
        if wanted == 0:
            continue
        top = s.topk(min(k if k is not None else wanted, s.numel())).indices
        positive = s.clamp(min=0)
        total = positive.sum()
        sums[0] += t[s.argmax()].float()
        sums[1] += t[top].any().float()
        sums[2] += positive[t].sum() / total if total > 0 else 0.0
        count += 1
    return sums[0], sums[1], sums[2], count


def _rationale_recall_compute(top1_sum: Tensor, hit_sum: Tensor, mass_sum: Tensor, count: Tensor | int) -> dict[str, Tensor]:
    return {"top1": top1_sum / count, "hit_at_k": hit_sum / count, "mass": mass_sum / count}


def rationale_recall(
    scores: Tensor, rationales: Tensor, valid: Tensor | None = None, k: int | None = None
) -> dict[str, Tensor]:
    r"""Whether token relevance finds the ground-truth tokens (e.g. the queried pair of a recall prompt).

    Per sample, over its valid tokens: ``top1`` is 1 when the most relevant token is a rationale token;
    ``hit_at_k`` is 1 when one of the :math:`k` most relevant tokens (default: as many as the rationale has)
    is (the top-k share that is, the precision, is :func:`rationale_agreement`'s ``token_f1``); ``mass`` the share of the positive relevance :math:`\sum_{r \in R} \max(s_r, 0) /
    \sum_n \max(s_n, 0)` that lies on them (0 when no token has positive relevance). Each is averaged over
    the samples that have a rationale.

    Args:
        scores: token relevance ``[B, T]`` (or ``[B, T, D]``, summed over D).
        rationales: ``[B, T]``, nonzero = rationale token.
        valid: ``[B, T]`` bool, the tokens that count (e.g. not padding, not special); default all.
        k: how many top tokens ``hit_at_k`` looks at; None: the rationale's length.

    Returns:
        ``{"top1", "hit_at_k", "mass"}``.

    >>> import torch
    >>> out = rationale_recall(torch.tensor([[0.1, 0.6, -0.2, 0.3]]), torch.tensor([[0, 1, 1, 0]]))
    >>> [round(out[key].item(), 4) for key in ("top1", "hit_at_k", "mass")]   # top 2 = {1, 3}; 0.6 of 1.0 positive
    [1.0, 1.0, 0.6]
    >>> rationale_recall(torch.tensor([[0.1, 0.6, -0.2, 0.3]]), torch.tensor([[1, 0, 1, 0]]))["hit_at_k"].item()
    0.0
    """
    return _rationale_recall_compute(*_rationale_recall_update(scores, rationales, valid, k))
