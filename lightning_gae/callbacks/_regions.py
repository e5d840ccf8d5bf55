"""GAECallback's declared regions: how much of each method's relevance sits on them, and the alert when a suspect
region takes it (:class:`~lightning_gae.options.RegionOptions`). The scores themselves are
:mod:`lightning_gae.metrics.regions`' (through :mod:`lightning_gae.evaluation`, as ``compare`` scores them); this
module is about the run: which samples, when to alert, what to say.

The shares and recalls are scored on the tracked samples, the ones the pictures show, at every explanation step;
the alert names the step, the method, the share, the samples most affected, the method's faithfulness and what
removing the region does to the prediction (does the model use it, or does the method only point at it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lightning_gae import evaluation
from lightning_gae._structures import map_tensors
from lightning_gae.evaluation import Batch, score_batches
from lightning_gae.methods.random import RANDOM
from lightning_gae.metrics.regions import held_shares, removal_check
from lightning_gae.modalities.regions import Region, region_valid_tokens, regions_of
from lightning_gae.modalities.tokens import Modality
from lightning_gae.callbacks._state import RunState
from lightning_gae.options import RegionOptions
from lightning_gae.tensorboard.summary import faithfulness_rows, write_alerts

__all__ = ["RegionAlert", "announce", "due_alerts", "with_data_regions", "faithfulness_beside", "new_alerts", "region_masks", "region_scalars",
           "removal_verdict", "share_tag"]


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
    them), and region -> method -> the per-sample shares ``[B]`` (NaN where not held,
    :func:`lightning_gae.metrics.regions.held_shares`)."""
    rows = {method: tokens.detach().float().cpu() for method, tokens in relevance.items()}
    # No metric, so the model is never called (score_batches types it as always given).
    scores = score_batches([Batch(inputs, rows, regions=masks)], (), None, modality, top_k=top_k)  # type: ignore[arg-type]
    scalars = {f"{column}/{method}": score.value for method, columns in scores.columns().items()
               for column, score in columns.items() if math.isfinite(score.value)}
    cpu = map_tensors(inputs, lambda t: t.detach().cpu())
    valid = region_valid_tokens(modality, cpu, next(iter(rows.values())).shape[1]) if rows else None
    shares: dict[str, dict[str, Tensor]] = {name: {} for name in masks}
    for method, tokens in rows.items():
        for name, share in held_shares(tokens, masks, valid).items():
            shares[name][method] = share
    return scalars, shares


def removal_verdict(model: nn.Module, inputs: Any, mask: Tensor, modality: Modality, seed: int) -> str:
    """Whether the model uses the region (:func:`lightning_gae.metrics.regions.removal_check`), as an alert's line."""
    check = removal_check(model, inputs, mask, modality, seed)
    if check.held == 0:
        return "removal check: no tracked sample holds the region"
    if not math.isfinite(check.region):
        return "removal check: too few samples to tell"
    verdict = "the model uses it" if check.uses else "the model does not rely on it more than on random places"
    return (f"removal check: removing it drops the prediction's probability by {check.region:.3g} ± "
            f"{check.region_stderr:.2g}, random regions of its size by {check.random:.3g} ± {check.random_stderr:.2g}: "
            f"{verdict}")


@dataclass
class RegionAlert:
    """A suspect region that took a method's relevance: what was seen, when, and what it means."""

    step: int
    region: str
    method: str
    share: float
    floor: float | None
    samples: list[Any]
    faithfulness: str
    removal: str

    def text(self, indent: str = "") -> str:
        """A headline with the step, the method, the region and the share, then one indented line per detail."""
        floor = "" if self.floor is None else f" (random: {self.floor:.0%})"
        head = f"step {self.step}: {self.share:.0%} of {self.method}'s relevance sits on the suspect region {self.region!r}{floor}"
        details = [f"samples most affected: {self.samples}", self.faithfulness, self.removal]
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


def due_alerts(regions: RegionOptions, scalars: Mapping[str, float], shares: Mapping[str, Mapping[str, Tensor]],
               first: Mapping[str, float], raised: set[tuple[str, str]], shown: list[Any]
               ) -> list[tuple[Region, str, float, list[Any]]]:
    """``(region, method, share, samples most affected)`` for every suspect region and method whose share crossed
    the threshold (or rose by ``rise`` since ``first``) and was not raised before."""
    due = []
    for region in regions.regions:
        if not region.suspect:
            continue
        for method, per_sample in shares.get(region.name, {}).items():
            if method == RANDOM.name or (region.name, method) in raised:
                continue
            share = scalars.get(share_tag(region.name, method))
            if share is None:
                continue
            start = first.get(share_tag(region.name, method))
            crossed = regions.threshold is not None and share >= regions.threshold
            rose = regions.rise is not None and start is not None and share - start >= regions.rise
            if crossed or rose:
                order = torch.argsort(torch.nan_to_num(per_sample, nan=-1.0), descending=True)[:3]
                due.append((region, method, share, [shown[int(i)] for i in order]))
    return due


def new_alerts(regions: RegionOptions, run: RunState, scalars: Mapping[str, float],
               shares: Mapping[str, Mapping[str, Tensor]], first: Mapping[str, float], raised: list[RegionAlert],
               module: nn.Module, inputs: Any, step: int, last_scores: Mapping[str, float] | None,
               seed: int) -> list[RegionAlert]:
    """The alerts this step raises (:func:`due_alerts`), each with the method's faithfulness (this step's, or the last
    scored) and the removal check of its region on the tracked samples."""
    scores = scalars if faithfulness_rows(scalars) is not None else last_scores
    done = {(a.region, a.method) for a in raised}
    found = []
    removals: dict[str, str] = {}  # the check removes the region from the samples: the same for every method
    assert run.modality is not None  # settled when the run started
    for region, method, share, samples in due_alerts(regions, scalars, shares, first, done, run.shown):
        if region.name not in removals:
            removals[region.name] = removal_verdict(module, inputs, run.region_masks[region.name], run.modality, seed)
        removal = removals[region.name]
        found.append(RegionAlert(step, region.name, method, share, scalars.get(share_tag(region.name, RANDOM.name)),
                                 samples, faithfulness_beside(method, scores), removal))
    return found


def announce(trainer: Trainer, writers: list[Any], step: int, alerts: list[RegionAlert], stop: bool,
             found: list[RegionAlert]) -> None:
    """Each new alert in ``found``: kept in ``alerts`` (for the summary), warned once, written to the Text tab and the
    GAE tab; with ``stop`` (``RegionOptions.stop_on_shortcut``) training stops."""
    for alert in found:
        alerts.append(alert)
        rank_zero_warn(f"GAECallback: {alert.text()}")
        trainer.should_stop = trainer.should_stop or stop
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
