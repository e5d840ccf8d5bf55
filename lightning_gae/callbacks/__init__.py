"""Lightning callbacks, one per file, the way ``lightning.pytorch.callbacks`` keeps its own."""

from lightning_gae.callbacks.gae_monitor import GAECallback

__all__ = ["GAECallback"]
