"""GAECallback never changes what the user's run computes, fails before training when it cannot work,
and runs under the set-ups real runs use (persistent workers, ddp_spawn, several validation loaders,
validate after fit, NaNs, sharded strategies). Real Trainers, event files read back with TensorBoard."""

from __future__ import annotations

import gc
import math
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import warnings
import weakref
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import CombinedLoader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset, SubsetRandomSampler

from lightning_gae import ImageTokens
from lightning_gae.callbacks import GAECallback
from lightning_gae.views import MAX_IMAGE_SIDE as _MAX_IMAGE_SIDE
from lightning_gae.views import bounded as _bounded
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier

ROOT = Path(__file__).resolve().parents[1]


def vit(**kwargs):
    return ViTClassifier(dim=32, depth=2, heads=2, **kwargs)


def make_trainer(root, callbacks, **kwargs):
    options = dict(max_epochs=2, limit_train_batches=2, limit_val_batches=2, logger=TensorBoardLogger(root, name="tb"))
    options.update(kwargs)
    return Trainer(default_root_dir=root, callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, accelerator="cpu", **options)


def events(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def scalar_events(acc, prefix=""):
    """``{tag: [(step, value), ...]}`` for the scalar tags starting with ``prefix``."""
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"] if t.startswith(prefix)}


def image_steps(acc, tag):
    return [e.step for e in acc.Images(tag)]


def heatmap_tag(sample):
    """The tag of a tracked sample's picture (the input and every method side by side)."""
    return f"gae_heatmaps/val_{sample}"


def weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def run_script(tmp_path, source, timeout=240):
    """Run ``source`` as a script in its own session (on a hang every process it started is killed)."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, (stdout + stderr)[-4000:]


# --- 1. persistent validation workers -----------------------------------------------------------


class PersistentWorkersDigits(DigitsDataModule):
    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=16, num_workers=2, persistent_workers=True)


def test_persistent_validation_workers_compute_the_same_validation_metrics(tmp_path):
    # With persistent workers, iter() on the Trainer's validation loader returns the loop's live
    # iterator, reset: reading samples through it would leave the validation epoch the leftovers.
    logged, final = [], []
    for callbacks in ([], [GAECallback(num_samples=2, metrics=())]):
        seed_everything(0)
        trainer = make_trainer(tmp_path / str(len(callbacks)), callbacks, limit_val_batches=3)
        trainer.fit(vit(), PersistentWorkersDigits(batch_size=32))
        acc = events(trainer.logger.log_dir)
        logged.append(scalar_events(acc, "val_"))
        final.append({k: v for k, v in trainer.callback_metrics.items() if k.startswith("val_")})
    without, with_callback = logged
    assert set(without) == {"val_loss", "val_acc"} and [s for s, _ in without["val_loss"]] == [1, 3]
    assert with_callback == without
    assert final[0].keys() == final[1].keys() and all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert len(image_steps(acc, heatmap_tag(callbacks[0].sample_indices[0]))) == 2


# --- 2. what cannot work stops the run before training ------------------------------------------


class FlatDigits(DigitsDataModule):
    """Digits as 64 features ``[B, 64]``: not images."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        for split in (self.train_set, self.val_set):
            split.tensors = (split.tensors[0].flatten(1), split.tensors[1])


class FeatureTransformer(ViTClassifier):
    """One token per feature: no image, so no modality can be inferred."""

    def __init__(self) -> None:
        super().__init__(dim=16, depth=1, heads=2)
        self.embed = nn.Linear(1, 16)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(x.flatten(1)[..., None]))[:, 0])


