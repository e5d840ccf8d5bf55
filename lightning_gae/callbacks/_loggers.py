"""Where GAECallback's output goes: every Lightning logger gets what it can take, and no logger fails a step or a run.

* A logger whose ``experiment`` is a ``SummaryWriter`` (``TensorBoardLogger``, of ``lightning`` or of
  ``pytorch_lightning``) gets everything (:func:`writers`): pictures, scalars, histograms, text, the Custom Scalars
  charts, the methods' runs and the GAE tab's tensors.
* Every logger gets the scalars through its own ``log_metrics`` (:func:`log_scalars`); MLflow the standard errors
  as ``<metric>/<method>_stderr`` (its file store cannot keep ``<metric>/<method>/stderr`` beside the value).
* A logger with an image call gets the pictures (``gae_heatmaps/val_<i>``, ``gae_evolution/val_<i>``) through it
  (:func:`image_loggers`, :func:`log_pictures`): ``WandbLogger.log_image``, ``MLFlowLogger`` as run artifacts
  ``<tag>/step_<step>.png`` (``MlflowClient.log_image``), ``CometLogger``'s ``Experiment.log_image``, and any other
  logger with a ``log_image(key, images, step)`` as ``WandbLogger`` has it. (Lightning's ``NeptuneLogger`` raises
  when built since Neptune was sunset; one that runs gets the scalars, as any logger.)
* What the others cannot show is named once, when a fit starts (:func:`logger_note`).

A logger that raises is warned about once per cause, counted in the run's failures (the summary names the logger, its
call, how many steps and the first) and the others go on: a logger never takes a step or a run down.
Loggers are matched by class name along their class's MRO, so ``pytorch_lightning``'s twins and subclasses match too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from lightning.pytorch import Trainer
from PIL import Image
from lightning.pytorch.loggers.logger import DummyLogger

from lightning_gae.callbacks.failures import Failures

__all__ = ["NOT_SHOWN", "elsewhere_lines", "event_logs", "experiment_of", "image_loggers", "log_pictures",
           "log_scalars", "logger_note", "only_dummy_loggers", "writers"]

ImageCall = Callable[[str, np.ndarray, int], None]
"""``call(tag, picture, step)``: one uint8 ``[h, w, 3]`` picture to a logger."""

NOT_SHOWN = ("the GAE tab, the Custom Scalars charts (one line per method), the histograms relevance/<method> and "
             "the Text tab's entries (gae_tokens, gae_faithfulness, gae_health, gae_alerts)")
"""What only TensorBoard shows."""


def only_dummy_loggers(trainer: Trainer) -> bool:
    """fast_dev_run swaps the loggers for no-op ones: there is nowhere to log an explanation to."""
    return bool(trainer.loggers) and all(isinstance(logger, DummyLogger) for logger in trainer.loggers)


def experiment_of(logger: Any) -> Any:
    """A logger's ``experiment``, or None: a logger written as Lightning's docs show has none, and reading it may
    raise (a logger that starts its service lazily); the callback then gives it scalars alone."""
    try:
        return getattr(logger, "experiment", None)
    except Exception:  # noqa: BLE001 - whatever a logger's property raises, it has no writer to give
        return None


def _is_tensorboard(logger: Any) -> bool:
    return not isinstance(logger, DummyLogger) and hasattr(experiment_of(logger), "add_image")


def writers(trainer: Trainer) -> list[Any]:
    """The loggers' ``SummaryWriter``s (those that take everything)."""
    found = (experiment_of(lg) for lg in trainer.loggers)
    return [experiment for experiment in found if hasattr(experiment, "add_image")]


def event_logs(trainer: Trainer) -> list[tuple[str, str]]:
    """``(log_dir, save_dir)`` of the loggers that write TensorBoard event files (fast_dev_run's no-op loggers
    answer every attribute, so they are left out by type); a logger whose folders cannot be read is left out."""
    found = []
    for logger in trainer.loggers:
        try:
            if _is_tensorboard(logger) and getattr(logger, "log_dir", None) and logger.save_dir:
                found.append((str(logger.log_dir), str(logger.save_dir)))
        except Exception:  # noqa: BLE001 - the summary names what it can
            continue
    return found


def _kinds(logger: Any) -> set[str]:
    return {cls.__name__ for cls in type(logger).__mro__}


def _image_call(logger: Any) -> tuple[str, ImageCall] | None:
    """How ``logger`` takes a picture, and how that is said; None for a logger without an image call."""
    kinds = _kinds(logger)
    if "MLFlowLogger" in kinds:
        def mlflow(tag: str, picture: np.ndarray, step: int) -> None:
            logger.experiment.log_image(logger.run_id, picture, artifact_file=f"{tag}/step_{step:07d}.png")
        return "as run artifacts <tag>/step_<step>.png", mlflow
    if "CometLogger" in kinds:  # a PIL image: Comet stretches an array's values to its min and max
        return "through Experiment.log_image", lambda tag, picture, step: logger.experiment.log_image(
            Image.fromarray(picture), name=tag, step=step)
    if callable(getattr(logger, "log_image", None)):  # WandbLogger's, and loggers written after it
        return "through log_image", lambda tag, picture, step: logger.log_image(key=tag, images=[picture], step=step)
    return None


