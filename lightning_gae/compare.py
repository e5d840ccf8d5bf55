"""GAE next to its attention baselines and Captum's gradient methods, on the same samples and metrics.

:func:`attribute` gives one attribution per sample for any method named in
:data:`ATTRIBUTION_METHODS`, in a form the faithfulness metrics (:mod:`lightning_gae.metrics`) and
the modalities' ``render`` take: token relevance ``[B, N]`` for the attention methods and the
random floor, Captum's input-shaped maps for float inputs (images ``[B, C, H, W]``, features
``[B, F]``) and one value per token ``[B, T]`` for token ids. :func:`compare` scores every method
with every metric and times the attribution step; :class:`Comparison` holds the table.

Token ids cannot be interpolated or perturbed, so Captum's methods see them through the embedding
layer: its output is the attributed tensor (what Captum's ``Layer*`` classes do), and the result is
summed over the embedding dimension. Captum's ``LayerGradientShap`` scales and perturbs the
*inputs*, which integer ids do not allow; attributing at the layer's output through one forward
hook keeps every Captum method, ``GradientShap`` included, the same class on every modality:
``saliency`` there is the absolute gradient of the embedding (``LayerGradientXActivation`` without
the multiplication), ``input_x_gradient`` is ``LayerGradientXActivation``, and
``integrated_gradients`` is ``LayerIntegratedGradients`` from a zero embedding.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np
import torch
from captum.attr import GradientShap, InputXGradient, IntegratedGradients, Saliency
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_gae import visualize
from lightning_gae.explain import METHODS, eval_mode, explain, map_tensors, model_logits
from lightning_gae.metrics import (
    PERTURBATION_METRICS,
    AlignmentAccuracy,
    RationaleAgreement,
    RelevanceSegmentation,
    perturbation_metric,
    random_attribution,
)
from lightning_gae.metrics.functional.perturbation import Protocol, _check_protocol, _class_index, _forward_logits
from lightning_gae.modalities import ImageTokens, Modality, TabularTokens, TextTokens
from lightning_gae.streams import Streams

__all__ = [
    "ATTRIBUTION_METHODS",
    "DEFAULT_METHODS",
    "Comparison",
    "attribute",
    "compare",
    "comparison_grid",
    "infer_modality",
    "last_positions",
    "sequence_rows",
    "token_set_input",
    "token_set_inputs",
]

_CAPTUM: dict[str, Callable[[Callable[..., Tensor]], Any]] = {
    "saliency": Saliency,
    "input_x_gradient": InputXGradient,
    "integrated_gradients": IntegratedGradients,
    "gradient_shap": GradientShap,
}
ATTRIBUTION_METHODS: tuple[str, ...] = (*METHODS, "random", *_CAPTUM)
"""Every method :func:`attribute` and :func:`compare` know: the attention methods of
:func:`~lightning_gae.explain`, ``"random"`` (the seeded floor) and Captum's gradient methods."""
DEFAULT_METHODS: tuple[str, ...] = (*METHODS, "random", "saliency", "input_x_gradient", "integrated_gradients")
"""What :func:`compare` and ``lightning-gae compare`` run unless told otherwise (GradientSHAP is optional)."""

# Keys of a keyword-argument input that hold the tensor being explained, in order of preference.
_ATTRIBUTED_KEYS = ("input_ids", "pixel_values")
_IG_STEPS = 32
_IG_ROWS = 256  # interpolated inputs per forward+backward: bounds IG's memory, not its result
_SHAP_SAMPLES = 16
_SHAP_BASELINES = 8

Target = Union[None, int, Sequence[int], Tensor]
SetTarget = Union[Target, Callable[[Any], Tensor]]


def _batch_tensor(inputs: Any) -> tuple[Tensor, str | None]:
    """The tensor attributed by Captum's methods and its key (None for a plain tensor)."""
    if isinstance(inputs, Tensor):
        return inputs, None
    if isinstance(inputs, Mapping):
        for key in _ATTRIBUTED_KEYS:
            if isinstance(inputs.get(key), Tensor):
                return inputs[key], key
        raise ValueError(
            f"inputs is a mapping with keys {sorted(inputs)}; the attributed tensor must be one of "
            f"{list(_ATTRIBUTED_KEYS)} (the rest is passed to the model as keyword arguments)"
        )
    raise TypeError(f"inputs must be a tensor or a mapping of keyword arguments (a tokenizer's output); got {type(inputs).__name__}")


def _cuda_devices(model: nn.Module) -> list[int]:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


@contextmanager
def _seeded(seed: int, devices: Sequence[int]) -> Iterator[None]:
    """Captum draws GradientSHAP's noise and baseline choice from the global torch and numpy RNGs:
    seed both for the call and give the caller's state back."""
    numpy_state = np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            np.random.seed(seed)
            yield
    finally:
        np.random.set_state(numpy_state)


def _predict(model: nn.Module, inputs: Any) -> Tensor:
    with torch.no_grad(), eval_mode(model):
        return _forward_logits(model, inputs).argmax(dim=1)


class _LogitsForward:
    """``f(x, *values)``: the model on the attributed tensor, the other keyword inputs positional.

    Captum only passes positional arguments and expands the tensors among them with the inputs
    (IG's steps, GradientSHAP's samples); non-tensor keyword inputs stay fixed here.
    """

    def __init__(self, model: nn.Module, key: str | None, tensor_keys: Sequence[str], fixed: Mapping[str, Any]) -> None:
        self.model, self.key, self.tensor_keys, self.fixed = model, key, list(tensor_keys), dict(fixed)

    def __call__(self, x: Tensor, *values: Tensor) -> Tensor:
        if self.key is None:
            output = self.model(x)
        else:
            output = self.model(**{self.key: x}, **dict(zip(self.tensor_keys, values)), **self.fixed)
        logits = model_logits(output)
        if logits is None:
            raise ValueError(f"{type(self.model).__name__} returned no logits (a tensor, a tuple or .logits) for Captum to attribute")
        return logits


