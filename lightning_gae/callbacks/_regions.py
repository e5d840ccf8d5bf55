"""GAECallback's declared regions: how much of each method's relevance sits on them, and the alert when that differs
from chance (:class:`~lightning_gae.options.RegionOptions`). The scores themselves are
:mod:`lightning_gae.metrics.regions`' (through :mod:`lightning_gae.evaluation`, as ``compare`` scores them); this
module is about the run: which samples, when to alert, what to say.

The shares and recalls are scored on the tracked samples, the ones the pictures show, at every explanation step.
Chance is the yardstick of the alert: each sample's share beside the share uniform random relevance puts on the
region in that sample (:func:`lightning_gae.metrics.regions.chance_shares`), and an alert where the mean difference
is beyond its standard errors and the ``margin`` (:func:`lightning_gae.metrics.regions.beyond_chance`): more than
chance on a suspect region, less on an evidence one. The alert names the step, the method, the share beside chance's,
the samples most affected, the method's faithfulness and what removing the region does to the prediction (does the
model use it, or does the method only point at it), measured on the faithfulness subset where there is one. An alert
whose check did not find the region used is checked again at every later step, and followed up once when a check
does (:func:`escalation`): an alert can come before the model has learnt the cue.
A region that holds no token of a tracked sample is not scored there, and the run says so (:func:`coverage`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_gae import evaluation
from lightning_gae._structures import map_tensors, take
from lightning_gae.evaluation import Batch, score_batches
from lightning_gae.methods.random import RANDOM
from lightning_gae.metrics.functional import region_removal_drop
from lightning_gae.metrics.regions import (MIN_SAMPLES, REMOVAL_MIN_DROP, STDERR_MULTIPLE, ChanceExcess, RemovalCheck,
                                           beyond_chance, chance_shares, excess_over_chance, held_shares)
from lightning_gae.modalities.regions import Region, region_valid_tokens, regions_of
from lightning_gae.modalities.tokens import Modality
from lightning_gae.callbacks._state import RunState
from lightning_gae.callbacks.samples import Samples
from lightning_gae.options import RegionOptions
from lightning_gae.tensorboard.summary import faithfulness_rows, write_alerts

__all__ = ["NOT_SCORED", "Due", "RegionAlert", "Removal", "Verdict", "alert_tokens", "announce", "announce_coverage",
           "coverage", "coverage_lines", "due_alerts", "escalation", "faithfulness_beside", "new_alerts",
           "region_chance", "region_masks", "region_scalars", "removal_chunks", "removal_text", "removal_verdict",
           "share_tag", "subset_removal", "with_data_regions"]

NOT_SCORED = "not_scored"
"""The method name of a region's entry in the alerts when no tracked sample holds it (the GAE tab lists it)."""


def share_tag(region: str, method: str) -> str:
    """The scalar of a method's share of relevance on a region."""
    return f"region_share_{region}/{method}"


def region_masks(regions: RegionOptions, modality: Modality, inputs: Any) -> dict[str, Tensor]:
    """Region name -> bool ``[B, N]`` over the tracked samples' tokens (:func:`lightning_gae.evaluation.region_masks`)."""
    return evaluation.region_masks(regions.regions, modality, inputs)


def region_scalars(relevance: Mapping[str, Tensor], masks: Mapping[str, Tensor], modality: Modality, inputs: Any,
                   top_k: int | None) -> tuple[dict[str, float], dict[str, dict[str, Tensor]]]:
    """``(scalars, shares)``: ``region_share_<region>/<method>`` and ``region_recall_<region>/<method>`` (means over the
    samples that hold the region, scored by :func:`lightning_gae.evaluation.score_batches` as ``compare`` scores
    them), and region -> method -> the per-sample shares ``[B]`` the alerts compare with chance, over the tokens
    :func:`alert_tokens` names (NaN where not held, :func:`lightning_gae.metrics.regions.held_shares`)."""
    rows = {method: tokens.detach().float().cpu() for method, tokens in relevance.items()}
    # No metric, so the model is never called (score_batches types it as always given).
    scores = score_batches([Batch(inputs, rows, regions=masks)], (), None, modality, top_k=top_k)  # type: ignore[arg-type]
    scalars = {f"{column}/{method}": score.value for method, columns in scores.columns().items()
               for column, score in columns.items() if math.isfinite(score.value)}
    cpu = map_tensors(inputs, lambda t: t.detach().cpu())
    valid = alert_tokens(modality, cpu, next(iter(rows.values())).shape[1]) if rows else None
    shares: dict[str, dict[str, Tensor]] = {name: {} for name in masks}
    for method, tokens in rows.items():
        for name, share in held_shares(tokens, masks, valid).items():
            shares[name][method] = share
    return scalars, shares


