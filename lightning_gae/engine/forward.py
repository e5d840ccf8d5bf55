"""The recorded forward every attention method shares: capture, token sets, readout, explained score, and at most
one backward pass (:class:`RecordedForward`); each method's rule (:mod:`lightning_gae.methods`) reads its relevance
from what this left.

:func:`recorded_forward` runs the model once under the capture, tells the token sets apart, finds each set's real
tokens and readout row and the explained score; :meth:`RecordedForward.backward` takes the score's gradient at the
attention calls (or, on the memory-lean path, :meth:`RecordedForward.lean_backward` leaves GAE's ``Ā`` and row);
:meth:`RecordedForward.explanation` turns a rule's rows into an :class:`~lightning_gae.engine.readout.Explanation`.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_gae._structures import Target, eval_mode, map_tensors, model_logits
from lightning_gae.engine import rules
from lightning_gae.engine.capture import AttentionRecord, AttentionRecorder
from lightning_gae.engine.readout import (
    Explanation,
    Query,
    diverged,
    explaining,
    hide_own,
    keep_mask,
    readout_query,
    resolve_readout,
    target_scores,
)
from lightning_gae.engine.token_sets import Streams, TokenSets, assign_token_sets

# eval_mode, map_tensors and model_logits: the batch plumbing the benchmarks use, re-exported from a public module.
__all__ = ["OutOfOrder", "RecordedForward", "eval_mode", "map_tensors", "model_logits", "on_device", "prepared",
           "readers", "recorded_forward"]

Propagation = Literal["rules", "rollout", "last"]


def on_device(tensors: Sequence[Tensor], device: torch.device) -> list[Tensor]:
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
            stacklevel=4,
        )
        return


def prepared(model: nn.Module, target: Target, query: Any) -> tuple[nn.Module, Target, Any]:
    """What every method explains: the module a ``torch.compile`` wrapper runs, and the target and query as tensors a
    graph can index (copies of those made under ``torch.inference_mode``, e.g. an answer row's label); warns when
    token 0 is read from a model that pools its tokens."""
    model = _unwrap_compiled(model)
    _pooling_warning(model, query)
    with torch.inference_mode(False):
        target, query = (map_tensors(v, lambda t: t.clone() if t.is_inference() else t) for v in (target, query))
    return model, target, query


def attended_keys(layers: Sequence[AttentionRecord]) -> Tensor:
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
        seen = on_device(seen, layers[0].tensor.device)
        return torch.stack(seen).any(dim=0)


def _refuse_diverged(layers: Sequence[AttentionRecord], keep: Tensor) -> None:
    """A sample none of whose tokens any query attends to, with NaN or inf probabilities: a model that has diverged
    (the readout would otherwise take all its tokens for padding). Said before anything reads the sample."""
    empty = ~keep.any(dim=1)
    if not empty.any():
        return
    with torch.no_grad():
        broken = torch.zeros_like(empty)
        for rec in layers:
            if rec.lean is None and rec.batch_size == empty.shape[0]:
                broken |= ~torch.isfinite(rec.as_heads()).flatten(1).all(dim=1).to(broken.device)
    if (broken & empty).any():
        raise diverged("attention", (broken & empty).nonzero().flatten().tolist())


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
        state.calls = {call.index for call in (r.lean for r in lean) if call is not None}
    if state is not None and row_start is not None:
        state.mode, state.row = "row", row_start
    tokens = list(recorder.lean_tokens.values()) if lean else []
    wanted = tokens + [r.tensor for r in explicit]
    found = torch.autograd.grad(score.sum(), wanted, allow_unused=True)
    if state is not None:
        state.workspace = []  # the backward's buffers are not needed past it
    if state is not None and row_start is not None:
        if state.order != sorted(state.order, reverse=True):
            raise OutOfOrder
        return None, state.row
    grads = dict(zip((r.index for r in explicit), found[len(tokens):]))
    abars = []
    for rec in layers:
        if rec.lean is not None:
            assert state is not None  # a lean call is recorded only by a recorder with a lean state
            abar = state.abars.get(rec.lean.index)
            abars.append(abar if abar is not None else
                         torch.zeros(rec.batch_size, rec.num_queries, rec.num_keys, device=rec.tensor.device))
        else:
            g = grads[rec.index]
            abars.append(rules.avg_heads(rec.as_heads(), rec.as_heads(torch.zeros_like(rec.tensor) if g is None else g)))
    return abars, None


class OutOfOrder(Exception):
    """The backward pass did not visit the attention calls last first; GAE's row form cannot run in it (explain
    again with ``lean=False``)."""


def readers(sets: TokenSets) -> dict[str, str]:
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


@dataclass
class RecordedForward:
    """One recorded forward of a batch, and its backward once asked for: what an attention method's rule reads.

    Attributes:
        sets: the token sets; ``sets.records`` are the attention calls explained, in call order, and
            ``sets.query_sets`` / ``sets.key_sets`` each call's sets.
        keeps: per token set, ``[B, N_set]`` bool, its real (not padded) tokens.
        starts: per token set read at its own token, its readout: ``[B]`` token indices, or a float ``[B, N_set]``
            start row (``query="mean"``).
        score: ``[B]`` the explained score ``y_t`` (in the graph until the backward ran).
        target: ``[B]`` the classes explained (None for a callable target).
        logits: the model's logits (None when its output has none).
        gradients: after :meth:`backward`, the score's gradient at the calls' probabilities as heads
            ``[B, H, Nq, Nk]``, aligned with the *last* calls (every call, or the last only when no method asked
            for more); empty before.
        lean_abars: after :meth:`lean_backward`, ``Ā`` per call (Eq. 5), else None.
        lean_row: after :meth:`lean_backward` on one token set of lean calls, GAE's relevance row, else None.
    """

    sets: TokenSets
    keeps: dict[str, Tensor]
    starts: dict[str, Tensor]
    score: Tensor
    target: Tensor | None
    logits: Tensor | None
    recorder: AttentionRecorder = field(repr=False)
    gradients: list[Tensor] = field(default_factory=list)
    lean_abars: list[Tensor] | None = None
    lean_row: Tensor | None = None

    @property
    def records(self) -> list[AttentionRecord]:
        return self.sets.records

    @property
    def single(self) -> bool:
        """One token set (the row form); else :meth:`set_rows` propagates across the sets."""
        return len(self.sets.sizes) == 1

    @property
    def query_set(self) -> str:
        return self.sets.query_set

    @property
    def query(self) -> Tensor:
        """The query set's readout, ``[B]`` indices or a float ``[B, N]`` start row for ``query="mean"``."""
        return self.starts[self.sets.query_set]

    @property
    def keep(self) -> Tensor:
        """``[B, N]`` bool: the query set's real tokens."""
        return self.keeps[self.sets.query_set]

    def used(self, last_only: bool = False) -> list[AttentionRecord]:
        """The calls a method reads: every call, or the last one alone on a single token set."""
        return self.records[-1:] if last_only and self.single else self.records

    def attentions(self, last_only: bool = False) -> list[Tensor]:
        """The probabilities of the calls read (:meth:`used`) as heads ``[B, H, Nq, Nk]``, on the readout's device."""
        return on_device([rec.as_heads() for rec in self.used(last_only)], self.query.device)

    def attention_gradients(self, last_only: bool = False) -> list[Tensor]:
        """Their gradients (:attr:`gradients`, after :meth:`backward`), aligned with :meth:`attentions`."""
        return on_device(self.gradients[-len(self.used(last_only)):], self.query.device)

    def abars(self) -> list[Tensor]:
        """``Ā`` per call (Eq. 5): the lean backward's, else from the recorded probabilities and their gradients."""
        if self.lean_abars is not None:
            return self.lean_abars
        return [rules.avg_heads(rec.as_heads(), g) for rec, g in zip(self.records, self.gradients)]

    def head_means(self) -> list[Tensor]:
        """Per call, the float32 head-mean attention ``[B, Nq, Nk]``: the map rollout and raw attention propagate."""
        return [rec.as_heads().to(torch.float32).mean(dim=1) for rec in self.records]

    def backward(self, every_call: bool) -> None:
        """One ``autograd.grad`` of the summed score at the calls' probabilities (:attr:`gradients`): at every call
        when ``every_call`` or the model has several token sets, else at the last one only."""
        self._require_gradient_path()
        wanted = self.records if every_call or not self.single else self.records[-1:]
        found = torch.autograd.grad(self.score.sum(), [r.tensor for r in wanted], allow_unused=True)
        self.gradients = [rec.as_heads(torch.zeros_like(rec.tensor) if g is None else g) for rec, g in zip(wanted, found)]

    def lean_backward(self) -> None:
        """GAE's backward on the memory-lean path (:attr:`lean_abars`, :attr:`lean_row`); raises ``OutOfOrder``
        when the backward did not visit the calls last first."""
        self._require_gradient_path()
        all_lean = all(r.lean is not None for r in self.records)
        row_start = rules.start_rows(self.query, self.sets.sizes[self.query_set]) if self.single and all_lean else None
        self.lean_abars, self.lean_row = _gae_backward(self.score, self.records, self.recorder, row_start)

    def _require_gradient_path(self) -> None:
        if not self.score.requires_grad:
            raise ValueError("the explained score does not depend on the attention (no gradient path); check target")

    def set_rows(self, maps: Sequence[Tensor], propagation: Propagation = "rules") -> dict[str, Tensor]:
        """Readout rows of every set for a model with several token sets (section 6-7b of GAE_SPEC.md).

        ``maps`` are per call the ``[B, Nq, Nk]`` map propagated: ``Ā`` (Eq. 5) for GAE, the head mean for rollout.
        ``propagation``: ``"rules"`` (Eq. 6-11), ``"rollout"`` (the same with rollout's step) or ``"last"`` (the
        last call whose queries are the reading set and whose keys are the set, read as it is). A set joined to
        the query set by cross-attention is read from ``R^{Q,x}``; a tower from its own ``R^{xx}``; a pooled tower
        from its pooling token's ``R^{p,x}``.
        """
        sets, starts = self.sets, self.starts
        reader = readers(sets)
        rows: dict[str, Tensor] = {}
        if propagation == "last":
            for x in sets.sizes:
                r = reader[x]
                last = max((i for i, (q, k) in enumerate(zip(sets.query_sets, sets.key_sets)) if q == r and k == x), default=None)
                if last is None:
                    continue
                rows[x] = rules.query_rows(maps[last], starts[r])
            return rows
        steps = list(zip(sets.query_sets, sets.key_sets, maps))
        relevance = rules.token_set_relevance(steps, sets.sizes, rollout=propagation == "rollout")
        for x in sets.sizes:
            r = reader[x]
            matrix = relevance.get((r, x))
            if matrix is not None:
                # A set read at its own token gets R̂ = R − I: its identity entry is removed anyway.
                rows[x] = rules.query_rows(matrix, starts[r])
                if r == x:
                    rows[x] = rows[x] + starts[x] if starts[x].is_floating_point() else rows[x]
        return rows

    def explanation(self, method: str, rows: Tensor | Mapping[str, Tensor], last_only: bool = False) -> Explanation:
        """The :class:`~lightning_gae.Explanation` of a rule's rows: the query set's row (a tensor) or rows per set; the readout's
        own entry and padding set to 0, float32, detached. ``last_only``: the method read the last call alone."""
        sets = self.sets
        rows = {sets.query_set: rows} if isinstance(rows, Tensor) else rows
        relevance = {}
        with torch.no_grad():
            for x, row in rows.items():
                if x in sets.pools.values():
                    continue
                own = self.single or readers(sets)[x] == x
                row = hide_own(row, self.starts[x]) if own else row
                relevance[x] = row.masked_fill(~self.keeps[x], 0.0).to(torch.float32).detach()
        tokens = relevance.get(sets.query_set)
        if tokens is None:
            tokens = next(iter(relevance.values()))
        return Explanation(
            tokens=tokens,
            logits=None if self.logits is None else self.logits.detach(),
            target=self.target,
            score=self.score.detach(),
            method=method,
            layers=[rec.path for rec in self.used(last_only)],
            query=None if self.query.is_floating_point() else self.query,
            relevance=relevance,
            query_set=sets.query_set,
        )


