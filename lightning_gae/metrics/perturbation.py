"""Perturbation protocols as ``torchmetrics.Metric`` classes (maths in ``functional/perturbation.py``).

Every class names its states after what they hold (the protocol, and the score and order where
they vary), so a ``MetricCollection`` never merges two metrics that compute different things into
one compute group: torchmetrics merges metrics whose states have the same names and equal values
after the first update, and then updates only the first of them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_gae.metrics.functional.perturbation import (
    ERASER_BINS,
    PERTURBATION_FRACTIONS,
    RISE_FRACTIONS,
    Order,
    Protocol,
    Score,
    Target,
    _abpc_per_sample,
    _deletion_curves,
    _eraser_per_sample,
    _mean_compute,
    _perturbation_auc_compute,
    _perturbation_curves,
    check_fractions,
    check_protocol,
)
from lightning_gae.metrics.functional.road import ROAD_NOISE, check_road, road_curves
from lightning_gae.modalities.tokens import Modality

__all__ = [
    "ABPC",
    "AOPC",
    "Comprehensiveness",
    "DeletionAUC",
    "InsertionAUC",
    "NegativePerturbationAUC",
    "PerturbationAUC",
    "PositivePerturbationAUC",
    "ROAD",
    "ROADLeRF",
    "Sufficiency",
]


def _empty(attributions: Tensor) -> bool:
    """An update with no sample (the last batch of a filtered loader, say): nothing to add, and nothing to fail."""
    return isinstance(attributions, Tensor) and attributions.dim() > 0 and attributions.shape[0] == 0


class _ModelMetric(Metric):
    """A metric that runs a model on perturbed inputs; the model is used, never owned."""

    forward_fn: Callable[..., Any]
    is_differentiable = False
    full_state_update = False

    def __init__(self, forward_fn: Callable[..., Any], modality: Modality, max_batch: int = 256,
                 protocol: Protocol = "target", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(forward_fn):
            raise ValueError(f"forward_fn must be the model or a callable returning logits; got {type(forward_fn).__name__}")
        if not isinstance(modality, Modality):
            raise ValueError("modality must be an ImageTokens, TextTokens or TabularTokens (it says how inputs are removed); "
                             f"got {type(modality).__name__}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1; got {max_batch}")
        check_protocol(protocol)
        # Kept out of the module tree: moving, saving or syncing the metric must not touch the model.
        self.__dict__["forward_fn"] = forward_fn
        self.modality = modality
        self.max_batch = max_batch
        self.protocol = protocol

    def __deepcopy__(self, memo: dict[int, Any]) -> _ModelMetric:
        # clone(), MetricTracker and MetricCollection.clone deep-copy the metric: the copy must
        # score the same model, not a private copy of its weights.
        memo[id(self.forward_fn)] = self.forward_fn
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return new


class _CurveMetric(_ModelMetric):
    plot_lower_bound = 0.0
    _scale: ClassVar[float] = 1.0

    def _curve_states(self, name: str, fractions: Sequence[float]) -> None:
        check_fractions(fractions, "fractions")
        self.fractions = tuple(float(f) for f in fractions)
        self._sum_name, self._count_name = f"{name}_curve_sum", f"{name}_count"
        self.add_state(self._sum_name, default=torch.zeros(len(self.fractions)), dist_reduce_fx="sum")
        self.add_state(self._count_name, default=torch.tensor(0), dist_reduce_fx="sum")

    def _curves(self, inputs: Any, attributions: Tensor, target: Target) -> Tensor:
        """``[B, S]``: each sample's own curve."""
        raise NotImplementedError

    def update(self, inputs: Any, attributions: Tensor, target: Target = None) -> None:
        if _empty(attributions):
            return
        curves = self._curves(inputs, attributions, target)
        total = getattr(self, self._sum_name)
        setattr(self, self._sum_name, total + curves.sum(dim=0).to(total))
        setattr(self, self._count_name, getattr(self, self._count_name) + curves.shape[0])

    def per_sample_states(self, inputs: Any, attributions: Tensor, target: Target = None) -> dict[str, Tensor]:
        """What each sample alone would add to every state, ``{state: [B, ...]}``, from one batched pass.

        ``update`` adds their sum over the batch; the metric is left unchanged. Standard errors over
        samples are computed from these (see :mod:`lightning_gae.compare`).
        """
        curves = self._curves(inputs, attributions, target)
        total, count = getattr(self, self._sum_name), getattr(self, self._count_name)
        return {self._sum_name: curves.to(total),
                self._count_name: torch.ones(curves.shape[0], dtype=count.dtype, device=count.device)}

    def compute(self) -> Tensor:
        return _perturbation_auc_compute(getattr(self, self._sum_name), getattr(self, self._count_name),
                                         self.fractions, self._scale).float()

    def per_sample_values(self, states: Mapping[str, Tensor]) -> Tensor:
        """Each sample's own value ``[n]`` from the rows of ``per_sample_states()`` (stacked ``{state: [n, ...]}``).

        The area is linear in the curve, so the metric over the samples is the mean of these, and
        their standard deviation over ``sqrt(n)`` is its standard error.
        """
        curves = states[self._sum_name].double() / states[self._count_name].double().reshape(-1, 1)
        x = torch.tensor(self.fractions, dtype=torch.float64, device=curves.device)
        return torch.trapezoid(curves, x, dim=-1) * self._scale

    def curve(self) -> Tensor:
        """The mean score at each fraction ``[S]`` over every sample seen so far (by every process, as ``compute``)."""
        # compute() syncs the states across processes; so must the curve it integrates.
        synced_already = self._is_synced
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync and not synced_already,
                               should_unsync=self._should_unsync and not synced_already):
            return (getattr(self, self._sum_name) / getattr(self, self._count_name)).float()

    def plot(self, val: Tensor | Sequence[Tensor] | None = None, ax: Any = None) -> Any:
        """Plot the value (or a sequence of values) with matplotlib; returns ``(figure, axes)``."""
        return self._plot(val, ax)


