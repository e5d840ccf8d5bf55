"""GAECallback: explain a fixed set of validation samples while the model trains, log to TensorBoard."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers.logger import DummyLogger
from lightning.pytorch.utilities import CombinedLoader, rank_zero_warn
from lightning.pytorch.utilities.seed import isolate_rng
from torch import Tensor
from torchmetrics import Metric
from typing_extensions import override

from lightning_gae._structures import display_input, map_tensors, take
from lightning_gae.attribution import CAPTUM_METHODS, attribute
from lightning_gae.callbacks._distributed import (
    Lockstep,
    RankFailed,
    check_strategy,
    from_rank_zero,
    gather_scores,
    random_rows,
    subset_part,
)
from lightning_gae.callbacks.samples import (
    Samples,
    balanced_choice,
    class_names,
    default_batch_ground_truth,
    default_batch_inputs,
    default_batch_labels,
    finite_rows,
    missing_classes,
    private_reader,
    read_samples,
)
from lightning_gae.language.answers import NextTokenLogits
from lightning_gae.callbacks.answer_samples import answer_samples, has_answer_labels, holds_causal_lm, keep_readout
from lightning_gae.callbacks._report import fit_report
from lightning_gae.callbacks._schedule import final_explanation, fit_part, interim_part, subset_due
from lightning_gae.callbacks._scoring import (
    Curves,
    ScoredBatch,
    faithfulness,
    relevance_scalars,
    set_truth_scalars,
)
from lightning_gae.engine.explain import LRP_METHODS, METHODS, Explanation, explain_methods
from lightning_gae.metrics import PERTURBATION_METRICS, random_attribution
from lightning_gae.modalities.tokens import ImageTokens, Modality, TabularTokens, TextTokens
from lightning_gae.engine.token_sets import Streams
from lightning_gae.tensorboard.summary import FAITHFULNESS_SAMPLES, Scale, SetInput, TensorBoardViews, faithfulness_rows
from lightning_gae.language.decoder_rows import is_sequence_output, last_positions, sequence_rows
from lightning_gae.metrics.ground_truth import RECALL, scored_truth
from lightning_gae.modalities.inputs import token_set_input, token_set_inputs

__all__ = ["GAECallback"]

# The readers of a batch are public here too: configs and the CLI name them by this path.
__all__ += ["default_batch_ground_truth", "default_batch_inputs", "default_batch_labels"]


def _only_dummy_loggers(trainer: Trainer) -> bool:
    """fast_dev_run swaps the loggers for no-op ones: there is nowhere to log an explanation to."""
    return bool(trainer.loggers) and all(isinstance(logger, DummyLogger) for logger in trainer.loggers)


def _writers(trainer: Trainer) -> list[Any]:
    """The loggers' ``SummaryWriter``s (those that take images)."""
    return [lg.experiment for lg in trainer.loggers if hasattr(lg.experiment, "add_image")]


# What rank zero reads from the validation set and every rank then tracks and scores.
_SHARED = ("sample_indices", "_inputs", "_labels", "_truth", "_keyed", "_groups", "_scored", "_interim", "_row_names")


