"""lightning_gae.lrp: AttnLRP against LXT and Transformer Attribution against the authors' code, through the LRP mode of the capture."""
