"""method="transformer_attribution" against the authors' own ViT_LRP code (Chefer, Gur & Wolf, CVPR 2021).

The authors' model (tests/helpers/chefer_vit.py, their code) and a plain timm-style ViT with the same
state dict (nn.Linear, nn.LayerNorm, nn.GELU, ``+`` residuals, fused SDPA or softmax -> ``@``) get
identical weights; our maps must equal the authors' ``generate_LRP(method="transformer_attribution")``,
which runs one sample at a time, sample by sample.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lightning_gae as lg
from lightning_gae import LRP_METHODS
from lightning_gae.methods import explain_methods
from lightning_gae.lrp import UnsupportedOperation
from tests.helpers.chefer_vit import LRP, VisionTransformer

IMG, PATCH, DIM, HEADS, DEPTH, CLASSES = 32, 4, 64, 4, 3, 10
TOL = 1e-3


class PlainAttention(nn.Module):
    """timm's ``Attention`` (qkv layout ``(3, heads, head_dim)``), fused or eager."""

    def __init__(self, dim: int, num_heads: int, fused: bool) -> None:
        super().__init__()
        self.num_heads, self.scale, self.fused_attn = num_heads, (dim // num_heads) ** -0.5, fused
        self.qkv = nn.Linear(dim, dim * 3)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            x = self.attn_drop(attn.softmax(dim=-1)) @ v
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, C)))


class PlainMlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class PlainBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, fused: bool) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), PlainAttention(dim, num_heads, fused)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=1e-6), PlainMlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PlainPatchEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, DIM, PATCH, PATCH)


class PlainViT(nn.Module):
    """A timm-style ``VisionTransformer`` whose state dict is the authors' model's."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.patch_embed = PlainPatchEmbed()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.zeros(1, (IMG // PATCH) ** 2 + 1, DIM))
        self.blocks = nn.ModuleList(PlainBlock(DIM, HEADS, fused) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.readout(self.norm(x)))

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return h[:, 0]


class ReadTwoTokens(PlainViT):
    """Classifies from the class token plus one patch token per sample (5, 0, 5, 40): rows 0, 5, 40 carry gradient
    past the last attention."""

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        return h[:, 0] + h[torch.arange(h.shape[0]), torch.tensor([5, 0, 5, 40])[:h.shape[0]]]


@pytest.fixture(scope="module")
def authors() -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(img_size=IMG, patch_size=PATCH, num_classes=CLASSES, embed_dim=DIM, depth=DEPTH,
                              num_heads=HEADS, qkv_bias=True).eval()
    with torch.no_grad():
        for p in model.parameters():  # away from the tiny initialisation: maps with structure
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.1))
    return model


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(4, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))


def plain(authors: VisionTransformer, fused: bool) -> PlainViT:
    model = PlainViT(fused).eval()
    model.load_state_dict(authors.state_dict(), strict=True)
    return model


def reference(authors: VisionTransformer, images: torch.Tensor, index: list[int] | None) -> torch.Tensor:
    """The authors' maps ``[B, N-1]`` (patches), one sample at a time as their code runs."""
    rows = [LRP(authors).generate_LRP(images[b:b + 1], index=None if index is None else index[b],
                                      method="transformer_attribution").detach()[0] for b in range(images.shape[0])]
    return torch.stack(rows)


def max_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest per-sample error relative to the sample's largest value."""
    return ((ours - ref).abs().amax(-1) / ref.abs().amax(-1)).max().item()


def test_registered() -> None:
    assert "transformer_attribution" in LRP_METHODS


@pytest.mark.parametrize("model_kind", ["authors", "plain_fused", "plain_eager"])
@pytest.mark.parametrize("given", [False, True])
def test_equals_authors_code(authors, images, model_kind, given) -> None:
    model = authors if model_kind == "authors" else plain(authors, fused=model_kind == "plain_fused")
    target = torch.tensor([3, 7, 1, 5]) if given else None
    e = lg.explain(model, images, method="transformer_attribution", target=target)
    predicted = authors(images).detach().argmax(-1)  # (their forward hooks the gradients: not under no_grad)
    assert e.tokens.shape == (4, (IMG // PATCH) ** 2 + 1)
    assert torch.equal(e.target, target if given else predicted)
    assert not given or (target != predicted).all()
    assert (e.tokens[:, 0] == 0).all()
    ref = reference(authors, images, target.tolist() if given else None)
    assert ref.abs().amax(-1).min() > 0
    assert max_error(e.tokens[:, 1:], ref) < TOL
    assert len(e.layers) == DEPTH


@pytest.mark.parametrize("fused", [True, False])
def test_batched_equals_one_at_a_time(authors, images, fused) -> None:
    model = plain(authors, fused)
    batched = lg.explain(model, images, method="transformer_attribution", target=2).tokens
    single = torch.cat([lg.explain(model, images[b:b + 1], method="transformer_attribution", target=2).tokens
                        for b in range(images.shape[0])])
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-6 * single.abs().max().item())


def test_with_other_methods(authors, images) -> None:
    model = plain(authors, fused=True)
    found = explain_methods(model, images, ("gae", "transformer_attribution"))
    alone = lg.explain(model, images, method="transformer_attribution").tokens
    assert set(found) == {"gae", "transformer_attribution"}
    torch.testing.assert_close(found["transformer_attribution"].tokens, alone)


class HandNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-6).sqrt()