class PerturbationAUC(_CurveMetric):
    r"""Perturbation test of Chefer et al.: remove units in relevance order, area under the accuracy curve.

    For each fraction :math:`f_s` (default 0, 10, ..., 90%) the top :math:`\lfloor f_s n_b \rfloor`
    of sample :math:`b`'s :math:`n_b` removable units (pixels, patches, tokens, features: the
    ``modality``'s) are removed, most relevant first (:class:`PositivePerturbationAUC`: lower is
    better) or least relevant first (:class:`NegativePerturbationAUC`: higher is better). With
    :math:`c_s` the mean score over samples,

    .. math:: \mathrm{AUC} = 100 \sum_s \tfrac{1}{2}(c_s + c_{s+1})(f_{s+1} - f_s)

    (so at most 90 with the default fractions). ``PerturbationAUC(..., order=...)`` builds the
    class of that order.

    Args:
        forward_fn: the model (put in eval mode while scoring, then restored) or a callable
            returning logits ``[B, C]``; called as ``f(x)``, ``f(*x)`` or ``f(**x)`` like ``explain``.
            A clone of the metric shares it.
        modality: ``ImageTokens`` (black pixels in [0, 1] space, normalised by its mean/std; or
            patches), ``TextTokens`` (mask/pad ids or the attention mask; special tokens kept) or
            ``TabularTokens`` (feature means).
        order: ``"positive"`` or ``"negative"``; only needed when building ``PerturbationAUC`` itself.
        fractions: increasing fractions in [0, 1].
        score: ``"accuracy"`` (the prediction still equals the reference class) or the scored
            class's ``"probability"``.
        protocol: ``"target"`` (score the class given as ``target``, the prediction for None) or
            ``"predicted"`` (score the unperturbed prediction, checked against the labels given as
            ``target``); :data:`~lightning_gae.metrics.functional.perturbation.PROTOCOLS`.
        max_batch: at most this many perturbed inputs per forward pass.
        kwargs: ``torchmetrics.Metric`` options (``sync_on_compute``, ...).

    Update:
        ``update(inputs, attributions, target=None)``: ``attributions`` token relevance ``[B, N]``
        or an input-shaped map (Captum's convention); ``target`` as ``protocol`` says.

    Example (class 1 while the features sum above 0.9):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[1.0, 0.5, 0.25]])
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> metric = PerturbationAUC(model, modality, order="positive", fractions=(0, 1 / 3, 2 / 3))
    >>> type(metric).__name__, metric.higher_is_better
    ('PositivePerturbationAUC', False)
    >>> metric.update(x, x)     # the features as their own relevance: "a" goes first and flips class 1
    >>> metric.curve(), round(metric.compute().item(), 2)
    (tensor([1., 0., 0.]), 16.67)
    """

    order: ClassVar[Order]
    plot_upper_bound = 100.0
    _scale = 100.0  # the area in percent points (at most 90 with the default fractions)

    def __new__(cls, *args: Any, **kwargs: Any) -> PerturbationAUC:
        if cls is PerturbationAUC:
            order = kwargs.get("order", args[2] if len(args) > 2 else "positive")
            if order not in _BY_ORDER:
                raise ValueError(f"order={order!r}; use 'positive' (most relevant removed first) or 'negative'")
            cls = _BY_ORDER[order]
        return super().__new__(cls)

    def __init__(
        self,
        forward_fn: Callable[..., Any],
        modality: Modality,
        order: Order | None = None,
        fractions: Sequence[float] = PERTURBATION_FRACTIONS,
        score: Score = "accuracy",
        max_batch: int = 256,
        protocol: Protocol = "target",
        **kwargs: Any,
    ) -> None:
        super().__init__(forward_fn, modality, max_batch, protocol, **kwargs)
        if order is not None and order != self.order:
            raise ValueError(f"{type(self).__name__} removes in {self.order} order; got order={order!r} "
                             f"(use PerturbationAUC(..., order={order!r}) or leave order out)")
        if score not in ("accuracy", "probability"):
            raise ValueError(f"score={score!r}; use 'accuracy' or 'probability'")
        self.score = score
        self._curve_states(f"{self.order}_{score}_{protocol}", fractions)

    def _curves(self, inputs: Any, attributions: Tensor, target: Target) -> Tensor:
        return _perturbation_curves(self.forward_fn, self.modality, inputs, attributions, target, self.order,
                                    self.fractions, self.score, self.max_batch, self.protocol)