class Verdict(NamedTuple):
    """What the removal check of a region said (:func:`removal_verdict`)."""

    text: str
    """The alert's line: what was measured, on how many samples, and the verdict."""
    uses: bool
    """The model uses the region (:attr:`lightning_gae.metrics.regions.RemovalCheck.uses`)."""


def removal_verdict(model: nn.Module, chunks: Iterable[tuple[Any, Tensor]], modality: Modality, seed: int,
                    what: str) -> Verdict:
    """Whether the model uses the region: the drops of the explained class's probability when it is removed and when
    random regions of its size are, over ``chunks`` (``(inputs, region mask)`` batches of the ``what`` samples), with
    the sample count, the interval of the difference and the verdict
    (:class:`lightning_gae.metrics.regions.RemovalCheck`)."""
    generator = torch.Generator().manual_seed(seed)
    region, random, held, total = [], [], 0, 0
    for inputs, mask in chunks:
        total += mask.shape[0]
        holds = mask.any(dim=1)
        if not bool(holds.any()):
            continue
        found = region_removal_drop(model, inputs, mask, modality, target=None, generator=generator)
        holds = holds.to(found.region.device)
        region.append(found.region[holds].cpu())
        random.append(found.random[holds].mean(dim=1).cpu())
        held += int(holds.sum())
    if not held:
        return Verdict(f"removal check: none of the {total} {what} samples holds the region", False)
    check = RemovalCheck.from_drops(torch.cat(region), torch.cat(random), held)
    return Verdict("removal check: " + removal_text(check, f"{total} {what}"), check.uses)


def removal_text(check: RemovalCheck, what: str) -> str:
    """What the removal check measured on the ``what`` samples (``"8 tracked"``) and what it says, with its sample
    count and interval."""
    if check.measured < 2:
        return (f"{check.measured} of the {what} samples hold a removable part of the region: too few samples to tell "
                f"(fewer than {MIN_SAMPLES})")
    measured = (f"on the {check.measured} of {what} samples that hold it, removing it drops the prediction's probability by "
                f"{check.region:.3g}, random regions of its size by {check.random:.3g}: a difference of "
                f"{check.excess:+.3g} (interval {check.low:+.3g} to {check.high:+.3g}, ±{STDERR_MULTIPLE:g} standard errors)")
    if check.measured < MIN_SAMPLES:
        return f"{measured}: too few samples to tell (fewer than {MIN_SAMPLES})"
    if not check.tells:
        return f"{measured}: too few samples to tell (the interval covers 0)"
    if check.uses:
        return f"{measured}: the model uses it"
    if check.low > 0:
        return f"{measured}: less than {REMOVAL_MIN_DROP:g} of probability, the model does not rely on it"
    return f"{measured}: the model does not rely on it more than on random places"


def removal_chunks(samples: Samples, region: Region, modality: Modality, move: Callable[[Any], Any],
                   max_batch: int) -> Iterator[tuple[Any, Tensor]]:
    """``samples`` (on the CPU) in batches of ``max_batch`` as the model takes them (``move``), each with the region's
    tokens in it: what :func:`removal_verdict` removes the region from."""
    total = len(samples)
    for start in range(0, total, max_batch):
        inputs = take(samples.inputs, start, min(start + max_batch, total), total)
        yield move(inputs), evaluation.region_masks([region], modality, inputs)[region.name]


Removal = Callable[[Region], tuple[Iterable[tuple[Any, Tensor]], str]]
"""Where the removal check of a region runs: ``region -> (batches of (inputs, region mask), what they are)``."""


def subset_removal(run: RunState, move: Callable[[Any], Any], max_batch: int) -> Removal | None:
    """The removal check on the faithfulness subset (more samples than the tracked ones, put on the model's device by
    ``move``, ``max_batch`` at a time) when the run has one and explains the model itself; None: on the tracked
    samples."""
    subset, modality = run.scored, run.modality
    if subset is None or run.readout is not None or modality is None:
        return None
    return lambda region: (removal_chunks(subset, region, modality, move, max_batch), "faithfulness subset")


