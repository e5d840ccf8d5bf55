"""The methods by name: each one's facts and rule, registered by its own file, read by every face of the package.

A method is a :class:`Method`: its ``kind`` says how its ``rule`` runs, the other fields what the rest of the package
needs to know about it (what it needs, what it supports, what its degenerate output means, how it is named). The
package's methods register themselves when :mod:`lightning_gae.methods` is imported; a user registers one the same
way (docs/guides/add-a-method.md), and it then works in :func:`~lightning_gae.explain`, ``GAECallback(methods=...)``,
:func:`~lightning_gae.compare.compare`, ``lightning-gae compare --methods`` and the GAE tab.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from torch import Tensor

from lightning_gae.engine.forward import RecordedForward

__all__ = ["ALL_ZERO_DEFAULT", "KINDS", "Kind", "Method", "get_method", "method_names", "methods_of", "register_method",
           "unregister_method"]

Kind = Literal["attention", "lrp", "gradient", "baseline"]
KINDS: tuple[Kind, ...] = ("attention", "lrp", "gradient", "baseline")
"""What a method's ``rule`` is, by kind:

- ``"attention"``: ``rule(run: RecordedForward) -> Tensor | Mapping[str, Tensor]``, the relevance read from the
  recorded forward every attention method of a call shares (the query set's ``[B, N]`` row, or rows per token set);
- ``"lrp"``: ``rule(model, inputs, target, query, embedding_layer) -> Explanation``, its own forward and backward;
- ``"gradient"``: ``rule(forward) -> a Captum attribution`` (the Captum class), run on the attributed input tensor;
- ``"baseline"``: ``rule(like: Tensor, seed: int) -> Tensor``, relevance shaped like ``like`` (the rows of
  ``explained_as``) that ignores the model.
"""

ALL_ZERO_DEFAULT = "all zero: the method gave no relevance to any unit of this input at this step"

AttentionRule = Callable[[RecordedForward], Union[Tensor, Mapping[str, Tensor]]]


@dataclass(frozen=True)
class Method:
    """A method's facts and its rule.

    Attributes:
        name: what ``method=`` / ``methods=`` / ``--methods`` take.
        kind: how ``rule`` runs (:data:`KINDS`).
        rule: the method itself, a callable of the form its kind takes (:data:`KINDS`).
        label: how it is named to a reader (plots, tables); default: ``name``.
        needs_gradients: an attention method that reads the explained score's gradient at the attention
            probabilities (the shared backward runs, and a score without a gradient path is refused).
        last_layer_only: an attention method that reads the last attention call alone (on one token set, the
            explanation's ``layers`` name that call only, and only its gradient is taken).
        token_sets: ``"any"``, or ``"one"``: defined on a single token set (refused on models with several, and
            left out of ``compare`` on them with ``one_set`` as the reason).
        one_set: with ``token_sets="one"``: why, in parentheses in the refusal.
        instead: with ``token_sets="one"``: what to use on a model with several sets, a sentence closing the refusal.
        readout_token: it needs one readout token per sample, so ``query="mean"`` is refused.
        one_token: with ``readout_token``: the refusal's text (why, and what to do instead).
        beside_identity: its relevance row starts from the identity (the readout token's own 1), so a row whose
            relevance outside that token is negligible beside it is flagged as degenerate (GAECallback's health).
        all_zero: what an all-zero map of it means, shown on the GAE tab instead of a black map.
        signed: its relevance takes both signs (for and against the explained score), so every view draws it on a
            diverging colormap with white at 0 and symmetric limits; False: non-negative, drawn on a sequential one
            (:func:`lightning_gae.display.colormap_for`), in every sample and view alike.
        default: ``compare`` and ``lightning-gae compare`` run it when no methods are named.
        lean: an attention method whose rule reads only GAE's ``Ā`` and row (:attr:`RecordedForward.lean_abars`,
            :attr:`RecordedForward.lean_row`), so a call of such methods alone takes the memory-lean path.
        check: an attention method's check of the recorded forward before its backward (e.g. a cost estimate); it
            raises ``ValueError`` to refuse.
        options: a gradient method's default keyword arguments of Captum's ``attribute``, from the attributed
            tensor and the batch size.
        explained_as: a baseline's method whose rows give its shape (one without a backward).
    """

    name: str
    kind: Kind
    rule: Callable[..., Any]
    label: str = ""
    needs_gradients: bool = False
    last_layer_only: bool = False
    token_sets: Literal["one", "any"] = "any"
    one_set: str = ""
    instead: str = ""
    readout_token: bool = False
    one_token: str = ""
    beside_identity: bool = False
    all_zero: str = ALL_ZERO_DEFAULT
    signed: bool = False
    default: bool = False
    lean: bool = False
    check: Callable[[RecordedForward], None] | None = None
    options: Callable[[Tensor, int], dict[str, Any]] | None = None
    explained_as: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Method(name={self.name!r}): give a non-empty name")
        if self.kind not in KINDS:
            raise ValueError(f"Method({self.name!r}, kind={self.kind!r}): use one of {list(KINDS)}")
        if self.token_sets not in ("one", "any"):
            raise ValueError(f"Method({self.name!r}, token_sets={self.token_sets!r}): use 'one' or 'any'")
        if not callable(self.rule):
            raise ValueError(f"Method({self.name!r}, rule={self.rule!r}): give a callable")
        if self.kind == "baseline" and not self.explained_as:
            raise ValueError(f"Method({self.name!r}, kind='baseline'): name the method whose rows give its shape "
                             "(explained_as=...)")
        if not self.label:
            object.__setattr__(self, "label", self.name)

    @property
    def token_relevance(self) -> bool:
        """It gives one value per token (``[B, N]``, or rows per token set); a gradient method attributes the
        input tensor instead."""
        return self.kind != "gradient"

    @property
    def per_set(self) -> bool:
        """Whether it gives a row per token set on a model with several (an attention method with
        ``token_sets="any"``, which reads the attention maps on any sets)."""
        return self.kind == "attention" and self.token_sets == "any"

    @property
    def explains(self) -> bool:
        """``explain(..., method=name)`` takes it: an attention or LRP method."""
        return self.kind in ("attention", "lrp")

    def refusal(self, sets: Sequence[str], mean_query: bool = False) -> str | None:
        """Why it does not run on a model with the token ``sets`` read with ``query="mean"`` or not (``mean_query``),
        or None where it does."""
        if self.token_sets == "one" and len(sets) != 1:
            why = f" ({self.one_set})" if self.one_set else ""
            return (f"method={self.name!r} is defined on one token set{why}; this model has the token sets "
                    f"{sorted(sets)}." + (f" {self.instead}" if self.instead else ""))
        if self.readout_token and mean_query:
            return (f"method={self.name!r} {self.one_token}" if self.one_token else
                    f"method={self.name!r} reads one readout token; pass a token index, not query='mean'")
        return None


_REGISTRY: dict[str, Method] = {}


def register_method(method: Method, replace: bool = False) -> Method:
    """Make ``method`` known to every face of the package by its name; returns it.

    Raises:
        ValueError: the name is taken (pass ``replace=True`` to swap a method for another).
    """
    if not isinstance(method, Method):
        raise ValueError(f"register_method({method!r}): give a lightning_gae.methods.Method(...)")
    if method.name in _REGISTRY and not replace:
        raise ValueError(f"a method named {method.name!r} is registered already; pick another name, or pass "
                         "replace=True")
    _REGISTRY[method.name] = method
    return method


def unregister_method(name: str) -> Method:
    """Forget the method ``name``; returns it. Raises ``ValueError`` for an unknown name."""
    get_method(name)
    return _REGISTRY.pop(name)


def get_method(name: str) -> Method:
    """The registered method ``name``. Raises ``ValueError`` naming the registered ones for an unknown name."""
    found = _REGISTRY.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"method={name!r}; choose one of {method_names()}")
    return found


def methods_of(*kinds: Kind) -> tuple[Method, ...]:
    """The registered methods of ``kinds`` (every kind when none is given), in the order they were registered."""
    return tuple(m for m in _REGISTRY.values() if not kinds or m.kind in kinds)


def method_names(*kinds: Kind) -> tuple[str, ...]:
    """The names of :func:`methods_of`."""
    return tuple(m.name for m in methods_of(*kinds))