class Keyed(Dataset):
    """Digits as mappings that also carry the sample's index, which the model does not take."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        x, y = self.base[i]
        return {"pixel_values": x, "labels": y, "index": torch.tensor(i)}


class KeyedDigits(DigitsDataModule):
    def train_dataloader(self) -> DataLoader:
        return DataLoader(Keyed(self.train_set), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(Keyed(self.val_set), batch_size=self.batch_size)


class KeyedViT(ViTClassifier):
    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch["pixel_values"]), batch["labels"])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch["pixel_values"]), batch["labels"]))


@pytest.mark.parametrize(
    "callback,model,message",
    [
        pytest.param(dict(modality=ImageTokens(patch_size=4)), vit,
                     r"GAECallback\(modality=ImageTokens\(patch_size=4, prefix_tokens=1\)\) does not fit.*"
                     r"patch_size=2, prefix_tokens=1 would fit", id="wrong patch_size"),
        pytest.param({}, FeatureTransformer, r"cannot infer the modality.*modality=ImageTokens\(patch_size=...\), TextTokens",
                     id="no modality fits"),
        pytest.param({}, KeyedViT, r"cannot be explained.*unexpected keyword argument 'index'.*pass batch_inputs=",
                     id="forward rejects a batch key"),
        pytest.param(dict(sample_indices=[10_000]), vit,
                     r"sample_indices=...\): \[10000\] are outside the 360 samples of the validation set",
                     id="sample outside the validation set"),
    ],
)
def test_what_cannot_work_stops_the_run_before_the_first_step(tmp_path, callback, model, message):
    # Each of these used to surface after a whole epoch (or never: a wrong patch_size gave a run without pictures).
    trainer = make_trainer(tmp_path, [GAECallback(num_samples=2, **callback)])
    data = {KeyedViT: KeyedDigits, FeatureTransformer: FlatDigits}.get(model, DigitsDataModule)(batch_size=32)
    with pytest.raises(ValueError, match=message):
        trainer.fit(model(), data)
    assert trainer.global_step == 0


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


def test_training_draws_the_same_random_numbers_and_weights_with_the_callback(tmp_path):
    # The check before training explains the samples once; collection reads a dataset that draws from
    # numpy: every global RNG must be as it was, so training and its augmentations see the same numbers.
    results = []
    for callbacks in ([], [GAECallback(num_samples=2, every_n_train_steps=2, metrics=())]):
        seed_everything(5)
        model = DrawsRandomNumbers()
        make_trainer(tmp_path / str(len(callbacks)), callbacks).fit(model, AugmentedDigits(batch_size=32))
        results.append((model.draws, weights(model)))
    (draws, without), (draws_with, with_callback) = results
    assert len(draws) == 4 and draws == draws_with
    assert all(torch.equal(without[k], with_callback[k]) for k in without)


# --- 3. ddp_spawn pickles the callback -------------------------------------------------------------


def test_the_callback_pickles():
    callback = GAECallback(num_samples=3, methods=("gae", "rollout"), dataloader_idx="val")
    copy = pickle.loads(pickle.dumps(callback))
    assert (copy.num_samples, copy.methods, copy.dataloader_idx) == (3, ("gae", "rollout"), "val")


DDP_SPAWN_SCRIPT = """
    import sys
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning_gae.callbacks import GAECallback
    from recipes.digits import DigitsDataModule
    from recipes.vit import ViTClassifier

    if __name__ == "__main__":  # spawned processes import this file again
        root = sys.argv[1]
        seed_everything(0)
        trainer = Trainer(default_root_dir=root, logger=TensorBoardLogger(root, name="tb"),
                          callbacks=[GAECallback(num_samples=2, sample_indices=[0, 5], metrics=())],
                          max_epochs=2, limit_train_batches=2, limit_val_batches=1, accelerator="cpu",
                          strategy="ddp_spawn", devices=2, enable_progress_bar=False, enable_model_summary=False,
                          enable_checkpointing=False)
        trainer.fit(ViTClassifier(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=16))
        assert trainer.state.finished