@dataclass
class RegionAlert:
    """A declared region whose share of a method's relevance differs from chance (more on a suspect region, less on
    an evidence one) or crossed an absolute rule: what was seen, when, and what it means."""

    step: int
    region: str
    method: str
    share: float
    floor: float | None
    """The mean share chance puts on the region over the same samples (:func:`~lightning_gae.metrics.regions.chance_shares`)."""
    samples: list[Any]
    faithfulness: str
    removal: str
    kind: str = "suspect"
    excess: float = float("nan")
    """The mean of each sample's share minus its chance share, and ``stderr`` its standard error, over ``count`` samples."""
    stderr: float = float("nan")
    count: int = 0
    rule: str = "chance"
    """What raised it: ``"chance"``, ``"threshold"``, ``"rise"``, or ``"follow-up"`` (:func:`escalation`)."""
    uses: bool | None = None
    """What its removal check said: True, the model uses the region; False, it does not rely on it or the samples were
    too few to tell (a later step may then raise a follow-up, :func:`escalation`); None, not known (an alert kept by a
    checkpoint of a version that did not keep it)."""
    follows: int | None = None
    """For a follow-up, the step of the first alert of its region and method, whose removal check did not find the
    model using the region; this one's does."""

    def text(self, indent: str = "") -> str:
        """A headline with the step, the method, the region, the share and chance's, then one indented line per detail."""
        floor = "" if self.floor is None or not math.isfinite(self.floor) else f", where chance puts {self.floor:.1%}"
        head = f"step {self.step}: {self.share:.0%} of {self.method}'s relevance sits on the {self.kind} region {self.region!r}{floor}"
        if self.follows is not None:
            head = (f"step {self.step}: the model now uses the {self.kind} region {self.region!r} ({self.method}'s "
                    f"alert of step {self.follows} came before it did); {self.share:.0%} of {self.method}'s relevance "
                    f"sits on it{floor}")
        lean = "more" if self.kind == "suspect" else "less"
        error = f" ± {self.stderr:.1%} (standard error)" if math.isfinite(self.stderr) else " (no standard error)"
        measured = f"share minus chance: {self.excess:+.1%}{error} over {self.count} samples"
        against = (f"{measured} ({lean} than chance by over {STDERR_MULTIPLE:g} standard errors and the margin)"
                   if self.rule == "chance" else f"raised by the {self.rule} rule; {measured}")
        if self.follows is not None:
            against = f"{measured} now; the alert of step {self.follows} found it {lean} than chance"
        details = [against, f"samples most affected: {self.samples}", self.faithfulness, self.removal]
        return "\n".join([indent + head, *(f"{indent}    {line}" for line in details)])

    def markdown(self) -> str:
        """The same for TensorBoard's Text tab: the headline, then the details as a list."""
        head, *details = self.text().split("\n")
        return "\n".join([f"**{head}**", "", *(f"- {line.strip()}" for line in details)])


def faithfulness_beside(method: str, scores: Mapping[str, float] | None) -> str:
    """The method's last faithfulness values with their errors, beside random's, for an alert."""
    found = None if not scores else faithfulness_rows(scores)
    if found is None:
        return "its faithfulness: not scored yet"
    metrics, rows = found
    by_method = {row[0]: row[1:] for row in rows}
    if method not in by_method:
        return "its faithfulness: not scored"
    floor = by_method.get(RANDOM.name)
    cells = [f"{metric} {value}" + (f" (random {floor[i]})" if floor is not None else "")
             for i, (metric, value) in enumerate(zip(metrics, by_method[method])) if value]
    return "its faithfulness: " + ", ".join(cells)


@dataclass
class Due:
    """An alert due (:func:`due_alerts`): the region, the method, its share against chance, the samples most
    affected and the rule that raised it (a follow-up is raised only if the removal check now finds the region used)."""

    region: Region
    method: str
    found: ChanceExcess
    samples: list[Any]
    rule: str


def _rule(regions: RegionOptions, region: Region, found: ChanceExcess, share: float | None,
          start: float | None) -> str | None:
    """Which rule raises an alert for this share (chance first), or None."""
    if regions.margin is not None and beyond_chance(found, region.suspect, regions.margin):
        return "chance"
    if region.suspect and share is not None:
        if regions.threshold is not None and share >= regions.threshold:
            return "threshold"
        if regions.rise is not None and start is not None and share - start >= regions.rise:
            return "rise"
    return None


