"""Captum's gradient methods on this library's inputs: the adapter ``compare`` and ``GAECallback`` share.

Token ids cannot be interpolated or perturbed, so Captum's methods see them through the embedding
layer: its output is the attributed tensor (what Captum's ``Layer*`` classes do), and the result is
summed over the embedding dimension. Captum's ``LayerGradientShap`` scales and perturbs the
*inputs*, which integer ids do not allow; attributing at the layer's output through one forward
hook keeps every Captum method, ``GradientShap`` included, the same class on every modality:
``saliency`` there is the absolute gradient of the embedding (``LayerGradientXActivation`` without
the multiplication), ``input_x_gradient`` is ``LayerGradientXActivation``, and
``integrated_gradients`` is ``LayerIntegratedGradients`` from a zero embedding.

A model whose forward takes the batch itself (``model(batch)``, inputs ``(batch,)`` with a mapping or dataclass
batch) is attributed at the batch's ``input_ids`` or ``pixel_values``: Captum's forward builds the batch again around
the tensor it varies, the other entries as the batch holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lightning_gae._structures import eval_mode, forward_logits, keyword_inputs, model_logits, with_fields
from lightning_gae.lrp.mode import word_embedding
from lightning_gae.methods import get_method, methods_of

__all__ = ["CAPTUM_METHODS", "batch_tensor", "captum_attribute", "predict"]

CAPTUM_METHODS: dict[str, Callable[[Callable[..., Tensor]], Any]] = {m.name: m.rule for m in methods_of("gradient")}
"""Captum's gradient methods the package registers, by the names ``attribute``, ``compare`` and the callback use:
each builds its Captum attribution from the forward function (``lightning_gae/methods/gradients.py``)."""

# Keys of a keyword-argument input that hold the tensor being explained, in order of preference.
_ATTRIBUTED_KEYS = ("input_ids", "pixel_values")


def batch_tensor(inputs: Any) -> tuple[Tensor, str | None]:
    """The tensor attributed by Captum's methods and its key (None for a plain tensor).

    Args:
        inputs: a tensor (``model(x)``), a mapping of keyword arguments (``model(**x)``), or ``(batch,)`` (also a
            dataclass batch alone) for a model whose forward takes the batch itself.

    Raises:
        ValueError: a mapping or batch without ``input_ids``/``pixel_values``.
        TypeError: inputs that are none of these.
    """
    if isinstance(inputs, Tensor):
        return inputs, None
    keywords = keyword_inputs(inputs)
    if keywords is not None:
        for key in _ATTRIBUTED_KEYS:
            if isinstance(keywords.get(key), Tensor):
                return keywords[key], key
        raise ValueError(
            f"inputs hold the keys {sorted(keywords)}; the attributed tensor must be one of "
            f"{list(_ATTRIBUTED_KEYS)} (the rest is passed to the model as it is)"
        )
    raise TypeError("inputs must be a tensor, a mapping of keyword arguments (a tokenizer's output), or (batch,) for a "
                    f"model whose forward takes the batch (a mapping or dataclass) itself; got {type(inputs).__name__}")


def _batch_argument(inputs: Any) -> Any:
    """The batch a model whose forward takes it is called with (``(batch,)`` or a dataclass), else None."""
    if isinstance(inputs, Mapping):
        return None
    return inputs[0] if isinstance(inputs, (tuple, list)) else inputs


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


def predict(model: nn.Module, inputs: Any) -> Tensor:
    """``[B]`` the model's predicted classes, in eval mode and without gradients."""
    with torch.no_grad(), eval_mode(model):
        return forward_logits(model, inputs).argmax(dim=1)


class _LogitsForward:
    """``f(x, *values)``: the model on the attributed tensor, the other inputs positional.

    Captum only passes positional arguments and expands the tensors among them with the inputs
    (IG's steps, GradientSHAP's samples); non-tensor inputs stay fixed here. The model is called with keyword
    arguments, or, given ``batch``, with that batch rebuilt around them (a forward that takes the batch itself).
    """

    def __init__(self, model: nn.Module, key: str | None, tensor_keys: Sequence[str], fixed: Mapping[str, Any],
                 batch: Any = None) -> None:
        self.model, self.key, self.tensor_keys, self.fixed = model, key, list(tensor_keys), dict(fixed)
        self.batch = batch

    def __call__(self, x: Tensor, *values: Tensor) -> Tensor:
        if self.key is None:
            output = self.model(x)
        else:
            given = {self.key: x, **dict(zip(self.tensor_keys, values)), **self.fixed}
            output = self.model(**given) if self.batch is None else self.model(with_fields(self.batch, given))
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
    """The token embedding Captum's methods attribute at, and how to name it in errors."""
    layer = word_embedding(model, embedding_layer)
    return layer, repr(embedding_layer) if isinstance(embedding_layer, str) else type(layer).__name__


def captum_attribute(method: str, model: nn.Module, inputs: Any, target: Tensor,
                      embedding_layer: str | nn.Module | None, seed: int, options: Mapping[str, Any]) -> Tensor:
    """The gradient method ``method`` (a registered method of kind ``"gradient"``) on the attributed tensor of
    ``inputs`` (see :func:`batch_tensor`), ``target`` ``[B]`` classes.

    Returns float32, detached: the input's shape for float inputs, ``[B, T]`` for token ids (the
    embedding's attribution summed over ``D``). ``options`` go to Captum's ``attribute`` over the method's defaults.
    """
    found = get_method(method)
    x, key = batch_tensor(inputs)
    batch, token_ids = x.shape[0], not x.is_floating_point()
    # A key names the attributed tensor among keyword inputs (batch_tensor): the others go with it.
    keywords = keyword_inputs(inputs) if key is not None else None
    rest = {k: v for k, v in keywords.items() if k != key} if keywords is not None else {}
    tensor_keys = [k for k, v in rest.items() if isinstance(v, Tensor)]
    fixed = {k: v for k, v in rest.items() if not isinstance(v, Tensor)}
    given = None if key is None else _batch_argument(inputs)
    logits = _LogitsForward(model, key, tensor_keys, fixed, given)
    forward: Callable[..., Tensor] = logits
    with _seeded(seed, _cuda_devices(model)), eval_mode(model), torch.inference_mode(False), torch.enable_grad():
        # Fresh copies: tensors made under inference mode (a validation loop) cannot enter a graph.
        x, target = x.detach().clone(), target.clone()
        extra = tuple(rest[k].detach().clone() for k in tensor_keys)
        if token_ids:
            layer, name = _embedding_layer(model, embedding_layer)
            embedded = _EmbeddingForward(logits, layer, name)
            x, extra = embedded.embeddings(x, *extra), (x, *extra)
            forward = embedded
        x.requires_grad_()
        kwargs = {**({} if found.options is None else found.options(x, batch)), **options}
        result = found.rule(forward).attribute(x, target=target, additional_forward_args=extra or None, **kwargs)
    result = result.detach().float()
    # One value per token id: the embedding's attribution summed over its dimension.
    return result.sum(dim=-1) if token_ids else result
