"""The run of a GAECallback: everything it knows and does between the Trainer's hooks, in one object.

:class:`Run` owns the run's whole state: the tracked samples read when a stage starts (:class:`RunState`), what
survives from one explanation step to the next and across a checkpoint (the previous step's relevance, the tracked
samples' positions), the views, the schedule's counters, the alerts and flags raised and what the summary reports.
The callback's hooks each call one of its methods. Every job it does on data has a module of its own, called with
data: which samples (:mod:`._tracked`), the check when a run starts (:mod:`._preflight`), explaining
(:mod:`._explainer`), several token sets (:mod:`._token_sets`), scoring (:mod:`._scoring`), regions (:mod:`._regions`),
the summary (:mod:`._report`), what each logger gets (:mod:`._loggers`), several processes (:mod:`.distributed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.seed import isolate_rng
from torch import Tensor

from lightning_gae._structures import display_input, map_tensors
from lightning_gae.callbacks._arguments import Arguments
from lightning_gae.callbacks._explainer import Explainer
from lightning_gae.callbacks._loggers import (elsewhere_lines, image_loggers, log_pictures, log_scalars, logger_note,
                                              only_dummy_loggers, writers)
from lightning_gae.callbacks._preflight import check_explanations
from lightning_gae.callbacks._regions import (RegionAlert, announce, announce_coverage, coverage_lines, new_alerts,
                                              region_masks, region_scalars, subset_removal, with_data_regions)
from lightning_gae.callbacks._report import run_summary
from lightning_gae.callbacks._schedule import final_explanation, fit_part, subset_due
from lightning_gae.callbacks._scoring import (Curves, ScoredBatch, faithfulness, finite_scalars, relevance_scalars,
                                              scored_batches, set_truth_scalars, warn_once)
from lightning_gae.callbacks._state import SHARED, RunState
from lightning_gae.callbacks._token_sets import decoder_rows, set_views
from lightning_gae.callbacks._tracked import collect
from lightning_gae.callbacks.distributed import Lockstep, check_strategy, from_rank_zero, gather_scores, together
from lightning_gae.callbacks.evaluation import checkpoint_step, logged_step, scorable, test_scalars
from lightning_gae.callbacks.failures import Failures
from lightning_gae.callbacks.health import Health
from lightning_gae.callbacks.samples import Samples, class_names
from lightning_gae.engine.readout import Explanation
from lightning_gae.language.answers import NextTokenLogits
from lightning_gae.methods.random import RANDOM
from lightning_gae.metrics.ground_truth import RECALL
from lightning_gae.options import DisplayOptions
from lightning_gae.tensorboard.summary import TensorBoardViews, faithfulness_rows
from lightning_gae.tensorboard.views import SetInput

__all__ = ["Run", "new_views"]


def new_views(display: DisplayOptions) -> TensorBoardViews:
    """The TensorBoard views drawn as ``display`` says (a run keeps its own across stages)."""
    return TensorBoardViews(scale=display.heatmap_scale, evolution_length=display.evolution_length)


def _stage(trainer: Trainer) -> str:
    """The Trainer call a hook runs in: ``"fit"``, ``"validate"``, ``"test"``, ..."""
    fn = trainer.state.fn
    assert fn is not None  # a hook runs inside a trainer call, which sets it
    return fn.value


class Run:
    """What a :class:`~lightning_gae.callbacks.GAECallback` knows and does across its runs (fits, validations, tests).

    Attributes:
        args: the callback's arguments (given again when each stage is set up).
        sample_indices: the tracked samples' positions: given, chosen when the first run starts, or restored from a
            checkpoint (:meth:`state_dict`).
        summary: the text of the last run's summary (rank zero), for whoever prints it later.
        state: the tracked samples of the current run and what was found out about them (:class:`RunState`).
        explainer: what the current run explains with (:class:`~lightning_gae.callbacks._explainer.Explainer`).
        previous: each method's relevance at the last explanation step (what stability compares with; checkpointed).
        views: the TensorBoard views, built in setup and kept across runs (evolution columns, fixed colour ranges).
        curves: the perturbation metrics' curves of the last scoring, for the dashboard.
        reported, not_scored: the last faithfulness scalars logged and what they were scored on, or why none were.
        first_regions, alerts: the first step's region shares (what a rise is measured from), the alerts raised.
        health: the flags raised this fit (:class:`~lightning_gae.callbacks.health.Health`).
        explanation_count, last_explained, last_scored, last_step: the schedule's counters: explanation steps of this
            fit, the last ``(stage, global step)`` explained and ``(stage, step)`` scored, the last step logged at.
        loaded_step: the step of the checkpoint a validate() or test() loaded.
        resumed_failures: the failures a resumed fit's checkpoint held, for the fit's samples when they are read.
        warned: what was warned once (in this process: a resumed run warns again in its own).

    A checkpoint keeps what the verdicts and the schedule depend on (:meth:`state_dict`); what is made again from it
    (the samples, the explainer, the metric objects) and the drawing's state (the evolution strips' columns, fixed
    colour ranges) are not kept.
    """

    def __init__(self, args: Arguments) -> None:
        self.args = args
        self.sample_indices: list[int] | None = (None if args.batches.sample_indices is None
                                                 else list(args.batches.sample_indices))
        self.summary: str | None = None
        self.state = RunState()
        self.explainer: Explainer | None = None
        self.last_explained: tuple[str, int] | None = None
        self.explanation_count = 0
        self.last_scored: tuple[str, int] | None = None
        self.last_step = 0
        self.loaded_step: int | None = None
        self.previous: dict[str, Tensor] = {}
        self.views: TensorBoardViews | None = None
        self.curves: Curves = {}
        self.warned: set[str] = set()
        self.reported: tuple[str, dict[str, float]] | None = None
        self.not_scored: str | None = None
        self.first_regions: dict[str, float] | None = None
        self.alerts: list[RegionAlert] = []
        self.health = Health()
        self.resumed_failures: Failures | None = None

    # --- a stage's start and end ----------------------------------------------------------------

    def setup(self, trainer: Trainer, stage: str, args: Arguments) -> None:
        """A stage is set up: the arguments as they are now, the views, a fit's fresh alerts and flags."""
        self.args = args
        check_strategy(trainer.strategy)
        if self.views is None:
            self.views = new_views(self.args.display)
        self.loaded_step = None  # a checkpoint is loaded after setup
        if stage == "fit":
            self.summary = None
            self.first_regions, self.alerts, self.health = None, [], Health()
        if not trainer.loggers:
            rank_zero_warn(
                "GAECallback: the Trainer has no logger, so nothing will be shown. Add one, e.g. "
                "Trainer(logger=lightning.pytorch.loggers.TensorBoardLogger('runs'))."
            )
        if trainer.is_global_zero and (note := logger_note(trainer)) is not None:
            warn_once(self.warned, "loggers", note)  # what the loggers that are not TensorBoard get and cannot show

    def teardown(self) -> None:
        """The stage ended: the metric objects hold the module; the next fit or validate reads its own samples."""
        self.state = RunState()
        self.explainer = None
        if self.views is not None:
            self.views.close()
        self.last_explained = self.last_scored = None
        self.explanation_count = 0
        self.reported = self.not_scored = None
        self.resumed_failures = None

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Read the samples and explain them once, so that what cannot work stops the run now, with its fix.

        Runs on every rank (all of them stop together); the RNGs are restored, so training is unchanged.
        """
        Lockstep(trainer, pl_module).run(lambda: self._prepare(trainer, pl_module), every_rank=True)

    @property
    def started(self) -> bool:
        """Whether this stage's samples were read (a validation inside a fit reads none of its own)."""
        return self.state.inputs is not None

    def _prepare(self, trainer: Trainer, pl_module: LightningModule) -> None:
        args = self.args
        with isolate_rng():
            testing = trainer.state.fn == "test"  # test data: samples of its own, never kept as the tracked ones
            state = self.state = RunState(sample_indices=None if testing else self.sample_indices)
            if trainer.state.fn == "fit" and self.resumed_failures is not None:
                state.failures = self.resumed_failures  # a resumed fit's, from its checkpoint
            try:
                # validate() runs its hooks in inference mode, and a tensor made there can never take part
                # in autograd: the labels, the explained class of target="label", would fail every explanation.
                with torch.inference_mode(False):
                    from_rank_zero(trainer, lambda: collect(trainer, state, args.num_samples, args.batches,
                                                            args.faithfulness, args.engine.answer_tokens, args.target),
                                   state, SHARED)
                self.sample_indices = self.sample_indices if testing else state.sample_indices
                # A causal LM's answer rows are read through the logits at each row's readout (on every rank).
                state.readout = None if state.row_names is None else NextTokenLogits(pl_module)
            except ValueError:
                raise
            except Exception as err:
                raise ValueError(f"GAECallback: reading the validation samples failed ({type(err).__name__}: {err}); "
                                 "check batches=BatchOptions(dataloader_idx=..., inputs=..., labels=..., "
                                 "ground_truth=...)") from err
            self.explainer = Explainer(args.methods, args.captum_baselines, args.target, args.query, args.engine,
                                       args.batches.seed, state.labels, state.readout)
            check_explanations(state, trainer, pl_module, self._model_inputs(trainer, pl_module), self.explainer,
                               args.modality, args.methods, args.target, args.query, args.faithfulness.metrics,
                               args.captum_baselines, args.engine, partial(new_views, args.display))
            regions = with_data_regions(args.regions, trainer.datamodule)  # type: ignore[attr-defined]  # set by Lightning at run time
            self.args = replace(self.args, regions=regions)
            if regions.regions:
                if state.sets is not None:
                    raise ValueError("GAECallback(regions=RegionOptions(...)): the model has several token sets; regions "
                                     "are declared over the inputs of a model with one")
                try:
                    assert state.modality is not None  # settled by the check above
                    state.region_masks = region_masks(regions, state.modality, state.inputs)
                except Exception as err:
                    raise ValueError(f"GAECallback(regions=RegionOptions(...)) does not fit the tracked samples with "
                                     f"{state.modality!r}: {type(err).__name__}: {err}") from err
                if trainer.is_global_zero:
                    announce_coverage(writers(trainer), trainer.global_step, state.region_masks)

    def _model_inputs(self, trainer: Trainer, pl_module: LightningModule) -> Any:
        # The loops cast every batch to the precision ("bf16-true", "16-true"); the kept samples need the same.
        return trainer.precision_plugin.convert_input(map_tensors(self.state.inputs, lambda t: t.to(pl_module.device)))

    def _explain(self) -> Explainer:
        assert self.explainer is not None  # built when the run started
        return self.explainer

    # --- an explanation step --------------------------------------------------------------------

    def explain_and_log(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Explain the tracked samples at this step, score what is due and log it all; never fail the run."""
        # The same weights are explained once: with gradient accumulation on_train_batch_end sees a
        # global step several times. The stage is part of it: validate() after fit() starts at fit's last step.
        explained = (_stage(trainer), trainer.global_step)
        if self.state.inputs is None or self.last_explained == explained:
            return
        if only_dummy_loggers(trainer):
            return
        self.last_explained = explained
        # What the module's self.log uses at this moment (global_step runs ahead of it at epoch ends).
        step = logged_step(trainer, self.loaded_step)
        self.last_step = step
        run = self.state
        subset = None if run.scored is None else subset_due(trainer, self.explanation_count,
                                                            self.args.faithfulness.every_n_explanations, run.scored,
                                                            run.interim)
        self.explanation_count += 1
        # Rank zero explains and logs; every rank takes part when the model is sharded or the subset is split.
        lockstep = Lockstep(trainer, pl_module)
        every_rank = lockstep.sharded or (subset is not None and run.sets is None)
        if not (every_rank or trainer.is_global_zero):
            return
        with isolate_rng(), run.failures.attempt(step):  # an explanation must never take training down
            lockstep.run(lambda: self._explain_step(trainer, pl_module, step, subset), every_rank)

    def _explain_step(self, trainer: Trainer, pl_module: LightningModule, step: int,
                      subset: Samples | None = None) -> None:
        run, args = self.state, self.args
        inputs = self._model_inputs(trainer, pl_module)
        explanations, maps = self._explain()(pl_module, inputs)
        first = next(iter(explanations.values()))
        computed = [r for e in explanations.values() for r in e.relevance.values()] + list(maps.values())
        views = rows = None
        if run.sets is not None:
            views = set_views(run, inputs)
            rows = None if run.last is None else decoder_rows(run, pl_module, inputs, args.methods, args.target,
                                                              args.engine)
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
            scalars.update(relevance_scalars(method, exp.tokens, self.previous.get(method),
                                             args.display.top_fraction))
        scored: dict[str, Tensor] = {**{m: e.tokens for m, e in explanations.items()}, **maps}
        if args.faithfulness.random_baseline:
            scored[RANDOM.name] = RANDOM.rule(first.tokens, args.batches.seed)
        scored_on = ""
        shared, groups = None, run.groups
        if run.scored is None or views is not None:
            # Models with several token sets score no perturbation metric; their ground truth is per set.
            # FaithfulnessOptions(samples=0): the displayed samples are scored, at every step (they are few).
            batches: Iterable[ScoredBatch] = [ScoredBatch(inputs, scored, first.target, run.labels, run.truth,
                                                          logits=first.logits)]
            assert self.sample_indices is not None  # chosen when the run started
            scored_on = f"the {len(self.sample_indices)} tracked validation samples at step {step}"
        elif subset is not None:
            batches, shared, groups = self._scored_batches(trainer, pl_module, subset), len(subset), subset.groups
            final = ", the final weights" if trainer.state.fn == "fit" and final_explanation(trainer) else ""
            scored_on = f"{len(subset)} validation samples{final} at step {step}"
            self.last_scored = (_stage(trainer), step)
        else:
            batches = []
        shares = None
        # The pictures are logged whatever scoring does, also when it failed on another rank (it gathers from all).
        with run.failures.isolated("scoring", step), together():
            scalars.update(self._faithfulness(pl_module, batches, shared, groups))
            if views is not None:
                assert run.sets is not None  # views are drawn per token set
                scalars.update(set_truth_scalars(explanations, rows, run.sets, inputs, run.keyed, pl_module,
                                                 run.metric_objects))
            if run.region_masks:
                assert run.modality is not None  # settled when the run started
                relevance = {m: e.tokens for m, e in explanations.items()}
                relevance[RANDOM.name] = RANDOM.rule(first.tokens, args.batches.seed)
                found, shares = region_scalars(relevance, run.region_masks, run.modality, inputs, args.regions.top_k)
                scalars.update(found)
        scalars = finite_scalars(scalars, step, self.warned)
        with run.failures.isolated("pictures", step):
            if trainer.is_global_zero:
                self._log(trainer, step, inputs, explanations, maps, scalars, views, rows)
        self._remember(scalars, scored_on)
        self.health.check(trainer, step, scalars, {m: e.tokens for m, e in explanations.items()})
        if shares is not None and trainer.is_global_zero:
            self._alert(trainer, pl_module, step, inputs, scalars, shares)
        self.previous = {m: e.tokens.detach().cpu() for m, e in explanations.items()}

    def _alert(self, trainer: Trainer, pl_module: LightningModule, step: int, inputs: Any, scalars: dict[str, float],
               shares: dict[str, dict[str, Tensor]]) -> None:
        """Warn once for every suspect region that took a method's relevance; to the Text tab and the summary too."""
        if self.first_regions is None:
            self.first_regions = {t: v for t, v in scalars.items() if t.startswith("region_share_")}
        module = self.state.readout if self.state.readout is not None else pl_module
        removal = subset_removal(self.state, lambda x: trainer.precision_plugin.convert_input(
            map_tensors(x, lambda t: t.to(pl_module.device))), self.args.faithfulness.max_batch)
        announce(trainer, writers(trainer), step, self.alerts, self.args.regions.stop_on_shortcut, new_alerts(
            self.args.regions, self.state, scalars, shares, self.first_regions, self.alerts, module, inputs, step,
            (self.reported or ("", None))[1], self.args.batches.seed, removal))

    def _remember(self, scalars: dict[str, float], scored_on: str) -> None:
        """Keep the faithfulness scalars just logged (if the step scored any) for the summary printed when fit ends."""
        if faithfulness_rows(scalars) is not None:
            self.reported, self.not_scored = (scored_on, dict(scalars)), None

    def _scored_batches(self, trainer: Trainer, pl_module: LightningModule, subset: Samples) -> Iterable[ScoredBatch]:
        options = self.args.faithfulness
        return scored_batches(trainer, pl_module, subset, self._explain(), options.max_batch, options.random_baseline,
                              self.args.batches.seed)

    def _faithfulness(self, pl_module: LightningModule, batches: Iterable[ScoredBatch],
                      shared: int | None = None, groups: Tensor | None = None) -> dict[str, float]:
        """Each metric and method over every batch with its standard error; keeps the curves for the GAE tab.

        ``shared``: the batches are this rank's part of a subset of that many samples; the other ranks' samples are
        gathered first. ``groups``: the scored samples' groups (a causal LM's prompts), left out whole by the errors.
        """
        share = None if shared is None else partial(gather_scores, total=shared)
        # A causal LM's answer rows are scored through the logits at their readout, and their ground truth by recall too.
        run, options = self.state, self.args.faithfulness
        module, extra = (pl_module, ()) if run.readout is None else (run.readout, (RECALL,))
        assert run.modality is not None  # settled when the run started
        scalars, self.curves = faithfulness(self.health.watch(batches), options.metrics, self.args.target == "pred",
                                            run.modality, module, run.metric_objects, options.max_batch, extra, share,
                                            groups)
        return scalars

    def _log(self, trainer: Trainer, step: int, inputs: Any, explanations: dict[str, Explanation],
             maps: dict[str, Tensor], scalars: dict[str, float], views: dict[str, SetInput] | None = None,
             rows: dict[str, dict[str, Tensor]] | None = None) -> None:
        found, images = writers(trainer), image_loggers(trainer)
        log_scalars(trainer, scalars, step, self.state.failures)
        if found or images:  # the pictures are drawn for TensorBoard and the loggers that take pictures
            assert self.views is not None and self.state.modality is not None  # built in setup and at the start
            shown = display_input(inputs) if views is None else views[next(iter(explanations.values())).query_set].shown
            pictures = self.views.write(
                found, step, modality=self.state.modality, inputs=inputs, shown=shown,
                sample_indices=self.state.shown, explanations=explanations, maps=maps, scalars=scalars,
                curves=self.curves, labels=self.state.labels,
                class_names=class_names(trainer), sets=views, rows=rows,
                last=trainer.state.fn != "fit" or final_explanation(trainer),
            )
            log_pictures(images, pictures, step, self.state.failures)

    # --- scoring outside the explanation steps ----------------------------------------------------

    def end_training(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Training ended: the evolution strips still due, and fit's part of the faithfulness subset on the final
        weights, unless the last explanation step scored them."""
        if trainer.is_global_zero and self.views is not None and self.explanation_count:
            # Evolution strips still due (fit ended between the steps they are written at), at their newest column's step.
            try:
                pictures = self.views.write_strips(writers(trainer), self.last_step)
                log_pictures(image_loggers(trainer), pictures, self.last_step, self.state.failures)
            except Exception as err:  # noqa: BLE001 - nor may a picture take the end of training down
                warn_once(self.warned, str(err), f"GAECallback: writing the evolution strips when fit ended failed ({err})")
        run = self.state
        if run.scored is None or not scorable(run, self.args.faithfulness.metrics) or only_dummy_loggers(trainer):
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        if self.last_explained == ("fit", trainer.global_step):
            # The weights of the last explanation step (fit ended on a validation): scalars, curves and pictures share it.
            step = self.last_step
        if self.last_scored == ("fit", step):
            return
        self.last_scored = ("fit", step)
        self._score_subset(trainer, pl_module, fit_part(run.scored, run.interim), step, "when fit ended",
                           "validation samples, the final weights")

    def score_test(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The whole faithfulness subset of the test data, under ``test_<tag>``, without pictures (:mod:`.evaluation`)."""
        run = self.state
        if (run.inputs is not None and run.scored is not None and scorable(run, self.args.faithfulness.metrics)
                and not only_dummy_loggers(trainer)):
            step = logged_step(trainer, self.loaded_step)
            self.last_scored = ("test", step)
            self._score_subset(trainer, pl_module, run.scored, step, "in test", "test samples")

    def _score_subset(self, trainer: Trainer, pl_module: LightningModule, part: Samples, step: int, when: str,
                      what: str) -> None:
        """Score ``part`` of the faithfulness subset (every rank its share), log it at ``step``; never fail the run."""
        testing = trainer.state.fn == "test"
        # explain() and the metrics put the module in eval mode themselves: at the end of fit it is in training mode.
        with isolate_rng():
            try:
                scalars = Lockstep(trainer, pl_module).run(lambda: finite_scalars(self._faithfulness(
                    pl_module, self._scored_batches(trainer, pl_module, part), len(part), part.groups), step,
                    self.warned), every_rank=True)
                if trainer.is_global_zero:
                    log_scalars(trainer, test_scalars(scalars) if testing else scalars, step, self.state.failures)
                    if not testing:
                        assert self.views is not None  # built in setup
                        self.views.write_scores(writers(trainer), step, scalars, self.curves)
                        self.health.check(trainer, step, scalars)
                self._remember(scalars, f"{len(part)} {what} at step {step}")
            except Exception as err:  # noqa: BLE001 - nor may scoring take the end of a run down
                self.not_scored = self.state.failures.subset_failed(step, when, err)  # warned once, counted

    # --- the summary ----------------------------------------------------------------------------

    def report(self, trainer: Trainer) -> str | None:
        """The run's summary on rank zero, kept in ``summary`` (None on the other ranks); a validation or test reports
        only what it scored."""
        if not trainer.is_global_zero:
            return None
        try:
            self.summary = self._report(trainer)
        except Exception as err:  # noqa: BLE001 - the run has finished: a summary must not fail it
            self.summary = f"\nGAECallback: the summary could not be written ({type(err).__name__}: {err})"
        return self.summary

    def _report(self, trainer: Trainer) -> str:
        stage = _stage(trainer)
        if stage != "fit" and (self.last_scored is None or self.last_scored[0] != stage):
            self.reported = self.not_scored = None
        alerts = [alert.text(indent="  ") for alert in self.alerts]
        after = [*coverage_lines(self.state.region_masks),
                 *(["alerts (declared regions whose share of relevance differs from chance):", *alerts] if alerts else []),
                 *self.health.summary_lines()]
        return run_summary(trainer, self.reported, self.not_scored, self.state, self.args.faithfulness.metrics, after,
                           elsewhere_lines(trainer), self.curves)

    # --- checkpointing --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, as plain data (``torch.load(weights_only=True)`` reads it): what the run's verdicts
        depend on, so that a fit resumed from it goes on as the uninterrupted fit would.

        ``sample_indices`` and ``previous`` (the tracked samples, the last step's relevance: what stability compares
        with); ``alerts`` raised, ``first_regions`` (what a rise is measured from), ``health`` (its flags and what its
        rule carries between scored steps), ``failures`` (what failed, for the summary's counts and warned once), the
        schedule's counters (``schedule``: which explanation steps score), and the last faithfulness ``reported``,
        ``not_scored`` and ``curves`` (what an alert and the summary quote until the next scoring).
        """
        return {
            "sample_indices": self.sample_indices,
            "previous": {m: t.detach().cpu() for m, t in self.previous.items()},
            "alerts": [asdict(alert) for alert in self.alerts],
            "first_regions": self.first_regions,
            "health": self.health.state_dict(),
            "failures": self.state.failures.state_dict(),
            "schedule": {"explanation_count": self.explanation_count, "last_step": self.last_step,
                         "last_explained": _listed(self.last_explained), "last_scored": _listed(self.last_scored)},
            "reported": _listed(self.reported),
            "not_scored": self.not_scored,
            "curves": {metric: {m: [[float(f) for f in fractions], curve.detach().cpu()]
                                for m, (fractions, curve) in by_method.items()} for metric, by_method in self.curves.items()},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Read back what :meth:`state_dict` kept; keys a checkpoint does not hold (one written before they were kept)
        leave their values as they are."""
        indices = state_dict.get("sample_indices")
        if indices is not None:
            self.sample_indices = list(indices)
        self.previous = dict(state_dict.get("previous", {}))
        if "alerts" in state_dict:
            try:
                self.alerts = [RegionAlert(**alert) for alert in state_dict["alerts"]]
            except TypeError as err:  # written by a version whose alerts had other fields: resume all the same
                rank_zero_warn(f"GAECallback: the checkpoint's alerts do not fit this version's ({err}); they are not "
                               "restored, and an alert raised before it may be raised again")
        self.first_regions = state_dict.get("first_regions", self.first_regions)
        self.health.load_state_dict(state_dict.get("health", {}))
        if "failures" in state_dict:
            # The fit's samples are read (and its RunState made) after the checkpoint is loaded, or before it under the
            # strategies that restore after their setup: both get them.
            self.resumed_failures = self.state.failures = Failures.from_state_dict(state_dict["failures"])
        schedule = state_dict.get("schedule", {})
        self.explanation_count = schedule.get("explanation_count", self.explanation_count)
        self.last_step = schedule.get("last_step", self.last_step)
        self.last_explained = _tupled(schedule.get("last_explained", self.last_explained))
        self.last_scored = _tupled(schedule.get("last_scored", self.last_scored))
        self.reported = _tupled(state_dict.get("reported", self.reported))
        self.not_scored = state_dict.get("not_scored", self.not_scored)
        if "curves" in state_dict:
            self.curves = {metric: {m: (tuple(fractions), curve) for m, (fractions, curve) in by_method.items()}
                           for metric, by_method in state_dict["curves"].items()}

    def load_checkpoint(self, trainer: Trainer, checkpoint: Mapping[str, Any]) -> None:
        """A validate() or test() of a checkpoint logs at its step (:mod:`.evaluation`). A fit resumed from it goes on
        at that step: in TensorBoard, what an interrupted fit logged into the same runs from there on is dropped, since
        the resumed fit logs those steps again (with the alerts the checkpoint does not hold)."""
        step = checkpoint_step(checkpoint)
        if trainer.state.fn != "fit":
            self.loaded_step = step
        elif step is not None and trainer.is_global_zero and self.views is not None:
            try:
                self.views.restart(writers(trainer), step)
            except Exception as err:  # noqa: BLE001 - a resumed fit goes on without it
                warn_once(self.warned, "restart", f"GAECallback: marking the resumed fit's start at step {step} in the "
                                                  f"TensorBoard runs failed ({type(err).__name__}: {err}); the steps "
                                                  "logged after the checkpoint before the fit stopped show twice")


def _listed(pair: tuple[Any, ...] | None) -> list[Any] | None:
    """A pair as a checkpoint keeps it (plain lists)."""
    return None if pair is None else list(pair)


def _tupled(pair: Any) -> Any:
    """A pair :func:`_listed` kept, as the run holds it."""
    return None if pair is None else tuple(pair)
