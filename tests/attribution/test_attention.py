"""The Captum classes against explain(), inside Captum's own tools (NoiseTunnel, metrics, visualization)."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from captum.attr import NoiseTunnel, visualization
from captum.metrics import infidelity, sensitivity_max
from matplotlib.figure import Figure
from torch import nn

import lightning_gae as lg
from lightning_gae.attribution import AttentionFlow, AttentionGradCAM, AttentionRollout, GenericAttention, RawAttention
from lightning_gae.modalities import ImageTokens, TabularTokens, TextTokens
from tests.helpers.models import TinySeq2Seq, TinyViT, tiny_clip
from recipes.vit import ViTClassifier

transformers = pytest.importorskip("transformers")

CLASSES = {"gae": GenericAttention, "rollout": AttentionRollout, "raw_attention": RawAttention, "attn_gradcam": AttentionGradCAM,
           "attention_flow": AttentionFlow}


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return ViTClassifier(in_chans=3, dim=32, depth=2, heads=4).eval()


@pytest.fixture(scope="module")
def images():
    return torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(2)
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3)
    return BertForSequenceClassification._from_config(config, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def text():
    """Token ids ``[3, 7]`` right-padded to lengths 7, 4, 6, and their attention mask."""
    lengths = torch.tensor([7, 4, 6])
    ids = torch.randint(5, 60, (3, 7), generator=torch.Generator().manual_seed(3))
    mask = (torch.arange(7)[None] < lengths[:, None]).long()
    return ids * mask, mask


def bert_on_embeddings(bert):
    """Captum passes positional arguments only; Hugging Face takes embeddings by keyword."""
    return GenericAttention(lambda embeds, mask: bert(inputs_embeds=embeds, attention_mask=mask).logits, model=bert)


def pixels(tokens, images, patch=2):
    """Each patch's pixels carry its token's relevance (CLS dropped): the default, nearest upsampling."""
    rows, cols = images.shape[-2] // patch, images.shape[-1] // patch
    grid = tokens[:, 1:].reshape(-1, rows, cols).repeat_interleave(patch, 1).repeat_interleave(patch, 2)
    return grid[:, None].expand_as(images)


def relative_change(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


# --- images: the explanation mapped onto pixels ----------------------------------------------


@pytest.mark.parametrize("target", [2, [0, 1, 2], torch.tensor([4, 3, 9])], ids=["int", "list", "tensor"])
def test_image_attribution_is_the_explanation_on_pixels(vit, images, target):
    attr = GenericAttention(vit).attribute(images, target=target)
    exp = lg.explain(vit, images, target=target)
    assert attr.shape == images.shape and attr.dtype == torch.float32
    assert torch.equal(attr, pixels(exp.tokens, images))
    assert torch.equal(attr[:, 0], attr[:, 2]), "every channel carries the pixel's relevance"
    assert attr.abs().max() > 0


def test_patch_means_are_the_token_relevance(vit, images):
    # Captum's metrics and the perturbation tests rank pixels or patches: the attribution must keep
    # the explanation's patch order, which bilinear smoothing across patch borders does not.
    exp = lg.explain(vit, images, target=2)
    patches = exp.tokens[:, 1:].reshape(3, 4, 4)
    attr = GenericAttention(vit).attribute(images, target=2)
    means = torch.nn.functional.avg_pool2d(attr[:, :1], 2)[:, 0]
    torch.testing.assert_close(means, patches, rtol=0, atol=0)
    smooth = GenericAttention(vit, interpolate_mode="bilinear").attribute(images, target=2)
    assert torch.equal(smooth[:, 0], ImageTokens(patch_size=2).to_input(exp.tokens, images))
    assert not torch.equal(torch.nn.functional.avg_pool2d(smooth[:, :1], 2)[:, 0], patches)
    with pytest.raises(ValueError, match=r"interpolate_mode='bicubic'; use 'nearest'.*or 'bilinear'"):
        GenericAttention(vit, interpolate_mode="bicubic")


def test_no_cls_token_warns_and_points_to_the_mean_query(vit):
    with pytest.warns(UserWarning, match=r"ImageTokens\(patch_size=2, prefix_tokens=0\) has no CLS token.*query=\"mean\""):
        GenericAttention(vit, modality=ImageTokens(patch_size=2, prefix_tokens=0))


@pytest.mark.parametrize("method", list(CLASSES))
def test_each_class_runs_its_method(vit, images, method):
    attr = CLASSES[method](vit).attribute(images, target=1)
    assert torch.equal(attr, pixels(lg.explain(vit, images, target=1, method=method).tokens, images))


def test_target_forms(vit, images):
    gae = GenericAttention(vit)
    argmax = vit(images).argmax(-1)
    assert torch.equal(gae.attribute(images), gae.attribute(images, target=argmax))
    # A one-element tensor is Captum's "same class for every example", not a batch of one.
    assert torch.equal(gae.attribute(images, target=torch.tensor([2])), gae.attribute(images, target=2))
    assert not torch.equal(gae.attribute(images, target=0), gae.attribute(images, target=2))
    with pytest.raises(ValueError, match="tuple targets"):
        gae.attribute(images, target=(1, 2))


def test_tuple_in_tuple_out(vit, images):
    gae = GenericAttention(vit)
    single = gae.attribute((images,), target=1)
    assert isinstance(single, tuple) and len(single) == 1
    assert torch.equal(single[0], gae.attribute(images, target=1))


class WithBias(nn.Module):
    """A second input that is not laid out like the tokens: it gets zeros."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit

    def forward(self, x, bias):
        return self.vit(x) + bias


