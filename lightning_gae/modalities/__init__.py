"""What a token is in the input: image patches, text tokens, table features (:mod:`~lightning_gae.modalities.tokens`),
and which model input each token set comes from (:mod:`~lightning_gae.modalities.inputs`)."""

from lightning_gae.modalities.inputs import infer_modality, token_set_input, token_set_inputs
from lightning_gae.modalities.tokens import ImageTokens, Modality, TabularTokens, TextTokens

__all__ = ["ImageTokens", "Modality", "TabularTokens", "TextTokens", "infer_modality", "token_set_input",
           "token_set_inputs"]
