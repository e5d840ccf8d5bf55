"""What GAECallback writes: TensorBoard pictures, scalars and histograms at every explanation step, read back from
the event files and from a real ``tensorboard`` server; other loggers beside TensorBoard; pictures of bounded size."""

import csv
import time
from pathlib import Path

import pytest
from lightning.pytorch import seed_everything
from lightning.pytorch.loggers import CSVLogger, Logger
from pytorch_lightning.loggers import TensorBoardLogger as PLTensorBoardLogger
from torch.utils.data import DataLoader, Subset

from lightning_gae.callbacks import DisplayOptions, FaithfulnessOptions, GAECallback
from lightning_gae.tensorboard.views import MAX_IMAGE_SIDE
from recipes.digits import DigitsDataModule
from tests.helpers.models import small_vit
from tests.helpers.processes import get_json, tensorboard_server
from tests.helpers.trainer import EPOCH_END_STEPS, assert_heatmaps_at_steps, heatmap_tag, no_skipped_explanation


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, make_trainer):
    root = tmp_path_factory.mktemp("fit")
    seed_everything(0)
    callback = GAECallback(num_samples=3, methods=("gae", "rollout"))
    trainer = make_trainer(root, [callback], max_epochs=2, limit_train_batches=4)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    return Path(trainer.logger.log_dir), callback


@pytest.mark.slow
def test_heatmaps_and_scalars_are_logged_at_every_explanation_step(fitted, read_events):
    logdir, callback = fitted
    acc = read_events(logdir)
    images, scalars = acc.Tags()["images"], acc.Tags()["scalars"]
    assert len(callback.sample_indices) == 3
    for sample in callback.sample_indices:
        # A heatmap row at both explanation steps; the evolution strip (evolution_length 5) at the last one.
        for kind, steps in (("gae_heatmaps", 2), ("gae_evolution", 1)):
            tag = f"{kind}/val_{sample}"
            assert tag in images
            assert len({e.step for e in acc.Images(tag)}) == steps, tag
    for method in ("gae", "rollout"):
        assert f"relevance_concentration/{method}" in scalars
        assert f"relevance_stability_spearman/{method}" in scalars
        assert f"relevance_stability_topk_overlap/{method}" in scalars
        assert f"relevance/{method}" in acc.Tags()["histograms"]
        values = [e.value for e in acc.Scalars(f"relevance_concentration/{method}")]
        assert all(0.0 < v <= 1.0 for v in values)


@pytest.mark.slow
def test_a_real_tensorboard_server_serves_the_tags(fitted):
    logdir, callback = fitted
    with tensorboard_server(logdir.parent) as server:
        deadline = time.monotonic() + 60
        base = f"{server}/data/plugin"
        run = logdir.name
        image_tags = scalar_tags = {}
        heatmap = f"gae_heatmaps/val_{callback.sample_indices[0]}"
        while time.monotonic() < deadline:
            image_tags = get_json(f"{base}/images/tags").get(run, {})
            scalar_tags = get_json(f"{base}/scalars/tags").get(run, {})
            if heatmap in image_tags and "relevance_concentration/gae" in scalar_tags:
                break
            time.sleep(0.5)
        assert heatmap in image_tags
        assert "relevance_concentration/gae" in scalar_tags


@pytest.mark.slow
def test_pytorch_lightning_tensorboard_logger_together_with_a_csv_logger(tmp_path, make_trainer, read_events):
    # The separate pytorch_lightning package has its own logger classes; lightning.pytorch's Trainer
    # takes them, and the callback finds the SummaryWriter of whichever logger has one.
    tensorboard = PLTensorBoardLogger(tmp_path, name="tb")
    table = CSVLogger(tmp_path, name="csv")
    callback = GAECallback(num_samples=2)
    trainer = make_trainer(tmp_path, [callback], logger=[tensorboard, table], limit_val_batches=1)
    with no_skipped_explanation():
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))

    acc = read_events(tensorboard.log_dir)
    assert_heatmaps_at_steps(acc, callback, EPOCH_END_STEPS)
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == EPOCH_END_STEPS
    with open(Path(table.log_dir) / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("relevance_concentration/gae")]
    assert [int(r["step"]) for r in rows] == EPOCH_END_STEPS
    assert all(0.0 < float(r["relevance_concentration/gae"]) <= 1.0 for r in rows)
    assert rows[-1]["relevance_stability_spearman/gae"]


@pytest.mark.slow
def test_more_samples_than_the_validation_set_warns_and_every_picture_stays_bounded(tmp_path, make_trainer,
                                                                                     read_events):
    # One run wrote a 386 x 70,949 px grid of every sample. Now a picture holds one sample, and the
    # evolution of 40 steps (40 columns of 128 px: wider than 5,000 px as drawn) is shrunk to the limit.
    data = DigitsDataModule()
    data.setup()
    callback = GAECallback(num_samples=50, faithfulness=FaithfulnessOptions(metrics=(), random_baseline=False),
                           display=DisplayOptions(evolution_length=40))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    with pytest.warns(UserWarning, match=r"num_samples=50\): there are only the 6 samples of the validation set; "
                                         r"tracking all 6"):
        trainer.fit(small_vit(), DataLoader(data.train_set, batch_size=32, shuffle=True),
                    DataLoader(Subset(data.val_set, range(6)), batch_size=4))
    assert sorted(callback.sample_indices) == list(range(6))
    acc = read_events(trainer.logger.log_dir)
    sizes = set()
    for sample in range(6):
        assert acc.image_steps(heatmap_tag(sample)) == [1]
        picture = acc.Images(heatmap_tag(sample))[0]
        sizes.add((picture.height, picture.width))
    # Every picture is one row (input and GAE, 256 px panels) whatever the number of samples.
    assert len(sizes) == 1 and next(iter(sizes))[0] < 2 * 256
    evolution = acc.Images("gae_evolution/val_0")[0]
    assert evolution.width == MAX_IMAGE_SIDE and evolution.height < evolution.width / 20


class _ScalarsOnly(Logger):
    """A logger as Lightning's docs show one: name, version, hyperparameters and metrics; no ``experiment``."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "scalars_only"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append((step, dict(metrics)))


@pytest.mark.slow
def test_a_logger_without_an_experiment_gets_the_scalars_and_the_run_ends(tmp_path, make_trainer, capsys):
    # It used to fail every explanation step and then fit() itself, from the summary, after training had finished.
    seed_everything(0)
    logger = _ScalarsOnly()
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(samples=8, interim_samples=0))
    trainer = make_trainer(tmp_path, [callback], logger=logger, max_epochs=1, limit_train_batches=2)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    logged = {tag for _, metrics in logger.metrics for tag in metrics}
    assert {"positive_perturbation_auc/gae", "positive_perturbation_auc/random",
            "relevance_concentration/gae"} <= logged
    out = capsys.readouterr().out
    assert "GAECallback: the fit ended" in out and "positive_perturbation_auc" in out
    assert "no logger writes TensorBoard event files" in out