class _EmbeddingForward:
    """``g(embeds, ids, *values)``: ``forward(ids, *values)`` with the embedding layer's output replaced by ``embeds``."""

    def __init__(self, forward: _LogitsForward, layer: nn.Module, name: str) -> None:
        self.forward, self.layer, self.name = forward, layer, name

    def embeddings(self, ids: Tensor, *values: Tensor) -> Tensor:
        """The layer's output ``[B, T, D]`` in the model's own forward (whatever it feeds the layer)."""
        outputs: list[Any] = []
        handle = self.layer.register_forward_hook(lambda module, args, output: outputs.append(output))
        try:
            with torch.no_grad():
                self.forward(ids, *values)
        finally:
            handle.remove()
        found = outputs[0] if len(outputs) == 1 else None
        if not isinstance(found, Tensor) or found.dim() != 3 or found.shape[:2] != ids.shape:
            got = f"was called {len(outputs)} times" if found is None else (
                f"returned {tuple(found.shape) if isinstance(found, Tensor) else type(found).__name__}")
            raise ValueError(f"embedding_layer {self.name} {got}; it must be called once and map the token ids "
                             f"{tuple(ids.shape)} to embeddings [B, T, D]: name the model's token embedding")
        return found.detach()

    def __call__(self, embeds: Tensor, ids: Tensor, *values: Tensor) -> Tensor:
        handle = self.layer.register_forward_hook(lambda module, args, output: embeds)
        try:
            return self.forward(ids, *values)
        finally:
            handle.remove()


def _embedding_layer(model: nn.Module, embedding_layer: str | nn.Module | None) -> tuple[nn.Module, str]:
    if isinstance(embedding_layer, nn.Module):
        return embedding_layer, type(embedding_layer).__name__
    if isinstance(embedding_layer, str):
        try:
            return model.get_submodule(embedding_layer), repr(embedding_layer)
        except AttributeError:
            raise ValueError(f"embedding_layer={embedding_layer!r} is not a module path of {type(model).__name__}; "
                             "give the dotted path of the layer mapping token ids to vectors, e.g. 'embed.tokens'") from None
    # Hugging Face models say where their token embeddings are, also inside a LightningModule.
    for module in model.modules():
        get_embeddings = getattr(module, "get_input_embeddings", None)
        if callable(get_embeddings):
            try:
                layer = get_embeddings()
            except NotImplementedError:
                continue
            if isinstance(layer, nn.Module):
                return layer, f"{type(module).__name__}.get_input_embeddings()"
    raise ValueError(
        f"token-id inputs are attributed at the embedding layer, and {type(model).__name__} has no "
        "get_input_embeddings(): pass embedding_layer='path.to.embedding' (a module path, e.g. 'embed.tokens')"
    )


def _captum_options(method: str, x: Tensor, batch: int) -> dict[str, Any]:
    """Moderate defaults: IG with 32 steps in chunks of 256 rows; GradientSHAP from seeded Gaussian
    baselines at the inputs' scale around IG's zero baseline."""
    if method == "integrated_gradients":
        return {"n_steps": _IG_STEPS, "internal_batch_size": max(batch, _IG_ROWS)}
    if method == "gradient_shap":
        baselines = torch.randn((_SHAP_BASELINES, *x.shape[1:])) * x.detach().float().std().cpu()
        return {"n_samples": _SHAP_SAMPLES, "baselines": baselines.to(x)}
    return {}


def _captum_attribute(method: str, model: nn.Module, inputs: Any, target: Tensor,
                      embedding_layer: str | nn.Module | None, seed: int, options: Mapping[str, Any]) -> Tensor:
    x, key = _batch_tensor(inputs)
    batch, token_ids = x.shape[0], not x.is_floating_point()
    rest = {k: v for k, v in inputs.items() if k != key} if key is not None else {}
    tensor_keys = [k for k, v in rest.items() if isinstance(v, Tensor)]
    fixed = {k: v for k, v in rest.items() if not isinstance(v, Tensor)}
    forward: Callable[..., Tensor] = _LogitsForward(model, key, tensor_keys, fixed)
    with _seeded(seed, _cuda_devices(model)), eval_mode(model), torch.inference_mode(False), torch.enable_grad():
        # Fresh copies: tensors made under inference mode (a validation loop) cannot enter a graph.
        x, target = x.detach().clone(), target.clone()
        extra = tuple(rest[k].detach().clone() for k in tensor_keys)
        if token_ids:
            layer, name = _embedding_layer(model, embedding_layer)
            forward = _EmbeddingForward(forward, layer, name)
            x, extra = forward.embeddings(x, *extra), (x, *extra)
        x.requires_grad_()
        kwargs = {**_captum_options(method, x, batch), **options}
        result = _CAPTUM[method](forward).attribute(x, target=target, additional_forward_args=extra or None, **kwargs)
    result = result.detach().float()
    # One value per token id: the embedding's attribution summed over its dimension.
    return result.sum(dim=-1) if token_ids else result


