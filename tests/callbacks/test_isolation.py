"""GAECallback leaves the user's run as it was: the same weights bit for bit (also mid-accumulation), the same
random numbers, the same validation metrics with persistent workers; it frees what it built when fit ends, and
every hook it defines overrides one of Lightning's."""

import gc
import random
import weakref

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, seed_everything
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier
from tests.helpers.models import small_vit
from tests.helpers.trainer import heatmap_tag, weights


@pytest.mark.slow
def test_training_is_bitwise_unchanged_by_the_callback(tmp_path, make_trainer):
    results = []
    for callbacks in ([], [GAECallback(num_samples=2, every_n_train_steps=2, methods=("gae", "attn_gradcam"))]):
        seed_everything(3)
        model = small_vit()
        make_trainer(tmp_path / str(len(callbacks)), callbacks, max_epochs=2, limit_train_batches=4).fit(
            model, DigitsDataModule(batch_size=32))
        results.append(weights(model))
    without, with_callback = results
    assert without.keys() == with_callback.keys()
    assert all(torch.equal(without[k], with_callback[k]) for k in without)


@pytest.mark.slow
def test_accumulation_training_is_bitwise_unchanged_by_the_callback(tmp_path, make_trainer, read_events):
    # Validation every 3 micro-batches falls between the two halves of steps 2 and 5, so the epoch
    # explanations at steps 1 and 4 run while .grad holds half a step's gradient: they must not add
    # to it. Steps 3 and 6 are explained by step, right after the optimizer stepped. Logged at Lightning's
    # steps: 1 and 4 mid-accumulation, 2 and 5 for global steps 3 and 6 (the epoch ends' validations
    # see the same weights and are not explained twice).
    results = []
    for callbacks in ([], [GAECallback(num_samples=2, every_n_train_steps=3, methods=("gae", "attn_gradcam"))]):
        seed_everything(3)
        model = small_vit(dropout=0.1)
        trainer = make_trainer(tmp_path / str(len(callbacks)), callbacks, limit_train_batches=6, limit_val_batches=1,
                               accumulate_grad_batches=2, val_check_interval=3)
        trainer.fit(model, DigitsDataModule(batch_size=16))
        results.append(weights(model))
    without, with_callback = results
    assert without.keys() == with_callback.keys()
    assert all(torch.equal(without[k], with_callback[k]) for k in without)
    assert read_events(trainer.logger.log_dir).image_steps(f"gae_heatmaps/val_{callbacks[0].sample_indices[0]}") == [1, 2, 4, 5]


# --- persistent validation workers -----------------------------------------------------------------


class PersistentWorkersDigits(DigitsDataModule):
    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=16, num_workers=2, persistent_workers=True)


@pytest.mark.slow
def test_persistent_validation_workers_compute_the_same_validation_metrics(tmp_path, make_trainer, read_events):
    # With persistent workers, iter() on the Trainer's validation loader returns the loop's live
    # iterator, reset: reading samples through it would leave the validation epoch the leftovers.
    logged, final = [], []
    for callbacks in ([], [GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(metrics=()))]):
        seed_everything(0)
        trainer = make_trainer(tmp_path / str(len(callbacks)), callbacks, limit_val_batches=3)
        trainer.fit(small_vit(), PersistentWorkersDigits(batch_size=32))
        acc = read_events(trainer.logger.log_dir)
        logged.append(acc.scalar_events("val_"))
        final.append({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val_")})
    without, with_callback = logged
    assert set(without) == {"val_loss", "val_acc"} and [s for s, _ in without["val_loss"]] == [1, 3]
    assert with_callback == without
    assert final[0].keys() == final[1].keys() and all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert len(acc.image_steps(heatmap_tag(callbacks[0].sample_indices[0]))) == 2


# --- global random number generators ---------------------------------------------------------------


class NumpyAugmented(Dataset):
    """Validation digits with numpy noise added on reading: reading them draws from numpy's global RNG."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        x, y = self.base[i]
        return x + torch.from_numpy(np.random.normal(0.0, 0.01, x.shape).astype(np.float32)), y


class AugmentedDigits(DigitsDataModule):
    def val_dataloader(self) -> DataLoader:
        return DataLoader(NumpyAugmented(self.val_set), batch_size=self.batch_size)


class DrawsRandomNumbers(ViTClassifier):
    """Records a draw of numpy's, Python's and torch's global RNG at every training step."""

    def __init__(self) -> None:
        super().__init__(dim=32, depth=2, heads=2, dropout=0.1)
        self.draws: list[tuple[float, float, float]] = []

    def training_step(self, batch, batch_idx):
        self.draws.append((float(np.random.random()), random.random(), float(torch.rand(()))))
        return super().training_step(batch, batch_idx)


@pytest.mark.slow
def test_training_draws_the_same_random_numbers_and_weights_with_the_callback(tmp_path, make_trainer):
    # The check before training explains the samples once; collection reads a dataset that draws from
    # numpy: every global RNG must be as it was, so training and its augmentations see the same numbers.
    results = []
    for callbacks in ([], [GAECallback(num_samples=2, every_n_train_steps=2,
                                       faithfulness=FaithfulnessOptions(metrics=()))]):
        seed_everything(5)
        model = DrawsRandomNumbers()
        make_trainer(tmp_path / str(len(callbacks)), callbacks).fit(model, AugmentedDigits(batch_size=32))
        results.append((model.draws, weights(model)))
    (draws, without), (draws_with, with_callback) = results
    assert len(draws) == 4 and draws == draws_with
    assert all(torch.equal(without[k], with_callback[k]) for k in without)


# --- freed state, hooks ----------------------------------------------------------------------------


class Probe(Callback):
    """Weak references to what the GAECallback built for the run (its samples and metric objects)."""

    def __init__(self, gae: GAECallback) -> None:
        self.gae = gae
        self.refs: list[weakref.ref] = []

    def on_fit_end(self, trainer, pl_module):
        self.refs = [weakref.ref(self.gae.run.state.inputs), *map(weakref.ref, self.gae.run.state.metric_objects.values())]


@pytest.mark.slow
def test_after_fit_the_callback_frees_its_samples_and_metric_objects(tmp_path, make_trainer):
    callback = GAECallback(num_samples=2,
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc", "deletion_auc")))
    probe = Probe(callback)
    trainer = make_trainer(tmp_path, [callback, probe], max_epochs=1)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    gc.collect()
    # Both metrics were built and held the module through their forward_fn; the callback outlives the run.
    assert len(probe.refs) == 3
    assert all(ref() is None for ref in probe.refs)


def test_every_hook_is_marked_as_overriding_lightnings():
    hooks = [name for name in vars(GAECallback) if name in vars(Callback) and not name.startswith("__")]
    assert {"setup", "teardown", "on_fit_start", "on_validation_start", "on_validation_epoch_end",
            "on_train_batch_end", "state_dict", "load_state_dict", "state_key"} <= set(hooks)
    for name in hooks:
        member = vars(GAECallback)[name]
        function = member.fget if isinstance(member, property) else member
        assert getattr(function, "__override__", False), name
