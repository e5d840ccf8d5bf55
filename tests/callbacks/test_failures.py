"""What cannot work stops the run in setup, before the first step, with the fix; what fails mid-run (a model that
stops exposing attention, NaN logits) warns once and training goes on; sharded strategies are refused."""

import json
import math
import os
import warnings
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning.pytorch import Callback
from lightning.pytorch.strategies import ModelParallelStrategy

import lightning_gae as lg
from lightning_gae import ImageTokens
from lightning_gae.callbacks import BatchOptions, DisplayOptions, EngineOptions, FaithfulnessOptions, GAECallback
from lightning_gae.callbacks.failures import Failures
from recipes.digits import DigitsDataModule
from recipes.vit import Block, ViTClassifier
from tests.helpers.hf_modules import Batches, TextByName, ids_and_mask, tiny_bert
from tests.helpers.models import RankOneFails, small_vit
from tests.helpers.processes import TENSOR_PARALLEL_SCRIPT
from tests.helpers.trainer import EPOCH_END_STEPS, CPUFSDPStrategy, heatmap_tag, no_skipped_explanation


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: GAECallback(methods=("lrp",)), r"GAECallback\(methods=\['lrp'\]\): \['lrp'\] are not methods; "
                                                r"choose from"),
        (lambda: GAECallback(target="class"), r"GAECallback\(target='class'\): use 'pred'"),
        (lambda: GAECallback(every_n_epochs=0), r"GAECallback\(every_n_epochs=0\): use a positive integer"),
        (lambda: GAECallback(every_n_epochs=None), r"every_n_epochs and every_n_train_steps are both None"),
        (lambda: GAECallback(num_samples=0), r"GAECallback\(num_samples=0\): track at least one sample"),
        (lambda: GAECallback(captum_baselines=("lime",)), r"GAECallback\(captum_baselines=\['lime'\]\): \['lime'\] are "
                                                          r"not Captum methods; choose from"),
        (lambda: GAECallback(target=lambda output: output[:, 0]),
         r"GAECallback\(target=<callable>\).*faithfulness=FaithfulnessOptions\(metrics=\(\)\)"),
        (lambda: GAECallback(modality=ImageTokens), r"GAECallback\(modality=<class.*give an ImageTokens"),
        (lambda: GAECallback(faithfulness={"samples": 4}), r"GAECallback\(faithfulness=\{'samples': 4\}\): give a "
                                                          r"FaithfulnessOptions"),
        (lambda: GAECallback(modality=lg.TabularTokens(["a", "b"])),
         r"removes features, but modality=.* has no value to put in their place"),
        (lambda: FaithfulnessOptions(interim_samples=-1), r"FaithfulnessOptions\(interim_samples=-1\): use an integer, 0"),
        (lambda: FaithfulnessOptions(metrics=("faithfulness",)), r"FaithfulnessOptions\(metrics=\['faithfulness'\]\)"
                                                                 r": \['faithfulness'\] are not metrics; choose from"),
        (lambda: FaithfulnessOptions(samples=-1), r"FaithfulnessOptions\(samples=-1\): use an integer, 0 or more"),
        (lambda: FaithfulnessOptions(every_n_explanations=0), r"FaithfulnessOptions\(every_n_explanations=0\)"),
        (lambda: FaithfulnessOptions(max_batch=0), r"FaithfulnessOptions\(max_batch=0\): use a positive integer"),
        (lambda: BatchOptions(dataloader_idx=-1), r"BatchOptions\(dataloader_idx=-1\): use a position"),
        (lambda: BatchOptions(max_scan_batches=0), r"BatchOptions\(max_scan_batches=0\): use a positive integer"),
        (lambda: BatchOptions(inputs="x"), r"BatchOptions\(inputs='x'\): give a function"),
        (lambda: BatchOptions(sample_indices=[-1]), r"BatchOptions\(sample_indices=\[-1\]\): \[-1\] are no positions"),
        (lambda: EngineOptions(answer_tokens="yes"), r"EngineOptions\(answer_tokens='yes'\): use True or False, or None"),
        (lambda: EngineOptions(set_inputs=["src"]), r"EngineOptions\(set_inputs=\['src'\]\): give a mapping"),
        (lambda: DisplayOptions(evolution_length=0), r"DisplayOptions\(evolution_length=0\): use a positive integer"),
        (lambda: DisplayOptions(top_fraction=0), r"DisplayOptions\(top_fraction=0\): use a fraction in \(0, 1\]"),
        (lambda: DisplayOptions(heatmap_scale="log"), r"DisplayOptions\(heatmap_scale='log'\): use 'per_map'"),
    ],
)
def test_misconfiguration_is_an_error_when_the_callback_is_built(build, message):
    # A typo in a config fails before the model and the data are built, as Lightning's own callbacks do.
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.slow
def test_no_logger_warns_with_the_fix(tmp_path, make_trainer):
    trainer = make_trainer(tmp_path, [GAECallback(num_samples=1)], max_epochs=1, limit_train_batches=4, logger=False)
    with pytest.warns(UserWarning, match=r"no logger.*TensorBoardLogger"):
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))


