"""What the ``lightning-gae`` command says of a mistake on its command line: :class:`CommandLineError` (one line
naming the fix, exit 2), and the checks that raise it on files (checkpoints, YAML) before anything runs."""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEBUG_VARIABLE", "CommandLineError", "check_weights_fit", "check_yaml", "debugging", "imported",
           "instantiation_error", "origin", "raised_here", "read_checkpoint", "reader_advice"]

# Set (to anything but 0) to see the traceback behind a command-line error, as --traceback does.
DEBUG_VARIABLE = "LIGHTNING_GAE_DEBUG"


class CommandLineError(Exception):
    """A mistake on the command line: :func:`main` prints its message, naming what to fix, and exits 2 (with
    ``--traceback`` or ``LIGHTNING_GAE_DEBUG=1`` it is raised, its cause's traceback above it)."""


def origin(err: BaseException) -> BaseException:
    """The exception ``err`` was raised from that this package raised (a GAECallback or option group refusing a
    value, wrapped by jsonargparse into its "Union subtypes" report), else the first one outside jsonargparse."""
    chain: list[BaseException] = []
    found: BaseException | None = err
    while found is not None and found not in chain:
        chain.append(found)
        # `raise ... from None` hides the context: the message raised in its place is the one to show.
        found = found.__cause__ or (None if found.__suppress_context__ else found.__context__)
    package = str(Path(__file__).resolve().parent)
    for candidate in reversed(chain):
        if raised_here(candidate, package):
            return candidate
    outside = [e for e in chain if "jsonargparse" not in "".join(f.filename for f in traceback.extract_tb(e.__traceback__)[-1:])]
    return outside[-1] if outside else err


def raised_here(err: BaseException, package: str | None = None) -> bool:
    """Whether this package raised ``err`` (the last frame of its traceback is one of its files)."""
    frames = traceback.extract_tb(err.__traceback__)
    package = package or str(Path(__file__).resolve().parent)
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(package)


def instantiation_error(err: BaseException) -> CommandLineError:
    """``err`` (raised while the config's classes were built) as one message: the refusing class's own."""
    found = origin(err)
    message = str(found).strip()
    if found is err and "Does not validate against any of the Union subtypes" in message:
        message = message.split("\nGiven value type:")[0]
    refused = CommandLineError(f"the config's classes could not be built: {message}")
    refused.__cause__ = err
    return refused


def read_checkpoint(path: Any, flag: str = "--ckpt_path", strict: bool = True) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (weights only, memory-mapped where it can be); a :class:`CommandLineError` naming
    ``flag`` for a file that is missing or not a checkpoint. A torch checkpoint that holds other objects than tensors
    and plain values is None where not ``strict`` (Lightning, which loads it in full, decides)."""
    import zipfile

    import torch

    where = str(path)
    if not Path(where).is_file():
        raise CommandLineError(f"{flag} {where}: no such file; give a checkpoint of the fit, e.g. "
                               "<save_dir>/<name>/version_0/checkpoints/last.ckpt")
    try:
        try:
            checkpoint = torch.load(where, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (not zip) format cannot be memory-mapped
            checkpoint = torch.load(where, map_location="cpu", weights_only=True)
    except Exception as err:
        if not strict and zipfile.is_zipfile(where):
            return None
        raise CommandLineError(f"{flag} {where}: not a checkpoint of tensors torch.load(weights_only=True) can read "
                               f"({type(err).__name__}); give a .ckpt file Lightning saved, e.g. "
                               "<run>/checkpoints/last.ckpt") from err
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("state_dict"), Mapping):
        raise CommandLineError(f"{flag} {where}: not a Lightning checkpoint (no state_dict); give a .ckpt file "
                               "Lightning saved, e.g. <run>/checkpoints/last.ckpt")
    return dict(checkpoint)


def check_weights_fit(model: Any, checkpoint: Mapping[str, Any], where: Any, flag: str = "--ckpt_path") -> None:
    """A :class:`CommandLineError` where the checkpoint's weights are not ``model``'s (another model's checkpoint)."""
    own = model.state_dict()
    saved = checkpoint["state_dict"]
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    resized = [k for k in own if k in saved and tuple(getattr(saved[k], "shape", ())) != tuple(own[k].shape)]
    if missing or unexpected or resized:
        parts = [f"{len(found)} {what} (e.g. {found[0]})" for found, what in
                 ((missing, "of its weights missing"), (unexpected, "unexpected"), (resized, "of another shape"))
                 if found]
        raise CommandLineError(f"{flag} {where}: its weights are not those of {type(model).__name__} "
                               f"({', '.join(parts)}); give a checkpoint of this model's fit")


def check_yaml(args: Sequence[str]) -> None:
    """A :class:`CommandLineError` naming the file, line and column of a ``--config`` file that is not valid YAML."""
    import yaml

    for i, arg in enumerate(args):
        path = arg.partition("=")[2] if arg.startswith("--config=") else \
            (args[i + 1] if arg == "--config" and i + 1 < len(args) else None)
        if not path or not Path(path).is_file():
            continue
        try:
            yaml.safe_load(Path(path).read_text())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err)
            context = getattr(err, "context", None)
            raise CommandLineError(f"--config {path}: not valid YAML, {at}{problem}"
                                   f"{f' ({context})' if context else ''}; fix that line") from err


def imported(path: str, flag: str) -> Any:
    """What the import path ``path`` (``package.module.name``) names, importable from the working directory; a
    :class:`CommandLineError` naming ``flag`` when it is not there."""
    import importlib

    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError) as err:
        raise CommandLineError(f"{flag} {path}: {err}") from err


def reader_advice(err: ValueError) -> str:
    """The callback's advice on a batch layout its forward cannot tell (a Python reader), put as the command's."""
    return (f"{str(err).removeprefix('GAECallback: ')}. Here such a reader is a function of a module importable from "
            "the working directory (e.g. my_readers.py: def pixels(batch): return batch[...]), given as --inputs "
            "my_readers.pixels or in the YAML as the GAECallback's init_args: {batches: {inputs: my_readers.pixels}}")


def debugging(args: Sequence[str]) -> bool:
    """Whether to raise a :class:`CommandLineError` with its traceback: ``--traceback`` or ``LIGHTNING_GAE_DEBUG``."""
    return "--traceback" in args or os.environ.get(DEBUG_VARIABLE, "0") not in ("", "0")
