"""Any Lightning logger (lightning_gae/callbacks/_loggers.py): TensorBoard gets everything; CSV, MLflow, W&B and Comet
(offline), alone or beside TensorBoard, get the scalars through log_metrics and (those with an image call) the
pictures, read back from the files each logger wrote; a one-time note names what they cannot show; no logger, or one
that raises, fails neither a step nor the run, and the summary is printed and counts the logger's failures."""

from __future__ import annotations

import csv
import io
import json
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from lightning.pytorch import seed_everything
from lightning.pytorch.loggers import CometLogger, CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from PIL import Image

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from recipes.digits import DigitsDataModule
from tests.helpers.models import small_vit
from tests.helpers.trainer import EPOCH_END_STEPS, assert_heatmaps_at_steps, heatmap_tag

NOTE = "Only TensorBoard shows the GAE tab, the Custom Scalars charts"
SCALARS = ("relevance_concentration/gae", "positive_perturbation_auc/gae", "positive_perturbation_auc/random")
SCORES = SCALARS[1:]  # with a standard error each


def _fit(tmp_path, make_trainer, logger):
    """A two-epoch fit explaining 2 samples and scoring 8 at the ends of the epochs (steps 1 and 3); the trainer,
    the callback and the warnings' texts."""
    seed_everything(0)
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(samples=8, interim_samples=0))
    trainer = make_trainer(tmp_path, [callback], logger=logger)
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    messages = [str(w.message) for w in records]
    assert not [m for m in messages if "was skipped" in m or "failed" in m], messages
    return trainer, callback, messages


def _notes(messages):
    return [m for m in messages if NOTE in m]


def _mlflow(tmp_path, monkeypatch):
    # MLflow 3 refuses its file store unless told to keep it; the store is files to read back, without a server.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return MLFlowLogger(experiment_name="gae", tracking_uri=f"file:{tmp_path}/mlruns")


def _mlflow_metrics(logger) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from the file store's ``metrics/<tag>`` files (``timestamp value step``)."""
    root = Path(logger.save_dir, logger.experiment_id, logger.run_id, "metrics")
    found = {}
    for path in root.rglob("*"):
        if path.is_file():
            rows = [line.split() for line in path.read_text().splitlines()]
            found[path.relative_to(root).as_posix()] = [(int(step), float(value)) for _, value, step in rows]
    return found


def _mlflow_pictures(logger) -> dict[str, np.ndarray]:
    """``{"<tag>/step_<step>.png": picture}`` from the run's artifacts folder."""
    root = Path(logger.save_dir, logger.experiment_id, logger.run_id, "artifacts")
    return {p.relative_to(root).as_posix(): np.asarray(Image.open(p)) for p in root.rglob("*.png")}


@pytest.mark.slow
def test_a_csv_logger_alone_gets_the_scalars_and_a_note_of_what_it_cannot_show(tmp_path, make_trainer, capsys):
    logger = CSVLogger(tmp_path, name="csv")
    trainer, callback, messages = _fit(tmp_path, make_trainer, logger)
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for tag in SCALARS:
        assert any(r.get(tag) for r in rows), tag
    assert [int(r["step"]) for r in rows if r.get("relevance_concentration/gae")] == EPOCH_END_STEPS
    assert [int(r["step"]) for r in rows if r.get("positive_perturbation_auc/gae")] == EPOCH_END_STEPS
    notes = _notes(messages)
    assert len(notes) == 1
    assert "CSVLogger gets the scalars (log_metrics)." in notes[0] and "pictures" not in notes[0]
    assert "gae_tokens, gae_faithfulness, gae_health, gae_alerts" in notes[0]
    assert "add lightning.pytorch.loggers.TensorBoardLogger to see them" in notes[0]
    out = capsys.readouterr().out
    assert "GAECallback: the fit ended" in out and "positive_perturbation_auc" in out
    assert "other loggers: CSVLogger gets the scalars (log_metrics)" in out


