"""GAECallback's tracked samples: which ones it picks, from which validation dataloader, and after a resume."""

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import CombinedLoader
from torch import Tensor
from torch.utils.data import DataLoader, Subset, SubsetRandomSampler, default_collate

from lightning_gae.callbacks import BatchOptions, FaithfulnessOptions, GAECallback
from lightning_gae.callbacks.gae_monitor import default_batch_inputs, default_batch_labels
from lightning_gae.callbacks.samples import balanced_choice
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier
from tests.helpers.models import small_vit
from tests.helpers.trainer import heatmap_tag


def test_samples_are_class_balanced():
    labels = torch.arange(10).repeat_interleave(20)

    chosen = balanced_choice(labels, 200, 10, seed=0)
    assert sorted(int(labels[i]) for i in chosen) == list(range(10))
    assert chosen == balanced_choice(labels, 200, 10, seed=0)
    assert chosen != balanced_choice(labels, 200, 10, seed=1)


@pytest.mark.slow
def test_tracked_samples_cover_every_class_or_the_warning_names_the_missing_ones(tmp_path, make_trainer):
    data = DigitsDataModule(batch_size=64)
    seed_everything(0)
    every = GAECallback(num_samples=10, methods=("gae",), faithfulness=FaithfulnessOptions(samples=0, metrics=()))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_trainer(tmp_path / "ten", [every], max_epochs=1, limit_train_batches=4).fit(small_vit(), data)
    assert not [w for w in seen if "show no sample of class" in str(w.message)]
    labels = torch.cat([batch[1] for batch in data.val_dataloader()])
    assert sorted(int(labels[i]) for i in every.sample_indices) == list(range(10))

    seed_everything(0)
    eight = GAECallback(num_samples=8, methods=("gae",), faithfulness=FaithfulnessOptions(samples=0, metrics=()))
    with pytest.warns(UserWarning, match=r"10 classes, so the tracked samples show no sample of class \[8, 9\]; "
                                         r"pass num_samples=10"):
        make_trainer(tmp_path / "eight", [eight], max_epochs=1, limit_train_batches=4).fit(small_vit(), data)
    assert {int(labels[i]) for i in eight.sample_indices} == set(range(8))


@pytest.mark.slow
def test_resume_tracks_the_same_samples(tmp_path, make_trainer, read_events):
    seed_everything(0)
    first = GAECallback(num_samples=4, batches=BatchOptions(seed=0))
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}")
    make_trainer(tmp_path, [first, checkpoint], max_epochs=2, limit_train_batches=4).fit(
        small_vit(), DigitsDataModule(batch_size=32))

    fresh = GAECallback(num_samples=4, batches=BatchOptions(seed=99))  # on its own it chooses other samples
    make_trainer(tmp_path, [fresh], max_epochs=1, limit_train_batches=4).fit(small_vit(), DigitsDataModule(batch_size=32))
    assert fresh.sample_indices != first.sample_indices

    resumed = GAECallback(num_samples=4, batches=BatchOptions(seed=99))
    trainer = make_trainer(tmp_path, [resumed], max_epochs=2, limit_train_batches=4)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32), ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"))
    assert resumed.sample_indices == first.sample_indices
    # The stability scalars continue from the checkpointed relevance: the first resumed step has them.
    assert "relevance_stability_spearman/gae" in read_events(trainer.logger.log_dir).Tags()["scalars"]


# --- several validation dataloaders -------------------------------------------------------------


class TwoLoaders(ViTClassifier):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))


def two_loaders(kind):
    data = DigitsDataModule()
    data.setup()
    # Position 300 exists only in "large": where the samples come from decides whether the run starts.
    loaders = {"small": DataLoader(Subset(data.val_set, range(40)), batch_size=32),
               "large": DataLoader(data.val_set, batch_size=32)}
    train = DataLoader(data.train_set, batch_size=32, shuffle=True)
    return train, (CombinedLoader(loaders, mode="sequential") if kind == "combined" else loaders)


@pytest.mark.slow
@pytest.mark.parametrize("kind,index", [("dict", "large"), ("dict", 1), ("combined", "large"), ("combined", 1)])
def test_samples_come_from_the_named_or_numbered_validation_dataloader(tmp_path, kind, index, make_trainer, read_events):
    callback = GAECallback(faithfulness=FaithfulnessOptions(metrics=()),
                           batches=BatchOptions(sample_indices=[300], dataloader_idx=index))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(TwoLoaders(dim=32, depth=2, heads=2), *two_loaders(kind))
    assert read_events(trainer.logger.log_dir).image_steps(heatmap_tag(300)) == [0]


