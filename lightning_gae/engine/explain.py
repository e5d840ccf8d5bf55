"""``explain()``: capture + forward + one ``autograd.grad`` + rules + readout, for a whole batch; the LRP
methods run their own forward and backward (:mod:`lightning_gae.lrp`)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_gae._structures import Target, eval_mode, map_tensors, model_logits
from lightning_gae.engine import rules
from lightning_gae.engine.capture import AttentionRecord, AttentionRecorder
from lightning_gae.engine.readout import (
    Explanation,
    Query,
    explaining,
    hide_own,
    keep_mask,
    readout_query,
    resolve_readout,
    target_scores,
)
from lightning_gae.engine.rules import attn_gradcam_vit_row
from lightning_gae.engine.token_sets import Streams, TokenSets, assign_token_sets
from lightning_gae.lrp import attnlrp, transformer_attribution

__all__ = ["Explanation", "LRP_METHODS", "allow_slow_attention_flow", "attention_flow_seconds", "explain", "eval_mode", "METHODS", "map_tensors", "model_logits"]

Method = Literal["gae", "rollout", "raw_attention", "attn_gradcam", "attn_gradcam_vit", "attention_flow", "attnlrp", "transformer_attribution"]
METHODS: tuple[str, ...] = ("gae", "rollout", "raw_attention", "attn_gradcam", "attn_gradcam_vit", "attention_flow")
"""The attention methods, read from the recorded attention maps: every ``method=`` of :func:`explain` but
the LRP ones. Each is described, with its equation and cost, on the documentation's methods page."""
# Relevance propagation through the whole model rather than through the attention maps: explain() takes
# them, METHODS (the attention methods that compare, the callback and the attribution table run) does not.
LRP_METHODS: tuple[str, ...] = ("attnlrp", "transformer_attribution")
"""The methods that propagate relevance through the whole model (LRP) rather than through the attention maps:
AttnLRP (Achtibat et al., ICML 2024) and Transformer Attribution (Chefer, Gur & Wolf, CVPR 2021). :func:`explain`
takes them as ``method=``; LRP is patented for commercial use (see the methods page)."""
_NEEDS_GRAD = {"gae", "attn_gradcam", "attn_gradcam_vit"}
_LAST_LAYER_ONLY = {"raw_attention", "attn_gradcam", "attn_gradcam_vit"}

def _on_device(tensors: Sequence[Tensor], device: torch.device) -> list[Tensor]:
    """Every tensor on ``device``: a model split across devices (``device_map``) records each layer on its own."""
    return [t.to(device) for t in tensors]


def _unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper runs: its forward is what the capture must see, in eager mode."""
    if "torch._dynamo" not in sys.modules:  # nothing was compiled; importing Dynamo would cost a second
        return model
    while isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        model = model._orig_mod
    return model


def _refuse_folded_batch(records: Sequence[AttentionRecord], batch: int) -> None:
    """Raise for attention whose leading dim is not the batch: windows or heads folded into it."""
    for rec in records:
        if rec.batch_size != batch:
            folded = f" = {batch} x {rec.batch_size // batch}" if batch and rec.batch_size % batch == 0 else ""
            raise ValueError(
                f"attention at {rec.path or '<model>'!r} has leading dimension {rec.batch_size}{folded} for a batch of "
                f"{batch} (probabilities {list(rec.tensor.shape)}): the model attends within windows (Swin-style) or "
                "folds heads or windows into the batch before the softmax. explain() needs each sample's attention over "
                "all its tokens, so windowed and batch-folded attention are not supported (docs/troubleshooting.md#windowed-attention)."
            )


def _pooling_warning(model: nn.Module, query: Query) -> None:
    """Warn when token 0 is read but the model's head pools all tokens instead of reading a CLS token."""
    if not (query is None or (isinstance(query, int) and query == 0)):  # None: the default readout, token 0 here
        return
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_mean_pooling", False) is True:
            reason = f"{type(module).__name__} pools the mean of its tokens (config.use_mean_pooling=True)"
        elif getattr(module, "global_pool", None) in ("avg", "avgmax", "max"):
            reason = f"{type(module).__name__} pools its tokens (global_pool={module.global_pool!r})"
        else:
            continue
        warnings.warn(
            f"{reason}, so its prediction is not read from token 0, the row explained with query=0; "
            "explain the pooled tokens with query=\"mean\"",
            UserWarning,
            stacklevel=3,
        )
        return