def test_x_at_weight_is_a_linear_layer(authors, images) -> None:
    """The same network with its head written as ``x @ Wᵀ``: the same map (no bias: ``+ b`` passes the gradient)."""
    model = plain(authors, fused=True)
    with torch.no_grad():
        model.head.bias.zero_()
    linear_head = model.state_dict()
    head = model.head

    class MatmulHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = head.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.weight.T

    reference_model = plain(authors, fused=True)
    reference_model.load_state_dict(linear_head)
    model.head = MatmulHead()
    reference_map = lg.explain(reference_model, images, method="transformer_attribution").tokens
    torch.testing.assert_close(lg.explain(model, images, method="transformer_attribution").tokens, reference_map)


def test_operation_without_rule_raises(authors, images) -> None:
    model = plain(authors, fused=True)
    model.blocks[1].norm2 = HandNorm()
    with pytest.raises(UnsupportedOperation, match=r"transformer_attribution.*'blocks\.1\.norm2'"):
        lg.explain(model, images, method="transformer_attribution")


def test_text_model_reads_the_word_embeddings() -> None:
    """Token ids are no leaves: the word embedding's output is. Eager == SDPA; padding changes nothing."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, num_labels=3, initializer_range=0.3)
    weights = transformers.BertForSequenceClassification(config).state_dict()
    maps = {}
    for impl in ("eager", "sdpa"):
        config._attn_implementation = impl
        model = transformers.BertForSequenceClassification(config).eval()
        model.load_state_dict(weights)
        ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[1, 5:] = 0
        e = lg.explain(model, {"input_ids": ids, "attention_mask": mask}, method="transformer_attribution")
        alone = lg.explain(model, {"input_ids": ids[1:, :5], "attention_mask": mask[1:, :5]}, method="transformer_attribution")
        assert e.layers == [f"bert.encoder.layer.{i}.attention.self" for i in range(2)]
        assert torch.isfinite(e.tokens).all() and (e.tokens[1, 5:] == 0).all() and e.tokens.abs().amax() > 0
        torch.testing.assert_close(alone.tokens, e.tokens[1:, :5], rtol=1e-4, atol=1e-7 * e.tokens.abs().max().item())
        maps[impl] = e.tokens
    torch.testing.assert_close(maps["eager"], maps["sdpa"], rtol=1e-4, atol=1e-6 * maps["eager"].abs().max().item())


def test_the_captum_class_puts_explains_patches_on_the_pixels(authors, images) -> None:
    from lightning_gae import ImageTokens
    from lightning_gae.attribution import TransformerAttribution

    model = plain(authors, fused=True)
    exp = lg.explain(model, images, target=torch.tensor([3, 7, 1, 5]), method="transformer_attribution")
    pixels = TransformerAttribution(model, modality=ImageTokens(patch_size=PATCH)).attribute(images, target=[3, 7, 1, 5])
    assert pixels.shape == images.shape
    grid = exp.tokens[:, 1:].reshape(-1, IMG // PATCH, IMG // PATCH)
    # Each patch's pixels carry its token's relevance, on every channel.
    torch.testing.assert_close(pixels[:, 0, ::PATCH, ::PATCH], grid)
    torch.testing.assert_close(pixels[:, 2], pixels[:, 0])


class GroupedAttention(nn.Module):
    """Causal attention with grouped key/value heads and a key-padding mask, fused (SDPA with ``enable_gqa``) or written
    out (repeated heads, -inf above the diagonal and on masked keys, softmax, ``@``)."""

    def __init__(self, dim: int, fused: bool) -> None:
        super().__init__()
        self.q, self.kv, self.proj, self.fused = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim), fused

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self.q(x).view(b, n, 4, d // 4).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, 2, d // 4).permute(2, 0, 3, 1, 4).unbind(0)
        allowed = torch.ones(n, n, dtype=torch.bool).tril() & keep[:, None, None, :]
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :], is_causal=True, enable_gqa=True)
        else:
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
            scores = (q * (d // 4) ** -0.5) @ k.transpose(-2, -1) + torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
            out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class GroupedModel(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.embed, self.norm = nn.Linear(6, 32), nn.LayerNorm(32)
        self.blocks = nn.ModuleList(GroupedAttention(32, fused) for _ in range(2))
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for blk in self.blocks:
            h = h + blk(self.norm(h), keep)
        return self.head(h[:, -1])


def test_fused_causal_grouped_attention_equals_the_written_out_one() -> None:
    """SDPA's rules in one function (is_causal, grouped heads, a boolean mask) equal them op by op."""
    torch.manual_seed(3)
    fused, written = GroupedModel(fused=True).eval(), GroupedModel(fused=False).eval()
    written.load_state_dict(fused.state_dict())
    x = torch.randn(3, 7, 6, generator=torch.Generator().manual_seed(4))
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[1, 2] = False
    maps = [lg.explain(m, {"x": x, "keep": keep}, method="transformer_attribution", query=6, target=1).tokens
            for m in (fused, written)]
    assert maps[0].abs().amax() > 0 and (maps[0][1, 2] == 0).all()
    torch.testing.assert_close(maps[0], maps[1], rtol=1e-4, atol=1e-6 * maps[1].abs().max().item())


