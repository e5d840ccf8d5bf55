"""compare.attribute on images, Hugging Face and plain token models; compare() on a model whose evidence is known
and on the recipes' models with several token sets (seq2seq, CLIP)."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from captum.attr import LayerGradientXActivation
from torch import nn

import lightning_gae as lg
from lightning_gae import explain
from lightning_gae.compare import ATTRIBUTION_METHODS, Comparison, attribute, compare, comparison_grid
from lightning_gae.options import EngineOptions, FaithfulnessOptions
from lightning_gae.metrics import (
    PERTURBATION_METRICS,
    AlignmentAccuracy,
    RationaleAgreement,
    RelevanceSegmentation,
    perturbation_metric,
)
from lightning_gae.metrics.functional import PROTOCOLS, perturbation_auc, rationale_agreement, relevance_segmentation
from lightning_gae.modalities import ImageTokens, TabularTokens, TextTokens
from recipes.dual_encoder import ShapeCLIP, image_text_similarity
from recipes.seq2seq import CopyTokens, Seq2SeqCopier, make_copy_task
from recipes.shapes import CaptionTokens, make_shapes
from recipes.vit import ViTClassifier
from tests.helpers.models import shape_clip_streams

CAPTUM = ("saliency", "input_x_gradient", "integrated_gradients", "gradient_shap")


class TokenClassifier(nn.Module):
    """Token ids -> class logits read at token 0; the embedding sits at ``embed.tokens`` and there is
    no ``get_input_embeddings``, so Captum's methods must be told where it is."""

    def __init__(self, vocab: int = 20, dim: int = 16, classes: int = 3, length: int = 8) -> None:
        super().__init__()
        self.embed = nn.ModuleDict({"tokens": nn.Embedding(vocab, dim)})
        self.pos = nn.Parameter(torch.randn(1, length, dim) * 0.5)
        layer = nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed["tokens"](ids) + self.pos[:, : ids.shape[1]]
        return self.head(self.encoder(h)[:, 0])


