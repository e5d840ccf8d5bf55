"""TensorBoard for GAECallback: the standard tabs done legibly, and the GAE dashboard plugin.

:class:`TensorBoardViews` writes each explanation step (images, Custom Scalars layout, text tables,
histograms, and the raw relevance tensors); :mod:`lightning_gae.tensorboard.plugin` is the "GAE"
tab that reads those tensors back, registered through the ``tensorboard_plugins`` entry point.
"""

from lightning_gae.tensorboard.metadata import PLUGIN_NAME
from lightning_gae.tensorboard.summary import (
    RELEVANCE_SCALARS,
    SetInput,
    TensorBoardViews,
    custom_scalars_layout,
    faithfulness_table,
    sample_tag,
    scalar_tag,
)

__all__ = ["PLUGIN_NAME", "RELEVANCE_SCALARS", "SetInput", "TensorBoardViews", "custom_scalars_layout", "faithfulness_table",
           "sample_tag", "scalar_tag"]