def _attended(layers: Sequence[AttentionRecord]) -> Tensor:
    """``[B, N]`` bool: keys that some query of some head of some layer attends to.

    A masked (padded) key gets exactly zero probability everywhere; this finds padding that no
    recognised keyword marks, e.g. a mask the model extends with its own prefix tokens.
    """
    with torch.no_grad():
        seen = []
        for rec in layers:
            if rec.lean is not None:
                # A lean call keeps no probabilities; its mask told which keys are open.
                attended = rec.lean.attended
                seen.append(torch.ones(rec.batch_size, rec.num_keys, dtype=torch.bool, device=rec.tensor.device)
                            if attended is None else attended.to(rec.tensor.device))
            else:
                seen.append((rec.as_heads() > 0).any(dim=1).any(dim=1))
        seen = _on_device(seen, layers[0].tensor.device)
        return torch.stack(seen).any(dim=0)


def _gae_backward(score: Tensor, layers: list[AttentionRecord], recorder: AttentionRecorder,
                  row_start: Tensor | None) -> tuple[list[Tensor] | None, Tensor | None]:
    """The one backward pass of GAE: ``(Ā per call, None)``, or ``(None, relevance row)``.

    With ``row_start`` (a single token set whose calls are all lean), the row form of Eq. 6 runs
    inside the backward pass (:mod:`lightning_gae.engine.lean`) and nothing ``N x N`` is kept. Otherwise
    lean calls leave their ``Ā`` in the backward pass and recorded probabilities get theirs from
    their gradient (Eq. 5).
    """
    state = recorder.lean_state
    lean = [r for r in layers if r.lean is not None]
    explicit = [r for r in layers if r.lean is None]
    if state is not None:
        # Every SDPA call of the forward runs the lean backward; only the selected ones may add to R.
        state.calls = {r.lean.index for r in lean}
    if state is not None and row_start is not None:
        state.mode, state.row = "row", row_start
    tokens = list(recorder.lean_tokens.values()) if lean else []
    wanted = tokens + [r.tensor for r in explicit]
    found = torch.autograd.grad(score.sum(), wanted, allow_unused=True)
    if state is not None:
        state.workspace = []  # the backward's buffers are not needed past it
    if state is not None and row_start is not None:
        if state.order != sorted(state.order, reverse=True):
            raise _OutOfOrder
        return None, state.row
    grads = dict(zip((r.index for r in explicit), found[len(tokens):]))
    abars = []
    for rec in layers:
        if rec.lean is not None:
            abar = state.abars.get(rec.lean.index)
            abars.append(abar if abar is not None else
                         torch.zeros(rec.batch_size, rec.num_queries, rec.num_keys, device=rec.tensor.device))
        else:
            g = grads[rec.index]
            abars.append(rules.avg_heads(rec.as_heads(), rec.as_heads(torch.zeros_like(rec.tensor) if g is None else g)))
    return abars, None


class _OutOfOrder(Exception):
    """The backward pass did not visit the attention calls last first; the row form cannot run in it."""


# Attention flow's cost: one max-flow per (sample, input token) on a graph of about L·N² edges.
# Measured on the project's shared 2-core CPU (random-init ViT, SciPy's Dinic, the flows alone): per
# sample 3-5 ms at N = 17, 60-100 ms at N = 65 and 1.4 s / 2.5 s at N = 257 tokens with 4 / 6 layers
# (rollout: under 1 ms), i.e. about 3e-8 s per edge plus 2e-4 s per max-flow. Above ATTENTION_FLOW_MAX_SECONDS estimated
# for one call, explain() refuses unless the call runs inside allow_slow_attention_flow().
ATTENTION_FLOW_SECONDS_PER_EDGE = 3e-8
ATTENTION_FLOW_SECONDS_PER_FLOW = 2e-4
ATTENTION_FLOW_MAX_SECONDS = 60.0
_SLOW_FLOW_ALLOWED: ContextVar[bool] = ContextVar("lightning_gae_slow_attention_flow", default=False)


