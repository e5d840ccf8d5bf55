"""Models with several token sets, and what each set is scored against.

A model's attention runs over one or more token sets (``explain(...).relevance``): one for a ViT,
BERT or GPT-2, an encoder and a decoder set for an encoder-decoder, two towers for a dual encoder.
This module says which model input each set's tokens come from (:func:`token_set_inputs`), explains
a decoder position by position (:func:`last_positions`, :func:`sequence_rows`), and holds the one
table from a kind of ground truth to the metric that scores it (:data:`GROUND_TRUTH`,
:data:`SET_TRUTH`), which ``compare`` and ``GAECallback`` both read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_gae._structures import display_input, take
from lightning_gae.explain import Explanation, explain
from lightning_gae.metrics import RationaleAgreement, RationaleRecall, RelevanceSegmentation
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens

__all__ = [
    "GROUND_TRUTH",
    "RECALL",
    "SET_TRUTH",
    "TruthScore",
    "infer_modality",
    "is_sequence_output",
    "scored_truth",
    "last_positions",
    "sequence_rows",
    "token_set_input",
    "token_set_inputs",
    "truth_score",
]


@dataclass(frozen=True)
class TruthScore:
    """How one kind of ground truth scores an attribution.

    Attributes:
        name: the scalar's prefix (``<name>_<key>/<method>``, ``<set>/<name>_<key>`` per token set).
        modality: the modality whose relevance it scores.
        truth_dims: the ground truth's dims with the batch (images' masks ``[B, H, W]``: 3).
        metric: ``modality -> Metric`` (built without syncing: one process scores).
        update_args: ``(modality, inputs, attributions, truth) -> the metric's update arguments``, each with the
            batch in dim 0.
    """

    name: str
    modality: type[Modality]
    truth_dims: int
    metric: Callable[[Modality], Metric]
    update_args: Callable[[Modality, Any, Tensor, Tensor], tuple[Any, ...]]


GROUND_TRUTH: tuple[TruthScore, ...] = (
    TruthScore("segmentation", ImageTokens, 3, lambda m: RelevanceSegmentation(m, sync_on_compute=False),
               lambda m, inputs, a, truth: (a, truth)),
    TruthScore("rationale", TextTokens, 2, lambda m: RationaleAgreement(sync_on_compute=False),
               lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth, m.removable(inputs))),
    TruthScore("feature_recovery", TabularTokens, 2, lambda m: RationaleAgreement(sync_on_compute=False),
               lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth)),
)
"""Ground truth -> metric, by modality: image masks ``[B, H, W]`` -> ``segmentation_{pixel_accuracy,miou,mean_ap}``
(:class:`~lightning_gae.metrics.RelevanceSegmentation`); rationale tokens ``[B, T]`` -> ``rationale_{token_f1,auprc}``
over the removable tokens and informative features ``[B, F]`` -> ``feature_recovery_{token_f1,auprc}``
(:class:`~lightning_gae.metrics.RationaleAgreement`)."""

RECALL = TruthScore("recall", TextTokens, 2, lambda m: RationaleRecall(sync_on_compute=False),
                    lambda m, inputs, a, truth: (m.unit_scores(a, inputs), truth, m.removable(inputs)))
"""Text ground truth scored as ``recall_{top1,hit_at_k,mass}`` (:class:`~lightning_gae.metrics.RationaleRecall`):
what a causal LM's answer rows are asked (does the relevance find the tokens the answer comes from)."""

SET_TRUTH: dict[str, type[Modality] | None] = {"alignment": None, "masks": ImageTokens, "segmentation": ImageTokens,
                                               "rationales": TextTokens}
"""Batch key of a ground truth -> the modality of the token set it scores, for models with several sets
(``None``: ``alignment [B, T]``, the source position each target token copies, scores the source set's rows)."""


def truth_score(modality: Modality) -> TruthScore:
    """The :data:`GROUND_TRUTH` entry of ``modality``.

    Raises:
        ValueError: a modality no ground truth is defined for.
    """
    for entry in GROUND_TRUTH:
        if isinstance(modality, entry.modality):
            return entry
    kinds = ", ".join(entry.modality.__name__ for entry in GROUND_TRUTH)
    raise ValueError(f"ground truth needs a {kinds} modality; got {type(modality).__name__}")


