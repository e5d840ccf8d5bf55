"""What every explanation shares, whichever method computes it: the result type, the preamble it runs
under, and how a sample's readout row, real tokens and explained score are found.

:class:`Explanation` is what :func:`~lightning_gae.explain` returns; :func:`explaining` is the
preamble (eval mode, forked RNG, gradients on, fresh copies of the inputs); :func:`keep_mask`,
:func:`readout_query` and :func:`target_scores` read the batch; :func:`hide_own` sets the query
token's own identity entry to 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import torch
from torch import Tensor, nn

from lightning_gae._structures import (
    Target,
    call_args,
    eval_mode,
    first_tensor,
    keyword_inputs,
    map_tensors,
    nonfinite_inputs,
)

__all__ = ["PADDING_KEYS", "Explanation", "Query", "diverged", "explaining", "hide_own", "keep_mask", "readout_query",
           "refuse_nonfinite", "resolve_readout", "target_scores", "check_inputs"]

Query = Union[int, Literal["last", "mean"], Sequence[int], Tensor]

# Keys of a keyword-argument input that mark padding, and whether a True/nonzero entry means "keep".
PADDING_KEYS = {"attention_mask": True, "src_key_padding_mask": False, "key_padding_mask": False}


@dataclass
class Explanation:
    """The relevance of every token for one prediction per sample.

    Attributes:
        tokens: float32 ``[B, N]``, aligned with the model's token sequence; the query token's own
            entry and padded positions are 0.
        logits: the logits the explanation was read from, detached (None when the output had none).
        target: ``[B]`` class indices explained, or None for a callable target.
        score: ``[B]`` the explained scalar ``y_t`` of each sample, detached.
        method: a name in :data:`METHODS` (``"gae"``, ``"rollout"``, ``"raw_attention"``, ...) or in
            :data:`LRP_METHODS` (``"attnlrp"``, ``"transformer_attribution"``).
        layers: module paths of the attention layers used, in call order.
        query: ``[B]`` index of the token whose row was read out (None for ``query="mean"``).
        relevance: token set name -> float32 ``[B, N_set]``: every set's relevance for the
            prediction (one entry, ``"tokens"``, for single-set models; ``"encoder"``/``"decoder"``
            for encoder-decoders; ``"text"``/``"image"`` for dual encoders). Padding and the
            query's own entry are 0.
        query_set: the token set ``tokens`` belongs to.
        conservation: ``[B]`` float32, ``method="attnlrp"`` only (else None): sum of each sample's token
            relevance / its explained score; biases and position/token-type embeddings absorb the rest.
    """

    tokens: Tensor
    logits: Tensor | None
    target: Tensor | None
    score: Tensor
    method: str
    layers: list[str] = field(default_factory=list)
    query: Tensor | None = None
    relevance: dict[str, Tensor] = field(default_factory=dict)
    query_set: str = "tokens"
    conservation: Tensor | None = None

    @property
    def finite(self) -> Tensor:
        """``[B]`` bool: whether every relevance of the sample, in every token set, is a finite number. The model's
        score is finite where an explanation is returned (a NaN or inf one is refused); a relevance can still
        overflow, in half precision say."""
        values = [self.tokens, *self.relevance.values()]
        return torch.stack([torch.isfinite(v).flatten(1).all(dim=1) for v in values]).all(dim=0)


def keep_mask(kwargs: Mapping[str, Any], batch: int, num_tokens: int, args: Sequence[Any] = ()) -> Tensor | None:
    """``[B, N]`` bool, True for real tokens, from a padding mask among the keyword inputs, or among the keys or fields
    of the one positional input of a model whose forward takes the batch itself (``model(batch)``)."""
    source = kwargs or keyword_inputs(tuple(args)) or {}
    for key, true_keeps in PADDING_KEYS.items():
        mask = source.get(key)
        if isinstance(mask, Tensor) and mask.shape == (batch, num_tokens):
            return mask != 0 if true_keeps else mask == 0
    return None


def readout_query(query: Query, batch: int, num_tokens: int, keep: Tensor, device: torch.device) -> Tensor:
    """``[B]`` token indices, or for ``"mean"`` a float ``[B, N]`` start row: the mean of the real tokens' rows."""
    if isinstance(query, str):
        if query == "mean":
            weights = keep.to(torch.float32)
            return weights / weights.sum(dim=1, keepdim=True).clamp(min=1)
        if query != "last":
            raise ValueError(f"query={query!r}: use a token index, 'last', 'mean', or one index per sample")
        # Last real token of each row (right padding), whatever the padding side.
        positions = torch.arange(num_tokens, device=device).expand(batch, num_tokens)
        return torch.where(keep, positions, -1).amax(dim=1)
    given = torch.as_tensor(query)
    if given.is_floating_point() or given.is_complex() or given.dtype == torch.bool:
        # A float would be truncated to a position silently (1.5 read token 1).
        raise ValueError(f"query={query!r} is no token index: give an integer, 'last', 'mean', or one integer per sample")
    index = given.to(dtype=torch.long, device=device)
    if index.dim() == 0:
        index = index.expand(batch)
    if index.shape != (batch,):
        raise ValueError(f"query has shape {tuple(index.shape)}; give one index, 'last', 'mean', or {batch} indices (one per sample)")
    if ((index < -num_tokens) | (index >= num_tokens)).any():
        raise ValueError(f"query {index.tolist()} is out of range for {num_tokens} tokens")
    index = index % num_tokens
    padded = ~keep[torch.arange(batch, device=device), index]
    if padded.any():
        raise ValueError(
            f"query {index.tolist()} lands on a padded position in samples {torch.nonzero(padded).flatten().tolist()}; "
            "read a real token (e.g. query='last' for the last real token)"
        )
    return index