def test_tuple_input_not_laid_out_like_the_tokens_gets_zeros(vit, images):
    bias = torch.randn(3, 10)
    attr_x, attr_bias = GenericAttention(WithBias(vit)).attribute((images, bias), target=4)
    assert attr_bias.shape == bias.shape and not attr_bias.any()
    assert torch.equal(attr_x, GenericAttention(vit).attribute(images, target=4))


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_gradients_are_switched_on_inside(vit, images, context):
    expected = GenericAttention(vit).attribute(images, target=[1, 2, 3])
    with context():
        got = GenericAttention(vit).attribute(images.clone(), target=[1, 2, 3])
    torch.testing.assert_close(got, expected)
    assert got.abs().max() > 0


def test_captum_contract(vit):
    gae = GenericAttention(vit)
    assert gae.has_convergence_delta() is False and gae.multiplies_by_inputs is False
    # NoiseTunnel calls the undecorated method through log_usage's functools.wraps.
    assert callable(GenericAttention.attribute.__wrapped__)
    assert gae.forward_func is vit


# --- Captum's tools on images -----------------------------------------------------------------


def test_noise_tunnel_on_images(vit, images):
    gae = GenericAttention(vit)
    target = [1, 5, 7]
    clean = gae.attribute(images, target=target)
    tunnel = NoiseTunnel(gae)
    # No noise: the tunnel's expansion of inputs and targets and its averaging give back the attribution.
    torch.testing.assert_close(tunnel.attribute(images, nt_samples=3, stdevs=0.0, target=target), clean)
    torch.manual_seed(4)
    smooth = tunnel.attribute(images, nt_type="smoothgrad", nt_samples=3, stdevs=0.3, target=target)
    assert smooth.shape == images.shape
    assert relative_change(smooth, clean) > 1e-2
    assert torch.equal(smooth[:, 0], smooth[:, 1])


def test_infidelity_and_sensitivity_on_images(vit, images):
    gae = GenericAttention(vit)
    target = vit(images).argmax(-1)
    attr = gae.attribute(images, target=target)

    def perturb(x):
        noise = 0.05 * torch.randn_like(x)
        return noise, x - noise

    torch.manual_seed(5)
    infid = infidelity(vit, perturb, images, attr, target=target, n_perturb_samples=3)
    sens = sensitivity_max(gae.attribute, images, perturb_radius=0.05, n_perturb_samples=2, target=target)
    for value in (infid, sens):
        assert value.shape == (3,) and torch.isfinite(value).all()
    assert (sens > 0).all(), "a perturbed image changes its explanation a little"


