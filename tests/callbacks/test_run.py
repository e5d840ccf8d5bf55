"""The callback's Run owns what a checkpoint keeps: the callback's state_dict is the run's, in plain data that
``torch.load(weights_only=True)`` reads, older checkpoints (``sample_indices``, ``previous`` only) still load, and a
fit that crashed and is resumed from its last checkpoint into the same log directory goes on as the uninterrupted fit
would: nothing raised twice, the same steps scored."""

import re
import io

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_gae.callbacks import BatchOptions, FaithfulnessOptions, GAECallback, RegionOptions
from lightning_gae.callbacks.health import Health, health_flags
from recipes.shortcuts import WatermarkedDigitsDataModule
from recipes.vit import ViTClassifier
from tests.helpers.trainer import heatmap_tag


def _reloaded(state):
    """``state`` through a file, read as Lightning reads a checkpoint by default (``weights_only=True``)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_the_callbacks_checkpoint_state_is_its_runs_and_round_trips():
    callback = GAECallback(batches=BatchOptions(sample_indices=[3, 1]))
    assert callback.sample_indices == [3, 1] == callback.run.sample_indices
    callback.run.previous = {"gae": torch.arange(10.0).reshape(2, 5)}
    callback.run.first_regions = {"region_share_corner/gae": 0.05}
    callback.run.explanation_count, callback.run.last_explained, callback.run.last_step = 3, ("fit", 90), 89
    with pytest.warns(UserWarning, match="explanation at step 44 failed"):
        callback.run.state.failures.record("explanation", 44, "ValueError: no")
    saved = _reloaded(callback.state_dict())
    resumed = GAECallback()
    assert resumed.sample_indices is None
    resumed.load_state_dict(saved)
    assert resumed.sample_indices == [3, 1] and torch.equal(resumed.run.previous["gae"], saved["previous"]["gae"])
    assert resumed.run.first_regions == {"region_share_corner/gae": 0.05}
    assert (resumed.run.explanation_count, resumed.run.last_explained, resumed.run.last_step) == (3, ("fit", 90), 89)
    assert resumed.run.state.failures.lines() == callback.run.state.failures.lines() != []
    assert _reloaded(resumed.state_dict()).keys() == saved.keys()


def test_a_checkpoint_without_the_keys_keeps_the_given_samples():
    # A checkpoint written before the run's verdicts were kept: it loads, and what it lacks stays as it was.
    callback = GAECallback(batches=BatchOptions(sample_indices=[2]))
    callback.load_state_dict({})
    assert callback.sample_indices == [2] and callback.run.previous == {}
    callback.sample_indices = (4, 0)
    assert callback.run.sample_indices == [4, 0] and callback.summary is None is callback.run.summary
    old = GAECallback()
    old.load_state_dict(_reloaded({"sample_indices": [5, 6], "previous": {"gae": torch.ones(2, 3)}}))
    run = old.run
    assert old.sample_indices == [5, 6] and torch.equal(run.previous["gae"], torch.ones(2, 3))
    assert (run.alerts, run.first_regions, run.health.flags, run.explanation_count, run.reported) == ([], None, [], 0, None)


def test_alerts_of_another_version_warn_and_the_rest_still_loads():
    callback = GAECallback()
    with pytest.warns(UserWarning, match=r"the checkpoint's alerts do not fit this version's .*not restored"):
        callback.load_state_dict({"sample_indices": [1], "alerts": [{"step": 3, "region": "corner"}],
                                  "schedule": {"explanation_count": 2}})
    assert callback.run.alerts == [] and callback.sample_indices == [1] and callback.run.explanation_count == 2


def test_the_health_flags_and_what_the_rule_carries_round_trip():
    scalars = {"positive_perturbation_auc/gae": 10.0, "positive_perturbation_auc/gae/stderr": 1.0,
               "positive_perturbation_auc/rollout": 40.0, "positive_perturbation_auc/rollout/stderr": 1.0,
               "positive_perturbation_auc/random": 30.0, "positive_perturbation_auc/random/stderr": 1.0}
    health = Health()
    health.flags = health_flags(7, scalars, {}, set())
    assert [(f.method, f.cause) for f in health.flags] == [("rollout", "random")]
    saved = _reloaded(health.state_dict())
    resumed = Health()
    resumed.load_state_dict(saved)
    assert resumed.flags == health.flags and resumed.summary_lines() == health.summary_lines()
    assert _reloaded(resumed.state_dict()) == saved


# --- a crash and a resume ----------------------------------------------------------------------


class CrashingViT(ViTClassifier):
    """The recipe ViT at the callback tests' size (``small_vit``), whose training step raises in epoch ``crash_epoch``
    (its 16th batch: after the explanation at step 100, logged at 99, past the checkpoint at the end of the epoch before)."""

    def __init__(self, crash_epoch: int | None = None) -> None:
        super().__init__(dim=32, depth=2, heads=2, lr=0.01)
        self.crash_epoch = crash_epoch

    def training_step(self, batch, batch_idx):
        if self.current_epoch == self.crash_epoch and batch_idx == 15:
            raise RuntimeError("the machine went down")
        return super().training_step(batch, batch_idx)


def _watermark_fit(make_trainer, root, crash_epoch=None, ckpt_path=None):
    """Five epochs on digits whose corner square names the class in every training image (the model learns the square:
    most of GAE's relevance sits on it from the second epoch, its one patch of 16 holds 6% by chance); every epoch
    (45 steps) and every 50 steps explain, every second explanation scores; checkpoints in ``root/ckpt`` at the end
    of each epoch, events in ``root/resume/version_0``."""
    seed_everything(0)
    data = WatermarkedDigitsDataModule(shortcut=True, correlation=1.0, batch_size=32, seed=0)
    callback = GAECallback(num_samples=8, every_n_train_steps=50, methods=("gae", "rollout"),
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=32,
                                                            interim_samples=16, every_n_explanations=2),
                           regions=RegionOptions(regions=[data.region], threshold=0.3))
    trainer = make_trainer(root, [callback, ModelCheckpoint(dirpath=root / "ckpt", save_last=True)],
                           logger=TensorBoardLogger(root, name="resume", version=0), max_epochs=5,
                           limit_train_batches=None, limit_val_batches=None)
    trainer.fit(CrashingViT(crash_epoch), datamodule=data, ckpt_path=ckpt_path)
    return callback, trainer


@pytest.mark.slow
def test_a_fit_resumed_after_a_crash_raises_nothing_twice_and_scores_the_steps_of_an_uninterrupted_fit(
        tmp_path, make_trainer, read_events):
    with pytest.raises(RuntimeError, match="the machine went down"):
        _watermark_fit(make_trainer, tmp_path / "run", crash_epoch=2)
    before = read_events(tmp_path / "run" / "resume" / "version_0")
    raised_before = {t for t in before.Tags()["tensors"] if t.startswith("gae_dashboard/alert/")}
    assert "gae_dashboard/alert/watermark/gae" in raised_before     # raised before the crash

    # What the resumed fit reads, as Lightning reads it by default: plain data.
    kept = torch.load(tmp_path / "run" / "ckpt" / "last.ckpt", weights_only=True)["callbacks"]
    assert [len(state["alerts"]) for key, state in kept.items() if key.startswith("GAECallback")] == [len(raised_before)]

    resumed, trainer = _watermark_fit(make_trainer, tmp_path / "run", ckpt_path="last")
    assert trainer.logger.log_dir == str(tmp_path / "run" / "resume" / "version_0")
    events = read_events(trainer.logger.log_dir)

    # Each alert and flag once in the GAE tab, in the Text tab and in the summary, those before the crash included.
    alerts = {f"gae_dashboard/alert/{a.region}/{a.method}": a for a in resumed.run.alerts}
    assert raised_before <= set(alerts) == {t for t in events.Tags()["tensors"] if t.startswith("gae_dashboard/alert/")}
    assert all(len(events.Tensors(tag)) == 1 for tag in alerts)
    # The Text tab shows names literally (escaped for markdown): read the entries as the user sees them.
    texts = [re.sub(r"\\(.)", r"\1", t.tensor_proto.string_val[0].decode())
             for t in events.Tensors("gae_alerts/text_summary")]
    assert all("\n\n".join(texts).count(alert.markdown()) == 1 for alert in alerts.values())
    assert all(resumed.summary.count(alert.text(indent="  ").splitlines()[0]) == 1 for alert in alerts.values())
    flags = [t for t in events.Tags()["tensors"] if t.startswith("gae_dashboard/flag/")]
    assert all(len(events.Tensors(tag)) == 1 for tag in flags)
    assert len(flags) == len(resumed.run.health.flags)
    assert all(resumed.summary.count(f.text(indent="  ").splitlines()[0]) == 1 for f in resumed.run.health.flags)
    # The rise is measured from the fit's first explanation step, not the resumed fit's first.
    first = before.scalar_events("region_share_watermark/gae")["region_share_watermark/gae"][0][1]
    assert resumed.run.first_regions["region_share_watermark/gae"] == pytest.approx(first)

    # The faithfulness subset is scored at the steps of the uninterrupted fit (every second explanation, and the last:
    # the explanations logged at 44, 49, 89 came before the checkpoint, so 99 does not score), and every step is shown
    # once: what the crashed fit logged past its checkpoint (step 99) is the resumed fit's.
    _, straight = _watermark_fit(make_trainer, tmp_path / "straight")
    uninterrupted = read_events(straight.logger.log_dir)
    scored = uninterrupted.scalar_steps("positive_perturbation_auc/gae")
    assert scored == [44, 89, 134, 179, 224] and events.scalar_steps("positive_perturbation_auc/gae") == scored
    assert 99 in before.image_steps(heatmap_tag(resumed.sample_indices[0]))
    assert all(events.image_steps(heatmap_tag(i)) == uninterrupted.image_steps(heatmap_tag(i))
               for i in resumed.sample_indices)
    for run in ("gae", "random"):
        method = read_events(tmp_path / "run" / "resume" / "version_0" / "methods" / run)
        assert method.Tags()["scalars"] and all(
            method.scalar_steps(tag) == read_events(straight.logger.log_dir + f"/methods/{run}").scalar_steps(tag)
            for tag in method.Tags()["scalars"])