def target_scores(output: Any, logits: Tensor | None, target: Target, query: Tensor, batch: int) -> tuple[Tensor, Tensor | None]:
    """``(y_t per sample [B], explained class per sample [B] or None)``."""
    if callable(target):
        score = target(output)
        if not isinstance(score, Tensor) or score.reshape(-1).shape != (batch,):
            got = tuple(score.shape) if isinstance(score, Tensor) else type(score).__name__
            raise ValueError(f"target callable must return one scalar per sample, a Tensor of shape [{batch}]; got {got}")
        return _refuse_nonfinite_scores(score.reshape(batch)), None
    if logits is None:
        raise ValueError(
            "the model output has no logits (a tensor, `.logits`, or a tuple whose first item is a tensor); "
            "pass target=callable(output) -> Tensor[B] that returns the scalar to explain"
        )
    if logits.dim() == 3:
        if query.is_floating_point():
            raise ValueError("query='mean' reads no single position of sequence logits [B, T, C]; pass a token index or target=callable(output)")
        # Sequence outputs ([B, T, C], e.g. a language model): the prediction made at the query token.
        logits = logits[torch.arange(batch, device=logits.device), query.to(logits.device)]
    if logits.dim() == 1:
        logits = logits[:, None]
    if logits.dim() != 2 or logits.shape[0] != batch:
        raise ValueError(f"logits of shape {tuple(logits.shape)} are not [B, C] or [B, T, C]; pass target=callable(output)")
    if target is None:
        index = logits.argmax(dim=-1)
    else:
        _refuse_non_integer(target)
        index = torch.as_tensor(target, dtype=torch.long, device=logits.device)
        index = index.expand(batch) if index.dim() == 0 else index.reshape(-1)
        if index.shape != (batch,):
            raise ValueError(f"target has {index.numel()} entries for a batch of {batch}; give an int, one index per sample, or a callable")
        if ((index < 0) | (index >= logits.shape[-1])).any():
            raise ValueError(f"target {index.tolist()} is out of range for {logits.shape[-1]} classes")
    return _refuse_nonfinite_scores(logits.gather(1, index[:, None]).squeeze(1)), index


def _refuse_nonfinite_scores(score: Tensor) -> Tensor:
    """The explained scores, refused where one is NaN or inf: every relevance read from it would be NaN (or a mask's
    test on NaN probabilities would answer for it), silently."""
    bad = ~torch.isfinite(score.detach())
    if bad.any():
        raise diverged("output to explain", bad.nonzero().flatten().tolist())
    return score


