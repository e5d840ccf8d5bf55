"""Which samples a run tracks and scores: read once from the validation data, chosen, checked.

Rank zero reads them (:func:`collect`) before the loops start; the callback then sends them to the other ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import CombinedLoader, rank_zero_warn
from torch import Tensor

from lightning_gae.callbacks.batch_layout import fit_to_forward
from lightning_gae.callbacks._schedule import interim_part
from lightning_gae.callbacks._state import RunState
from lightning_gae.callbacks.answer_samples import answer_samples, has_answer_labels, holds_causal_lm
from lightning_gae.options import BatchOptions, FaithfulnessOptions
from lightning_gae.callbacks.samples import (
    Samples,
    balanced_choice,
    default_batch_ground_truth,
    default_batch_inputs,
    default_batch_labels,
    finite_rows,
    missing_classes,
    private_reader,
    read_samples,
)

__all__ = ["collect", "explains_answers", "pick_loader", "tracked_target", "validation_loaders"]


def validation_loaders(trainer: Trainer) -> Any:
    """The validation dataloader(s) of the starting stage as the user gave them (no loop has iterated them); in
    ``test()``, the test dataloader(s)."""
    fn = trainer.state.fn
    loop = (trainer.fit_loop.epoch_loop.val_loop if fn == "fit" else trainer.test_loop if fn == "test"
            else trainer.validate_loop)
    source = loop._data_source
    loaders = source.dataloader() if source.is_defined() else None
    if isinstance(loaders, CombinedLoader):
        loaders = loaders.iterables
    if loaders is None or (isinstance(loaders, (Mapping, list, tuple)) and not loaders):
        if fn == "test":
            raise ValueError("GAECallback: the Trainer has no test dataloader to take samples from; pass "
                             "dataloaders to test() or define test_dataloader() on the module or datamodule")
        raise ValueError("GAECallback: the Trainer has no validation dataloader to take samples from; pass "
                         "val_dataloaders to fit() or define val_dataloader() on the module or datamodule")
    return loaders


def pick_loader(loaders: Any, index: int | str) -> Any:
    """The loader ``BatchOptions(dataloader_idx=index)`` names among ``loaders``."""
    if isinstance(index, str):
        if not isinstance(loaders, Mapping):
            raise ValueError(f"GAECallback(batches=BatchOptions(dataloader_idx={index!r})): the validation dataloaders "
                             f"are a {type(loaders).__name__}, not a mapping with keys; give the position as an int")
        if index not in loaders:
            raise ValueError(f"GAECallback(batches=BatchOptions(dataloader_idx={index!r})): the validation dataloaders "
                             f"are named {list(loaders)}")
        return loaders[index]
    # Lightning's own numbering: the leaves of the collection in order, as validation_step receives it.
    flat = CombinedLoader(loaders).flattened
    if index >= len(flat):
        names = f" (named {list(loaders)})" if isinstance(loaders, Mapping) else ""
        raise ValueError(f"GAECallback(batches=BatchOptions(dataloader_idx={index})): there are {len(flat)} validation "
                         f"dataloaders{names}; use 0..{len(flat) - 1}" + (" or a name" if names else ""))
    return flat[index]


def explains_answers(trainer: Trainer, read: Samples, answer_tokens: bool | None) -> bool:
    """Whether the answer tokens of a causal LM are explained (``answer_tokens``; None: when the batches and the
    module look like one)."""
    if answer_tokens is False:
        return False
    labelled = has_answer_labels(read)
    if answer_tokens is None:
        return labelled and holds_causal_lm(trainer.lightning_module)
    if not labelled:
        raise ValueError("GAECallback(engine=EngineOptions(answer_tokens=True)): the validation batches need keyword "
                         "inputs with 'input_ids' [B, T] and integer labels [B, T] (the same shape) holding -100 where "
                         "nothing is learnt, as a Hugging Face causal LM takes them; pass "
                         "batches=BatchOptions(labels=...) if they are elsewhere")
    return True


def collect(trainer: Trainer, run: RunState, num_samples: int, batches: BatchOptions,
            faithfulness: FaithfulnessOptions, answer_tokens: bool | None, target: Any) -> None:
    """Read validation batches once and keep the tracked samples and the faithfulness subset in ``run`` (CPU).

    ``run.sample_indices``: the positions asked for (given, or kept from a resumed run), or None to choose them.
    """
    reader = private_reader(pick_loader(validation_loaders(trainer), batches.dataloader_idx))
    read, count = read_samples(reader, batches.max_scan_batches, batches.inputs or default_batch_inputs,
                               batches.labels or default_batch_labels,
                               batches.ground_truth or default_batch_ground_truth)
    if batches.inputs is None:
        # The default reader's inputs as the module's forward takes them: by name, or the batch itself.
        read.inputs = fit_to_forward(trainer.lightning_module, read.inputs)
    total = len(read)
    scanned = (f"the first {total} samples read (max_scan_batches={batches.max_scan_batches})"
               if count == batches.max_scan_batches else f"the {total} samples of the validation set")
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
    if run.sample_indices is not None:  # given ones with NaN or inf go; out-of-range ones are refused below
        run.sample_indices = [i for i in run.sample_indices if not 0 <= i < total or bool(finite[i])]
    if run.sample_indices is None:
        if num_samples > len(usable):
            rank_zero_warn(f"GAECallback(num_samples={num_samples}): there are only {scanned}; "
                           f"tracking all {len(usable)}")
        chosen = balanced_choice(pool_labels, len(usable), num_samples, batches.seed)
        run.sample_indices = [int(usable[i]) for i in chosen]
        missing, classes = missing_classes(read.labels, run.sample_indices)
        if missing:
            rank_zero_warn(f"GAECallback(num_samples={num_samples}): {scanned} have {classes} classes, so "
                           f"the tracked samples show no sample of class {missing}; pass num_samples={classes} "
                           "(or more) to see every class")
    bad = [i for i in run.sample_indices if not 0 <= i < total]
    if bad:
        raise ValueError(f"GAECallback(batches=BatchOptions(sample_indices=...)): {bad} are outside {scanned}")
    tracked = read.subset(run.sample_indices)
    scored_indices = None
    if faithfulness.samples:
        # Another seed than the displayed choice: the subset is a sample of the validation set, not of the shown ones.
        scored = balanced_choice(pool_labels, len(usable), faithfulness.samples, batches.seed + 1)
        scored_indices = [int(usable[i]) for i in scored]
        run.scored = read.subset(scored_indices)
    if explains_answers(trainer, read, answer_tokens):
        # A causal LM: each tracked or scored sequence becomes one sample per answer token.
        assert run.sample_indices is not None  # chosen above
        tracked, run.row_names = answer_samples(tracked, run.sample_indices)
        if run.scored is not None:
            assert scored_indices is not None  # the subset was chosen above
            run.scored, _ = answer_samples(run.scored, scored_indices)
    if run.scored is not None:
        run.interim = interim_part(run.scored, faithfulness.interim_samples, batches.seed + 2)
    run.inputs, run.labels, run.truth, run.keyed = tracked.inputs, tracked.labels, tracked.truth, tracked.keyed
    run.groups = tracked.groups
    if target == "label" and run.labels is None:
        raise ValueError("GAECallback(target='label'): the batches carry no labels; pass "
                         "batches=BatchOptions(labels=...) or use target='pred'")


def tracked_target(target: Any, labels: Tensor | None, device: torch.device, query: Any) -> Any:
    """What ``explain`` is told to explain for the tracked samples (``labels``: theirs); labels of sequence outputs
    ``[B, T]`` are read at the query position."""
    if callable(target):
        return target
    if target == "pred":
        return None
    assert labels is not None  # target="label" without labels stops the run at its start
    labels = labels.to(device)
    if labels.dim() == 2 and not isinstance(query, str):
        position = torch.as_tensor(query, device=labels.device).expand(labels.shape[0])
        return labels.gather(1, position[:, None])[:, 0]
    return labels