class EvidenceViT(nn.Module):
    """Known evidence: the CLS token attends to the left half's 2x2 patches only and reads their mean
    brightness; class 1 iff it exceeds 0.3. Nothing on the right half can change the prediction."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        brightness = F.unfold(x, 2, stride=2).mean(dim=1)                       # [B, 16] patches, row-major
        left = torch.arange(16) % 4 < 2
        keys = torch.cat([torch.tensor([-1.0]), left.float() * 2 - 1]).to(x)   # CLS and right: -1, left: +1
        k = keys.view(1, 1, 17, 1).expand(batch, 1, 17, 1)
        q = torch.full_like(k, 10.0)
        v = torch.cat([torch.zeros(batch, 1), brightness], dim=1).view(batch, 1, 17, 1)
        cls = F.scaled_dot_product_attention(q, k, v, scale=1.0)[:, 0, 0, 0]
        return torch.stack([0.3 - cls, cls - 0.3], dim=1) * 10


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return ViTClassifier(dim=32, depth=2, heads=2)


@pytest.fixture(scope="module")
def images():
    return torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def bert():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3)
    return transformers.BertForSequenceClassification._from_config(config, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def text():
    """A tokenizer-style batch: [CLS]=1 ... [SEP]=2, the second row padded (0) after 5 tokens."""
    ids = torch.randint(5, 40, (3, 8), generator=torch.Generator().manual_seed(3))
    ids[:, 0], ids[:, -1] = 1, 2
    ids[1, 4], ids[1, 5:] = 2, 0
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


@pytest.fixture(scope="module")
def token_model():
    torch.manual_seed(4)
    return TokenClassifier()


# --- attribute() -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ATTRIBUTION_METHODS)
def test_every_method_on_the_vit(vit, images, method):
    vit.train()
    attributions = attribute(method, vit, images, target=[1, 2, 3])
    expected = (3, 17) if method in (*lg.METHODS, *lg.LRP_METHODS, "random") else images.shape
    assert attributions.shape == expected and attributions.dtype == torch.float32
    assert torch.isfinite(attributions).all() and attributions.abs().sum() > 0
    assert vit.training and all(m.training for m in vit.modules()), "every module's mode is restored"
    if method in (*lg.METHODS, *lg.LRP_METHODS):
        vit.eval()
        assert torch.equal(attributions, lg.explain(vit, images, target=[1, 2, 3], method=method).tokens)


def test_input_x_gradient_is_the_input_times_the_target_gradient(vit, images):
    vit.eval()
    x = images.clone().requires_grad_()
    logits = vit(x)
    (grad,) = torch.autograd.grad(logits[torch.arange(3), logits.argmax(1)].sum(), x)
    torch.testing.assert_close(attribute("input_x_gradient", vit, images), images * grad)


def test_captum_runs_under_inference_mode_without_touching_grads(vit, images):
    with torch.inference_mode():
        attributions = attribute("integrated_gradients", vit, images, target=0)
    assert attributions.shape == images.shape and not attributions.is_inference()
    assert all(p.grad is None for p in vit.parameters())


@pytest.mark.parametrize("method", ATTRIBUTION_METHODS)
def test_every_method_on_hugging_face_token_ids(bert, text, method):
    attributions = attribute(method, bert, text)
    assert attributions.shape == (3, 8) and attributions.dtype == torch.float32
    assert torch.isfinite(attributions).all() and attributions.abs().sum() > 0
    if method in lg.METHODS:
        torch.testing.assert_close(attributions, lg.explain(bert, text, method=method).tokens)


@pytest.mark.parametrize("method, multiply, absolute", [("input_x_gradient", True, False), ("saliency", False, True)])
def test_token_ids_match_captums_layer_gradient_on_the_found_embedding(bert, text, method, multiply, absolute):
    target = torch.tensor([0, 2, 1])
    layer = LayerGradientXActivation(lambda ids, mask: bert(input_ids=ids, attention_mask=mask).logits,
                                     bert.get_input_embeddings(), multiply_by_inputs=multiply)
    reference = layer.attribute(text["input_ids"], target=target, additional_forward_args=(text["attention_mask"],))
    reference = reference.abs() if absolute else reference
    torch.testing.assert_close(attribute(method, bert, text, target=target), reference.sum(dim=-1))


@pytest.mark.parametrize("method", CAPTUM)
def test_plain_token_model_with_the_embedding_named(token_model, method):
    ids = torch.randint(0, 20, (4, 8), generator=torch.Generator().manual_seed(5))
    attributions = attribute(method, token_model, ids, embedding_layer="embed.tokens")
    assert attributions.shape == (4, 8) and attributions.abs().sum() > 0
    by_module = attribute(method, token_model, ids, embedding_layer=token_model.embed["tokens"])
    torch.testing.assert_close(attributions, by_module)


def test_token_ids_without_a_findable_embedding_say_what_to_pass(token_model):
    ids = torch.randint(0, 20, (2, 8))
    with pytest.raises(ValueError, match="embedding_layer="):
        attribute("saliency", token_model, ids)
    with pytest.raises(ValueError, match="embedding_layer='embed.words'"):
        attribute("saliency", token_model, ids, embedding_layer="embed.words")
    with pytest.raises(ValueError, match="must be called once"):
        attribute("saliency", token_model, ids, embedding_layer="head")


def test_random_is_seeded_and_leaves_the_global_rng_alone(vit, images):
    state = torch.get_rng_state()
    first = attribute("random", vit, images, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    assert first.shape == (3, 17)
    assert torch.equal(first, attribute("random", vit, images, seed=7))
    assert not torch.equal(first, attribute("random", vit, images, seed=8))


def test_gradient_shap_is_seeded_and_leaves_the_global_rngs_alone(vit, images):
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    first = attribute("gradient_shap", vit, images, seed=3)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], numpy_state[1])
    assert torch.equal(first, attribute("gradient_shap", vit, images, seed=3))
    assert not torch.equal(first, attribute("gradient_shap", vit, images, seed=4))


def test_options_reach_the_underlying_call(vit, images):
    coarse = attribute("integrated_gradients", vit, images, n_steps=2)
    assert not torch.allclose(coarse, attribute("integrated_gradients", vit, images))
    with pytest.raises(TypeError, match="n_steps"):
        attribute("saliency", vit, images, n_steps=2)


def test_bad_arguments_name_the_fix(vit, images):
    with pytest.raises(ValueError, match="integrated_gradients"):
        attribute("ig", vit, images)
    with pytest.raises(ValueError, match="input_ids"):
        attribute("saliency", vit, {"images": images})
    with pytest.raises(ValueError, match="one class per sample"):
        attribute("saliency", vit, images, target=[1, 2])


# --- compare() -------------------------------------------------------------------------------------


def test_compare_ranks_the_known_evidence_above_random():
    model = EvidenceViT()
    images = 0.5 + 0.5 * torch.rand(24, 1, 8, 8, generator=torch.Generator().manual_seed(6))
    methods = ("gae", "rollout", "random", "saliency", "integrated_gradients")
    result = compare(model, images, methods=methods, batch_size=10)

    assert result.num_samples == 24 and list(result.methods) == list(methods)
    positive = {m: v["positive_perturbation_auc"] for m, v in result.methods.items()}
    negative = {m: v["negative_perturbation_auc"] for m, v in result.methods.items()}
    for method in ("gae", "rollout", "saliency", "integrated_gradients"):
        assert positive[method] + 15 < positive["random"], positive
        assert negative[method] > negative["random"] + 15, negative
    assert result.higher_is_better == {"positive_perturbation_auc": False, "negative_perturbation_auc": True}
    assert all(v["seconds_per_sample"] > 0 for v in result.methods.values())


def test_compare_protocols_explain_the_prediction_or_the_label_scored_against_the_label():
    model = EvidenceViT()
    images = torch.rand(12, 1, 8, 8, generator=torch.Generator().manual_seed(8))
    predictions = model(images).argmax(dim=1)
    labels = predictions.clone()
    labels[:4] = 1 - labels[:4]                          # a third of the labels disagree with the model
    metrics = ("positive_perturbation_auc", "deletion_auc")
    modality = ImageTokens(2)
    results = {p: compare(model, images, labels, methods=("gae",), batch_size=8, protocol=p,
                          faithfulness=FaithfulnessOptions(metrics=metrics))
               for p in PROTOCOLS}
    explained = {"predicted": predictions, "target": labels}
    for protocol, result in results.items():
        assert result.protocol == protocol and result.to_dict()["protocol"] == protocol
        attributions = attribute("gae", model, images, explained[protocol])
        for name in metrics:
            reference = perturbation_metric(name, model, modality, protocol=protocol)
            reference.update(images, attributions, labels)
            assert result.methods["gae"][name] == pytest.approx(reference.compute().item(), abs=1e-5), (protocol, name)
    # Scored against the labels, the "predicted" curve starts at the model's accuracy; "target" explains the label.
    start = perturbation_metric("positive_perturbation_auc", model, modality, protocol="predicted")
    start.update(images, attribute("gae", model, images, predictions), labels)
    assert start.curve()[0].item() == pytest.approx(8 / 12)
    assert results["predicted"].methods["gae"] != results["target"].methods["gae"]
    # Without labels both protocols explain and score the predictions.
    unlabelled = [compare(model, images, methods=("gae",), protocol=p,
                          faithfulness=FaithfulnessOptions(metrics=metrics)).methods["gae"] for p in PROTOCOLS]
    assert {k: v for k, v in unlabelled[0].items() if k != "seconds_per_sample"} == \
        pytest.approx({k: v for k, v in unlabelled[1].items() if k != "seconds_per_sample"})
    with pytest.raises(ValueError, match="protocol='label'"):
        compare(model, images, labels, methods=("gae",), protocol="label")


def test_compare_standard_errors_are_the_spread_of_each_samples_score():
    model = EvidenceViT()
    images = torch.rand(9, 1, 8, 8, generator=torch.Generator().manual_seed(9))
    result = compare(model, images, methods=("gae", "random"), batch_size=4,
                     faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",)))
    modality = ImageTokens(2)
    for method in ("gae", "random"):
        # Each sample alone, with the attribution compare gave it (random is seeded per batch).
        per_sample = []
        for index, start in enumerate(range(0, 9, 4)):
            chunk = images[start : start + 4]
            maps = attribute(method, model, chunk, seed=index)
            per_sample += [perturbation_auc(model, modality, chunk[i : i + 1], maps[i : i + 1]).item()
                           for i in range(len(chunk))]
        scores = np.array(per_sample, dtype=np.float64)
        assert result.methods[method]["positive_perturbation_auc"] == pytest.approx(scores.mean(), abs=1e-4)
        assert result.stderr[method]["positive_perturbation_auc"] == pytest.approx(scores.std(ddof=1) / 3, abs=1e-4)
    assert result.stderr["random"]["positive_perturbation_auc"] > 0
    assert " ± " in result.to_markdown()


def _jackknife_stderr(held_out: list[float]) -> float:
    """The jackknife standard error from the values with each sample left out, in float64."""
    values = np.array(held_out, dtype=np.float64)
    n = len(values)
    return float(np.sqrt((n - 1) / n * ((values - values.mean()) ** 2).sum()))


def test_compare_scores_segmentation_masks_with_a_jackknife_error():
    model = EvidenceViT()
    images = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(10))
    masks = torch.zeros(6, 8, 8, dtype=torch.long)
    masks[:, :, :4] = 1                                    # the left half is the evidence
    masks[0, :, :2] = 0                                    # samples differ, so the error is not zero
    result = compare(model, images, methods=("gae",), batch_size=4, ground_truth=masks,
                     faithfulness=FaithfulnessOptions(metrics=("deletion_auc",)))
    maps = ImageTokens(2).pixel_map(attribute("gae", model, images), images)
    expected = relevance_segmentation(maps, masks)
    gae = result.methods["gae"]
    for key, value in expected.items():
        assert gae[f"segmentation_{key}"] == pytest.approx(value.item(), abs=1e-5)
        assert result.higher_is_better[f"segmentation_{key}"]
    # mIoU pools pixels over samples: its error is the jackknife of the pooled value, left out one sample at a time.
    held_out = [relevance_segmentation(maps[np.arange(6) != i], masks[np.arange(6) != i])["miou"].item() for i in range(6)]
    assert result.stderr["gae"]["segmentation_miou"] == pytest.approx(_jackknife_stderr(held_out), abs=1e-5)
    assert gae["segmentation_mean_ap"] > 0.9


def test_compare_scores_rationales_and_informative_features():
    torch.manual_seed(11)
    modality = TextTokens(vocab=[str(i) for i in range(40)], special_ids=[0, 1, 2], pad_id=0, mask_id=3)
    bert_ids = torch.randint(5, 40, (4, 8), generator=torch.Generator().manual_seed(12))
    bert_ids[:, 0], bert_ids[:, -1] = 1, 2
    rationales = torch.zeros(4, 8, dtype=torch.long)
    rationales[:, 3] = 1
    model = TokenClassifier(vocab=40).eval()
    result = compare(model, bert_ids, methods=("raw_attention",), modality=modality, batch_size=3,
                     ground_truth=rationales, faithfulness=FaithfulnessOptions(metrics=("comprehensiveness",)))
    tokens = attribute("raw_attention", model, bert_ids)
    expected = rationale_agreement(tokens, rationales, modality.removable(bert_ids))
    for key, value in expected.items():
        assert result.methods["raw_attention"][f"rationale_{key}"] == pytest.approx(value.item(), abs=1e-5)

    # Features: a linear model reading features 0 and 2 only; its input x gradient puts them first.
    weight = torch.tensor([[0.0, 0.0, 0.0, 0.0], [3.0, 0.0, -3.0, 0.0]])
    linear = nn.Linear(4, 2)
    linear.weight.data, linear.bias.data = weight, torch.zeros(2)
    features = torch.randn(8, 4, generator=torch.Generator().manual_seed(13)).abs() + 0.5
    features[:, 2] *= -1                                    # both informative features push class 1 up
    informative = torch.tensor([1, 0, 1, 0]).expand(8, -1)
    tabular = TabularTokens(["a", "b", "c", "d"], prefix_tokens=0, means=[0.0] * 4)
    result = compare(linear, features, target=1, methods=("input_x_gradient",), modality=tabular,
                     ground_truth=informative, faithfulness=FaithfulnessOptions(metrics=("deletion_auc",)))
    scores = result.methods["input_x_gradient"]
    assert scores["feature_recovery_token_f1"] == 1.0 and scores["feature_recovery_auprc"] == pytest.approx(1.0)
    assert result.stderr["input_x_gradient"]["feature_recovery_token_f1"] == 0.0
    with pytest.raises(ValueError, match="ground_truth has 3 samples"):
        compare(linear, features, methods=("input_x_gradient",), modality=tabular, ground_truth=informative[:3])


def test_compare_scores_every_method_with_every_metric_in_range(vit):
    images = torch.rand(10, 1, 8, 8, generator=torch.Generator().manual_seed(7))
    methods = ("gae", "attn_gradcam", "random", "input_x_gradient")
    metrics = tuple(PERTURBATION_METRICS)
    result = compare(vit, images, methods=methods, batch_size=4,
                     faithfulness=FaithfulnessOptions(metrics=metrics, max_batch=64))

    bounds = {name: perturbation_metric(name, vit, ImageTokens(2)) for name in metrics}
    for method in methods:
        assert set(result.methods[method]) == {*metrics, "seconds_per_sample"}
        for name in metrics:
            low, high = bounds[name].plot_lower_bound, bounds[name].plot_upper_bound
            assert low <= result.methods[method][name] <= high, (method, name)

    as_dict = json.loads(json.dumps(result.to_dict()))
    assert as_dict == {"methods": result.methods, "num_samples": 10, "protocol": "target", "stderr": result.stderr}
    assert {m: set(e) for m, e in result.stderr.items()} == {m: set(metrics) for m in methods}

    table = result.to_markdown().strip().splitlines()
    assert len(table) == 2 + len(methods)
    assert "positive_perturbation_auc ↓" in table[0] and "negative_perturbation_auc ↑" in table[0]
    column = 1 + metrics.index("positive_perturbation_auc")
    best = min(methods, key=lambda m: result.methods[m]["positive_perturbation_auc"])
    row = next(line for line in table if line.startswith(f"| {best} |"))
    assert row.split("|")[column + 1].strip().startswith("**")


def test_compare_text_in_batches_fixes_the_targets_once(bert, text):
    modality = TextTokens(vocab=[str(i) for i in range(40)], special_ids=[1, 2], pad_id=0, mask_id=3)
    methods = ("gae", "integrated_gradients")
    whole = compare(bert, text, methods=methods, modality=modality, batch_size=3,
                    faithfulness=FaithfulnessOptions(metrics=("comprehensiveness",)))
    split = compare(bert, text, methods=methods, modality=modality, batch_size=2,
                    faithfulness=FaithfulnessOptions(metrics=("comprehensiveness",)))
    for method in methods:
        assert whole.methods[method]["comprehensiveness"] == pytest.approx(split.methods[method]["comprehensiveness"], abs=1e-5)


def test_compare_reports_each_methods_progress_in_samples(vit, images, seq2seq):
    calls = []
    compare(vit, images, methods=("gae", "random"), batch_size=2, progress=lambda *call: calls.append(call),
            faithfulness=FaithfulnessOptions(metrics=("deletion_auc",)))
    assert calls == [("gae", 0, 3), ("gae", 2, 3), ("gae", 3, 3), ("random", 0, 3), ("random", 2, 3), ("random", 3, 3)]
    model, data, modality = seq2seq
    calls.clear()
    compare(model, (data["src"], data["tgt_in"]), methods=("gae",), modality=modality, batch_size=4,
            ground_truth={"alignment": data["alignment"]}, progress=lambda *call: calls.append(call),
            faithfulness=FaithfulnessOptions(metrics=()),
            engine=EngineOptions(set_inputs={"encoder": 0, "decoder": 1}))
    assert calls == [("gae", 0, 6), ("gae", 4, 6), ("gae", 6, 6)]


def test_compare_errors_name_the_argument(vit, images, token_model):
    with pytest.raises(ValueError, match="methods="):
        compare(vit, images, methods=("gae", "lime"))
    with pytest.raises(ValueError, match="metrics="):
        compare(vit, images, faithfulness=FaithfulnessOptions(metrics=("accuracy",)))
    with pytest.raises(ValueError, match="modality="):
        compare(token_model, torch.randint(0, 20, (2, 8)), methods=("gae",))


def test_comparison_grid_draws_samples_by_methods(vit, images):
    picture = comparison_grid(vit, images[:2], methods=("gae", "saliency"))
    assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
    # Two rows of at least 128-pixel renders, three columns (input, gae, saliency).
    assert picture.shape[0] >= 2 * 128 and picture.shape[1] >= 3 * 128


def _probe_maps(like: torch.Tensor, seed: int) -> torch.Tensor:
    """Token maps ``[2, N]`` of known sign: sample 0 all positive, sample 1 mixed (mostly positive, a little below 0)."""
    ramp = torch.linspace(0.0, 1.0, like.shape[1])
    return torch.stack([0.1 + ramp, ramp - 0.25])


def _probe_positive(like: torch.Tensor, seed: int) -> torch.Tensor:
    """A non-negative method's maps with a rounding error below 0 in sample 1."""
    return _probe_maps(like, seed).clamp(min=-1e-3)


