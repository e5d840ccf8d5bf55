"""GAECallback's arguments as one value, and their checks when it is built: everything that needs neither the model
nor the data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from torch import Tensor

from lightning_gae.methods import method_names
from lightning_gae.modalities.tokens import Modality
from lightning_gae.options import (
    BatchOptions,
    DisplayOptions,
    EngineOptions,
    FaithfulnessOptions,
    Field,
    RegionOptions,
    checked,
    count,
    flag,
    instance,
    names,
)

__all__ = ["Arguments", "check_arguments"]


@dataclass(frozen=True)
class Arguments:
    """What a :class:`~lightning_gae.callbacks.GAECallback` was told, as its run reads it (its arguments of the same
    names; the callback hands a fresh one to its run when a stage is set up, so changes made before then count)."""

    num_samples: int
    every_n_epochs: int | None
    every_n_train_steps: int | None
    methods: tuple[str, ...]
    modality: Modality | Mapping[str, Modality] | None
    target: Literal["pred", "label"] | Callable[[Any], Tensor]
    query: int | str
    captum_baselines: tuple[str, ...]
    log_sanity_check: bool
    faithfulness: FaithfulnessOptions
    batches: BatchOptions
    engine: EngineOptions
    display: DisplayOptions
    regions: RegionOptions


def check_arguments(args: Arguments) -> Arguments:
    """Every check of ``GAECallback``'s arguments that needs neither the model nor the data, run when it is built (a
    typo in a config fails before either is built, as Lightning's own callbacks check theirs) and again when a stage
    is set up: ``args`` as the callback keeps them (lists as tuples), or a ``ValueError`` that names the argument and
    what it accepts."""
    read = Arguments(**checked("GAECallback", {f.name: getattr(args, f.name) for f in fields(args)}, _CHECKS))
    _check_together(read)
    return read


def _methods_elsewhere(unknown: list[str]) -> str:
    """Where the names given to ``methods=`` that are no attention or LRP method belong."""
    captum = [m for m in unknown if m in method_names("gradient")]
    floors = [m for m in unknown if m in method_names("baseline")]
    hints = [f"{captum} are Captum methods: pass captum_baselines={captum} to draw and score them beside the "
             "others"] if captum else []
    hints += [f"{floors} are the floor every method is scored against: faithfulness=FaithfulnessOptions("
              "random_baseline=True) scores it (the default)"] if floors else []
    return "; ".join(hints)


def _target(value: Any) -> Any:
    if callable(value) or (isinstance(value, str) and value in ("pred", "label")):
        return value
    raise ValueError("use 'pred' (predicted class), 'label', or a callable output -> Tensor[B]")


def _query(value: Any) -> int | str:
    if isinstance(value, str) and value in ("last", "mean"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError("use a token index (0 for a CLS token, -1 for the last position), 'last' (the last real token, "
                     "for decoders) or 'mean' (mean-pooled models)")


def _modality(value: Any) -> Any:
    if value is None or isinstance(value, Modality):
        return value
    if isinstance(value, Mapping):
        wrong = {k: type(v).__name__ for k, v in value.items() if not isinstance(v, Modality)}
        if not wrong and all(isinstance(k, str) for k in value):
            return value
        raise ValueError(f"{wrong or 'keys that are not set names'} are not modalities of token sets; give each "
                         "token set an ImageTokens, TextTokens or TabularTokens")
    raise ValueError("give an ImageTokens, TextTokens or TabularTokens, a mapping {token set: modality}, or None to "
                     "infer it")


def _group(kind: type) -> Field:
    return instance(kind, f"{'an' if kind.__name__[0] in 'AEIOU' else 'a'} {kind.__name__}(...)")


_CHECKS = {
    "num_samples": count(0, hint=" (0 only with batches=BatchOptions(sample_indices=[...]))"),
    "every_n_epochs": count(none="never by epoch"),
    "every_n_train_steps": count(none="never by step"),
    "methods": names(lambda: method_names("attention", "lrp"), "methods", hints=_methods_elsewhere),
    "modality": Field(_modality),
    "target": Field(_target),
    "query": Field(_query),
    "captum_baselines": names(lambda: method_names("gradient"), "Captum methods", empty="no Captum baseline"),
    "log_sanity_check": flag(),
    "faithfulness": _group(FaithfulnessOptions),
    "batches": _group(BatchOptions),
    "engine": _group(EngineOptions),
    "display": _group(DisplayOptions),
    "regions": _group(RegionOptions),
}


def _check_together(args: Arguments) -> None:
    """What two arguments decide together."""
    if args.every_n_epochs is None and args.every_n_train_steps is None:
        raise ValueError("GAECallback: every_n_epochs and every_n_train_steps are both None; set one of them")
    if args.num_samples < 1 and not args.batches.sample_indices:
        raise ValueError(f"GAECallback(num_samples={args.num_samples}): track at least one sample")
    if callable(args.target) and (args.faithfulness.metrics or args.captum_baselines):
        raise ValueError("GAECallback(target=<callable>) explains a score that is not a class, which the "
                         "perturbation metrics and Captum baselines cannot score: pass "
                         "faithfulness=FaithfulnessOptions(metrics=()) and captum_baselines=()")
    tabular = args.modality.values() if isinstance(args.modality, Mapping) else [args.modality]
    if any(isinstance(m, Modality) and not m.can_remove for m in tabular) and args.faithfulness.metrics:
        raise ValueError(
            f"GAECallback(faithfulness=FaithfulnessOptions(metrics={list(args.faithfulness.metrics)})) removes "
            f"features, but modality={args.modality!r} has no value to put in their place: build it with "
            "TabularTokens(..., means=[...]) (the training features' means, in the scale the model sees) or "
            "TabularTokens(...).fit(train_features), or pass faithfulness=FaithfulnessOptions(metrics=())"
        )