class PositivePerturbationAUC(PerturbationAUC):
    """:class:`PerturbationAUC`, most relevant units removed first: a faithful explanation loses accuracy fast."""

    order = "positive"
    higher_is_better = False


class NegativePerturbationAUC(PerturbationAUC):
    """:class:`PerturbationAUC`, least relevant units removed first: a faithful explanation keeps accuracy."""

    order = "negative"
    higher_is_better = True


_BY_ORDER: dict[str, type[PerturbationAUC]] = {"positive": PositivePerturbationAUC, "negative": NegativePerturbationAUC}


class ROAD(_CurveMetric):
    r"""ROAD (Rong et al., ICML 2022), most relevant first (MoRF): the perturbation test with removed pixels imputed.

    The curve and area of :class:`PositivePerturbationAUC` (fractions 0, 10, ..., 90%, accuracy, ×100; lower is
    better), with the units removed by the modality's :meth:`~lightning_gae.Modality.impute`: an image's pixels (or
    patches) by :func:`~lightning_gae.metrics.functional.noisy_linear_imputation` of the kept ones in [0, 1] space
    plus noise, so that the shape of what was removed does not tell the class; tokens and features the modality's
    way, where ROAD equals the perturbation test. :class:`ROADLeRF` removes the least relevant first.

    Args:
        noise: the standard deviation of the noise on imputed pixels in [0, 1] space (ROAD's 0.01).
        seed: seeds the noise at every update: a batch scores the same every time, every method meeting the same noise.
        fractions: increasing, within [0, 1) (an image keeps a pixel to impute from).
        others: as in :class:`PerturbationAUC`.
    """

    order: ClassVar[Order] = "positive"
    higher_is_better = False
    plot_upper_bound = 100.0
    _scale = 100.0

    def __init__(
        self,
        forward_fn: Callable[..., Any],
        modality: Modality,
        fractions: Sequence[float] = PERTURBATION_FRACTIONS,
        score: Score = "accuracy",
        noise: float = ROAD_NOISE,
        seed: int = 0,
        max_batch: int = 256,
        protocol: Protocol = "target",
        **kwargs: Any,
    ) -> None:
        super().__init__(forward_fn, modality, max_batch, protocol, **kwargs)
        check_road(fractions, noise)
        if score not in ("accuracy", "probability"):
            raise ValueError(f"score={score!r}; use 'accuracy' or 'probability'")
        self.score, self.noise, self.seed = score, float(noise), int(seed)
        self._curve_states(f"road_{self.order}_{score}_{protocol}", fractions)

    def _curves(self, inputs: Any, attributions: Tensor, target: Target) -> Tensor:
        return road_curves(self.forward_fn, self.modality, inputs, attributions, target, self.order, self.fractions,
                           self.score, self.noise, self.seed, self.max_batch, self.protocol)


class ROADLeRF(ROAD):
    """:class:`ROAD`, least relevant units imputed first (LeRF): a faithful explanation keeps the accuracy; higher is
    better."""

    order = "negative"
    higher_is_better = True