class GAECallback(Callback):
    r"""Explains a fixed set of validation samples every N epochs/steps and logs to TensorBoard.

    The samples are chosen once (seeded, class-balanced when labels exist, or ``sample_indices``)
    and tracked for the whole run, also across a resume. At every explanation step it logs, under
    tags that stay the same so TensorBoard's step slider shows the evolution (``<i>``: the
    sample's index in the validation set; :mod:`lightning_gae.tensorboard` draws them):

    * ``gae_heatmaps/val_<i>``: one picture per tracked sample, the input and every method side
      by side (image overlays, token boxes or a feature table), each with its colorbar, under one
      line with label, prediction and its probability (class names from the data module's
      ``class_names``); images also ``gae_evolution/val_<i>``: methods x the last
      ``evolution_length`` steps; text and tabular data also ``gae_tokens/val_<i>`` in the Text tab;
    * scalars ``relevance_stability_spearman/<method>`` and ``relevance_stability_topk_overlap/<method>``
      (versus the previous step) and ``relevance_concentration/<method>`` (share of relevance in the
      top ``top_fraction`` of tokens); a histogram ``relevance/<method>``;
    * faithfulness scalars ``<metric>/<method>`` for every method, every Captum baseline and
      ``random`` (seeded uniform relevance, the floor): the ``metrics`` named (default: positive and
      negative perturbation AUC, :mod:`lightning_gae.metrics`); and, when the batches carry ground
      truth, ``segmentation_{pixel_accuracy,miou,mean_ap}/<method>`` (image masks) or
      ``rationale_{token_f1,auprc}/<method>`` (rationale tokens), scored on a subset of
      ``metric_samples`` validation samples: in ``fit`` a fixed part of it (``metric_interim_samples``)
      at every second explanation step and on the final weights, so ``fit`` draws a curve
      (``faithfulness_samples`` says how many samples each point was scored on); every method's
      scalars also go to a run of its own (``methods/<method>``, tags ``gae_faithfulness/<metric>``
      and ``gae_relevance/<scalar>``), so that TensorBoard draws each method in its own colour, and a
      Custom Scalars layout charts each metric with one line per method;
    * for the "GAE" tab of TensorBoard (:mod:`lightning_gae.tensorboard.plugin`): the raw relevance
      of every sample and method, the inputs, predictions and the metrics' curves, as tensors.

    Everything is logged at the step Lightning's loggers use for the module's own ``self.log``
    values at that moment (so ``val_loss`` and the explanations of a validation share a step);
    ``trainer.validate()`` after ``trainer.fit()`` logs too. No picture is larger than 4096 pixels
    on a side.

    Explanations never change what the run computes. The samples are read once, before the loops
    start, through a private single-process DataLoader over the validation dataset (never the
    Trainer's own loader, whose persistent workers would be reset). The explanations run in eval
    mode on copies of the samples with ``autograd.grad`` (no ``.grad`` is touched; under FSDP1, whose
    backward hooks set the sharded gradients aside, they are put back), and the
    global torch, numpy and Python RNGs are restored after every read and explanation.

    On several processes rank zero reads the samples and sends them to the others, and alone draws and
    logs. Under DDP it explains alone (the others join at the steps that score the subset); under FSDP2
    (``ModelParallelStrategy`` with ``fully_shard``) and FSDP1 (``FSDPStrategy``, explained through the root
    unit it wraps the module in) every rank takes part in each explanation. The faithfulness subset is split
    across the ranks and its per-sample states gathered, so its values and standard errors are one process's.
    An explanation that fails on one rank is skipped by every rank (README, "Several processes: DDP, FSDP2
    and FSDP1").

    Whatever can be checked is checked when ``fit`` starts (for ``validate``: when validation
    starts), by reading the samples and explaining them once: collection, the model's forward on
    the batch's inputs, every method and Captum baseline, and the modality (inferred or given).
    Any failure then stops the run with the fix. Later, a failing explanation warns once with its
    reason and is skipped, and a step whose logits or relevance are not finite (NaN/inf) is skipped
    with one warning: no non-finite value is ever logged. Validation samples whose inputs hold NaN or
    inf are neither tracked nor scored (one warning names them; all of them stops the run).

    Args:
        num_samples: how many validation samples to track; more than the validation set holds warns
            and tracks all of them.
        every_n_epochs: explain after every N-th validation epoch of ``fit`` (None: never by epoch).
        every_n_train_steps: also explain every N optimizer steps (None: never by step).
        methods: any of ``"gae"``, ``"rollout"``, ``"raw_attention"``, ``"attn_gradcam"``, ``"attn_gradcam_vit"``,
            ``"attention_flow"``, ``"attnlrp"`` (its relevance at the word embeddings: ``embedding_layer``) and
            ``"transformer_attribution"``.
        modality: ``ImageTokens``, ``TextTokens`` or ``TabularTokens``; None infers ``ImageTokens``
            for image batches whose token count fits a square patch grid plus prefix tokens. For a
            model with several token sets (encoder-decoder, image and text towers, co-attention), a
            mapping ``{set: modality}`` over the sets of ``explain(...).relevance``; a set left out is
            inferred where it can be (an image input whose patch grid fits its token count).
        target: ``"pred"`` explains the predicted class, ``"label"`` the true one (for sequence
            outputs ``[B, T, C]``: at the explained position), or a callable ``output -> Tensor[B]``
            explains any scalar per sample (e.g. a dual encoder's image-text similarity; then
            ``metrics=()`` and no ``captum_baselines``).
        sample_indices: explicit positions in the validation dataset instead of a seeded choice.
        seed: seed of the sample choice.
        attention_modules: passed to :func:`~lightning_gae.explain`.
        query: passed to :func:`~lightning_gae.explain` (0: CLS; ``"last"`` for decoders).
        evolution_length: how many past heatmaps an evolution strip shows; a sample's strip is written every
            ``evolution_length`` explanation steps and at the last one of a run (``fit``'s, or a validation).
        top_fraction: the share of tokens counted as "top" by the overlap and concentration scalars.
        log_sanity_check: also explain during Lightning's sanity check.
        dataloader_idx: which validation dataloader the samples come from: its position (in the
            order Lightning numbers them, as in ``validation_step``'s ``dataloader_idx``) or, for a
            mapping of dataloaders or a ``CombinedLoader`` over one, its key.
        batch_inputs: ``batch -> model inputs``; default: ``x`` of ``(x, y)``, a mapping minus labels.
        batch_labels: ``batch -> labels``; default: ``y`` of ``(x, y)``, a mapping's ``labels``.
        max_scan_batches: at most this many validation batches are read to choose the samples.
        metrics: faithfulness metrics by name, any of ``"positive_perturbation_auc"``,
            ``"negative_perturbation_auc"``, ``"deletion_auc"``, ``"insertion_auc"``,
            ``"comprehensiveness"``, ``"sufficiency"``, ``"aopc"``; removal is the modality's.
        random_baseline: also score a seeded random attribution with the metrics.
        captum_baselines: Captum methods shown in the grid and scored like the others:
            ``"saliency"``, ``"input_x_gradient"``, ``"integrated_gradients"``, ``"gradient_shap"``
            (token-id models: on the embedding layer, see :func:`lightning_gae.compare.attribute`).
        embedding_layer: module path of the token embedding for ``captum_baselines`` on token ids and for
            ``"attnlrp"``; None finds it for Hugging Face models.
        metric_max_batch: at most this many perturbed inputs per forward pass of the metrics.
        batch_ground_truth: ``batch -> masks [B, H, W] or rationales [B, T]``; default: a mapping's
            ``masks``/``segmentation``/``rationales``, or ``z`` of ``(x, y, z)``.
        heatmap_scale: ``"per_map"`` (each heatmap's colours span 0 to its own largest magnitude) or
            ``"fixed"`` (a method's colour range is set at its first logged step and kept, so the
            heatmaps of different steps are comparable).
        metric_samples: how many validation samples (seeded, stratified by class when there are
            labels, at most the samples read) the faithfulness ``metrics`` and the ground-truth
            scalars are scored on, apart from the ``num_samples`` shown; explained in batches of
            ``metric_max_batch``. Each scalar ``<metric>/<method>`` comes with its standard error
            ``<metric>/<method>/stderr`` over these samples (the jackknife of
            :func:`lightning_gae.compare.compare`). 0 scores the displayed samples instead (the
            behaviour before this option; their standard errors are then large, and they are scored
            at every explanation step).
        metric_every_n_explanations: when ``fit`` scores the faithfulness subset, its expensive part
            (``len(metrics)`` x scored methods x samples x 9 forward passes): at the first explanation
            step and every ``n``-th after it (default 2; 1: every step), and at the last explanation step
            (or when fit ends between explanation steps: the final weights are always scored, once), on its
            part of ``metric_interim_samples``. None scores the final weights only. ``validate``/``test``
            score all ``metric_samples`` at every explanation (the summary printed when fit ends says how).
            At the defaults a fit of 10 explanation steps has 6 points, all on the same 32 samples (the main
            job's config scores at each of its 5 steps).
        metric_interim_samples: how many of the ``metric_samples`` ``fit`` scores (default 32: a seeded part,
            stratified by class when there are labels, the same samples at every step, the final weights'
            included, so that the points of a curve differ by the weights, not by the samples). Its standard
            errors are about ``sqrt(metric_samples / metric_interim_samples)`` times those of ``validate``.
            0, or at least ``metric_samples``, scores all of them at every scheduled step and at the last.
        set_inputs: for several token sets, which model input each set's tokens come from: the
            key of a mapping input or the position in a tuple input, e.g. ``{"encoder": 0, "decoder": 1}``
            or ``{"text_model": "input_ids", "image_model": "pixel_values"}``. None finds the one input
            each set's modality fits; when two fit alike (equal lengths) the run stops and asks for this.
        streams: passed to :func:`~lightning_gae.explain`: declares the token sets where no preset or
            inference finds them (e.g. which set a co-attention model's prediction is read from).
        print_summary: when ``fit`` ends, print (rank zero, once) ``trainer.callback_metrics``, each method's
            faithfulness ± standard error as last logged (the Text tab's ``gae_faithfulness`` table, or why
            nothing was scored), the loggers' event-file folders and the ``tensorboard --logdir`` command.
            The text is kept in ``callback.summary`` either way.
        answer_tokens: explain a causal language model's answer tokens (None: when the module holds a Hugging Face
            causal LM and the validation batches carry ``input_ids`` and ``labels [B, T]`` with -100 where nothing
            is learnt). Each tracked and scored sequence becomes one sample per answer token (the labels that are
            not -100): its relevance over the prompt and the answer before it, read at the position that predicts
            it, shown as ``val_<i>/answer_<n>`` with the answer token as its label. The perturbation metrics remove
            prompt tokens and read that position's next-token logit (``target="pred"``: whether the prediction
            survives); batches with ``rationales`` (the tokens the answer must come from) also log
            ``recall_{top1,hit_at_k,mass}/<method>`` (:class:`~lightning_gae.metrics.RationaleRecall`). The
            readout token itself is neither removed nor scored. ``modality`` must be a ``TextTokens`` (default: ids).

    Models with several token sets (``explain(...).relevance`` holds more than one) are drawn per
    set in ``gae_heatmaps/val_<i>``: the inputs, then a line per method with every set's relevance
    side by side (an image set as a heatmap, a text set as its tokens); text sets also go to
    ``gae_tokens/val_<i>``. When the model's output is a sequence ``[B, T, C]`` over the query set
    (a decoder), every position ``t`` is explained (``query=t``, one explanation per position over
    the tracked samples) and each set is drawn as a target x set matrix, one row per target
    position; batches with an ``alignment`` ``[B, T]`` (the source position each target token
    copies, ``-1`` for none) then log ``alignment_accuracy/<method>``
    (:class:`~lightning_gae.metrics.AlignmentAccuracy`). Batches with ``masks`` score the image set
    (``segmentation_*``) and with ``rationales`` the text set (``rationale_*``). Perturbation
    ``metrics`` and ``captum_baselines`` remove or attribute one input and are refused on such
    models when the run starts (pass ``metrics=()``). The GAE tab shows every set with its tokens (a decoder's
    rows as target x set matrices) from its tensors (``set_input``, ``set_relevance``, ``row_labels``,
    :mod:`lightning_gae.tensorboard.metadata`).

    Raises:
        ValueError: in ``setup``: an unknown method, metric or Captum baseline, a bad schedule,
            target, ``dataloader_idx``, ``heatmap_scale`` or ``evolution_length``, a ``TabularTokens``
            without ``means`` while perturbation ``metrics`` are on (a removed feature needs a value),
            or a strategy it cannot explain under (DeepSpeed stage 3, ``ModelParallelStrategy`` with tensor
            parallelism, the LRP methods under ``FSDPStrategy``; DDP, FSDP2 and FSDP1 are supported, see the
            README's section on multi-process training).
            When ``fit`` starts (``validate``: when validation starts): no validation dataloader,
            no ``dataloader_idx`` among them, a ``sample_indices`` outside the samples read,
            ``target="label"`` without labels, a model that cannot be explained on the samples
            (e.g. its forward rejects a batch key: pass ``batch_inputs``), or a modality that cannot
            be inferred or does not fit the model's tokens (e.g. a wrong ``patch_size``).

    Example::

        from lightning.pytorch import Trainer
        from lightning.pytorch.loggers import TensorBoardLogger
        from lightning_gae.callbacks import GAECallback

        trainer = Trainer(logger=TensorBoardLogger("runs"), callbacks=[GAECallback(num_samples=8)])
        trainer.fit(model, datamodule)      # then: tensorboard --logdir runs
    """

    def __init__(
        self,
        num_samples: int = 8,
        every_n_epochs: int | None = 1,
        every_n_train_steps: int | None = None,
        methods: Sequence[str] = ("gae",),
        modality: Modality | Mapping[str, Modality] | None = None,
        target: Literal["pred", "label"] | Callable[[Any], Tensor] = "pred",
        sample_indices: Sequence[int] | None = None,
        seed: int = 0,
        attention_modules: Sequence[str] | None = None,
        query: int | str = 0,
        evolution_length: int = 5,
        top_fraction: float = 0.1,
        log_sanity_check: bool = False,
        dataloader_idx: int | str = 0,
        batch_inputs: Callable[[Any], Any] | None = None,
        batch_labels: Callable[[Any], Tensor | None] | None = None,
        max_scan_batches: int = 64,
        metrics: Sequence[str] = ("positive_perturbation_auc", "negative_perturbation_auc"),
        random_baseline: bool = True,
        captum_baselines: Sequence[str] = (),
        embedding_layer: str | None = None,
        metric_max_batch: int = 256,
        batch_ground_truth: Callable[[Any], Tensor | None] | None = None,
        heatmap_scale: Scale = "per_map",
        metric_samples: int = 256,
        metric_every_n_explanations: int | None = 2,
        metric_interim_samples: int = 32,
        set_inputs: Mapping[str, int | str] | None = None,
        streams: Streams | None = None,
        print_summary: bool = True,
        answer_tokens: bool | None = None,
    ) -> None:
        self.num_samples = num_samples
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps
        self.methods = tuple(methods)
        self.modality = modality
        self.target = target
        self.sample_indices = None if sample_indices is None else [int(i) for i in sample_indices]
        self.seed = seed
        self.attention_modules = attention_modules
        self.query = query
        self.evolution_length = evolution_length
        self.top_fraction = top_fraction
        self.log_sanity_check = log_sanity_check
        self.dataloader_idx = dataloader_idx
        self.batch_inputs = batch_inputs or default_batch_inputs
        self.batch_labels = batch_labels or default_batch_labels
        self.max_scan_batches = max_scan_batches
        self.metrics = tuple(metrics)
        self.random_baseline = random_baseline
        self.captum_baselines = tuple(captum_baselines)
        self.embedding_layer = embedding_layer
        self.metric_max_batch = metric_max_batch
        self.batch_ground_truth = batch_ground_truth or default_batch_ground_truth
        self.heatmap_scale = heatmap_scale
        self.metric_samples = metric_samples
        self.metric_every_n_explanations = metric_every_n_explanations
        self.metric_interim_samples = metric_interim_samples
        self.set_inputs = None if set_inputs is None else dict(set_inputs)
        self.streams = streams
        self.print_summary = print_summary
        self.answer_tokens = answer_tokens
        # The text printed when the last fit ended (rank zero), for whoever prints it later (the CLI does).
        self.summary: str | None = None

        # Per run (fit or validate): read when it starts, freed in teardown.
        self._inputs: Any = None
        self._labels: Tensor | None = None
        self._truth: Tensor | None = None
        # The samples' groups (a causal LM's answer rows: their prompt), left out together by the standard errors.
        self._groups: Tensor | None = None
        # The faithfulness subset (None with metric_samples=0: the displayed samples are scored), and the part of it
        # fit scores before the final weights (None: all of it).
        self._scored: Samples | None = None
        self._interim: Samples | None = None
        self._modality: Modality | None = None
        # Models with several token sets: each set's modality and input key; the ground truth by batch key;
        # the last real position of the query set per sample when the rows of a decoder are drawn.
        self._sets: dict[str, tuple[Modality, int | str]] | None = None
        self._keyed: dict[str, Tensor] = {}
        self._last: Tensor | None = None
        self._metric_objects: dict[str, Metric] = {}
        # A causal LM's answer tokens (answer_tokens): the rows' names and the model read at each row's readout.
        self._row_names: list[str] | None = None
        self._readout: NextTokenLogits | None = None
        self._last_explained: tuple[str, int] | None = None
        # The faithfulness subset's schedule: explanation steps of this fit so far, and the last (stage, step) scored.
        self._explanation_count = 0
        self._last_scored: tuple[str, int] | None = None
        self._last_step = 0
        # Across runs: what the stability scalars and evolution strips compare with.
        self._previous: dict[str, Tensor] = {}
        # Built in setup, once the arguments are checked; kept across runs (evolution columns, fixed colour ranges).
        self._views: TensorBoardViews | None = None
        # Per explanation step: the perturbation metrics' curves, for the dashboard.
        self._curves: Curves = {}
        self._warned: set[str] = set()
        # What the summary printed when fit ends shows: the last faithfulness scalars logged and what they were
        # scored on, or why none were.
        self._reported: tuple[str, dict[str, float]] | None = None
        self._not_scored: str | None = None

    @property
    @override
    def state_key(self) -> str:
        # Not the seed: a resumed run keeps the samples it tracked, whatever seed it was given.
        return self._generate_state_key(num_samples=self.num_samples, methods=self.methods)

    # --- configuration ----------------------------------------------------------------------

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        unknown = [m for m in self.methods if m not in METHODS + LRP_METHODS]
        if unknown or not self.methods:
            raise ValueError(f"GAECallback(methods={list(self.methods)}): choose from {list(METHODS + LRP_METHODS)}")
        if not callable(self.target) and self.target not in ("pred", "label"):
            raise ValueError(f"GAECallback(target={self.target!r}): use 'pred' (predicted class), 'label', or a "
                             "callable output -> Tensor[B]")
        if callable(self.target) and (self.metrics or self.captum_baselines):
            raise ValueError("GAECallback(target=<callable>) explains a score that is not a class, which the "
                             "perturbation metrics and Captum baselines cannot score: pass metrics=() and captum_baselines=()")
        if isinstance(self.modality, Mapping):
            wrong = {k: type(v).__name__ for k, v in self.modality.items() if not isinstance(v, Modality)}
            if wrong:
                raise ValueError(f"GAECallback(modality={{...}}): {wrong} are not modalities; give each token set an "
                                 "ImageTokens, TextTokens or TabularTokens")
        for name in ("every_n_epochs", "every_n_train_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"GAECallback({name}={value}): use a positive integer, or None to switch it off")
        if self.every_n_epochs is None and self.every_n_train_steps is None:
            raise ValueError("GAECallback: every_n_epochs and every_n_train_steps are both None; set one of them")
        if self.num_samples < 1 and not self.sample_indices:
            raise ValueError(f"GAECallback(num_samples={self.num_samples}): track at least one sample")
        unknown = [m for m in self.metrics if m not in PERTURBATION_METRICS]
        if unknown:
            raise ValueError(f"GAECallback(metrics={list(self.metrics)}): choose from {sorted(PERTURBATION_METRICS)}")
        captum_names = list(CAPTUM_METHODS)
        unknown = [m for m in self.captum_baselines if m not in captum_names]
        if unknown:
            raise ValueError(f"GAECallback(captum_baselines={list(self.captum_baselines)}): choose from {captum_names}")
        if self.metric_max_batch < 1:
            raise ValueError(f"GAECallback(metric_max_batch={self.metric_max_batch}): use a positive integer")
        if self.metric_samples < 0:
            raise ValueError(f"GAECallback(metric_samples={self.metric_samples}): use a positive integer, "
                             "or 0 to score the displayed samples")
        every = self.metric_every_n_explanations
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"GAECallback(metric_every_n_explanations={every!r}): use a positive integer (1: every "
                             "explanation step), or None to score the faithfulness subset once, when fit ends")
        if self.metric_interim_samples < 0:
            raise ValueError(f"GAECallback(metric_interim_samples={self.metric_interim_samples}): use a positive "
                             "integer, or 0 to score all metric_samples at every scheduled step")
        if not 0 < self.top_fraction <= 1:
            raise ValueError(f"GAECallback(top_fraction={self.top_fraction}): use a fraction in (0, 1]")
        if self.heatmap_scale not in ("per_map", "fixed"):
            raise ValueError(f"GAECallback(heatmap_scale={self.heatmap_scale!r}): use 'per_map' (each map its own "
                             "colour range) or 'fixed' (each method's range from its first step)")
        if self.evolution_length < 1:
            raise ValueError(f"GAECallback(evolution_length={self.evolution_length}): use a positive integer")
        tabular = self.modality.values() if isinstance(self.modality, Mapping) else [self.modality]
        if any(isinstance(m, TabularTokens) and m.means is None for m in tabular) and self.metrics:
            raise ValueError(
                f"GAECallback(metrics={list(self.metrics)}) removes features, but modality={self.modality!r} has no "
                "value to put in their place: build it with TabularTokens(..., means=[...]) (the training features' "
                "means, in the scale the model sees) or TabularTokens(...).fit(train_features), or pass metrics=()"
            )
        index = self.dataloader_idx
        if isinstance(index, bool) or not isinstance(index, (int, str)) or (isinstance(index, int) and index < 0):
            raise ValueError(f"GAECallback(dataloader_idx={index!r}): use a position 0, 1, ... or the key of a "
                             "mapping of validation dataloaders")
        check_strategy(trainer.strategy)
        if self._views is None:
            self._views = self._new_views()
        if stage == "fit":
            self.summary = None
        if not trainer.loggers:
            rank_zero_warn(
                "GAECallback: the Trainer has no logger, so nothing will be shown. Add one, e.g. "
                "Trainer(logger=lightning.pytorch.loggers.TensorBoardLogger('runs'))."
            )

    def _new_views(self) -> TensorBoardViews:
        return TensorBoardViews(scale=self.heatmap_scale, evolution_length=self.evolution_length)

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # The metric objects hold the module; the next fit or validate reads its own samples.
        self._inputs = self._labels = self._truth = self._groups = self._modality = self._sets = self._last = None
        self._scored = self._interim = None
        self._row_names = self._readout = None
        self._keyed = {}
        self._metric_objects = {}
        if self._views is not None:
            self._views.close()
        self._last_explained = self._last_scored = None
        self._explanation_count = 0
        self._reported = self._not_scored = None

    # --- reading the samples and checking them, before the loops -----------------------------------

    def _validation_loaders(self, trainer: Trainer) -> Any:
        """The validation dataloader(s) of the starting stage as the user gave them (no loop has iterated them)."""
        loop = trainer.fit_loop.epoch_loop.val_loop if trainer.state.fn == "fit" else trainer.validate_loop
        source = loop._data_source
        loaders = source.dataloader() if source.is_defined() else None
        if isinstance(loaders, CombinedLoader):
            loaders = loaders.iterables
        if loaders is None or (isinstance(loaders, (Mapping, list, tuple)) and not loaders):
            raise ValueError("GAECallback: the Trainer has no validation dataloader to take samples from; pass "
                             "val_dataloaders to fit() or define val_dataloader() on the module or datamodule")
        return loaders

    def _pick_loader(self, loaders: Any) -> Any:
        index = self.dataloader_idx
        if isinstance(index, str):
            if not isinstance(loaders, Mapping):
                raise ValueError(f"GAECallback(dataloader_idx={index!r}): the validation dataloaders are a "
                                 f"{type(loaders).__name__}, not a mapping with keys; give the position as an int")
            if index not in loaders:
                raise ValueError(f"GAECallback(dataloader_idx={index!r}): the validation dataloaders are named "
                                 f"{list(loaders)}")
            return loaders[index]
        # Lightning's own numbering: the leaves of the collection in order, as validation_step receives it.
        flat = CombinedLoader(loaders).flattened
        if index >= len(flat):
            names = f" (named {list(loaders)})" if isinstance(loaders, Mapping) else ""
            raise ValueError(f"GAECallback(dataloader_idx={index}): there are {len(flat)} validation dataloaders"
                             f"{names}; use 0..{len(flat) - 1}" + (" or a name" if names else ""))
        return flat[index]

    def _collect(self, trainer: Trainer) -> None:
        """Read validation batches once and keep the tracked samples (on the CPU)."""
        batches = private_reader(self._pick_loader(self._validation_loaders(trainer)))
        read, count = read_samples(batches, self.max_scan_batches, self.batch_inputs, self.batch_labels,
                                   self.batch_ground_truth)
        total = len(read)
        scanned = (f"the first {total} samples read (max_scan_batches={self.max_scan_batches})"
                   if count == self.max_scan_batches else f"the {total} samples of the validation set")
        # Samples whose inputs hold NaN or inf cannot be explained (explain() refuses them): never tracked or scored.
        finite = finite_rows(read)
        usable = torch.nonzero(finite).flatten()
        pool_labels = None if read.labels is None else read.labels[usable]
        if not bool(finite.all()):
            broken = torch.nonzero(~finite).flatten().tolist()
            rank_zero_warn(f"GAECallback: {len(broken)} of {scanned} hold NaN or inf input values (samples "
                           f"{broken[:5]}{' ...' if len(broken) > 5 else ''}); they are neither tracked nor scored")
            if not len(usable):
                raise ValueError(f"GAECallback: every one of {scanned} holds NaN or inf input values; nothing can be explained")
        if self.sample_indices is not None:  # given ones with NaN or inf go; out-of-range ones are refused below
            self.sample_indices = [i for i in self.sample_indices if not 0 <= i < total or bool(finite[i])]
        if self.sample_indices is None:
            if self.num_samples > len(usable):
                rank_zero_warn(f"GAECallback(num_samples={self.num_samples}): there are only {scanned}; "
                               f"tracking all {len(usable)}")
            chosen = balanced_choice(pool_labels, len(usable), self.num_samples, self.seed)
            self.sample_indices = [int(usable[i]) for i in chosen]
            missing, classes = missing_classes(read.labels, self.sample_indices)
            if missing:
                rank_zero_warn(f"GAECallback(num_samples={self.num_samples}): {scanned} have {classes} classes, so "
                               f"the tracked samples show no sample of class {missing}; pass num_samples={classes} "
                               "(or more) to see every class")
        bad = [i for i in self.sample_indices if not 0 <= i < total]
        if bad:
            raise ValueError(f"GAECallback(sample_indices=...): {bad} are outside {scanned}")
        tracked = read.subset(self.sample_indices)
        scored_indices = None
        if self.metric_samples:
            # Another seed than the displayed choice: the subset is a sample of the validation set, not of the shown ones.
            scored = balanced_choice(pool_labels, len(usable), self.metric_samples, self.seed + 1)
            scored_indices = [int(usable[i]) for i in scored]
            self._scored = read.subset(scored_indices)
        if self._explains_answers(trainer, read):
            # A causal LM: each tracked or scored sequence becomes one sample per answer token.
            tracked, self._row_names = answer_samples(tracked, self.sample_indices)
            if self._scored is not None:
                self._scored, _ = answer_samples(self._scored, scored_indices)
        if self._scored is not None:
            self._interim = interim_part(self._scored, self.metric_interim_samples, self.seed + 2)
        self._inputs, self._labels, self._truth, self._keyed = tracked.inputs, tracked.labels, tracked.truth, tracked.keyed
        self._groups = tracked.groups
        if self.target == "label" and self._labels is None:
            raise ValueError("GAECallback(target='label'): the batches carry no labels; pass batch_labels=... or use target='pred'")

    def _explains_answers(self, trainer: Trainer, read: Samples) -> bool:
        """Whether the answer tokens of a causal LM are explained (``answer_tokens``; None: when the batches and
        the module look like one)."""
        if self.answer_tokens is False:
            return False
        labelled = has_answer_labels(read)
        if self.answer_tokens is None:
            return labelled and holds_causal_lm(trainer.lightning_module)
        if not labelled:
            raise ValueError("GAECallback(answer_tokens=True): the validation batches need keyword inputs with "
                             "'input_ids' [B, T] and integer labels [B, T] (the same shape) holding -100 where nothing is "
                             "learnt, as a Hugging Face causal LM takes them; pass batch_labels=... if they are elsewhere")
        return True

    @property
    def _shown(self) -> list[Any]:
        """What the views name each tracked sample by: its validation index, or ``"<index>/answer_<n>"``."""
        return self._row_names if self._row_names is not None else list(self.sample_indices)

    def _prepare(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Read the samples and explain them once, so that what cannot work stops the run now, with its fix.

        Runs on every rank (all of them stop together); the RNGs are restored, so training is unchanged.
        """
        with isolate_rng():
            try:
                # validate() runs its hooks in inference mode, and a tensor made there can never take part
                # in autograd: the labels, the explained class of target="label", would fail every explanation.
                with torch.inference_mode(False):
                    from_rank_zero(trainer, lambda: self._collect(trainer), self, _SHARED)
                # A causal LM's answer rows are read through the logits at each row's readout (on every rank).
                self._readout = None if self._row_names is None else NextTokenLogits(pl_module)
            except ValueError:
                raise
            except Exception as err:
                raise ValueError(f"GAECallback: reading the validation samples failed ({type(err).__name__}: {err}); "
                                 "check dataloader_idx, batch_inputs, batch_labels and batch_ground_truth") from err
            inputs = self._model_inputs(trainer, pl_module)
            try:
                explanations, maps = self._explain(pl_module, inputs)
            except Exception as err:
                hint = ""
                if isinstance(err, TypeError) and isinstance(inputs, Mapping):
                    hint = (f" The model is called as model(**inputs) with the batch keys {list(inputs)}; if its "
                            "forward does not take all of them, pass batch_inputs=lambda batch: {...} that keeps "
                            "only its inputs.")
                raise ValueError(f"GAECallback: the tracked validation samples cannot be explained, so the run stops "
                                 f"before training ({type(err).__name__}: {err}).{hint}") from err
            first = next(iter(explanations.values()))
            if len(first.relevance) > 1:
                self._prepare_sets(trainer, pl_module, inputs, explanations)
                return
            if isinstance(self.modality, Mapping):
                raise ValueError(f"GAECallback(modality={{{', '.join(map(repr, self.modality))}: ...}}) names token sets, but "
                                 f"the model attends over one set of {first.tokens.shape[1]} tokens: pass one modality")
            self._sets = None
            modality = self.modality
            if modality is None and self._readout is not None:
                modality = TextTokens()
            if self._readout is not None:
                modality = keep_readout(modality)
            if modality is None:
                modality = ImageTokens.infer(display_input(inputs), first.tokens.shape[1])
            if modality is None:
                raise ValueError(
                    "GAECallback: cannot infer the modality of these inputs; pass modality=ImageTokens(patch_size=...), "
                    "TextTokens(tokenizer=...) or TabularTokens(feature_names=[...])"
                )
            if isinstance(modality, ImageTokens) and modality.prefix_tokens == 0 and self.query == 0:
                rank_zero_warn(
                    f"GAECallback: {modality!r} has no CLS token, so query=0 explains the first patch, not the "
                    "prediction; pass GAECallback(query=\"mean\") to explain the pooled patches",
                    category=UserWarning,
                )
            try:
                self._modality = modality
                shown = display_input(inputs).detach().cpu()
                # to_input first: its error says which layout would fit the token count.
                for exp in explanations.values():
                    modality.to_input(exp.tokens.detach().cpu(), shown)
                # Every picture and tensor the first logged step will write, drawn once by views that write nowhere.
                self._new_views().write([], 0, modality=modality, inputs=inputs, shown=shown,
                                        sample_indices=self._shown, explanations=explanations, maps=maps,
                                        labels=self._labels, class_names=class_names(trainer))
                # What the metrics and the ground truth's metric ask of the modality before their forwards.
                cpu_inputs = map_tensors(inputs, lambda t: t.cpu())
                if self.metrics:
                    modality.removable(cpu_inputs)
                    modality.unit_scores(first.tokens.cpu(), cpu_inputs)
                entry = None if self._truth is None else scored_truth(modality, self._truth)
                if entry is not None:
                    entry.update_args(modality, cpu_inputs, first.tokens.cpu(), self._truth)
            except Exception as err:
                self._modality = None
                raise ValueError(f"GAECallback(modality={modality!r}) does not fit the model's explanations of these "
                                 f"inputs: {type(err).__name__}: {err}") from err

    def _model_inputs(self, trainer: Trainer, pl_module: LightningModule) -> Any:
        # The loops cast every batch to the precision ("bf16-true", "16-true"); the kept samples need the same.
        return trainer.precision_plugin.convert_input(map_tensors(self._inputs, lambda t: t.to(pl_module.device)))

    # --- when -----------------------------------------------------------------------------------

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        Lockstep(trainer, pl_module).run(lambda: self._prepare(trainer, pl_module), every_rank=True)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # trainer.validate() has no fit start; its loaders are known by now.
        if self._inputs is None:
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
        if self._inputs is None or self._last_explained == explained:
            return
        if _only_dummy_loggers(trainer):
            return
        self._last_explained = explained
        # What the module's self.log uses at this moment (global_step runs ahead of it at epoch ends).
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        self._last_step = step
        subset = None if self._scored is None else subset_due(trainer, self._explanation_count,
                                                               self.metric_every_n_explanations, self._scored,
                                                               self._interim)
        self._explanation_count += 1
        # Rank zero explains and logs; every rank takes part when the model is sharded or the subset is split.
        lockstep = Lockstep(trainer, pl_module)
        every_rank = lockstep.sharded or (subset is not None and self._sets is None)
        if not (every_rank or trainer.is_global_zero):
            return
        with isolate_rng():
            try:
                lockstep.run(lambda: self._run(trainer, pl_module, step, subset), every_rank)
            except Exception as err:  # noqa: BLE001 - an explanation must never take training down
                reason = str(err) if isinstance(err, RankFailed) else f"{type(err).__name__}: {err}"
                self._warn_once(reason, f"GAECallback: explanation at step {step} failed and was skipped ({reason})")

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero and self._views is not None and self._explanation_count:
            # Evolution strips still due (fit ended between the steps they are written at), at their newest column's step.
            try:
                self._views.write_strips(_writers(trainer), self._last_step)
            except Exception as err:  # noqa: BLE001 - nor may a picture take the end of training down
                self._warn_once(str(err), f"GAECallback: writing the evolution strips when fit ended failed ({err})")
        # fit's part of the faithfulness subset on the final weights, unless the last explanation step scored them.
        if self._scored is None or self._sets is not None:
            return
        if (not self.metrics and self._scored.truth is None) or _only_dummy_loggers(trainer):
            return
        step = trainer.fit_loop.epoch_loop._batches_that_stepped
        if self._last_explained == ("fit", trainer.global_step):
            # The weights of the last explanation step (fit ended on a validation): its scalars, curves and pictures
            # share that step, where the GAE tab shows them together.
            step = self._last_step
        if self._last_scored == ("fit", step):
            return
        self._last_scored = ("fit", step)
        # explain() and the metrics put the module in eval mode themselves: at the end of fit it is in training mode.
        with isolate_rng():
            try:
                # Every rank scores its share of the samples.
                part = fit_part(self._scored, self._interim)
                scalars = Lockstep(trainer, pl_module).run(lambda: self._finite(self._faithfulness(
                    pl_module, self._scored_batches(trainer, pl_module, part), len(part), part.groups), step),
                    every_rank=True)
                if trainer.is_global_zero:
                    for logger in trainer.loggers:
                        logger.log_metrics(scalars, step=step)
                    self._views.write_scores(_writers(trainer), step, scalars, self._curves)
                self._remember(scalars, f"{len(part)} validation samples, the final weights at step {step}")
            except Exception as err:  # noqa: BLE001 - nor may scoring take the end of training down
                reason = str(err) if isinstance(err, RankFailed) else f"{type(err).__name__}: {err}"
                self._not_scored = f"scoring failed when fit ended: {reason}"
                self._warn_once(reason, f"GAECallback: scoring the faithfulness subset when fit ended (step {step}) "
                                        f"failed and was skipped ({reason})")

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
        """The summary of a run (fit, validate or test) on rank zero: kept in ``summary``, printed unless
        ``print_summary=False``. A validation or test reports only what it scored itself."""
        if not trainer.is_global_zero:
            return
        stage = trainer.state.fn.value
        if stage != "fit" and (self._last_scored is None or self._last_scored[0] != stage):
            self._reported = self._not_scored = None
        metrics = {name: float(value) for name, value in trainer.callback_metrics.items()
                   if isinstance(value, Tensor) and value.numel() == 1}
        scored_on, scores = self._reported if self._reported is not None else ("", None)
        # The loggers that write TensorBoard event files (fast_dev_run's no-op loggers answer every attribute).
        logs = [(str(lg.log_dir), str(lg.save_dir)) for lg in trainer.loggers
                if not isinstance(lg, DummyLogger) and hasattr(lg.experiment, "add_image")
                and getattr(lg, "log_dir", None) and lg.save_dir]
        hint = self._whole_subset_hint(trainer, scores, logs) if stage == "fit" else []
        self.summary = fit_report(metrics, scores, scored_on, self._why_not_scored(trainer), logs, self._why_no_logs(trainer),
                                  hint, stage)
        if self.print_summary:
            print(self.summary)

    def _whole_subset_hint(self, trainer: Trainer, scores: Mapping[str, float] | None,
                           logs: Sequence[tuple[str, str]]) -> list[str]:
        """How to score the whole subset, when the fit's last faithfulness scored only its part. (Rank zero alone:
        ``trainer.log_dir`` would broadcast, so the loggers' own ``logs`` are read.)"""
        if self._scored is None or not scores or scores.get(FAITHFULNESS_SAMPLES, len(self._scored)) >= len(self._scored):
            return []
        lines = [f"these are {int(scores[FAITHFULNESS_SAMPLES])} of the {len(self._scored)} samples of the faithfulness "
                 f"subset (metric_interim_samples); validating scores all of them:"]
        checkpoint = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        configs = [Path(log_dir, "config.yaml") for log_dir, _ in logs if Path(log_dir, "config.yaml").is_file()]
        if checkpoint and configs:
            # LightningCLI saved the run's config there; its validate subcommand reads it back.
            lines.append(f"  lightning-gae validate --config {configs[0]} --ckpt_path {checkpoint}")
        else:
            lines.append(f"  trainer.validate(model, datamodule{', ckpt_path=' + repr(checkpoint) if checkpoint else ''})")
        return lines

    def _why_not_scored(self, trainer: Trainer) -> str:
        if self._not_scored is not None:
            return self._not_scored
        if _only_dummy_loggers(trainer):
            return "fast_dev_run replaces the loggers with no-op ones, so the callback explains nothing"
        if not self.metrics and self._truth is None and not self._keyed:
            return "metrics=() and the validation batches carry no ground truth"
        if trainer.state.fn != "fit":
            return "no explanation of this run scored the samples"
        return "no explanation step scored the samples and none was due when training ended"

    @staticmethod
    def _why_no_logs(trainer: Trainer) -> str:
        if not trainer.loggers:
            return "the Trainer has no logger"
        if _only_dummy_loggers(trainer):
            return "fast_dev_run writes no logs"
        return "no logger writes TensorBoard event files; add lightning.pytorch.loggers.TensorBoardLogger"

    def _explain(self, pl_module: LightningModule, inputs: Any,
                 labels: Tensor | None = None) -> tuple[dict[str, Explanation], dict[str, Tensor]]:
        """Each method's explanation and each Captum baseline's attribution of ``inputs``.

        ``labels``: those of ``inputs`` when they are not the tracked samples (the faithfulness subset).
        """
        if labels is None or callable(self.target):
            target = self._target_at(pl_module, self.query)
        else:
            target = None if self.target == "pred" else labels.to(pl_module.device)
        # One recorded forward for every method (GAE alone keeps its memory-lean path).
        query = "last" if self._readout is not None else self.query
        explanations = explain_methods(pl_module, inputs, self.methods, target=target, query=query,
                                       attention_modules=self.attention_modules, streams=self.streams,
                                       embedding_layer=self.embedding_layer)
        first = next(iter(explanations.values()))
        # Every method explains the same classes: the first explanation's (the prediction or the label).
        classifier = self._readout if self._readout is not None else pl_module
        maps = {m: attribute(m, classifier, inputs, first.target, embedding_layer=self.embedding_layer, seed=self.seed)
                for m in self.captum_baselines}
        return explanations, maps

    def _target_at(self, pl_module: LightningModule, query: Any) -> Any:
        """What ``explain`` is told to explain; labels of sequence outputs ``[B, T]`` are read at the query position."""
        if callable(self.target):
            return self.target
        if self.target == "pred":
            return None
        labels = self._labels.to(pl_module.device)
        if labels.dim() == 2 and not isinstance(query, str):
            position = torch.as_tensor(query, device=labels.device).expand(labels.shape[0])
            return labels.gather(1, position[:, None])[:, 0]
        return labels

    # --- several token sets ----------------------------------------------------------------------

    def _set_inputs(self, inputs: Any, explanations: dict[str, Explanation]) -> dict[str, tuple[Modality, int | str]]:
        """Each token set's modality and the key (or tuple position) of the input its tokens come from."""
        first = next(iter(explanations.values()))
        if self.modality is not None and not isinstance(self.modality, Mapping):
            raise ValueError(f"GAECallback(modality={self.modality!r}): the model has the token sets {list(first.relevance)}; "
                             "pass one modality per set, modality={set: ImageTokens(...)/TextTokens(...)}")
        return token_set_inputs(inputs, {x: r.shape[1] for x, r in first.relevance.items()}, self.modality,
                                self.set_inputs, "GAECallback")

    def _set_views(self, inputs: Any) -> dict[str, SetInput]:
        """What the views draw each token set with; a text set among keyword inputs keeps its attention_mask."""
        return {x: SetInput(modality, *token_set_input(inputs, key)) for x, (modality, key) in self._sets.items()}

    def _rows(self, pl_module: LightningModule, inputs: Any) -> dict[str, dict[str, Tensor]]:
        """Method -> set -> ``[B, T, N_set]``: row ``t`` is ``explain(..., query=t)``'s relevance of the set."""
        labels = None if self.target == "pred" else self._labels.to(pl_module.device)
        return {m: sequence_rows(pl_module, inputs, m, self._last.to(pl_module.device), labels,
                                 attention_modules=self.attention_modules, streams=self.streams) for m in self.methods}

    def _prepare_sets(self, trainer: Trainer, pl_module: LightningModule, inputs: Any,
                      explanations: dict[str, Explanation]) -> None:
        """Check a model with several token sets: a modality and an input per set, what can be scored, one drawing."""
        first = next(iter(explanations.values()))
        sets = list(first.relevance)
        if self.metrics or self.captum_baselines:
            raise ValueError(
                f"GAECallback: the model has the token sets {sets}; the perturbation metrics {list(self.metrics)} and "
                f"Captum baselines {list(self.captum_baselines)} remove or attribute one input and read class logits, "
                "which does not say which set's tokens to remove. Pass metrics=() and captum_baselines=() (ground "
                "truth in the batches, masks, rationales or alignment, is still scored per set)."
            )
        try:
            self._sets = self._set_inputs(inputs, explanations)
            self._modality = self._sets[first.query_set][0]
            views = self._set_views(map_tensors(inputs, lambda t: t.detach().cpu()))
            rows = None
            self._last = None
            if is_sequence_output(first, self.target):
                if self.target == "label" and self._labels.dim() != 2:
                    raise ValueError(f"target='label' on sequence outputs needs labels [B, T], one per target position; "
                                     f"the batches carry labels of shape {tuple(self._labels.shape)}")
                self._last = last_positions(pl_module, inputs, attention_modules=self.attention_modules,
                                            streams=self.streams).cpu()
                rows = self._rows(pl_module, inputs)
            self._check_set_truth(first, rows)
            self._new_views().write([], 0, modality=self._modality, inputs=inputs, shown=views[first.query_set].shown,
                                    sample_indices=self.sample_indices, explanations=explanations, labels=self._labels,
                                    class_names=class_names(trainer), sets=views, rows=rows)
        except Exception as err:
            self._sets = self._modality = None
            raise ValueError(f"GAECallback(modality={self.modality!r}, set_inputs={self.set_inputs!r}) does not fit "
                             f"the token sets {sets} of the model's explanations: {type(err).__name__}: {err}") from err
        # The single-set ground truth (the first of masks/rationales) is scored per set instead.
        self._truth = None

    def _check_set_truth(self, first: Explanation, rows: dict[str, dict[str, Tensor]] | None) -> None:
        alignment = self._keyed.get("alignment")
        if alignment is None:
            return
        if rows is None:
            raise ValueError("the batches carry an alignment, but the model's explanations are not per target "
                             "position (sequence logits [B, T, C] over the query set and target='pred' or 'label')")
        if len(first.relevance) != 2 or alignment.dim() != 2 or alignment.shape[1] != first.tokens.shape[1]:
            raise ValueError(f"the alignment {tuple(alignment.shape)} must be [B, T] with T = {first.tokens.shape[1]} "
                             f"target positions, for a model with two token sets (it has {list(first.relevance)})")

    def _run(self, trainer: Trainer, pl_module: LightningModule, step: int, subset: Samples | None = None) -> None:
        inputs = self._model_inputs(trainer, pl_module)
        explanations, maps = self._explain(pl_module, inputs)
        first = next(iter(explanations.values()))
        computed = [r for e in explanations.values() for r in e.relevance.values()] + list(maps.values())
        views = rows = None
        if self._sets is not None:
            views = self._set_views(inputs)
            rows = None if self._last is None else self._rows(pl_module, inputs)
            computed += [r for by_set in (rows or {}).values() for r in by_set.values()]
        if first.logits is not None:
            computed.append(first.logits)
        if not all(torch.isfinite(t).all() for t in computed):
            self._warn_once("non-finite", f"GAECallback: explanation at step {step} was skipped: the model's logits or "
                                          "the relevance are not finite (NaN or inf). Such steps are skipped and "
                                          "nothing non-finite is logged; this warning is not repeated.")
            return
        scalars: dict[str, float] = {}
        for method, exp in explanations.items():
            scalars.update(relevance_scalars(method, exp.tokens, self._previous.get(method), self.top_fraction))
        scored: dict[str, Tensor] = {**{m: e.tokens for m, e in explanations.items()}, **maps}
        if self.random_baseline:
            scored["random"] = random_attribution(first.tokens, self.seed)
        scored_on = ""
        shared, groups = None, self._groups
        if self._scored is None or views is not None:
            # Models with several token sets score no perturbation metric; their ground truth is per set.
            # metric_samples=0: the displayed samples are scored, at every step (they are few).
            batches: Iterable[ScoredBatch] = [(inputs, scored, first.target, self._labels, self._truth)]
            scored_on = f"the {len(self.sample_indices)} tracked validation samples at step {step}"
        elif subset is not None:
            batches, shared, groups = self._scored_batches(trainer, pl_module, subset), len(subset), subset.groups
            final = ", the final weights" if trainer.state.fn == "fit" and final_explanation(trainer) else ""
            scored_on = f"{len(subset)} validation samples{final} at step {step}"
            self._last_scored = (trainer.state.fn.value, step)
        else:
            batches = []
        scalars.update(self._faithfulness(pl_module, batches, shared, groups))
        if views is not None:
            scalars.update(set_truth_scalars(explanations, rows, self._sets, views, self._keyed, pl_module,
                                             self._metric_objects))
        scalars = self._finite(scalars, step)
        if trainer.is_global_zero:
            self._log(trainer, step, inputs, explanations, maps, scalars, views, rows)
        self._remember(scalars, scored_on)
        self._previous = {m: e.tokens.detach().cpu() for m, e in explanations.items()}

    def _remember(self, scalars: dict[str, float], scored_on: str) -> None:
        """Keep the faithfulness scalars just logged (if the step scored any) for the summary printed when fit ends."""
        if faithfulness_rows(scalars) is not None:
            self._reported, self._not_scored = (scored_on, dict(scalars)), None

    def _finite(self, scalars: dict[str, float], step: int) -> dict[str, float]:
        """``scalars`` without the values that are not finite, which are named in a warning (once)."""
        dropped = sorted(tag for tag, value in scalars.items() if not math.isfinite(value))
        if dropped:
            self._warn_once(f"non-finite scalars {dropped}",
                            f"GAECallback: {dropped} came out not finite at step {step} and are not logged")
        return {tag: value for tag, value in scalars.items() if tag not in dropped}

    def _scored_batches(self, trainer: Trainer, pl_module: LightningModule, subset: Samples) -> Iterable[ScoredBatch]:
        """This rank's part of ``subset`` (the faithfulness subset or its interim part; all of it on one process) in
        batches of ``metric_max_batch``, each explained once per method."""
        total = len(subset)
        rows, _ = subset_part(total, trainer.world_size, trainer.global_rank)
        with torch.inference_mode(False):  # validate()'s hooks: labels made in inference mode cannot be targets
            part = subset.part(rows)
        for start in range(0, len(rows), self.metric_max_batch):
            stop = min(start + self.metric_max_batch, len(rows))
            inputs = take(part.inputs, start, stop, len(rows))
            inputs = trainer.precision_plugin.convert_input(map_tensors(inputs, lambda t: t.to(pl_module.device)))
            labels = None if part.labels is None else part.labels[start:stop]
            explanations, maps = self._explain(pl_module, inputs, labels)
            first = next(iter(explanations.values()))
            scored: dict[str, Tensor] = {**{m: e.tokens for m, e in explanations.items()}, **maps}
            if self.random_baseline:
                # Seeded by position, so that a sample's random ranking is the same at every step and on any ranks.
                scored["random"] = random_rows(first.tokens, rows[start:stop], self.seed, self.metric_max_batch, total)
            truth = None if part.truth is None else part.truth[start:stop]
            yield inputs, scored, first.target, labels, truth

    def _faithfulness(self, pl_module: LightningModule, batches: Iterable[ScoredBatch],
                      shared: int | None = None, groups: Tensor | None = None) -> dict[str, float]:
        """Each metric and method over every batch with its standard error; keeps the curves for the GAE tab.

        ``shared``: the batches are this rank's part of a subset of that many samples; the other ranks' samples are
        gathered first. ``groups``: the scored samples' groups (a causal LM's prompts), left out whole by the errors.
        """
        share = None if shared is None else (lambda scores: gather_scores(scores, shared))
        # A causal LM's answer rows are scored through the logits at their readout, and their ground truth by recall too.
        module, extra = (pl_module, ()) if self._readout is None else (self._readout, (RECALL,))
        scalars, self._curves = faithfulness(batches, self.metrics, self.target == "pred", self._modality, module,
                                             self._metric_objects, self.metric_max_batch, extra, share, groups)
        return scalars

    def _log(self, trainer: Trainer, step: int, inputs: Any, explanations: dict[str, Explanation],
             maps: dict[str, Tensor], scalars: dict[str, float], views: dict[str, SetInput] | None = None,
             rows: dict[str, dict[str, Tensor]] | None = None) -> None:
        writers = _writers(trainer)
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
        if writers:
            shown = display_input(inputs) if views is None else views[next(iter(explanations.values())).query_set].shown
            self._views.write(
                writers, step, modality=self._modality, inputs=inputs, shown=shown,
                sample_indices=self._shown, explanations=explanations, maps=maps, scalars=scalars,
                curves=self._curves, labels=self._labels,
                class_names=class_names(trainer), sets=views, rows=rows,
                last=trainer.state.fn != "fit" or final_explanation(trainer),
            )

    # --- checkpointing --------------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"sample_indices": self.sample_indices, "previous": self._previous}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        indices = state_dict.get("sample_indices")
        if indices is not None:
            self.sample_indices = list(indices)
        self._previous = dict(state_dict.get("previous", {}))
