"""GAECallback: explain a fixed set of validation samples while the model trains, log to TensorBoard.

The class keeps its arguments and their checks, and the Trainer's hooks, each of a few lines: every hook hands its
work to the callback's :class:`~lightning_gae.callbacks.run.Run`, the one object that owns the run's state (what a
checkpoint keeps included) and calls the modules that do each job on data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, Literal

from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from typing_extensions import override

from lightning_gae.callbacks._arguments import Arguments, check_arguments
from lightning_gae.callbacks._schedule import epoch_due, step_due
from lightning_gae.callbacks.run import Run
from lightning_gae.callbacks.samples import (
    default_batch_ground_truth,
    default_batch_inputs,
    default_batch_labels,
)
from lightning_gae.modalities.tokens import Modality
from lightning_gae.options import (
    BatchOptions,
    DisplayOptions,
    EngineOptions,
    FaithfulnessOptions,
    RegionOptions,
    check_field,
    flag,
)

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
      previous step), ``relevance_concentration/<method>`` (the share of the positive relevance in the top
      ``DisplayOptions.top_fraction`` of tokens, in [0, 1]); a histogram ``relevance/<method>``;
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

    Whatever can be checked without the model and data is checked here, when the callback is built (every argument
    and option group refuses a value of the wrong type or range, naming it and what it accepts; nothing is
    converted silently); the rest when a run starts, by reading the samples and explaining them once: any failure
    stops the run with the fix. Later, a failing explanation warns once with its reason and is skipped, and nothing
    non-finite is ever logged.

    A Trainer takes one ``GAECallback``: two would write the same tags at the same steps into one logger, so a
    second one stops the run in ``setup``, naming both. One callback takes every method (``methods``,
    ``captum_baselines``) and every region (``regions``).

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
        ValueError: here, naming the argument and what it accepts: an unknown or repeated method or Captum
            baseline (a Captum method given to ``methods`` is pointed to ``captum_baselines``), a bad schedule,
            target or query, a flag that is not True or False, a group that is not its options class, options that
            conflict (a callable target with metrics; a ``TabularTokens`` without ``means`` while metrics remove
            features). In ``setup``: a second ``GAECallback`` in the Trainer. When a run starts: a strategy it cannot explain under (DeepSpeed stage 3, tensor
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
        self.methods = methods
        self.modality = modality
        self.target = target
        self.query = query
        self.captum_baselines = captum_baselines
        self.print_summary = check_field("GAECallback", "print_summary", print_summary, flag())
        self.log_sanity_check = log_sanity_check
        self.faithfulness = FaithfulnessOptions() if faithfulness is None else faithfulness
        self.batches = BatchOptions() if batches is None else batches
        self.engine = EngineOptions() if engine is None else engine
        self.display = DisplayOptions() if display is None else display
        self.regions = RegionOptions() if regions is None else regions
        # The run's whole state, what a checkpoint keeps included: every hook below hands its work to it.
        self.run = Run(self._arguments())

    def _arguments(self) -> Arguments:
        """The arguments as they are now (a config or the CLI may change them before a run), checked
        (:func:`check_arguments`); the callback keeps what the checks read (lists as tuples)."""
        args = check_arguments(Arguments(**{f.name: getattr(self, f.name) for f in fields(Arguments)}))
        self.__dict__.update({f.name: getattr(args, f.name) for f in fields(args)})  # plain attributes, no properties
        return args

    @property
    def sample_indices(self) -> list[int] | None:
        """The tracked samples' positions in the validation set (given, chosen when the first run starts, or restored
        from a checkpoint)."""
        return self.run.sample_indices

    @sample_indices.setter
    def sample_indices(self, indices: Sequence[int] | None) -> None:
        self.run.sample_indices = None if indices is None else list(indices)

    @property
    def summary(self) -> str | None:
        """The text printed when the last run ended (rank zero), for whoever prints it later (the CLI does)."""
        return self.run.summary

    @property
    @override
    def state_key(self) -> str:
        # Not the seed: a resumed run keeps the samples it tracked, whatever seed it was given.
        return self._generate_state_key(num_samples=self.num_samples, methods=self.methods)

    # --- a stage's start and end ----------------------------------------------------------------

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._only_one(trainer)
        self.run.setup(trainer, stage, self._arguments())

    def _only_one(self, trainer: Trainer) -> None:
        """One ``GAECallback`` per Trainer: two would write the same tags (``gae_heatmaps/val_<i>``, every
        ``<metric>/<method>``, the GAE tab's summaries) at the same steps into the same logger, and nothing tells them
        apart."""
        ours = [(i, c) for i, c in enumerate(trainer.callbacks)  # type: ignore[attr-defined]  # set by Lightning at run time
                if isinstance(c, GAECallback)]
        if len(ours) > 1:
            named = " and ".join(f"trainer.callbacks[{i}] (methods={list(c.methods)}, num_samples={c.num_samples})"
                                 for i, c in ours)
            raise ValueError(f"the Trainer holds {len(ours)} GAECallbacks, {named}: they would write the same tags at "
                             "the same steps into one logger. Keep one GAECallback and give it every method "
                             "(methods=[...], captum_baselines=[...]); a second set of samples or options needs a second "
                             "Trainer run")

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.run.teardown()

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start(trainer, pl_module)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # trainer.validate() has no fit start; its loaders are known by now.
        if not self.run.started:
            self._start(trainer, pl_module)

    @override
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start(trainer, pl_module)  # its samples are read from the test data

    def _start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        try:
            self.run.start(trainer, pl_module)
        finally:
            self.regions = self.run.args.regions  # with the datamodule's, read once (RegionOptions.from_data)

    # --- when -----------------------------------------------------------------------------------

    @override
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if epoch_due(trainer, self.every_n_epochs, self.log_sanity_check):
            self.run.explain_and_log(trainer, pl_module)

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if step_due(trainer.global_step, self.every_n_train_steps):
            self.run.explain_and_log(trainer, pl_module)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.run.end_training(trainer, pl_module)

    @override
    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.run.score_test(trainer, pl_module)

    # --- the summary ----------------------------------------------------------------------------

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
        summary = self.run.report(trainer)  # rank zero's, kept in ``summary``
        if summary is not None and self.print_summary:
            print(summary)

    # --- checkpointing --------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.run.state_dict()

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self.run.load_checkpoint(trainer, checkpoint)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.run.load_state_dict(state_dict)