def image_loggers(trainer: Trainer) -> list[tuple[Any, ImageCall]]:
    """The loggers that are not TensorBoard and take pictures, each with its call."""
    found = []
    for logger in trainer.loggers:
        call = None if isinstance(logger, DummyLogger) or _is_tensorboard(logger) else _image_call(logger)
        if call is not None:
            found.append((logger, call[1]))
    return found


def _name(logger: Any) -> str:
    return type(logger).__name__


def _named_for(logger: Any, scalars: Mapping[str, float]) -> dict[str, float]:
    """``scalars`` under the names ``logger`` can keep. MLflow's file store keeps a metric as a file named by its
    path, so ``<metric>/<method>`` cannot also be the folder of ``<metric>/<method>/stderr`` (the whole batch is
    refused): MLflow gets the standard errors as ``<metric>/<method>_stderr``, whatever its store."""
    if "MLFlowLogger" not in _kinds(logger):
        return dict(scalars)
    return {(tag.removesuffix("/stderr") + "_stderr" if tag.endswith("/stderr") else tag): value
            for tag, value in scalars.items()}


def _failed(failures: Failures, step: int, logger: Any, call: str, err: Exception, lost: str) -> None:
    """``logger``'s ``call`` raised ``err`` at ``step``: recorded (warned the first time) for the summary."""
    reason = f"{_name(logger)}.{call}: {type(err).__name__}: {err}"
    failures.record("logging", step, reason, f"GAECallback: {lost} ({type(err).__name__}: {err}). Fix the logger's "
                    f"settings or service, or leave it out of Trainer(logger=...); the other loggers and training go "
                    f"on, and further failures of this kind are counted in the summary")


def log_scalars(trainer: Trainer, scalars: Mapping[str, float], step: int, failures: Failures) -> None:
    """``scalars`` to every logger's ``log_metrics``; one that raises is recorded in ``failures`` (warned once per
    cause) and the others go on."""
    for logger in trainer.loggers:
        try:
            logger.log_metrics(_named_for(logger, scalars), step=step)
        except Exception as err:  # noqa: BLE001 - a logger never takes the step down
            _failed(failures, step, logger, "log_metrics", err, f"{_name(logger)}.log_metrics failed at step {step} "
                    "and its scalars were left out; the other loggers got them")


def log_pictures(loggers: list[tuple[Any, ImageCall]], pictures: Mapping[str, np.ndarray], step: int,
                 failures: Failures) -> None:
    """``pictures`` (tag -> uint8 ``[h, w, 3]``) to each of ``loggers`` (:func:`image_loggers`) through its own image
    call; a logger that raises is recorded in ``failures`` (warned once per cause) and left for this step."""
    for logger, call in loggers:
        try:
            for tag, picture in pictures.items():
                call(tag, picture, step)
        except Exception as err:  # noqa: BLE001 - a logger never takes the step down
            _failed(failures, step, logger, "log_image", err, f"logging the pictures to {_name(logger)} failed at step "
                    f"{step}; its scalars are logged all the same")


def _gets(logger: Any) -> str:
    call = _image_call(logger)
    scalars = "the scalars (log_metrics" + (", standard errors as <metric>/<method>_stderr)"
                                            if "MLFlowLogger" in _kinds(logger) else ")")
    if call is None:
        return f"{_name(logger)} gets {scalars}"
    return f"{_name(logger)} gets {scalars} and the pictures gae_heatmaps, gae_evolution ({call[0]})"


def _others(trainer: Trainer) -> list[Any]:
    return [lg for lg in trainer.loggers if not isinstance(lg, DummyLogger) and not _is_tensorboard(lg)]


def logger_note(trainer: Trainer) -> str | None:
    """What the loggers that are not TensorBoard get and cannot show, as a warning's text; None when every logger
    is TensorBoard (or there is none)."""
    others = _others(trainer)
    if not others:
        return None
    where = ("the TensorBoard logger beside them shows them" if len(others) < len(trainer.loggers)
             else "add lightning.pytorch.loggers.TensorBoardLogger to see them")
    return (f"GAECallback: {'; '.join(_gets(lg) for lg in others)}. Only TensorBoard shows {NOT_SHOWN}: {where}.")


def elsewhere_lines(trainer: Trainer) -> list[str]:
    """The summary's lines for the loggers that are not TensorBoard: what each got."""
    return [f"other loggers: {_gets(lg)}" for lg in _others(trainer)]
