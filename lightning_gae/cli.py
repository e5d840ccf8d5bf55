"""The ``lightning-gae`` command.

``lightning-gae fit|validate|test|predict ...`` is Lightning's own ``LightningCLI`` (models and data
modules chosen by ``class_path`` in a YAML config); ``lightning-gae bench`` times ``explain``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def _lightning_cli(args: Sequence[str] | None) -> None:
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    class GAECLI(LightningCLI):
        def after_fit(self) -> None:
            # Where to look: TensorBoard finds every run and version below the save_dir.
            roots = {getattr(lg, "save_dir", None) for lg in self.trainer.loggers}
            for root in sorted(r for r in roots if r):
                print(f"tensorboard --logdir {root}")

    GAECLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        # None lets LightningCLI read sys.argv itself; explicit args are for calls from Python.
        args=None if args is None else list(args),
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "bench":
        from lightning_gae.bench import main as bench_main

        bench_main(args[1:])
        return
    _lightning_cli(None if argv is None else args)


if __name__ == "__main__":
    main()