@pytest.mark.slow
def test_an_mlflow_logger_alone_gets_the_scalars_and_the_pictures_as_artifacts(tmp_path, make_trainer, monkeypatch,
                                                                                capsys):
    logger = _mlflow(tmp_path, monkeypatch)
    trainer, callback, messages = _fit(tmp_path, make_trainer, logger)
    metrics = _mlflow_metrics(logger)
    for tag in SCALARS:
        assert tag in metrics, sorted(metrics)
    for tag in SCORES:
        # The standard error beside the value: the file store cannot make <tag> a file and the folder of <tag>/stderr.
        assert f"{tag}_stderr" in metrics, sorted(metrics)
    assert [step for step, _ in metrics["relevance_concentration/gae"]] == EPOCH_END_STEPS
    assert all(0.0 < value <= 1.0 for _, value in metrics["relevance_concentration/gae"])
    pictures = _mlflow_pictures(logger)
    for sample in callback.sample_indices:
        for step in EPOCH_END_STEPS:
            picture = pictures[f"{heatmap_tag(sample)}/step_{step:07d}.png"]
            assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
        # The evolution strip, at the last explanation step.
        assert f"gae_evolution/val_{sample}/step_{EPOCH_END_STEPS[-1]:07d}.png" in pictures
    notes = _notes(messages)
    assert len(notes) == 1
    assert ("MLFlowLogger gets the scalars (log_metrics, standard errors as <metric>/<method>_stderr) and the pictures "
            "gae_heatmaps, gae_evolution (as run artifacts <tag>/step_<step>.png)") in notes[0]
    assert "other loggers: MLFlowLogger gets the scalars" in capsys.readouterr().out


@pytest.mark.slow
def test_tensorboard_with_mlflow_gets_everything_and_mlflow_the_same_pictures(tmp_path, make_trainer, monkeypatch,
                                                                               read_events, capsys):
    tensorboard, mlflow = TensorBoardLogger(tmp_path, name="tb"), _mlflow(tmp_path, monkeypatch)
    trainer, callback, messages = _fit(tmp_path, make_trainer, [tensorboard, mlflow])
    acc = read_events(tensorboard.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    assert "relevance/gae" in acc.Tags()["histograms"]
    assert any(tag.startswith("gae_dashboard/") for tag in acc.Tags()["tensors"])
    metrics = _mlflow_metrics(mlflow)
    for tag in SCALARS:
        # The same values in both.
        for name, logged in ((tag, tag), *([(f"{tag}_stderr", f"{tag}/stderr")] if tag in SCORES else [])):
            assert [v for _, v in metrics[name]] == pytest.approx([e.value for e in acc.Scalars(logged)], rel=1e-6)
    pictures = _mlflow_pictures(mlflow)
    for sample in callback.sample_indices:
        # The last heatmap, pixel for pixel the one TensorBoard shows.
        shown = np.asarray(Image.open(io.BytesIO(acc.Images(heatmap_tag(sample))[-1].encoded_image_string)))
        np.testing.assert_array_equal(pictures[f"{heatmap_tag(sample)}/step_{EPOCH_END_STEPS[-1]:07d}.png"], shown)
    notes = _notes(messages)
    assert len(notes) == 1 and "the TensorBoard logger beside them shows them" in notes[0]
    assert "TensorBoardLogger gets" not in notes[0]
    out = capsys.readouterr().out
    assert f"event files: {tensorboard.log_dir}" in out and "other loggers: MLFlowLogger" in out


@pytest.mark.slow
def test_tensorboard_with_csv_notes_what_the_csv_logger_misses(tmp_path, make_trainer, read_events):
    tensorboard, table = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    trainer, callback, messages = _fit(tmp_path, make_trainer, [tensorboard, table])
    assert_heatmaps_at_steps(read_events(tensorboard.log_dir), callback, EPOCH_END_STEPS)
    with open(Path(table.log_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(any(r.get(tag) for r in rows) for tag in SCALARS)
    notes = _notes(messages)
    assert len(notes) == 1 and "CSVLogger gets the scalars (log_metrics). Only TensorBoard" in notes[0]
    assert "the TensorBoard logger beside them shows them" in notes[0]


def _wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of an offline run, read from its ``run-<id>.wandb`` file: W&B's LevelDB-style log (a 7-byte
    header, then 32 KiB blocks of records ``crc32, length, type`` + data, a record split across blocks as
    FIRST/MIDDLE/LAST), each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    rows, pos, chunks, block = [], 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks, pos = chunks + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
            chunks = b""
    return rows


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_tensorboard"])
@pytest.mark.slow
def test_a_wandb_offline_logger_gets_the_scalars_and_the_pictures(tmp_path, make_trainer, monkeypatch, read_events,
                                                                  beside):
    import wandb

    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                        "WANDB_CONSOLE": "off", "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                        "WANDB_CONFIG_DIR": str(tmp_path / "config"), "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(name, value)
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="gae")
    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    try:
        trainer, callback, messages = _fit(tmp_path, make_trainer, [tensorboard, logger] if beside else logger)
        run_dir = Path(logger.experiment.dir).parent
    finally:
        wandb.finish()
        # Waits for W&B's service process to finish writing the run's transaction log before the test reads it
        # (the history was once found without scalars, as if read before the service had flushed).
        wandb.teardown()
    rows = _wandb_history(run_dir)
    steps = {tag: [r["trainer/global_step"] for r in rows if tag in r] for tag in SCALARS}
    assert steps["relevance_concentration/gae"] == EPOCH_END_STEPS
    assert steps["positive_perturbation_auc/gae"] == EPOCH_END_STEPS
    for sample in callback.sample_indices:
        images = [r for r in rows if f"{heatmap_tag(sample)}/filenames" in r]
        assert [r["trainer/global_step"] for r in images] == EPOCH_END_STEPS
        for row in images:
            (name,) = row[f"{heatmap_tag(sample)}/filenames"]
            picture = np.asarray(Image.open(run_dir / "files" / name))
            assert picture.shape[:2] == (row[f"{heatmap_tag(sample)}/height"], row[f"{heatmap_tag(sample)}/width"])
        if beside:  # pixel for pixel the picture TensorBoard shows
            acc = read_events(tensorboard.log_dir)
            shown = np.asarray(Image.open(io.BytesIO(acc.Images(heatmap_tag(sample))[-1].encoded_image_string)))
            np.testing.assert_array_equal(picture, shown)
    notes = _notes(messages)
    assert len(notes) == 1 and "WandbLogger gets the scalars (log_metrics) and the pictures" in notes[0]


def _comet_archive(directory: Path) -> tuple[list[dict], dict[str, bytes]]:
    """The messages of the offline archive in ``directory`` (``<key>-<id>.zip``: ``messages.json``, one JSON message
    a line) and its other files, by name (what ``file_upload`` messages point at)."""
    (archive,) = directory.glob("*.zip")
    with zipfile.ZipFile(archive) as z:
        messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines()]
        return messages, {name: z.read(name) for name in z.namelist() if name != "messages.json"}


