"""Generic Attention-model Explainability (GAE) for PyTorch Lightning, Captum and torchmetrics."""

from lightning_gae.engine.capture import AttentionRecord, AttentionRecorder
from lightning_gae.engine.readout import Explanation
from lightning_gae.engine.token_sets import Streams
from lightning_gae.methods import allow_slow_attention_flow, explain, method_names
from lightning_gae.language.generation import GenerationExplanation, explain_generation
from lightning_gae.language.answers import AnswerExplanation, NextTokenLogits, answer_rows, explain_answers
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens
from lightning_gae import metrics  # noqa: E402  (after explain/modalities, which it builds on)

METHODS: tuple[str, ...] = method_names("attention")
"""The attention methods, read from the recorded attention maps (every ``method=`` of :func:`explain` but the LRP
ones), as the package registers them (:func:`lightning_gae.methods.method_names` lists yours too). Each is described,
with its equation and cost, on the documentation's methods page."""
LRP_METHODS: tuple[str, ...] = method_names("lrp")
"""The methods that propagate relevance through the whole model (LRP) rather than through the attention maps:
AttnLRP (Achtibat et al., ICML 2024) and Transformer Attribution (Chefer, Gur & Wolf, CVPR 2021). :func:`explain`
takes them as ``method=``; LRP is patented for commercial use (see the methods page)."""

__all__ = [
    "AnswerExplanation",
    "AttentionRecord",
    "AttentionRecorder",
    "Explanation",
    "GenerationExplanation",
    "ImageTokens",
    "LRP_METHODS",
    "METHODS",
    "Modality",
    "NextTokenLogits",
    "Streams",
    "TabularTokens",
    "TextTokens",
    "allow_slow_attention_flow",
    "answer_rows",
    "explain",
    "explain_answers",
    "explain_generation",
    "metrics",
]
__version__ = "0.1.0"
