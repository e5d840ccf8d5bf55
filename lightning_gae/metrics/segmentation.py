"""Relevance against ground truth (image masks, rationale tokens, informative features) as ``torchmetrics.Metric`` classes;
their maths in :mod:`lightning_gae.metrics.functional.segmentation`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_gae.metrics._dict_metric import DictMetric
from lightning_gae.metrics.functional.segmentation import (
    _rationale_agreement_compute,
    _rationale_agreement_update,
    _rationale_recall_compute,
    _rationale_recall_update,
    _relevance_segmentation_compute,
    _relevance_segmentation_update,
)
from lightning_gae.modalities import Modality

__all__ = ["RationaleAgreement", "RationaleRecall", "RelevanceSegmentation"]


class RelevanceSegmentation(DictMetric):
    r"""Relevance maps scored as a segmentation of ground-truth masks (the ImageNet-segmentation protocol).

    Each map is min-max normalised per sample and thresholded at its own mean; pixel accuracy and
    mIoU over {background, foreground} come from a confusion matrix over all pixels seen
    (torchmetrics'); ``mean_ap`` is the mean over samples of the average precision of the
    background channel :math:`1 - m` (against the background) and the foreground channel
    :math:`m` (against the foreground) ranked together, as the authors' code scores them. See
    :func:`~lightning_gae.metrics.functional.relevance_segmentation`.

    Args:
        modality: an ``ImageTokens`` (or any modality whose ``to_input`` maps token relevance onto the masks'
            pixels) to turn token relevance ``[B, N]`` into pixels; not needed for
            pixel maps ``[B, H, W]`` or input-shaped maps ``[B, C, H, W]`` (summed over channels).

    Update:
        ``update(attributions, masks)``: ``masks [B, H, W]``, nonzero = foreground.

    Compute:
        ``{"pixel_accuracy", "miou", "mean_ap"}``.

    Normalised, the map below is [1, 0, 1/3, 2/3]; above its mean: pixels 0 and 3 (TP 1, FP 1,
    TN 2), so accuracy 3/4 and mIoU (1/2 + 2/3) / 2. Ranked together, the 8 channel scores give
    precision 2/2, 3/4 and 4/6 at recall 1/2, 3/4 and 1: AP = 1/2 + 1/4 * 3/4 + 1/4 * 4/6.

    >>> import torch
    >>> metric = RelevanceSegmentation()
    >>> metric.update(torch.tensor([[[4.0, 1.0], [2.0, 3.0]]]), torch.tensor([[[1, 0], [0, 0]]]))
    >>> {k: round(v.item(), 4) for k, v in metric.compute().items()}
    {'pixel_accuracy': 0.75, 'miou': 0.5833, 'mean_ap': 0.8542}
    """

    confusion: Tensor
    ap_sum: Tensor
    ap_count: Tensor

    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, modality: Modality | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.modality = modality
        self.add_state("confusion", default=torch.zeros(2, 2, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("ap_sum", default=torch.tensor(0.0, dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state("ap_count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, attributions: Tensor, masks: Tensor) -> None:
        if attributions.dim() == 2:
            if self.modality is None:
                raise ValueError("RelevanceSegmentation got token relevance [B, N]: pass modality=ImageTokens(patch_size=...) "
                                 "to map it onto pixels, or give pixel maps [B, H, W]")
            # to_input only reads the image size, which the masks carry.
            maps = self.modality.to_input(attributions, masks[:, None])
        elif attributions.dim() == 4:
            maps = attributions.float().sum(dim=1)
        else:
            maps = attributions
        confusion, ap_sum, ap_count = _relevance_segmentation_update(maps, masks.to(maps.device))
        self.confusion += confusion.to(self.confusion.device)
        self.ap_sum += ap_sum.to(self.ap_sum)
        self.ap_count += ap_count

    def compute(self) -> dict[str, Tensor]:
        return _relevance_segmentation_compute(self.confusion, self.ap_sum, self.ap_count)


def _top_k(k: int | None) -> int | None:
    """``k`` of the rationale metrics, checked: at least 1, or None for each sample's rationale length."""
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1 (or None for the rationale's length); got {k}")
    return k


class RationaleAgreement(DictMetric):
    r"""Token relevance against ground-truth rationale tokens (ERASER): top-k token F1 and AUPRC.

    Args:
        k: how many top tokens are predicted; None: as many as the sample's rationale has.

    Update:
        ``update(attributions, rationales, valid=None)``: ``attributions [B, T]`` (or ``[B, T, D]``),
        ``rationales [B, T]`` nonzero = rationale, ``valid [B, T]`` the tokens that count (e.g.
        ``TextTokens.removable(batch)``: not padding, not special).

    Compute:
        ``{"token_f1", "auprc"}``, averaged over samples that have a rationale; AUPRC of the scores
        min-max normalised per sample (see :func:`~lightning_gae.metrics.functional.rationale_agreement`).
    """

    f1_sum: Tensor
    auprc_sum: Tensor
    count: Tensor

    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, k: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = _top_k(k)
        self.add_state("f1_sum", default=torch.tensor(0.0, dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state("auprc_sum", default=torch.tensor(0.0, dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, attributions: Tensor, rationales: Tensor, valid: Tensor | None = None) -> None:
        f1_sum, auprc_sum, count = _rationale_agreement_update(attributions, rationales.to(attributions.device),
                                                               None if valid is None else valid.to(attributions.device),
                                                               self.k)
        self.f1_sum += f1_sum.to(self.f1_sum)
        self.auprc_sum += auprc_sum.to(self.auprc_sum)
        self.count += count

    def compute(self) -> dict[str, Tensor]:
        return {k: v.float() for k, v in _rationale_agreement_compute(self.f1_sum, self.auprc_sum, self.count).items()}


class RationaleRecall(DictMetric):
    r"""Whether token relevance finds ground-truth tokens: the most relevant token, the top k, the relevance mass.

    What a recall task asks of an explanation (is the queried pair of the prompt what the answer token's
    relevance points at); the maths in :func:`~lightning_gae.metrics.functional.rationale_recall`.

    Args:
        k: how many top tokens ``hit_at_k`` looks at; None: as many as the sample's rationale has.

    Update:
        ``update(attributions, rationales, valid=None)`` as :class:`RationaleAgreement`.

    Compute:
        ``{"top1", "hit_at_k", "mass"}``, averaged over samples that have a rationale.
    """

    top1_sum: Tensor
    hit_sum: Tensor
    mass_sum: Tensor
    count: Tensor

    higher_is_better = True
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, k: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = _top_k(k)
        for name in ("top1_sum", "hit_sum", "mass_sum"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float32), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, attributions: Tensor, rationales: Tensor, valid: Tensor | None = None) -> None:
        top1, hit, mass, count = _rationale_recall_update(attributions, rationales.to(attributions.device),
                                                          None if valid is None else valid.to(attributions.device),
                                                          self.k)
        self.top1_sum += top1.to(self.top1_sum)
        self.hit_sum += hit.to(self.hit_sum)
        self.mass_sum += mass.to(self.mass_sum)
        self.count += count

    def compute(self) -> dict[str, Tensor]:
        return {k: v.float() for k, v in
                _rationale_recall_compute(self.top1_sum, self.hit_sum, self.mass_sum, self.count).items()}
