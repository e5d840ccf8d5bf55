"""What failed in a run's explanation steps, and how often: each part of a step fails on its own, each kind of
failure is warned once with its step, and the summary counts them all.

A step has parts that fail apart: the explanation itself (nothing of the step can be logged), its scoring (the
faithfulness metrics, the ground truth and the regions: the pictures are still logged), its pictures (the scalars
are still logged and kept for the summary) and each logger's share of what is logged (the other loggers get theirs:
:mod:`._loggers` records it, with the logger's name and call in the reason).

The scoring of the whole faithfulness subset outside an explanation step (when a fit ends, in a test) is recorded as
a scoring failure of the step it would have logged at (:meth:`Failures.subset_failed`): warned once, counted in the
summary like the others, and its reason is what the summary's "not scored (...)" line says.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_gae.callbacks.distributed import RankFailed

__all__ = ["Failures"]

# What a failing part costs the step, said in its warning.
_WHAT_IS_LOST = {
    "explanation": "was skipped",
    "scoring": "was skipped; the step's pictures were logged",
    "pictures": "were skipped; the step's scalars were logged",
    "logging": "",  # a logger's failure is said by :mod:`._loggers`, which knows what the logger lost
}
# The steps a part's failures are counted among when some are not explanation steps (fit's end, a test's scoring).
_OTHER_STEPS = {"logging": "steps logged at", "scoring": "steps explained or scored at"}


def describe(err: Exception) -> str:
    """How a failure is named in warnings and the summary: ``Type: message``, or a failed rank's own account."""
    return str(err) if isinstance(err, RankFailed) else f"{type(err).__name__}: {err}"


@dataclass
class _Kind:
    """One kind of failure of one part: where it first happened and at which steps."""

    part: str
    reason: str
    steps: list[int] = field(default_factory=list)


@dataclass
class Failures:
    """The explanation steps of a run (fit, validate or test) and what failed in them."""

    steps: set[int] = field(default_factory=set)
    kinds: dict[tuple[str, str], _Kind] = field(default_factory=dict)

    @contextmanager
    def attempt(self, step: int) -> Iterator[None]:
        """One explanation step: counted; if it raises, the whole step is the failure (never raised further)."""
        self.steps.add(step)
        with self.isolated("explanation", step):
            yield

    @contextmanager
    def isolated(self, part: str, step: int) -> Iterator[None]:
        """One ``part`` of a step: what it raises is recorded, and the rest of the step goes on."""
        try:
            yield
        except Exception as err:  # noqa: BLE001 - a failing part of an explanation step never stops training
            self.record(part, step, describe(err))

    def subset_failed(self, step: int, when: str, err: Exception) -> str:
        """The scoring of the faithfulness subset ``when`` (e.g. ``"when fit ended"``, ``"in test"``) failed with
        ``err``: recorded as a scoring failure at ``step`` (warned once per kind, counted in the summary).

        Args:
            step: the step its scalars would have been logged at.
            when: when it scored, as the warning and the summary say it.
            err: what the scoring raised.

        Returns:
            Why the summary has no faithfulness from it, e.g. ``"scoring failed in test: RuntimeError: ..."``.
        """
        reason = describe(err)
        self.record("scoring", step, reason, f"GAECallback: scoring the faithfulness subset {when} (step {step}) "
                                             f"failed and was skipped ({reason}); further failures of this kind are "
                                             f"counted in the summary")
        return f"scoring failed {when}: {reason}"

    def last(self, part: str) -> str | None:
        """The latest failure of ``part`` as the summary's "not scored" line gives it, e.g. ``"scoring failed at
        step 4: RuntimeError: ..."``; None when ``part`` never failed in this run."""
        kinds = [k for k in self.kinds.values() if k.part == part]
        if not kinds:
            return None
        latest = max(kinds, key=lambda k: max(k.steps))
        return f"{part} failed at step {max(latest.steps)}: {latest.reason}"

    def record(self, part: str, step: int, reason: str, message: str | None = None) -> None:
        """A failure of ``part`` at ``step``; a kind not seen before in this run is warned (``message``, or the
        part, the step and the reason)."""
        kind = self.kinds.get((part, reason))
        if kind is None:
            kind = self.kinds[(part, reason)] = _Kind(part, reason)
            rank_zero_warn(message or f"GAECallback: {_noun(part)} at step {step} failed and {_WHAT_IS_LOST[part]} "
                                      f"({reason}); further failures of this kind are counted in the summary")
        if step not in kind.steps:
            kind.steps.append(step)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, as plain data: the steps and each kind of failure with its steps, so that a resumed
        fit warns no kind twice and its summary counts the steps before the checkpoint too."""
        return {"steps": sorted(self.steps),
                "kinds": [[k.part, k.reason, list(k.steps)] for k in self.kinds.values()]}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Failures:
        """The failures :meth:`state_dict` kept."""
        kinds = {(part, reason): _Kind(part, reason, list(steps)) for part, reason, steps in state.get("kinds", [])}
        return cls(set(state.get("steps", [])), kinds)

    def lines(self) -> list[str]:
        """The summary's lines: per part, how many steps failed and why, e.g. ``explanations failed at 3 of 10
        steps: ValueError: ... (first at step 4)``; none when nothing failed. A logger or the subset's scoring may
        also fail at a step that scored without explaining (when fit ends, in test): those count among the steps."""
        found = []
        for part in _WHAT_IS_LOST:
            kinds = [k for k in self.kinds.values() if k.part == part]
            if not kinds:
                continue
            failed = {s for k in kinds for s in k.steps}
            steps = len(self.steps | failed)
            found.append(f"{_noun(part, plural=True)} failed at {len(failed)} of {steps} "
                         f"{'explanation steps' if failed <= self.steps else _OTHER_STEPS.get(part, 'steps')}:")
            found += [f"  {k.reason} ({len(k.steps)} {'step' if len(k.steps) == 1 else 'steps'}, first at step "
                      f"{k.steps[0]})" for k in kinds]
        return found

    def summary(self) -> str:
        """:meth:`lines` as a block to add below the summary (empty when nothing failed)."""
        lines = self.lines()
        return "\n" + "\n".join(lines) if lines else ""


def _noun(part: str, plural: bool = False) -> str:
    if part == "pictures":
        return "pictures"
    if part == "logging":
        return "loggers" if plural else "a logger"
    return part + ("s" if plural and part == "explanation" else "")
