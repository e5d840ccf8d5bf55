"""GAECallback: explain a fixed set of validation samples while the model trains, log to TensorBoard.

The class keeps its arguments, the Trainer's hooks, the schedule and the state a checkpoint carries; each job it
delegates has a module of its own: which samples (:mod:`~lightning_gae.callbacks._tracked`), the check when a run
starts (:mod:`~lightning_gae.callbacks._preflight`), several token sets (:mod:`~lightning_gae.callbacks._token_sets`),
scoring (:mod:`~lightning_gae.callbacks._scoring`), the summary (:mod:`~lightning_gae.callbacks._report`), what each
logger gets (:mod:`~lightning_gae.callbacks._loggers`), several processes (:mod:`~lightning_gae.callbacks.distributed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.seed import isolate_rng
from torch import Tensor
from typing_extensions import override

from lightning_gae._structures import display_input, map_tensors
from lightning_gae.attribution import attribute
from lightning_gae.callbacks.evaluation import checkpoint_step, logged_step, scorable, test_scalars
from lightning_gae.callbacks.distributed import (Lockstep, check_strategy, from_rank_zero, gather_scores,
                                                  together)
from lightning_gae.callbacks.health import Health
from lightning_gae.callbacks._preflight import check_explanations
from lightning_gae.callbacks._regions import (RegionAlert, announce, new_alerts, region_masks, region_scalars,
                                              with_data_regions)
from lightning_gae.callbacks._loggers import (elsewhere_lines, image_loggers, log_pictures, log_scalars, logger_note,
                                              only_dummy_loggers, writers)
from lightning_gae.callbacks._report import run_summary
from lightning_gae.callbacks._schedule import final_explanation, fit_part, subset_due
from lightning_gae.callbacks._scoring import (Curves, ScoredBatch, faithfulness, finite_scalars, relevance_scalars,
                                              scored_batches, set_truth_scalars)
from lightning_gae.callbacks._state import SHARED, RunState
from lightning_gae.callbacks._token_sets import decoder_rows, set_views
from lightning_gae.callbacks._tracked import collect, tracked_target
from lightning_gae.callbacks._arguments import check_arguments
from lightning_gae.callbacks.samples import (
    class_names,
    default_batch_ground_truth,
    default_batch_inputs,
    default_batch_labels,
)
from lightning_gae.tensorboard.views import SetInput
from lightning_gae.methods import explain_methods
from lightning_gae.engine.readout import Explanation
from lightning_gae.language.answers import NextTokenLogits
from lightning_gae.metrics import random_attribution
from lightning_gae.metrics.ground_truth import RECALL
from lightning_gae.modalities.tokens import Modality
from lightning_gae.options import BatchOptions, DisplayOptions, EngineOptions, FaithfulnessOptions, RegionOptions
from lightning_gae.tensorboard.summary import TensorBoardViews, faithfulness_rows

__all__ = ["GAECallback"]

# The readers of a batch are public here too: configs and the CLI name them by this path.
__all__ += ["default_batch_ground_truth", "default_batch_inputs", "default_batch_labels"]


class GAECallback(Callback):
    r"""Explains a fixed set of validation samples every N epochs/steps and logs to TensorBoard.

    The samples are chosen once (seeded, class-balanced when labels exist) and tracked for the whole run, also
    across a resume. At every explanation step it logs, under tags that stay the same so that TensorBoard's step
    slider shows the evolution (``<i>``: the sample's index in the validation set):

    * ``gae_heatmaps/val_<i>``: the input and every method side by side (image overlays, token boxes or a feature
      table), each with its colorbar, under a line with label, prediction and probability (class names from the
      data module's ``class_names``); images also ``gae_evolution/val_<i>`` (methods x the last steps); text and
      tabular data also ``gae_tokens/val_<i>`` in the Text tab;
    * scalars ``relevance_stability_spearman/<method>``, ``relevance_stability_topk_overlap/<method>`` (versus the
      previous step), ``relevance_concentration/<method>``; a histogram ``relevance/<method>``;
    * faithfulness ``<metric>/<method>`` with ``<metric>/<method>/stderr`` for every method, Captum baseline and
      ``random`` (the floor), and ground-truth scores when the batches carry masks or rationales
      (``segmentation_*``, ``rationale_*``), on a fixed subset of the validation set (:class:`FaithfulnessOptions`);
      each method's scalars also go to a run of its own (``methods/<method>``) so that TensorBoard gives each its
      colour, with a Custom Scalars chart per metric;
    * for the "GAE" tab of TensorBoard: the raw relevance of every sample and method, the inputs, predictions and
      the metrics' curves.

    Other loggers (CSV, W&B, MLflow, Comet, ...) get the scalars and, where they have an image call, the
    pictures; a warning when a run starts names what only TensorBoard shows.

    Everything is logged at the step the module's own ``self.log`` values use at that moment; ``trainer.validate()``
    explains and scores too, ``trainer.test()`` scores its test data (``test_<tag>``). Explanations never change what
    the run computes: the samples are
    read once through a private single-process loader, explained in eval mode on copies with ``autograd.grad``, and
    the RNGs are restored. On several processes (DDP, FSDP2, FSDP1) rank zero reads the samples and logs; the
    faithfulness subset is split across the ranks and its per-sample states gathered.

    Whatever can be checked without the model and data is checked here, when the callback is built; the rest when a
    run starts, by reading the samples and explaining them once: any failure stops the run with the fix. Later, a
    failing explanation warns once with its reason and is skipped, and nothing non-finite is ever logged.

    Models with several token sets (encoder-decoders, dual encoders, co-attention) are drawn and scored per set, a
    decoder position by position; perturbation metrics and Captum baselines, which remove one input, are refused.

    Args:
        num_samples: how many validation samples to show; more than the validation set holds warns and shows all.
        every_n_epochs: explain after every N-th validation epoch of ``fit`` (None: never by epoch).
        every_n_train_steps: also explain every N optimizer steps (None: never by step).
        methods: any of :data:`lightning_gae.METHODS` and :data:`lightning_gae.LRP_METHODS`: ``"gae"``,
            ``"rollout"``, ``"raw_attention"``, ``"attn_gradcam"``, ``"attn_gradcam_vit"``, ``"attention_flow"``,
            ``"attnlrp"``, ``"transformer_attribution"``.
        modality: ``ImageTokens``, ``TextTokens`` or ``TabularTokens``; None infers ``ImageTokens`` for image batches
            whose token count fits a square patch grid. For several token sets, a mapping ``{set: modality}``.
        target: ``"pred"`` explains the predicted class, ``"label"`` the true one, a callable ``output -> Tensor[B]``
            any scalar per sample (then no metrics and no Captum baselines).
        query: the readout token (:func:`~lightning_gae.explain`'s ``query``: 0 for a CLS token, ``"last"`` for
            decoders, ``"mean"`` for mean-pooled models).
        captum_baselines: Captum methods drawn and scored beside the others: ``"saliency"``, ``"input_x_gradient"``,
            ``"integrated_gradients"``, ``"gradient_shap"``.
        print_summary: print the run's summary when ``fit``, ``validate`` or ``test`` ends (rank zero); the text is
            kept in ``callback.summary`` either way.
        log_sanity_check: also explain during Lightning's sanity check.
        faithfulness: which metrics, on how many samples, how often (:class:`FaithfulnessOptions`).
        batches: which dataloader and how its batches are read (:class:`BatchOptions`).
        engine: what the model's explanation needs told (:class:`EngineOptions`).
        display: how the explanations are drawn (:class:`DisplayOptions`).
        regions: declared evidence and suspect regions, their shares of the relevance and the alert when a suspect
            one takes it (:class:`~lightning_gae.options.RegionOptions`).

    Raises:
        ValueError: here, for an unknown method or Captum baseline, a bad schedule or target, options that
            conflict (a callable target with metrics; a ``TabularTokens`` without ``means`` while metrics remove
            features). When a run starts: a strategy it cannot explain under (DeepSpeed stage 3, tensor
            parallelism), no validation dataloader, samples outside the validation set, ``target="label"`` without
            labels, a model that cannot be explained on the samples, or a modality that does not fit its tokens.

    Example (then ``Trainer(logger=TensorBoardLogger("runs"), callbacks=[callback]).fit(model, data)`` and
    ``tensorboard --logdir runs``; :doc:`/getting-started` trains a model with it):

    >>> from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
    >>> callback = GAECallback(num_samples=8, methods=("gae", "rollout"), faithfulness=FaithfulnessOptions(samples=128))
    >>> callback.faithfulness       # the other groups: callback.batches, .engine, .display, .regions
    FaithfulnessOptions(metrics=('positive_perturbation_auc', 'negative_perturbation_auc'), random_baseline=True,
                        samples=128, interim_samples=32, every_n_explanations=2, max_batch=256)
    """

    def __init__(
        self,
        num_samples: int = 8,
        every_n_epochs: int | None = 1,
        every_n_train_steps: int | None = None,
        methods: Sequence[str] = ("gae",),
        modality: Modality | Mapping[str, Modality] | None = None,
        target: Literal["pred", "label"] | Callable[[Any], Tensor] = "pred",
        query: int | str = 0,
        captum_baselines: Sequence[str] = (),
        print_summary: bool = True,
        log_sanity_check: bool = False,
        faithfulness: FaithfulnessOptions | None = None,
        batches: BatchOptions | None = None,
        engine: EngineOptions | None = None,
        display: DisplayOptions | None = None,
        regions: RegionOptions | None = None,
    ) -> None:
        self.num_samples = num_samples
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps
        self.methods = tuple(methods)
        self.modality = modality
        self.target = target
        self.query = query
        self.captum_baselines = tuple(captum_baselines)
        self.print_summary = print_summary
        self.log_sanity_check = log_sanity_check
        self.faithfulness = FaithfulnessOptions() if faithfulness is None else faithfulness
        self.batches = BatchOptions() if batches is None else batches
        self.engine = EngineOptions() if engine is None else engine
        self.display = DisplayOptions() if display is None else display
        self.regions = RegionOptions() if regions is None else regions
        check_arguments(self)
        # The tracked samples' positions: given, chosen when the first run starts, or restored from a checkpoint.
        self.sample_indices: list[int] | None = (None if self.batches.sample_indices is None
                                                 else list(self.batches.sample_indices))
        # The text printed when the last run ended (rank zero), for whoever prints it later (the CLI does).
        self.summary: str | None = None
        self._run = RunState()
        self._last_explained: tuple[str, int] | None = None
        # The faithfulness subset's schedule: explanation steps of this fit so far, and the last (stage, step) scored.
        self._explanation_count = 0
        self._last_scored: tuple[str, int] | None = None
        self._last_step = 0
        # The step of the checkpoint a validate() or test() loaded (what it logs at on a Trainer that has not trained).
        self._loaded_step: int | None = None
        # Across runs: what the stability scalars and evolution strips compare with.
        self._previous: dict[str, Tensor] = {}
        # Built in setup; kept across runs (evolution columns, fixed colour ranges).
        self._views: TensorBoardViews | None = None
        # Per explanation step: the perturbation metrics' curves, for the dashboard.
        self._curves: Curves = {}
        self._warned: set[str] = set()
        # What the summary shows: the last faithfulness scalars logged and what they were scored on, or why none were.
        self._reported: tuple[str, dict[str, float]] | None = None
        self._not_scored: str | None = None
        # Declared regions: the first step's shares (what a rise is measured from) and the alerts raised this run.
        self._first_regions: dict[str, float] | None = None
        self._alerts: list[RegionAlert] = []
        # Explanations that stopped being faithful: the flags raised this fit (:mod:`.health`).
        self._health = Health()

    @property
    @override
    def state_key(self) -> str:
        # Not the seed: a resumed run keeps the samples it tracked, whatever seed it was given.
        return self._generate_state_key(num_samples=self.num_samples, methods=self.methods)

    # --- configuration ----------------------------------------------------------------------

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_strategy(trainer.strategy)
        if self._views is None:
            self._views = self._new_views()
        self._loaded_step = None  # a checkpoint is loaded after setup
        if stage == "fit":
            self.summary = None
            self._first_regions, self._alerts, self._health = None, [], Health()
        if not trainer.loggers:
            rank_zero_warn(
                "GAECallback: the Trainer has no logger, so nothing will be shown. Add one, e.g. "
                "Trainer(logger=lightning.pytorch.loggers.TensorBoardLogger('runs'))."
            )
        if trainer.is_global_zero and (note := logger_note(trainer)) is not None:
            self._warn_once("loggers", note)  # what the loggers that are not TensorBoard get and cannot show

    def _new_views(self) -> TensorBoardViews:
        return TensorBoardViews(scale=self.display.heatmap_scale, evolution_length=self.display.evolution_length)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # The metric objects hold the module; the next fit or validate reads its own samples.
        self._run = RunState()
        if self._views is not None:
            self._views.close()
        self._last_explained = self._last_scored = None
        self._explanation_count = 0
        self._reported = self._not_scored = None

    # --- reading the samples and checking them, before the loops -----------------------------------

    def _collect(self, trainer: Trainer) -> None:
        collect(trainer, self._run, self.num_samples, self.batches, self.faithfulness, self.engine.answer_tokens,
                self.target)

    def _prepare(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Read the samples and explain them once, so that what cannot work stops the run now, with its fix.

        Runs on every rank (all of them stop together); the RNGs are restored, so training is unchanged.
        """
        with isolate_rng():
            testing = trainer.state.fn == "test"  # test data: samples of its own, never kept as the tracked ones
            self._run = RunState(sample_indices=None if testing else self.sample_indices)
            try:
                # validate() runs its hooks in inference mode, and a tensor made there can never take part
                # in autograd: the labels, the explained class of target="label", would fail every explanation.
                with torch.inference_mode(False):
                    from_rank_zero(trainer, lambda: self._collect(trainer), self._run, SHARED)
                self.sample_indices = self.sample_indices if testing else self._run.sample_indices
                # A causal LM's answer rows are read through the logits at each row's readout (on every rank).
                self._run.readout = None if self._run.row_names is None else NextTokenLogits(pl_module)
            except ValueError:
                raise
            except Exception as err:
                raise ValueError(f"GAECallback: reading the validation samples failed ({type(err).__name__}: {err}); "
                                 "check batches=BatchOptions(dataloader_idx=..., inputs=..., labels=..., "
                                 "ground_truth=...)") from err
            check_explanations(self._run, trainer, pl_module, self._model_inputs(trainer, pl_module), self._explain,
                               self.modality, self.methods, self.target, self.query, self.faithfulness.metrics,
                               self.captum_baselines, self.engine, self._new_views)
            self.regions = with_data_regions(self.regions, trainer.datamodule)
            if self.regions.regions:
                if self._run.sets is not None:
                    raise ValueError("GAECallback(regions=RegionOptions(...)): the model has several token sets; regions "
                                     "are declared over the inputs of a model with one")
                try:
                    self._run.region_masks = region_masks(self.regions, self._run.modality, self._run.inputs)
                except Exception as err:
                    raise ValueError(f"GAECallback(regions=RegionOptions(...)) does not fit the tracked samples with "
                                     f"{self._run.modality!r}: {type(err).__name__}: {err}") from err

    def _model_inputs(self, trainer: Trainer, pl_module: LightningModule) -> Any:
        # The loops cast every batch to the precision ("bf16-true", "16-true"); the kept samples need the same.
        return trainer.precision_plugin.convert_input(map_tensors(self._run.inputs, lambda t: t.to(pl_module.device)))

    # --- when -----------------------------------------------------------------------------------

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        Lockstep(trainer, pl_module).run(lambda: self._prepare(trainer, pl_module), every_rank=True)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # trainer.validate() has no fit start; its loaders are known by now.
        if self._run.inputs is None:
            Lockstep(trainer, pl_module).run(lambda: self._prepare(trainer, pl_module), every_rank=True)

    def _wanted_now(self, trainer: Trainer) -> bool:
        if trainer.sanity_checking:
            return self.log_sanity_check
        if trainer.state.fn != "fit":
            return True
        return self.every_n_epochs is not None and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._wanted_now(trainer):
            self._explain_and_log(trainer, pl_module)

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        n = self.every_n_train_steps
        if n is not None and trainer.global_step > 0 and trainer.global_step % n == 0:
            self._explain_and_log(trainer, pl_module)

    # --- what -----------------------------------------------------------------------------------

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)

    def _explain_and_log(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # The same weights are explained once: with gradient accumulation on_train_batch_end sees a
        # global step several times. The stage is part of it: validate() after fit() starts at fit's last step.
        explained = (trainer.state.fn.value, trainer.global_step)
        if self._run.inputs is None or self._last_explained == explained:
            return
        if only_dummy_loggers(trainer):
            return
        self._last_explained = explained
        # What the module's self.log uses at this moment (global_step runs ahead of it at epoch ends).
        step = logged_step(trainer, self._loaded_step)
        self._last_step = step
        run = self._run
        subset = None if run.scored is None else subset_due(trainer, self._explanation_count,
                                                            self.faithfulness.every_n_explanations, run.scored,
                                                            run.interim)
        self._explanation_count += 1
        # Rank zero explains and logs; every rank takes part when the model is sharded or the subset is split.
        lockstep = Lockstep(trainer, pl_module)
        every_rank = lockstep.sharded or (subset is not None and run.sets is None)
        if not (every_rank or trainer.is_global_zero):
            return
        with isolate_rng(), run.failures.attempt(step):  # an explanation must never take training down
            lockstep.run(lambda: self._explain_step(trainer, pl_module, step, subset), every_rank)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero and self._views is not None and self._explanation_count:
            # Evolution strips still due (fit ended between the steps they are written at), at their newest column's step.
            try:
                pictures = self._views.write_strips(writers(trainer), self._last_step)
                log_pictures(image_loggers(trainer), pictures, self._last_step, self._run.failures)
            except Exception as err:  # noqa: BLE001 - nor may a picture take the end of training down
                self._warn_once(str(err), f"GAECallback: writing the evolution strips when fit ended failed ({err})")
        # fit's part of the faithfulness subset on the final weights, unless the last explanation step scored them.
        run = self._run
        if not scorable(self._run, self.faithfulness.metrics) or only_dummy_loggers(trainer):
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        if self._last_explained == ("fit", trainer.global_step):
            # The weights of the last explanation step (fit ended on a validation): scalars, curves and pictures share it.
            step = self._last_step
        if self._last_scored == ("fit", step):
            return
        self._last_scored = ("fit", step)
        self._score_subset(trainer, pl_module, fit_part(run.scored, run.interim), step, "when fit ended",
                           "validation samples, the final weights")

    @override
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.on_fit_start(trainer, pl_module)  # its samples are read from the test data

    @override
    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # The whole faithfulness subset of the test data, under test_<tag>, without pictures (:mod:`.evaluation`).
        if self._run.inputs is not None and scorable(self._run, self.faithfulness.metrics) and not only_dummy_loggers(trainer):
            step = logged_step(trainer, self._loaded_step)
            self._last_scored = ("test", step)
            self._score_subset(trainer, pl_module, self._run.scored, step, "in test", "test samples")

    def _score_subset(self, trainer: Trainer, pl_module: LightningModule, part: Any, step: int, when: str,
                      what: str) -> None:
        """Score ``part`` of the faithfulness subset (every rank its share), log it at ``step``; never fail the run."""
        testing = trainer.state.fn == "test"
        # explain() and the metrics put the module in eval mode themselves: at the end of fit it is in training mode.
        with isolate_rng():
            try:
                scalars = Lockstep(trainer, pl_module).run(lambda: finite_scalars(self._warn_once, self._faithfulness(
                    pl_module, self._scored_batches(trainer, pl_module, part), len(part), part.groups), step),
                    every_rank=True)
                if trainer.is_global_zero:
                    log_scalars(trainer, test_scalars(scalars) if testing else scalars, step, self._run.failures)
                    if not testing:
                        self._views.write_scores(writers(trainer), step, scalars, self._curves)
                        self._health.check(trainer, step, scalars)
                self._remember(scalars, f"{len(part)} {what} at step {step}")
            except Exception as err:  # noqa: BLE001 - nor may scoring take the end of a run down
                self._not_scored = self._run.failures.subset_failed(step, when, err)  # warned once, counted

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print_report(trainer)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "validate" and not trainer.sanity_checking:
            self._print_report(trainer)

    @override
    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._print_report(trainer)

    def _print_report(self, trainer: Trainer) -> None:
        """The run's summary on rank zero, kept in ``summary``; a validation or test reports only what it scored."""
        if not trainer.is_global_zero:
            return
        try:
            self.summary = self._report(trainer)
        except Exception as err:  # noqa: BLE001 - the run has finished: a summary must not fail it
            self.summary = f"\nGAECallback: the summary could not be written ({type(err).__name__}: {err})"
        if self.print_summary:
            print(self.summary)

    def _report(self, trainer: Trainer) -> str:
        stage = trainer.state.fn.value
        if stage != "fit" and (self._last_scored is None or self._last_scored[0] != stage):
            self._reported = self._not_scored = None
        alerts = [alert.text(indent="  ") for alert in self._alerts]
        after = [*(["alerts (suspect regions that took a method's relevance):", *alerts] if alerts else []),
                 *self._health.summary_lines()]
        return run_summary(trainer, self._reported, self._not_scored, self._run, self.faithfulness.metrics, after,
                           elsewhere_lines(trainer))

    def _explain(self, pl_module: LightningModule, inputs: Any,
                 labels: Tensor | None = None) -> tuple[dict[str, Explanation], dict[str, Tensor]]:
        """Each method's explanation and each Captum baseline's attribution of ``inputs``.

        ``labels``: those of ``inputs`` when they are not the tracked samples (the faithfulness subset).
        """
        if labels is None or callable(self.target):
            target = tracked_target(self.target, self._run.labels, pl_module.device, self.query)
        else:
            target = None if self.target == "pred" else labels.to(pl_module.device)
        # One recorded forward for every method (GAE alone keeps its memory-lean path).
        readout = self._run.readout
        query = "last" if readout is not None else self.query
        explanations = explain_methods(pl_module, inputs, self.methods, target=target, query=query,
                                       attention_modules=self.engine.attention_modules, streams=self.engine.streams,
                                       embedding_layer=self.engine.embedding_layer)
        first = next(iter(explanations.values()))
        # Every method explains the same classes: the first explanation's (the prediction or the label).
        classifier = readout if readout is not None else pl_module
        maps = {m: attribute(m, classifier, inputs, first.target, embedding_layer=self.engine.embedding_layer,
                             seed=self.batches.seed)
                for m in self.captum_baselines}
        return explanations, maps

    def _explain_step(self, trainer: Trainer, pl_module: LightningModule, step: int, subset: Any = None) -> None:
        run = self._run
        inputs = self._model_inputs(trainer, pl_module)
        explanations, maps = self._explain(pl_module, inputs)
        first = next(iter(explanations.values()))
        computed = [r for e in explanations.values() for r in e.relevance.values()] + list(maps.values())
        views = rows = None
        if run.sets is not None:
            views = set_views(run, inputs)
            rows = None if run.last is None else decoder_rows(run, pl_module, inputs, self.methods, self.target,
                                                              self.engine)
            computed += [r for by_set in (rows or {}).values() for r in by_set.values()]
        if first.logits is not None:
            computed.append(first.logits)
        if not all(torch.isfinite(t).all() for t in computed):
            run.failures.record("explanation", step, "not finite", f"GAECallback: explanation at step {step} was skipped: "
                                "the model's logits or the relevance are not finite (NaN or inf). Such steps are skipped, "
                                "nothing non-finite is logged, and the summary counts them.")
            return
        scalars: dict[str, float] = {}
        for method, exp in explanations.items():
            scalars.update(relevance_scalars(method, exp.tokens, self._previous.get(method),
                                             self.display.top_fraction))
        scored: dict[str, Tensor] = {**{m: e.tokens for m, e in explanations.items()}, **maps}
        if self.faithfulness.random_baseline:
            scored["random"] = random_attribution(first.tokens, self.batches.seed)
        scored_on = ""
        shared, groups = None, run.groups
        if run.scored is None or views is not None:
            # Models with several token sets score no perturbation metric; their ground truth is per set.
            # FaithfulnessOptions(samples=0): the displayed samples are scored, at every step (they are few).
            batches: Iterable[ScoredBatch] = [ScoredBatch(inputs, scored, first.target, run.labels, run.truth)]
            scored_on = f"the {len(self.sample_indices)} tracked validation samples at step {step}"
        elif subset is not None:
            batches, shared, groups = self._scored_batches(trainer, pl_module, subset), len(subset), subset.groups
            final = ", the final weights" if trainer.state.fn == "fit" and final_explanation(trainer) else ""
            scored_on = f"{len(subset)} validation samples{final} at step {step}"
            self._last_scored = (trainer.state.fn.value, step)
        else:
            batches = []
        shares = None
        # The pictures are logged whatever scoring does, also when it failed on another rank (it gathers from all).
        with run.failures.isolated("scoring", step), together():
            scalars.update(self._faithfulness(pl_module, batches, shared, groups))
            if views is not None:
                scalars.update(set_truth_scalars(explanations, rows, run.sets, inputs, run.keyed, pl_module,
                                                 run.metric_objects))
            if run.region_masks:
                relevance = {m: e.tokens for m, e in explanations.items()}
                relevance["random"] = random_attribution(first.tokens, self.batches.seed)
                found, shares = region_scalars(relevance, run.region_masks, run.modality, inputs, self.regions.top_k)
                scalars.update(found)
        scalars = finite_scalars(self._warn_once, scalars, step)
        with run.failures.isolated("pictures", step):
            if trainer.is_global_zero:
                self._log(trainer, step, inputs, explanations, maps, scalars, views, rows)
        self._remember(scalars, scored_on)
        self._health.check(trainer, step, scalars)
        if shares is not None and trainer.is_global_zero:
            self._alert(trainer, pl_module, step, inputs, scalars, shares)
        self._previous = {m: e.tokens.detach().cpu() for m, e in explanations.items()}

    def _alert(self, trainer: Trainer, pl_module: LightningModule, step: int, inputs: Any, scalars: dict[str, float],
               shares: dict[str, dict[str, Tensor]]) -> None:
        """Warn once for every suspect region that took a method's relevance; to the Text tab and the summary too."""
        if self._first_regions is None:
            self._first_regions = {t: v for t, v in scalars.items() if t.startswith("region_share_")}
        module = self._run.readout if self._run.readout is not None else pl_module
        announce(trainer, writers(trainer), step, self._alerts, self.regions.stop_on_shortcut, new_alerts(
            self.regions, self._run, scalars, shares, self._first_regions, self._alerts, module, inputs, step,
            (self._reported or ("", None))[1], self.batches.seed))

    def _remember(self, scalars: dict[str, float], scored_on: str) -> None:
        """Keep the faithfulness scalars just logged (if the step scored any) for the summary printed when fit ends."""
        if faithfulness_rows(scalars) is not None:
            self._reported, self._not_scored = (scored_on, dict(scalars)), None

    def _scored_batches(self, trainer: Trainer, pl_module: LightningModule, subset: Any) -> Iterable[ScoredBatch]:
        return scored_batches(trainer, pl_module, subset, self._explain, self.faithfulness.max_batch,
                              self.faithfulness.random_baseline, self.batches.seed)

    def _faithfulness(self, pl_module: LightningModule, batches: Iterable[ScoredBatch],
                      shared: int | None = None, groups: Tensor | None = None) -> dict[str, float]:
        """Each metric and method over every batch with its standard error; keeps the curves for the GAE tab.

        ``shared``: the batches are this rank's part of a subset of that many samples; the other ranks' samples are
        gathered first. ``groups``: the scored samples' groups (a causal LM's prompts), left out whole by the errors.
        """
        share = None if shared is None else (lambda scores: gather_scores(scores, shared))
        # A causal LM's answer rows are scored through the logits at their readout, and their ground truth by recall too.
        run = self._run
        module, extra = (pl_module, ()) if run.readout is None else (run.readout, (RECALL,))
        scalars, self._curves = faithfulness(self._health.watch(batches), self.faithfulness.metrics,
                                             self.target == "pred", run.modality, module, run.metric_objects,
                                             self.faithfulness.max_batch, extra, share, groups)
        return scalars

    def _log(self, trainer: Trainer, step: int, inputs: Any, explanations: dict[str, Explanation],
             maps: dict[str, Tensor], scalars: dict[str, float], views: dict[str, SetInput] | None = None,
             rows: dict[str, dict[str, Tensor]] | None = None) -> None:
        found, images = writers(trainer), image_loggers(trainer)
        log_scalars(trainer, scalars, step, self._run.failures)
        if found or images:  # the pictures are drawn for TensorBoard and the loggers that take pictures
            shown = display_input(inputs) if views is None else views[next(iter(explanations.values())).query_set].shown
            pictures = self._views.write(
                found, step, modality=self._run.modality, inputs=inputs, shown=shown,
                sample_indices=self._run.shown, explanations=explanations, maps=maps, scalars=scalars,
                curves=self._curves, labels=self._run.labels,
                class_names=class_names(trainer), sets=views, rows=rows,
                last=trainer.state.fn != "fit" or final_explanation(trainer),
            )
            log_pictures(images, pictures, step, self._run.failures)

    # --- checkpointing --------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"sample_indices": self.sample_indices, "previous": self._previous}

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn != "fit":  # validate()/test() of a checkpoint log at its step (:mod:`.evaluation`)
            self._loaded_step = checkpoint_step(checkpoint)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        indices = state_dict.get("sample_indices")
        if indices is not None:
            self.sample_indices = list(indices)
        self._previous = dict(state_dict.get("previous", {}))