@pytest.fixture
def probe_methods():
    from lightning_gae.methods import Method, register_method, unregister_method

    made = [register_method(Method(name="signed_probe", kind="baseline", rule=_probe_maps, explained_as="raw_attention",
                                   signed=True)),
            register_method(Method(name="positive_probe", kind="baseline", rule=_probe_positive,
                                   explained_as="raw_attention"))]
    yield made
    for method in made:
        unregister_method(method.name)


def test_comparison_grid_draws_each_method_on_one_colormap_from_zero_in_every_sample(vit, images, probe_methods):
    from lightning_gae import display
    from tests.helpers.pictures import find

    modality = ImageTokens(patch_size=2)
    picture = comparison_grid(vit, images[:2], methods=[m.name for m in probe_methods], modality=modality)
    tokens = _probe_maps(torch.zeros(2, 17), 0)
    for method, signed in ((probe_methods[0], True), (probe_methods[1], False)):
        pixels = modality.input_map(method.rule(tokens, 0), images[:2], images[:2])
        for i in range(2):
            heat = pixels[i]
            # The method's colormap over the range anchored at 0 by its sign: (-m, m) for the signed one in the
            # all-positive sample too, (0, max) for the non-negative one in the sample with a rounding error below 0.
            vrange = display.value_range(heat, signed)
            assert (vrange[0] == -vrange[1]) if signed else vrange[0] == 0.0
            panel = display.heatmap_panel(modality.display_image(images[i]), heat, size=128, vrange=vrange,
                                          cmap=display.colormap_for(signed), alpha=modality.alpha)
            assert len(find(picture, panel)) == 1, (method.name, i)
    assert (display.colormap_lut(display.colormap_for(True))[128] > 240).all()  # 0, the centre of (-m, m), is white


