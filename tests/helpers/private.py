"""Every private name of lightning_gae the tests use, imported here and nowhere else.

When one of them moves, this file is the one place to point at its new home. Some are public names of the
package's private modules (``_samples``, ``_stderr``, ``_distributed``), kept under the names the tests used.
"""

from lightning_gae.lrp._ta_attention import Layer as _Layer
from lightning_gae.lrp._ta_attention import layer_abar as _layer_abar
from lightning_gae.callbacks._batch_layout import fit_to_forward as _fit_to_forward
from lightning_gae.callbacks._distributed import random_rows as _random_rows
from lightning_gae.callbacks._failures import Failures as _Failures
from lightning_gae.callbacks._distributed import subset_part as _subset_part
from lightning_gae.callbacks.samples import balanced_choice as _balanced_choice
from lightning_gae.callbacks._health import Health as _Health
from lightning_gae.callbacks._health import health_flags as _health_flags
from lightning_gae.engine.forward import _attended
from lightning_gae.engine.lean import _chunks, _LeanAttention
from lightning_gae.metrics.stderr import value_and_stderr as _value_and_stderr
from lightning_gae.tensorboard.views import MAX_IMAGE_SIDE as _MAX_IMAGE_SIDE

__all__ = ["_Failures", "_Health", "_MAX_IMAGE_SIDE", "_Layer", "_LeanAttention", "_attended", "_balanced_choice", "_chunks",
           "_fit_to_forward", "_health_flags", "_layer_abar", "_random_rows", "_subset_part", "_value_and_stderr"]