class DeletionAUC(_CurveMetric):
    r"""Deletion (RISE): area under the scored class's probability as the most relevant units are removed first.

    :math:`\sum_s \tfrac{1}{2}(p_s + p_{s+1})(f_{s+1} - f_s)` with :math:`p_s` the mean probability
    once the top :math:`\lfloor f_s n_b \rfloor` units are removed; fractions default to 0, 5, ...,
    100%, so the area is in [0, 1]; lower is better. Arguments (``protocol`` included) and
    ``update(inputs, attributions, target=None)`` as in :class:`PerturbationAUC`.
    """

    higher_is_better = False
    plot_upper_bound = 1.0
    _insertion = False

    def __init__(self, forward_fn: Callable[..., Any], modality: Modality, fractions: Sequence[float] = RISE_FRACTIONS,
                 max_batch: int = 256, protocol: Protocol = "target", **kwargs: Any) -> None:
        super().__init__(forward_fn, modality, max_batch, protocol, **kwargs)
        self._curve_states(f"{'insertion' if self._insertion else 'deletion'}_{protocol}", fractions)

    def _curves(self, inputs: Any, attributions: Tensor, target: Target) -> Tensor:
        return _deletion_curves(self.forward_fn, self.modality, inputs, attributions, target, self.fractions,
                                self.max_batch, insertion=self._insertion, protocol=self.protocol)


class InsertionAUC(DeletionAUC):
    r"""Insertion (RISE): area under the scored class's probability as the most relevant units are put back first.

    The curve starts from the modality's ``blurred`` input (a Gaussian blur for images; every
    removable token or feature removed otherwise) and puts the top :math:`\lfloor f_s n_b \rfloor`
    units back at step :math:`s`; the area as in :class:`DeletionAUC`; higher is better.
    """

    higher_is_better = True
    _insertion = True


