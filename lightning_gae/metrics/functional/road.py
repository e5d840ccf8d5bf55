"""ROAD (Rong et al., ICML 2022): the perturbation test with removed pixels imputed, so the mask's shape tells nothing.

The curve of :func:`~lightning_gae.metrics.functional.perturbation_auc` (the same fractions, ranking, score and
protocols), with the units removed by the modality's :meth:`~lightning_gae.Modality.impute`: images by
:func:`~lightning_gae.metrics.functional.noisy_linear_imputation` in [0, 1] space; tokens and features by their
modality's removal (mask ids, feature means), where ROAD's curve is the perturbation test's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_gae._structures import ClassTarget as Target
from lightning_gae.metrics.functional._removal import (
    Order,
    Protocol,
    Score,
    check_fractions,
    perturbed_scores,
    ranked_masks,
    removal_counts,
    unit_ranking,
    unorderable,
)
from lightning_gae.metrics.functional.imputation import noisy_linear_imputation
from lightning_gae.metrics.functional.perturbation import PERTURBATION_FRACTIONS
from lightning_gae.modalities.tokens import Modality

__all__ = ["ROAD_NOISE", "check_road", "road_auc", "road_curve", "road_curves"]

ROAD_NOISE = 0.01
"""ROAD's noise on imputed pixels: its standard deviation in [0, 1] space."""


def check_road(fractions: Sequence[float], noise: float) -> None:
    """Raise, naming the argument, unless ``fractions`` increase within [0, 1) and ``noise >= 0``."""
    check_fractions(fractions, "fractions")
    if max(float(f) for f in fractions) >= 1:
        raise ValueError(f"fractions must stay below 1 for ROAD (the imputation infers removed pixels from kept ones); "
                         f"got {list(fractions)}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0 (the standard deviation of the noise on imputed pixels); got {noise}")


def _imputation(noise: float, seed: int) -> Callable[[Tensor, Tensor], Tensor]:
    """Noisy linear imputation drawing its noise from a generator seeded with ``seed`` (one per device)."""
    generators: dict[torch.device, torch.Generator] = {}

    def impute(images: Tensor, mask: Tensor) -> Tensor:
        if images.device not in generators:
            generators[images.device] = torch.Generator(images.device).manual_seed(seed)
        return noisy_linear_imputation(images, mask, noise, generators[images.device])

    return impute


def road_curves(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    noise: float = ROAD_NOISE,
    seed: int = 0,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """``[B, S]``: each sample's own score at every step of ROAD's curve (see :func:`road_auc`)."""
    check_road(fractions, noise)
    scores, removable = unit_ranking(modality, inputs, attributions)
    masks = ranked_masks(scores, removable, removal_counts(fractions, removable), order)
    impute = _imputation(noise, seed)
    curves, _ = perturbed_scores(forward_fn, modality, inputs, masks, target, score, max_batch=max_batch,
                                 protocol=protocol, removal=lambda rows, drop: modality.impute(rows, drop, impute))
    return curves.T.masked_fill(unorderable(scores, removable)[:, None], float("nan"))


def road_curve(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    noise: float = ROAD_NOISE,
    seed: int = 0,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    """The mean score ``[S]`` over samples at every step of ROAD's curve (see :func:`road_auc`)."""
    return road_curves(forward_fn, modality, inputs, attributions, target, order, fractions, score, noise, seed,
                       max_batch, protocol).mean(dim=0)


def road_auc(
    forward_fn: Callable[..., Any],
    modality: Modality,
    inputs: Any,
    attributions: Tensor,
    target: Target = None,
    order: Order = "positive",
    fractions: Sequence[float] = PERTURBATION_FRACTIONS,
    score: Score = "accuracy",
    noise: float = ROAD_NOISE,
    seed: int = 0,
    max_batch: int = 256,
    protocol: Protocol = "target",
) -> Tensor:
    r"""ROAD (Rong et al., ICML 2022): the perturbation test's area with the removed units imputed.

    For each fraction :math:`f_s` the top :math:`\lfloor f_s n_b \rfloor` of sample :math:`b`'s removable units
    are removed, most relevant first (``order="positive"``, ROAD's MoRF: lower is better) or least relevant first
    (``"negative"``, LeRF: higher is better), as :func:`~lightning_gae.metrics.functional.perturbation_auc` removes
    them, but by :meth:`~lightning_gae.Modality.impute`: an image's removed pixels (or patches) are
    :func:`~lightning_gae.metrics.functional.noisy_linear_imputation` of the kept ones in [0, 1] space, plus noise
    of standard deviation ``noise``; tokens and features are removed the modality's way. With :math:`c_s` the mean
    score, :math:`100 \sum_s \tfrac{1}{2}(c_s + c_{s+1})(f_{s+1} - f_s)`.

    The noise comes from a generator seeded with ``seed`` at every call, so a batch scores the same every time and
    every method of it meets the same noise. Ties keep index order (ROAD's code breaks them with 1e-4 noise).

    Args:
        fractions: increasing fractions in [0, 1) (default 0, 0.1, ..., 0.9): an image keeps a pixel to impute from.
        noise: the standard deviation of the noise on imputed pixels, in [0, 1] space (ROAD's 0.01).
        seed: seeds the noise.
        others: as in :func:`~lightning_gae.metrics.functional.perturbation_auc`.

    Returns:
        A scalar tensor; with the default fractions and ``score="accuracy"``, in [0, 90].

    Example (on a table ROAD removes features as the perturbation test does):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[1.0, 0.5, 0.25]])
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> round(road_auc(model, modality, x, x, fractions=(0, 1 / 3, 2 / 3)).item(), 2)
    16.67
    """
    curves = road_curves(forward_fn, modality, inputs, attributions, target, order, fractions, score, noise, seed,
                         max_batch, protocol)
    x = torch.tensor([float(f) for f in fractions], dtype=curves.dtype, device=curves.device)
    return torch.trapezoid(curves.mean(dim=0), x) * 100.0
