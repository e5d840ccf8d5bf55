"""The random floor: seeded uniform relevance, shaped like the rows of a method without a backward (raw attention).
Every method must beat it; it ignores the model."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_gae.methods.registry import Method, register_method

__all__ = ["RANDOM", "random_attribution"]


def random_attribution(like: Tensor, seed: int = 0) -> Tensor:
    """Seeded uniform noise shaped like ``like`` (token relevance or a map): the floor every method must beat.

    The same seed gives the same values on every device (drawn on the CPU, then moved).
    """
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(like.shape, generator=generator).to(like.device)


RANDOM = register_method(Method(name="random", kind="baseline", rule=random_attribution, label="Random",
                                explained_as="raw_attention", default=True))
