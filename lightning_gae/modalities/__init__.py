"""What a token is in the input: the :class:`Modality` interface (:mod:`~lightning_gae.modalities.tokens`), one module
per modality (:mod:`~lightning_gae.modalities.image`, :mod:`~lightning_gae.modalities.text`,
:mod:`~lightning_gae.modalities.tabular`), regions of interest (:mod:`~lightning_gae.modalities.regions`) and which
model input each token set comes from (:mod:`~lightning_gae.modalities.inputs`)."""

from lightning_gae.modalities.image import ImageTokens
from lightning_gae.modalities.inputs import infer_modality, token_set_input, token_set_inputs
from lightning_gae.modalities.tabular import TabularTokens
from lightning_gae.modalities.text import TextTokens
from lightning_gae.modalities.tokens import MethodMap, Modality, render_map

__all__ = ["ImageTokens", "MethodMap", "Modality", "TabularTokens", "TextTokens", "infer_modality", "render_map",
           "token_set_input", "token_set_inputs"]
