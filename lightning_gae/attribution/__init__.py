"""Attributions in Captum's shape: this library's attention methods as Captum classes, Captum's methods on its inputs.

:mod:`~lightning_gae.attribution.attention` holds the Captum classes (``GenericAttention``, ...);
:mod:`~lightning_gae.attribution.gradients` runs Captum's gradient methods on a tensor, a tuple or
keyword inputs (token ids through the embedding layer); :func:`attribute` gives any method by name
in the form the faithfulness metrics score.
"""

from lightning_gae.attribution.attention import (
    AttentionAttribution,
    AttentionFlow,
    AttentionGradCAM,
    AttentionRollout,
    AttnLRP,
    GenericAttention,
    RawAttention,
    TransformerAttribution,
)
from lightning_gae.attribution.gradients import CAPTUM_METHODS
from lightning_gae.attribution.methods import ATTRIBUTION_METHODS, attribute

__all__ = [
    "ATTRIBUTION_METHODS",
    "AttentionAttribution",
    "AttentionFlow",
    "AttentionGradCAM",
    "AttentionRollout",
    "AttnLRP",
    "CAPTUM_METHODS",
    "GenericAttention",
    "RawAttention",
    "TransformerAttribution",
    "attribute",
]
