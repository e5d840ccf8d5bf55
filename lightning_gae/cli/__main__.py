"""``python -m lightning_gae.cli``: the ``lightning-gae`` command."""

from lightning_gae.cli import main

main()
