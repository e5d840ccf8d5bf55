"""GAECallback in real training: real Trainer, real TensorBoard event files and server."""

import json
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_gae.callbacks import GAECallback
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier


def small_model():
    return ViTClassifier(dim=32, depth=2, heads=2, dropout=0.1)


def make_trainer(root, callbacks, max_epochs=2, logger=True, **kwargs):
    return Trainer(
        default_root_dir=root,
        max_epochs=max_epochs,
        limit_train_batches=4,
        limit_val_batches=2,
        logger=TensorBoardLogger(root, name="tb") if logger else False,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        accelerator="cpu",
        **kwargs,
    )


def events(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"images": 0, "scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    seed_everything(0)
    callback = GAECallback(num_samples=3, methods=("gae", "rollout"))
    trainer = make_trainer(root, [callback], max_epochs=2)
    trainer.fit(small_model(), DigitsDataModule(batch_size=32))
    return Path(trainer.logger.log_dir), callback


def test_heatmaps_and_scalars_are_logged_at_every_explanation_step(fitted):
    logdir, callback = fitted
    acc = events(logdir)
    images, scalars = acc.Tags()["images"], acc.Tags()["scalars"]
    assert len(callback.sample_indices) == 3
    for sample in callback.sample_indices:
        for kind in ("gae_heatmaps", "gae_evolution"):
            tag = f"{kind}/val_{sample}"
            assert tag in images
            assert len({e.step for e in acc.Images(tag)}) == 2, tag
    for method in ("gae", "rollout"):
        assert f"relevance_concentration/{method}" in scalars
        assert f"relevance_stability_spearman/{method}" in scalars
        assert f"relevance_stability_topk_overlap/{method}" in scalars
        assert f"relevance/{method}" in acc.Tags()["histograms"]
        values = [e.value for e in acc.Scalars(f"relevance_concentration/{method}")]
        assert all(0.0 < v <= 1.0 for v in values)


def test_samples_are_class_balanced():
    labels = torch.arange(10).repeat_interleave(20)
    from lightning_gae.callbacks.gae_monitor import _balanced_choice

    chosen = _balanced_choice(labels, 200, 10, seed=0)
    assert sorted(int(labels[i]) for i in chosen) == list(range(10))
    assert chosen == _balanced_choice(labels, 200, 10, seed=0)
    assert chosen != _balanced_choice(labels, 200, 10, seed=1)


def test_tracked_samples_cover_every_class_or_the_warning_names_the_missing_ones(tmp_path):
    data = DigitsDataModule(batch_size=64)
    seed_everything(0)
    every = GAECallback(num_samples=10, methods=("gae",), metric_samples=0, metrics=())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_trainer(tmp_path / "ten", [every], max_epochs=1).fit(small_model(), data)
    assert not [w for w in seen if "show no sample of class" in str(w.message)]
    labels = torch.cat([batch[1] for batch in data.val_dataloader()])
    assert sorted(int(labels[i]) for i in every.sample_indices) == list(range(10))

    seed_everything(0)
    eight = GAECallback(num_samples=8, methods=("gae",), metric_samples=0, metrics=())
    with pytest.warns(UserWarning, match=r"10 classes, so the tracked samples show no sample of class \[8, 9\]; "
                                         r"pass num_samples=10"):
        make_trainer(tmp_path / "eight", [eight], max_epochs=1).fit(small_model(), data)
    assert {int(labels[i]) for i in eight.sample_indices} == set(range(8))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url, deadline):
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_real_tensorboard_server_serves_the_tags(fitted):
    logdir, callback = fitted
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir.parent), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        base = f"http://127.0.0.1:{port}/data/plugin"
        run = logdir.name
        image_tags = scalar_tags = {}
        heatmap = f"gae_heatmaps/val_{callback.sample_indices[0]}"
        while time.monotonic() < deadline:
            image_tags = _get_json(f"{base}/images/tags", deadline).get(run, {})
            scalar_tags = _get_json(f"{base}/scalars/tags", deadline).get(run, {})
            if heatmap in image_tags and "relevance_concentration/gae" in scalar_tags:
                break
            time.sleep(0.5)
        assert heatmap in image_tags
        assert "relevance_concentration/gae" in scalar_tags
    finally:
        server.terminate()
        server.wait(timeout=30)


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_training_is_bitwise_unchanged_by_the_callback(tmp_path):
    results = []
    for callbacks in ([], [GAECallback(num_samples=2, every_n_train_steps=2, methods=("gae", "attn_gradcam"))]):
        seed_everything(3)
        model = small_model()
        make_trainer(tmp_path / str(len(callbacks)), callbacks, max_epochs=2).fit(model, DigitsDataModule(batch_size=32))
        results.append(_weights(model))
    without, with_callback = results
    assert without.keys() == with_callback.keys()
    assert all(torch.equal(without[k], with_callback[k]) for k in without)