def test_renders_with_captum_visualization(vit, images):
    attr = GenericAttention(vit).attribute(images, target=3)
    fig, _ = visualization.visualize_image_attr(
        attr[0].permute(1, 2, 0).numpy(),
        images[0].permute(1, 2, 0).numpy(),
        method="blended_heat_map",
        sign="absolute_value",
        use_pyplot=False,
    )
    assert isinstance(fig, Figure) and fig.axes


# --- text: token ids and embeddings -----------------------------------------------------------


def test_token_ids_get_one_value_per_token(bert, text):
    ids, mask = text
    attr = GenericAttention(bert).attribute(ids, target=[0, 1, 2], additional_forward_args=(mask,))
    exp = lg.explain(bert, {"input_ids": ids, "attention_mask": mask}, target=[0, 1, 2])
    assert attr.shape == ids.shape and attr.dtype == torch.float32
    torch.testing.assert_close(attr, exp.tokens)
    assert not attr[mask == 0].any(), "padded positions are 0"
    assert attr[mask == 1].abs().max() > 0


def test_embeddings_get_the_token_value_across_d(bert, text):
    ids, mask = text
    embeds = bert.get_input_embeddings()(ids).detach()
    attr = bert_on_embeddings(bert).attribute(embeds, target=1, additional_forward_args=(mask,))
    assert attr.shape == embeds.shape
    by_ids = GenericAttention(bert).attribute(ids, target=1, additional_forward_args=(mask,))
    torch.testing.assert_close(attr, by_ids[..., None].expand_as(embeds))
    assert not attr[mask == 0].any()


def test_noise_tunnel_on_embeddings(bert, text):
    ids, mask = text
    embeds = bert.get_input_embeddings()(ids).detach()
    gae = bert_on_embeddings(bert)
    clean = gae.attribute(embeds, target=[0, 1, 2], additional_forward_args=(mask,))
    tunnel = NoiseTunnel(gae)
    kwargs = dict(nt_samples=3, target=[0, 1, 2], additional_forward_args=(mask,))
    torch.testing.assert_close(tunnel.attribute(embeds, stdevs=0.0, **kwargs), clean)
    torch.manual_seed(6)
    smooth = tunnel.attribute(embeds, stdevs=0.5, **kwargs)
    assert smooth.shape == embeds.shape
    assert relative_change(smooth, clean) > 1e-2
    assert not smooth[mask == 0].any(), "the mask travels with the noisy copies"


def test_infidelity_and_sensitivity_on_embeddings(bert, text):
    ids, mask = text
    embeds = bert.get_input_embeddings()(ids).detach()
    gae = bert_on_embeddings(bert)
    target = [0, 1, 2]
    attr = gae.attribute(embeds, target=target, additional_forward_args=(mask,))

    def perturb(x):
        noise = 0.05 * torch.randn_like(x)
        return noise, x - noise

    torch.manual_seed(7)
    infid = infidelity(gae.forward_func, perturb, embeds, attr, additional_forward_args=(mask,), target=target,
                       n_perturb_samples=3)
    sens = sensitivity_max(gae.attribute, embeds, perturb_radius=0.05, n_perturb_samples=2, target=target,
                           additional_forward_args=(mask,))
    for value in (infid, sens):
        assert value.shape == (3,) and torch.isfinite(value).all()
    assert (sens > 0).all()


# --- forward functions ------------------------------------------------------------------------


