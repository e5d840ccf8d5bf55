"""Captum attribution classes: GAE and its attention baselines behind Captum's ``attribute()`` contract.

``GenericAttention(model).attribute(inputs, target)`` returns relevance with the shape of
``inputs``, so GAE drops into anything built for Captum attributions: ``NoiseTunnel``,
``captum.metrics.infidelity`` / ``sensitivity_max``, ``captum.attr.visualization`` and
side-by-side comparisons with ``Saliency`` or ``IntegratedGradients``. The explanation itself is
:func:`lightning_gae.explain` (one forward, one backward for the whole batch); this module
only adapts its arguments and maps its token relevance ``[B, N]`` onto each input tensor.

Which input receives the relevance (``N`` is the number of tokens the model attends over):

* an image ``[B, C, H, W]`` (floating point): the patch grid of an :class:`~lightning_gae.ImageTokens` modality
  (given, or inferred from ``H``, ``W`` and ``N``), upsampled to the pixels (``interpolate_mode``:
  ``"nearest"`` by default, so each patch's pixels carry its token's relevance and patch means keep
  the token order; ``"bilinear"`` for display), the same for every channel;
* a tensor whose dim 1 holds one entry per token: token ids ``[B, T]`` get one value per id,
  embeddings ``[B, T, D]`` (e.g. Hugging Face ``inputs_embeds``) the token's value across ``D``;
  with :class:`~lightning_gae.TextTokens` padding ids are 0;
* with :class:`~lightning_gae.TabularTokens`, features ``[B, F]`` (``F`` = the number of feature names) get one
  value per feature, prefix tokens dropped;
* any other input of a tuple (a scale, a side input) gets zeros of its shape: it is not laid out
  like the tokens, so no relevance can be placed on it. At least one input must match.

Masks are not attributed: pass ``attention_mask`` in ``additional_forward_args``, as Captum asks
for every argument that is not explained (and so that ``NoiseTunnel`` does not add noise to it).
A model whose forward takes the batch itself (a mapping or dataclass) is explained through a
``forward_func`` that builds the batch from those tensors; ``attribute(batch)`` is refused with that call.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Union

import torch
from captum.attr import GradientAttribution
from captum.log import log_usage
from torch import Tensor, nn

from lightning_gae._structures import input_tensor, keyword_inputs
from lightning_gae.engine.readout import Query
from lightning_gae.methods import explain
from lightning_gae.methods.attention_flow import ATTENTION_FLOW
from lightning_gae.methods.attn_gradcam import ATTN_GRADCAM
from lightning_gae.methods.attnlrp import ATTNLRP
from lightning_gae.methods.gae import GAE
from lightning_gae.methods.raw_attention import RAW_ATTENTION
from lightning_gae.methods.rollout import ROLLOUT
from lightning_gae.methods.transformer_attribution import TRANSFORMER_ATTRIBUTION
from lightning_gae.engine.token_sets import Streams
from lightning_gae.modalities import ImageTokens, Modality
from lightning_gae.modalities.tokens import spread

__all__ = ["AttentionAttribution", "AttentionFlow", "AttnLRP", "AttentionGradCAM", "AttentionRollout", "GenericAttention", "RawAttention",
           "TransformerAttribution"]

TensorOrTuple = Union[Tensor, tuple[Tensor, ...]]
InterpolateMode = Literal["nearest", "bilinear"]
AttributionTarget = Union[None, int, Sequence[int], Tensor, Callable[[Any], Tensor]]


class _ForwardFunction(nn.Module):
    """A plain ``forward_func`` seen as a module that owns ``model``.

    ``explain()`` needs a module: it switches the model to eval mode (and back) and the recorder
    names attention layers by module path. Owning ``model`` as a child gives the first;
    reporting the model's own ``named_modules`` gives the second with the model's paths
    (``"bert.encoder.layer.0..."``, not ``"model.bert..."``), so ``attention_modules`` patterns
    and error messages read as they do for the model itself.
    """

    def __init__(self, forward_func: Callable[..., Any], model: nn.Module) -> None:
        super().__init__()
        self.forward_func = forward_func
        self.model = model

    def forward(self, *args: Any) -> Any:
        return self.forward_func(*args)

    @property
    def wrapped_model(self) -> nn.Module:
        """The model whose family presets apply (:func:`lightning_gae.engine.token_sets.preset_streams`)."""
        return self.model

    def named_modules(
        self, memo: set[nn.Module] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Module]]:
        return self.model.named_modules(memo, prefix, remove_duplicate)


def _explained_module(forward_func: nn.Module | Callable[..., Any], model: nn.Module | None) -> nn.Module:
    if isinstance(forward_func, nn.Module):
        if model is not None and model is not forward_func:
            raise ValueError(
                "forward_func is already an nn.Module, which explain() runs and records directly; "
                "model= is only for a forward_func that is a plain function or lambda"
            )
        return forward_func
    if not callable(forward_func):
        raise TypeError(f"forward_func must be an nn.Module or a callable; got {type(forward_func).__name__}")
    if model is None:
        # A bound method (``model.forward``, ``model.predict``) names its module.
        owner = getattr(forward_func, "__self__", None)
        if not isinstance(owner, nn.Module):
            raise TypeError(
                "forward_func is a plain callable, so the attention layers it runs are unknown: pass the "
                "module it calls as model=..., e.g. GenericAttention(lambda e, m: bert(inputs_embeds=e, "
                "attention_mask=m).logits, model=bert)"
            )
        model = owner
    return _ForwardFunction(forward_func, model)


def _explain_target(target: AttributionTarget) -> AttributionTarget:
    """Captum's target forms as explain() takes them."""
    if isinstance(target, tuple) or (isinstance(target, list) and any(isinstance(t, tuple) for t in target)):
        raise ValueError(
            "tuple targets (indices into outputs with more than two dimensions) are not supported: "
            "give None, an int, one class per sample, or a callable output -> Tensor[B]"
        )
    if isinstance(target, Tensor) and target.numel() == 1:
        # Captum applies a one-element tensor to every example and does not expand it for
        # NoiseTunnel or the metrics, so it must not be read as a batch of one.
        return int(target.item())
    return target