@pytest.mark.slow
def test_a_comet_offline_logger_beside_tensorboard_gets_the_scalars_and_the_pictures(tmp_path, make_trainer,
                                                                                     monkeypatch, read_events):
    pytest.importorskip("comet_ml")
    # Lightning's CometLogger(online=False) builds a disabled experiment (it writes nothing); Comet's own setting for
    # starting offline keeps it enabled and writes the archive. No key, no service, nothing sent.
    for name, value in {"COMET_START_ONLINE": "false", "COMET_CONFIG": str(tmp_path / "comet.config"),
                        "COMET_ERROR_TRACKING_ENABLE": "false", "COMET_DISABLE_ANNOUNCEMENT": "true"}.items():
        monkeypatch.setenv(name, value)
    logger = CometLogger(project="gae", offline_directory=str(tmp_path / "comet"), log_code=False,
                         log_git_metadata=False, log_git_patch=False, log_env_details=False, log_env_gpu=False,
                         log_env_host=False, log_env_cpu=False, log_env_network=False, log_env_disk=False,
                         auto_output_logging=False, display_summary_level=0)
    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    trainer, callback, messages = _fit(tmp_path, make_trainer, [tensorboard, logger])
    logger.experiment.end()  # writes the archive
    found, files = _comet_archive(tmp_path / "comet")
    metrics = [m["payload"]["metric"] for m in found if m["type"] == "metric_msg"]
    for tag in SCALARS:
        assert [m["step"] for m in metrics if m["metricName"] == tag] == EPOCH_END_STEPS
    images = [m["payload"] for m in found if m["type"] == "file_upload" and m["payload"]["upload_type"] == "visualization"]
    acc = read_events(tensorboard.log_dir)
    for sample in callback.sample_indices:
        shown = [p for p in images if p["additional_params"]["figName"] == heatmap_tag(sample)]
        assert [p["additional_params"]["step"] for p in shown] == EPOCH_END_STEPS
        for picture, event in zip(shown, acc.Images(heatmap_tag(sample))):  # pixel for pixel TensorBoard's
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(files[picture["file_path"]]))),
                                          np.asarray(Image.open(io.BytesIO(event.encoded_image_string))))
    notes = _notes(messages)
    assert len(notes) == 1 and "CometLogger gets the scalars (log_metrics) and the pictures" in notes[0]


