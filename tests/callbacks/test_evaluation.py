"""GAECallback in ``trainer.validate()`` and ``trainer.test()``: test() scores the whole faithfulness subset of the test
data under its own tags, and a validation or test of a checkpoint on a new Trainer logs at the checkpoint's step;
the ``lightning-gae validate`` command the end-of-fit summary prints logs into the fit's own run at its last step."""

from __future__ import annotations

import warnings

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from lightning_gae.callbacks.evaluation import checkpoint_step
from recipes.digits import DigitsDataModule
from tests.helpers.models import small_vit
from tests.helpers.report import section, value_and_error


def _callback() -> GAECallback:
    return GAECallback(num_samples=2, methods=("gae",), faithfulness=FaithfulnessOptions(samples=40, interim_samples=8))


def test_the_step_of_a_checkpoint_is_the_one_its_fit_logged_at():
    # Saved at a validation's end, before Lightning counts the batch: the fit logged its final weights one later.
    loops = {"fit_loop": {"epoch_loop.state_dict": {"_batches_that_stepped": 5}}}
    assert checkpoint_step({"global_step": 6, "loops": loops}) == 6
    assert checkpoint_step({"global_step": 12, "loops": loops}) == 6  # two optimizers step twice per batch
    assert checkpoint_step({"global_step": 12}) == 12
    assert checkpoint_step({}) is None


@pytest.mark.slow
def test_test_scores_the_whole_subset_of_the_test_data_under_its_own_tags(tmp_path, make_trainer, read_events,
                                                                         capsys):
    seed_everything(0)
    trainer = make_trainer(tmp_path, [_callback()], limit_train_batches=3, limit_test_batches=2)
    model, data = small_vit(), DigitsDataModule(batch_size=32)
    trainer.fit(model, data)
    capsys.readouterr()
    trainer.test(model, data)
    out = capsys.readouterr().out
    assert out.count("GAECallback: the test ended") == 1 and "not scored" not in out, out
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    assert f"faithfulness (40 test samples at step {step};" in out
    events = read_events(trainer.logger.log_dir)
    logged = events.scalar_events("test_")
    assert logged["test_faithfulness_samples"] == [(step, 40.0)]
    rows = {row[0]: row[1] for row in section(out, "faithfulness (")[1:]}
    assert set(rows) == {"gae", "random"}
    value, _ = value_and_error(rows["gae"])
    assert logged["test_positive_perturbation_auc/gae"][0][1] == pytest.approx(value, abs=1e-3)
    assert "test_positive_perturbation_auc/gae/stderr" in logged
    # The validation curves hold validation numbers only: test's are under test_<tag>, and it draws no picture.
    assert events.scalar_values()["faithfulness_samples"] == [8.0, 8.0]


@pytest.mark.slow
def test_validate_and_test_of_a_checkpoint_on_a_new_trainer_log_at_its_step(tmp_path, make_trainer, read_events):
    seed_everything(0)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt")
    trainer = make_trainer(tmp_path, [_callback(), checkpoints], limit_train_batches=3)
    model, data = small_vit(), DigitsDataModule(batch_size=32)
    trainer.fit(model, data)
    step = trainer.fit_loop.epoch_loop._batches_that_stepped
    assert step > 0
    later = _callback()
    fresh = make_trainer(tmp_path, [later], name="later", limit_test_batches=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh.validate(small_vit(), data, ckpt_path=checkpoints.best_model_path)
        fresh.test(small_vit(), data, ckpt_path=checkpoints.best_model_path)
    events = read_events(fresh.logger.log_dir)
    assert events.scalar_steps("faithfulness_samples") == [step]
    assert events.scalar_steps("test_faithfulness_samples") == [step]
    assert events.image_steps(f"gae_heatmaps/val_{later.sample_indices[0]}") == [step]
    assert torch.load(checkpoints.best_model_path, weights_only=False)["global_step"] == step
