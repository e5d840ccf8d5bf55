"""Small models for the tests, each with an independent way to read its attention for the oracle.

The oracle paths never go through lightning_gae: they run one sample at a time in float64 and take
the probabilities either from the model's own explicit code path (``impl="manual"``), from a
hand-written dense forward (``nn.TransformerEncoder``) or from Hugging Face's own
``output_attentions`` in eager mode.

Beside them: the recipe ViT at the size the callback tests train (``small_vit``; ``RankOneFails`` for the
multi-process tests), a tiny Hugging
Face CLIP (``tiny_clip``) and ``SumModel``, whose logits the metric tests can work out by hand.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_gae import Streams
from lightning_gae.modalities import TabularTokens
from recipes.vit import ViTClassifier


class TinyAttention(nn.Module):
    """Multi-head self-attention with three interchangeable inner products.

    ``sdpa``: the fused ``F.scaled_dot_product_attention``; ``manual``: softmax then ``@`` with the
    probabilities kept in ``self.probs`` (the oracle path); ``einsum``: softmax, then ``attn_drop``,
    then ``torch.einsum`` (a hand-written model the automatic capture does not see).
    """

    def __init__(self, dim: int, heads: int, impl: str = "sdpa") -> None:
        super().__init__()
        self.heads, self.impl = heads, impl
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(0.1)
        self.probs: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
            if self.impl == "manual":
                self.probs = scores.softmax(dim=-1)
                out = self.probs @ v
            else:
                probs = self.attn_drop(scores.softmax(dim=-1))
                out = torch.einsum("bhqk,bhkd->bhqd", probs, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class TinyBlock(nn.Module):
    def __init__(self, dim: int, heads: int, impl: str) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = TinyAttention(dim, heads, impl)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """A ViT: patch embedding, CLS token at 0, pre-norm blocks, head on CLS."""

    def __init__(self, image_size: int = 8, patch: int = 2, chans: int = 1, dim: int = 32, depth: int = 3,
                 heads: int = 4, classes: int = 5, impl: str = "sdpa") -> None:
        super().__init__()
        self.embed = nn.Conv2d(chans, dim, patch, patch)
        n = (image_size // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos = nn.Parameter(torch.randn(1, n, dim) * 0.5)
        self.blocks = nn.ModuleList(TinyBlock(dim, heads, impl) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])

    def set_impl(self, impl: str) -> TinyViT:
        for block in self.blocks:
            block.attn.impl = impl
        return self


def vit_reference(model: TinyViT, x: Tensor, score: Callable[[Tensor, int], Tensor]):
    """Per sample, float64, through the explicit path: ``[(attns, grads)]`` with ``[H, N, N]`` entries."""
    ref = copy.deepcopy(model).double().eval().set_impl("manual")
    out = []
    for b in range(x.shape[0]):
        logits = ref(x[b : b + 1].double())
        probs = [blk.attn.probs for blk in ref.blocks]
        grads = torch.autograd.grad(score(logits, b), probs)
        out.append(([p[0].detach() for p in probs], [g[0] for g in grads]))
    return out


class EncoderClassifier(nn.Module):
    """``nn.TransformerEncoder`` (post-norm, ReLU) over projected features with a CLS token."""

    def __init__(self, features: int = 6, dim: int = 16, heads: int = 2, depth: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(features, dim)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor, src_key_padding_mask: Tensor | None = None) -> Tensor:
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), self.inp(x)], dim=1)
        if src_key_padding_mask is not None:
            src_key_padding_mask = F.pad(src_key_padding_mask, (1, 0), value=False)
        return self.head(self.encoder(h, src_key_padding_mask=src_key_padding_mask)[:, 0])


def encoder_reference(model: EncoderClassifier, x: Tensor, lengths: list[int], score: Callable[[Tensor, int], Tensor]):
    """A hand-written dense forward of the encoder from its weights, one unpadded sample at a time."""
    m = copy.deepcopy(model).double().eval()
    out = []
    for b, length in enumerate(lengths):
        h = torch.cat([m.cls[0], m.inp(x[b, :length].double())], dim=0)
        probs = []
        for layer in m.encoder.layers:
            sa = layer.self_attn
            heads, dim = sa.num_heads, h.shape[-1]
            hd = dim // heads
            w_q, w_k, w_v = sa.in_proj_weight.chunk(3)
            b_q, b_k, b_v = sa.in_proj_bias.chunk(3)
            q, k, v = h @ w_q.T + b_q, h @ w_k.T + b_k, h @ w_v.T + b_v
            head_out, layer_probs = [], []
            for i in range(heads):
                s = slice(i * hd, (i + 1) * hd)
                p = torch.softmax(q[:, s] @ k[:, s].T / math.sqrt(hd), dim=-1)
                layer_probs.append(p)
                head_out.append(p @ v[:, s])
            probs.append(layer_probs)
            attn_out = torch.cat(head_out, dim=-1) @ sa.out_proj.weight.T + sa.out_proj.bias
            h = layer.norm1(h + attn_out)
            h = layer.norm2(h + layer.linear2(torch.relu(layer.linear1(h))))
        logits = m.head(h[0])[None]
        flat = [p for layer_probs in probs for p in layer_probs]
        grads = torch.autograd.grad(score(logits, b), flat)
        heads = len(probs[0])
        out.append((
            [torch.stack([p.detach() for p in lp]) for lp in probs],
            [torch.stack(grads[i * heads : (i + 1) * heads]) for i in range(len(probs))],
        ))
    return out


def hf_reference(eager_model: nn.Module, samples: list[dict], score: Callable[[object, int], Tensor]):
    """Hugging Face eager attention in float64 via ``output_attentions=True``, one sample at a time."""
    m = copy.deepcopy(eager_model).double().eval()
    out = []
    for b, kwargs in enumerate(samples):
        kwargs = {k: (v.double() if v.is_floating_point() else v) for k, v in kwargs.items()}
        output = m(**kwargs, output_attentions=True)
        attns = list(output.attentions)
        grads = torch.autograd.grad(score(output, b), attns)
        out.append(([a[0].detach() for a in attns], [g[0] for g in grads]))
    return out


class TinyCrossAttention(nn.Module):
    """Queries from one token set, keys and values from another; ``sdpa`` or ``manual`` (keeps ``probs``)."""

    def __init__(self, dim: int, heads: int, impl: str = "sdpa") -> None:
        super().__init__()
        self.heads, self.impl = heads, impl
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.probs: Tensor | None = None

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None = None) -> Tensor:
        b, n, c = x.shape
        m = memory.shape[1]
        q = self.q(x).reshape(b, n, self.heads, c // self.heads).transpose(1, 2)
        k, v = self.kv(memory).reshape(b, m, 2, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            self.probs = scores.softmax(dim=-1)
            out = self.probs @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class TinySeq2Seq(nn.Module):
    """An SDPA encoder-decoder: encoder self-attention, causal decoder self-attention, cross-attention.

    ``forward(src, tgt) -> logits [B, T, V]``; every attention is a ``TinyCrossAttention`` so that the
    manual path keeps each probability tensor for the oracle.
    """

    def __init__(self, vocab: int = 11, dim: int = 16, heads: int = 2, enc_layers: int = 2, dec_layers: int = 2,
                 impl: str = "sdpa") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.3)
        self.enc = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(enc_layers))
        self.dec_self = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(dec_layers))
        self.dec_cross = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(dec_layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        h = self.embed(src) + self.pos[:, : src.shape[1]]
        for layer in self.enc:
            x = self.norm(h)
            h = h + layer(x, x)
        memory = self.norm(h)
        t = tgt.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()
        y = self.embed(tgt) + self.pos[:, :t]
        for sa, ca in zip(self.dec_self, self.dec_cross):
            x = self.norm(y)
            y = y + sa(x, x, causal)
            y = y + ca(self.norm(y), memory)
        return self.head(self.norm(y))

    def set_impl(self, impl: str) -> "TinySeq2Seq":
        for m in self.modules():
            if isinstance(m, TinyCrossAttention):
                m.impl = impl
        return self


def seq2seq_reference(model: TinySeq2Seq, src: Tensor, tgt: Tensor, score: Callable[[Tensor, int], Tensor]):
    """Per sample, float64, manual path: ``[steps]`` with ``(query set, key set, attn, grad)`` in call order."""
    ref = copy.deepcopy(model).double().eval().set_impl("manual")
    out = []
    for b in range(src.shape[0]):
        logits = ref(src[b : b + 1], tgt[b : b + 1])
        order = [("encoder", "encoder", m) for m in ref.enc]
        for sa, ca in zip(ref.dec_self, ref.dec_cross):
            order += [("decoder", "decoder", sa), ("decoder", "encoder", ca)]
        probs = [m.probs for _, _, m in order]
        grads = torch.autograd.grad(score(logits, b), probs)
        out.append([(q, k, p[0].detach(), g[0]) for (q, k, _), p, g in zip(order, probs, grads)])
    return out


class TinyCoAttention(nn.Module):
    """LXMERT-style: text and image self-attention streams, then co-attention layers in which text
    attends to image and image attends to text (both from the old states), then self-attention again.
    ``forward(ids, feats) -> logits [B, C]`` read from the text CLS token."""

    def __init__(self, vocab: int = 13, feat: int = 5, dim: int = 16, heads: int = 2, classes: int = 3,
                 impl: str = "sdpa") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(feat, dim)
        self.text_self = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(2))
        self.image_self = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(2))
        self.t2i = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(2))
        self.i2t = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(2))
        self.cross_text_self = nn.ModuleList(TinyCrossAttention(dim, heads, impl) for _ in range(2))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: Tensor, feats: Tensor) -> Tensor:
        t = self.embed(ids)
        v = self.proj(feats)
        for layer in self.text_self:
            x = self.norm(t)
            t = t + layer(x, x)
        for layer in self.image_self:
            x = self.norm(v)
            v = v + layer(x, x)
        for t2i, i2t, ts in zip(self.t2i, self.i2t, self.cross_text_self):
            nt, nv = self.norm(t), self.norm(v)
            t, v = t + t2i(nt, nv), v + i2t(nv, nt)
            x = self.norm(t)
            t = t + ts(x, x)
        return self.head(self.norm(t)[:, 0])

    def set_impl(self, impl: str) -> "TinyCoAttention":
        for m in self.modules():
            if isinstance(m, TinyCrossAttention):
                m.impl = impl
        return self

    def call_order(self) -> list[tuple[str, str, nn.Module]]:
        order = [("text", "text", m) for m in self.text_self] + [("image", "image", m) for m in self.image_self]
        for t2i, i2t, ts in zip(self.t2i, self.i2t, self.cross_text_self):
            order += [("text", "image", t2i), ("image", "text", i2t), ("text", "text", ts)]
        return order


def coattention_reference(model: TinyCoAttention, ids: Tensor, feats: Tensor, score: Callable[[Tensor, int], Tensor]):
    ref = copy.deepcopy(model).double().eval().set_impl("manual")
    out = []
    for b in range(ids.shape[0]):
        logits = ref(ids[b : b + 1], feats[b : b + 1].double())
        order = ref.call_order()
        probs = [m.probs for _, _, m in order]
        # The last image-to-text layer feeds nothing the text CLS reads: its gradient is zero.
        grads = torch.autograd.grad(score(logits, b), probs, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(probs, grads)]
        out.append([(q, k, p[0].detach(), g[0]) for (q, k, _), p, g in zip(order, probs, grads)])
    return out


# --- the recipe ViT, a tiny CLIP, a model to work metrics out by hand ---------------------------------


def small_vit(**kwargs) -> ViTClassifier:
    """The recipe's ViT LightningModule at the size the callback tests train (8x8 digits, 2 blocks of 2 heads)."""
    return ViTClassifier(dim=32, depth=2, heads=2, **kwargs)


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        raise RuntimeError("forced on rank 1, in the backward")