def due_alerts(regions: RegionOptions, scalars: Mapping[str, float], shares: Mapping[str, Mapping[str, Tensor]],
               chance: Mapping[str, Tensor], first: Mapping[str, float], raised: set[tuple[str, str]],
               shown: list[Any], waiting: Set[tuple[str, str]] = frozenset()) -> list[Due]:
    """Every region and method not raised before whose share differs from chance as
    :func:`~lightning_gae.metrics.regions.beyond_chance` says (``margin``), or, for a suspect region, crossed
    ``threshold`` or rose by ``rise`` since ``first``; and every one ``waiting`` for a follow-up (raised before, its
    removal check did not find the model using the region: :func:`escalation`), whatever its share now, by the rule
    ``"follow-up"``. ``chance``: region -> each tracked sample's chance share."""
    due = []
    for region in regions.regions:
        for method, per_sample in shares.get(region.name, {}).items():
            pair = (region.name, method)
            if method == RANDOM.name or (pair in raised and pair not in waiting):
                continue
            found = excess_over_chance(per_sample, chance[region.name])
            tag = share_tag(region.name, method)
            rule = "follow-up" if pair in waiting else _rule(regions, region, found, scalars.get(tag), first.get(tag))
            if rule is None:
                continue
            # The samples most affected: the highest shares on a suspect region, the lowest on an evidence one.
            order = torch.argsort(torch.nan_to_num(per_sample if region.suspect else -per_sample, nan=-2.0),
                                  descending=True)[:3]
            due.append(Due(region, method, found, [shown[int(i)] for i in order], rule))
    return due


def alert_tokens(modality: Modality, inputs: Any, tokens: int) -> Tensor | None:
    """The tokens an alert's shares and chance count: those a region can hold, the modality's removable tokens (not
    the CLS or other prefix tokens, special tokens or padding; the query token's relevance is 0 by definition, so
    counting it would put chance below what a region covering the whole input takes); else the real tokens
    (:func:`~lightning_gae.modalities.regions.region_valid_tokens`)."""
    try:
        found = modality.removable_tokens(inputs)
    except Exception:  # noqa: BLE001 - a modality that cannot tell: its real tokens
        found = None
    if isinstance(found, Tensor) and found.shape[-1] == tokens:
        return found.cpu()
    return region_valid_tokens(modality, inputs, tokens)


def region_chance(masks: Mapping[str, Tensor], modality: Modality, inputs: Any) -> dict[str, Tensor]:
    """Region -> each tracked sample's chance share (:func:`~lightning_gae.metrics.regions.chance_shares`) over the
    tokens the alerts' shares count (:func:`alert_tokens`)."""
    cpu = map_tensors(inputs, lambda t: t.detach().cpu())
    return {name: chance_shares(mask.cpu(), alert_tokens(modality, cpu, mask.shape[1])) for name, mask in masks.items()}


def escalation(raised: Iterable[RegionAlert], region: str, method: str, uses: bool) -> tuple[bool, int | None]:
    """Whether a region and method whose share differs from chance at this step raise an alert, given the alerts
    ``raised`` before and whether this step's removal check finds the model using the region (``uses``), and the step
    of the earlier alert it follows (None: a first alert).

    A first alert is always raised. After it, one follow-up only, and only when the earlier alerts' removal checks
    all said the model did not use the region (an alert can come before the model has learnt the cue) and this
    step's check says it does: what the first alert could not yet say. Alerts whose check is not known (kept by an
    older checkpoint) are not followed up.
    """
    before = [a for a in raised if a.region == region and a.method == method]
    if not before:
        return True, None
    if uses and all(a.uses is False for a in before):
        return True, before[0].step
    return False, None