@pytest.mark.parametrize(
    "index,message",
    [("small", r"\[300\] are outside the 40 samples"),
     ("medium", r"BatchOptions\(dataloader_idx='medium'\)\): the validation dataloaders are named \['small', 'large'\]"),
     (2, r"BatchOptions\(dataloader_idx=2\)\): there are 2 validation dataloaders \(named \['small', 'large'\]\); use 0..1 or a name")],
    ids=["small", "unknown name", "past the last"],
)
def test_a_validation_dataloader_that_is_not_there_stops_the_run_with_the_choices(tmp_path, index, message, make_trainer):
    trainer = make_trainer(tmp_path, [GAECallback(batches=BatchOptions(sample_indices=[300], dataloader_idx=index))], max_epochs=1)
    with pytest.raises(ValueError, match=message):
        trainer.fit(TwoLoaders(dim=32, depth=2, heads=2), *two_loaders("dict"))


@pytest.mark.slow
def test_a_validation_split_chosen_by_a_sampler_is_where_samples_come_from(tmp_path, make_trainer):
    data = DigitsDataModule()
    data.setup()
    split = DataLoader(data.val_set, batch_size=4, sampler=SubsetRandomSampler(range(100, 110)))
    callback = GAECallback(num_samples=20, faithfulness=FaithfulnessOptions(metrics=()))
    with pytest.warns(UserWarning, match=r"num_samples=20\): there are only the 10 samples of the validation set"):
        make_trainer(tmp_path, [callback]).validate(small_vit(), split)
    assert sorted(callback.sample_indices) == list(range(10))


# --- labels named y or target in mapping and dataclass batches (issue 34 item 4) -------------------------------------


@dataclasses.dataclass
class XY:
    x: Tensor
    y: Tensor


_LAYOUTS = {"tuple": lambda x, y: (x, y), "y": lambda x, y: {"x": x, "y": y},
            "target": lambda x, y: {"x": x, "target": y}, "dataclass": XY}


def test_y_or_target_are_the_labels_of_a_mapping_or_dataclass_that_names_no_labels():
    x, y, other = torch.rand(3, 1, 8, 8), torch.tensor([0, 1, 2]), torch.tensor([2, 1, 0])
    for layout in ("y", "target", "dataclass"):
        assert default_batch_labels(_LAYOUTS[layout](x, y)) is y
    assert default_batch_labels({"x": x, "targets": y}) is y
    # labels/label come first; with both y and target, which is meant cannot be told: no labels.
    assert default_batch_labels({"x": x, "y": other, "labels": y}) is y
    assert default_batch_labels({"x": x, "y": y, "target": other}) is None
    # They stay among the inputs: the callback passes a forward only the keys it takes.
    assert default_batch_inputs({"x": x, "y": y}).keys() == {"x", "y"}


class AnyBatch(ViTClassifier):
    def validation_step(self, batch, batch_idx):
        return None


@pytest.mark.slow
def test_y_or_target_of_mapping_and_dataclass_batches_are_scored_as_labels_like_y_of_a_tuple(tmp_path, make_trainer,
                                                                                           read_events):
    # {"x", "y"} batches had no labels: target="label" stopped the run, and the faithfulness of the prediction was
    # scored by the target protocol instead of checking the perturbed predictions against the labels.
    data = DigitsDataModule()
    data.setup()
    scored = {}
    for layout, make in {**_LAYOUTS, "unlabelled": lambda x, y: {"x": x, "digit": y}}.items():
        loader = DataLoader(Subset(data.val_set, range(32)), batch_size=16,
                            collate_fn=lambda samples, make=make: make(*default_collate(samples)))
        for target in ("pred",) if layout == "unlabelled" else ("pred", "label"):
            seed_everything(0)
            callback = GAECallback(num_samples=2, methods=("gae",), target=target,
                                   faithfulness=FaithfulnessOptions(samples=32, metrics=("positive_perturbation_auc",)))
            trainer = make_trainer(tmp_path / layout / target, [callback])
            trainer.validate(AnyBatch(dim=32, depth=2, heads=2), loader)
            scored[layout, target] = read_events(trainer.logger.log_dir).scalar_values()["positive_perturbation_auc/gae"]
    for layout in ("y", "target", "dataclass"):
        for target in ("pred", "label"):
            assert scored[layout, target] == pytest.approx(scored["tuple", target], abs=1e-6), (layout, target)
    # Without labels (a key named otherwise) the prediction's explanation is scored by the target protocol (the
    # unperturbed prediction counts as correct): the labels made the difference.
    assert scored["unlabelled", "pred"] != pytest.approx(scored["tuple", "pred"], abs=1e-3)
