"""Generic Attention-model Explainability (GAE) for PyTorch Lightning, Captum and torchmetrics."""

from lightning_gae.capture import AttentionRecord, AttentionRecorder
from lightning_gae.explain import METHODS, Explanation, explain

__all__ = ["AttentionRecord", "AttentionRecorder", "Explanation", "METHODS", "explain"]
__version__ = "0.1.0"
