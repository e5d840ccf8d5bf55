"""lightning_gae.metrics: by-hand cases, the class == functional == oracle harness, torchmetrics plumbing."""