def test_fused_attention_on_the_queried_rows_alone_equals_the_written_out_one(authors, images) -> None:
    """Past the last attention only the read-out tokens' rows carry a gradient: the fused attention runs both passes
    on those rows alone (tokens 0, 5 and 40 of 65 here, two samples sharing one; batch == heads), the first attention
    gives q, k, v no gradient. The written-out attention runs every row of every layer."""
    maps = []
    for fused in (True, False):
        model = ReadTwoTokens(fused).eval()
        model.load_state_dict(authors.state_dict(), strict=True)
        maps.append(lg.explain(model, images, method="transformer_attribution", target=2, query=5).tokens)
    assert maps[0].abs().amax() > 0 and images.shape[0] == HEADS
    torch.testing.assert_close(maps[0], maps[1], rtol=1e-4, atol=1e-6 * maps[1].abs().max().item())


@pytest.mark.parametrize("rules_rows, plain_rows", [([1, 3], [1, 3]), ([1, 3], [3, 4]), (None, [0, 2]), ([2], None)])
def test_a_layers_abar_from_the_rows_each_pass_ran_on(rules_rows, plain_rows) -> None:
    """``E_h[(R ⊙ ∇A)⁺]`` where each pass ran on some query rows (None: all) equals it on dense ``[B, H, Nq, Nk]``
    matrices with the other rows 0 (B == H == 2, Nq = 5, Nk = 3)."""
    from lightning_gae.lrp.ta_attention import Layer, layer_abar

    g = torch.Generator().manual_seed(5)
    shape = torch.Size((2, 2, 5, 3))
    dense = []
    for at in (rules_rows, plain_rows):
        full = torch.randn(shape, generator=g)
        if at is not None:
            full[:, :, [i for i in range(5) if i not in at]] = 0
        dense.append(full)
    expected = (dense[0] * dense[1]).clamp(min=0).mean(dim=1)
    rows = [d.reshape(4, 5, 3) if at is None else d.reshape(4, 5, 3)[:, at] for d, at in zip(dense, (rules_rows, plain_rows))]
    layer = Layer(())
    layer.relevance = rows[0].clone()
    layer.relevance_at = None if rules_rows is None else torch.tensor(rules_rows)
    found = layer_abar(layer, rows[1].clone(), None if plain_rows is None else torch.tensor(plain_rows), shape)
    torch.testing.assert_close(found, expected)


class ZeroedBlock(PlainBlock):
    """A block that zeroes token 1 of its normalised input: in place (``h[:, 1] = 0``) or by a constant mask."""

    def __init__(self, block: PlainBlock, in_place: bool) -> None:
        super().__init__(DIM, HEADS, fused=True)
        self.load_state_dict(block.state_dict())
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        if self.in_place:
            h[:, 1] = 0.0
        else:
            h = h * (torch.arange(h.shape[1]) != 1).to(h.dtype)[None, :, None]
        x = x + self.attn(h)
        return x + self.mlp(self.norm2(x))


def test_a_normalised_output_changed_in_place(authors, images) -> None:
    """The identity rule hands out the norm's own output tensor (no copy): writing into it is still the model's
    computation, with the relevance of a constant mask."""
    maps = []
    for in_place in (True, False):
        model = plain(authors, fused=True)
        model.blocks[1] = ZeroedBlock(model.blocks[1], in_place)
        maps.append(lg.explain(model, images, method="transformer_attribution", target=2).tokens)
    assert maps[0].abs().amax() > 0
    torch.testing.assert_close(maps[0], maps[1])


class TanhCall(nn.Module):
    """Not an activation module: its ``torch.tanh`` is one operation of the mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


def test_an_activation_that_keeps_its_output(authors, images) -> None:
    """tanh's backward reads its output: the identity rule copies it (a module unit and the function alike)."""
    maps = []
    for unit in (True, False):
        model = plain(authors, fused=True)
        for blk in model.blocks:
            blk.mlp.act = nn.Tanh() if unit else TanhCall()
        maps.append(lg.explain(model, images, method="transformer_attribution", target=2).tokens)
    assert maps[0].abs().amax() > 0
    torch.testing.assert_close(maps[0], maps[1])
