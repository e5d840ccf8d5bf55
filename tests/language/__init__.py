"""lightning_gae.language: a causal LM's answer tokens and generated tokens explained."""
