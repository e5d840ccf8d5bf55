"""Captum's gradient methods, run on the attributed input tensor by :mod:`lightning_gae.attribution.gradients` (token
ids through their embedding): saliency, input x gradient, integrated gradients and GradientSHAP. Each registers its
Captum class and its default arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_gae.methods.registry import Method, register_method

__all__ = ["GRADIENT_SHAP", "INPUT_X_GRADIENT", "INTEGRATED_GRADIENTS", "SALIENCY", "captum_method",
           "gradient_shap_options", "integrated_gradients_options"]

_IG_STEPS = 32
_IG_ROWS = 256  # interpolated inputs per forward+backward: bounds IG's memory, not its result
_SHAP_SAMPLES = 16
_SHAP_BASELINES = 8
_NO_GRADIENT = "all zero: the explained output has zero gradient with respect to this input"


def captum_method(name: str) -> Callable[[Callable[..., Tensor]], Any]:
    """``forward -> captum.attr.<name>(forward)``: Captum is imported when a gradient method first runs, not with the
    package."""

    def build(forward: Callable[..., Tensor]) -> Any:
        import captum.attr

        return getattr(captum.attr, name)(forward)

    build.__name__ = build.__qualname__ = name
    return build


def integrated_gradients_options(x: Tensor, batch: int) -> dict[str, Any]:
    """IG with 32 steps in chunks of 256 rows."""
    return {"n_steps": _IG_STEPS, "internal_batch_size": max(batch, _IG_ROWS)}


def gradient_shap_options(x: Tensor, batch: int) -> dict[str, Any]:
    """GradientSHAP from seeded Gaussian baselines at the inputs' scale around IG's zero baseline."""
    baselines = torch.randn((_SHAP_BASELINES, *x.shape[1:])) * x.detach().float().std().cpu()
    return {"n_samples": _SHAP_SAMPLES, "baselines": baselines.to(x)}


SALIENCY = register_method(Method(name="saliency", kind="gradient", rule=captum_method("Saliency"),
                                  label="Saliency", all_zero=_NO_GRADIENT, default=True))
INPUT_X_GRADIENT = register_method(Method(name="input_x_gradient", kind="gradient",
                                          rule=captum_method("InputXGradient"), label="Input x gradient",
                                          all_zero=_NO_GRADIENT, signed=True, default=True))
INTEGRATED_GRADIENTS = register_method(Method(name="integrated_gradients", kind="gradient",
                                              rule=captum_method("IntegratedGradients"), label="Integrated gradients",
                                              options=integrated_gradients_options, signed=True, default=True))
GRADIENT_SHAP = register_method(Method(name="gradient_shap", kind="gradient", rule=captum_method("GradientShap"),
                                       label="GradientSHAP", options=gradient_shap_options, signed=True))