def diverged(what: str, samples: list[int]) -> ValueError:
    """The error every method raises for a model whose ``what`` (its output, its attention) is NaN or inf on finite
    inputs: whichever part of the forward shows it first, the cause and the fix are the same."""
    return ValueError(f"the model's {what} is NaN or inf for sample(s) {samples[:8]}{' ...' if len(samples) > 8 else ''}"
                      ", from finite inputs: the model has diverged (non-finite weights or activations), and every "
                      "explanation of it would be NaN. Check the weights (all(p.isfinite().all() for p in "
                      "model.parameters())) and the training's loss")


def _refuse_non_integer(target: Any) -> None:
    """A class index is an integer: a string or a float would be refused inside ``torch`` or silently truncated."""
    values = target if isinstance(target, (list, tuple)) else [target]
    bad = next((v for v in values if isinstance(v, (str, float, bool)) or (isinstance(v, Tensor) and (
        v.is_floating_point() or v.is_complex() or v.dtype == torch.bool))), None)
    if bad is not None:
        got = f"a {bad.dtype} tensor" if isinstance(bad, Tensor) else f"{type(bad).__name__} {bad!r}"
        raise ValueError(f"target: a class index is an integer (an int, a LongTensor [B] of one class per sample, None "
                         f"for the prediction, or a callable output -> Tensor[B] for any other score); got {got}")


def hide_own(row: Tensor, query: Tensor) -> Tensor:
    """The query's own identity entry set to 0 (a mean readout loses its start vector instead)."""
    if query.is_floating_point():
        return row - query.to(row.dtype)
    row = row.clone()
    row[torch.arange(row.shape[0], device=row.device), query] = 0.0
    return row


def refuse_nonfinite(inputs: Any) -> None:
    bad = nonfinite_inputs(inputs)
    if bad:
        # Every relevance computed from them would be NaN, silently: say where they are instead.
        where = ", ".join(f"{count} in {name}" for name, count in bad.items())
        raise ValueError(f"the inputs hold NaN or inf values ({where}); an explanation of them would be NaN. Drop or "
                         "repair those samples before explaining them")


def resolve_readout(readout: Any, kwargs: Mapping[str, Any], args: Sequence[Any] = ()) -> Any:
    """A preset's readout may be a function of the inputs (CLIP's text EOS position)."""
    return readout(kwargs, args) if callable(readout) else readout


def check_inputs(model: nn.Module, inputs: Any) -> None:
    """Refuses what no explanation can be read from, saying what to do: a model or inputs on the meta device, an
    empty batch, NaN or inf inputs (:func:`refuse_nonfinite`)."""
    try:
        first = first_tensor(inputs)
    except TypeError:  # no tensor at all: the model's own call says what it wanted
        first = None
    if (first is not None and first.is_meta) or any(p.is_meta for p in model.parameters()):
        where = "the inputs are" if first is not None and first.is_meta else "the model's parameters are"
        raise ValueError(f"{where} on the meta device: they have shapes but no values, so there is nothing to explain. "
                         "Materialise the model and load its weights first (model.to_empty(device=...), then "
                         "load_state_dict), and pass inputs with values")
    refuse_nonfinite(inputs)
    if first is not None and first.dim() and first.shape[0] == 0:
        raise ValueError(f"the inputs hold no sample (a batch of 0: {type(inputs).__name__} with a first tensor of "
                         f"shape {tuple(first.shape)}); explain at least one")


@contextmanager
def explaining(model: nn.Module, inputs: Any, float_leaves: bool = False) -> Iterator[tuple[tuple, dict]]:
    """The preamble of every explanation: ``(args, kwargs)`` of fresh copies of ``inputs`` for the model's call.

    Refuses what :func:`check_inputs` refuses, then holds the model in eval mode, the RNG (CPU and the model's CUDA
    devices) forked, inference mode off and gradients on, so that nothing the
    explanation does is seen by the run around it. Inference-mode tensors cannot enter an autograd graph,
    hence the copies; with ``float_leaves`` the float copies require grad (the leaves of an LRP pass).
    """
    check_inputs(model, inputs)
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with eval_mode(model), torch.random.fork_rng(devices=cuda), torch.inference_mode(False), torch.enable_grad():
        yield call_args(map_tensors(inputs, lambda t: t.detach().clone().requires_grad_(float_leaves and t.is_floating_point())))