def test_resume_tracks_the_same_samples(tmp_path):
    seed_everything(0)
    first = GAECallback(num_samples=4, seed=0)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}")
    make_trainer(tmp_path, [first, checkpoint], max_epochs=2).fit(small_model(), DigitsDataModule(batch_size=32))

    fresh = GAECallback(num_samples=4, seed=99)  # on its own it chooses other samples
    make_trainer(tmp_path, [fresh], max_epochs=1).fit(small_model(), DigitsDataModule(batch_size=32))
    assert fresh.sample_indices != first.sample_indices

    resumed = GAECallback(num_samples=4, seed=99)
    trainer = make_trainer(tmp_path, [resumed], max_epochs=2)
    trainer.fit(small_model(), DigitsDataModule(batch_size=32), ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"))
    assert resumed.sample_indices == first.sample_indices
    # The stability scalars continue from the checkpointed relevance: the first resumed step has them.
    assert "relevance_stability_spearman/gae" in events(trainer.logger.log_dir).Tags()["scalars"]


@pytest.mark.parametrize("target", ["pred", "label"])
def test_validate_under_inference_mode_logs_heatmaps(tmp_path, target):
    # validate() reads the samples in inference mode: the labels, explained with target="label",
    # must still be usable by autograd.
    callback = GAECallback(num_samples=2, target=target)
    trainer = make_trainer(tmp_path, [callback], inference_mode=True)
    with _no_skip_warning():
        trainer.validate(small_model(), DigitsDataModule(batch_size=32))
    acc = events(trainer.logger.log_dir)
    assert f"gae_heatmaps/val_{callback.sample_indices[0]}" in acc.Tags()["images"]


class _no_skip_warning:
    """Fails if the callback reports a skipped explanation."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self._records = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        skipped = [str(w.message) for w in self._records if "was skipped" in str(w.message)]
        assert not skipped, skipped


class BreaksAfterFirstEpoch(ViTClassifier):
    """From epoch 1 on, evaluation bypasses attention: explanations fail, training goes on."""

    def forward(self, x):
        if self.current_epoch >= 1 and not self.training:
            return self.model.head(self.model.patch_embed(x).mean(dim=(2, 3)))
        return super().forward(x)


def test_a_model_that_breaks_mid_run_warns_and_training_finishes(tmp_path):
    callback = GAECallback(num_samples=2)
    trainer = make_trainer(tmp_path, [callback], max_epochs=3)
    with pytest.warns(UserWarning, match=r"GAECallback: explanation at step \d+ failed and was skipped \(ValueError: no attention was recorded"):
        trainer.fit(BreaksAfterFirstEpoch(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    assert trainer.current_epoch == 3 and trainer.state.finished
    steps = {e.step for e in events(trainer.logger.log_dir).Images(f"gae_heatmaps/val_{callback.sample_indices[0]}")}
    assert len(steps) == 1, "only the first epoch could be explained"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"methods": ("lrp",)}, r"GAECallback\(methods=\['lrp'\]\): choose from"),
        ({"target": "class"}, r"GAECallback\(target='class'\): use 'pred'"),
        ({"every_n_epochs": 0}, r"GAECallback\(every_n_epochs=0\): use a positive integer"),
        ({"every_n_epochs": None}, r"every_n_epochs and every_n_train_steps are both None"),
    ],
)
def test_misconfiguration_is_an_error_in_setup(tmp_path, kwargs, message):
    trainer = make_trainer(tmp_path, [GAECallback(**kwargs)], max_epochs=1)
    with pytest.raises(ValueError, match=message):
        trainer.fit(small_model(), DigitsDataModule(batch_size=32))


def test_fast_dev_run_explains_nothing_and_warns_nothing(tmp_path):
    """fast_dev_run gives the Trainer no-op loggers: the callback checks its setup and stays quiet."""
    callback = GAECallback(num_samples=10, metric_samples=16)
    trainer = Trainer(default_root_dir=tmp_path, fast_dev_run=True, logger=TensorBoardLogger(tmp_path),
                      callbacks=[callback], enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit(small_model(), DigitsDataModule(batch_size=32))
    assert not [w for w in seen if "GAECallback" in str(w.message)], [str(w.message) for w in seen]
    assert callback.sample_indices is not None and callback._last_explained is None


def test_no_logger_warns_with_the_fix(tmp_path):
    trainer = make_trainer(tmp_path, [GAECallback(num_samples=1)], max_epochs=1, logger=False)
    with pytest.warns(UserWarning, match=r"no logger.*TensorBoardLogger"):
        trainer.fit(small_model(), DigitsDataModule(batch_size=32))
