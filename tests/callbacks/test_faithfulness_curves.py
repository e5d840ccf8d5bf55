"""Faithfulness over training: the schedule's points per fit, each an honest score of the samples it names, and
one TensorBoard run per method so that every chart draws each method in its own colour."""

import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, seed_everything
from lightning.pytorch.cli import LightningCLI
from tensorboard.plugins.custom_scalar import layout_pb2

from lightning_gae import ImageTokens, explain
from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from lightning_gae.metrics import PositivePerturbationAUC, random_attribution
from recipes.digits import DigitsDataModule
from tests.helpers.models import small_vit
from tests.helpers.processes import ROOT

METRICS = ("negative_perturbation_auc", "positive_perturbation_auc")


def _method_runs(log_dir):
    """``{method: its run's folder}`` under a logger's log dir."""
    return {path.name: path for path in sorted((Path(log_dir) / "methods").iterdir())}


@pytest.mark.slow
def test_the_main_job_at_its_defaults_logs_a_curve_of_at_least_five_points(tmp_path, read_events):
    # The main job's config as the README runs it, its 30 epochs and 5 explanation steps, on 2 training batches
    # per epoch so that the test is quick: the callback's schedule is the config's and the callback's defaults.
    args = ["--config", str(ROOT / "configs" / "vit_digits.yaml"), f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_progress_bar=false", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
            "--trainer.enable_checkpointing=false"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = LightningCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                           save_config_callback=None, run=False, args=args)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, GAECallback)]
    log_dir = cli.trainer.logger.log_dir
    acc = read_events(log_dir)
    pictures = acc.image_steps(f"gae_heatmaps/val_{callback.sample_indices[0]}")
    assert len(pictures) == 5
    methods = (*callback.methods, "random")
    for metric in METRICS:
        for method in methods:
            steps = acc.scalar_steps(f"{metric}/{method}")
            # Every explanation step, the last included, on the same part of the subset: one continuous curve.
            assert steps == pictures, (metric, method)
            assert acc.scalar_steps(f"{metric}/{method}/stderr") == steps
    counts = [(e.step, e.value) for e in acc.Scalars("faithfulness_samples")]
    assert counts == [(s, 32.0) for s in pictures]
    # The summary printed when fit ends says how to score the whole subset of 256.
    assert "these are 32 of the 256 samples of the faithfulness subset" in callback.summary
    assert "trainer.validate(trainer.lightning_module, datamodule=trainer.datamodule)" in callback.summary
    # Each method's own run holds the same values under one tag per metric, for the charts that compare methods.
    runs = _method_runs(log_dir)
    assert set(runs) == set(methods)
    for method, folder in runs.items():
        own = read_events(folder)
        for metric in METRICS:
            logged = [(e.step, e.value) for e in acc.Scalars(f"{metric}/{method}")]
            assert [(e.step, e.value) for e in own.Scalars(f"gae_faithfulness/{metric}")] == logged
            errors = [(e.step, e.value) for e in acc.Scalars(f"{metric}/{method}/stderr")]
            assert [(e.step, e.value) for e in own.Scalars(f"gae_faithfulness/{metric}/stderr")] == errors
        if method != "random":
            assert own.scalar_steps("gae_relevance/relevance_concentration") == pictures


class Snapshots(Callback):
    """After GAECallback (later in the callback list) explained: the weights and the interim part it scored."""

    def __init__(self, gae):
        self.gae, self.taken = gae, []

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self.taken.append((step, state, self.gae.run.state.interim))


def _dense_auc(model, x, label, tokens):
    """One sample's positive perturbation AUC, alone: the metric over a batch of one."""
    metric = PositivePerturbationAUC(model, ImageTokens(patch_size=2), protocol="predicted")
    metric.update(x[None], tokens[None], label[None])
    return metric.compute().item()