class _MeanMetric(_ModelMetric):
    """A mean over samples of one value per sample: states ``<name>_total`` and ``<name>_count``."""

    def _mean_states(self, name: str) -> None:
        self._total_name, self._count_name = f"{name}_total", f"{name}_count"
        self.add_state(self._total_name, default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state(self._count_name, default=torch.tensor(0), dist_reduce_fx="sum")

    def _per_sample(self, inputs: Any, attributions: Tensor, target: Target) -> Tensor:
        """``[B]``: each sample's own value."""
        raise NotImplementedError

    def update(self, inputs: Any, attributions: Tensor, target: Target = None) -> None:
        if _empty(attributions):
            return
        values = self._per_sample(inputs, attributions, target)
        state = getattr(self, self._total_name)
        setattr(self, self._total_name, state + values.sum().to(state))
        setattr(self, self._count_name, getattr(self, self._count_name) + values.numel())

    def per_sample_states(self, inputs: Any, attributions: Tensor, target: Target = None) -> dict[str, Tensor]:
        """What each sample alone would add to every state, ``{state: [B]}``, from one batched pass
        (``update`` adds their sum; the metric is left unchanged)."""
        values = self._per_sample(inputs, attributions, target)
        total, count = getattr(self, self._total_name), getattr(self, self._count_name)
        return {self._total_name: values.to(total),
                self._count_name: torch.ones(values.numel(), dtype=count.dtype, device=count.device)}

    def compute(self) -> Tensor:
        return _mean_compute(getattr(self, self._total_name), getattr(self, self._count_name)).float()

    def plot(self, val: Tensor | Sequence[Tensor] | None = None, ax: Any = None) -> Any:
        """Plot the value (or a sequence of values) with matplotlib; returns ``(figure, axes)``."""
        return self._plot(val, ax)


class ABPC(_MeanMetric):
    r"""ABPC, the area between the perturbation curves: negative minus positive perturbation AUC.

    The figure AttnLRP (Achtibat et al., ICML 2024) reports. With :math:`c^-_s` and :math:`c^+_s`
    the mean score once the least / the most relevant :math:`\lfloor f_s n_b \rfloor` of sample
    :math:`b`'s removable units are removed (the curves of :class:`NegativePerturbationAUC` and
    :class:`PositivePerturbationAUC`),

    .. math:: \mathrm{ABPC} = 100 \sum_s \tfrac{1}{2}\big[(c^-_s - c^+_s) + (c^-_{s+1} - c^+_{s+1})\big](f_{s+1} - f_s)
              = \mathrm{AUC}^- - \mathrm{AUC}^+,

    higher is better; in [-90, 90] with the default fractions and ``score="accuracy"``. Each update
    runs both orders through one pass of the engine
    (:func:`~lightning_gae.metrics.functional.abpc`). The states are the sum over samples of each
    sample's own ABPC and their count (the area is linear in the curves, so their mean is the ABPC of
    the mean curves), which gives ``per_sample_states()`` and standard errors. Arguments
    (``fractions``, ``score``, ``protocol``, ``max_batch``) and ``update(inputs, attributions,
    target=None)`` as in :class:`PerturbationAUC`.

    Example (class 1 while the features sum above 0.9):

    >>> import torch
    >>> from lightning_gae import TabularTokens
    >>> model = lambda x: torch.stack([torch.full((len(x),), 0.9), x.sum(dim=1)], dim=1)
    >>> x = torch.tensor([[1.0, 0.5, 0.25]])
    >>> modality = TabularTokens(["a", "b", "c"], prefix_tokens=0, means=[0.0, 0.0, 0.0])
    >>> metric = ABPC(model, modality, fractions=(0, 1 / 3, 2 / 3))
    >>> metric.update(x, x)     # negative AUC 66.67 minus positive AUC 16.67
    >>> round(metric.compute().item(), 2), metric.higher_is_better
    (50.0, True)
    """

    higher_is_better = True
    plot_lower_bound = -100.0
    plot_upper_bound = 100.0

    def __init__(
        self,
        forward_fn: Callable[..., Any],
        modality: Modality,
        fractions: Sequence[float] = PERTURBATION_FRACTIONS,
        score: Score = "accuracy",
        max_batch: int = 256,
        protocol: Protocol = "target",
        **kwargs: Any,
    ) -> None:
        super().__init__(forward_fn, modality, max_batch, protocol, **kwargs)
        check_fractions(fractions, "fractions")
        if score not in ("accuracy", "probability"):
            raise ValueError(f"score={score!r}; use 'accuracy' or 'probability'")
        self.fractions = tuple(float(f) for f in fractions)
        self.score = score
        self._mean_states(f"abpc_{score}_{protocol}")

    def _per_sample(self, inputs: Any, attributions: Tensor, target: Target) -> Tensor:
        return _abpc_per_sample(self.forward_fn, self.modality, inputs, attributions, target, self.fractions,
                                self.score, self.max_batch, self.protocol)

    def per_sample_values(self, states: Mapping[str, Tensor]) -> Tensor:
        """Each sample's own ABPC ``[n]`` from the rows of ``per_sample_states()``; their mean is
        the metric and their standard deviation over ``sqrt(n)`` its standard error."""
        return states[self._total_name].double() / states[self._count_name].double()


class _EraserMetric(_MeanMetric):
    plot_lower_bound = -1.0
    plot_upper_bound = 1.0
    _name: ClassVar[str]
    _keep_only = False
    _with_zero = False

    def __init__(self, forward_fn: Callable[..., Any], modality: Modality, bins: Sequence[float] = ERASER_BINS,
                 max_batch: int = 256, protocol: Protocol = "target", **kwargs: Any) -> None:
        super().__init__(forward_fn, modality, max_batch, protocol, **kwargs)
        check_fractions(bins, "bins")
        self.bins = tuple(float(b) for b in bins)
        self._mean_states(f"{self._name}_{protocol}")

    def _per_sample(self, inputs: Any, attributions: Tensor, target: Target) -> Tensor:
        return _eraser_per_sample(self.forward_fn, self.modality, inputs, attributions, target, self.bins,
                                  keep_only=self._keep_only, with_zero=self._with_zero, max_batch=self.max_batch,
                                  protocol=self.protocol)


class Comprehensiveness(_EraserMetric):
    r"""ERASER comprehensiveness: mean over bins of :math:`p(x) - p(x \setminus r_k)`; higher is better.

    :math:`r_k` is the top :math:`k` share (bins 1, 5, 10, 20, 50%; at least one unit) of the
    removable units by relevance, :math:`p` the scored class's probability. Arguments
    (``protocol`` included) and ``update(inputs, attributions, target=None)`` as in
    :class:`PerturbationAUC`, with ``bins``.
    """

    higher_is_better = True
    _name = "comprehensiveness"


class Sufficiency(_EraserMetric):
    r"""ERASER sufficiency: mean over bins of :math:`p(x) - p(r_k)`, only the top units kept; lower is better.

    As :class:`Comprehensiveness`.
    """

    higher_is_better = False
    _name = "sufficiency"
    _keep_only = True


class AOPC(_EraserMetric):
    r"""AOPC (Samek et al.), most relevant first, on ERASER's bins, the unperturbed step included.

    :math:`\frac{1}{|K|+1}\sum_{k \in \{0\} \cup K} p(x) - p(x \setminus r_k)`; higher is better.
    As :class:`Comprehensiveness`.
    """

    higher_is_better = True
    _name = "aopc"
    _with_zero = True