def attribute(
    method: str,
    model: nn.Module,
    inputs: Any,
    target: Target = None,
    embedding_layer: str | nn.Module | None = None,
    seed: int = 0,
    **options: Any,
) -> Tensor:
    """One attribution per sample for ``method``, in a form the metrics score and the modality renders.

    Args:
        method: a name in :data:`ATTRIBUTION_METHODS`: ``"gae"``, ``"rollout"``, ``"raw_attention"``,
            ``"attn_gradcam"`` (:func:`~lightning_gae.explain`), ``"random"`` (seeded uniform token
            relevance, the floor every method must beat), or Captum's ``"saliency"``,
            ``"input_x_gradient"``, ``"integrated_gradients"``, ``"gradient_shap"``.
        model: the classifier (an ``nn.Module`` returning logits ``[B, C]``, a tuple or ``.logits``).
            It runs in eval mode; every module's mode is restored and no parameter's ``.grad`` changes.
        inputs: a tensor (``model(x)``) or a mapping of keyword arguments (``model(**x)``, e.g. a
            tokenizer's output); Captum's methods attribute its ``input_ids`` or ``pixel_values``
            and pass the rest (``attention_mask``, ...) to the model unchanged.
        target: the class explained: None (each sample's prediction), an int, or one class per sample.
        embedding_layer: for token-id inputs and Captum's methods, the layer mapping ids to vectors:
            a module path (``"embed.tokens"``) or the module; None finds it with Hugging Face's
            ``get_input_embeddings()`` on the model or any submodule.
        seed: seeds ``"random"`` and GradientSHAP's baselines and noise (the caller's RNG state is kept).
        options: keyword arguments of the underlying call, over the defaults: ``query`` or
            ``attention_modules`` of :func:`~lightning_gae.explain` for the attention methods and
            ``"random"``; Captum's ``attribute`` arguments otherwise (``n_steps`` and
            ``internal_batch_size``, default 32 and 256 for IG; ``baselines``, ``n_samples``,
            ``stdevs``; default for GradientSHAP: 16 samples from 8 Gaussian baselines with the
            inputs' standard deviation).

    Returns:
        float32, detached: token relevance ``[B, N]`` for the attention methods and ``"random"``;
        for Captum's methods the input's shape for float inputs (images ``[B, C, H, W]``, features
        ``[B, F]``) and ``[B, T]`` for token ids (the embedding's attribution summed over ``D``).

    Raises:
        ValueError: an unknown method (the message lists them), a target that does not fit the
            batch, a mapping without ``input_ids``/``pixel_values``, or token ids whose embedding
            layer is not found (the message names ``embedding_layer=``).
        TypeError: inputs that are neither a tensor nor a mapping.

    Example::

        from lightning_gae.compare import attribute

        gae = attribute("gae", vit, images)                       # [B, N] token relevance
        ig = attribute("integrated_gradients", vit, images)       # [B, C, H, W]
        ig_text = attribute("integrated_gradients", bert, tokenizer(texts, padding=True, return_tensors="pt"))  # [B, T]
        shap = attribute("gradient_shap", token_model, ids, embedding_layer="embed.tokens", seed=1)
    """
    if method not in ATTRIBUTION_METHODS:
        raise ValueError(f"method={method!r}; choose one of {list(ATTRIBUTION_METHODS)}")
    if method in METHODS:
        return explain(model, inputs, target=target, method=method, **options).tokens
    if method == "random":
        # Only the token count is needed, and raw attention needs no backward.
        return random_attribution(explain(model, inputs, method="raw_attention", **options).tokens, seed)
    x, _ = _batch_tensor(inputs)
    target_index = _predict(model, inputs) if target is None else _class_index(target, x.shape[0], x.device)
    return _captum_attribute(method, model, inputs, target_index, embedding_layer, seed, options)


@dataclass
class Comparison:
    """Every method scored by every metric on the same samples and targets.

    Attributes:
        methods: method -> {metric name -> value, ..., ``"seconds_per_sample"`` -> the attribution
            step's wall-clock time per sample}.
        num_samples: how many samples were scored.
        higher_is_better: metric name -> its direction (the metric's ``higher_is_better``).
        protocol: which class was explained and scored, ``"target"`` or ``"predicted"`` (see :func:`compare`).
        stderr: method -> {metric name -> the value's standard error over the samples} (see
            :func:`compare`); empty when not measured.
        sets: the token sets of a model with several (encoder/decoder, image/text); empty otherwise.
            Their scores are named ``<set>/<metric>``.
        relevance: for a model with several token sets, method -> set -> the relevance of every
            sample, ``[N, N_set]`` (``[N, T, N_set]`` for sequence outputs: a row per target position).
        skipped: method -> why it was left out (Captum's methods on a model with several token sets).
    """

    methods: dict[str, dict[str, float]]
    num_samples: int
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    protocol: str = "target"
    stderr: dict[str, dict[str, float]] = field(default_factory=dict)
    sets: list[str] = field(default_factory=list)
    relevance: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"methods": {name: {metric: value, ..., "seconds_per_sample": s}}, "num_samples": n, "protocol": p,
        "stderr": {name: {metric: se}}}``, JSON-ready."""
        out = {"methods": {name: dict(values) for name, values in self.methods.items()}, "num_samples": self.num_samples,
               "protocol": self.protocol, "stderr": {name: dict(values) for name, values in self.stderr.items()}}
        if self.sets:
            out["sets"] = list(self.sets)
        if self.skipped:
            out["skipped"] = dict(self.skipped)
        return out

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        """A table: a row per method, a column per metric (↑ higher is better, ↓ lower), the best in bold
        (``± standard error`` where measured), then the time."""
        metrics = list(self.higher_is_better)
        best = {}
        for metric, higher in self.higher_is_better.items():
            values = [scores[metric] for scores in self.methods.values()]
            best[metric] = max(values) if higher else min(values)
        header = ["method", *(f"{m} {'↑' if self.higher_is_better[m] else '↓'}" for m in metrics), "ms / sample"]
        lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
        for name, scores in self.methods.items():
            errors = self.stderr.get(name, {})
            cells = [(f"**{scores[m]:.4g}**" if scores[m] == best[m] else f"{scores[m]:.4g}")
                     + (f" ± {errors[m]:.2g}" if m in errors else "") for m in metrics]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {1000 * scores['seconds_per_sample']:.3g} |")
        lines += [f"\n{name} left out: {reason}" for name, reason in self.skipped.items()]
        return "\n".join(lines) + "\n"


def _take(inputs: Any, start: int, stop: int, batch: int) -> Any:
    """Samples ``start:stop`` of every tensor with the batch in dim 0."""
    return map_tensors(inputs, lambda t: t[start:stop] if t.dim() and t.shape[0] == batch else t)


def _per_sample_states(metric: Metric, update: Callable[[int], None], count: int) -> list[dict[str, Tensor]]:
    """The metric's states after ``update(i)`` alone, for each sample ``i`` of ``count``."""
    states = []
    for i in range(count):
        metric.reset()
        update(i)
        states.append({name: value.detach().clone() for name, value in metric.metric_state.items()})
    return states