"""


def test_ddp_spawn_on_two_cpu_processes(tmp_path):
    run_script(tmp_path, DDP_SPAWN_SCRIPT)
    event_dirs = {p.parent for p in tmp_path.rglob("events.out.tfevents.*")}
    assert len(event_dirs) == 1
    acc = events(event_dirs.pop())
    counts = Counter((tag, e.step) for tag in acc.Tags()["images"] for e in acc.Images(tag))
    for sample in (0, 5):
        assert sorted(s for (t, s) in counts if t == heatmap_tag(sample)) == [1, 3]
    assert set(counts.values()) == {1}, "rank zero alone logs"


# --- 4. several validation dataloaders -------------------------------------------------------------


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


@pytest.mark.parametrize("kind,index", [("dict", "large"), ("dict", 1), ("combined", "large"), ("combined", 1)])
def test_samples_come_from_the_named_or_numbered_validation_dataloader(tmp_path, kind, index):
    callback = GAECallback(sample_indices=[300], dataloader_idx=index, metrics=())
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(TwoLoaders(dim=32, depth=2, heads=2), *two_loaders(kind))
    assert image_steps(events(trainer.logger.log_dir), heatmap_tag(300)) == [0]


@pytest.mark.parametrize(
    "index,message",
    [("small", r"\[300\] are outside the 40 samples"),
     ("medium", r"dataloader_idx='medium'\): the validation dataloaders are named \['small', 'large'\]"),
     (2, r"dataloader_idx=2\): there are 2 validation dataloaders \(named \['small', 'large'\]\); use 0..1 or a name")],
    ids=["small", "unknown name", "past the last"],
)
def test_a_validation_dataloader_that_is_not_there_stops_the_run_with_the_choices(tmp_path, index, message):
    trainer = make_trainer(tmp_path, [GAECallback(sample_indices=[300], dataloader_idx=index)], max_epochs=1)
    with pytest.raises(ValueError, match=message):
        trainer.fit(TwoLoaders(dim=32, depth=2, heads=2), *two_loaders("dict"))


def test_a_validation_split_chosen_by_a_sampler_is_where_samples_come_from(tmp_path):
    data = DigitsDataModule()
    data.setup()
    split = DataLoader(data.val_set, batch_size=4, sampler=SubsetRandomSampler(range(100, 110)))
    callback = GAECallback(num_samples=20, metrics=())
    with pytest.warns(UserWarning, match=r"num_samples=20\): there are only the 10 samples of the validation set"):
        make_trainer(tmp_path, [callback]).validate(vit(), split)
    assert sorted(callback.sample_indices) == list(range(10))


# --- 5. validate() after fit() -----------------------------------------------------------------------


def test_validate_after_fit_with_the_same_callback_logs_at_lightnings_step(tmp_path):
    callback = GAECallback(num_samples=2, metrics=())
    trainer = make_trainer(tmp_path, [callback])
    model, data = vit(), DigitsDataModule(batch_size=32)
    trainer.fit(model, data)
    trainer.validate(model, data)
    acc = events(trainer.logger.log_dir)
    # Fit's two epochs end at 1 and 3; validate() logs where its val_loss goes, after the last step.
    assert image_steps(acc, heatmap_tag(callback.sample_indices[0])) == [1, 3, 4]
    assert [e.step for e in acc.Scalars("val_loss")] == [1, 3, 4]
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == [1, 3, 4]


# --- 6. non-finite logits ------------------------------------------------------------------------------


class NaNAfterFirstEpoch(ViTClassifier):
    """From epoch 1 on, evaluation returns NaN logits (training itself is untouched)."""

    def forward(self, x):
        logits = super().forward(x)
        return logits * float("nan") if self.current_epoch >= 1 and not self.training else logits


def test_nan_logits_skip_the_step_with_one_warning_and_nothing_non_finite_is_logged(tmp_path):
    # Two NaN steps (epochs 1 and 2), two methods: still one warning.
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"), metrics=(), random_baseline=False)
    trainer = make_trainer(tmp_path, [callback], max_epochs=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(NaNAfterFirstEpoch(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    # The 2 tracked digits leave classes out, which is said once at fit start; not counted here.
    messages = [str(w.message) for w in caught
                if "GAECallback" in str(w.message) and "show no sample of class" not in str(w.message)]
    assert len(messages) == 1 and "not finite (NaN or inf)" in messages[0], messages
    assert trainer.state.finished and trainer.current_epoch == 3
    acc = events(trainer.logger.log_dir)
    # The callback's scalars are <metric>/<method> (the model's own val_loss is NaN from epoch 1 on).
    logged = {t: v for t, v in scalar_events(acc).items() if t.rsplit("/", 1)[-1] in ("gae", "rollout")}
    assert len(logged) == 2 and all(math.isfinite(v) for values in logged.values() for _, v in values)
    assert {s for values in logged.values() for s, _ in values} == {1}
    for sample in callback.sample_indices:
        assert image_steps(acc, heatmap_tag(sample)) == [1]


# --- 7. more samples than the validation set, pictures of bounded size ---------------------------------


def test_more_samples_than_the_validation_set_warns_and_every_picture_stays_bounded(tmp_path):
    # One run wrote a 386 x 70,949 px grid of every sample. Now a picture holds one sample, and the
    # evolution of 40 steps (40 columns of 128 px: wider than 5,000 px as drawn) is shrunk to the limit.
    data = DigitsDataModule()
    data.setup()
    callback = GAECallback(num_samples=50, evolution_length=40, metrics=(), random_baseline=False)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    with pytest.warns(UserWarning, match=r"num_samples=50\): there are only the 6 samples of the validation set; "
                                         r"tracking all 6"):
        trainer.fit(vit(), DataLoader(data.train_set, batch_size=32, shuffle=True),
                    DataLoader(Subset(data.val_set, range(6)), batch_size=4))
    assert sorted(callback.sample_indices) == list(range(6))
    acc = events(trainer.logger.log_dir)
    sizes = set()
    for sample in range(6):
        assert image_steps(acc, heatmap_tag(sample)) == [1]
        picture = acc.Images(heatmap_tag(sample))[0]
        sizes.add((picture.height, picture.width))
    # Every picture is one row (input and GAE, 256 px panels) whatever the number of samples.
    assert len(sizes) == 1 and next(iter(sizes))[0] < 2 * 256
    evolution = acc.Images("gae_evolution/val_0")[0]
    assert evolution.width == _MAX_IMAGE_SIDE and evolution.height < evolution.width / 20


def test_a_picture_larger_than_the_limit_is_shrunk_keeping_its_aspect():
    tall = np.random.default_rng(0).integers(0, 255, (3 * _MAX_IMAGE_SIDE, 300, 3), dtype=np.uint8)
    small = tall[:100]
    shrunk = _bounded(tall)
    assert shrunk.dtype == np.uint8 and shrunk.shape == (_MAX_IMAGE_SIDE, 100, 3)
    assert _bounded(small) is small


# --- 8. sharded strategies ---------------------------------------------------------------------------


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's FSDPStrategy; Lightning refuses the exact class on a CPU accelerator, not a subclass.

    The callback refuses it in ``setup``, before the strategy would shard the model.
    """


