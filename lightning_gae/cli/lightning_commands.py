"""``lightning-gae fit|validate|test|predict``: Lightning's own ``LightningCLI`` (models and data modules chosen by
``class_path`` in a YAML config, or by ``--model``/``--data`` with a plain ``Trainer``'s checkpoint), which logs a
validation or test of a fit's run into that run and says a refused option in one line."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_gae.cli.errors import (
    CommandLineError,
    check_weights_fit,
    imported,
    instantiation_error,
    read_checkpoint,
    reader_advice,
)

__all__ = ["lightning_cli"]


def lightning_cli(args: Sequence[str] | None) -> None:
    """``lightning-gae fit|validate|test|predict`` with ``args`` (None: ``sys.argv``, as LightningCLI reads it)."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from lightning_gae.callbacks.batch_layout import LayoutUnclear

    given = list(sys.argv[1:] if args is None else args)
    subcommand = given[0] if given else None
    reader = None
    if subcommand in ("validate", "test"):  # --inputs MODULE.FUNCTION: the GAECallback's batches.inputs
        given, reader = _inputs_reader(given)
        args = None if args is None and reader is None else given
    try:
        _cli_class(reader)(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            # None lets LightningCLI read sys.argv itself; explicit args are for calls from Python.
            args=None if args is None else list(args),
        )
    except LayoutUnclear as err:
        if subcommand not in ("validate", "test"):
            raise
        # The callback's advice is a Python reader; here it is --inputs (or the YAML's batches: inputs:).
        raise CommandLineError(reader_advice(err)) from err


def _cli_class(reader: Any) -> type:
    """The ``LightningCLI`` of the command; ``reader``: ``--inputs``' function (None: the callback's own)."""
    import dataclasses

    from lightning.pytorch.cli import LightningCLI

    from lightning_gae.callbacks import GAECallback
    from lightning_gae.callbacks.evaluation import continue_fit_steps

    class GAECLI(LightningCLI):
        def _parse_ckpt_path(self) -> None:
            # A missing file or one that is no checkpoint, said before anything is built.
            subcommand = self.config.get("subcommand")
            ckpt_path = subcommand and self.config[subcommand].get("ckpt_path")
            if ckpt_path and subcommand in ("validate", "test", "predict"):
                read_checkpoint(ckpt_path, strict=False)
            # A plain Trainer's checkpoint names no class (LightningCLI's own do, and Lightning reads only those): its
            # saved hyper-parameters are the init_args of the --model given.
            found = _plain_checkpoint_model(self.config)
            if found is None:
                super()._parse_ckpt_path()
            else:
                self.config = self.parser.parse_object(found, self.config)

        def instantiate_classes(self) -> None:
            # A class of the config refusing its arguments (a GAECallback option, a model's): its message, not
            # jsonargparse's report of every Union subtype it tried.
            try:
                super().instantiate_classes()
            except (ValueError, TypeError) as err:
                raise instantiation_error(err) from err

        def before_instantiate_classes(self) -> None:
            # validate/test of a fit's saved config or checkpoint: into that run at its last step, not a new version
            # (its config left as it is).
            self._run: Path | None = None
            self._summaries: list[Any] = []
            if self.subcommand in ("validate", "test"):
                self._run = _into_saved_run(self.config[self.subcommand])
                if self._run is not None:
                    self.save_config_callback = None

        def before_validate(self) -> None:
            found = [cb for cb in self.trainer.callbacks if isinstance(cb, GAECallback)]  # type: ignore[attr-defined]  # set by Lightning at run time
            if reader is not None and not found:
                raise CommandLineError("--inputs reads the batches of a GAECallback; add one "
                                       "(--trainer.callbacks+=lightning_gae.callbacks.GAECallback)")
            for callback in found if reader is not None else []:
                callback.batches = dataclasses.replace(callback.batches, inputs=reader)
            ckpt_path = self.config[self.subcommand].get("ckpt_path")
            _check_fits(self.model, ckpt_path)
            if self._run is not None:
                continue_fit_steps(self.trainer, ckpt_path)
                # Its summary is printed by after_validate, to look at that run alone.
                self._summaries = [cb for cb in found if cb.print_summary]
                for callback in self._summaries:
                    callback.print_summary = False

        def before_test(self) -> None:
            self.before_validate()

        def after_validate(self) -> None:
            if self._run is not None and self.trainer.is_global_zero:
                _print_into_run(self._run, self._summaries)

        def after_test(self) -> None:
            self.after_validate()

        def before_fit(self) -> None:
            # The callbacks' summaries are printed when fit has returned, under the progress bar's last lines
            # (a rich progress bar keeps drawing until the trainer's teardown, after the callbacks' on_fit_end).
            self._summaries = [cb for cb in self.trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning at run time
                               if isinstance(cb, GAECallback) and cb.print_summary]
            for callback in self._summaries:
                callback.print_summary = False

        def after_fit(self) -> None:
            for callback in self._summaries:
                callback.print_summary = True
                if callback.summary is not None:
                    print(callback.summary)
            if self._summaries or not self.trainer.is_global_zero:
                return  # the callback's summary ends with the same command
            # Where to look: TensorBoard finds every run and version below the save_dir.
            roots = {getattr(lg, "save_dir", None) for lg in self.trainer.loggers}
            for root in sorted(r for r in roots if r):
                print(f"tensorboard --logdir {root}")

    return GAECLI


