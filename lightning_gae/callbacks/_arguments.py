"""GAECallback's arguments as one value, and their checks when it is built: everything that needs neither the model
nor the data."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

from lightning_gae.methods import method_names
from lightning_gae.modalities.tokens import Modality
from lightning_gae.options import BatchOptions, DisplayOptions, EngineOptions, FaithfulnessOptions, RegionOptions

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


def check_arguments(args: Arguments) -> None:
    """Every check of ``GAECallback``'s arguments that needs neither the model nor the data, run when it is built:
    a typo in a config fails before either is built (as Lightning's own callbacks check theirs)."""
    for name, group, kind in (("faithfulness", args.faithfulness, FaithfulnessOptions),
                              ("batches", args.batches, BatchOptions), ("engine", args.engine, EngineOptions),
                              ("display", args.display, DisplayOptions), ("regions", args.regions, RegionOptions)):
        if not isinstance(group, kind):
            raise ValueError(f"GAECallback({name}={group!r}): give a {kind.__name__}(...)")
    explaining = method_names("attention", "lrp")
    unknown = [m for m in args.methods if m not in explaining]
    if unknown or not args.methods:
        raise ValueError(f"GAECallback(methods={list(args.methods)}): choose from {list(explaining)}")
    if not callable(args.target) and args.target not in ("pred", "label"):
        raise ValueError(f"GAECallback(target={args.target!r}): use 'pred' (predicted class), 'label', or a "
                         "callable output -> Tensor[B]")
    if callable(args.target) and (args.faithfulness.metrics or args.captum_baselines):
        raise ValueError("GAECallback(target=<callable>) explains a score that is not a class, which the "
                         "perturbation metrics and Captum baselines cannot score: pass "
                         "faithfulness=FaithfulnessOptions(metrics=()) and captum_baselines=()")
    if isinstance(args.modality, Mapping):
        wrong = {k: type(v).__name__ for k, v in args.modality.items() if not isinstance(v, Modality)}
        if wrong:
            raise ValueError(f"GAECallback(modality={{...}}): {wrong} are not modalities; give each token set an "
                             "ImageTokens, TextTokens or TabularTokens")
    elif args.modality is not None and not isinstance(args.modality, Modality):
        raise ValueError(f"GAECallback(modality={args.modality!r}): give an ImageTokens, TextTokens or "
                         "TabularTokens, a mapping {token set: modality}, or None to infer it")
    for name in ("every_n_epochs", "every_n_train_steps"):
        value = getattr(args, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"GAECallback({name}={value}): use a positive integer, or None to switch it off")
    if args.every_n_epochs is None and args.every_n_train_steps is None:
        raise ValueError("GAECallback: every_n_epochs and every_n_train_steps are both None; set one of them")
    if args.num_samples < 1 and not args.batches.sample_indices:
        raise ValueError(f"GAECallback(num_samples={args.num_samples}): track at least one sample")
    unknown = [m for m in args.captum_baselines if m not in method_names("gradient")]
    if unknown:
        raise ValueError(f"GAECallback(captum_baselines={list(args.captum_baselines)}): choose from "
                         f"{list(method_names('gradient'))}")
    tabular = args.modality.values() if isinstance(args.modality, Mapping) else [args.modality]
    if any(isinstance(m, Modality) and not m.can_remove for m in tabular) and args.faithfulness.metrics:
        raise ValueError(
            f"GAECallback(faithfulness=FaithfulnessOptions(metrics={list(args.faithfulness.metrics)})) removes "
            f"features, but modality={args.modality!r} has no value to put in their place: build it with "
            "TabularTokens(..., means=[...]) (the training features' means, in the scale the model sees) or "
            "TabularTokens(...).fit(train_features), or pass faithfulness=FaithfulnessOptions(metrics=())"
        )