@pytest.mark.parametrize("logger", ["none", "csv"])
@pytest.mark.slow
def test_no_logger_or_a_csv_logger_fails_nothing_and_fit_and_validate_print_their_summaries(tmp_path, make_trainer,
                                                                                             capsys, logger):
    trainer, callback, messages = _fit(tmp_path, make_trainer, False if logger == "none" else CSVLogger(tmp_path))
    if logger == "none":
        assert any("the Trainer has no logger" in m for m in messages) and not _notes(messages)
    out = capsys.readouterr().out
    assert "GAECallback: the fit ended" in out and "positive_perturbation_auc" in out and callback.summary in out
    assert "event files: none (" in out
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.validate(trainer.lightning_module, DigitsDataModule(batch_size=32))
    assert not [str(w.message) for w in records if "failed" in str(w.message)]
    out = capsys.readouterr().out
    assert "GAECallback: the validation ended" in out and callback.summary in out


class _Failing(Logger):
    """A logger (a real Lightning ``Logger``) whose folders and image call raise (a service that is down) and whose
    backend refuses metric names with a ``/``: the module's own ``train_loss`` goes through, the callback's tags not.
    (Not its ``experiment``: Lightning reads it itself when a fit starts, and would fail first.)"""

    name, version = "failing", 0

    @property
    def log_dir(self):
        raise ConnectionError("the tracking server is unreachable")

    @property
    def save_dir(self):
        raise ConnectionError("the tracking server is unreachable")

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        refused = sorted(name for name in metrics if "/" in name)
        if refused:
            raise ValueError(f"metric names may not hold '/': {refused[0]}")

    def log_image(self, key, images, step=None) -> None:
        raise ConnectionError("the tracking server is unreachable")


@pytest.mark.slow
def test_a_logger_that_raises_is_warned_about_once_counted_in_the_summary_and_tensorboard_gets_everything(
        tmp_path, make_trainer, read_events, capsys):
    seed_everything(0)
    tensorboard = TensorBoardLogger(tmp_path, name="tb")
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(samples=8, interim_samples=0))
    trainer = make_trainer(tmp_path, [callback], logger=[tensorboard, _Failing()])
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    messages = [str(w.message) for w in records]
    acc = read_events(tensorboard.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    assert [e.step for e in acc.Scalars("positive_perturbation_auc/gae")] == EPOCH_END_STEPS
    failed = [m for m in messages if "_Failing.log_metrics failed" in m]
    assert len(failed) == 1 and "ValueError: metric names may not hold '/'" in failed[0]
    assert len([m for m in messages if "logging the pictures to _Failing failed" in m]) == 1
    assert not [m for m in messages if "was skipped" in m]
    out = capsys.readouterr().out
    assert "GAECallback: the fit ended" in out and f"event files: {tensorboard.log_dir}" in out
    assert "other loggers: _Failing gets the scalars (log_metrics) and the pictures" in out
    # Counted like the explanation steps' own failures: which logger and call, how many steps, the first.
    assert ("loggers failed at 2 of 2 explanation steps:\n"
            "  _Failing.log_metrics: ValueError: metric names may not hold '/': negative_perturbation_auc/gae (2 steps, "
            "first at step 1)\n"
            "  _Failing.log_image: ConnectionError: the tracking server is unreachable (2 steps, first at step 1)"
            ) in callback.summary, callback.summary
    assert callback.summary in out and trainer.state.finished
