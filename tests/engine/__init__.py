"""lightning_gae.engine: capture, token sets, rules, readout, explain() and the lean path with its GPU kernel, each against the dense float64 oracle."""
