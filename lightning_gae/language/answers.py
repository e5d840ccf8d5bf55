"""Explaining a causal language model's answer tokens: each one over the prompt and the answer before it.

A causal LM is trained on sequences whose ``labels`` mark what is learnt (the Hugging Face convention:
``labels[b, t]`` is the token at ``t``, predicted by the logits at ``t - 1``; positions that are not
learnt hold -100). Each learnt position is an *answer token*. :func:`answer_rows` turns a batch into
one row per answer token: the sequence with its attention mask closed from the answer token on, so
that the row's last real position is the one whose next-token logit produces the answer token, and
its label is that token. A row is then an ordinary classification sample over the vocabulary, which
the callback, the metrics and :func:`explain` take as they take any classifier's samples
(:class:`NextTokenLogits` reads the logits at the last real position).

:func:`explain_answers` explains every answer token of a batch at once, in batched calls of
:func:`~lightning_gae.explain` (``query="last"`` on the rows), as a ``[B, A, T]`` matrix: row ``j``
of sample ``b`` is its ``j``-th answer token's relevance over the positions before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_gae._structures import model_logits
from lightning_gae.methods import explain, method_names

__all__ = ["IGNORE_INDEX", "AnswerExplanation", "AnswerRows", "NextTokenLogits", "answer_rows", "explain_answers"]

IGNORE_INDEX = -100
"""The label of positions that are not learnt (Hugging Face's and ``torch.nn.functional.cross_entropy``'s default)."""


@dataclass
class AnswerRows:
    """One row per answer token (what :func:`answer_rows` returns).

    Attributes:
        inputs: the rows' model inputs: the mapping given, each ``[B, T]`` tensor repeated per row, with
            ``attention_mask`` 0 from the answer token on (the row's last real position is ``position``).
        labels: ``[R]`` each row's answer token.
        sample: ``[R]`` the batch index of each row's sequence.
        position: ``[R]`` the position whose next-token logit gives the answer token (the answer's position - 1).
        number: ``[R]`` which answer token of its sequence the row is (0, 1, ...).
    """

    inputs: dict[str, Any]
    labels: Tensor
    sample: Tensor
    position: Tensor
    number: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _ids_and_mask(inputs: Any, caller: str) -> tuple[Tensor, Tensor]:
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise ValueError(f"{caller} needs inputs as a mapping with 'input_ids' [B, T] (and 'attention_mask'), "
                         "the keyword inputs of a Hugging Face causal LM")
    mask = inputs.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask
    if mask.shape != ids.shape:
        raise ValueError(f"{caller}: attention_mask {tuple(mask.shape)} does not match input_ids {tuple(ids.shape)}")
    return ids, mask


def answer_rows(inputs: Mapping[str, Any], labels: Tensor, ignore_index: int = IGNORE_INDEX) -> AnswerRows:
    """One row per answer token of a causal-LM batch.

    Args:
        inputs: ``{"input_ids": [B, T], "attention_mask": [B, T], ...}``; other ``[B, T]`` tensors (e.g.
            ``position_ids``) are repeated per row like the ids, other tensors kept as they are.
        labels: ``[B, T]``, aligned with ``input_ids`` (not shifted): ``labels[b, t]`` is learnt from the
            logits at ``t - 1``; ``ignore_index`` where nothing is learnt. Position 0 has no logit before it
            and is never a row.
        ignore_index: the label of positions that are not answer tokens.

    Returns:
        :class:`AnswerRows`, ordered by sample, then position.

    Raises:
        ValueError: inputs without ``input_ids``, labels of another shape, or an answer token on padding.

    >>> ids = torch.tensor([[1, 5, 6, 7, 0]])
    >>> rows = answer_rows({"input_ids": ids, "attention_mask": (ids != 0).long()}, torch.tensor([[-100, -100, -100, 7, -100]]))
    >>> rows.labels.tolist(), rows.position.tolist(), rows.inputs["attention_mask"].tolist()
    ([7], [2], [[1, 1, 1, 0, 0]])
    """
    ids, mask = _ids_and_mask(inputs, "answer_rows")
    if not isinstance(labels, Tensor) or labels.shape != ids.shape or labels.is_floating_point():
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"answer_rows: labels must be integer [B, T] = {tuple(ids.shape)} like input_ids, with "
                         f"{ignore_index} where nothing is learnt; got {shape}")
    labels = labels.to(ids.device)
    wanted = labels != ignore_index
    wanted[:, 0] = False
    on_padding = wanted & (mask.to(ids.device) == 0)
    if bool(on_padding.any()):
        rows = torch.nonzero(on_padding.any(dim=1)).flatten().tolist()
        raise ValueError(f"answer_rows: samples {rows} have answer labels on padded positions (attention_mask 0); "
                         f"set their labels to {ignore_index}")
    sample, answer = torch.nonzero(wanted, as_tuple=True)
    batch, length = ids.shape
    number = wanted.long().cumsum(dim=1)[sample, answer] - 1
    # The row sees the positions before its answer token: the mask is closed from the answer token on.
    open_ = torch.arange(length, device=ids.device)[None, :] < answer[:, None]

    def per_row(value: Any, key: str) -> Any:
        if not isinstance(value, Tensor) or value.dim() < 2 or tuple(value.shape[:2]) != (batch, length):
            return value
        value = value[sample.to(value.device)]
        if key == "attention_mask":
            value = value * open_.to(value.device, value.dtype)
        return value

    row_inputs = {key: per_row(value, key) for key, value in inputs.items()}
    if "attention_mask" not in row_inputs:
        row_inputs["attention_mask"] = open_.long()
    return AnswerRows(inputs=row_inputs, labels=labels[sample, answer], sample=sample, position=answer - 1,
                      number=number)


class NextTokenLogits(nn.Module):
    """A causal LM read as a classifier: the next-token logits ``[B, V]`` at each row's last real position.

    The last real position is the last 1 of ``attention_mask`` (the last position without one), so the
    rows of :func:`answer_rows` read the logit that produces their answer token. The model is called as it
    is (``model(*args, **kwargs)``) and its output's logits (``[B, T, V]``) are read.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def device(self) -> torch.device:
        parameter = next(self.model.parameters(), None)
        return torch.device("cpu") if parameter is None else parameter.device

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        logits = model_logits(self.model(*args, **kwargs))
        if logits is None or logits.dim() != 3:
            raise ValueError(f"NextTokenLogits: {type(self.model).__name__} must return next-token logits [B, T, V]; "
                             f"got {None if logits is None else tuple(logits.shape)}")
        mask = kwargs.get("attention_mask")
        batch, length = logits.shape[:2]
        if mask is None:
            last = torch.full((batch,), length - 1, device=logits.device)
        else:
            positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
            last = torch.where(mask.bool(), positions, -1).amax(dim=1).clamp(min=0).to(logits.device)
        return logits[torch.arange(batch, device=logits.device), last]


@dataclass
class AnswerExplanation:
    """What :func:`explain_answers` returns; ``A`` is the most answer tokens of a sample.

    Attributes:
        relevance: float32 ``[B, A, T]``: row ``j`` is answer token ``j``'s relevance over the positions
            before it (0 from its own position on, on padding, and in rows past a sample's answers).
        answers: ``[B, A]`` the answer tokens (``ignore_index`` past a sample's answers).
        positions: ``[B, A]`` the readout position of each (-1 past a sample's answers).
        valid: ``[B, A]`` bool, which rows hold an answer token.
        scores: ``[B, A]`` the explained logits.
        target: ``[B, A]`` the explained token: the answer token (``target="label"``) or the model's prediction.
        method: the method.
    """

    relevance: Tensor
    answers: Tensor
    positions: Tensor
    valid: Tensor
    scores: Tensor
    target: Tensor
    method: str


def explain_answers(
    model: nn.Module,
    inputs: Mapping[str, Any],
    labels: Tensor,
    method: str = "gae",
    target: Literal["label", "pred"] = "label",
    max_batch: int = 64,
    ignore_index: int = IGNORE_INDEX,
    **explain_kwargs: Any,
) -> AnswerExplanation:
    """Explain every answer token of a causal-LM batch over the prompt and the answer tokens before it.

    Args:
        model: a causal LM whose forward takes the keyword ``inputs`` and returns logits ``[B, T, V]``.
        inputs: ``{"input_ids": [B, T], "attention_mask": [B, T], ...}`` (any padding side).
        labels: ``[B, T]`` aligned with ``input_ids``, ``ignore_index`` where nothing is learnt
            (what a Hugging Face causal LM takes as ``labels``).
        method: any method of :func:`lightning_gae.explain`.
        target: explain the answer token (``"label"``) or the model's own next-token prediction there (``"pred"``).
        max_batch: rows per call of :func:`~lightning_gae.explain`.
        ignore_index: the label of positions that are not answer tokens.
        explain_kwargs: passed on to :func:`~lightning_gae.explain` (``attention_modules=``, ...).

    Returns:
        :class:`AnswerExplanation`; ``relevance[b, j]`` equals ``explain(model, inputs_b[:, :p + 1], query=p,
        target=answers[b, j]).tokens`` with ``p = positions[b, j]``: sample ``b`` cut after the readout. For a
        causal model every method but ``attn_gradcam`` gives the same on the whole sequence read at ``p``
        (Grad-CAM weighs heads by a mean over every real token pair, which the later tokens change).

    Raises:
        ValueError: an unknown method or target, ``max_batch`` below 1, or what :func:`answer_rows` refuses.
    """
    if method not in method_names("attention", "lrp"):
        raise ValueError(f"method={method!r}; choose one of {method_names('attention', 'lrp')}")
    if target not in ("label", "pred"):
        raise ValueError(f"target={target!r}; use 'label' (the answer tokens) or 'pred' (the model's predictions)")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1; got {max_batch}")
    rows = answer_rows(inputs, labels, ignore_index)
    ids, _ = _ids_and_mask(inputs, "explain_answers")
    batch, length = ids.shape
    count = torch.bincount(rows.sample, minlength=batch) if len(rows) else torch.zeros(batch, dtype=torch.long)
    width = int(count.max()) if batch else 0
    relevance = torch.zeros(batch, width, length, dtype=torch.float32)
    answers = torch.full((batch, width), ignore_index, dtype=torch.long)
    positions = torch.full((batch, width), -1, dtype=torch.long)
    scores = torch.zeros(batch, width, dtype=torch.float32)
    explained = torch.full((batch, width), ignore_index, dtype=torch.long)
    sample, number = rows.sample.cpu(), rows.number.cpu()
    answers[sample, number] = rows.labels.cpu()
    positions[sample, number] = rows.position.cpu()
    for start in range(0, len(rows), max_batch):
        stop = min(start + max_batch, len(rows))
        part = {k: v[start:stop] if isinstance(v, Tensor) and v.dim() and v.shape[0] == len(rows) else v
                for k, v in rows.inputs.items()}
        exp = explain(model, part, method=method, query="last",
                      target=rows.labels[start:stop] if target == "label" else None, **explain_kwargs)
        index = (sample[start:stop], number[start:stop])
        relevance[index] = exp.tokens.detach().float().cpu()
        scores[index] = exp.score.detach().float().cpu()
        assert exp.target is not None  # a class target (labels or the prediction), never a callable
        explained[index] = exp.target.detach().cpu()
    valid = positions >= 0
    return AnswerExplanation(relevance=relevance, answers=answers, positions=positions, valid=valid, scores=scores,
                             target=explained, method=method)
