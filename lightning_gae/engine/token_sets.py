"""Which recorded attention call runs over which token sets.

A ViT or BERT has one token set; an encoder-decoder has two (source and target, joined by
cross-attention); CLIP has two towers joined only at the output; an LXMERT-style model has two
streams with co-attention between them. Every recorded call gets a query set and a key set, found
in this order:

1. an explicit declaration, :class:`Streams` (module-path globs of the module that called the
   attention);
2. a preset for a known family (``nn.Transformer``, Hugging Face encoder-decoders, Hugging Face
   dual encoders such as CLIP and SigLIP), kept as data in :data:`PRESETS`;
3. the data flow: the autograd graph from each call's queries and keys back to the outputs of
   earlier calls. Self-attention reads queries and keys from the same hidden states; a
   cross-attention call's keys descend from another set's calls; a call whose inputs descend from
   no earlier call starts a new set (a second tower, or a module run again in the same forward).

A call that cannot be assigned is never chained into another set: :func:`assign_token_sets`
raises and says what to declare.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from lightning_gae.engine.capture import AttentionRecord

__all__ = ["Streams", "TokenSets", "assign_token_sets", "preset_streams", "PRESETS"]

# A per-set readout: an index, "last", "mean", per-sample indices, or a function of the model's
# keyword inputs that returns per-sample indices (CLIP reads its text tower at the EOS token).
Readout = Any


@dataclass
class Streams:
    """Declares the token sets of a model whose attention calls no preset or inference can assign.

    Args:
        self_attention: token set name -> module-path globs of the modules that call self-attention
            over that set, e.g. ``{"encoder": ["encoder.*"], "decoder": ["decoder.*.self_attn"]}``.
        cross_attention: module-path glob -> ``(query set, key set)``, e.g.
            ``{"decoder.*.cross_attn": ("decoder", "encoder")}``. Cross globs are tried first.
        query_set: the set whose token makes the prediction (its row is ``Explanation.tokens``);
            default: the query set of the last attention call.
        queries: set name -> the token to read that set at, for sets no cross-attention joins to
            the query set (towers): an index, ``"last"``, ``"mean"``, or per-sample indices.

    Example:
        The sets of an ``nn.Transformer`` (which a preset also knows), declared as one's own model would need:

        >>> import torch
        >>> from torch import nn
        >>> from lightning_gae import Streams, explain
        >>> model = nn.Transformer(16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
        ...                        batch_first=True).eval()
        >>> streams = Streams(
        ...     self_attention={"encoder": ["encoder.*"], "decoder": ["decoder.*.self_attn"]},
        ...     cross_attention={"decoder.*.multihead_attn": ("decoder", "encoder")},
        ...     query_set="decoder",
        ... )
        >>> src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
        >>> exp = explain(model, (src, tgt), query=3, streams=streams)
        >>> exp.relevance["encoder"].shape, exp.tokens.shape     # source relevance for target position 3
        (torch.Size([2, 6]), torch.Size([2, 4]))
    """

    self_attention: Mapping[str, Sequence[str]] = field(default_factory=dict)
    cross_attention: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    query_set: str | None = None
    queries: Mapping[str, Readout] = field(default_factory=dict)

    def match(self, path: str) -> tuple[str, str] | None:
        """``(query set, key set)`` declared for a call made by the module at ``path``, or None."""
        for pattern, (q, k) in self.cross_attention.items():
            if fnmatch.fnmatchcase(path, pattern):
                return q, k
        for name, patterns in self.self_attention.items():
            patterns = [patterns] if isinstance(patterns, str) else patterns
            if any(fnmatch.fnmatchcase(path, p) for p in patterns):
                return name, name
        return None


@dataclass
class TokenSets:
    """The outcome of :func:`assign_token_sets`.

    ``query_sets[i]`` / ``key_sets[i]`` belong to ``records[i]``; ``sizes`` maps every set to its
    token count; ``query_set`` is the set read out for the prediction; ``queries`` holds per-set
    readouts for sets not joined to the query set; ``pools`` maps a tower to the one-token set whose
    attention pools it (timm ``global_pool="map"``, SigLIP's head).
    """

    records: list[AttentionRecord]
    query_sets: list[str]
    key_sets: list[str]
    sizes: dict[str, int]
    query_set: str
    queries: dict[str, Readout] = field(default_factory=dict)
    pools: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.sizes)

    @property
    def has_cross_attention(self) -> bool:
        return any(q != k for q, k in zip(self.query_sets, self.key_sets))

    def joined(self, a: str, b: str) -> bool:
        """Whether relevance can flow between ``a`` and ``b`` through cross-attention calls."""
        edges = {(q, k) for q, k in zip(self.query_sets, self.key_sets) if q != k}
        seen, todo = {a}, [a]
        while todo:
            x = todo.pop()
            for q, k in edges:
                for y in ((k,) if q == x else (q,) if k == x else ()):
                    if y not in seen:
                        seen.add(y)
                        todo.append(y)
        return b in seen


# --- presets: per-architecture facts as data -------------------------------------------------------

# Names of the modules that run a decoder's cross-attention in Hugging Face encoder-decoders
# (BART/Marian/mBART/Whisper/Pegasus: encoder_attn; T5/mT5: EncDecAttention; BERT-as-decoder:
# crossattention) and in torch's nn.TransformerDecoderLayer (multihead_attn).
CROSS_ATTENTION_NAMES = ("encoder_attn", "EncDecAttention", "crossattention", "cross_attn", "multihead_attn")


def _path_of(model: nn.Module, target: nn.Module | None) -> str | None:
    if target is None:
        return None
    return next((n for n, m in model.named_modules() if m is target), None)


def _under(prefix: str) -> str:
    return f"{prefix}.*" if prefix else "*"


def _clip_text_readout(config: Any) -> Callable[[Mapping[str, Any]], Tensor]:
    eos = getattr(config, "eos_token_id", None)

    def readout(kwargs: Mapping[str, Any], args: Sequence[Any] = ()) -> Tensor:
        ids = kwargs.get("input_ids")
        if ids is None:
            # Positional inputs (the Captum classes' forward functions): the integer ids among them.
            ids = next((a for a in args if isinstance(a, Tensor) and a.dim() == 2 and not a.is_floating_point()), None)
        if ids is None:
            raise ValueError("CLIP's text tower is read at its EOS token, found in input_ids; pass input_ids, or query={'text': ...}")
        if eos is None or eos == 2:
            # CLIP's original vocabulary has the EOS token at the largest id, and pools at argmax.
            return ids.argmax(dim=-1)
        return (ids == eos).int().argmax(dim=-1)

    return readout


def _hf_encoder_decoder(model: nn.Module) -> Streams | None:
    config = getattr(model, "config", None)
    if not getattr(config, "is_encoder_decoder", False):
        return None
    get_encoder, get_decoder = getattr(model, "get_encoder", None), getattr(model, "get_decoder", None)
    if get_encoder is None or get_decoder is None:
        return None
    enc, dec = _path_of(model, get_encoder()), _path_of(model, get_decoder())
    if enc is None or dec is None:
        return None
    cross = {f"{_under(dec)}.{name}*": ("decoder", "encoder") for name in CROSS_ATTENTION_NAMES}
    queries: dict[str, Readout] = {}
    eos = getattr(config, "eos_token_id", None)
    if type(model).__name__.endswith("ForSequenceClassification") and eos is not None:
        # BART-style classifiers read the decoder at the last EOS of input_ids (the decoder input is
        # input_ids shifted right, so positions line up).
        queries["decoder"] = lambda kwargs, args=(): _last_index(kwargs["input_ids"] == eos)
    return Streams(
        self_attention={"encoder": [_under(enc)], "decoder": [_under(dec)]},
        cross_attention=cross,
        query_set="decoder",
        queries=queries,
    )


def _last_index(flags: Tensor) -> Tensor:
    positions = torch.arange(flags.shape[-1], device=flags.device).expand_as(flags)
    return torch.where(flags, positions, -1).amax(dim=-1)


def _hf_dual_encoder(model: nn.Module) -> Streams | None:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "text_config") or not hasattr(config, "vision_config"):
        return None
    if not isinstance(getattr(model, "text_model", None), nn.Module) or not isinstance(getattr(model, "vision_model", None), nn.Module):
        return None
    siglip = "siglip" in str(getattr(config, "model_type", ""))
    text_query = -1 if siglip else _clip_text_readout(config.text_config)
    return Streams(
        self_attention={"text": ["text_model.*"], "image": ["vision_model.*"]},
        cross_attention={"vision_model.head.*": ("image_pool", "image")} if siglip else {},
        query_set="image",
        queries={"text": text_query, "image": 0},
    )


def _torch_transformer(model: nn.Module) -> Streams | None:
    enc = [n for n, m in model.named_modules() if isinstance(m, nn.TransformerEncoderLayer)]
    dec = [n for n, m in model.named_modules() if isinstance(m, nn.TransformerDecoderLayer)]
    if not dec:
        return None
    prefix = lambda n: f"{n}." if n else ""  # noqa: E731
    self_attention = {"decoder": [f"{prefix(n)}self_attn" for n in dec]}
    cross: dict[str, tuple[str, str]] = {}
    if enc:
        self_attention["encoder"] = [f"{prefix(n)}self_attn" for n in enc]
        # Without an encoder of nn.TransformerEncoderLayer, the memory's set is left to the data flow.
        cross = {f"{prefix(n)}multihead_attn": ("decoder", "encoder") for n in dec}
    return Streams(self_attention=self_attention, cross_attention=cross, query_set="decoder")


_HF_PRESETS = (_hf_encoder_decoder, _hf_dual_encoder)
PRESETS: tuple[Callable[[nn.Module], Streams | None], ...] = (*_HF_PRESETS, _torch_transformer)
"""Functions ``model -> Streams | None`` tried in order; the first that recognises the model wins."""


def preset_streams(model: nn.Module) -> Streams | None:
    """The preset :class:`Streams` of a known family (see :data:`PRESETS`), or None.

    A wrapper that stands for a model (the Captum classes' forward function) names it as
    ``wrapped_model``; the wrapper reports the model's own module paths.
    """
    model = getattr(model, "wrapped_model", None) or model
    found = _root_preset(model)
    if found is not None:
        return found
    # A known family held inside the user's module (a LightningModule around CLIP or T5): the
    # outermost submodule a preset recognises, its globs moved under that submodule's path.
    matches: list[tuple[str, Streams]] = []
    for path, module in model.named_modules():
        # Only the Hugging Face presets (models that carry a config) are tried below the root: the
        # nn.Transformer preset already finds its layers at any depth, and walking every submodule's
        # tree again would cost O(n^2).
        if not path or getattr(module, "config", None) is None or any(path.startswith(f"{outer}.") for outer, _ in matches):
            continue
        inner = _root_preset(module, _HF_PRESETS)
        if inner is not None:
            matches.append((path, inner))
    if len(matches) != 1:
        # Two known models in one module: their set names would clash, so the data flow decides.
        return None
    return _moved_under(*matches[0])


def _root_preset(model: nn.Module, presets: Sequence[Callable[[nn.Module], Streams | None]] = PRESETS) -> Streams | None:
    for preset in presets:
        found = preset(model)
        if found is not None:
            return found
    return None


def _moved_under(prefix: str, streams: Streams) -> Streams:
    return Streams(
        self_attention={name: [f"{prefix}.{g}" for g in ([globs] if isinstance(globs, str) else globs)]
                        for name, globs in streams.self_attention.items()},
        cross_attention={f"{prefix}.{g}": pair for g, pair in streams.cross_attention.items()},
        query_set=streams.query_set,
        queries=dict(streams.queries),
    )


# --- inference from the data flow -------------------------------------------------------------------


class _Ancestry:
    """For a tensor, the earlier attention calls its value was computed from, as a bit mask.

    Walking back from a tensor's ``grad_fn`` stops at the output of a recorded call (that call is
    an ancestor), so residual paths reach every earlier call of the same stream but cross-attention
    outputs hide the other stream behind them.
    """

    def __init__(self, records: Sequence[AttentionRecord]) -> None:
        self.stops: dict[Any, int] = {}
        for rec in records:
            node = None if rec.output is None else _node_of(rec.output)
            if node is not None:
                self.stops.setdefault(node, rec.index)
        self.memo: dict[Any, int] = {}

    def _node(self, node: Any) -> int:
        if node is None:
            return 0
        memo, stops = self.memo, self.stops
        stack = [node]
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            if n in stops:
                memo[n] = 1 << stops[n]
                stack.pop()
                continue
            children = [c for c, _ in n.next_functions if c is not None]
            pending = [c for c in children if c not in memo]
            if pending:
                stack.extend(pending)
                continue
            mask = 0
            for c in children:
                mask |= memo[c]
            memo[n] = mask
            stack.pop()
        return memo[node]

    def of(self, t: Tensor | None, own: int | None = None) -> int:
        """Ancestors of ``t``; ``own`` (a record index) is looked through, not counted."""
        node = None if t is None else _node_of(t)
        if node is None:
            return 0
        if own is not None and self.stops.get(node) == own:
            mask = 0
            for c, _ in node.next_functions:
                mask |= self._node(c)
            return mask
        return self._node(node)


def _node_of(t: Tensor) -> Any:
    """``t``'s node in the autograd graph: its ``grad_fn``, or for a leaf that requires grad (the
    probabilities of a frozen model, made leaves by the capture) the node that accumulates into it."""
    if t.grad_fn is not None:
        return t.grad_fn
    if t.requires_grad:
        view = t.view_as(t).grad_fn
        assert view is not None  # a view of a tensor that requires grad has a node
        return view.next_functions[0][0]
    return None


def _latest(mask: int) -> int | None:
    return mask.bit_length() - 1 if mask else None


def _declare_hint(path: str) -> str:
    return (
        f"Declare the token sets with explain(..., streams=lightning_gae.Streams(self_attention={{'name': ['{path}*']}}, "
        "cross_attention={'glob.of.cross.module': ('query set', 'key set')}))."
    )


def _name_sets(paths: dict[int, list[str]], edges: set[tuple[int, int]], sizes: dict[int, int]) -> dict[int, str]:
    """Readable names for inferred sets.

    Two sets where one only reads the other through cross-attention are ``"decoder"`` and
    ``"encoder"``; otherwise a set is named after the first module-path component that tells its
    first call apart from the other sets' (``"text_model"``, ``"vision_model"``); one set is
    ``"tokens"``; a module run again in the same forward gives ``name#1``, ``name#2``; a one-token
    set that only attends to another set (an attention-pooling probe) is ``"pool"``.
    """
    probes = {q for q, _ in edges if sizes.get(q) == 1 and all(k != q for _, k in edges)}
    if probes:
        rest = _name_sets({s: p for s, p in paths.items() if s not in probes},
                          {(q, k) for q, k in edges if q not in probes}, sizes)
        return {**rest, **{s: "pool" if i == 0 else f"pool#{i}" for i, s in enumerate(sorted(probes))}}
    if len(paths) == 1:
        return {s: "tokens" for s in paths}
    if len(paths) == 2 and len(edges) == 1:
        (dec, enc), = edges
        return {dec: "decoder", enc: "encoder"}
    firsts = {s: (ps[0].split(".") if ps and ps[0] else []) for s, ps in paths.items()}
    shared = 0
    while all(len(p) > shared for p in firsts.values()) and len({p[shared] for p in firsts.values()}) == 1:
        shared += 1
    names: dict[int, str] = {}
    used: dict[str, int] = {}
    for s, p in firsts.items():
        # Identical paths (one module run twice) are named after their outermost module.
        base = p[shared] if len(p) > shared else (p[0] if p else "tokens")
        count = used.get(base, 0)
        used[base] = count + 1
        names[s] = base if count == 0 else f"{base}#{count}"
    return names


def _named(records: Sequence[AttentionRecord], query_sets: list[str], key_sets: list[str],
           inferred: dict[int, list[str]]) -> tuple[list[str], list[str]]:
    """The calls' query and key sets with each inferred set (``"\\0<i>"``) named (:func:`_name_sets`), apart from the
    declared and preset names."""
    edges = set()
    for rec, q, k in zip(records, query_sets, key_sets):
        if q.startswith("\0"):
            inferred[int(q[1:])].append(rec.path)
        if q != k and q.startswith("\0") and k.startswith("\0"):
            edges.add((int(q[1:]), int(k[1:])))
    raw_sizes: dict[int, int] = {}
    for rec, q in zip(records, query_sets):
        if q.startswith("\0"):
            raw_sizes.setdefault(int(q[1:]), rec.num_queries)
    names = {f"\0{i}": n for i, n in _name_sets(inferred, edges, raw_sizes).items()}
    taken = {s for s in query_sets + key_sets if not s.startswith("\0")}
    for raw, name in list(names.items()):
        while name in taken:
            name = f"{name}'"
        names[raw] = name
        taken.add(name)
    return [names.get(s, s) for s in query_sets], [names.get(s, s) for s in key_sets]


def _set_sizes(records: Sequence[AttentionRecord], query_sets: list[str], key_sets: list[str]) -> dict[str, int]:
    """Set -> its token count, the same in every call that reads it (else a ValueError naming the two calls)."""
    sizes: dict[str, int] = {}
    for rec, q, k in zip(records, query_sets, key_sets):
        for s, n in ((q, rec.num_queries), (k, rec.num_keys)):
            if sizes.setdefault(s, n) != n:
                first = next(r for r, qq, kk in zip(records, query_sets, key_sets) if s in (qq, kk))
                raise ValueError(
                    f"token set {s!r} changes size: {first.path or '<model>'!r} sees {sizes[s]} tokens, "
                    f"{rec.path or '<model>'!r} sees {n}. Models that merge, drop or add tokens between layers "
                    "are not supported; name one token set's layers with attention_modules=..., or "
                    + _declare_hint(rec.path)
                )
    return sizes


def assign_token_sets(records: Sequence[AttentionRecord], model: nn.Module, streams: Streams | None = None) -> TokenSets:
    """Assign every recorded call a query set and a key set (declaration, preset, then data flow).

    Raises:
        ValueError: a call matches no declared glob, cannot be told apart (queries and keys from
            inputs no earlier call produced, with different lengths; keys that include tokens this
            forward did not compute, as with a KV cache), or a set changes its token count.
    """
    if not records:
        raise ValueError("no attention was recorded")
    declared = streams
    preset = None if declared is not None else preset_streams(model)
    ancestry = _Ancestry(records)
    query_sets: list[str] = []
    key_sets: list[str] = []
    # Inferred sets are numbered while walking the calls and named at the end.
    inferred: dict[int, list[str]] = {}

    def new_set(rec: AttentionRecord) -> str:
        key = len(inferred)
        inferred[key] = []
        return f"\0{key}"

    # Ancestry bits are call indices among everything recorded; attention_modules may select a subset.
    position = {rec.index: i for i, rec in enumerate(records)}

    def set_of(mask: int) -> str | None:
        latest = _latest(mask)
        return None if latest is None else query_sets[position[latest]]

    given = declared or preset
    for rec in records:
        pair = given.match(rec.path) if given is not None else None
        if declared is not None and pair is None:
            raise ValueError(
                f"attention at {rec.path or '<model>'!r} matches none of the declared streams "
                f"(self_attention={dict(declared.self_attention)}, cross_attention={dict(declared.cross_attention)}); "
                "add a glob for it."
            )
        if pair is not None:
            q, k = pair
            if rec.run > 0:
                # The same module ran again in this forward (a bi-encoder, test-time augmentation):
                # each run is its own token set.
                q, k = f"{q}#{rec.run}", f"{k}#{rec.run}"
            query_sets.append(q)
            key_sets.append(k)
            continue
        if rec.source in ("sdpa", "mha"):
            fq = ancestry.of(rec.query_input)
            fk = ancestry.of(rec.key_input)
        elif rec.source == "softmax":
            fk = ancestry.of(rec.key_input)
            both = ancestry.of(rec.tensor, own=rec.index)
            fq = both if both == fk else both & ~fk
        else:
            fq = fk = ancestry.of(rec.tensor, own=rec.index)
        same = fq == fk or rec.self_attention is True
        where = rec.path or "<model>"
        if same:
            if rec.num_queries != rec.num_keys:
                raise ValueError(
                    f"attention at {where!r} reads {rec.num_queries} queries and {rec.num_keys} keys from the same "
                    "hidden states: the keys include tokens this forward did not compute (a KV cache from an "
                    "earlier call?) or the token sets cannot be told apart. Explain the whole sequence in one "
                    "forward without a cache (use_cache=False, past_key_values=None), or "
                    + _declare_hint(where)
                )
            s = set_of(fq) or new_set(rec)
            query_sets.append(s)
            key_sets.append(s)
            continue
        q = set_of(fq) or new_set(rec)
        k = set_of(fk) or new_set(rec)
        if q == k:
            raise ValueError(
                f"attention at {where!r} takes queries and keys from different depths of one token set; "
                "the rules cannot place it. " + _declare_hint(where)
            )
        query_sets.append(q)
        key_sets.append(k)

    query_sets, key_sets = _named(records, query_sets, key_sets, inferred)
    sizes = _set_sizes(records, query_sets, key_sets)

    spec = declared or preset
    query_set = spec.query_set if spec is not None and spec.query_set in sizes else query_sets[-1]
    queries = dict(spec.queries) if spec is not None else {}
    # A one-token set that only attends to another set, read at the end, pools that set
    # (timm global_pool="map", SigLIP's head): the pooled set is read through it.
    pools: dict[str, str] = {}
    for name in sizes:
        own = [(q, k) for q, k in zip(query_sets, key_sets) if q == name]
        if sizes[name] == 1 and own and all(q != k for q, k in own) and len({k for _, k in own}) == 1:
            pools[own[0][1]] = name
    if query_set in pools.values():
        query_set = next(k for k, p in pools.items() if p == query_set)
    return TokenSets(list(records), query_sets, key_sets, sizes, query_set, queries, pools)
