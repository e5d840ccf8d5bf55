"""``explain()`` and ``explain_methods()``: each method run by its registered facts and rule.

The attention methods of a call share one recorded forward and at most one backward
(:func:`~lightning_gae.engine.forward.recorded_forward`); each reads its relevance from it with its rule. The LRP
methods run their own forward and backward (:mod:`lightning_gae.lrp`). Nothing here knows a method by its name:
the registry (:mod:`lightning_gae.methods.registry`) says what each needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from lightning_gae._structures import Target
from lightning_gae.engine.forward import OutOfOrder, prepared, recorded_forward
from lightning_gae.engine.readout import Explanation, Query
from lightning_gae.engine.token_sets import Streams
from lightning_gae.methods.registry import Method, get_method, method_names

__all__ = ["explain", "explain_methods"]


def explain(
    model: nn.Module,
    inputs: Any,
    target: Target = None,
    method: str = "gae",
    query: Query | Mapping[str, Query] | None = None,
    attention_modules: Sequence[str] | str | None = None,
    streams: Streams | None = None,
    embedding_layer: nn.Module | str | None = None,
) -> Explanation:
    """Explain ``model``'s prediction on a batch with GAE (or a baseline): one forward, one backward.

    Args:
        model: any ``nn.Module`` whose attention goes through ``F.scaled_dot_product_attention``,
            ``nn.MultiheadAttention`` or a softmax followed by a matmul, or whose probability
            modules are named in ``attention_modules``. It is not modified. A model compiled with
            ``torch.compile``, or one holding compiled submodules, is explained by running the original
            modules eagerly.
        inputs: a tensor (``model(x)``), a tuple (``model(*x)``) or a mapping of keyword arguments
            (``model(**x)``, e.g. a tokenizer's output). An ``attention_mask`` (1 = token) or
            ``src_key_padding_mask`` / ``key_padding_mask`` (True = pad) among them marks padding.
        target: what to explain: None (each sample's argmax), an int, one class per sample, or a
            callable ``output -> Tensor[B]`` returning any scalar per sample.
        method: a registered method that explains (:func:`~lightning_gae.methods.method_names` of the kinds
            ``"attention"`` and ``"lrp"``, a method you registered included): ``"gae"`` (Eq. 5-11), ``"rollout"``, ``"raw_attention"``, ``"attn_gradcam"`` (heads
            weighted by their whole gradient map's mean, the LXMERT/GAE code) or ``"attn_gradcam_vit"``
            (weighted by the readout row's gradient mean, the ViT baseline of the CVPR 2021 table) or
            ``"attention_flow"`` (Abnar & Zuidema's max flow through the layered attention graph: one
            token set, one readout token; one max-flow per token and sample, so a call estimated
            above a minute raises unless run inside :func:`~lightning_gae.allow_slow_attention_flow`) or ``"attnlrp"``
            (AttnLRP, :mod:`lightning_gae.lrp`) or ``"transformer_attribution"`` (Chefer et al. 2021).
        query: the token of the query set whose relevance row is read: an index (a decoder
            position for encoder-decoders; default: the family's readout where a preset knows it,
            such as BART classifiers' last EOS, else 0, the CLS token), ``"last"`` (the last real token),
            ``"mean"`` (the mean of the real tokens' rows, for mean-pooled models) or one index per
            sample. A mapping ``{set: query}`` sets the readout of several sets (towers).
        attention_modules: glob patterns over module paths selecting the attention to explain:
            modules whose output is the probability tensor (e.g. ``"blocks.*.attn.attn_drop"``,
            for attention the automatic capture does not see), or modules that compute attention
            (their recorded calls are used; a module that a fused kernel replaced selects the
            calls of its parent). See :class:`lightning_gae.engine.capture.AttentionRecorder`.
        streams: a :class:`~lightning_gae.Streams` declaring the token sets, for models with
            several sets that no preset or data-flow inference assigns.
        embedding_layer: for ``"attnlrp"``: the word-embedding module (or its path) whose output is
            explained; default: the model's Hugging Face ``get_input_embeddings()``.

    Returns:
        An :class:`~lightning_gae.Explanation`: ``tokens`` is the query set's float32 ``[B, N]`` row and
        ``relevance`` maps every token set to its ``[B, N_set]`` row.

    Raises:
        ValueError: unknown method, bad target or query, no attention recorded (the message says
            what the forward did), windowed or batch-folded attention, attention the engine
            cannot propagate or assign to token sets (the message names the module and the fix), or
            ``"attention_flow"`` on several token sets, with ``query="mean"`` or on a size it would
            take minutes on (see :func:`~lightning_gae.allow_slow_attention_flow`); ``"attnlrp"`` without a word
            embedding or through an operation it has no rule for (:class:`~lightning_gae.lrp.UnsupportedOperation`).

    Example:
        A model read at token 0 (here a bare ``nn.TransformerEncoder``, whose output the explained score is read
        from); the readout's own entry is 0:

        >>> import torch
        >>> from torch import nn
        >>> from lightning_gae import explain
        >>> layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
        >>> encoder = nn.TransformerEncoder(layer, num_layers=2).eval()
        >>> exp = explain(encoder, torch.randn(2, 5, 16))
        >>> exp.tokens.shape, exp.layers
        (torch.Size([2, 5]), ['layers.0.self_attn', 'layers.1.self_attn'])
        >>> exp.tokens[:, 0]
        tensor([0., 0.])

        Other models, as the guides show them: ``explain(vit, images).tokens[:, 1:].reshape(B, 14, 14)`` (patch
        relevance, CLS dropped); ``explain(bert, tokenizer(texts, padding=True, return_tensors="pt"),
        target=labels)``; ``explain(t5, batch, query=3).relevance["encoder"]`` (source relevance of decoder
        position 3).
    """
    return explain_methods(model, inputs, (method,), target, query, attention_modules, streams,
                           embedding_layer=embedding_layer)[method]


def explain_methods(
    model: nn.Module,
    inputs: Any,
    methods: Sequence[str],
    target: Target = None,
    query: Query | Mapping[str, Query] | None = None,
    attention_modules: Sequence[str] | str | None = None,
    streams: Streams | None = None,
    embedding_layer: nn.Module | str | None = None,
) -> dict[str, Explanation]:
    """:func:`explain` with several methods from one recorded forward (and at most one backward).

    Each value equals ``explain(..., method=m)``; the forward, the token sets and the gradients are
    shared, which is what the callback and ``compare`` pay for once per batch instead of per method.
    Lean methods alone (GAE) take the memory-lean path; with other methods the probabilities are recorded once.
    The LRP methods run their own forward and backward (their forward computes different gradients).
    """
    names = tuple(dict.fromkeys(methods))
    specs = [_explaining_method(m) for m in names]
    if not specs:
        raise ValueError(f"method={names!r}; choose one of {method_names('attention', 'lrp')}")
    model, target, query = prepared(model, target, query)
    # An LRP rule runs its own forward and backward; its explanation carries the name the method is registered by.
    found: dict[str, Explanation] = {
        m.name: replace(m.rule(model, inputs, target, query, embedding_layer), method=m.name)
        for m in specs if m.kind == "lrp"}
    attention = [m for m in specs if m.kind == "attention"]
    if attention:
        lean = all(m.lean for m in attention)
        try:
            found.update(_attention_methods(model, inputs, target, attention, query, attention_modules, streams, lean))
        except OutOfOrder:
            found.update(_attention_methods(model, inputs, target, attention, query, attention_modules, streams, False))
    return {m: found[m] for m in names}


def _explaining_method(name: str) -> Method:
    """The registered method ``name`` if :func:`explain` takes it; raises ``ValueError`` listing those otherwise."""
    try:
        method = get_method(name)
    except ValueError:
        method = None
    if method is None or not method.explains:
        raise ValueError(f"method={name!r}; choose one of {method_names('attention', 'lrp')}")
    return method


def _attention_methods(model: nn.Module, inputs: Any, target: Target, methods: Sequence[Method], query: Any,
                       attention_modules: Sequence[str] | str | None, streams: Streams | None,
                       lean: bool) -> dict[str, Explanation]:
    """The attention methods from one recorded forward: each one's refusal and check, the one backward they need,
    then each rule."""
    with recorded_forward(model, inputs, target, query, attention_modules, streams, lean=lean) as run:
        for method in methods:
            refusal = method.refusal(list(run.sets.sizes), run.query.is_floating_point())
            if refusal is not None:
                raise ValueError(refusal)
            if method.check is not None:
                method.check(run)
        if lean:
            run.lean_backward()
        elif any(m.needs_gradients for m in methods):
            run.backward(every_call=any(m.needs_gradients and not m.last_layer_only for m in methods))
        explanations = {}
        for method in methods:
            with torch.no_grad():
                rows = method.rule(run)
            explanations[method.name] = run.explanation(method.name, rows, method.last_layer_only)
    return explanations