# --- what cannot work stops the run before training ------------------------------------------------


class FlatDigits(DigitsDataModule):
    """Digits as 64 features ``[B, 64]``: not images."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        for split in (self.train_set, self.val_set):
            split.tensors = (split.tensors[0].flatten(1), split.tensors[1])


class FeatureTransformer(ViTClassifier):
    """One token per pair of features: neither image patches nor one token per feature, so no modality is inferred."""

    def __init__(self) -> None:
        super().__init__(dim=16, depth=1, heads=2)
        self.embed = nn.Linear(2, 16)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(16, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(x.flatten(1).view(len(x), -1, 2)))[:, 0])


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
    """Its forward hides its parameters behind ``*args, **kwargs`` (a decorator's wrapper): the keys it takes cannot
    be read from its signature. (A forward that names them gets only those: tests/callbacks/test_batch_layout.py.)"""

    def forward(self, *args, **kwargs) -> Tensor:
        return self._forward(*args, **kwargs)

    def _forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch["pixel_values"]), batch["labels"])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch["pixel_values"]), batch["labels"]))


@pytest.mark.parametrize(
    "callback,model,message",
    [
        pytest.param(dict(modality=ImageTokens(patch_size=4)), small_vit,
                     r"GAECallback\(modality=ImageTokens\(patch_size=4, prefix_tokens=1\)\) does not fit.*"
                     r"patch_size=2, prefix_tokens=1 would fit", id="wrong patch_size"),
        pytest.param({}, FeatureTransformer, r"cannot infer the modality.*modality=ImageTokens\(patch_size=...\), TextTokens",
                     id="no modality fits"),
        pytest.param({}, KeyedViT, r"cannot be explained.*unexpected keyword argument 'index'.*pass "
                                   r"batches=BatchOptions\(inputs=",
                     id="forward hides its parameters and rejects a batch key"),
        pytest.param(dict(batches=BatchOptions(sample_indices=[10_000])), small_vit,
                     r"BatchOptions\(sample_indices=...\)\): \[10000\] are outside the 360 samples of the validation set",
                     id="sample outside the validation set"),
    ],
)
def test_what_cannot_work_stops_the_run_before_the_first_step(tmp_path, callback, model, message, make_trainer):
    # Each of these used to surface after a whole epoch (or never: a wrong patch_size gave a run without pictures).
    trainer = make_trainer(tmp_path, [GAECallback(num_samples=2, **callback)])
    data = {KeyedViT: KeyedDigits, FeatureTransformer: FlatDigits}.get(model, DigitsDataModule)(batch_size=32)
    with pytest.raises(ValueError, match=message):
        trainer.fit(model(), data)
    assert trainer.global_step == 0


# --- failures mid-run: warn once, skip the step, train on ------------------------------------------


class BreaksAfterFirstEpoch(ViTClassifier):
    """From epoch 1 on, evaluation bypasses attention: explanations fail, training goes on."""

    def forward(self, x):
        if self.current_epoch >= 1 and not self.training:
            return self.model.head(self.model.patch_embed(x).mean(dim=(2, 3)))
        return super().forward(x)


@pytest.mark.slow
def test_a_model_that_breaks_mid_run_warns_and_training_finishes(tmp_path, make_trainer, read_events):
    callback = GAECallback(num_samples=2)
    trainer = make_trainer(tmp_path, [callback], max_epochs=3, limit_train_batches=4)
    with pytest.warns(UserWarning, match=r"GAECallback: explanation at step \d+ failed and was skipped \(ValueError: no attention was recorded"):
        trainer.fit(BreaksAfterFirstEpoch(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    assert trainer.current_epoch == 3 and trainer.state.finished
    steps = {e.step for e in read_events(trainer.logger.log_dir).Images(f"gae_heatmaps/val_{callback.sample_indices[0]}")}
    assert len(steps) == 1, "only the first epoch could be explained"
    assert "explanations failed at 2 of 3 explanation steps:\n  ValueError: no attention was recorded" in callback.summary


class NaNAfterFirstEpoch(ViTClassifier):
    """From epoch 1 on, evaluation returns NaN logits (training itself is untouched)."""

    def forward(self, x):
        logits = super().forward(x)
        return logits * float("nan") if self.current_epoch >= 1 and not self.training else logits


@pytest.mark.slow
def test_nan_logits_skip_the_step_with_one_warning_and_nothing_non_finite_is_logged(tmp_path, make_trainer, read_events):
    # Two NaN steps (epochs 1 and 2), two methods: still one warning.
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"),
                           faithfulness=FaithfulnessOptions(metrics=(), random_baseline=False))
    trainer = make_trainer(tmp_path, [callback], max_epochs=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(NaNAfterFirstEpoch(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    # The 2 tracked digits leave classes out, which is said once at fit start; not counted here.
    messages = [str(w.message) for w in caught
                if "GAECallback" in str(w.message) and "show no sample of class" not in str(w.message)]
    # explain() refuses the NaN score, naming the samples and what to check; the callback warns once and skips.
    assert len(messages) == 1 and "the model's output to explain is NaN or inf" in messages[0], messages
    assert trainer.state.finished and trainer.current_epoch == 3
    acc = read_events(trainer.logger.log_dir)
    # The callback's scalars are <metric>/<method> (the model's own val_loss is NaN from epoch 1 on).
    logged = {t: v for t, v in acc.scalar_events().items() if t.rsplit("/", 1)[-1] in ("gae", "rollout")}
    assert len(logged) == 2 and all(math.isfinite(v) for values in logged.values() for _, v in values)
    assert {s for values in logged.values() for s, _ in values} == {1}
    for sample in callback.sample_indices:
        assert acc.image_steps(heatmap_tag(sample)) == [1]


# --- sharded strategies ----------------------------------------------------------------------------


@contextmanager
def _own_process_group():
    """Lightning sets up a one-process group and its environment for FSDP: leave none to later tests."""
    environment = dict(os.environ)
    try:
        yield
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)


@pytest.mark.slow
def test_fsdp1_on_one_process_explains_through_the_root_unit(tmp_path, make_trainer, read_events):
    # FSDPStrategy wraps the LightningModule itself in the root unit (and each block in its own); the explanations
    # run through it. Two processes, where the parameters are sharded: tests/callbacks/test_multiprocess.py.
    # A block's modules are then at model.blocks.<i>._fsdp_wrapped_module.<name>, which the glob's * matches.
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(samples=8),
                           engine=EngineOptions(attention_modules=["model.blocks.*.attn"]))
    trainer = make_trainer(tmp_path, [callback], strategy=CPUFSDPStrategy(auto_wrap_policy={Block}), devices=1)
    with _own_process_group(), no_skipped_explanation():
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    assert trainer.state.finished
    acc = read_events(trainer.logger.log_dir)
    for sample in callback.sample_indices:
        assert acc.image_steps(heatmap_tag(sample)) == EPOCH_END_STEPS
    scored = {step for tag, values in acc.scalar_events().items() if "perturbation_auc" in tag for step, _ in values}
    assert scored == set(EPOCH_END_STEPS)


class _ShardedViT(RankOneFails):
    """FSDP2 on every block and on the ViT (one process: a unit of one rank, gathered and initialized as on several)."""

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


@pytest.mark.slow
def test_the_lrp_methods_under_fsdp2_leave_training_as_it_was_on_one_process(tmp_path, make_trainer):
    # The check when the fit starts is the units' first forward: it used to initialize them with the LRP forward's
    # detached parameters, and the first training step's backward raised "element 0 of tensors does not require
    # grad". Two processes, where the parameters are sharded: tests/callbacks/test_multiprocess.py.
    losses = []
    for callbacks in ([GAECallback(num_samples=2, methods=("gae", "attnlrp", "transformer_attribution"),
                                   every_n_train_steps=1, faithfulness=FaithfulnessOptions(samples=4))], []):
        torch.manual_seed(0)
        model = _ShardedViT(dim=32, depth=2, heads=2)
        trainer = make_trainer(tmp_path, callbacks, logger=False, devices=1,
                               strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1))
        with _own_process_group(), no_skipped_explanation():
            trainer.fit(model, DigitsDataModule(batch_size=32))
        assert trainer.state.finished
        losses.append(model.losses)
    assert losses[0] == losses[1] and len(losses[0]) == 4


@pytest.mark.slow
def test_tensor_parallelism_is_refused_in_setup_with_the_reason(tmp_path, run_script):
    # What stays refused: tensor parallelism (the explanations read whole attention maps) and DeepSpeed stage 3
    # (not installable here: it needs CUDA).
    run_script(TENSOR_PARALLEL_SCRIPT)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert result["steps"] == 0
        assert result["stopped"].startswith("GAECallback cannot run with ModelParallelStrategy(tensor_parallel_size=2): "
                                            "tensor parallelism splits every layer's computation across ranks")
        assert "ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)" in result["stopped"]


class DigitsWithBrokenSamples(DigitsDataModule):
    """Validation samples 0, 3 and 5 hold a NaN or inf pixel (a sensor glitch); training data is clean."""

    def setup(self, stage=None):
        super().setup(stage)
        x, y = self.val_set.tensors
        x = x.clone()
        x[0, 0, 1, 1] = float("nan")
        x[3, 0, 4, 4] = float("inf")
        x[5, 0, 7, 0] = float("-inf")
        self.val_set = torch.utils.data.TensorDataset(x, y)


@pytest.mark.slow
def test_samples_with_nan_or_inf_inputs_are_neither_tracked_nor_scored(tmp_path, make_trainer, read_events):
    callback = GAECallback(num_samples=10, methods=("gae", "rollout"), faithfulness=FaithfulnessOptions(samples=32))
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_val_batches=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(small_vit(), DigitsWithBrokenSamples(batch_size=32))
    messages = [str(w.message) for w in caught if "NaN or inf" in str(w.message)]
    assert messages == [f"GAECallback: 3 of the {len(trainer.datamodule.val_set)} samples of the validation set hold NaN or "
                        "inf input values (samples [0, 3, 5]); they are neither tracked nor scored"], messages
    assert not any("was skipped" in str(w.message) or "failed" in str(w.message) for w in caught)
    assert len(callback.sample_indices) == 10 and not {0, 3, 5} & set(callback.sample_indices)
    assert trainer.state.finished
    acc = read_events(trainer.logger.log_dir)
    scalars = {t: v for t, v in acc.scalar_events().items() if t.rsplit("/", 1)[-1] in ("gae", "rollout")}
    assert scalars and all(math.isfinite(v) for values in scalars.values() for _, v in values)
    for sample in callback.sample_indices:
        assert acc.image_steps(heatmap_tag(sample))


def test_every_sample_non_finite_stops_the_run_at_start(tmp_path, make_trainer):
    class AllBroken(DigitsDataModule):
        def setup(self, stage=None):
            super().setup(stage)
            x, y = self.val_set.tensors
            self.val_set = torch.utils.data.TensorDataset(torch.full_like(x, float("nan")), y)

    trainer = make_trainer(tmp_path, [GAECallback(num_samples=2)], max_epochs=1)
    with pytest.raises(ValueError, match="every one of the .* holds NaN or inf input values"):
        trainer.fit(small_vit(), AllBroken(batch_size=32))


@pytest.mark.slow
def test_the_lrp_methods_under_fsdp1_train_as_without_the_callback_and_explain_like_the_unwrapped_model(
        tmp_path, make_trainer, read_events):
    # FSDP1 gathers a unit's parameters inside its forward (a write-back of changed parameters, the all-gather, views
    # set on the modules), which ran under the LRP rules and raised UnsupportedOperation at an in-place copy. Two
    # processes, where the parameters are sharded: tests/callbacks/test_multiprocess.py.
    methods = ("gae", "attnlrp", "transformer_attribution")
    runs = []
    for callbacks in ([GAECallback(num_samples=2, methods=methods, every_n_train_steps=1,
                                   faithfulness=FaithfulnessOptions(samples=4))], []):
        torch.manual_seed(0)
        model = RankOneFails(dim=32, depth=2, heads=2)
        trainer = make_trainer(tmp_path / str(len(runs)), callbacks, logger=bool(callbacks), devices=1,
                               strategy=CPUFSDPStrategy(auto_wrap_policy={Block}))
        with _own_process_group(), no_skipped_explanation():
            trainer.fit(model, DigitsDataModule(batch_size=32))
            weights = trainer.strategy.lightning_module_state_dict()
        assert trainer.state.finished
        runs.append((trainer, callbacks, model.losses, weights))
    (trainer, (callback,), losses, weights), (_, _, plain_losses, plain_weights) = runs
    assert losses == plain_losses and len(losses) == 4
    assert weights.keys() == plain_weights.keys() and all(torch.equal(weights[k], plain_weights[k]) for k in weights)

    # The unwrapped model with the final weights, on one process: the relevance of the last step.
    acc = read_events(trainer.logger.log_dir)
    torch.save(weights, tmp_path / "weights.pt")
    model = RankOneFails(dim=32, depth=2, heads=2)
    model.load_state_dict(weights)
    single = GAECallback(num_samples=2, methods=methods[1:], faithfulness=FaithfulnessOptions(samples=4),
                         batches=BatchOptions(sample_indices=callback.sample_indices))
    alone_trainer = make_trainer(tmp_path / "single", [single], limit_val_batches=1)
    alone_trainer.validate(model, DigitsDataModule(batch_size=32))
    alone = read_events(alone_trainer.logger.log_dir)
    data = DigitsDataModule(batch_size=32)
    data.setup("fit")
    x = torch.stack([data.val_set[i][0] for i in callback.sample_indices])
    for method in methods[1:]:
        # lightning_gae.explain on the unwrapped model, the tracked samples as one batch.
        tokens = lg.explain(model.eval(), x, method=method).tokens
        for k, sample in enumerate(callback.sample_indices):
            tag = f"gae_dashboard/relevance/{method}/val_{sample}"
            assert np.abs(alone.tensor(tag)).max() > 0
            np.testing.assert_allclose(acc.tensor(tag), alone.tensor(tag), rtol=0, atol=1e-5)
            np.testing.assert_allclose(acc.tensor(tag), tokens[k].numpy(), rtol=0, atol=1e-5)


# --- failures are isolated and counted ---------------------------------------------------------------


def test_failures_are_warned_once_per_kind_and_counted_per_step():
    failures = Failures()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 3, 5, 7):
            with failures.attempt(step):
                if step > 1:
                    with failures.isolated("scoring", step):
                        raise RuntimeError("perturbed forward broke")
                if step == 7:
                    raise ValueError("no attention was recorded")
    messages = [str(w.message) for w in caught]
    assert messages == [
        "GAECallback: scoring at step 3 failed and was skipped; the step's pictures were logged (RuntimeError: perturbed "
        "forward broke); further failures of this kind are counted in the summary",
        "GAECallback: explanation at step 7 failed and was skipped (ValueError: no attention was recorded); further "
        "failures of this kind are counted in the summary"]
    assert failures.lines() == ["explanations failed at 1 of 4 explanation steps:",
                                "  ValueError: no attention was recorded (1 step, first at step 7)",
                                "scoring failed at 3 of 4 explanation steps:",
                                "  RuntimeError: perturbed forward broke (3 steps, first at step 3)"]


def test_a_logger_failing_where_nothing_was_explained_counts_among_the_steps_logged_at():
    # A logger fails at an explanation step and at fit's end-of-run scoring (no explanation step): both are counted.
    failures = Failures()
    with failures.attempt(1):
        pass
    with pytest.warns(UserWarning, match=r"^GAECallback: the tracking server is down$"):
        for step in (1, 4):
            failures.record("logging", step, "Remote.log_metrics: OSError: down", "GAECallback: the tracking server is down")
    assert failures.lines() == ["loggers failed at 2 of 2 steps logged at:",
                                "  Remote.log_metrics: OSError: down (2 steps, first at step 1)"]


def _token_ids(i):
    ids, mask = ids_and_mask(i)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(i % 2)}


@pytest.mark.slow
def test_text_tokens_that_cannot_remove_a_token_stop_the_run_at_start_naming_the_argument(tmp_path, make_trainer):
    # TextTokens() with no mask or pad id used to pass the fit-start check, then drop every scored step whole.
    trainer = make_trainer(tmp_path, [GAECallback(num_samples=2, modality=lg.TextTokens())])
    loader = DataLoader(Batches(_token_ids), batch_size=4)
    with pytest.raises(ValueError, match=r"FaithfulnessOptions\(metrics=\['positive_perturbation_auc', "
                                         r"'negative_perturbation_auc'\]\)\): the metrics remove parts of the inputs, "
                                         r"but modality=TextTokens\(ids, pad_id=None\) cannot.*pass mask_id=.*"
                                         r"FaithfulnessOptions\(metrics=\(\)\)"):
        trainer.fit(TextByName(tiny_bert()), loader, loader)
    assert trainer.global_step == 0


class PerturbedForwardBreaks(ViTClassifier):
    """From epoch 1 on, once validation is over, the forwards without gradients (the metrics' perturbed inputs) fail;
    the explanation's own forward, validation and training are untouched."""

    breaks = False

    def forward(self, x):
        if self.breaks and not torch.is_grad_enabled():
            raise RuntimeError("perturbed forward broke")
        return super().forward(x)


class BreakScoring(Callback):
    """Before GAECallback (callbacks run in order): scoring breaks at the explanation steps from epoch 1 on."""

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        pl_module.breaks = False

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        pl_module.breaks = trainer.current_epoch >= 1 and not trainer.sanity_checking


@pytest.mark.slow
def test_a_scoring_failure_keeps_the_steps_pictures_and_every_step_is_counted(tmp_path, make_trainer, read_events):
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(samples=0))
    trainer = make_trainer(tmp_path, [BreakScoring(), callback], max_epochs=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(PerturbedForwardBreaks(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    said = [str(w.message) for w in caught if "failed" in str(w.message)]
    assert said == [f"GAECallback: scoring at step {EPOCH_END_STEPS[1]} failed and was skipped; the step's pictures were "
                    "logged (RuntimeError: perturbed forward broke); further failures of this kind are counted in the "
                    "summary"], said
    acc = read_events(trainer.logger.log_dir)
    steps = [*EPOCH_END_STEPS, EPOCH_END_STEPS[1] + 2]
    for sample in callback.sample_indices:
        assert acc.image_steps(heatmap_tag(sample)) == steps  # the pictures of the steps whose scoring failed too
    assert acc.scalar_steps("positive_perturbation_auc/gae") == steps[:1]
    assert acc.scalar_steps("relevance_concentration/gae") == steps
    assert ("scoring failed at 2 of 3 explanation steps:\n  RuntimeError: perturbed forward broke (2 steps, first at "
            f"step {EPOCH_END_STEPS[1]})") in callback.summary


class BreakScoringWhenTrainingEnds(Callback):
    """Before GAECallback: the perturbed forwards fail once training is over (fit's end-of-run scoring)."""

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.breaks = True


@pytest.mark.slow
def test_a_failure_of_the_end_of_fit_scoring_is_counted_with_its_step(tmp_path, make_trainer):
    # Explained after step 3 (logged at 2); fit ends at step 4, between explanation steps, and scores the subset
    # there, which fails.
    callback = GAECallback(num_samples=2, every_n_epochs=None, every_n_train_steps=3,
                           faithfulness=FaithfulnessOptions(samples=8))
    trainer = make_trainer(tmp_path, [BreakScoringWhenTrainingEnds(), callback], max_epochs=1, limit_train_batches=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(PerturbedForwardBreaks(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    said = [str(w.message) for w in caught if "failed" in str(w.message)]
    assert said == ["GAECallback: scoring the faithfulness subset when fit ended (step 4) failed and was skipped "
                    "(RuntimeError: perturbed forward broke); further failures of this kind are counted in the "
                    "summary"], said
    # The summary's scores are those of the last step that scored (step 2), said with their step.
    assert "faithfulness (8 validation samples at step 2;" in callback.summary
    assert callback.summary.endswith("scoring failed at 1 of 2 steps explained or scored at:\n  RuntimeError: "
                                     "perturbed forward broke (1 step, first at step 4)"), callback.summary


class BreakScoringInEvaluation(Callback):
    """Before GAECallback: the perturbed forwards fail once the validation or test batches have run."""

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        pl_module.breaks = False

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        pl_module.breaks = not trainer.sanity_checking

    on_test_epoch_start = on_validation_epoch_start
    on_test_epoch_end = on_validation_epoch_end


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_a_failure_of_the_whole_subsets_scoring_in_validate_and_test_is_counted_with_its_step(tmp_path, make_trainer,
                                                                                             stage):
    callback = GAECallback(num_samples=2, methods=("gae",), faithfulness=FaithfulnessOptions(samples=8))
    trainer = make_trainer(tmp_path, [BreakScoringInEvaluation(), callback], limit_test_batches=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(trainer, stage)(PerturbedForwardBreaks(dim=32, depth=2, heads=2), DigitsDataModule(batch_size=32))
    said = [str(w.message) for w in caught if "failed" in str(w.message)]
    # validate explains and scores at its explanation step; test scores the whole subset of the test data alone.
    warned = {"validate": "scoring at step 0 failed and was skipped; the step's pictures were logged",
              "test": "scoring the faithfulness subset in test (step 0) failed and was skipped"}[stage]
    assert said == [f"GAECallback: {warned} (RuntimeError: perturbed forward broke); further failures of this kind "
                    "are counted in the summary"], said
    why = {"validate": "at step 0", "test": "in test"}[stage]
    assert f"faithfulness: not scored (scoring failed {why}: RuntimeError: perturbed forward broke)" \
        in callback.summary, callback.summary
    steps = {"validate": "explanation steps", "test": "steps explained or scored at"}[stage]  # test explains nothing
    assert callback.summary.endswith(f"scoring failed at 1 of 1 {steps}:\n  RuntimeError: perturbed forward broke "
                                     "(1 step, first at step 0)"), callback.summary


class BrokenPictures(ImageTokens):
    """Draws at fit start (the check), then fails every picture (``broken`` is set when training starts)."""

    broken = False

    def display_image(self, x):
        if self.broken:
            raise RuntimeError("cannot draw")
        return super().display_image(x)


class BreakPictures(Callback):
    def __init__(self, modality: BrokenPictures) -> None:
        self.modality = modality

    def on_train_start(self, trainer, pl_module) -> None:
        self.modality.broken = True


@pytest.mark.slow
def test_a_picture_failure_keeps_the_steps_scalars_and_the_summarys_scores(tmp_path, make_trainer, read_events):
    modality = BrokenPictures(patch_size=2)
    callback = GAECallback(num_samples=2, modality=modality, faithfulness=FaithfulnessOptions(samples=0))
    trainer = make_trainer(tmp_path, [callback, BreakPictures(modality)])
    with pytest.warns(UserWarning, match=r"pictures at step 1 failed and were skipped; the step's scalars were logged "
                                         r"\(RuntimeError: cannot draw\)"):
        trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    acc = read_events(trainer.logger.log_dir)
    assert acc.scalar_steps("positive_perturbation_auc/gae") == EPOCH_END_STEPS
    assert "faithfulness (the 2 tracked validation samples at step 3" in callback.summary
    assert "pictures failed at 2 of 2 explanation steps:\n  RuntimeError: cannot draw (2 steps, first at step 1)" \
        in callback.summary