def _is_image(x: Tensor) -> bool:
    return x.dim() == 4 and x.is_floating_point()


def _relevance_on(
    x: Tensor, tokens: Tensor, modality: Modality | None, position: int, mode: InterpolateMode = "nearest"
) -> Tensor | None:
    """Token relevance ``[B, N]`` in the shape of input ``x``, or None when ``x`` is not laid out like the tokens.

    The modality maps (:meth:`~lightning_gae.Modality.relevance_on`); without one, images get the patch grid
    :meth:`~lightning_gae.ImageTokens.infer` finds, any other input with ``N`` entries in dim 1 the tokens' values.
    """
    num_tokens = tokens.shape[1]
    if modality is None and _is_image(x):
        modality = ImageTokens.infer(x, num_tokens)
        if modality is None:
            raise ValueError(
                f"input {position} looks like images {tuple(x.shape)}, but how {num_tokens} tokens tile "
                f"{x.shape[-2]}x{x.shape[-1]} pixels cannot be inferred (square images with 0, 1 or 2 prefix "
                "tokens are); pass modality=ImageTokens(patch_size=..., prefix_tokens=...)"
            )
    if modality is None:
        return spread(tokens, x) if x.dim() >= 2 and x.shape[1] == num_tokens else None
    return modality.relevance_on(x, tokens, mode)


