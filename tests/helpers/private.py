"""Every private name of lightning_gae the tests use, imported here and nowhere else.

When one of them moves, this file is the one place to point at its new home. The statements are
those the tests used to write where they needed the names.
"""

from lightning_gae.callbacks.gae_monitor import _balanced_choice
from lightning_gae.compare import _value_and_stderr
from lightning_gae.explain import _explain
from lightning_gae.explain import _attended, _relevance_row
from lightning_gae.tensorboard.summary import _MAX_IMAGE_SIDE, _bounded

__all__ = ["_MAX_IMAGE_SIDE", "_attended", "_balanced_choice", "_bounded", "_explain", "_relevance_row",
           "_value_and_stderr"]