def test_markdown_bolds_ties_and_follows_direction():
    result = Comparison(
        methods={"a": {"deletion_auc": 0.2, "insertion_auc": 0.5, "seconds_per_sample": 0.001},
                 "b": {"deletion_auc": 0.2, "insertion_auc": 0.7, "seconds_per_sample": 0.002}},
        num_samples=4,
        higher_is_better={"deletion_auc": False, "insertion_auc": True},
    )
    lines = result.to_markdown().splitlines()
    assert lines[2] == "| a | **0.2** | 0.5 | 1 |"
    assert lines[3] == "| b | **0.2** | **0.7** | 2 |"


# --- models with several token sets: the recipes' seq2seq and CLIP ----------------------------------------
# Both are built with EQUAL token counts in their two sets (7 source and 7 target positions; 16 patches
# + CLS and 17 caption positions), so only the numbers, not the shapes, can show the sets kept apart.


@pytest.fixture(scope="module")
def seq2seq():
    torch.manual_seed(0)
    model = Seq2SeqCopier(d_model=32, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32).eval()
    data = make_copy_task(6, source_length=7, copy_length=6, generator=torch.Generator().manual_seed(1))
    tokens = CopyTokens()
    return model, data, {"encoder": tokens, "decoder": tokens}


def test_seq2seq_rows_and_alignment_per_method(seq2seq):
    model, data, modality = seq2seq
    inputs = (data["src"], data["tgt_in"])
    # Two batches (4 + 2 samples): the rows of both are joined in sample order.
    with pytest.warns(UserWarning, match="saliency attributes one input tensor"):
        result = compare(model, inputs, methods=("gae", "random", "saliency"), modality=modality,
                         ground_truth={"alignment": data["alignment"]}, batch_size=4,
                         faithfulness=FaithfulnessOptions(metrics=()),
                         engine=EngineOptions(set_inputs={"encoder": 0, "decoder": 1}))
    assert result.sets == ["encoder", "decoder"] and list(result.methods) == ["gae", "random"]
    assert "saliency" in result.skipped and "saliency left out" in result.to_markdown()
    assert result.to_dict()["skipped"] == result.skipped
    by_position = [explain(model, inputs, query=t).relevance for t in range(7)]
    for name in ("encoder", "decoder"):
        rows = torch.stack([relevance[name] for relevance in by_position], dim=1)
        torch.testing.assert_close(result.relevance["gae"][name], rows, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(result.relevance["gae"]["encoder"], result.relevance["gae"]["decoder"])
    for method in ("gae", "random"):
        metric = AlignmentAccuracy()
        metric.update(result.relevance[method]["encoder"], data["alignment"])
        assert result.methods[method]["encoder/alignment_accuracy"] == pytest.approx(metric.compute().item(), abs=1e-6)
        assert result.stderr[method]["encoder/alignment_accuracy"] >= 0
    assert result.higher_is_better == {"encoder/alignment_accuracy": True}
    assert result.relevance["random"]["encoder"].shape == (6, 7, 7)


def test_seq2seq_metrics_that_cannot_apply_are_errors(seq2seq):
    model, data, modality = seq2seq
    inputs = (data["src"], data["tgt_in"])
    common = {"methods": ("gae",), "modality": modality, "engine": EngineOptions(set_inputs={"encoder": 0, "decoder": 1})}
    with pytest.raises(ValueError, match=r"cannot apply to a model with the token sets \['encoder', 'decoder'\]"):
        compare(model, inputs, **common, faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",)))
    with pytest.raises(ValueError, match=r"ground_truth\['masks'\] scores the one set whose modality scores 'segmentation' ground truth"):
        compare(model, inputs, ground_truth={"masks": torch.zeros(6, 7, 7, dtype=torch.bool)}, **common,
                faithfulness=FaithfulnessOptions(metrics=()))
    with pytest.raises(ValueError, match=r"is a mapping from the batch key"):
        compare(model, inputs, ground_truth=data["alignment"], **common,
                faithfulness=FaithfulnessOptions(metrics=()))
    with pytest.raises(ValueError, match=r"fit it alike; pass EngineOptions\(set_inputs="):
        compare(model, inputs, methods=("gae",), modality=modality, faithfulness=FaithfulnessOptions(metrics=()))


def test_clip_at_equal_token_counts_scores_each_tower_with_its_own_truth():
    torch.manual_seed(0)
    model = ShapeCLIP(image_size=32, patch_size=8, max_length=17, hidden_size=32, intermediate_size=32, num_layers=2,
                      num_heads=2, projection_dim=16).eval()
    data = make_shapes(6, max_length=17, generator=torch.Generator().manual_seed(2))
    inputs = {k: data[k] for k in ("input_ids", "pixel_values", "attention_mask")}
    text, image = CaptionTokens(), ImageTokens(patch_size=8)
    result = compare(model, inputs, target=image_text_similarity, methods=("gae", "rollout", "random"),
                     modality={"text": text, "image": image}, batch_size=4,
                     ground_truth={"masks": data["masks"], "rationales": data["rationales"]},
                     faithfulness=FaithfulnessOptions(metrics=()),
                     engine=EngineOptions(streams=shape_clip_streams()))
    assert sorted(result.sets) == ["image", "text"]
    for method in ("gae", "rollout"):
        exp = explain(model, inputs, target=image_text_similarity, method=method, streams=shape_clip_streams())
        assert exp.relevance["text"].shape == exp.relevance["image"].shape == (6, 17)
        for name in ("text", "image"):
            torch.testing.assert_close(result.relevance[method][name], exp.relevance[name], rtol=1e-5, atol=1e-7)
        segmentation = RelevanceSegmentation(image)
        segmentation.update(exp.relevance["image"], data["masks"])
        for key, value in segmentation.compute().items():
            assert result.methods[method][f"image/segmentation_{key}"] == pytest.approx(value.item(), abs=1e-5)
        text_inputs = {"input_ids": data["input_ids"], "attention_mask": data["attention_mask"]}
        rationale = RationaleAgreement()
        rationale.update(text.unit_scores(exp.relevance["text"], text_inputs), data["rationales"],
                         text.removable(text_inputs))
        for key, value in rationale.compute().items():
            assert result.methods[method][f"text/rationale_{key}"] == pytest.approx(value.item(), abs=1e-5)
    with pytest.raises(ValueError, match=r"ground_truth\['alignment'\] scores a source set per target position"):
        compare(model, inputs, target=image_text_similarity, methods=("gae",),
                modality={"text": text, "image": image},
                ground_truth={"alignment": torch.zeros(6, 17, dtype=torch.long)},
                faithfulness=FaithfulnessOptions(metrics=()), engine=EngineOptions(streams=shape_clip_streams()))


# --- declared regions: the callback's shares, for a finished model --------------------------------------------------


def _review_case(tmp_path):
    """A small review classifier, its validation data with the spurious word, and a GAECallback that declares the word
    and logs its shares on 8 tracked samples when validated (the same weights compare is given)."""
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import TensorBoardLogger

    from lightning_gae.callbacks import GAECallback, RegionOptions
    from recipes.shortcuts import SpuriousReviewsDataModule
    from recipes.text_rationales import ReviewClassifier, ReviewTokens

    seed_everything(0)
    data = SpuriousReviewsDataModule(num_train=64, num_val=64, max_length=32, batch_size=32, seed=0)
    model = ReviewClassifier(max_length=32, dim=32, depth=2, heads=2, dropout=0.0)
    callback = GAECallback(num_samples=8, methods=("gae", "rollout"), modality=ReviewTokens(),
                           faithfulness=FaithfulnessOptions(metrics=(), samples=0),
                           regions=RegionOptions(regions=[data.region], threshold=None))
    trainer = Trainer(logger=TensorBoardLogger(tmp_path, name="regions"), callbacks=[callback], accelerator="cpu",
                      devices=1, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1)
    return data, model, callback, trainer


def test_compare_region_share_is_a_plain_loop_over_samples(tmp_path):
    from lightning_gae.metrics.functional import region_recall, region_share
    from lightning_gae.modalities.regions import region_token_mask
    from recipes.text_rationales import ReviewTokens

    data, model, _, _ = _review_case(tmp_path)
    data.setup("validate")
    batch = torch.utils.data.default_collate([data.val_set[i] for i in range(12)])
    inputs, modality = {"input_ids": batch["input_ids"]}, ReviewTokens()
    model.eval()
    result = compare(model, inputs, methods=("gae", "random"), modality=modality, regions=[data.region], batch_size=5,
                     faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",)))
    for method in ("gae", "random"):
        shares, recalls = [], []
        for i in range(12):
            one = {"input_ids": inputs["input_ids"][i : i + 1]}
            mask = region_token_mask(data.region, modality, one)
            if not mask.any():
                continue
            if method == "random":  # the floor is drawn per batch of 5 (seed + batch): the sample's row of its noise
                chunk = {"input_ids": inputs["input_ids"][5 * (i // 5) : 5 * (i // 5) + 5]}
                relevance = attribute("random", model, chunk, seed=i // 5)[i % 5 : i % 5 + 1]
            else:
                relevance = explain(model, one).tokens
            valid = modality.real_tokens(one)
            shares.append(float(region_share(relevance, mask, valid)))
            recalls.append(float(region_recall(relevance, mask, None, valid)))
        assert len(shares) >= 3
        values = torch.tensor(shares, dtype=torch.float64)
        assert result.methods[method]["region_share_spurious_word"] == pytest.approx(float(values.mean()), abs=1e-5)
        assert result.stderr[method]["region_share_spurious_word"] == pytest.approx(
            float(values.std() / len(shares) ** 0.5), abs=1e-5)
        assert result.methods[method]["region_recall_spurious_word"] == pytest.approx(sum(recalls) / len(recalls), abs=1e-5)
    assert result.higher_is_better["region_share_spurious_word"] is False, "less on a suspect region is better"
    assert result.to_dict()["regions"] == {"spurious_word": "suspect"}
    table = result.to_markdown()
    assert "region_share_spurious_word ↓" in table and "region_recall_spurious_word ↓" in table


def test_a_region_with_a_mask_per_sample_is_scored_batch_by_batch(vit, images):
    # Region(mask=[N, H, W]) holds one mask per sample: each batch scores its own samples' masks.
    from lightning_gae.modalities.regions import Region

    masks = torch.zeros(3, 8, 8)
    masks[0, :4, :4], masks[1, 4:, 4:], masks[2, :4, 4:] = 1, 1, 1
    region = Region("corner", "evidence", mask=masks)
    common = {"methods": ("gae", "random"), "modality": ImageTokens(patch_size=2), "regions": [region],
              "faithfulness": FaithfulnessOptions(metrics=("positive_perturbation_auc",))}
    whole = compare(vit.eval(), images, batch_size=3, **common)
    batched = compare(vit.eval(), images, batch_size=2, **common)
    assert batched.methods["gae"]["region_share_corner"] == pytest.approx(whole.methods["gae"]["region_share_corner"])
    assert batched.methods["gae"]["region_recall_corner"] == pytest.approx(whole.methods["gae"]["region_recall_corner"])


@pytest.mark.slow
def test_compare_reports_the_region_shares_the_callback_logs(tmp_path, read_events):
    from lightning_gae.callbacks.gae_monitor import default_batch_inputs

    data, model, callback, trainer = _review_case(tmp_path)
    trainer.validate(model, datamodule=data)
    logged = {tag: values[-1] for tag, values in read_events(trainer.logger.log_dir).scalar_values().items()}
    batch = torch.utils.data.default_collate([data.val_set[i] for i in callback.sample_indices])
    model.eval()
    result = compare(model, default_batch_inputs(batch), methods=("gae", "rollout", "random"),
                     modality=callback.modality, regions=callback.regions, seed=callback.batches.seed, batch_size=8,
                     faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",)))
    for method in ("gae", "rollout", "random"):
        for key in ("share", "recall"):
            tag = f"region_{key}_spurious_word/{method}"
            assert tag in logged, sorted(logged)
            assert result.methods[method][f"region_{key}_spurious_word"] == pytest.approx(logged[tag], abs=1e-5)


def _text_batch():
    """5 sequences of 7 token ids (hidden size 32 below), two of them padded under the mask (ids not the pad id)."""
    ids = torch.randint(5, 50, (5, 7), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 2
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[1, 5:], mask[3, 3:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask}


class _TakesTheBatch(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, batch):
        return self.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def test_compare_scores_a_model_taking_the_batch_as_the_same_model_by_keyword():
    # Captum's baselines attribute the batch's input_ids and call the model with the batch rebuilt around them.
    pytest.importorskip("transformers")
    from tests.helpers.hf_modules import tiny_bert

    torch.manual_seed(0)
    bert = tiny_bert(initializer_range=0.5).eval()
    batch, text = _text_batch(), TextTokens(pad_id=0, removal="attention")
    methods = ("gae", "random", "saliency", "input_x_gradient", "integrated_gradients")
    by_keyword = compare(bert, batch, methods=methods, modality=text, batch_size=2).to_dict()
    whole = compare(_TakesTheBatch(bert), (batch,), methods=methods, modality=text, batch_size=2).to_dict()
    for result in (by_keyword, whole):
        for scores in result["methods"].values():
            scores.pop("seconds_per_sample")
    assert whole == by_keyword
    assert len({scores["positive_perturbation_auc"] for scores in whole["methods"].values()}) > 1
