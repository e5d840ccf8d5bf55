"""When GAECallback explains: at the end of validation epochs, every n optimizer steps (also under gradient
accumulation), in validate() before and after fit, and at the step Lightning logs the module's own values."""

import warnings

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from recipes.digits import DigitsDataModule
from tests.helpers.models import small_vit
from tests.helpers.trainer import assert_heatmaps_at_steps, heatmap_tag, no_skipped_explanation


@pytest.mark.slow
@pytest.mark.parametrize("target", ["pred", "label"])
def test_validate_under_inference_mode_logs_heatmaps(tmp_path, target, make_trainer, read_events):
    # validate() reads the samples in inference mode: the labels, explained with target="label",
    # must still be usable by autograd.
    callback = GAECallback(num_samples=2, target=target)
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=4, inference_mode=True)
    with no_skipped_explanation():
        trainer.validate(small_vit(), DigitsDataModule(batch_size=32))
    acc = read_events(trainer.logger.log_dir)
    assert f"gae_heatmaps/val_{callback.sample_indices[0]}" in acc.Tags()["images"]


@pytest.mark.slow
def test_accumulation_explains_once_per_optimizer_step_multiple_of_n(tmp_path, make_trainer, read_events):
    # 8 micro-batches per epoch, 2 per optimizer step: steps 1..4, then 5..8. on_train_batch_end fires
    # twice with the same global_step (3 and 6 included), but each step must be explained once. Steps 3
    # and 6 are explained right after the optimizer stepped, where Lightning logs that batch at 2 and 5.
    callback = GAECallback(num_samples=2, every_n_epochs=None, every_n_train_steps=3)
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=8, limit_val_batches=1, accumulate_grad_batches=2)
    with no_skipped_explanation():
        trainer.fit(small_vit(), DigitsDataModule(batch_size=16))
    assert trainer.global_step == 8
    acc = read_events(trainer.logger.log_dir)
    assert_heatmaps_at_steps(acc, callback, [2, 5])
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == [2, 5]
    assert [e.step for e in acc.Scalars("relevance_stability_spearman/gae")] == [5]


@pytest.mark.slow
def test_validate_after_fit_with_the_same_callback_logs_at_lightnings_step(tmp_path, make_trainer, read_events):
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(metrics=()))
    trainer = make_trainer(tmp_path, [callback])
    model, data = small_vit(), DigitsDataModule(batch_size=32)
    trainer.fit(model, data)
    trainer.validate(model, data)
    acc = read_events(trainer.logger.log_dir)
    # Fit's two epochs end at 1 and 3; validate() logs where its val_loss goes, after the last step.
    assert acc.image_steps(heatmap_tag(callback.sample_indices[0])) == [1, 3, 4]
    assert [e.step for e in acc.Scalars("val_loss")] == [1, 3, 4]
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == [1, 3, 4]


@pytest.mark.slow
def test_scalars_land_at_the_step_of_the_modules_own_validation_logs_under_accumulation(tmp_path, make_trainer,
                                                                                         read_events):
    # Validation every 3 micro-batches with 2 per optimizer step: once mid-accumulation (global step 1,
    # Lightning's step 1), once at the epoch end (global step 3, Lightning's step still 2).
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(metrics=()))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=6,
                           accumulate_grad_batches=2, val_check_interval=3, limit_val_batches=1)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=16))
    acc = read_events(trainer.logger.log_dir)
    assert [e.step for e in acc.Scalars("val_loss")] == [1, 2]
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == [1, 2]
    assert acc.image_steps(heatmap_tag(callback.sample_indices[0])) == [1, 2]


@pytest.mark.slow
def test_fast_dev_run_explains_nothing_and_warns_nothing(tmp_path):
    """fast_dev_run gives the Trainer no-op loggers: the callback checks its setup and stays quiet."""
    callback = GAECallback(num_samples=10, faithfulness=FaithfulnessOptions(samples=16))
    trainer = Trainer(default_root_dir=tmp_path, fast_dev_run=True, logger=TensorBoardLogger(tmp_path),
                      callbacks=[callback], enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    assert not [w for w in seen if "GAECallback" in str(w.message)], [str(w.message) for w in seen]
    assert callback.sample_indices is not None and callback.run.last_explained is None