def _value_and_stderr(metric: Metric, samples: Sequence[Mapping[str, Tensor]]) -> tuple[dict[str, float], dict[str, float]]:
    r"""The metric over all samples and its jackknife standard error, from one state per sample.

    Every state of the library's metrics is a sum over samples (that is how they sync across
    processes), so the states of all samples but ``i`` are the total minus sample ``i``'s, and the
    metric's own ``compute`` gives each leave-one-out value :math:`\theta_{(i)}`. The jackknife
    :math:`\mathrm{se}^2 = \frac{n - 1}{n} \sum_i (\theta_{(i)} - \bar\theta)^2` is exactly
    :math:`s / \sqrt{n}` for a mean over samples (the perturbation AUCs, AP, AUPRC) and also
    covers ratios over pooled counts (pixel accuracy, mIoU). Returns ``{key: value}`` and
    ``{key: se}`` (key ``""`` for a scalar metric).
    """
    def computed(states: Mapping[str, Tensor]) -> dict[str, float]:
        for name, value in states.items():
            setattr(metric, name, value)
        # The class's own compute, not the instance's wrapper: that one syncs and caches.
        out = type(metric).compute(metric)
        return {key: float(v) for key, v in out.items()} if isinstance(out, dict) else {"": float(out)}

    n = len(samples)
    per_sample_values = getattr(metric, "per_sample_values", None)
    if per_sample_values is not None:
        # A mean over samples: the jackknife reduces to the own values' standard deviation over sqrt(n),
        # without a compute() per left-out sample.
        own = per_sample_values({name: torch.stack([s[name] for s in samples]) for name in samples[0]})
        spread = float(own.std()) / math.sqrt(n) if n > 1 else math.nan
        return {"": float(own.mean())}, {"": spread}
    total = {name: torch.stack([s[name] for s in samples]).sum(dim=0) for name in samples[0]}
    value = computed(total)
    leave_one_out = [computed({name: total[name] - s[name] for name in total}) for s in samples]
    stderr = {}
    for key in value:
        others = torch.tensor([v[key] for v in leave_one_out], dtype=torch.float64)
        stderr[key] = math.sqrt((n - 1) / n * float(((others - others.mean()) ** 2).sum())) if n > 1 else math.nan
    metric.reset()
    return value, stderr


def _truth_metric(modality: Modality) -> tuple[str, Metric, Callable[[Any, Tensor, Tensor], tuple[Any, ...]]]:
    """``(prefix, metric, args)``: the ground-truth metric of the modality and how to call its update."""
    if isinstance(modality, ImageTokens):
        return "segmentation", RelevanceSegmentation(modality, sync_on_compute=False), lambda x, a, t: (a, t)
    if isinstance(modality, TextTokens):
        return "rationale", RationaleAgreement(sync_on_compute=False), lambda x, a, t: (
            modality.unit_scores(a, x), t, modality.removable(x))
    if isinstance(modality, TabularTokens):
        return "feature_recovery", RationaleAgreement(sync_on_compute=False), lambda x, a, t: (
            modality.unit_scores(a, x), t)
    raise ValueError(f"ground_truth needs an ImageTokens, TextTokens or TabularTokens modality; got {type(modality).__name__}")


# --- models with several token sets ------------------------------------------------------------------


