"""GAECallback's check that an explanation still says something (:mod:`lightning_gae.metrics.functional.health`).

A method is flagged when

- its relevance outside the read-out token is negligible beside the identity on a large part of the samples it
  explained at a step (at least :data:`DOMINATED_SHARE` of them): checked at every explanation step on the tracked
  samples, and at every scored step on the faithfulness samples scored, so neither the faithfulness schedule nor
  ``FaithfulnessOptions(metrics=())`` hides it; the flag names the samples affected ("on 15 of 32 samples of the
  faithfulness subset (47%)");
- or it is not better than the random floor beyond the standard errors, at two scored steps in a row.

A flag warns once per method and cause, naming the step, the numbers, the run's most faithful method and the likely
cause; each step's flags go to the Text tab (``gae_health``) and the GAE tab, and the summary lists them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from lightning_gae.callbacks._loggers import writers
from lightning_gae.callbacks._scoring import ScoredBatch
from lightning_gae.methods import methods_of
from lightning_gae.methods.random import RANDOM
from lightning_gae.metrics import PERTURBATION_METRICS
from lightning_gae.metrics.functional.health import (
    IDENTITY_TOLERANCE,
    beside_identity,
    differs_beyond_stderr,
    not_better_than_random,
    tied_groups,
)
from lightning_gae.tensorboard.summary import write_health
from lightning_gae.tensorboard.ranks import higher_is_better

__all__ = ["CAUSES", "DOMINATED_SHARE", "FLOOR", "Health", "HealthFlag", "health_flags"]

DOMINATED_SHARE = 0.25
"""A method is flagged beside the identity when at least this share of the samples explained at a step (the tracked
ones, or the faithfulness samples scored) have relevance negligible beside it. A healthy model has none: the trained
recipe models' largest relevance beside the identity is 0.003..0.2 on every sample, and untrained ones 8e-5 and up. A
saturated one has a large part: a small BERT that decides by one spurious word had 15 of 32 (47%), the saturated BERT
of GAE_SPEC section 11 50..70%. A quarter of the pictures showing round-off is enough to say so."""

FLOOR = RANDOM.name
"""The floor every method is held against: random relevance, scored under its method's name."""

CAUSES = {
    "identity": "its layers' terms (GAE's Ā) vanish beside the identity: the model is saturated (a confident, "
                "well-fitted model has tiny gradients of the explained score), so the relevance outside the read-out "
                "token is at the level of round-off, the maps are black, and its ranking cannot be trusted even where "
                "a score still looks good (docs/guides/callback.md#unfaithful-explanations)",
    FLOOR: "the method does not track what the model uses: removing or keeping the tokens it ranks first changes "
              "the prediction no more than random relevance does (docs/guides/callback.md#unfaithful-explanations)",
}
"""Each cause's likely reason, as the flag states it."""


@dataclass
class HealthFlag:
    """A method whose explanation stopped being faithful at a step: what was measured and what it means."""

    step: int
    method: str
    cause: str
    finding: str
    faithfulness: str
    best: str

    def text(self, indent: str = "") -> str:
        """A headline with the step, the method and the finding, then one indented line per detail."""
        head = f"step {self.step}: {self.method}'s explanation is not faithful: {self.finding}"
        details = [self.faithfulness, self.best, f"likely cause: {CAUSES[self.cause]}"]
        return "\n".join([indent + head, *(f"{indent}    {line}" for line in details)])

    def markdown(self) -> str:
        """The same for TensorBoard's Text tab and the GAE tab: the headline, then the details as a list."""
        head, *details = self.text().split("\n")
        return "\n".join([f"**{head}**", "", *(f"- {line.strip()}" for line in details)])


def _scores(scalars: Mapping[str, float]) -> dict[str, dict[str, tuple[float, float]]]:
    """Perturbation metric -> method -> ``(value, standard error)`` (NaN where none), in
    :data:`~lightning_gae.metrics.PERTURBATION_METRICS`' order."""
    found: dict[str, dict[str, tuple[float, float]]] = {}
    for tag, value in scalars.items():
        parts = tag.split("/")
        if len(parts) == 2 and parts[0] in PERTURBATION_METRICS:
            found.setdefault(parts[0], {})[parts[1]] = (value, scalars.get(f"{tag}/stderr", float("nan")))
    return {metric: found[metric] for metric in PERTURBATION_METRICS if metric in found}


def _beside_random(metric: str, method: str, by_method: Mapping[str, tuple[float, float]]) -> str:
    value, error = by_method[method]
    random = by_method.get(FLOOR)
    floor = "" if random is None else f" vs random {random[0]:.4g} ± {random[1]:.2g}"
    return f"{metric} {value:.4g} ± {error:.2g}{floor}"


def _with_floor(method: str, by_method: Mapping[str, tuple[float, float]]) -> tuple[tuple[float, float], ...] | None:
    """``(method's (value, error), random's)``, or None where either is missing or not finite (nothing to tell by)."""
    if FLOOR not in by_method or method not in by_method:
        return None
    pair = by_method[method], by_method[FLOOR]
    return pair if all(math.isfinite(x) for x in (*pair[0], *pair[1])) else None