@pytest.mark.slow
def test_interim_points_equal_a_dense_rescoring_of_the_samples_they_name(tmp_path, make_trainer, read_events):
    seed_everything(0)
    gae = GAECallback(num_samples=2, methods=("gae",),
                      faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=40, interim_samples=12, every_n_explanations=1))
    snapshots = Snapshots(gae)
    trainer = make_trainer(tmp_path, [gae, snapshots], max_epochs=3, limit_train_batches=3)
    trainer.fit(small_vit(dropout=0.0), DigitsDataModule(batch_size=32))
    acc = read_events(trainer.logger.log_dir)
    logged = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in
              ("positive_perturbation_auc/gae", "positive_perturbation_auc/gae/stderr", "positive_perturbation_auc/random",
               "faithfulness_samples")}
    parts = []
    for step, state, interim in snapshots.taken:
        model = small_vit(dropout=0.0)
        model.load_state_dict(state)
        model.eval()
        x, labels = interim.inputs, interim.labels
        parts.append(labels)
        assert len(labels) == 12 and logged["faithfulness_samples"][step] == 12
        # One sample at a time: its own explanation, its own curve.
        own = [_dense_auc(model, x[i], labels[i], explain(model, x[i : i + 1]).tokens[0]) for i in range(len(labels))]
        values = torch.tensor(own, dtype=torch.float64)
        assert logged["positive_perturbation_auc/gae"][step] == pytest.approx(values.mean().item(), abs=1e-4)
        assert logged["positive_perturbation_auc/gae/stderr"][step] == pytest.approx(
            values.std().item() / math.sqrt(len(own)), rel=1e-4)
        # The random floor: the same seeded relevance per position in the part, at every step.
        noise = random_attribution(torch.empty(len(labels), 17), gae.batches.seed)
        floor = [_dense_auc(model, x[i], labels[i], noise[i]) for i in range(len(labels))]
        assert logged["positive_perturbation_auc/random"][step] == pytest.approx(sum(floor) / len(floor), abs=1e-4)
    # The same samples at every step, the final weights' included, stratified over the classes.
    assert len(parts) == 3 and all(torch.equal(parts[0], part) for part in parts)
    assert len(set(parts[0].tolist())) == 10


@pytest.mark.slow
def test_a_fit_ending_on_max_steps_scores_its_part_at_its_last_explanation_and_validate_all(tmp_path, make_trainer,
                                                                                            read_events):
    # Explanations every 2 optimizer steps up to max_steps=6: steps 2 and 4 are scheduled interim points, 6 the last.
    gae = GAECallback(num_samples=2, every_n_epochs=None, every_n_train_steps=2,
                      faithfulness=FaithfulnessOptions(samples=24, interim_samples=8, every_n_explanations=1, metrics=("positive_perturbation_auc",)))
    trainer = make_trainer(tmp_path, [gae], max_epochs=5, max_steps=6, limit_train_batches=4)
    model, data = small_vit(), DigitsDataModule(batch_size=32)
    trainer.fit(model, data)
    acc = read_events(trainer.logger.log_dir)
    assert [e.value for e in acc.Scalars("faithfulness_samples")] == [8.0, 8.0, 8.0]
    # Scored once per step: the final weights are not scored again when fit ends.
    steps = acc.scalar_steps("positive_perturbation_auc/gae")
    assert len(steps) == len(set(steps)) == 3
    # validate() scores the whole subset, on the same weights, after them (its events in a file of their own).
    trainer.validate(model, data)
    counts = sorted((e.step, e.value) for e in read_events(trainer.logger.log_dir).Scalars("faithfulness_samples"))
    assert counts[:3] == [(step, 8.0) for step in steps] and counts[3][0] >= steps[-1] and counts[3][1] == 24.0


@pytest.mark.slow
def test_the_custom_scalars_layout_charts_each_metric_with_every_method_as_its_own_run(tmp_path, make_trainer,
                                                                                      read_events):
    seed_everything(0)
    gae = GAECallback(num_samples=2, methods=("gae", "rollout"), faithfulness=FaithfulnessOptions(samples=16))
    trainer = make_trainer(tmp_path, [gae], max_epochs=2, limit_train_batches=2)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    log_dir = trainer.logger.log_dir
    acc = read_events(log_dir)
    layout = layout_pb2.Layout()
    layout.ParseFromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    charts = {chart.title: chart for category in layout.category for chart in category.chart}
    assert {category.title for category in layout.category} == {"GAE faithfulness", "GAE relevance"}
    assert set(charts) == {*METRICS, "relevance_concentration", "relevance_stability_spearman",
                           "relevance_stability_topk_overlap"}
    runs = {"": acc, **{method: read_events(folder) for method, folder in _method_runs(log_dir).items()}}
    assert set(runs) == {"", "gae", "rollout", "random"}
    for title, chart in charts.items():
        # One multi-line chart per metric; TensorBoard matches its expression against each run's tags and draws
        # every match as a series named "<tag> (<run>)", coloured by its run: one series, one colour, per method.
        (expression,) = chart.multiline.tag
        matches = {run: [t for t in events.Tags()["scalars"] if re.match(expression, t)] for run, events in runs.items()}
        expected = {"gae", "rollout"} | ({"random"} if title in METRICS else set())
        assert {run for run, tags in matches.items() if tags} == expected, title
        assert all(len(tags) == 1 for tags in matches.values() if tags), title
