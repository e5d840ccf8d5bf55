"""The classes' former module, kept so that imports and configs naming ``lightning_gae.metrics.agreement`` still work.

They live in :mod:`lightning_gae.metrics.segmentation` and :mod:`lightning_gae.metrics.stability`, named after their
functional forms.
"""

from lightning_gae.metrics.segmentation import RationaleAgreement, RelevanceSegmentation
from lightning_gae.metrics.stability import ExplanationStability

__all__ = ["ExplanationStability", "RationaleAgreement", "RelevanceSegmentation"]