def _set_relevances(
    inputs: tuple[Tensor, ...], relevance: dict[str, Tensor], modality: Modality | Mapping[str, Modality] | None,
    mode: InterpolateMode,
) -> list[Tensor | None]:
    """Each input's attribution from the token set laid out like it (models with several token sets).

    With a mapping ``{set: modality}`` each set is mapped by its own modality; otherwise images take
    the set whose token count tiles them, and other inputs the one set with their length in dim 1.
    A set goes to one input at most; an input two sets could fit raises and asks for the mapping.
    """
    out: list[Tensor | None] = [None] * len(inputs)
    free = dict(relevance)
    mods = dict(modality) if isinstance(modality, Mapping) else {}
    unknown = [k for k in mods if k not in relevance]
    if unknown:
        raise ValueError(f"modality names token sets {unknown}; this model's sets are {list(relevance)}")
    order = sorted(range(len(inputs)), key=lambda i: not _is_image(inputs[i]))   # images first
    for i in order:
        x = inputs[i]
        fits = []
        for name, tokens in free.items():
            mod = mods.get(name) if mods else (modality if not isinstance(modality, Mapping) else None)
            try:
                mapped = _relevance_on(x, tokens, mod, i, mode)
            except ValueError:
                mapped = None
            if mapped is not None:
                fits.append((name, mapped))
        if len(fits) > 1 and not mods:
            raise ValueError(
                f"input {i} {tuple(x.shape)} fits token sets {[n for n, _ in fits]} alike; pass "
                "modality={set: ImageTokens(...)/TextTokens(...)} naming which set each input belongs to"
            )
        if fits:
            name, mapped = fits[0]
            out[i] = mapped
            del free[name]
    return out


def _not_a_tensor(position: int, x: Any, attribution: str) -> str:
    """Why input ``position`` cannot be attributed, and for a batch (a mapping or dataclass) the call that can."""
    keys = keyword_inputs(x)
    if keys is None:
        return (f"input {position} is a {type(x).__name__}; inputs must be tensors, pass other arguments in "
                "additional_forward_args")
    # The tensor a person looks at (images, token ids) is the one attributed; the others go along unattributed.
    shown = input_tensor(keys)
    tensors = sorted((k for k, v in keys.items() if isinstance(v, Tensor)), key=lambda k: keys[k] is not shown)
    read = (lambda k: f"batch[{k!r}]") if isinstance(x, Mapping) else (lambda k: f"batch.{k}")
    build = (f"{{{', '.join(f'{k!r}: {k}' for k in tensors)}}}" if isinstance(x, Mapping)
             else f"{type(x).__name__}({', '.join(f'{k}={k}' for k in tensors)})")
    first, rest = tensors[0] if tensors else "x", tensors[1:]
    extra = f", additional_forward_args=({', '.join(read(k) for k in rest)},)" if rest else ""
    return (f"input {position} is a batch ({type(x).__name__} with {list(keys)}); Captum's contract attributes "
            f"tensors, so give the tensors and a forward_func that builds the batch the model takes: "
            f"{attribution}(lambda {', '.join(tensors) or 'x'}: model({build}), model=model)"
            f".attribute({read(first)}{extra})")


def _no_input_matches(inputs: tuple[Tensor, ...], num_tokens: int,
                      modality: Modality | Mapping[str, Modality] | None) -> ValueError:
    shapes = ", ".join(f"input {i}: {tuple(x.shape)}" for i, x in enumerate(inputs))
    if modality is not None:
        return ValueError(f"{modality!r} maps onto none of the inputs ({shapes}) of a model attending over {num_tokens} tokens")
    return ValueError(
        f"none of the inputs ({shapes}) is laid out like the {num_tokens} tokens the model attends over: an input "
        f"needs {num_tokens} entries in dim 1 (token ids [B, T], embeddings [B, T, D]) or to be images "
        "[B, C, H, W]. Pass modality=ImageTokens(...), TextTokens(...) or TabularTokens(feature_names, "
        "prefix_tokens=...) to say how the model made its tokens from the input."
    )