@contextmanager
def allow_slow_attention_flow() -> Iterator[None]:
    """Let ``method="attention_flow"`` run on any size inside the block (by default a call estimated
    above :data:`ATTENTION_FLOW_MAX_SECONDS` raises a ``ValueError`` instead of running for minutes).

    It covers every ``explain`` call made in the block, also those made by ``compare`` and the
    callback::

        from lightning_gae.engine.explain import allow_slow_attention_flow

        with allow_slow_attention_flow():
            exp = lightning_gae.explain(model, inputs, method="attention_flow")
    """
    token = _SLOW_FLOW_ALLOWED.set(True)
    try:
        yield
    finally:
        _SLOW_FLOW_ALLOWED.reset(token)


def attention_flow_seconds(samples: int, tokens: int, layers: int) -> float:
    """The estimated seconds of attention flow for ``samples`` sequences of ``tokens`` tokens and ``layers``
    attention layers: ``samples·tokens`` max-flows of ``(layers-1)·tokens² + tokens`` edges each."""
    edges = (layers - 1) * tokens**2 + tokens
    return samples * tokens * (edges * ATTENTION_FLOW_SECONDS_PER_EDGE + ATTENTION_FLOW_SECONDS_PER_FLOW)


def _check_attention_flow(sets: TokenSets, query_index: Tensor, batch: int) -> None:
    """Refuse what attention flow does not define (several token sets, a mean readout) and, unless
    :func:`allow_slow_attention_flow` is active, a call estimated to take minutes."""
    if len(sets.sizes) != 1:
        raise ValueError(
            f"method='attention_flow' is defined on one token set (the layered graph of one sequence's self-attention); "
            f"this model has the token sets {sorted(sets.sizes)}. Use 'rollout' (attention flow's path-sum "
            "approximation, which follows the calls across token sets) or 'gae'"
        )
    if query_index.is_floating_point():
        raise ValueError("method='attention_flow' is a max flow into one readout token, and query='mean' reads none; "
                         "pass a token index (or 'last'), or use 'rollout' for a mean-pooled model")
    tokens, layers = sets.sizes[sets.query_set], len(sets.records)
    seconds = attention_flow_seconds(batch, tokens, layers)
    if seconds > ATTENTION_FLOW_MAX_SECONDS and not _SLOW_FLOW_ALLOWED.get():
        edges = (layers - 1) * tokens**2 + tokens
        raise ValueError(
            f"method='attention_flow' on {tokens} tokens x {layers} layers x {batch} samples is {batch * tokens} "
            f"max-flow problems on graphs of {layers * tokens + 1} nodes and {edges} edges, about {seconds:.0f} s "
            f"(estimated at {ATTENTION_FLOW_SECONDS_PER_EDGE:g} s per edge and max-flow; the limit is "
            f"{ATTENTION_FLOW_MAX_SECONDS:g} s). Use method='rollout', its cheap approximation, explain fewer samples "
            "per call, or run it anyway inside `with allow_slow_attention_flow():` "
            "(`from lightning_gae.engine.explain import allow_slow_attention_flow`)"
        )


