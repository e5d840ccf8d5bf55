"""Training recipes (models, data modules) used with ``lightning-gae fit --config configs/...``."""