def test_fsdp_is_refused_in_setup_with_the_reason(tmp_path):
    environment = dict(os.environ)
    trainer = make_trainer(tmp_path, [GAECallback()], strategy=CPUFSDPStrategy(), devices=1, logger=False)
    try:
        with pytest.raises(ValueError, match=r"GAECallback cannot run with CPUFSDPStrategy: it shards the model's "
                                             r"parameters.*explanations run on rank zero only.*strategy='ddp'"):
            trainer.fit(vit(), DigitsDataModule(batch_size=32))
    finally:
        # Lightning set up a one-process group and its environment for FSDP: leave none to later tests.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)
    assert trainer.global_step == 0


# --- 9. Lightning's step, freed state, hooks -------------------------------------------------------------


def test_scalars_land_at_the_step_of_the_modules_own_validation_logs_under_accumulation(tmp_path):
    # Validation every 3 micro-batches with 2 per optimizer step: once mid-accumulation (global step 1,
    # Lightning's step 1), once at the epoch end (global step 3, Lightning's step still 2).
    callback = GAECallback(num_samples=2, metrics=())
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=6,
                           accumulate_grad_batches=2, val_check_interval=3, limit_val_batches=1)
    trainer.fit(vit(), DigitsDataModule(batch_size=16))
    acc = events(trainer.logger.log_dir)
    assert [e.step for e in acc.Scalars("val_loss")] == [1, 2]
    assert [e.step for e in acc.Scalars("relevance_concentration/gae")] == [1, 2]
    assert image_steps(acc, heatmap_tag(callback.sample_indices[0])) == [1, 2]


class Probe(Callback):
    """Weak references to what the GAECallback built for the run (its samples and metric objects)."""

    def __init__(self, gae: GAECallback) -> None:
        self.gae = gae
        self.refs: list[weakref.ref] = []

    def on_fit_end(self, trainer, pl_module):
        self.refs = [weakref.ref(self.gae._inputs), *map(weakref.ref, self.gae._metric_objects.values())]


def test_after_fit_the_callback_frees_its_samples_and_metric_objects(tmp_path):
    callback = GAECallback(num_samples=2, metrics=("positive_perturbation_auc", "deletion_auc"))
    probe = Probe(callback)
    trainer = make_trainer(tmp_path, [callback, probe], max_epochs=1)
    trainer.fit(vit(), DigitsDataModule(batch_size=32))
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


class _MeanPooledViT(ViTClassifier):
    """The recipe ViT without its CLS token: the head reads the mean of the 16 patch tokens."""

    def forward(self, x: Tensor) -> Tensor:
        vit = self.model
        tokens = vit.patch_embed(x).flatten(2).transpose(1, 2) + vit.pos_embed[:, 1:]
        for block in vit.blocks:
            tokens = block(tokens)
        return vit.head(vit.norm(tokens).mean(dim=1))


@pytest.mark.parametrize("query", [0, "mean"])
def test_an_image_modality_without_cls_read_at_token_0_warns_to_use_the_mean(tmp_path, query):
    # Issue 10 item 17: token 0 of a model without CLS is a patch, not what the head reads.
    seed_everything(0)
    model = _MeanPooledViT(dim=32, depth=2, heads=2)
    callback = GAECallback(num_samples=2, methods=["gae"], metrics=[], query=query,
                           modality=ImageTokens(patch_size=2, prefix_tokens=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [callback], max_epochs=1).fit(model, DigitsDataModule(batch_size=32))
    told = [w for w in caught if "has no CLS token" in str(w.message)]
    if query == 0:
        assert len(told) == 1 and 'query="mean"' in str(told[0].message)
    else:
        assert not told
        # query="mean" explains the pooled patches: 16 tokens per sample, every one with relevance.
        assert events(tmp_path / "tb" / "version_0").Tags()["images"]
