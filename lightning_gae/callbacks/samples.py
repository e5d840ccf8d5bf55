"""Which validation samples GAECallback tracks, and how it reads them without touching the Trainer's loaders.

The default readers of a batch (inputs, labels, ground truth), the seeded class-balanced choice,
and :func:`read_samples`, which reads a validation loader once into CPU tensors.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Trainer
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler, Subset

from lightning_gae._structures import batch_fields, concat, display_input, map_tensors, take

__all__ = [
    "Samples",
    "balanced_choice",
    "class_names",
    "default_batch_ground_truth",
    "default_batch_inputs",
    "default_batch_labels",
    "finite_rows",
    "keyed_truth",
    "missing_classes",
    "private_reader",
    "read_samples",
]

_LABEL_KEYS = ("labels", "label")
# Labels where a mapping or dataclass has none of _LABEL_KEYS and exactly one of these, as ``y`` of ``(x, y)`` is; they
# stay among the inputs, which the forward may take by name (the callback leaves out the keys it does not take).
_LABEL_NAMES = ("y", "target", "targets")
_TRUTH_KEYS = ("masks", "segmentation", "rationales")
# Source position of each target token (encoder-decoders): ground truth of the source x target rows.
_ALIGNMENT_KEYS = ("alignment",)


def _keyed(batch: Any) -> Any:
    """A dataclass batch as the mapping of its fields, read by the same names as a mapping batch."""
    fields = batch_fields(batch)
    return batch if fields is None else fields


def default_batch_inputs(batch: Any) -> Any:
    """Model inputs of a batch: ``x`` of ``(x, y, ...)``, every key of a mapping but labels and ground truth, or a
    dataclass batch whole (the callback then passes the fields its forward takes by name, or the batch itself)."""
    if isinstance(batch, Mapping):
        return {k: v for k, v in batch.items() if k not in _LABEL_KEYS + _TRUTH_KEYS + _ALIGNMENT_KEYS}
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


def default_batch_labels(batch: Any) -> Tensor | None:
    """Labels of a batch: ``y`` of ``(x, y, ...)``, or a mapping's or dataclass's ``labels``/``label`` (else its one
    tensor named ``y``, ``target`` or ``targets``: with two of them, which is meant cannot be told); else None."""
    batch = _keyed(batch)
    if isinstance(batch, Mapping):
        named = [batch[k] for k in _LABEL_KEYS if k in batch]
        others = [batch[k] for k in _LABEL_NAMES if isinstance(batch.get(k), Tensor)]
        return named[0] if named else (others[0] if len(others) == 1 else None)
    if isinstance(batch, (tuple, list)) and len(batch) > 1 and isinstance(batch[1], Tensor):
        return batch[1]
    return None


def default_batch_ground_truth(batch: Any) -> Tensor | None:
    """Ground truth of a batch: a mapping's (or dataclass's) ``masks``/``segmentation`` (images ``[B, H, W]``) or
    ``rationales`` (tokens ``[B, T]``), or ``z`` of ``(x, y, z)``; else None."""
    batch = _keyed(batch)
    if isinstance(batch, Mapping):
        return next((batch[k] for k in _TRUTH_KEYS if k in batch), None)
    if isinstance(batch, (tuple, list)) and len(batch) > 2 and isinstance(batch[2], Tensor):
        return batch[2]
    return None


def keyed_truth(batch: Any) -> dict[str, Tensor]:
    """Every ground truth a mapping (or dataclass) batch carries, by key: what models with several token sets score
    each set with."""
    batch = _keyed(batch)
    if not isinstance(batch, Mapping):
        return {}
    return {k: batch[k].detach().cpu().clone() for k in _TRUTH_KEYS + _ALIGNMENT_KEYS if isinstance(batch.get(k), Tensor)}


def balanced_choice(labels: Tensor | None, total: int, count: int, seed: int) -> list[int]:
    """``count`` indices out of ``total``, seeded; round-robin over classes when labels exist."""
    rng = np.random.default_rng(seed)
    if labels is None or labels.dim() != 1:
        return sorted(rng.choice(total, size=min(count, total), replace=False).tolist())
    by_class = {int(c): rng.permutation(torch.nonzero(labels == c).flatten().numpy()).tolist()
                for c in torch.unique(labels)}
    chosen: list[int] = []
    while len(chosen) < min(count, total):
        for members in by_class.values():
            if members and len(chosen) < count:
                chosen.append(members.pop())
    return chosen


def class_names(trainer: Trainer) -> Sequence[str] | None:
    """The data module's ``class_names``, if it has them (drawn beside the class numbers)."""
    return getattr(getattr(trainer, "datamodule", None), "class_names", None)