def _check_fits(model: Any, ckpt_path: Any) -> None:
    """A :class:`CommandLineError` where the checkpoint file ``ckpt_path`` holds another model's weights."""
    if ckpt_path and Path(str(ckpt_path)).is_file():  # "best"/"last" are Lightning's to resolve
        saved = read_checkpoint(ckpt_path, strict=False)
        if saved is not None:
            check_weights_fit(model, saved, ckpt_path)


def _print_into_run(run: Path, summaries: Sequence[Any]) -> None:
    """The summaries of a validation or test logged into a fit's ``run``, which ``tensorboard --logdir`` names: its
    curves from the fit and this point at the fit's last step, nothing else."""
    for callback in summaries:
        callback.print_summary = True
        if callback.summary is not None:
            print("\n".join(line for line in callback.summary.splitlines()
                            if not line.startswith("tensorboard --logdir ")))
    print(f"tensorboard --logdir {_shown(run)}")


def _plain_checkpoint_model(config: Any) -> dict[str, Any] | None:
    """``{subcommand: {"model": {"class_path": --model, "init_args": the checkpoint's hyper-parameters}}}`` for a
    checkpoint a plain ``Trainer`` wrote (its hyper-parameters name no class); None for others."""
    subcommand = config.get("subcommand")
    ckpt_path = subcommand and config[subcommand].get("ckpt_path")
    class_path = getattr(config[subcommand].get("model"), "class_path", None) if subcommand else None
    if not class_path or not ckpt_path or not Path(str(ckpt_path)).is_file():
        return None
    hparams = dict((read_checkpoint(ckpt_path, strict=False) or {}).get("hyper_parameters") or {})
    if not hparams or "_class_path" in hparams or "_instantiator" in hparams:
        return None
    return {subcommand: {"model": {"class_path": class_path, "init_args": hparams}}}


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it (as a user typed it), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def _fit_run(config: Any) -> Path | None:
    """The folder of the fit a validate/test ``config`` comes from: the one of its saved ``config.yaml`` (LightningCLI
    saves it in the run's folder, ``<save_dir>/<name>/<version>``), else of its checkpoint (``<run>/checkpoints/``)."""
    files = [Path(str(getattr(f, "absolute", f))).resolve() for f in (config.get("config") or [])]
    if len(files) == 1 and files[0].name == "config.yaml":
        return files[0].parent
    ckpt_path = config.get("ckpt_path")
    found = Path(str(ckpt_path)).resolve() if ckpt_path else None
    if found is not None and found.is_file() and found.parent.name == "checkpoints":
        return found.parent.parent
    return None


def _into_saved_run(config: Any) -> Path | None:
    """When ``config`` (a subcommand's parsed config) comes from a fit's run (:func:`_fit_run`) that its logger's
    ``save_dir`` and ``name`` hold (without a logger: Lightning's default, else the TensorBoard run the checkpoint
    lies in), point the logger at that version (where the config says none) and return the run's folder; else None
    and nothing changes."""
    from jsonargparse import Namespace

    run = _fit_run(config)
    if run is None:
        return None
    logger = config.trainer.get("logger")
    if logger is None or logger is True:  # Lightning's default: a TensorBoardLogger in default_root_dir
        root = config.trainer.get("default_root_dir") or os.getcwd()
        if Path(root).resolve() / "lightning_logs" != run.parent and any(run.glob("events.out.tfevents.*")):
            # A TensorBoard run elsewhere (the fit's own logger): that one, as no logger was asked for.
            root, name = str(run.parent.parent), run.parent.name
        else:
            name = "lightning_logs"
        logger = Namespace(class_path="lightning.pytorch.loggers.TensorBoardLogger",
                           init_args=Namespace(save_dir=str(root), name=name, version=None))
        config.trainer.logger = logger
    for entry in logger if isinstance(logger, list) else [logger]:
        args = entry.get("init_args") if isinstance(entry, Namespace) else None
        if args is None or args.get("version") is not None or not args.get("save_dir"):
            continue
        name = args.get("name")
        root = Path(args.save_dir).resolve() / name if name else Path(args.save_dir).resolve()
        if root == run.parent:
            args.version = run.name
            return run
    return None


def _inputs_reader(args: list[str]) -> tuple[list[str], Any]:
    """``args`` of validate/test without ``--inputs MODULE.FUNCTION``, and that function (None without the flag)."""
    for i, arg in enumerate(args):
        if arg == "--inputs" or arg.startswith("--inputs="):
            path = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            reader = imported(path, "--inputs")
            if not callable(reader):
                raise CommandLineError(f"--inputs {path}: not a function batch -> model inputs (give "
                                 "its import path, e.g. my_readers.pixels for my_readers.py of the working directory)")
            return args[:i] + args[i + (1 if "=" in arg else 2):], reader
    return args, None