class RankOneFails(ViTClassifier):
    """The recipe ViT whose explanations raise on rank 1 while ``failing`` says where (``"forward"``: before its
    layers run; ``"backward"``: in the first step of the backward), and which keeps its training losses.

    An explanation is the only forward in eval mode with gradients on (validation runs without them), so
    training and validation never fail. Subclasses set ``failing`` from a hook that runs before the explanation.
    """

    failing: str | None = None

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.losses: list[float] = []

    def forward(self, x: Tensor) -> Tensor:
        fails = self.failing if self.global_rank == 1 and not self.training and torch.is_grad_enabled() else None
        if fails == "forward":
            raise RuntimeError("forced on rank 1")
        logits = super().forward(x)
        return _FailsInBackward.apply(logits) if fails == "backward" else logits

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.losses.append(loss.item())
        return loss


def tiny_clip():
    """A Hugging Face CLIPModel with random weights: two towers with equal token counts (4 patches + CLS, 5 tokens)."""
    import transformers

    text = transformers.CLIPTextConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, max_position_embeddings=16, eos_token_id=49)
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=8, patch_size=4)
    torch.manual_seed(10)
    return transformers.CLIPModel(transformers.CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=8)).eval()


class SumModel(nn.Module):
    """Two classes: logit 0 is a constant, logit 1 the sum of the features (or of an image region)."""

    def __init__(self, threshold=1.9, region=None):
        super().__init__()
        self.threshold, self.region = threshold, region
        self.calls = []

    def forward(self, x):
        self.calls.append(x.shape[0])
        if x.dim() == 4:
            rows, cols = self.region
            x = x[:, :, rows, cols]
        total = x.flatten(1).sum(dim=1)
        return torch.stack([torch.full_like(total, self.threshold), total], dim=1)