def scored_truth(modality: Modality, truth: Tensor) -> TruthScore | None:
    """The :data:`GROUND_TRUTH` entry that scores ``truth`` for ``modality``, or None when there is none or the
    truth's dims do not fit it (a batch's third element that is not this modality's ground truth)."""
    entry = next((e for e in GROUND_TRUTH if isinstance(modality, e.modality)), None)
    return entry if entry is not None and truth.dim() == entry.truth_dims else None


def is_sequence_output(explanation: Explanation, target: Any = None) -> bool:
    """Whether each position of the query set is explained on its own: sequence logits ``[B, T, C]`` over the
    query set (a decoder) and a class target (a callable target is one scalar per sample)."""
    logits = explanation.logits
    return (not callable(target) and logits is not None and logits.dim() == 3
            and logits.shape[1] == explanation.tokens.shape[1])


def token_set_inputs(
    inputs: Any,
    sizes: Mapping[str, int],
    modality: Mapping[str, Modality] | None = None,
    set_inputs: Mapping[str, int | str] | None = None,
    caller: str = "compare",
) -> dict[str, tuple[Modality, int | str]]:
    """Each token set's modality and the model input its tokens come from.

    Args:
        inputs: the model inputs: a mapping of keyword arguments, a tuple, or one tensor.
        sizes: token set -> its token count (``{x: r.shape[1] for x, r in explain(...).relevance.items()}``).
        modality: set -> modality; a set left out is inferred when exactly one input is images whose
            patch grid fits its token count (:meth:`ImageTokens.infer`).
        set_inputs: set -> the key of a mapping input or the position in a tuple; a set left out
            takes the one input its modality fits (masks, keys ending in ``mask``, hold no tokens).
        caller: named in the errors (``"GAECallback"``, ``"compare"``).

    Returns:
        set -> ``(modality, key or position)``, one input per set.

    Raises:
        ValueError: a set named that the model does not have, a set whose modality cannot be
            inferred, an input two sets fit alike (equal lengths: pass ``set_inputs``), or an input
            given that does not fit the set's modality.
    """
    given = dict(modality or {})
    for name, argument in (("modality", given), ("set_inputs", set_inputs or {})):
        unknown = [x for x in argument if x not in sizes]
        if unknown:
            raise ValueError(f"{caller}({name}=...) names token sets {unknown}; the model's sets are {list(sizes)} "
                             "(from explain(...).relevance)")
    if isinstance(inputs, Mapping):
        # Masks (attention_mask, key_padding_mask, ...) are laid out like the tokens but hold none.
        candidates = {k: v for k, v in inputs.items() if isinstance(v, Tensor) and not str(k).endswith("mask")}
    elif isinstance(inputs, (tuple, list)):
        candidates = {i: v for i, v in enumerate(inputs) if isinstance(v, Tensor)}
    else:
        candidates = {0: inputs}
    out: dict[str, tuple[Modality, int | str]] = {}
    for x, size in sizes.items():
        key = (set_inputs or {}).get(x)
        if key is not None and key not in candidates:
            raise ValueError(f"{caller}(set_inputs={{{x!r}: {key!r}}}): the model inputs have no tensor {key!r}; "
                             f"they are {list(candidates)}")
        chosen = given.get(x)
        if chosen is None:
            inferred = [(k, ImageTokens.infer(v, size)) for k, v in candidates.items() if key in (None, k)]
            inferred = [(k, m) for k, m in inferred if m is not None]
            if len(inferred) != 1:
                raise ValueError(f"{caller}: cannot infer the modality of token set {x!r} ({size} tokens); pass "
                                 f"modality={{{x!r}: ImageTokens(patch_size=...) or TextTokens(...)}} for every set "
                                 f"(the model's sets: {list(sizes)})")
            key, chosen = inferred[0]
        if key is None:
            fits = [k for k, v in candidates.items() if chosen.matches_input(v, size)]
            if len(fits) != 1:
                found = f"the inputs {fits} fit it alike" if fits else "no input fits it"
                raise ValueError(f"{caller}: token set {x!r} ({size} tokens, {chosen!r}): {found}; pass "
                                 f"set_inputs={{set: input key or tuple position}} for the sets {list(sizes)}")
            key = fits[0]
        if not chosen.matches_input(candidates[key], size):
            raise ValueError(f"{caller}: {chosen!r} of token set {x!r} ({size} tokens) does not fit input {key!r} of "
                             f"shape {tuple(candidates[key].shape)}")
        out[x] = (chosen, key)
    taken = [key for _, key in out.values()]
    doubled = sorted({str(k) for k in taken if taken.count(k) > 1})
    if doubled:
        raise ValueError(f"{caller}: the token sets {list(out)} were matched to the inputs {taken}, {doubled} more than "
                         "once; pass modality={set: ImageTokens(...)/TextTokens(...)} for every set and "
                         "set_inputs={set: input key or tuple position}")
    return out