def private_reader(loader: Iterable[Any]) -> Iterable[Any]:
    """Batches of a validation loader read without touching it: a new single-process DataLoader over its dataset.

    Iterating the Trainer's own loader would reset its live iterator when ``persistent_workers=True``
    (the validation loop would then run on what is left). The loader's sampler is not used, as it may
    shuffle or shard; one that picks part of the dataset (a validation split) keeps that part, in order.
    Other iterables (e.g. a list of batches) are read as they are.
    """
    if not isinstance(loader, DataLoader):
        return loader
    dataset = loader.dataset
    whole = (SequentialSampler, RandomSampler, DistributedSampler)
    if not isinstance(dataset, IterableDataset) and not isinstance(loader.sampler, whole):
        dataset = Subset(dataset, sorted(set(loader.sampler)))
    batch_size = loader.batch_size
    if batch_size is None and loader.batch_sampler is not None:
        batch_size = getattr(loader.batch_sampler, "batch_size", None) or 1
    return DataLoader(dataset, batch_size=batch_size, collate_fn=loader.collate_fn)


@dataclass
class Samples:
    """Samples kept on the CPU, in the order read.

    Attributes:
        inputs: the model inputs (a tensor, a tuple or a mapping), the batch in dim 0.
        labels: ``[n]`` (or ``[n, T]`` per position), or None when a batch had none.
        truth: the single ground truth of each sample (masks ``[n, H, W]``, rationales ``[n, T]``, features
            ``[n, F]``), or None.
        keyed: every ground truth a mapping batch carried, by key (models with several token sets score each set).
        groups: ``[n]``, the samples that are not independent share a label (a causal LM's answer tokens: their
            prompt's validation index), so that standard errors leave them out together; None: all independent.
    """

    inputs: Any
    labels: Tensor | None
    truth: Tensor | None
    keyed: dict[str, Tensor]
    groups: Tensor | None = None

    def __len__(self) -> int:
        return display_input(self.inputs).shape[0]

    def part(self, rows: Sequence[int]) -> Samples:
        """The samples at ``rows``: views of these when the rows are one contiguous run, else copies (``subset``)."""
        start = rows[0] if len(rows) else 0
        if list(rows) != list(range(start, start + len(rows))):
            return self.subset(rows)
        total, stop = len(self), start + len(rows)
        return Samples(
            inputs=take(self.inputs, start, stop, total),
            labels=None if self.labels is None else self.labels[start:stop],
            truth=None if self.truth is None else self.truth[start:stop],
            keyed={k: v[start:stop] for k, v in self.keyed.items()},
            groups=None if self.groups is None else self.groups[start:stop],
        )

    def subset(self, index: Sequence[int]) -> Samples:
        """The samples at ``index``, in that order."""
        total, rows = len(self), torch.as_tensor(list(index), dtype=torch.long)
        return Samples(
            inputs=map_tensors(self.inputs, lambda t: t[rows] if t.dim() and t.shape[0] == total else t),
            labels=None if self.labels is None else self.labels[rows],
            truth=None if self.truth is None else self.truth[rows],
            keyed={k: v[rows] for k, v in self.keyed.items()},
            groups=None if self.groups is None else self.groups[rows],
        )


def read_samples(batches: Iterable[Any], max_batches: int, batch_inputs: Callable[[Any], Any],
                 batch_labels: Callable[[Any], Tensor | None],
                 batch_ground_truth: Callable[[Any], Tensor | None]) -> tuple[Samples, int]:
    """At most ``max_batches`` batches read into CPU copies; returns the samples and how many batches were read.

    Raises:
        ValueError: no batch at all.
    """
    inputs, labels, truths, keyed = [], [], [], []
    for batch in itertools.islice(batches, max_batches):
        keyed.append(keyed_truth(batch))
        inputs.append(map_tensors(batch_inputs(batch), lambda t: t.detach().cpu().clone()))
        found = batch_labels(batch)
        labels.append(None if found is None else found.detach().cpu().clone())
        truth = batch_ground_truth(batch)
        truths.append(None if truth is None else truth.detach().cpu().clone())
    if not inputs:
        raise ValueError("GAECallback: the validation dataloader is empty")
    samples = Samples(
        inputs=concat(inputs),
        labels=None if any(lbl is None for lbl in labels) else torch.cat([lbl for lbl in labels if lbl is not None]),
        truth=None if any(t is None for t in truths) else concat(truths),
        keyed={k: concat([part[k] for part in keyed]) for k in keyed[0] if all(k in part for part in keyed)},
    )
    return samples, len(inputs)


def finite_rows(samples: Samples) -> Tensor:
    """``[n]`` bool: True for the samples whose float inputs hold no NaN or inf (token ids are always finite)."""
    total = len(samples)
    keep = torch.ones(total, dtype=torch.bool)

    def check(t: Tensor) -> Tensor:
        if t.is_floating_point() and t.dim() and t.shape[0] == total:
            keep.logical_and_(torch.isfinite(t.reshape(total, -1)).all(dim=1))
        return t

    map_tensors(samples.inputs, check)
    return keep


def missing_classes(labels: Tensor | None, chosen: Sequence[int]) -> tuple[list[int], int]:
    """``(classes no chosen sample shows, number of classes)``; nothing for labels that are not one class per sample."""
    if labels is None or labels.dim() != 1 or labels.is_floating_point():
        return [], 0
    classes = torch.unique(labels).tolist()
    shown = set(labels[torch.tensor(list(chosen), dtype=torch.long)].tolist())
    return [c for c in classes if c not in shown], len(classes)
