"""lightning_gae.modalities: token relevance back to pixels, token ids and features."""