@contextmanager
def recorded_forward(model: nn.Module, inputs: Any, target: Target, query: Query | Mapping[str, Query] | None,
                     attention_modules: Sequence[str] | str | None, streams: Streams | None,
                     lean: bool = False) -> Iterator[RecordedForward]:
    """One forward of ``model`` under the capture (``lean``: the memory-lean path, which keeps no probabilities),
    inside :func:`~lightning_gae.engine.readout.explaining` (eval mode, gradients on, fresh inputs): the
    :class:`RecordedForward` of the batch, valid inside the block. See :func:`lightning_gae.explain` for the
    arguments."""
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
        if len(sets.sizes) == 1:
            num_tokens = layers[0].num_queries
            keep = keep_mask(kwargs, batch, num_tokens, args)
            keeps = {sets.query_set: attended_keys(layers) if keep is None else keep.to(device)}
        else:
            keeps = {}
            for x in sets.sizes:
                used = [r for r, k in zip(layers, sets.key_sets) if k == x]
                keeps[x] = attended_keys(used) if used else torch.ones(batch, sets.sizes[x], dtype=torch.bool, device=device)
        for keep in keeps.values():
            _refuse_diverged(layers, keep)
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
        score, target_index = target_scores(output, logits, target, starts[sets.query_set], batch)
        yield RecordedForward(sets=sets, keeps=keeps, starts=starts, score=score, target=target_index, logits=logits,
                              recorder=recorder)