def _below_floor(metric: str, method: str, by_method: Mapping[str, tuple[float, float]]) -> bool:
    """Not better than random beyond the errors; False where either has no standard error."""
    pair = _with_floor(method, by_method)
    return pair is not None and not_better_than_random(*pair[0], *pair[1], higher_is_better(metric))


def _beats_floor(metric: str, method: str, by_method: Mapping[str, tuple[float, float]]) -> bool:
    """Better than random beyond the errors; False where either has no standard error."""
    pair = _with_floor(method, by_method)
    if pair is None:
        return False
    (value, _), (floor, _) = pair
    good_side = value > floor if higher_is_better(metric) else value < floor
    return good_side and differs_beyond_stderr(*pair[0], *pair[1])


def _worse(metric: str, scored: tuple[float, float], floor: tuple[float, float]) -> bool:
    """On the bad side of random beyond the errors."""
    bad_side = scored[0] < floor[0] if higher_is_better(metric) else scored[0] > floor[0]
    return bad_side and differs_beyond_stderr(*scored, *floor)


def _most_faithful(scores: Mapping[str, Mapping[str, tuple[float, float]]], flagged: set[str]) -> str:
    """The run's most faithful method on its first perturbation metric: the best group the errors do not tell apart,
    among the methods not flagged and above the floor."""
    if not scores:
        return "most faithful method of this run: none scored"
    metric, by_method = next(iter(scores.items()))
    healthy = {m: v for m, v in by_method.items() if m != FLOOR and m not in flagged}
    if not healthy:
        return f"most faithful method of this run: none; no method beats random on {metric} beyond the standard error"
    groups = tied_groups({m: v for m, (v, _) in healthy.items()}, {m: e for m, (_, e) in healthy.items()},
                         higher_is_better(metric))
    best = ", ".join(f"{m} {by_method[m][0]:.4g} ± {by_method[m][1]:.2g}" for m in groups[0])
    tied = " (tied within the standard errors)" if len(groups[0]) > 1 else ""
    return f"most faithful method of this run, on {metric}: {best}{tied}; read its explanations instead"


def _identity_finding(largest: Mapping[str, Tensor]) -> str | None:
    """What the flag beside the identity says, or None: ``largest`` holds
    :func:`~lightning_gae.metrics.functional.health.beside_identity` of every sample of each set of samples explained
    at the step, by what the flag calls them (``"tracked samples"``); the set with the most samples among those where
    at least :data:`DOMINATED_SHARE` are negligible is named (the first of equal ones)."""
    found: tuple[int, str] | None = None
    for what, values in largest.items():
        values = values[torch.isfinite(values)]
        negligible = values[values < IDENTITY_TOLERANCE]
        if not len(values) or len(negligible) < DOMINATED_SHARE * len(values):
            continue
        if found is None or len(values) > found[0]:
            found = (len(values), f"its relevance beside the identity is negligible on {len(negligible)} of "
                                  f"{len(values)} {what} ({len(negligible) / len(values):.0%}): their largest "
                                  f"is below {IDENTITY_TOLERANCE:g} of the identity's 1 (median "
                                  f"{float(negligible.median()):.2g}), so their maps are round-off")
    return None if found is None else found[1]


def health_flags(step: int, scalars: Mapping[str, float], dominated: Mapping[str, Mapping[str, Tensor]],
                 raised: AbstractSet[tuple[str, str]] = frozenset()) -> list[HealthFlag]:
    """The flags a step raises, those in ``raised`` (``(method, cause)``) left out.

    Args:
        step: the step the scalars were logged at.
        scalars: the step's scalars, ``<metric>/<method>`` and ``<metric>/<method>/stderr`` with ``random`` the floor
            (none: only the flag beside the identity can be raised).
        dominated: the samples explained at the step (``"tracked samples"``, ``"samples of the faithfulness subset"``)
            -> method ->
            :func:`~lightning_gae.metrics.functional.health.beside_identity` of each sample's row (methods registered
            with ``beside_identity`` only).
        raised: the flags raised before, which are not raised again.
    """
    scores = _scores(scalars)
    found: dict[tuple[str, str], tuple[str, str]] = {}
    methods_seen = dict.fromkeys(m for by_method in dominated.values() for m in by_method)
    for method in methods_seen:
        finding = _identity_finding({what: by_method[method] for what, by_method in dominated.items()
                                     if method in by_method})
        if finding is not None:
            numbers = "; ".join(_beside_random(m, method, v) for m, v in scores.items() if method in v)
            found[(method, "identity")] = (finding, f"its faithfulness: {numbers or 'not scored at this step'}")
    methods = dict.fromkeys(m for by_method in scores.values() for m in by_method if m != FLOOR)
    for method in methods:
        # Worse than random beyond the errors always says something. Not better than random does only where the scores
        # tell another method from random: with few samples every method is within the errors of random, which says
        # that the samples are too few, not that the methods are unfaithful. Nor does it where the method that beats
        # random is not itself told apart from this one: then the errors cannot say which of the two to read.
        below = [metric for metric, by_method in scores.items() if _below_floor(metric, method, by_method)
                 and (_worse(metric, by_method[method], by_method[FLOOR])
                      or any(_beats_floor(metric, other, by_method) and _worse(metric, by_method[method], by_method[other])
                             for other in by_method if other not in (method, FLOOR)))]
        if below:
            worse = [m for m in below if _worse(m, scores[m][method], scores[m][FLOOR])]
            finding = (f"it is worse than random relevance beyond the standard error on {', '.join(worse)}" if worse else
                       f"it is not better than random relevance beyond the standard error on {', '.join(below)}, "
                       "where another method is")
            found[(method, FLOOR)] = (
                finding, "its faithfulness: " + "; ".join(_beside_random(m, method, scores[m]) for m in below))
    best = _most_faithful(scores, {method for method, _ in found})
    return [HealthFlag(step, method, cause, finding, numbers, best)
            for (method, cause), (finding, numbers) in found.items() if (method, cause) not in raised]