def token_set_input(inputs: Any, key: int | str) -> tuple[Tensor, Any]:
    """``(tensor, what the set's modality maps with)`` of the input at ``key`` (:func:`token_set_inputs`).

    The second is the tensor itself, or for ``input_ids`` among keyword inputs a mapping that also
    holds their ``attention_mask``, so that text padding is known.
    """
    tensor = inputs[key] if isinstance(inputs, (Mapping, tuple, list)) else inputs
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) and key == "input_ids" else None
    with_mask = isinstance(mask, Tensor) and mask.shape == tensor.shape
    return tensor, ({"input_ids": tensor, "attention_mask": mask} if with_mask else tensor)


def last_positions(model: nn.Module, inputs: Any, **options: Any) -> Tensor:
    """``[B]`` the last real position of the query set (a decoder) per sample, as ``explain(query="last")`` reads it.

    ``options``: ``attention_modules`` or ``streams`` of :func:`~lightning_gae.explain`.
    """
    return explain(model, inputs, method="raw_attention", query="last", **options).query


def sequence_rows(model: nn.Module, inputs: Any, method: str, last: Tensor, labels: Tensor | None = None,
                  **options: Any) -> dict[str, Tensor]:
    """Set -> ``[B, T, N_set]``: row ``t`` is ``explain(..., query=t)``'s relevance of the set, for sequence outputs.

    One explanation per position ``t`` over the whole batch, of the prediction made at ``t`` (the
    argmax, or ``labels[:, t]``). A sample whose last real position (``last``) is before ``t`` is
    read at that last position and its row ``t`` is zeroed: nothing is predicted there.

    Args:
        model: a model whose logits are ``[B, T, C]`` over the query set (an encoder-decoder).
        inputs: its inputs.
        method: a method of :func:`~lightning_gae.explain`.
        last: ``[B]`` from :func:`last_positions`.
        labels: ``[B, T]`` classes to explain per position; None: the predictions.
        options: ``attention_modules`` or ``streams`` of :func:`~lightning_gae.explain`.
    """
    rows: dict[str, list[Tensor]] = {}
    for t in range(int(last.max()) + 1):
        query = torch.clamp(last, max=t)
        beyond = (last < t).cpu()
        target = None if labels is None else labels.gather(1, query.to(labels.device)[:, None])[:, 0]
        exp = explain(model, inputs, target=target, method=method, query=query, **options)
        for x, row in exp.relevance.items():
            rows.setdefault(x, []).append(row.detach().float().cpu().masked_fill(beyond[:, None], 0.0))
    return {x: torch.stack(found, dim=1) for x, found in rows.items()}


def infer_modality(model: nn.Module, inputs: Any) -> ImageTokens:
    """The :class:`ImageTokens` of a ViT-style model on square images, from one raw-attention pass.

    Raises:
        ValueError: inputs that are not square images, or a token count no patching explains
            (the message names ``modality=``).
    """
    x = display_input(inputs)
    probe = take(inputs, 0, 1, x.shape[0])
    num_tokens = explain(model, probe, method="raw_attention").tokens.shape[1]
    modality = ImageTokens.infer(display_input(probe), num_tokens)
    if modality is None:
        raise ValueError(
            f"cannot tell how {type(model).__name__} made its {num_tokens} tokens from inputs of shape "
            f"{tuple(x.shape)} (only square ViT-style images are inferred); pass modality=ImageTokens(...), "
            "TextTokens(...) or TabularTokens(...)"
        )
    return modality
