"""``lightning-gae compare``: score attribution methods on a trained checkpoint's first validation samples and
write comparison.md, comparison.json and comparison.png."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_gae.cli.errors import (
    CommandLineError,
    check_weights_fit,
    imported,
    instantiation_error,
    origin,
    raised_here,
    read_checkpoint,
    reader_advice,
)

__all__ = ["COMPARE_METRICS", "compare_main", "configured"]

COMPARE_METRICS: tuple[str, ...] = (
    "positive_perturbation_auc",
    "negative_perturbation_auc",
    "deletion_auc",
    "insertion_auc",
    "comprehensiveness",
    "sufficiency",
)
_GRID_SAMPLES = 4  # rows of comparison.png
def _compare_parser() -> argparse.ArgumentParser:
    from lightning_gae import compare, methods
    from lightning_gae.metrics import PERTURBATION_METRICS

    parser = argparse.ArgumentParser(
        prog="lightning-gae compare",
        description="Score attribution methods with faithfulness metrics on the first validation samples of a "
                    "trained checkpoint; writes comparison.md, comparison.json and comparison.png.",
    )
    parser.add_argument("--config", help="the LightningCLI YAML the model was fit with (or --model and --data)")
    parser.add_argument("--model", help="without a YAML: the LightningModule's class, e.g. my_project.MyModel, built "
                                        "from the checkpoint (load_from_checkpoint: its save_hyperparameters())")
    parser.add_argument("--data", help="without a YAML: the LightningDataModule's class (its hyper-parameters from the "
                                       "checkpoint where it saved them); default: the module's own val_dataloader()")
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint of that fit")
    parser.add_argument("--output", required=True, help="directory for the three files (created)")
    parser.add_argument("--num_samples", type=int, default=256, help="first N validation samples (default 256)")
    parser.add_argument("--methods", nargs="+", default=list(compare.DEFAULT_METHODS), choices=methods.method_names())
    parser.add_argument("--metrics", nargs="+", default=None, choices=list(PERTURBATION_METRICS),
                        help=f"default: {' '.join(COMPARE_METRICS)}; none for models with several token sets, whose "
                             "sets are scored against the batches' ground truth instead")
    parser.add_argument("--inputs", help="a function batch -> model inputs by import path, e.g. my_readers.pixels (the "
                                         "YAML's GAECallback batches: inputs:); default: the callback's, else each "
                                         "batch laid out as the module's forward takes it, as the callback does")
    parser.add_argument("--modality", help="what a token is, by import path: a Modality class built without arguments "
                                           "or an instance, e.g. lightning_gae.TextTokens (the YAML's GAECallback "
                                           "modality: wins); default: the callback's, else inferred as the callback "
                                           "infers it (token ids: text, with the module's or datamodule's tokenizer; "
                                           "features: tabular; square images)")
    parser.add_argument("--batch_size", type=int, default=64, help="samples per attribution call (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random floor and GradientSHAP")
    parser.add_argument("--protocol", default="predicted", choices=("predicted", "target"),
                        help="explain the model's prediction and check it against the label ('predicted', default), "
                             "or explain and score the label ('target'); without labels both use the prediction")
    parser.add_argument("--regions", default="auto", choices=("auto", "callback", "data", "none"),
                        help="declared regions to score (region_share_<name>, region_recall_<name>): the config's "
                             "GAECallback regions ('callback'), the datamodule's `region` ('data'), none; 'auto' "
                             "(default): the callback's if it declares any, else the datamodule's if it has one")
    return parser


def _regions(choice: str, datamodule: Any, callback: Any) -> Any:
    """The :class:`~lightning_gae.options.RegionOptions` ``--regions`` asks for (None: none): the callback's own (its
    ``top_k`` too), or the datamodule's ``region`` (or ``regions``) with the callback's ``top_k``."""
    from lightning_gae.options import RegionOptions

    declared = None if callback is None else callback.regions
    if choice in ("auto", "callback") and declared is not None and declared.regions:
        return declared
    if choice in ("auto", "data"):
        from lightning_gae.modalities.regions import regions_of

        found = regions_of(datamodule)
        if found:
            return RegionOptions(regions=found, top_k=None if declared is None else declared.top_k)
    if choice != "auto":
        where = "the config's GAECallback declares no regions" if choice == "callback" else \
            f"the datamodule ({type(datamodule).__name__}) has no `region`"
        if choice != "none":
            raise ValueError(f"lightning-gae compare --regions {choice}: {where}")
    return None


def configured(config: str) -> tuple[Any, Any, Any]:
    """``(model, datamodule, GAECallback or None)`` built from the fit's YAML, without fitting or logging (a
    :class:`~lightning_gae.cli.CommandLineError` where a class of it refuses its arguments)."""
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    from lightning_gae.callbacks import GAECallback

    # The Trainer is built only to read its callbacks: its set-up messages (seed, devices, tips) would say it runs.
    quiet = {logging.getLogger(name): logging.getLogger(name).level for name in ("lightning.pytorch", "lightning.fabric")}
    for logger in quiet:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            # The arguments are compare's own, not the fit's: LightningCLI warns when args= and sys.argv both exist.
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            cli = LightningCLI(
                LightningModule,
                LightningDataModule,
                subclass_mode_model=True,
                subclass_mode_data=True,
                save_config_callback=None,
                run=False,
                args=["--config", config],
            )
    except (ValueError, TypeError) as err:  # a class of the config refusing its arguments: its own message
        raise instantiation_error(err) from err
    finally:
        for logger, level in quiet.items():
            logger.setLevel(level)
    callback = next((cb for cb in cli.trainer.callbacks if isinstance(cb, GAECallback)), None)  # type: ignore[attr-defined]  # set by Lightning at run time
    return cli.model, cli.datamodule, callback


def _from_checkpoint(model: str, data: str | None, ckpt_path: str) -> tuple[Any, Any, None]:
    """``(model, datamodule, None)`` of a plain ``Trainer`` project: the classes by import path, built from the
    checkpoint's saved hyper-parameters (``save_hyperparameters()``) as ``load_from_checkpoint`` builds them; without
    ``data``, the module's own validation data."""
    from lightning.pytorch import LightningDataModule, LightningModule

    def load(path: str, base: type, flag: str) -> Any:
        found = imported(path, flag)
        if not (isinstance(found, type) and issubclass(found, base)):
            raise CommandLineError(f"{flag} {path}: not a {base.__name__} class (give its import path, "
                             "e.g. my_project.models.MyModel, importable from the working directory)")
        return found

    module = load(model, LightningModule, "--model").load_from_checkpoint(ckpt_path, map_location="cpu")
    if data is None:
        return module, module, None
    data_class = load(data, LightningDataModule, "--data")
    try:
        datamodule = data_class.load_from_checkpoint(ckpt_path)
    except (KeyError, TypeError):  # no datamodule hyper-parameters in the checkpoint: its defaults
        datamodule = data_class()
    return module, datamodule, None


