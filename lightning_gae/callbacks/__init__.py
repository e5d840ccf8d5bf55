"""Lightning callbacks: GAECallback and the option groups it takes."""

from lightning_gae.callbacks.gae_monitor import GAECallback
from lightning_gae.options import BatchOptions, DisplayOptions, EngineOptions, FaithfulnessOptions, RegionOptions

__all__ = ["BatchOptions", "DisplayOptions", "EngineOptions", "FaithfulnessOptions", "GAECallback", "RegionOptions"]
