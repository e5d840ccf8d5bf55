"""GAECallback's arguments checked when it is built: everything that needs neither the model nor the data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_gae.methods import method_names
from lightning_gae.modalities.tokens import Modality
from lightning_gae.options import BatchOptions, DisplayOptions, EngineOptions, FaithfulnessOptions, RegionOptions

__all__ = ["check_arguments"]


def check_arguments(callback: Any) -> None:
    """Every check of ``GAECallback``'s arguments that needs neither the model nor the data, run when it is built:
    a typo in a config fails before either is built (as Lightning's own callbacks check theirs)."""
    for name, group, kind in (("faithfulness", callback.faithfulness, FaithfulnessOptions),
                              ("batches", callback.batches, BatchOptions), ("engine", callback.engine, EngineOptions),
                              ("display", callback.display, DisplayOptions), ("regions", callback.regions, RegionOptions)):
        if not isinstance(group, kind):
            raise ValueError(f"GAECallback({name}={group!r}): give a {kind.__name__}(...)")
    explaining = method_names("attention", "lrp")
    unknown = [m for m in callback.methods if m not in explaining]
    if unknown or not callback.methods:
        raise ValueError(f"GAECallback(methods={list(callback.methods)}): choose from {list(explaining)}")
    if not callable(callback.target) and callback.target not in ("pred", "label"):
        raise ValueError(f"GAECallback(target={callback.target!r}): use 'pred' (predicted class), 'label', or a "
                         "callable output -> Tensor[B]")
    if callable(callback.target) and (callback.faithfulness.metrics or callback.captum_baselines):
        raise ValueError("GAECallback(target=<callable>) explains a score that is not a class, which the "
                         "perturbation metrics and Captum baselines cannot score: pass "
                         "faithfulness=FaithfulnessOptions(metrics=()) and captum_baselines=()")
    if isinstance(callback.modality, Mapping):
        wrong = {k: type(v).__name__ for k, v in callback.modality.items() if not isinstance(v, Modality)}
        if wrong:
            raise ValueError(f"GAECallback(modality={{...}}): {wrong} are not modalities; give each token set an "
                             "ImageTokens, TextTokens or TabularTokens")
    elif callback.modality is not None and not isinstance(callback.modality, Modality):
        raise ValueError(f"GAECallback(modality={callback.modality!r}): give an ImageTokens, TextTokens or "
                         "TabularTokens, a mapping {token set: modality}, or None to infer it")
    for name in ("every_n_epochs", "every_n_train_steps"):
        value = getattr(callback, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"GAECallback({name}={value}): use a positive integer, or None to switch it off")
    if callback.every_n_epochs is None and callback.every_n_train_steps is None:
        raise ValueError("GAECallback: every_n_epochs and every_n_train_steps are both None; set one of them")
    if callback.num_samples < 1 and not callback.batches.sample_indices:
        raise ValueError(f"GAECallback(num_samples={callback.num_samples}): track at least one sample")
    unknown = [m for m in callback.captum_baselines if m not in method_names("gradient")]
    if unknown:
        raise ValueError(f"GAECallback(captum_baselines={list(callback.captum_baselines)}): choose from "
                         f"{list(method_names('gradient'))}")
    tabular = callback.modality.values() if isinstance(callback.modality, Mapping) else [callback.modality]
    if any(isinstance(m, Modality) and not m.can_remove for m in tabular) and callback.faithfulness.metrics:
        raise ValueError(
            f"GAECallback(faithfulness=FaithfulnessOptions(metrics={list(callback.faithfulness.metrics)})) removes "
            f"features, but modality={callback.modality!r} has no value to put in their place: build it with "
            "TabularTokens(..., means=[...]) (the training features' means, in the scale the model sees) or "
            "TabularTokens(...).fit(train_features), or pass faithfulness=FaithfulnessOptions(metrics=())"
        )