def _modality_argument(path: str) -> Any:
    """The :class:`~lightning_gae.Modality` ``--modality`` names: an instance, or a class built without arguments."""
    from lightning_gae.modalities import Modality

    found = imported(path, "--modality")
    if isinstance(found, type) and issubclass(found, Modality):
        try:
            return found()
        except TypeError as err:
            raise CommandLineError(f"--modality {path}: {found.__name__} needs arguments ({err}); declare it in a "
                                   "YAML, as the GAECallback's init_args: {modality: {class_path: ..., init_args: "
                                   "{...}}}, and pass --config") from err
    if isinstance(found, Modality):
        return found
    raise CommandLineError(f"--modality {path}: not a Modality class or instance (give its import path, e.g. "
                           "lightning_gae.TextTokens, lightning_gae.TabularTokens, or my_project.MyTokens)")


def _first_validation_samples(model: Any, datamodule: Any, count: int, callback: Any, reader: str | None,
                              refuse: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(inputs, labels, ground truth, ground truth by batch key)`` of the first ``count`` validation samples,
    collated by the datamodule's own loader and read with ``--inputs`` and the config's callback's batch functions
    (or their defaults: the inputs then laid out as ``model``'s forward takes them, as the callback does; what its
    signature cannot tell goes to ``refuse`` with the callback's advice, put as ``--inputs`` or the YAML's)."""
    from torch.utils.data import DataLoader

    from lightning_gae.callbacks.batch_layout import fit_to_forward
    from lightning_gae.callbacks.samples import (
        default_batch_ground_truth,
        default_batch_inputs,
        default_batch_labels,
        keyed_truth,
    )

    datamodule.setup("validate")
    loader = datamodule.val_dataloader()
    if isinstance(loader, (list, tuple)):
        loader = loader[callback.batches.dataloader_idx if callback is not None else 0]
    # One batch of `count` straight from the dataset: the first samples, in order, whatever the loader's batch size.
    batch = next(iter(DataLoader(loader.dataset, batch_size=count, collate_fn=loader.collate_fn)))
    given = None if callback is None else callback.batches
    read_inputs = (reader and imported(reader, "--inputs")) or (given and given.inputs) or default_batch_inputs
    read_labels = (given and given.labels) or default_batch_labels
    read_truth = (given and given.ground_truth) or default_batch_ground_truth
    inputs = read_inputs(batch)
    if read_inputs is default_batch_inputs:
        try:
            inputs = fit_to_forward(model, inputs)
        except ValueError as err:
            refuse(reader_advice(err))
    return inputs, read_labels(batch), read_truth(batch), keyed_truth(batch)


def _set_comparison_picture(model: Any, inputs: Any, methods: Sequence[str], layout: dict[str, Any], target: Any,
                            streams: Any, sequence: bool) -> Any:
    """The first samples of a model with several token sets, drawn as the callback draws them, one under another."""
    from lightning_gae import display
    from lightning_gae._structures import first_tensor, map_tensors
    from lightning_gae.methods import explain, get_method
    from lightning_gae.language.decoder_rows import last_positions, sequence_rows
    from lightning_gae.modalities.inputs import token_set_input
    from lightning_gae.tensorboard import SetInput, TensorBoardViews

    count = min(_GRID_SAMPLES, first_tensor(inputs).shape[0])
    first = map_tensors(inputs, lambda t: t[:count] if t.dim() else t)
    shown = [m for m in methods if get_method(m).per_set]
    explained = target if callable(target) else None
    explanations = {m: explain(model, first, target=explained, method=m, streams=streams) for m in shown}
    rows = None
    if sequence:
        last = last_positions(model, first, streams=streams)
        rows = {m: sequence_rows(model, first, m, last, streams=streams) for m in shown}
    sets = {x: SetInput(modality, *token_set_input(first, key)) for x, (modality, key) in layout.items()}
    pictures = TensorBoardViews().set_pictures(sets, list(range(count)), explanations, rows)
    return display.stack(pictures, axis=0, gap=8)


def compare_main(argv: Sequence[str]) -> None:
    """``lightning-gae compare``: score attribution methods on a checkpoint's first validation samples.

    The model and datamodule are built from the YAML the fit used (no trainer runs, nothing is
    logged), the checkpoint's weights are loaded, and the first ``--num_samples`` validation
    samples are explained with every method and scored with every metric, each with its standard
    error (:func:`lightning_gae.compare.compare`), under ``--protocol`` against the batches'
    labels. Batches with ground truth (``masks``, ``rationales``, or ``z`` of ``(x, y, z)``) are
    scored against it too. The modality is the config's ``GAECallback``'s, else ``--modality``'s, else inferred as
    the callback infers it (:func:`lightning_gae.modalities.inputs.infer_data_modality`: token ids are text, read with the
    module's or datamodule's ``tokenizer``; features are tabular; square images are ViT-style). Declared regions (``--regions``: the callback's
    ``RegionOptions``, else the datamodule's ``region``) add each method's share of relevance on every region and its recall, as the callback logs them,
    beside the random floor. While it runs, stderr shows a bar per method (samples scored, rate, time left);
    Ctrl-C stops it with one line saying which methods were scored and that nothing was written
    (the files are written once every method is scored), exit code 130.

    Args:
        argv: the arguments after ``compare`` (``--help`` lists them).

    Raises:
        SystemExit: bad arguments (argparse's message).
        CommandLineError: a modality that cannot be inferred, a file that is no checkpoint of this model, or
            anything ``compare`` rejects (:func:`main` prints it and exits 2).

    Example:
        .. code-block:: bash

            lightning-gae compare --config configs/vit_digits.yaml \\
                --ckpt_path runs/vit_digits/version_0/checkpoints/last.ckpt --output runs/compare
            # -> runs/compare/comparison.md, comparison.json, comparison.png
    """
    parser = _compare_parser()
    args = parser.parse_args(list(argv))
    if (args.config is None) == (args.model is None):
        parser.error("give --config (a LightningCLI YAML) or --model (a LightningModule class), not both")
    if args.data is not None and args.model is None:
        parser.error("--data goes with --model")
    for name in ("num_samples", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.config is not None and not Path(args.config).is_file():
        parser.error(f"--config {args.config}: no such file; give the LightningCLI YAML the model was fit with")
    if not Path(args.ckpt_path).is_file():
        parser.error(f"--ckpt_path {args.ckpt_path}: no such file; give a checkpoint of the fit, e.g. "
                     "<save_dir>/<name>/version_0/checkpoints/last.ckpt")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        parser.error(f"--output {args.output}: a file, not a directory; give a directory for comparison.md, "
                     "comparison.json and comparison.png (created if missing)")
    from lightning_gae.display.progress import MethodBars

    bars = MethodBars(args.methods)
    try:
        _compare(args, bars, parser.error)
    except (ValueError, TypeError) as err:
        bars.close()
        refusal = origin(err)
        if not raised_here(refusal):
            raise  # not a refusal of this package's: a traceback says where
        raise CommandLineError(str(refusal)) from err
    except KeyboardInterrupt:
        bars.close()
        done = f"{len(bars.finished)} of {len(args.methods)} methods scored ({', '.join(bars.finished) or 'none'})"
        written = (f"writing to {args.output} was under way, its files may be incomplete" if bars.writing else
                   f"nothing was written to {args.output} (the files are written once every method is scored)")
        # "\r": a Ctrl-C inside tqdm's first draw leaves that bar's line open; the message writes over it.
        print(f"\rlightning-gae compare: interrupted; {done}; {written}", file=sys.stderr)
        raise SystemExit(130) from None


def _compare(args: argparse.Namespace, bars: Any, refuse: Any) -> None:
    from lightning_gae.compare import comparison_grid, compare, token_set_inputs
    from lightning_gae.modalities.inputs import infer_data_modality
    from lightning_gae.options import EngineOptions, FaithfulnessOptions
    from lightning_gae._structures import map_tensors
    from lightning_gae.methods import explain

    model, datamodule, callback = (configured(args.config) if args.config is not None
                                   else _from_checkpoint(args.model, args.data, args.ckpt_path))
    checkpoint = read_checkpoint(args.ckpt_path)
    assert checkpoint is not None  # strict
    check_weights_fit(model, checkpoint, args.ckpt_path)
    model.load_state_dict(checkpoint["state_dict"])
    model.eval()
    inputs, labels, truth, keyed = _first_validation_samples(model, datamodule, args.num_samples, callback, args.inputs,
                                                             refuse)
    given = None if callback is None else callback.modality
    if given is None and args.modality is not None:
        given = _modality_argument(args.modality)
    streams = None if callback is None else callback.engine.streams
    explained = callback.target if callback is not None and callable(callback.target) else None
    try:
        probe = explain(model, map_tensors(inputs, lambda t: t[:1] if t.dim() else t), target=explained,
                        method="raw_attention", streams=streams)
    except ValueError:
        # Nothing to tell token sets apart with; compare() says what is wrong with the model, if anything.
        probe = None
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    if isinstance(given, Mapping) or (probe is not None and len(probe.relevance) > 1):
        # Each token set is scored against the ground truth the batches carry for it (compare() says why not perturbation).
        set_inputs = None if callback is None else callback.engine.set_inputs
        target = explained if explained is not None else (labels if args.protocol == "target" else None)
        result = compare(model, inputs, target, methods=args.methods, modality=given, batch_size=args.batch_size,
                         seed=args.seed, protocol=args.protocol, ground_truth=keyed or None, progress=bars,
                         faithfulness=FaithfulnessOptions(metrics=args.metrics or ()),
                         engine=EngineOptions(streams=streams, set_inputs=set_inputs))
        assert probe is not None  # where the probe raised, compare() has raised the same first
        layout = token_set_inputs(inputs, {x: r.shape[1] for x, r in probe.relevance.items()}, given, set_inputs)
        sequence = (explained is None and probe.logits is not None and probe.logits.dim() == 3
                    and probe.logits.shape[1] == probe.tokens.shape[1])
        picture = _set_comparison_picture(model, inputs, args.methods, layout, explained, streams, sequence)
        bars.writing = True
        _write_comparison(output, args, result, labels, picture)
        return
    query = groups = None
    rows = _answer_rows(model, inputs, labels, truth, callback)
    if rows is not None:
        # A causal LM: one sample per answer token, read at the position that predicts it (as the callback scores it),
        # the standard errors over prompts (a prompt's answer rows are left out together).
        model, inputs, labels, truth, given, groups = rows
        query = "last"
    if given is not None:
        modality = given
    else:
        try:
            modality = infer_data_modality(model, inputs, (model, datamodule))
        except ValueError as err:
            raise CommandLineError(f"{err}; here: --modality MODULE.CLASS (e.g. lightning_gae.TextTokens, or a "
                                   "Modality of your own with its settings as defaults), or the YAML's GAECallback "
                                   "init_args: {modality: {class_path: ..., init_args: {...}}}") from err

    result = compare(model, inputs, labels, methods=args.methods, modality=modality, batch_size=args.batch_size,
                     seed=args.seed, protocol=args.protocol, ground_truth=truth, progress=bars, query=query,
                     recall=rows is not None and truth is not None, groups=groups,
                     faithfulness=FaithfulnessOptions(metrics=args.metrics or COMPARE_METRICS),
                     regions=_regions(args.regions, datamodule, callback))
    first = map_tensors(inputs, lambda t: t[:_GRID_SAMPLES])
    picture = comparison_grid(model, first, methods=args.methods, modality=modality, seed=args.seed, query=query)
    bars.writing = True
    _write_comparison(output, args, result, labels, picture)


def _answer_rows(model: Any, inputs: Any, labels: Any, truth: Any, callback: Any) -> tuple[Any, ...] | None:
    """A causal LM's samples as one row per answer token: ``(model read at the readout, inputs, answer tokens,
    ground truth per row, modality keeping the readout, each row's prompt)``; None for other models (or
    ``answer_tokens: false``)."""
    from lightning_gae.language.answers import NextTokenLogits
    from lightning_gae.callbacks.answer_samples import answer_samples, has_answer_labels, holds_causal_lm, keep_readout
    from lightning_gae.callbacks.samples import Samples
    from lightning_gae.modalities import TextTokens

    wanted = None if callback is None else callback.engine.answer_tokens
    samples = Samples(inputs=inputs, labels=labels, truth=truth, keyed={})
    if wanted is False or not has_answer_labels(samples) or (wanted is None and not holds_causal_lm(model)):
        return None
    rows, _ = answer_samples(samples, range(len(samples)))
    modality = callback.modality if callback is not None and callback.modality is not None else TextTokens()
    return NextTokenLogits(model), rows.inputs, rows.labels, rows.truth, keep_readout(modality), rows.groups


def _write_comparison(output: Path, args: argparse.Namespace, result: Any, labels: Any, picture: Any) -> None:
    import matplotlib.image

    table = result.to_markdown()
    if result.sets:
        how = (f"the relevance of each token set ({', '.join(result.sets)}) scored against the ground truth the "
               "batches carry for it (`<set>/<metric>`)")
    else:
        explained = "its predicted class" if args.protocol == "predicted" or labels is None else "its label"
        against = "its label" if labels is not None else "its unperturbed prediction"
        how = (f"each explained for {explained}; a perturbed prediction counts as correct while it equals {against} "
               f"(protocol `{args.protocol}`)")
    if result.regions:
        declared = ", ".join(f"`{name}` ({kind})" for name, kind in result.regions.items())
        how += (f"; `region_share_<region>` is the share of a method's positive relevance on a declared region "
                f"({declared}) and `region_recall_<region>` the recall of its tokens among the most relevant, over "
                "the samples that hold it (`random`: the floor)")
    (output / "comparison.md").write_text(
        f"{result.num_samples} validation samples of `{args.config or args.model}` at `{args.ckpt_path}`, {how}; values ± standard "
        f"error over the samples.\n\n{table}"
    )
    (output / "comparison.json").write_text(result.to_json() + "\n")
    matplotlib.image.imsave(output / "comparison.png", picture)
    print(table)
    print(f"wrote {output / 'comparison.md'}, {output / 'comparison.json'}, {output / 'comparison.png'}")
