"""How a step's methods rank on each faithfulness metric, and why they tie: the ranks the summary, the Text tab's
table and the end-of-fit report print (:func:`rank_labels`), and the note that says why every method ties where they
all do (:func:`tie_note`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from lightning_gae.metrics import PERTURBATION_METRICS
from lightning_gae.metrics.functional.health import tied_groups
from lightning_gae.metrics.regions import STDERR_MULTIPLE
from lightning_gae.tensorboard.method_runs import is_faithfulness

__all__ = ["FAITHFULNESS_ACCURACY", "FAITHFULNESS_CLASSES", "FAITHFULNESS_PREDICTED_CLASSES", "FAITHFULNESS_SAMPLES",
           "Curves", "at_chance", "higher_is_better", "rank_labels", "tie_note"]

Curves = Mapping[str, Mapping[str, tuple[Sequence[float], Tensor]]]
"""Metric -> method -> (the fractions removed, the mean curve): what a scoring step drew."""

FAITHFULNESS_SAMPLES = "faithfulness_samples"
"""The scalar that says how many samples a step's faithfulness scalars were scored on."""
FAITHFULNESS_ACCURACY = "faithfulness_accuracy"
"""The model's accuracy on those samples (where they have class labels and the methods explain the prediction)."""
FAITHFULNESS_CLASSES = "faithfulness_classes"
"""How many classes the model chooses from (its logits' width)."""
FAITHFULNESS_PREDICTED_CLASSES = "faithfulness_predicted_classes"
"""How many different classes it predicted on those samples."""


def higher_is_better(metric: str) -> bool:
    """Which way ``metric``'s methods rank: a perturbation metric's own ``higher_is_better``; every ground-truth
    score the callback logs (segmentation, rationale agreement, alignment accuracy) is better higher."""
    found = PERTURBATION_METRICS.get(metric)
    # The table holds callables; every one declares higher_is_better (register_metric admits no other).
    return True if found is None else bool(getattr(found, "higher_is_better", True))


def rank_labels(scalars: Mapping[str, float]) -> dict[str, dict[str, str]]:
    """Metric -> method -> its rank among the step's methods (``random`` included): ``"#k"``, or ``"#k="`` for
    methods that the standard errors do not tell apart, which share their rank
    (:func:`~lightning_gae.metrics.functional.health.tied_groups`; a method without a standard error ties).

    >>> rank_labels({"positive_perturbation_auc/gae": 30.0, "positive_perturbation_auc/gae/stderr": 1.0,
    ...              "positive_perturbation_auc/rollout": 31.0, "positive_perturbation_auc/rollout/stderr": 1.0,
    ...              "positive_perturbation_auc/random": 45.0, "positive_perturbation_auc/random/stderr": 1.0})
    {'positive_perturbation_auc': {'gae': '#1=', 'rollout': '#1=', 'random': '#2'}}
    """
    values: dict[str, dict[str, float]] = {}
    for tag, value in scalars.items():
        parts = tag.split("/")
        if len(parts) == 2 and is_faithfulness(parts[0]):
            values.setdefault(parts[0], {})[parts[1]] = value
    out: dict[str, dict[str, str]] = {}
    for metric, by_method in values.items():
        errors = {m: scalars.get(f"{metric}/{m}/stderr", float("nan")) for m in by_method}
        groups = tied_groups(by_method, errors, higher_is_better(metric))
        out[metric] = {m: f"#{k}" + ("=" if len(group) > 1 else "") for k, group in enumerate(groups, 1) for m in group}
    return out


def _flat(values: Tensor) -> bool:
    """Every value the same, to round-off (NaN: not)."""
    values = values.detach().double()
    spread = float(values.max() - values.min()) if values.numel() else float("nan")
    return spread <= 1e-9 * max(1.0, float(values.abs().max()))


