"""AttnLRP's relevance at the model's input: one forward under :class:`~lightning_gae.lrp.mode.LRPCapture`, one
backward, the relevance of each token read at the embedding (Achtibat et al., ICML 2024).

Token ids are read at their word embedding, pixels at the patch embedding, a ``[B, F]`` feature
tensor at itself; :func:`token_relevance` sums ``e * grad e`` over each token's vector.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_gae._structures import Target, model_logits
from lightning_gae.engine.readout import (
    Explanation,
    explaining,
    keep_mask,
    readout_query,
    resolve_readout,
    target_scores,
)
from lightning_gae.lrp.mode import LRPCapture, flat_tensors, word_embedding

__all__ = ["LRPForward", "explain", "input_embedding", "relevance_forward", "token_relevance"]


@dataclass
class LRPForward:
    """One forward under :class:`LRPCapture`: the model's ``output``, the tensor relevance is read at
    (``embeddings``, a leaf requiring grad: ``[B, n, D]`` token vectors, ``[B, D, h, w]`` a
    convolution's patch grid, or ``[B, F]`` float features), the module paths of its ``attention``
    and ``attended``, the key count of the first attention (None if none ran)."""

    output: Any
    embeddings: Tensor
    attention: list[str]
    attended: int | None = None

    @property
    def num_tokens(self) -> int:
        """The tokens explained: those attention sees, or the embedding's own when no attention ran."""
        if self.attended is not None:
            return self.attended
        e = self.embeddings
        return e.shape[-2] * e.shape[-1] if e.dim() == 4 else e.shape[1]


def input_embedding(model: nn.Module, embedding_layer: nn.Module | str | None, token_ids: bool) -> nn.Module | None:
    """Where ``method="attnlrp"`` reads relevance: ``embedding_layer`` if given; for token ids the word
    embedding (:func:`word_embedding`); for float inputs a Hugging Face ``get_input_embeddings()``
    (a ViT's patch embedding) or the first submodule named ``patch_embed`` (timm's convention), else
    None (the float inputs themselves)."""
    if embedding_layer is not None or token_ids:
        return word_embedding(model, embedding_layer)
    try:
        return word_embedding(model)
    except ValueError:
        pass
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "patch_embed":
            return module
    return None


def relevance_forward(model: nn.Module, args: tuple, kwargs: dict, embedding_layer: nn.Module | str | None = None) -> LRPForward:
    """Run ``model(*args, **kwargs)`` under :class:`LRPCapture`; the embedding must run once.

    Token ids are read at their word embedding; float inputs (pixels, features) at the patch
    embedding (:func:`input_embedding`) or, without one, at a single ``[B, F]`` float input.
    """
    floats = [t for t in flat_tensors(args, kwargs) if t.is_floating_point()]
    module = input_embedding(model, embedding_layer, token_ids=not floats)
    if module is None:
        if len(floats) != 1 or floats[0].dim() != 2:
            shapes = [list(t.shape) for t in floats]
            raise ValueError(
                f"method='attnlrp' reads relevance at an embedding whose output is one vector per token; "
                f"{type(model).__name__} has no get_input_embeddings() and no 'patch_embed' module, and its float "
                f"inputs {shapes} are not one [B, F] tensor of features: pass embedding_layer= (the module, or "
                "its path such as 'stem.proj') whose output is [B, N, D] or a convolution's [B, D, h, w]"
            )
        floats[0].requires_grad_(True)
    capture = LRPCapture(model, module if module is not None else False)
    with capture:
        output = capture.forward(*args, **kwargs)
    if module is None:
        return LRPForward(output, floats[0], list(capture.attention), capture.num_tokens)
    if len(capture.embeddings) != 1:
        runs = "never ran" if not capture.embeddings else f"ran {len(capture.embeddings)} times"
        raise ValueError(
            f"the embedding ({type(module).__name__}) {runs} in the forward; method='attnlrp' explains "
            "one call of one module (an encoder-decoder may embed through its own modules, e.g. "
            "'model.encoder.embed_tokens'): pass embedding_layer= naming it"
        )
    embeddings = capture.embeddings[0]
    if embeddings.dim() not in (3, 4):
        raise ValueError(f"the embedding ({type(module).__name__}) returned shape {list(embeddings.shape)}; method='attnlrp' "
                         "needs one vector per token, [B, N, D], or a convolution's patch grid [B, D, h, w]")
    # A word embedding's tokens are the explained ones; a patch embedding's are the last of what attention sees.
    return LRPForward(output, embeddings, list(capture.attention), None if capture.from_ids else capture.num_tokens)


def token_relevance(run: LRPForward, score: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """``(relevance [B, N], conservation [B])``: ``sum_d e * grad e`` of each token, 0 where ``keep`` is
    False, and its sum over the tokens divided by the score (NaN for a score of 0).

    A patch grid ``[B, D, h, w]`` gives its ``h * w`` tokens row-major; ``[B, F]`` features one each.
    When the embedding yields fewer tokens than attention sees, they are its last ones: the tokens
    the model adds before them (CLS, ...) get 0, as ``prefix_tokens`` in the image and tabular
    modalities.
    """
    if not score.requires_grad:
        raise ValueError("the explained score does not depend on the embeddings (no gradient path); check target")
    embeddings = run.embeddings
    (grad,) = torch.autograd.grad(score.sum(), [embeddings])
    with torch.no_grad():
        product = embeddings * grad
        if embeddings.dim() == 4:
            tokens = product.sum(1).flatten(1)
        elif embeddings.dim() == 3:
            tokens = product.sum(-1)
        else:
            tokens = product
        tokens = tokens.to(torch.float32)
        prefix = keep.shape[1] - tokens.shape[1]
        if prefix < 0:
            raise ValueError(f"the embedding gives {tokens.shape[1]} tokens but attention sees {keep.shape[1]}; "
                             "pass embedding_layer= naming the module whose output is one vector per attended token")
        if prefix:
            tokens = torch.cat([tokens.new_zeros(tokens.shape[0], prefix), tokens], dim=1)
        tokens = tokens.masked_fill(~keep, 0.0)
        total = score.detach().to(torch.float32)
        conservation = tokens.sum(-1) / torch.where(total == 0, torch.ones_like(total), total)
        conservation = torch.where(total == 0, torch.full_like(total, float("nan")), conservation)
    return tokens, conservation


def explain(model: nn.Module, inputs: Any, target: Target, query: Any,
            embedding_layer: nn.Module | str | None = None) -> Explanation:
    """``method="attnlrp"``: one forward under :class:`~lightning_gae.lrp.mode.LRPCapture`, one backward."""
    if isinstance(query, Mapping):
        raise ValueError("method='attnlrp' explains one score per sample; query={set: ...} is for models with several token sets")
    with explaining(model, inputs) as (args, kwargs):
        run = relevance_forward(model, args, kwargs, embedding_layer)
        batch, num_tokens = run.embeddings.shape[0], run.num_tokens
        logits = model_logits(run.output)
        keep = keep_mask(kwargs, batch, num_tokens, args)
        device = run.embeddings.device
        keep = torch.ones(batch, num_tokens, dtype=torch.bool, device=device) if keep is None else keep.to(device)
        query_index = readout_query(resolve_readout(0 if query is None else query, kwargs, args), batch, num_tokens, keep, device)
        score, target_index = target_scores(run.output, logits, target, query_index, batch)
        tokens, conservation = token_relevance(run, score, keep)
    return Explanation(tokens=tokens, logits=None if logits is None else logits.detach(), target=target_index,
                       score=score.detach(), method="attnlrp", layers=run.attention,
                       query=None if query_index.is_floating_point() else query_index, relevance={"tokens": tokens},
                       conservation=conservation)
