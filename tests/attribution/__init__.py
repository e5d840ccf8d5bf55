"""lightning_gae.attribution: our methods as Captum classes, inside Captum's own tools."""