class AttentionAttribution(GradientAttribution):
    """Base of the attention attributions: ``explain(..., method=method)`` behind Captum's contract.

    Subclasses only set ``method``. See :class:`GenericAttention` for the arguments.
    """

    method: str = "gae"

    def __init__(
        self,
        forward_func: nn.Module | Callable[..., Any],
        modality: Modality | Mapping[str, Modality] | None = None,
        query: Query | Mapping[str, Query] | None = None,
        attention_modules: Sequence[str] | str | None = None,
        model: nn.Module | None = None,
        interpolate_mode: InterpolateMode = "nearest",
        streams: Streams | None = None,
    ) -> None:
        if interpolate_mode not in ("nearest", "bilinear"):
            raise ValueError(
                f"interpolate_mode={interpolate_mode!r}; use 'nearest' (one value per patch, for metrics) or "
                "'bilinear' (smooth, for display)"
            )
        self._module = _explained_module(forward_func, model)
        GradientAttribution.__init__(self, forward_func)
        self.modality = modality
        self.query = query
        self.attention_modules = attention_modules
        self.interpolate_mode = interpolate_mode
        self.streams = streams
        if isinstance(modality, Modality) and modality.first_token_is_input and (query is None or (isinstance(query, int) and query == 0)):
            warnings.warn(
                f"{modality!r} has no CLS token, so query=0 explains the first patch, not the prediction; "
                "explain the pooled patches with query=\"mean\"",
                UserWarning,
                stacklevel=2,
            )

    @log_usage(part_of_slo=True)
    def attribute(
        self,
        inputs: TensorOrTuple,
        target: AttributionTarget = None,
        additional_forward_args: Any = None,
    ) -> TensorOrTuple:
        r"""Relevance of every input element for the prediction, in the shape of ``inputs``.

        Args:
            inputs: a tensor, or a tuple of tensors for a forward function of several inputs, all with
                the batch in dim 0. The forward function is called as
                ``forward_func(*inputs, *additional_forward_args)``. Token ids, embeddings, images and
                tabular features are mapped as described in this module's docstring; tuple entries
                that are not laid out like the model's tokens get zeros.
            target: what to explain: None (each example's predicted class, the argmax of the logits),
                an int or a one-element tensor for every example, or one class per example (a list or
                a 1-D ``LongTensor``). A callable ``output -> Tensor[B]`` explains any scalar per
                example. Captum's tuple targets (indices into outputs of more than two dimensions)
                are not supported. For sequence logits ``[B, T, C]`` the class is read at the query
                token.
            additional_forward_args: arguments passed after ``inputs`` and not attributed (e.g. an
                ``attention_mask``): one object, or a tuple of them.

        Returns:
            Tensor or tuple of tensors: one attribution per input with that input's shape, a tuple
            exactly when ``inputs`` is a tuple. Floating inputs get their own dtype, integer inputs
            (token ids) float32; everything is detached and on the input's device. The query token
            (e.g. CLS) and padded positions are 0.

        Raises:
            ValueError: an image input whose patching cannot be inferred, or no input laid out like
                the model's tokens (both messages name ``modality=``); a tuple target; anything
                :func:`lightning_gae.explain` rejects (no attention recorded, bad target).
            TypeError: an input that is not a tensor.
        """
        is_tuple = isinstance(inputs, tuple)
        inputs_tuple: tuple[Tensor, ...] = inputs if isinstance(inputs, tuple) else (inputs,)
        for position, x in enumerate(inputs_tuple):
            if not isinstance(x, Tensor):
                raise TypeError(_not_a_tensor(position, x, type(self).__name__))
        if additional_forward_args is None:
            extra: tuple = ()
        else:
            extra = additional_forward_args if isinstance(additional_forward_args, tuple) else (additional_forward_args,)

        # explain() runs with gradients on and outside inference mode whatever the caller's context
        # (NoiseTunnel and captum.metrics call attribute() under torch.no_grad()).
        exp = explain(
            self._module,
            (*inputs_tuple, *extra),
            target=_explain_target(target),
            method=self.method,
            query=self.query,
            attention_modules=self.attention_modules,
            streams=self.streams,
        )

        if len(exp.relevance) > 1 or isinstance(self.modality, Mapping):
            relevances = _set_relevances(inputs_tuple, exp.relevance, self.modality, self.interpolate_mode)
        else:
            relevances = [_relevance_on(x, exp.tokens, self.modality, i, self.interpolate_mode) for i, x in enumerate(inputs_tuple)]
        if all(r is None for r in relevances):
            raise _no_input_matches(inputs_tuple, exp.tokens.shape[1], self.modality)
        attributions = []
        for x, relevance in zip(inputs_tuple, relevances):
            dtype = x.dtype if x.is_floating_point() else torch.float32
            if relevance is None:
                attributions.append(torch.zeros(x.shape, dtype=dtype, device=x.device))
            else:
                # A copy, not an expanded view: callers accumulate into attributions in place.
                attributions.append(relevance.to(device=x.device, dtype=dtype).contiguous().clone())
        return tuple(attributions) if is_tuple else attributions[0]

    def attribute_future(self) -> None:
        """Not implemented: the explanation is computed synchronously."""
        raise NotImplementedError(f"attribute_future is not implemented for {type(self).__name__}")