def _relevance_row(method: str, layers: list[AttentionRecord], grads: list[Tensor], query: Tensor, keep: Tensor,
                   abars: list[Tensor] | None = None) -> Tensor:
    """One token set: the row form (the fast path). ``query`` is ``[B]`` indices or a float start row."""
    if method == "gae":
        return rules.gae_relevance_row(_on_device(abars, query.device), query)
    # A model split across devices (device_map) records each layer on its own device.
    attns = _on_device([rec.as_heads() for rec in layers], query.device)
    grads = _on_device(grads, query.device)
    if method == "rollout":
        return rules.rollout_row(attns, query)
    if method == "raw_attention":
        return rules.raw_attention_row(attns[-1], query)
    if method == "attention_flow":
        # Padded tokens send nothing past their own node and the query's own entry is dropped: not solved.
        own = torch.nn.functional.one_hot(query, keep.shape[1]).bool()
        return rules.attention_flow_row(attns, query, sources=keep & ~own)
    if method == "attn_gradcam_vit":
        if query.is_floating_point():
            raise ValueError("method='attn_gradcam_vit' weighs heads by the gradient of one query row; pass a token index, not query='mean'")
        return attn_gradcam_vit_row(attns[-1], grads[-1], query, keep)
    return rules.attn_gradcam_row(attns[-1], grads[-1], query, keep)


def _set_maps(method: str, sets: TokenSets, grads: list[Tensor], keeps: dict[str, Tensor],
              abars: list[Tensor] | None = None) -> list[Tensor]:
    """Per call, the ``[B, Nq, Nk]`` map the rules propagate: ``Ā`` (Eq. 5) or the head-mean attention."""
    if method == "gae":
        return list(abars)
    maps = []
    for i, rec in enumerate(sets.records):
        attn = rec.as_heads()
        if method == "attn_gradcam":
            maps.append(rules.attn_gradcam_map(attn.to(torch.float32), grads[i].to(torch.float32),
                                               keeps[sets.query_sets[i]], keeps[sets.key_sets[i]]))
        else:
            maps.append(attn.to(torch.float32).mean(dim=1))
    return maps


def _readers(sets: TokenSets) -> dict[str, str]:
    """For every set, the set whose token it is read from: its pooling token, the query set it is
    joined to by cross-attention, or itself (a tower read at its own token)."""
    reader = {}
    for x in sets.sizes:
        if x in sets.pools:
            reader[x] = sets.pools[x]
        elif sets.joined(x, sets.query_set):
            reader[x] = sets.query_set
        else:
            reader[x] = x
    return reader


def _multi_set_rows(method: str, sets: TokenSets, grads: list[Tensor], keeps: dict[str, Tensor],
                    starts: dict[str, Tensor], abars: list[Tensor] | None = None) -> dict[str, Tensor]:
    """Readout rows of every set for a model with several token sets (section 6-7b of GAE_SPEC.md).

    ``starts`` maps the sets read at their own token (the query set, towers, pooling sets) to their
    start rows/indices. A set joined to the query set by cross-attention is read from ``R^{Q,x}``;
    a tower is read from its own ``R^{xx}``; a pooled tower from its pooling token's ``R^{p,x}``.
    """
    if method == "attn_gradcam_vit":
        raise ValueError("method='attn_gradcam_vit' is defined on one token set (the ViT baseline); use 'attn_gradcam' for models with several sets")
    maps = _set_maps(method, sets, grads, keeps, abars)
    steps = list(zip(sets.query_sets, sets.key_sets, maps))
    reader = _readers(sets)
    rows: dict[str, Tensor] = {}
    if method in _LAST_LAYER_ONLY:
        # The last call whose queries are the reading set and whose keys are x.
        for x in sets.sizes:
            r = reader[x]
            last = max((i for i, (q, k) in enumerate(zip(sets.query_sets, sets.key_sets)) if q == r and k == x), default=None)
            if last is None:
                continue
            rows[x] = rules.query_rows(maps[last], starts[r])
        return rows
    relevance = rules.token_set_relevance(steps, sets.sizes, rollout=method == "rollout")
    for x in sets.sizes:
        r = reader[x]
        matrix = relevance.get((r, x))
        if matrix is not None:
            # A set read at its own token gets R̂ = R − I: its identity entry is removed anyway.
            rows[x] = rules.query_rows(matrix, starts[r])
            if r == x:
                rows[x] = rows[x] + starts[x] if starts[x].is_floating_point() else rows[x]
    return rows