def _fits(modality: Modality, x: Tensor, size: int) -> bool:
    """Whether ``x`` is laid out like ``size`` tokens of ``modality``."""
    if isinstance(modality, ImageTokens):
        return x.dim() == 4 and x.is_floating_point() and modality.prefix_tokens + (
            x.shape[-2] // modality.patch_size) * (x.shape[-1] // modality.patch_size) == size
    if isinstance(modality, TextTokens):
        return x.dim() == 2 and not x.is_floating_point() and x.shape[1] == size
    if isinstance(modality, TabularTokens):
        return x.dim() == 2 and x.shape[1] == len(modality.feature_names) == size - modality.prefix_tokens
    return False


def token_set_inputs(
    inputs: Any,
    sizes: Mapping[str, int],
    modality: Mapping[str, Modality] | None = None,
    set_inputs: Mapping[str, int | str] | None = None,
    caller: str = "compare",
) -> dict[str, tuple[Modality, int | str]]:
    """Each token set's modality and the model input its tokens come from.

    Args:
        inputs: the model inputs: a mapping of keyword arguments, a tuple, or one tensor.
        sizes: token set -> its token count (``{x: r.shape[1] for x, r in explain(...).relevance.items()}``).
        modality: set -> modality; a set left out is inferred when exactly one input is images whose
            patch grid fits its token count (:meth:`ImageTokens.infer`).
        set_inputs: set -> the key of a mapping input or the position in a tuple; a set left out
            takes the one input its modality fits (masks, keys ending in ``mask``, hold no tokens).
        caller: named in the errors (``"GAECallback"``, ``"compare"``).

    Returns:
        set -> ``(modality, key or position)``, one input per set.

    Raises:
        ValueError: a set named that the model does not have, a set whose modality cannot be
            inferred, an input two sets fit alike (equal lengths: pass ``set_inputs``), or an input
            given that does not fit the set's modality.
    """
    given = dict(modality or {})
    for name, argument in (("modality", given), ("set_inputs", set_inputs or {})):
        unknown = [x for x in argument if x not in sizes]
        if unknown:
            raise ValueError(f"{caller}({name}=...) names token sets {unknown}; the model's sets are {list(sizes)} "
                             "(from explain(...).relevance)")
    if isinstance(inputs, Mapping):
        # Masks (attention_mask, key_padding_mask, ...) are laid out like the tokens but hold none.
        candidates = {k: v for k, v in inputs.items() if isinstance(v, Tensor) and not str(k).endswith("mask")}
    elif isinstance(inputs, (tuple, list)):
        candidates = {i: v for i, v in enumerate(inputs) if isinstance(v, Tensor)}
    else:
        candidates = {0: inputs}
    out: dict[str, tuple[Modality, int | str]] = {}
    for x, size in sizes.items():
        key = (set_inputs or {}).get(x)
        if key is not None and key not in candidates:
            raise ValueError(f"{caller}(set_inputs={{{x!r}: {key!r}}}): the model inputs have no tensor {key!r}; "
                             f"they are {list(candidates)}")
        chosen = given.get(x)
        if chosen is None:
            inferred = [(k, ImageTokens.infer(v, size)) for k, v in candidates.items() if key in (None, k)]
            inferred = [(k, m) for k, m in inferred if m is not None]
            if len(inferred) != 1:
                raise ValueError(f"{caller}: cannot infer the modality of token set {x!r} ({size} tokens); pass "
                                 f"modality={{{x!r}: ImageTokens(patch_size=...) or TextTokens(...)}} for every set "
                                 f"(the model's sets: {list(sizes)})")
            key, chosen = inferred[0]
        if key is None:
            fits = [k for k, v in candidates.items() if _fits(chosen, v, size)]
            if len(fits) != 1:
                found = f"the inputs {fits} fit it alike" if fits else "no input fits it"
                raise ValueError(f"{caller}: token set {x!r} ({size} tokens, {chosen!r}): {found}; pass "
                                 f"set_inputs={{set: input key or tuple position}} for the sets {list(sizes)}")
            key = fits[0]
        if not _fits(chosen, candidates[key], size):
            raise ValueError(f"{caller}: {chosen!r} of token set {x!r} ({size} tokens) does not fit input {key!r} of "
                             f"shape {tuple(candidates[key].shape)}")
        out[x] = (chosen, key)
    taken = [key for _, key in out.values()]
    doubled = sorted({str(k) for k in taken if taken.count(k) > 1})
    if doubled:
        raise ValueError(f"{caller}: the token sets {list(out)} were matched to the inputs {taken}, {doubled} more than "
                         "once; pass modality={set: ImageTokens(...)/TextTokens(...)} for every set and "
                         "set_inputs={set: input key or tuple position}")
    return out


def last_positions(model: nn.Module, inputs: Any, **options: Any) -> Tensor:
    """``[B]`` the last real position of the query set (a decoder) per sample, as ``explain(query="last")`` reads it.

    ``options``: ``attention_modules`` or ``streams`` of :func:`~lightning_gae.explain`.
    """
    return explain(model, inputs, method="raw_attention", query="last", **options).query


def sequence_rows(model: nn.Module, inputs: Any, method: str, last: Tensor, labels: Tensor | None = None,
                  **options: Any) -> dict[str, Tensor]:
    """Set -> ``[B, T, N_set]``: row ``t`` is ``explain(..., query=t)``'s relevance of the set, for sequence outputs.

    One explanation per position ``t`` over the whole batch, of the prediction made at ``t`` (the
    argmax, or ``labels[:, t]``). A sample whose last real position (``last``) is before ``t`` is
    read at that last position and its row ``t`` is zeroed: nothing is predicted there.

    Args:
        model: a model whose logits are ``[B, T, C]`` over the query set (an encoder-decoder).
        inputs: its inputs.
        method: a method of :func:`~lightning_gae.explain`.
        last: ``[B]`` from :func:`last_positions`.
        labels: ``[B, T]`` classes to explain per position; None: the predictions.
        options: ``attention_modules`` or ``streams`` of :func:`~lightning_gae.explain`.
    """
    rows: dict[str, list[Tensor]] = {}
    for t in range(int(last.max()) + 1):
        query = torch.clamp(last, max=t)
        beyond = (last < t).cpu()
        target = None if labels is None else labels.gather(1, query.to(labels.device)[:, None])[:, 0]
        exp = explain(model, inputs, target=target, method=method, query=query, **options)
        for x, row in exp.relevance.items():
            rows.setdefault(x, []).append(row.detach().float().cpu().masked_fill(beyond[:, None], 0.0))
    return {x: torch.stack(found, dim=1) for x, found in rows.items()}


def infer_modality(model: nn.Module, inputs: Any) -> ImageTokens:
    """The :class:`ImageTokens` of a ViT-style model on square images, from one raw-attention pass.

    Raises:
        ValueError: inputs that are not square images, or a token count no patching explains
            (the message names ``modality=``).
    """
    x, _ = _batch_tensor(inputs)
    probe = _take(inputs, 0, 1, x.shape[0])
    num_tokens = explain(model, probe, method="raw_attention").tokens.shape[1]
    modality = ImageTokens.infer(_batch_tensor(probe)[0], num_tokens)
    if modality is None:
        raise ValueError(
            f"cannot tell how {type(model).__name__} made its {num_tokens} tokens from inputs of shape "
            f"{tuple(x.shape)} (only square ViT-style images are inferred); pass modality=ImageTokens(...), "
            "TextTokens(...) or TabularTokens(...)"
        )
    return modality


def compare(
    model: nn.Module,
    inputs: Any,
    target: SetTarget = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    metrics: Sequence[str] = ("positive_perturbation_auc", "negative_perturbation_auc"),
    modality: Modality | Mapping[str, Modality] | None = None,
    batch_size: int = 64,
    max_batch: int = 256,
    embedding_layer: str | nn.Module | None = None,
    seed: int = 0,
    protocol: Protocol = "target",
    ground_truth: Tensor | Mapping[str, Tensor] | None = None,
    streams: Streams | None = None,
    set_inputs: Mapping[str, int | str] | None = None,
) -> Comparison:
    r"""Score every attribution method with every perturbation metric on the same samples and targets.

    The classes explained are fixed once for all methods. Samples go through :func:`attribute`
    ``batch_size`` at a time; only the attribution step is timed (``time.perf_counter``), the
    metrics' own forwards are not. Each metric is updated with one sample at a time, so every value
    comes with its standard error over the samples (the jackknife, which for a mean over samples
    is the sample standard deviation over :math:`\sqrt{n}`), in :attr:`Comparison.stderr`.

    With ``ground_truth``, each method is also scored against the known answer: image masks
    ``[N, H, W]`` give ``segmentation_{pixel_accuracy,miou,mean_ap}``
    (:class:`~lightning_gae.metrics.RelevanceSegmentation`); rationale tokens ``[N, T]`` give
    ``rationale_{token_f1,auprc}`` over the removable tokens and informative features ``[N, F]``
    give ``feature_recovery_{token_f1,auprc}`` (:class:`~lightning_gae.metrics.RationaleAgreement`,
    ``token_f1`` being the share of the top-k units that are right, k the number of right ones).
    Attributions are scored as they come (Captum's signed maps included).

    The two protocols of the CVPR 2021 table, with the labels as ``target``:

    - ``protocol="target"``: every method explains ``target`` (None: the model's predictions) and
      the metrics score that class: accuracy is "the prediction is still ``target``";
    - ``protocol="predicted"``: every method explains the model's prediction, the probability
      metrics score it, and accuracy is "the prediction equals the label ``target``" (None: the
      unperturbed prediction), so the curve starts at the model's accuracy.

    Models with several token sets (``explain(...).relevance`` has more than one: encoder-decoders,
    image and text towers, co-attention) are compared set by set. Each method's relevance of every
    set is kept in :attr:`Comparison.relevance` (for sequence outputs ``[B, T, C]`` over the query
    set, a row per target position ``t``, each explained with ``query=t``, :func:`sequence_rows`).
    ``ground_truth`` is then a mapping by batch key, and each entry scores the set it belongs to:
    ``"alignment"`` ``[N, T]`` the source set's rows (``<set>/alignment_accuracy``,
    :class:`~lightning_gae.metrics.AlignmentAccuracy`), ``"masks"`` the image set
    (``<set>/segmentation_*``), ``"rationales"`` the text set (``<set>/rationale_*``). Perturbation
    metrics do not apply (they remove units of one input and read one class logit): ask for none.
    Captum's methods attribute one input tensor, not one per set; they are left out, with the reason
    in :attr:`Comparison.skipped` and a warning.

    Args:
        model: the classifier (logits ``[B, C]``, a tuple or ``.logits``); it is left in the mode it had.
        inputs: the samples: a tensor or a mapping of keyword arguments (see :func:`attribute`); a
            tuple of tensors for a model with several token sets (e.g. ``(src, tgt_in)``).
        target: None, an int, or one class per sample (usually the labels): the class explained
            and scored, or the labels the prediction is checked against (``protocol``). For a model
            with several token sets also ``[N, T]`` classes per target position, or a callable
            ``output -> Tensor[B]`` (e.g. an image-text similarity).
        methods: names from :data:`ATTRIBUTION_METHODS`.
        metrics: names from :data:`lightning_gae.metrics.PERTURBATION_METRICS`.
        modality: how inputs are removed and tokens mapped (``ImageTokens``, ``TextTokens``,
            ``TabularTokens``); None infers ``ImageTokens`` for ViT-style square images.
        batch_size: samples per attribution call and metric update.
        max_batch: at most this many perturbed inputs per forward pass of a metric.
        embedding_layer: the embedding of token-id inputs for Captum's methods (see :func:`attribute`).
        seed: seed of ``"random"`` and GradientSHAP; batch ``i`` uses ``seed + i``.
        protocol: ``"target"`` or ``"predicted"``, as above.
        ground_truth: None, or the known answer per sample (nonzero = right), as above; a mapping
            by batch key for a model with several token sets.
        streams: declares the token sets (:class:`~lightning_gae.Streams`) where no preset or inference does.
        set_inputs: set -> the input its tokens come from (see :func:`token_set_inputs`); needed
            when two sets' inputs look alike (equal lengths).

    Returns:
        A :class:`Comparison`; ``to_markdown()`` and ``to_dict()`` give the table.

    Raises:
        ValueError: an unknown method, metric or protocol (the message lists the known ones), a
            modality that cannot be inferred (the message names ``modality=``), ``batch_size < 1``,
            or anything :func:`attribute` rejects.

    Example::

        from lightning_gae.compare import compare

        result = compare(vit, images, methods=("gae", "rollout", "random", "integrated_gradients"))
        print(result.to_markdown())
        result.methods["gae"]["positive_perturbation_auc"]     # lower is better
        # The paper's two columns, scored against the labels:
        predicted = compare(vit, images, labels, protocol="predicted")
        target = compare(vit, images, labels, protocol="target")
    """
    unknown = [m for m in methods if m not in ATTRIBUTION_METHODS]
    if unknown or not methods:
        raise ValueError(f"methods={list(methods)}: choose from {list(ATTRIBUTION_METHODS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    total = _first_tensor(inputs).shape[0]
    try:
        probe = explain(model, _take(inputs, 0, 1, total), target=target if callable(target) else None,
                        method="raw_attention", streams=streams)
    except ValueError:
        # No attention to tell sets apart (a model scored with Captum's methods alone): one input, as before.
        if isinstance(modality, Mapping):
            raise
        probe = None
    if isinstance(modality, Mapping) or (probe is not None and len(probe.relevance) > 1):
        return _compare_sets(model, inputs, target, methods, metrics, modality, batch_size, seed, protocol, ground_truth,
                             streams, set_inputs, probe, total)
    unknown = [m for m in metrics if m not in PERTURBATION_METRICS]
    if unknown or not metrics:
        raise ValueError(f"metrics={list(metrics)}: choose from {list(PERTURBATION_METRICS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    _check_protocol(protocol)
    x, _ = _batch_tensor(inputs)
    total = x.shape[0]
    starts = range(0, total, batch_size)
    given = None if target is None else _class_index(target, total, x.device)
    if given is None or protocol == "predicted":
        explained = torch.cat([_predict(model, _take(inputs, s, s + batch_size, total)) for s in starts])
    else:
        explained = given
    # What the metrics are told: the class scored ("target"), or the labels to check against ("predicted").
    scored = explained if protocol == "target" else given
    if modality is None:
        modality = infer_modality(model, inputs)

    if ground_truth is not None and ground_truth.shape[0] != total:
        raise ValueError(f"ground_truth has {ground_truth.shape[0]} samples for {total} inputs; give one per sample")

    results: dict[str, dict[str, float]] = {}
    errors: dict[str, dict[str, float]] = {}
    directions: dict[str, bool] = {}
    for method in methods:
        scorers: dict[str, Metric] = {name: perturbation_metric(name, model, modality, max_batch=max_batch,
                                                                sync_on_compute=False, protocol=protocol)
                                      for name in metrics}
        truth_prefix, truth_metric, truth_args = _truth_metric(modality) if ground_truth is not None else ("", None, None)
        if truth_metric is not None:
            scorers[truth_prefix] = truth_metric
        states: dict[str, list[dict[str, Tensor]]] = {name: [] for name in scorers}
        seconds = 0.0
        for index, start in enumerate(starts):
            stop = min(start + batch_size, total)
            chunk = _take(inputs, start, stop, total)
            began = time.perf_counter()
            attributions = attribute(method, model, chunk, explained[start:stop], embedding_layer=embedding_layer,
                                     seed=seed + index)
            seconds += time.perf_counter() - began
            size = stop - start

            def one(i: int) -> tuple[Any, Tensor]:
                return _take(chunk, i, i + 1, size), attributions[i : i + 1]

            for name in metrics:
                reference = None if scored is None else scored[start:stop]
                states[name] += _per_sample_states(scorers[name], lambda i: scorers[name].update(
                    *one(i), None if reference is None else reference[i : i + 1]), size)
            if truth_metric is not None:
                truth = ground_truth[start:stop].to(attributions.device)
                states[truth_prefix] += _per_sample_states(truth_metric, lambda i: truth_metric.update(
                    *truth_args(*one(i), truth[i : i + 1])), size)
        results[method], errors[method] = {}, {}
        for name, scorer in scorers.items():
            value, stderr = _value_and_stderr(scorer, states[name])
            for key in value:
                column = name if key == "" else f"{name}_{key}"
                results[method][column], errors[method][column] = value[key], stderr[key]
                directions[column] = bool(scorer.higher_is_better)
        results[method]["seconds_per_sample"] = seconds / total
    return Comparison(methods=results, num_samples=total, higher_is_better=directions, protocol=protocol, stderr=errors)


def _first_tensor(inputs: Any) -> Tensor:
    found: list[Tensor] = []
    map_tensors(inputs, lambda t: found.append(t) or t)
    if not found:
        raise TypeError(f"inputs hold no tensor; got {type(inputs).__name__}")
    return found[0]


_SET_TRUTH = {"alignment": None, "masks": ImageTokens, "segmentation": ImageTokens, "rationales": TextTokens}


def token_set_input(inputs: Any, key: int | str) -> tuple[Tensor, Any]:
    """``(tensor, what the set's modality maps with)`` of the input at ``key`` (:func:`token_set_inputs`).

    The second is the tensor itself, or for ``input_ids`` among keyword inputs a mapping that also
    holds their ``attention_mask``, so that text padding is known.
    """
    tensor = inputs[key] if isinstance(inputs, (Mapping, tuple, list)) else inputs
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) and key == "input_ids" else None
    with_mask = isinstance(mask, Tensor) and mask.shape == tensor.shape
    return tensor, ({"input_ids": tensor, "attention_mask": mask} if with_mask else tensor)


def _compare_sets(model: nn.Module, inputs: Any, target: SetTarget, methods: Sequence[str], metrics: Sequence[str],
                  modality: Mapping[str, Modality] | None, batch_size: int, seed: int, protocol: str,
                  ground_truth: Tensor | Mapping[str, Tensor] | None, streams: Streams | None,
                  set_inputs: Mapping[str, int | str] | None, probe: Any, total: int) -> Comparison:
    """:func:`compare` for a model with several token sets: each set's relevance, scored against its own ground truth."""
    sizes = {x: r.shape[1] for x, r in probe.relevance.items()}
    if metrics:
        raise ValueError(
            f"metrics={list(metrics)} cannot apply to a model with the token sets {list(sizes)}: a perturbation metric "
            "removes units of one input and reads one class logit per sample, and here neither says which set's tokens "
            "to remove. Pass metrics=() and score the sets against ground truth (ground_truth={'alignment' | 'masks' | "
            "'rationales': tensor})"
        )
    if modality is not None and not isinstance(modality, Mapping):
        raise ValueError(f"modality={modality!r}: the model has the token sets {list(sizes)}; pass one per set, "
                         "modality={set: ImageTokens(...)/TextTokens(...)}")
    if ground_truth is not None and not isinstance(ground_truth, Mapping):
        raise ValueError(f"ground_truth of a model with the token sets {list(sizes)} is a mapping from the batch key "
                         f"({list(_SET_TRUTH)}) to its tensor, so that each set is scored with its own")
    truths = dict(ground_truth or {})
    unknown = [k for k in truths if k not in _SET_TRUTH]
    if unknown:
        raise ValueError(f"ground_truth keys {unknown}: use {list(_SET_TRUTH)}")
    layout = token_set_inputs(inputs, sizes, modality, set_inputs, "compare")
    sequence = (not callable(target) and probe.logits is not None and probe.logits.dim() == 3
                and probe.logits.shape[1] == probe.tokens.shape[1])
    scorers: dict[str, tuple[str, Callable[[], Metric], Callable[..., tuple[Any, ...]]]] = {}
    for key, truth in truths.items():
        if truth.shape[0] != total:
            raise ValueError(f"ground_truth[{key!r}] has {truth.shape[0]} samples for {total} inputs; give one per sample")
        kind = _SET_TRUTH[key]
        if kind is None:
            if not sequence or len(sizes) != 2:
                raise ValueError(f"ground_truth['alignment'] scores a source set per target position: it needs sequence "
                                 f"logits [B, T, C] over the query set, a class target and two token sets; the model has "
                                 f"{list(sizes)} and logits {None if probe.logits is None else tuple(probe.logits.shape)}")
            source = next(x for x in sizes if x != probe.query_set)
            scorers[key] = (f"{source}/alignment_accuracy", lambda: AlignmentAccuracy(sync_on_compute=False),
                            lambda chunk, by_set, truth: (by_set[source], truth))
            continue
        owners = [x for x, (m, _) in layout.items() if isinstance(m, kind)]
        if len(owners) != 1 or sequence:
            raise ValueError(f"ground_truth[{key!r}] scores the one {kind.__name__} set of a model read at one position; "
                             f"the sets are {[f'{x}: {m!r}' for x, (m, _) in layout.items()]}"
                             + ("; its outputs are sequences" if sequence else ""))
        x, (set_modality, input_key) = owners[0], layout[owners[0]]
        if kind is ImageTokens:
            scorers[key] = (f"{x}/segmentation", lambda m=set_modality: RelevanceSegmentation(m, sync_on_compute=False),
                            lambda chunk, by_set, truth, x=x: (by_set[x], truth))
        else:
            def rationale_args(chunk: Any, by_set: Mapping[str, Tensor], truth: Tensor, x: str = x,
                               m: Modality = set_modality, k: int | str = input_key) -> tuple[Any, ...]:
                mapped = token_set_input(chunk, k)[1]
                return m.unit_scores(by_set[x], mapped), truth, m.removable(mapped)

            scorers[key] = (f"{x}/rationale", lambda: RationaleAgreement(sync_on_compute=False), rationale_args)
    skipped = {m: (f"Captum's {m} attributes one input tensor, but this model takes one input per token set "
                   f"({', '.join(f'{x}: {k!r}' for x, (_, k) in layout.items())}), so it gives no relevance per set")
               for m in methods if m in _CAPTUM}
    if "attn_gradcam_vit" in methods:
        skipped["attn_gradcam_vit"] = "the ViT baseline's Grad-CAM is defined on one token set; attn_gradcam is its form for several"
    for method, reason in skipped.items():
        warnings.warn(f"compare: {reason}; {method} is left out", UserWarning, stacklevel=3)
    labels = target if isinstance(target, Tensor) and target.dim() == 2 else None
    starts = range(0, total, batch_size)
    results: dict[str, dict[str, float]] = {}
    errors: dict[str, dict[str, float]] = {}
    directions: dict[str, bool] = {}
    relevance: dict[str, dict[str, Tensor]] = {}
    for method in (m for m in methods if m not in skipped):
        explained = "raw_attention" if method == "random" else method
        metrics_now = {key: build() for key, (_, build, _) in scorers.items()}
        states: dict[str, list[dict[str, Tensor]]] = {key: [] for key in scorers}
        parts: dict[str, list[Tensor]] = {}
        seconds = 0.0
        for index, start in enumerate(starts):
            stop = min(start + batch_size, total)
            chunk = _take(inputs, start, stop, total)
            began = time.perf_counter()
            if sequence:
                last = last_positions(model, chunk, streams=streams)
                chunk_labels = None if labels is None else labels[start:stop].to(last.device)
                by_set = sequence_rows(model, chunk, explained, last, chunk_labels, streams=streams)
            else:
                chunk_target = target if callable(target) or target is None or isinstance(target, int) else \
                    torch.as_tensor(target)[start:stop]
                exp = explain(model, chunk, target=chunk_target, method=explained, streams=streams)
                by_set = {x: r.detach().float().cpu() for x, r in exp.relevance.items()}
            if method == "random":
                flat = [r.flatten(1) for r in by_set.values()]
                noise = random_attribution(torch.cat(flat, dim=1), seed + index).split([f.shape[1] for f in flat], dim=1)
                by_set = {x: n.reshape(r.shape) for (x, r), n in zip(by_set.items(), noise)}
            seconds += time.perf_counter() - began
            for x, r in by_set.items():
                parts.setdefault(x, []).append(r)
            for key, (_, _, args) in scorers.items():
                truth = truths[key][start:stop].cpu()
                metric = metrics_now[key]
                states[key] += _per_sample_states(metric, lambda i: metric.update(*args(
                    _take(chunk, i, i + 1, stop - start), {x: r[i : i + 1] for x, r in by_set.items()}, truth[i : i + 1])),
                    stop - start)
        relevance[method] = {x: torch.cat(found) for x, found in parts.items()}
        results[method], errors[method] = {}, {}
        for key, (name, _, _) in scorers.items():
            value, stderr = _value_and_stderr(metrics_now[key], states[key])
            for part in value:
                column = name if part == "" else f"{name}_{part}"
                results[method][column], errors[method][column] = value[part], stderr[part]
                directions[column] = bool(metrics_now[key].higher_is_better)
        results[method]["seconds_per_sample"] = seconds / total
    return Comparison(methods=results, num_samples=total, higher_is_better=directions, protocol=protocol, stderr=errors,
                      sets=list(sizes), relevance=relevance, skipped=skipped)


def comparison_grid(
    model: nn.Module,
    inputs: Any,
    methods: Sequence[str] = DEFAULT_METHODS,
    target: Target = None,
    modality: Modality | None = None,
    embedding_layer: str | nn.Module | None = None,
    seed: int = 0,
) -> np.ndarray:
    """A samples x (input | each method) picture of the attributions, drawn by the modality.

    Args:
        model: the classifier.
        inputs: the few samples to draw (a tensor or a mapping, see :func:`attribute`).
        methods: names from :data:`ATTRIBUTION_METHODS`, one column each.
        target: None (the predictions), an int, or one class per sample.
        modality: draws each sample; None infers ``ImageTokens`` for ViT-style square images.
        embedding_layer: see :func:`attribute`.
        seed: seed of ``"random"`` and GradientSHAP (``compare``'s first batch uses the same).

    Returns:
        uint8 ``[h, w, 3]`` (:func:`lightning_gae.visualize.grid`), rows titled with the explained class.

    Raises:
        ValueError: as :func:`attribute`, or a modality that cannot be inferred.

    Example::

        matplotlib.image.imsave("grid.png", comparison_grid(vit, images[:4], methods=("gae", "saliency")))
    """
    display, _ = _batch_tensor(inputs)
    if modality is None:
        modality = infer_modality(model, inputs)
    classes = _predict(model, inputs) if target is None else _class_index(target, display.shape[0], display.device)
    columns = []
    for method in methods:
        attributions = attribute(method, model, inputs, classes, embedding_layer=embedding_layer, seed=seed)
        # Pixels for images; one value per token or feature otherwise.
        if isinstance(modality, ImageTokens):
            columns.append(modality.pixel_map(attributions, display))
        else:
            columns.append(modality.unit_scores(attributions, inputs))
    cells = [[modality.render(display[i], None, ""), *(modality.render(display[i], maps[i], "") for maps in columns)]
             for i in range(display.shape[0])]
    rows = [f"#{i}: class {int(c)}" for i, c in enumerate(classes)]
    return visualize.grid(cells, rows, ["input", *methods])
