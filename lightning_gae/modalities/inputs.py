"""Which model input each token set's tokens come from, and the modality the inputs say (images, token ids, features).

A model's attention runs over one or more token sets (``explain(...).relevance``): one for a ViT,
BERT or GPT-2, an encoder and a decoder set for an encoder-decoder, two towers for a dual encoder.
:func:`token_set_inputs` pairs each set with its modality and its input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from lightning_gae._structures import display_input, keyword_inputs, take
from lightning_gae.methods import explain
from lightning_gae.modalities.image import ImageTokens
from lightning_gae.modalities.tabular import TabularTokens
from lightning_gae.modalities.text import TextTokens
from lightning_gae.modalities.tokens import Modality

__all__ = ["infer_data_modality", "infer_modality", "infer_token_modality", "token_set_input", "token_set_inputs"]


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
            patch grid fits its token count (:meth:`~lightning_gae.ImageTokens.infer`).
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
            raise ValueError(f"{caller}: EngineOptions(set_inputs={{{x!r}: {key!r}}}): the model inputs have no tensor {key!r}; "
                             f"they are {list(candidates)}")
        chosen = given.get(x)
        if chosen is None:
            guesses = [(k, ImageTokens.infer(v, size)) for k, v in candidates.items() if key in (None, k)]
            inferred = [(k, m) for k, m in guesses if m is not None]
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
                                 f"EngineOptions(set_inputs={{set: input key or tuple position}}) for the sets {list(sizes)}")
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
                         "EngineOptions(set_inputs={set: input key or tuple position})")
    return out


def token_set_input(inputs: Any, key: int | str) -> tuple[Tensor, Any]:
    """``(tensor, what the set's modality maps with)`` of the input at ``key`` (:func:`token_set_inputs`).

    The second is the tensor itself, or for ``input_ids`` among keyword inputs a mapping that also
    holds their ``attention_mask``, so that text padding is known.
    """
    if isinstance(inputs, Mapping):
        tensor = inputs[key]
    elif isinstance(inputs, (tuple, list)):
        if not isinstance(key, int):
            raise TypeError(f"inputs given as a tuple are found by position; got the key {key!r}")
        tensor = inputs[key]
    else:
        tensor = inputs
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) and key == "input_ids" else None
    with_mask = isinstance(mask, Tensor) and mask.shape == tensor.shape
    return tensor, ({"input_ids": tensor, "attention_mask": mask} if with_mask else tensor)


def infer_modality(model: nn.Module, inputs: Any) -> ImageTokens:
    """The :class:`~lightning_gae.ImageTokens` of a ViT-style model on square images, from one raw-attention pass.

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


def infer_token_modality(model: nn.Module, inputs: Any, num_tokens: int, holders: Sequence[Any] = (),
                         fit_on: Tensor | None = None) -> tuple[Modality | None, str | None]:
    """``(modality, note)`` for inputs that say it, with ``num_tokens`` tokens: integer token ids, one per token
    (:class:`~lightning_gae.TextTokens` with the ``tokenizer`` of the first of ``holders`` that has one; else the ids,
    padding by the model's ``config.pad_token_id``, removed by the attention mask where the inputs carry one);
    features ``[B, F]``, one per token after at most one prefix token (:class:`~lightning_gae.TabularTokens` named
    ``<input>[i]``, removed to their mean over ``fit_on``, the inputs' own samples by default); ``(None, None)``
    otherwise. ``note`` says what was guessed and how to set it where a user should hear it (None: nothing guessed)."""
    shown = display_input(inputs)
    if not isinstance(shown, Tensor) or shown.dim() != 2:
        return None, None
    keywords = keyword_inputs(inputs) or {}
    if not shown.is_floating_point() and shown.shape[1] == num_tokens:
        tokenizer = next((t for t in (getattr(h, "tokenizer", None) for h in holders)
                          if hasattr(t, "convert_ids_to_tokens")), None)
        if tokenizer is not None:
            return TextTokens(tokenizer), None
        mask = keywords.get("attention_mask")
        by_mask = isinstance(mask, Tensor) and mask.shape == shown.shape
        pad = next((c.pad_token_id for c in (getattr(m, "config", None) for m in model.modules())
                    if c is not None and isinstance(getattr(c, "pad_token_id", None), int)), None)
        text = TextTokens(pad_id=pad, removal="attention" if by_mask else "replace")
        return text, (f"the inputs are token ids, so modality={text!r} (removal={text.removal!r}); without a "
                      "tokenizer the tokens are drawn as ids and special tokens ([CLS], [SEP]) are not told apart: "
                      "pass modality=TextTokens(tokenizer), or give the module or its data module a `tokenizer` "
                      "attribute")
    features = shown.shape[1]
    if shown.is_floating_point() and 0 <= num_tokens - features <= 1:
        key = next((k for k, v in keywords.items() if v is shown), "x")
        read = shown if fit_on is None else fit_on
        table = TabularTokens([f"{key}[{i}]" for i in range(features)], prefix_tokens=num_tokens - features)
        table.fit(read.float())
        return table, (f"the inputs are {features} features, one token each, so modality={table!r} with the names "
                       f"{key}[0], ... and, for a removed feature, its mean over the {len(read)} validation samples "
                       "read; pass modality=TabularTokens(feature_names=[...], means=[...]) (the training set's means, "
                       "or .fit(train_features)) to set them")
    return None, None


def infer_data_modality(model: nn.Module, inputs: Any, holders: Sequence[Any] = ()) -> Modality:
    """The modality the inputs say, as :class:`~lightning_gae.callbacks.GAECallback` infers it: text or tabular
    (:func:`infer_token_modality`, the model's token count read from one sample), else square ViT-style images
    (:func:`infer_modality`).

    Raises:
        ValueError: none of these (the message names ``modality=``).
    """
    shown = display_input(inputs)
    if isinstance(shown, Tensor) and shown.dim() == 2 and shown.shape[0] > 0:
        probe = take(inputs, 0, 1, shown.shape[0])
        num_tokens = explain(model, probe, method="raw_attention").tokens.shape[1]
        found, _ = infer_token_modality(model, inputs, num_tokens, holders)
        if found is not None:
            return found
    return infer_modality(model, inputs)
