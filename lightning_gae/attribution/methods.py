"""Any attribution method by name, in the form the faithfulness metrics score and the modalities render.

The attention methods of :func:`~lightning_gae.explain` give token relevance ``[B, N]``, as does
``"random"`` (the seeded floor every method must beat); Captum's gradient methods
(:mod:`lightning_gae.attribution.gradients`) give input-shaped maps for float inputs and one value
per token for token ids.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from lightning_gae._structures import ClassTarget, class_index
from lightning_gae.attribution.gradients import batch_tensor, captum_attribute, predict
from lightning_gae.engine.readout import check_inputs
from lightning_gae.methods import explain, get_method, method_names

__all__ = ["ATTRIBUTION_METHODS", "attribute"]

ATTRIBUTION_METHODS: tuple[str, ...] = method_names()
"""Every method the package registers, which :func:`attribute` and :func:`~lightning_gae.compare.compare` know: the
attention and LRP methods of :func:`~lightning_gae.explain`, ``"random"`` (the seeded floor) and Captum's gradient
methods (:func:`lightning_gae.methods.method_names` lists the methods registered since, yours included)."""


def attribute(
    method: str,
    model: nn.Module,
    inputs: Any,
    target: ClassTarget = None,
    embedding_layer: str | nn.Module | None = None,
    seed: int = 0,
    **options: Any,
) -> Tensor:
    """One attribution per sample for ``method``, in a form the metrics score and the modality renders.

    Args:
        method: a registered method (:func:`lightning_gae.methods.method_names`), such as those of
            :data:`~lightning_gae.attribution.ATTRIBUTION_METHODS`: ``"gae"``, ``"rollout"``,
            ``"raw_attention"``,
            ``"attn_gradcam"``, ``"attention_flow"``, ``"attnlrp"``, ``"transformer_attribution"`` (:func:`~lightning_gae.explain`), ``"random"`` (seeded uniform token
            relevance, the floor every method must beat), or Captum's ``"saliency"``,
            ``"input_x_gradient"``, ``"integrated_gradients"``, ``"gradient_shap"``.
        model: the classifier (an ``nn.Module`` returning logits ``[B, C]``, a tuple or ``.logits``).
            It runs in eval mode; every module's mode is restored and no parameter's ``.grad`` changes.
        inputs: a tensor (``model(x)``), a mapping of keyword arguments (``model(**x)``, e.g. a
            tokenizer's output), or ``(batch,)`` for a model whose forward takes the batch (a mapping or
            dataclass) itself; Captum's methods attribute its ``input_ids`` or ``pixel_values``
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
            batch, a mapping or batch without ``input_ids``/``pixel_values`` (for Captum's methods), or token ids whose embedding
            layer is not found (the message names ``embedding_layer=``).
        TypeError: inputs that are none of these (for Captum's methods).

    Example:
        Token relevance and Captum's input-shaped maps of a small ViT-style classifier (8 x 8 images in 2 x 2
        patches, read at token 0); token ids are attributed at their embedding (``embedding_layer=``):

        >>> import torch
        >>> from torch import nn
        >>> from lightning_gae.attribution import attribute
        >>> class ViT(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.patch, self.head = nn.Conv2d(1, 16, 2, stride=2), nn.Linear(16, 3)
        ...         layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
        ...         self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        ...     def forward(self, x):
        ...         return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2))[:, 0])
        >>> vit, images = ViT().eval(), torch.rand(2, 1, 8, 8)
        >>> attribute("gae", vit, images).shape, attribute("integrated_gradients", vit, images, n_steps=8).shape
        (torch.Size([2, 16]), torch.Size([2, 1, 8, 8]))
        >>> text = nn.Sequential(nn.Embedding(10, 16), nn.Flatten(), nn.Linear(5 * 16, 3))
        >>> attribute("saliency", text, torch.randint(10, (2, 5)), embedding_layer="0").shape
        torch.Size([2, 5])
    """
    if method not in method_names():
        raise ValueError(f"method={method!r}; choose one of {list(method_names())}")
    found = get_method(method)
    if found.kind == "attention":
        return explain(model, inputs, target=target, method=method, **options).tokens
    if found.kind == "lrp":
        # Relevance at the word embeddings: embedding_layer names them where get_input_embeddings() cannot.
        return explain(model, inputs, target=target, method=method, embedding_layer=embedding_layer, **options).tokens
    if found.kind == "baseline":
        # Only the token count is needed, from a method without a backward.
        return found.rule(explain(model, inputs, method=found.explained_as, **options).tokens, seed)
    check_inputs(model, inputs)  # as explain() does: Captum would fail inside, or attribute NaN inputs silently
    x, _ = batch_tensor(inputs)
    target_index = predict(model, inputs) if target is None else class_index(target, x.shape[0], x.device)
    return captum_attribute(method, model, inputs, target_index, embedding_layer, seed, options)
