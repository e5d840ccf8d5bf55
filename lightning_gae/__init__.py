"""Generic Attention-model Explainability (GAE) for PyTorch Lightning, Captum and torchmetrics."""

from lightning_gae.engine.capture import AttentionRecord, AttentionRecorder
from lightning_gae.engine.explain import LRP_METHODS, METHODS, allow_slow_attention_flow, explain
from lightning_gae.engine.readout import Explanation
from lightning_gae.engine.token_sets import Streams
from lightning_gae.language.generation import GenerationExplanation, explain_generation
from lightning_gae.language.answers import AnswerExplanation, NextTokenLogits, answer_rows, explain_answers
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens
from lightning_gae import metrics  # noqa: E402  (after explain/modalities, which it builds on)

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