def test_forward_function_runs_the_model_with_its_own_paths_and_modes():
    torch.manual_seed(8)
    model = TinyViT(impl="einsum").train()  # hand-written attention: only attention_modules sees it
    x = torch.rand(2, 1, 8, 8)
    gae = GenericAttention(lambda images: model(images), model=model, attention_modules="blocks.*.attn.attn_drop")
    attr = gae.attribute(x, target=1)
    expected = lg.explain(model, x, target=1, attention_modules="blocks.*.attn.attn_drop").tokens
    # Dropout off inside (a deterministic result equal to the module's own) and train mode restored.
    torch.testing.assert_close(attr, pixels(expected, x))
    assert model.training and all(m.training for m in model.modules())


def test_bound_method_names_its_module(vit, images):
    assert torch.equal(GenericAttention(vit.forward).attribute(images, target=2), GenericAttention(vit).attribute(images, target=2))


def test_forward_function_needs_its_model(vit):
    with pytest.raises(TypeError, match="model="):
        GenericAttention(lambda x: vit(x))
    with pytest.raises(ValueError, match="already an nn.Module"):
        GenericAttention(vit, model=TinyViT())


# --- modalities and the errors that name them -------------------------------------------------


class FeatureTransformer(nn.Module):
    """FT-Transformer: one token per scalar feature after a CLS token."""

    def __init__(self, features=5, dim=16, classes=3):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features, dim))
        self.bias = nn.Parameter(torch.randn(features, dim))
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        layer = nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        tokens = x[..., None] * self.weight + self.bias
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], dim=1)
        return self.head(self.encoder(h)[:, 0])


def test_tabular_features_with_tabular_tokens():
    torch.manual_seed(9)
    model = FeatureTransformer().eval()
    x = torch.randn(4, 5)
    modality = TabularTokens(["a", "b", "c", "d", "e"])
    attr = GenericAttention(model, modality=modality).attribute(x, target=0)
    assert attr.shape == x.shape
    torch.testing.assert_close(attr, lg.explain(model, x, target=0).tokens[:, 1:])
    with pytest.raises(ValueError, match=r"none of the inputs \(input 0: \(4, 5\)\).*6 tokens.*modality=.*TabularTokens"):
        GenericAttention(model).attribute(x, target=0)