class Health:
    """What a fit found out so far: the flags raised, and the rows of the samples explained at the current step.

    :meth:`state_dict` holds what the verdicts depend on, as plain data for a checkpoint.
    """

    def __init__(self) -> None:
        self.flags: list[HealthFlag] = []
        self._rows: dict[str, list[Tensor]] = {}
        # The methods found not better than random at the last scored step: that cause is raised only when it holds
        # at two scored steps in a row. On a few dozen samples one step's scores cross twice the standard error by
        # chance now and then, for one method or another, over the many steps, methods and metrics of a fit.
        self._below_random: set[str] = set()

    @staticmethod
    def _identity_methods() -> set[str]:
        # The methods whose relevance row starts from the identity (the read-out token's own 1), so that relevance
        # outside that token is measured in units of it.
        return {m.name for m in methods_of() if m.beside_identity}

    def watch(self, batches: Iterable[ScoredBatch]) -> Iterator[ScoredBatch]:
        """``batches`` unchanged, each identity-starting method's rows measured on the way
        (:func:`~lightning_gae.metrics.functional.health.beside_identity`)."""
        self._rows = {}
        identity = self._identity_methods()
        for batch in batches:
            for method, tokens in batch[1].items():
                if method in identity and tokens.dim() == 2:
                    self._rows.setdefault(method, []).append(beside_identity(tokens).cpu())
            yield batch

    def check(self, trainer: Trainer, step: int, scalars: Mapping[str, float],
              tracked: Mapping[str, Tensor] | None = None) -> None:
        """On rank zero, after an explanation step (``tracked``: each method's relevance of the tracked samples) or a
        scoring (the rows :meth:`watch` saw): warn once per method and cause, and write the step's new flags to the
        Text tab (``gae_health``) and the GAE tab."""
        rows, self._rows = {m: torch.cat(r) for m, r in self._rows.items() if r}, {}
        if not trainer.is_global_zero:
            return
        identity = self._identity_methods()
        shown = {m: beside_identity(t.detach()).cpu() for m, t in (tracked or {}).items()
                 if m in identity and t.dim() == 2}
        found = health_flags(step, scalars, {"tracked samples": shown, "samples of the faithfulness subset": rows},
                             {(f.method, f.cause) for f in self.flags})
        if _scores(scalars):
            now = {f.method for f in found if f.cause == FLOOR}
            found = [f if f.cause != FLOOR else replace(f, finding=f"{f.finding} (here and at the scored step before)")
                     for f in found if f.cause != FLOOR or f.method in self._below_random]
            self._below_random = now
        for flag in found:
            self.flags.append(flag)
            rank_zero_warn(f"GAECallback: {flag.text()}")
        if found:
            write_health(writers(trainer), step, [(f.method, f.cause, f.markdown()) for f in found])

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, as plain data: every attribute (the flags raised and what the rule carries from one
        scored step to the next), but the rows of the step being scored, which a checkpoint never falls within."""
        return {name: [asdict(f) for f in value] if name == "flags" else _plain(value)
                for name, value in vars(self).items() if name != "_rows"}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Read back what :meth:`state_dict` kept; attributes a checkpoint does not hold keep their values."""
        for name, value in state.items():
            if name == "flags":
                self.flags = [HealthFlag(**flag) for flag in value]
            elif hasattr(self, name):
                kind = type(getattr(self, name))
                setattr(self, name, kind(value) if kind in (set, frozenset, tuple) else value)

    def summary_lines(self) -> list[str]:
        """The summary's section: every flag of the fit."""
        if not self.flags:
            return []
        return ["flags (explanations that are not faithful; read the most faithful method's instead):",
                *(flag.text(indent="  ") for flag in self.flags)]


def _plain(value: Any) -> Any:
    """``value`` as a checkpoint loaded with ``weights_only=True`` reads it: sets as sorted lists, tensors on the CPU."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Tensor):
        return value.detach().cpu()
    return value