def at_chance(scalars: Mapping[str, float]) -> str | None:
    """The evidence that the model was at chance on a step's scored samples, or None (not at chance, or not known):
    it predicted one class for all of them (``faithfulness_predicted_classes``), or its accuracy
    (``faithfulness_accuracy``) is not above chance, one class in ``faithfulness_classes``, by more than
    :data:`~lightning_gae.metrics.regions.STDERR_MULTIPLE` standard errors of an accuracy at chance on that many
    samples (``faithfulness_samples``).

    >>> at_chance({"faithfulness_samples": 32.0, "faithfulness_classes": 2.0, "faithfulness_predicted_classes": 2.0,
    ...            "faithfulness_accuracy": 0.5})
    "the model's accuracy on these 32 samples is 0.50 (chance with 2 classes: 0.50; not above it by 2 standard errors of 0.088)"
    >>> at_chance({"faithfulness_samples": 32.0, "faithfulness_classes": 2.0, "faithfulness_predicted_classes": 2.0,
    ...            "faithfulness_accuracy": 0.9}) is None
    True
    """
    count, classes = scalars.get(FAITHFULNESS_SAMPLES), scalars.get(FAITHFULNESS_CLASSES)
    predicted, accuracy = scalars.get(FAITHFULNESS_PREDICTED_CLASSES), scalars.get(FAITHFULNESS_ACCURACY)
    if count is None or count < 2 or classes is None or classes < 2:
        return None
    n, c = int(count), int(classes)
    if predicted == 1:
        held = "" if accuracy is None else f" (accuracy {accuracy:.2f}; chance with {c} classes: {1 / c:.2f})"
        return f"the model predicts one class for all {n} of these samples{held}"
    if accuracy is None:
        return None
    chance = 1 / c
    error = math.sqrt(chance * (1 - chance) / n)
    if accuracy > chance + STDERR_MULTIPLE * error:
        return None
    return (f"the model's accuracy on these {n} samples is {accuracy:.2f} (chance with {c} classes: {chance:.2f}; not "
            f"above it by {STDERR_MULTIPLE:g} standard errors of {error:.2g})")


def tie_note(scalars: Mapping[str, float], curves: Curves | None = None) -> str | None:
    """Why a step's ranking ties every method (random included) on some metric, and the number of samples behind it;
    None where every metric tells some methods apart.

    Two causes are told apart:

    - every method scores the same: its perturbation curves (``curves``, the metrics' mean curves) are flat, or
      without curves every value and standard error is equal. Removing tokens in any order then changes the model's
      predictions alike, which is a model whose predictions do not change under perturbation (one that predicts one
      class whatever the input): the ranking says nothing about the methods;
    - the values differ but not beyond the standard errors (:func:`rank_labels`): a model at chance, that no token
      decides, where the step's scalars show one (:func:`at_chance`: its accuracy or its predictions, with their
      numbers), else too few samples.

    >>> tie_note({"positive_perturbation_auc/gae": 45.0, "positive_perturbation_auc/gae/stderr": 8.1,
    ...           "positive_perturbation_auc/random": 45.0, "positive_perturbation_auc/random/stderr": 8.1,
    ...           "faithfulness_samples": 32.0}).split(":")[0]
    'every method, random included, scores the same on positive_perturbation_auc (45 ± 8.1 over 32 samples)'
    """
    values: dict[str, dict[str, float]] = {}
    for tag, value in scalars.items():
        parts = tag.split("/")
        if len(parts) == 2 and is_faithfulness(parts[0]):
            values.setdefault(parts[0], {})[parts[1]] = value
    count = scalars.get(FAITHFULNESS_SAMPLES)
    over = "" if count is None else f" over {int(count)} samples"
    same, tied = [], []
    for metric, by_method in sorted(values.items()):
        if len(by_method) < 2:
            continue
        errors = {m: scalars.get(f"{metric}/{m}/stderr", float("nan")) for m in by_method}
        drawn = (curves or {}).get(metric, {})
        equal = _flat(torch.tensor(list(by_method.values()))) and _flat(torch.tensor(list(errors.values())))
        if equal and (set(drawn) < set(by_method) or all(_flat(curve) for _, curve in drawn.values())):
            value, error = next(iter(by_method.values())), next(iter(errors.values()))
            same.append(f"{metric} ({value:.4g} ± {error:.2g}{over})")
        elif len(tied_groups(by_method, errors, higher_is_better(metric))) == 1:
            tied.append(metric)
    chance = at_chance(scalars)
    notes = []
    if same:
        why = "as for a model that predicts one class whatever the input" if chance is None else chance
        notes.append(f"every method, random included, scores the same on {', '.join(same)}: removing tokens in any "
                     f"order leaves the model's predictions as they were (its perturbation curves are flat), {why}; "
                     "these ranks say nothing about the methods")
    if tied:
        head = f"no method is told apart from another, random included, on {', '.join(tied)}: "
        if chance is not None:
            notes.append(f"{head}the model is at chance: {chance}, so no token decides its prediction and these ranks "
                         "say nothing about the methods; train it further")
        else:
            accuracy = scalars.get(FAITHFULNESS_ACCURACY)
            known = (f" (the model is not at chance: its accuracy is {accuracy:.2f})" if accuracy is not None
                     else ", or check whether the model is at chance (no token decides its prediction)")
            notes.append(f"{head}the standard errors{over} are wider than the differences; score more samples "
                         f"(FaithfulnessOptions(samples=..., interim_samples=...)){known}")
    return "; ".join(notes) or None