def explain(
    model: nn.Module,
    inputs: Any,
    target: Target = None,
    method: Method = "gae",
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
        method: ``"gae"`` (Eq. 5-11), ``"rollout"``, ``"raw_attention"``, ``"attn_gradcam"`` (heads
            weighted by their whole gradient map's mean, the LXMERT/GAE code) or ``"attn_gradcam_vit"``
            (weighted by the readout row's gradient mean, the ViT baseline of the CVPR 2021 table) or
            ``"attention_flow"`` (Abnar & Zuidema's max flow through the layered attention graph: one
            token set, one readout token; one max-flow per token and sample, so a call estimated
            above a minute raises unless run inside :func:`allow_slow_attention_flow`) or ``"attnlrp"``
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
        An :class:`Explanation`: ``tokens`` is the query set's float32 ``[B, N]`` row and
        ``relevance`` maps every token set to its ``[B, N_set]`` row.

    Raises:
        ValueError: unknown method, bad target or query, no attention recorded (the message says
            what the forward did), windowed or batch-folded attention, attention the engine
            cannot propagate or assign to token sets (the message names the module and the fix), or
            ``"attention_flow"`` on several token sets, with ``query="mean"`` or on a size it would
            take minutes on (see :func:`allow_slow_attention_flow`); ``"attnlrp"`` without a word
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
    methods: Sequence[Method],
    target: Target = None,
    query: Query | Mapping[str, Query] | None = None,
    attention_modules: Sequence[str] | str | None = None,
    streams: Streams | None = None,
    embedding_layer: nn.Module | str | None = None,
) -> dict[str, Explanation]:
    """:func:`explain` with several methods from one recorded forward (and at most one backward).

    Each value equals ``explain(..., method=m)``; the forward, the token sets and the gradients are
    shared, which is what the callback and ``compare`` pay for once per batch instead of per method.
    GAE alone takes the memory-lean path; with other methods the probabilities are recorded once.
    ``"attnlrp"`` runs its own forward and backward (its forward computes different gradients).
    """
    methods = tuple(dict.fromkeys(methods))
    unknown = [m for m in methods if m not in METHODS + LRP_METHODS]
    if unknown or not methods:
        raise ValueError(f"method={unknown[0] if unknown else methods!r}; choose one of {METHODS + LRP_METHODS}")
    model = _unwrap_compiled(model)
    _pooling_warning(model, query)
    # A target or query made under torch.inference_mode (an answer row's label) cannot index the graph's tensors:
    # copies made outside it can (the inputs are copied so by readout.explaining).
    with torch.inference_mode(False):
        target, query = (map_tensors(v, lambda t: t.clone() if t.is_inference() else t) for v in (target, query))
    lrp_runs = {"attnlrp": lambda: attnlrp.explain(model, inputs, target, query, embedding_layer),
                "transformer_attribution": lambda: transformer_attribution.explain(model, inputs, target, query, embedding_layer)}
    found: dict[str, Explanation] = {m: lrp_runs[m]() for m in methods if m in lrp_runs}
    rest = tuple(m for m in methods if m not in LRP_METHODS)
    if rest:
        try:
            found.update(_explain(model, inputs, target, rest, query, attention_modules, streams, lean=rest == ("gae",)))
        except _OutOfOrder:
            found.update(_explain(model, inputs, target, rest, query, attention_modules, streams, lean=False))
    return {m: found[m] for m in methods}


def _explain(model: nn.Module, inputs: Any, target: Target, methods: tuple[str, ...], query: Any,
             attention_modules: Sequence[str] | str | None, streams: Streams | None, lean: bool) -> dict[str, Explanation]:
    # The graph is built for every method: token sets are told apart by following it.
    with explaining(model, inputs) as (args, kwargs):
        with AttentionRecorder(model, attention_modules, lean=lean) as recorder:
            output = model(*args, **kwargs)
        if not recorder.records:
            raise ValueError(f"no attention was recorded from {type(model).__name__}: {recorder.describe()}")
        logits = model_logits(output)
        batch = recorder.records[0].batch_size if logits is None else logits.shape[0]
        _refuse_folded_batch(recorder.records, batch)
        sets = assign_token_sets(recorder.records, model, streams)
        layers = sets.records
        device = layers[0].tensor.device
        single = len(sets.sizes) == 1
        if single:
            num_tokens = layers[0].num_queries
            keep = keep_mask(kwargs, batch, num_tokens, args)
            keeps = {sets.query_set: _attended(layers) if keep is None else keep.to(device)}
        else:
            keeps = {}
            for x in sets.sizes:
                used = [r for r, k in zip(layers, sets.key_sets) if k == x]
                keeps[x] = _attended(used) if used else torch.ones(batch, sets.sizes[x], dtype=torch.bool, device=device)
        per_set = dict(query) if isinstance(query, Mapping) else {}
        main_query = per_set.pop(sets.query_set, None) if isinstance(query, Mapping) else query
        if main_query is None:
            main_query = sets.queries.get(sets.query_set, 0)
        starts = {sets.query_set: readout_query(resolve_readout(main_query, kwargs, args), batch, sets.sizes[sets.query_set],
                                               keeps[sets.query_set], device)}
        for x in sets.sizes:
            if x != sets.query_set:
                readout = per_set.get(x, sets.queries.get(x, 0))
                starts[x] = readout_query(resolve_readout(readout, kwargs, args), batch, sets.sizes[x], keeps[x], device)
        query_index = starts[sets.query_set]
        if "attention_flow" in methods:
            _check_attention_flow(sets, query_index, batch)
        score, target_index = target_scores(output, logits, target, query_index, batch)

        if any(m in _NEEDS_GRAD for m in methods) and not score.requires_grad:
            raise ValueError("the explained score does not depend on the attention (no gradient path); check target")
        lean_row: Tensor | None = None
        abars: list[Tensor] | None = None
        all_grads: list[Tensor] = []
        if lean:
            all_lean = all(r.lean is not None for r in layers)
            row_start = rules.start_rows(query_index, sets.sizes[sets.query_set]) if single and all_lean else None
            abars, lean_row = _gae_backward(score, layers, recorder, row_start)
        elif any(m in _NEEDS_GRAD for m in methods):
            # One backward for every gradient method: to every call when GAE or several sets need them all.
            wanted = layers if "gae" in methods or not single else layers[-1:]
            found = torch.autograd.grad(score.sum(), [r.tensor for r in wanted], allow_unused=True)
            all_grads = [rec.as_heads(torch.zeros_like(rec.tensor) if g is None else g) for rec, g in zip(wanted, found)]
            if "gae" in methods:
                abars = [rules.avg_heads(rec.as_heads(), g) for rec, g in zip(layers, all_grads)]
        explanations = {}
        for method in methods:
            used_layers = layers[-1:] if single and method in _LAST_LAYER_ONLY else layers
            grads = all_grads[-len(used_layers):] if method in _NEEDS_GRAD and method != "gae" else []
            with torch.no_grad():
                if lean_row is not None:
                    rows = {sets.query_set: lean_row}
                elif single:
                    rows = {sets.query_set: _relevance_row(method, used_layers, grads, query_index, keeps[sets.query_set], abars)}
                else:
                    rows = _multi_set_rows(method, sets, grads, keeps, starts, abars)
                relevance = {}
                for x, row in rows.items():
                    if x in sets.pools.values():
                        continue
                    own = single or _readers(sets)[x] == x
                    row = hide_own(row, starts[x]) if own else row
                    relevance[x] = row.masked_fill(~keeps[x], 0.0).to(torch.float32).detach()
            tokens = relevance.get(sets.query_set)
            if tokens is None:
                tokens = next(iter(relevance.values()))
            explanations[method] = Explanation(
                tokens=tokens,
                logits=None if logits is None else logits.detach(),
                target=target_index,
                score=score.detach(),
                method=method,
                layers=[rec.path for rec in used_layers],
                query=None if query_index.is_floating_point() else query_index,
                relevance=relevance,
                query_set=sets.query_set,
            )
    return explanations