def shape_clip_streams() -> Streams:
    """The token sets of recipes/dual_encoder.py's ShapeCLIP: the LightningModule holds the CLIPModel as `model`;
    the towers are read at CLS and at the EOS, the image set being the query set."""
    return Streams(self_attention={"text": ["model.text_model.*"], "image": ["model.vision_model.*"]},
                   query_set="image", queries={"text": "last", "image": 0})


# SumModel's features, relevance ordered like the features, and the modality that removes them (to 0).
FEATURES = torch.tensor([[2.0, 1.0, 0.5, 0.25]])
TAB = TabularTokens(["a", "b", "c", "d"], prefix_tokens=0, means=[0.0, 0.0, 0.0, 0.0])


def tiny_hf_bert(device: torch.device | str = "cpu", layers: int = 2):
    """A Hugging Face BERT classifier built from a small config (SDPA attention), and a batch of 3 x 21 token ids
    whose second sample ends in 6 padded positions."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2, attn_implementation="sdpa")
    model = BertForSequenceClassification(config).to(device).eval()
    ids = torch.randint(1, 100, (3, 21), device=device)
    mask = torch.ones_like(ids)
    mask[1, -6:] = 0  # padding
    return model, {"input_ids": ids, "attention_mask": mask}


class PrototypeViT(TinyViT):
    """TinyViT whose head soft-assigns features to learned prototypes: ``softmax(f @ P.T) @ M``."""

    def __init__(self, per_token: bool) -> None:
        super().__init__()
        self.per_token = per_token
        self.prototypes = nn.Parameter(torch.randn(6, 32))
        self.prototype_logits = nn.Parameter(torch.randn(6, 5))

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        features = self.norm(x) if self.per_token else self.norm(x)[:, 0]  # [B, N, D] or [B, D]
        logits = (features @ self.prototypes.T).softmax(dim=-1) @ self.prototype_logits
        return logits[:, 0] if self.per_token else logits


class MeanPooledViT(ViTClassifier):
    """The recipe ViT without its CLS token: the head reads the mean of the 16 patch tokens."""

    def forward(self, x: Tensor) -> Tensor:
        vit = self.model
        tokens = vit.patch_embed(x).flatten(2).transpose(1, 2) + vit.pos_embed[:, 1:]
        for block in vit.blocks:
            tokens = block(tokens)
        return vit.head(vit.norm(tokens).mean(dim=1))
