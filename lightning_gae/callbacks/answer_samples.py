"""GAECallback on a causal language model: the answer tokens are what it explains and scores.

When the validation batches carry ``labels [B, T]`` with -100 where nothing is learnt (the Hugging Face
convention) and the module holds a causal LM, every tracked and scored sequence becomes one row per
answer token (:func:`lightning_gae.language.answers.answer_rows`): the prompt and the answer before that token,
read at the position that predicts it. Each row is then scored like a classifier's sample: its
class is the answer token, the model is read through :class:`~lightning_gae.language.answers.NextTokenLogits`,
and the readout token itself is neither removed by the perturbation metrics nor scored against the
ground truth (:func:`keep_readout`): every method ranks the token it reads from first, and the
metrics would measure that instead of the evidence before it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_gae.language.answers import IGNORE_INDEX, answer_rows
from lightning_gae.callbacks.samples import Samples
from lightning_gae.modalities import Modality, TextTokens

__all__ = ["answer_samples", "has_answer_labels", "holds_causal_lm", "keep_readout", "row_name"]


def holds_causal_lm(module: nn.Module) -> bool:
    """Whether ``module`` is or holds a Hugging Face causal LM (a generating model that is not an encoder-decoder)."""
    for sub in module.modules():
        can_generate = getattr(type(sub), "can_generate", None)
        config = getattr(sub, "config", None)
        if callable(can_generate) and config is not None and not getattr(config, "is_encoder_decoder", False):
            try:
                if can_generate():
                    return True
            except TypeError:
                continue
    return False


def has_answer_labels(samples: Samples, ignore_index: int = IGNORE_INDEX) -> bool:
    """Whether the samples look like a causal LM's batches: keyword ``input_ids [N, T]`` and integer ``labels`` of
    the same shape holding ``ignore_index`` somewhere and an answer token somewhere after position 0."""
    inputs, labels = samples.inputs, samples.labels
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if not isinstance(ids, Tensor) or labels is None or labels.shape != ids.shape or labels.is_floating_point():
        return False
    return bool((labels == ignore_index).any()) and bool((labels[:, 1:] != ignore_index).any())


def row_name(sample: int, number: int) -> str:
    """The name of answer token ``number`` (0-based) of validation sample ``sample``: ``"<sample>/answer_<n>"``."""
    return f"{sample}/answer_{number + 1}"


def answer_samples(samples: Samples, indices: Sequence[int], ignore_index: int = IGNORE_INDEX) -> tuple[Samples, list[str]]:
    """One sample per answer token of ``samples`` (validation indices ``indices``), and each row's name.

    The labels become the answer tokens ``[R]``; ground truth and keyed tensors are repeated per row, and each
    row's group is its prompt's validation index (a prompt's answer tokens are not independent samples).
    """
    assert samples.labels is not None  # a causal LM's batches carry its answer tokens as labels
    rows = answer_rows(samples.inputs, samples.labels, ignore_index)
    source = rows.sample.cpu()
    repeat = lambda t: None if t is None else t[source]  # noqa: E731
    names = [row_name(int(indices[s]), int(n)) for s, n in zip(source.tolist(), rows.number.tolist())]
    prompts = torch.as_tensor([int(i) for i in indices], dtype=torch.long)
    return Samples(inputs=rows.inputs, labels=rows.labels.cpu(), truth=repeat(samples.truth),
                   keyed={k: v[source] for k, v in samples.keyed.items()}, groups=prompts[source]), names


_READOUT_CLASSES: dict[type, type] = {}


def _but_readout(removable: Tensor, self: TextTokens, inputs: Any) -> Tensor:
    real = self.real_tokens(inputs).to(removable.device)
    positions = torch.arange(real.shape[1], device=real.device).expand_as(real)
    last = torch.where(real, positions, -1).amax(dim=1)
    rows = torch.nonzero(last >= 0).flatten()
    removable = removable.clone()
    removable[rows, last[rows]] = False
    return removable


def keep_readout(modality: Modality) -> Modality:
    """A copy of a text modality whose ``removable`` leaves out each row's last real token (the readout).

    Raises:
        ValueError: ``modality`` is not a :class:`~lightning_gae.modalities.TextTokens`.
    """
    if not isinstance(modality, Modality) or modality.vocabulary(0) is None:
        raise ValueError(f"GAECallback: a causal LM's answer tokens are explained over text; modality={modality!r} is not "
                         "a TextTokens (pass modality=TextTokens(tokenizer=...) or TextTokens(vocab=[...]))")
    base = type(modality)
    if base in _READOUT_CLASSES.values():
        return modality
    cls = _READOUT_CLASSES.get(base)
    if cls is None:
        def removable(self: TextTokens, inputs: Any) -> Tensor:
            return _but_readout(base.removable(self, inputs), self, inputs)

        cls = type(base.__name__, (base,), {"removable": removable, "__module__": base.__module__, "__doc__": base.__doc__})
        _READOUT_CLASSES[base] = cls
    kept = copy.copy(modality)
    kept.__class__ = cls
    return kept