class GenericAttention(AttentionAttribution):
    r"""Generic Attention-model Explainability (Chefer, Gur & Wolf, ICCV 2021) as a Captum attribution.

    Relevance maps are propagated through every self-attention layer with the gradient-weighted,
    head-averaged attention ``Ā = E_h[(∇A ⊙ A)^+]`` (Eq. 5-7); the query token's row (CLS by
    default) is the relevance of each token, mapped back onto the inputs. One forward and one
    backward explain the whole batch; the model is not modified, runs in eval mode, and no
    parameter's ``.grad`` changes.

    The attribution is not multiplied by the inputs (``multiplies_by_inputs`` is False) and has no
    convergence delta (``has_convergence_delta()`` is False).

    Args:
        forward_func: the model (an ``nn.Module``, e.g. a LightningModule or a Hugging Face model,
            called with the inputs positionally), or a callable that runs it, e.g. to pass keyword
            arguments that Captum cannot: ``lambda e, m: bert(inputs_embeds=e, attention_mask=m).logits``.
            Its output may be logits, a tuple whose first item is the logits, or an object with
            ``.logits``.
        modality: how the model made its tokens from the input: :class:`~lightning_gae.ImageTokens`,
            :class:`~lightning_gae.TextTokens`, :class:`~lightning_gae.TabularTokens` or another
            :class:`~lightning_gae.Modality` (whose ``to_input`` is then called for every input).
            None infers: images by their patching, other inputs by having one entry per token in dim 1. For models with several token
            sets (encoder-decoders, dual encoders, co-attention) a mapping ``{set: modality}``
            says which set each input belongs to (e.g. ``{"image": ImageTokens(16), "text":
            TextTokens(tokenizer)}``); each input gets its own set's relevance
            (``Explanation.relevance``).
        query: the token whose relevance row is read: an index (default: the model family's
            readout, else 0, the CLS token), ``"mean"`` (mean-pooled models), a mapping ``{set: query}``,
            ``"last"`` (the last real token, for decoder-only models), or one index per example
            (which ``NoiseTunnel`` and the Captum metrics do not expand; prefer an int or ``"last"``
            with them).
        attention_modules: glob patterns over the model's module paths naming the modules whose
            output is the post-softmax attention, for attention computed in a way the automatic
            capture does not see (see :func:`lightning_gae.explain`).
        model: the ``nn.Module`` that a plain-callable ``forward_func`` runs, needed to record its
            attention by module path and to put it in eval mode. Inferred for a bound method such as
            ``model.forward``; must be left out when ``forward_func`` is itself a module.
        interpolate_mode: how an image's patch relevance reaches its pixels: ``"nearest"`` (default;
            every pixel of a patch gets the patch's value, so the mean over a patch is its token's
            relevance, which Captum's metrics and perturbation tests rely on) or ``"bilinear"``
            (smooth, for display only).
        streams: a :class:`~lightning_gae.Streams` declaring token sets no preset or inference finds.

    Raises:
        TypeError: a plain-callable ``forward_func`` without ``model``.
        ValueError: ``model`` given together with an ``nn.Module`` ``forward_func``; an unknown
            ``interpolate_mode``.

    Example:
        A small ViT-style classifier (8 x 8 images in 2 x 2 patches, read at token 0; ``ImageTokens`` is inferred),
        alone and inside Captum's ``NoiseTunnel``:

        >>> import torch
        >>> from torch import nn
        >>> from captum.attr import NoiseTunnel
        >>> from lightning_gae.attribution import GenericAttention
        >>> class ViT(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.patch, self.head = nn.Conv2d(1, 16, 2, stride=2), nn.Linear(16, 3)
        ...         layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, batch_first=True)
        ...         self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        ...     def forward(self, x):
        ...         return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2))[:, 0])
        >>> gae, images = GenericAttention(ViT().eval()), torch.rand(2, 1, 8, 8)
        >>> gae.attribute(images, target=1).shape                     # like the images, a patch's value on its pixels
        torch.Size([2, 1, 8, 8])
        >>> NoiseTunnel(gae).attribute(images, nt_samples=4, stdevs=0.1, target=1).shape
        torch.Size([2, 1, 8, 8])
    """

    method = GAE.name