def new_alerts(regions: RegionOptions, run: RunState, scalars: Mapping[str, float],
               shares: Mapping[str, Mapping[str, Tensor]], first: Mapping[str, float], raised: list[RegionAlert],
               module: nn.Module, inputs: Any, step: int, last_scores: Mapping[str, float] | None,
               seed: int, removal: Removal | None = None) -> list[RegionAlert]:
    """The alerts this step raises (:func:`due_alerts`), each with the method's faithfulness (this step's, or the last
    scored) and the removal check of its region: on the samples ``removal(region)`` gives (``(chunks, what)``: the
    faithfulness subset), else on the tracked samples."""
    scores = scalars if faithfulness_rows(scalars) is not None else last_scores
    done = {(a.region, a.method) for a in raised}
    # Alerts whose removal check did not find the model using the region: checked again at every step, until it does.
    waiting = {pair for pair in done if escalation(raised, *pair, uses=True)[0]}
    found = []
    removals: dict[str, Verdict] = {}  # the check removes the region from the samples: the same for every method
    assert run.modality is not None  # settled when the run started
    chance = region_chance(run.region_masks, run.modality, inputs)
    for due in due_alerts(regions, scalars, shares, chance, first, done, run.shown, waiting):
        name = due.region.name
        if name not in removals:
            chunks, what = (([(inputs, run.region_masks[name])], "tracked") if removal is None
                            else removal(due.region))
            removals[name] = removal_verdict(module, chunks, run.modality, seed, what)
        raise_it, follows = escalation(raised, name, due.method, removals[name].uses)
        if not raise_it:
            continue
        share = due.found.share if math.isfinite(due.found.share) else scalars.get(share_tag(name, due.method), math.nan)
        found.append(RegionAlert(step, name, due.method, share, due.found.chance, due.samples,
                                 faithfulness_beside(due.method, scores), removals[name].text, due.region.kind,
                                 due.found.excess, due.found.stderr, due.found.samples, due.rule, removals[name].uses,
                                 follows))
    return found


def coverage(masks: Mapping[str, Tensor]) -> dict[str, tuple[int, int]]:
    """Region -> ``(samples that hold it, tracked samples)``: a region holds no token of a sample where its mask
    matches nothing there (an all-false mask, a token id that does not occur, a feature left out), and is not
    scored on it."""
    return {name: (int(mask.any(dim=1).sum()), mask.shape[0]) for name, mask in masks.items()}


def coverage_lines(masks: Mapping[str, Tensor]) -> list[str]:
    """The summary's lines on the regions' coverage: what was scored on how many tracked samples, what not at all."""
    lines = []
    for name, (held, total) in coverage(masks).items():
        if held == 0:
            lines.append(f"  {name!r}: not scored: it matches no token of any of the {total} tracked samples")
        else:
            lines.append(f"  {name!r}: scored on the {held} of {total} tracked samples that hold it")
    return ["regions (each method's share against chance):", *lines] if lines else []


def announce_coverage(writers: list[Any], step: int, masks: Mapping[str, Tensor]) -> None:
    """A warning naming each region that matches no token of the tracked samples, and its entry in the GAE tab's
    alerts (method :data:`NOT_SCORED`); a region that misses some samples is left out of those only."""
    entries = []
    for name, (held, total) in coverage(masks).items():
        if held:
            continue
        text = (f"region {name!r} is not scored: it matches no token of any of the {total} tracked samples (an "
                "all-false mask, a token id that never occurs in them, a mask smaller than half a patch); no share, "
                "recall or alert can come from it")
        rank_zero_warn(f"GAECallback: {text}")
        entries.append((name, NOT_SCORED, f"**{text}**"))
    write_alerts(writers, step, entries)


def announce(trainer: Trainer, writers: list[Any], step: int, alerts: list[RegionAlert], stop: bool,
             found: list[RegionAlert]) -> None:
    """Each new alert in ``found``: kept in ``alerts`` (for the summary), warned once, written to the Text tab and the
    GAE tab; with ``stop`` (``RegionOptions.stop_on_shortcut``) an alert of a suspect region stops training."""
    for alert in found:
        alerts.append(alert)
        rank_zero_warn(f"GAECallback: {alert.text()}")
        trainer.should_stop = trainer.should_stop or (stop and alert.kind == "suspect")
    write_alerts(writers, step, [(alert.region, alert.method, alert.markdown()) for alert in found])


def with_data_regions(options: RegionOptions, datamodule: Any) -> RegionOptions:
    """``options`` with the datamodule's regions added where ``from_data`` asks for them (read once: the result no
    longer asks); unchanged otherwise."""
    if not options.from_data:
        return options
    found = regions_of(datamodule)
    if not found:
        raise ValueError(f"GAECallback(regions=RegionOptions(from_data=True)): the datamodule "
                         f"({type(datamodule).__name__}) has no `region` or `regions` attribute; declare the regions "
                         "with RegionOptions(regions=[Region(...)])")
    return replace(options, regions=(*options.regions, *found), from_data=False)
