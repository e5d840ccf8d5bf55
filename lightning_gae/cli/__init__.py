"""The ``lightning-gae`` command.

``lightning-gae fit|validate|test|predict ...`` is Lightning's own ``LightningCLI`` (models and data
modules chosen by ``class_path`` in a YAML config); ``lightning-gae compare`` scores GAE, its
attention baselines and Captum's gradient methods on a trained checkpoint. What an explanation costs is measured
by the repository's ``python -m benchmarks.bench`` (it measures the repository's recipes, which the wheel does not ship).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from lightning_gae.cli.compare_command import COMPARE_METRICS, compare_main, configured
from lightning_gae.cli.errors import DEBUG_VARIABLE, CommandLineError, check_yaml, debugging
from lightning_gae.cli.lightning_commands import lightning_cli

__all__ = ["COMPARE_METRICS", "DEBUG_VARIABLE", "CommandLineError", "compare_main", "configured", "main"]


def _import_from_working_directory() -> None:
    """Put the working directory first on ``sys.path``, as ``python -m`` does.

    A config's ``class_path`` names modules next to it (this repository's ``recipes/``, a user's
    own ``my_model.py``); a console script, unlike ``python -m``, would not find them.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


_SUBCOMMANDS = {
    "fit": "train a config's model with its callbacks (LightningCLI), e.g. --config configs/vit_digits.yaml",
    "validate": "one evaluation epoch over the validation set (LightningCLI)",
    "test": "one evaluation epoch over the test set (LightningCLI)",
    "predict": "run the model on the predict set (LightningCLI)",
    "compare": "score every attribution method on a checkpoint's first validation samples (tables and a picture)",
}


def _overview() -> str:
    lines = ["usage: lightning-gae SUBCOMMAND [options]", "",
             "Generic Attention-model Explainability for PyTorch Lightning: train while watching explanations,",
             "compare attribution methods.", "", "subcommands:"]
    lines += [f"  {name:<10} {what}" for name, what in _SUBCOMMANDS.items()]
    lines += ["", "lightning-gae SUBCOMMAND --help lists a subcommand's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """The ``lightning-gae`` command: ``fit``, ``validate``, ``test``, ``predict`` (LightningCLI) and ``compare``.

    A mistake on the command line (an option a class refuses, a missing or foreign checkpoint, a malformed YAML)
    prints one line naming what to fix and exits 2; ``--traceback`` (or ``LIGHTNING_GAE_DEBUG=1``) raises it instead.

    Args:
        argv: the arguments after the command's name; None reads ``sys.argv``. Without arguments, or with
            ``-h``, it prints the subcommands; ``lightning-gae SUBCOMMAND --help`` lists a subcommand's options.
    """
    _import_from_working_directory()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = debugging(args)
    if "--traceback" in args:
        args = [arg for arg in args if arg != "--traceback"]
        if argv is None:  # LightningCLI reads sys.argv itself
            sys.argv[1:] = args
    if not args or args[0] in ("-h", "--help"):
        print(_overview())
        return
    try:
        check_yaml(args)
        if args[0] == "compare":
            compare_main(args[1:])
        else:
            lightning_cli(None if argv is None else args)
    except CommandLineError as err:
        if debug:
            raise
        print(f"lightning-gae {args[0]}: error: {err} (--traceback shows where it was raised)", file=sys.stderr)
        raise SystemExit(2) from None