class AttentionRollout(AttentionAttribution):
    r"""Attention rollout (Abnar & Zuidema, 2020) as a Captum attribution: the query's row of the
    product over layers of the head-averaged attention with the identity added, rows normalised.
    Needs no gradient, so the attribution does not depend on ``target``.

    Same arguments and contract as :class:`GenericAttention`.
    """

    method = ROLLOUT.name


class RawAttention(AttentionAttribution):
    r"""The last layer's head-averaged attention row of the query token, as a Captum attribution.
    Needs no gradient; the attribution does not depend on ``target``.

    Same arguments and contract as :class:`GenericAttention`.
    """

    method = RAW_ATTENTION.name


class AttentionGradCAM(AttentionAttribution):
    r"""Grad-CAM on the last attention layer, a baseline of Chefer et al., as a Captum attribution:
    ``(E_h[mean(∇A_h) · A_h])⁺``, the query's row; each head weighted by its mean gradient.

    Same arguments and contract as :class:`GenericAttention`.
    """

    method = ATTN_GRADCAM.name


class AttentionFlow(AttentionAttribution):
    r"""Attention flow (Abnar & Zuidema, 2020) as a Captum attribution: each token's maximum flow into the
    query token through the layered graph of ``rownorm(0.5·I + 0.5·E_h A_l)``. Needs no gradient; the
    attribution does not depend on ``target``. One max flow per token and sample, so a call estimated
    above a minute raises unless it runs inside :func:`lightning_gae.allow_slow_attention_flow`.

    Same arguments and contract as :class:`GenericAttention`.
    """

    method = ATTENTION_FLOW.name


class AttnLRP(AttentionAttribution):
    r"""AttnLRP (Achtibat et al., ICML 2024) as a Captum attribution: relevance propagated by LRP rules
    through an unmodified model (:mod:`lightning_gae.lrp`), read at the word embeddings, one value per
    token. Explains ``target``; the model's word embedding must run inside the forward (token ids as
    inputs, found by ``get_input_embeddings()``).

    Same arguments and contract as :class:`GenericAttention`.
    """

    method = ATTNLRP.name


class TransformerAttribution(AttentionAttribution):
    r"""Transformer Attribution (Chefer, Gur & Wolf, CVPR 2021) as a Captum attribution: the authors' LRP
    relevance at each attention map times its gradient, negatives removed, mean over heads, ``I +`` that
    multiplied over layers, the query's row (:mod:`lightning_gae.lrp.transformer_attribution`). Explains ``target``.

    Same arguments and contract as :class:`GenericAttention`.
    """

    method = TRANSFORMER_ATTRIBUTION.name