class WithRegisters(nn.Module):
    """A ViT with 3 register tokens after CLS: 4 prefix tokens, which cannot be inferred."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit.model
        self.registers = nn.Parameter(torch.randn(1, 3, self.vit.cls_token.shape[-1]))

    def forward(self, x):
        patches = self.vit.patch_embed(x).flatten(2).transpose(1, 2) + self.vit.pos_embed[:, 1:]
        prefix = torch.cat([self.vit.cls_token, self.registers], dim=1).expand(x.shape[0], -1, -1)
        h = torch.cat([prefix, patches], dim=1)
        for block in self.vit.blocks:
            h = block(h)
        return self.vit.head(self.vit.norm(h)[:, 0])


def test_image_patching_that_cannot_be_inferred_asks_for_the_modality(vit, images):
    model = WithRegisters(vit).eval()
    with pytest.raises(ValueError, match=r"input 0 looks like images.*20 tokens.*modality=ImageTokens"):
        GenericAttention(model).attribute(images, target=0)
    modality = ImageTokens(patch_size=2, prefix_tokens=4)
    attr = GenericAttention(model, modality=modality, interpolate_mode="bilinear").attribute(images, target=0)
    expected = modality.to_input(lg.explain(model, images, target=0).tokens, images)
    torch.testing.assert_close(attr, expected[:, None].expand_as(images))


def test_embeddings_whose_length_is_not_the_token_count(bert, text):
    ids, _ = text
    embeds = bert.get_input_embeddings()(ids).detach()
    extra = torch.zeros(1, 1, embeds.shape[-1])
    # The forward function adds a token of its own: the model attends over T + 1 tokens.
    gae = GenericAttention(lambda e: bert(inputs_embeds=torch.cat([extra.expand(e.shape[0], -1, -1), e], 1)).logits, model=bert)
    with pytest.raises(ValueError, match=r"input 0: \(3, 7, 32\).*8 tokens.*8 entries in dim 1.*modality="):
        gae.attribute(embeds, target=0)


def test_inputs_must_be_tensors(vit, images):
    with pytest.raises(TypeError, match="additional_forward_args"):
        GenericAttention(WithBias(vit)).attribute((images, 1.0))


def test_a_model_taking_the_batch_is_refused_with_a_call_that_works_when_pasted():
    # Captum's contract attributes tensors: a batch mapping is refused naming the forward_func that builds it.
    pytest.importorskip("transformers")
    from tests.helpers.hf_modules import tiny_bert

    torch.manual_seed(0)
    bert = tiny_bert(initializer_range=0.5).eval()

    class TakesTheBatch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, batch):
            return self.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    model = TakesTheBatch()
    ids = torch.randint(5, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[2, 4:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 0])}
    with pytest.raises(TypeError, match=r"input 0 is a batch \(dict with \['input_ids', 'attention_mask', 'labels'\]\)"
                                        r".*GenericAttention\(lambda input_ids, attention_mask, labels: ") as refused:
        GenericAttention(model).attribute(batch)
    offered = str(refused.value).split("takes: ", 1)[1]
    relevance = eval(offered, {"GenericAttention": GenericAttention, "model": model, "batch": batch})
    by_keyword = GenericAttention(lambda i, m: bert(input_ids=i, attention_mask=m).logits, model=bert).attribute(
        ids, additional_forward_args=(mask,))
    torch.testing.assert_close(relevance, by_keyword)
    assert relevance.shape == (3, 7) and (relevance[2, 4:] == 0).all() and relevance.abs().sum() > 0


# --- several token sets ------------------------------------------------------------------------


def test_dual_encoder_inputs_each_get_their_own_towers_relevance():
    model = tiny_clip()
    ids = torch.tensor([[3, 4, 49, 0, 0], [5, 6, 7, 8, 49]])
    pixels = torch.randn(2, 3, 8, 8)

    def similarity(pixel_values, input_ids):
        return model(input_ids=input_ids, pixel_values=pixel_values).logits_per_image.diagonal()[:, None]

    gae = GenericAttention(similarity, model=model,
                           modality={"image": ImageTokens(patch_size=4), "text": TextTokens(pad_id=0)})
    image_map, text_map = gae.attribute((pixels, ids), target=0)
    exp = lg.explain(model, {"input_ids": ids, "pixel_values": pixels}, target=lambda o: o.logits_per_image.diagonal())
    # Nearest upsampling: every pixel of a patch holds its image token's relevance.
    patches = exp.relevance["image"][:, 1:].reshape(2, 2, 2)
    torch.testing.assert_close(image_map[:, 0, ::4, ::4], patches, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(text_map, exp.relevance["text"], rtol=1e-4, atol=1e-7)
    # Without the mapping, 5 text tokens and 5 image tokens (4 patches + CLS) both tile the image:
    # which tower it belongs to cannot be told from shapes, so it is not guessed.
    with pytest.raises(ValueError, match=r"input 0 \(2, 3, 8, 8\) fits token sets \['image', 'text'\] alike"):
        GenericAttention(similarity, model=model).attribute((pixels, ids), target=0)


def test_seq2seq_source_and_target_inputs_of_equal_length_need_the_mapping():
    torch.manual_seed(0)
    model = TinySeq2Seq().eval()
    src, tgt = torch.randint(0, 11, (2, 6)), torch.randint(0, 11, (2, 6))
    with pytest.raises(ValueError, match=r"input 0 \(2, 6\) fits token sets \['encoder', 'decoder'\] alike; pass modality=\{set"):
        GenericAttention(model, query=3).attribute((src, tgt), target=1)
    source, target = GenericAttention(model, query=3, modality={"encoder": TextTokens(), "decoder": TextTokens()}).attribute((src, tgt), target=1)
    exp = lg.explain(model, (src, tgt), query=3, target=1)
    torch.testing.assert_close(source, exp.relevance["encoder"])
    torch.testing.assert_close(target, exp.relevance["decoder"])
