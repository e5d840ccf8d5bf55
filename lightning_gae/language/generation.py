"""Explaining what a decoder generates: every generated token over the prompt and the tokens before it.

:func:`explain_generation` runs the model's own ``generate`` (greedy unless told otherwise), then
explains each generated token ``j`` as the next-token logit read at the position before it, over
the prompt and the tokens generated before ``j``. All ``k`` rows come from batched calls of
:func:`lightning_gae.explain`: the sequence is repeated once per generated token, each copy with its
own readout position and target, so one forward and one backward explain up to ``max_batch`` rows
(not ``k`` separate passes).

Padded prompts must be padded on the left (a decoder generates after the last prompt token); the
positions are those ``generate`` used, ``attention_mask.cumsum(-1) - 1``, passed as
``position_ids`` so that each row is explained as it was generated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_gae.methods import explain, method_names
from lightning_gae.engine.readout import check_inputs

__all__ = ["GenerationExplanation", "explain_generation"]


@dataclass
class GenerationExplanation:
    """What :func:`explain_generation` returns.

    Attributes:
        sequences: ``[B, P + k]`` prompt and generated ids (left padding kept).
        attention_mask: ``[B, P + k]``, 1 for real tokens.
        generated: ``[B, k]`` the generated ids (``pad`` after a row's end-of-sequence).
        positions: ``[B, k]`` the position whose next-token logit produced each generated token.
        relevance: float32 ``[B, k, P + k]``: row ``j`` is generated token ``j``'s relevance over
            every position; 0 on padding, at and after its readout position's own entry, and for rows
            after a sequence ended (``finished`` False).
        scores: ``[B, k]`` the explained logits.
        finished: ``[B, k]`` bool, False for the positions generated after a row's end of sequence
            (not explained).
        method: the method.
    """

    sequences: Tensor
    attention_mask: Tensor
    generated: Tensor
    positions: Tensor
    relevance: Tensor
    scores: Tensor
    finished: Tensor
    method: str


def _prompt_mask(inputs: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else None
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
        got = type(inputs).__name__ if ids is None else (type(ids).__name__ if not isinstance(ids, Tensor)
                                                          else f"input_ids {ids.dtype} {list(ids.shape)}")
        raise ValueError(f"explain_generation(inputs=...) needs a mapping with 'input_ids' [B, P] (a tokenizer's "
                         f"output, return_tensors='pt'); got {got}")
    if ids.shape[1] == 0:
        raise ValueError(f"explain_generation: the prompts hold no token (input_ids {list(ids.shape)}); a decoder "
                         "generates after the last prompt token, so give each prompt at least one (e.g. the BOS token)")
    mask = inputs.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask.to(ids.device).long()
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask {list(mask.shape)} does not match input_ids {list(ids.shape)}")
    if bool((mask[:, -1] == 0).any()):
        rows = torch.nonzero(mask[:, -1] == 0).flatten().tolist()
        raise ValueError(f"prompts {rows} end in padding: a decoder generates after the last prompt token, so pad on the "
                         "left (tokenizer.padding_side = 'left')")
    return ids, mask


def explain_generation(
    model: nn.Module,
    inputs: Mapping[str, Any],
    max_new_tokens: int,
    method: str = "gae",
    generate_kwargs: Mapping[str, Any] | None = None,
    max_batch: int = 64,
    **explain_kwargs: Any,
) -> GenerationExplanation:
    """Generate ``max_new_tokens`` tokens and explain each one over the tokens before it.

    Args:
        model: a Hugging Face causal LM (anything with ``generate`` whose forward takes
            ``input_ids``, ``attention_mask`` and ``position_ids`` and returns ``[B, T, V]`` logits).
        inputs: ``{"input_ids": [B, P], "attention_mask": [B, P]}``, padded on the left.
        max_new_tokens: ``k``, how many tokens to generate and explain.
        method: any method of :func:`lightning_gae.explain` (``"gae"``, ``"rollout"``, ``"attnlrp"``, ...).
        generate_kwargs: more arguments of ``model.generate`` (default greedy: ``do_sample=False``).
        max_batch: explained rows per call (sequence copies); lower it for long sequences.
        explain_kwargs: passed on to :func:`lightning_gae.explain` (``attention_modules=``, ...).

    Returns:
        A :class:`GenerationExplanation`; ``relevance[b, j]`` equals
        ``explain(model, sequence_b, query=positions[b, j], target=generated[b, j]).tokens``.

    Raises:
        ValueError: a model without ``generate`` or with ``generation_config=None``, inputs without ``input_ids``,
            an empty batch or prompts of no token, prompts padded on the right, ``max_new_tokens`` or ``max_batch``
            that is no int >= 1, an unknown method, or what :func:`lightning_gae.explain` refuses (a model on the
            meta device, a model whose output is NaN or inf).
    """
    if method not in method_names("attention", "lrp"):
        raise ValueError(f"method={method!r}; choose one of {method_names('attention', 'lrp')}")
    for name, value in (("max_new_tokens", max_new_tokens), ("max_batch", max_batch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"explain_generation({name}={value!r}): pass an int >= 1")
    if max_new_tokens < 1 or max_batch < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) and max_batch ({max_batch}) must be >= 1")
    generate = getattr(model, "generate", None)
    if not callable(generate):
        raise ValueError(f"{type(model).__name__} has no generate(): explain_generation needs a causal LM (e.g. a Hugging "
                         "Face *ForCausalLM); for one given continuation call explain(..., query=position) per token")
    ids, mask = _prompt_mask(inputs)
    check_inputs(model, {"input_ids": ids})  # the meta device and an empty batch, before generate() fails on them
    if getattr(model, "generation_config", True) is None:
        raise ValueError(f"{type(model).__name__}.generation_config is None: generate() needs one; set "
                         "model.generation_config = transformers.GenerationConfig.from_model_config(model.config)")
    options = {"do_sample": False, **dict(generate_kwargs or {})}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, **options)
    finally:
        model.train(was_training)
    sequences = out if isinstance(out, Tensor) else out.sequences
    batch, prompt = ids.shape
    generated = sequences[:, prompt:]
    k = generated.shape[1]
    full_mask = torch.cat([mask, torch.ones_like(generated)], dim=1)
    # A row that produced its end-of-sequence token is padded after it by generate(): those are not explained.
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    ended = torch.zeros(batch, k, dtype=torch.bool, device=generated.device)
    if eos:
        is_eos = torch.isin(generated, torch.tensor(sorted(eos), device=generated.device))
        ended[:, 1:] = is_eos.cumsum(dim=1)[:, :-1] > 0
    finished = ~ended
    full_mask[:, prompt:] = finished.long()
    position_ids = (full_mask.cumsum(dim=-1) - 1).clamp(min=0)
    positions = torch.arange(prompt - 1, prompt - 1 + k, device=ids.device).expand(batch, k)

    total = sequences.shape[1]
    relevance = torch.zeros(batch, k, total, dtype=torch.float32)
    scores = torch.zeros(batch, k, dtype=torch.float32)
    rows = [(b, j) for b in range(batch) for j in range(k) if bool(finished[b, j])]
    for start in range(0, len(rows), max_batch):
        chunk = rows[start:start + max_batch]
        b_index = torch.tensor([b for b, _ in chunk], device=ids.device)
        j_index = torch.tensor([j for _, j in chunk], device=ids.device)
        batch_inputs = {"input_ids": sequences[b_index], "attention_mask": full_mask[b_index],
                        "position_ids": position_ids[b_index]}
        exp = explain(model, batch_inputs, target=generated[b_index, j_index], method=method,
                      query=positions[b_index, j_index], **explain_kwargs)
        relevance[b_index.cpu(), j_index.cpu()] = exp.tokens.detach().float().cpu()
        scores[b_index.cpu(), j_index.cpu()] = exp.score.detach().float().cpu()
    return GenerationExplanation(sequences=sequences, attention_mask=full_mask, generated=generated, positions=positions,
                                 relevance=relevance, scores=scores, finished=finished, method=method)
