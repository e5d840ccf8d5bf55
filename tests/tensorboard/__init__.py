"""lightning_gae.tensorboard: the summaries and the GAE dashboard plugin."""
