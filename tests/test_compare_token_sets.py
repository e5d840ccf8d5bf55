"""``compare`` and ``lightning-gae compare`` on models with several token sets: the recipes' seq2seq and CLIP.

Both are built with EQUAL token counts in their two sets (7 source and 7 target positions; 16 patches
+ CLS and 17 caption positions), so only the numbers, not the shapes, can show the sets kept apart.
"""

import json
from pathlib import Path

import matplotlib.image
import pytest
import torch
import yaml

from lightning_gae import ImageTokens, Streams, explain
from lightning_gae.cli import main
from lightning_gae.compare import compare
from lightning_gae.metrics import AlignmentAccuracy, RationaleAgreement, RelevanceSegmentation
from recipes.dual_encoder import ShapeCLIP, image_text_similarity
from recipes.seq2seq import CopyTokens, Seq2SeqCopier, make_copy_task
from recipes.shapes import CaptionTokens, make_shapes

ROOT = Path(__file__).resolve().parent.parent


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
        result = compare(model, inputs, methods=("gae", "random", "saliency"), metrics=(), modality=modality,
                         set_inputs={"encoder": 0, "decoder": 1}, ground_truth={"alignment": data["alignment"]},
                         batch_size=4)
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
    common = {"methods": ("gae",), "modality": modality, "set_inputs": {"encoder": 0, "decoder": 1}}
    with pytest.raises(ValueError, match=r"cannot apply to a model with the token sets \['encoder', 'decoder'\]"):
        compare(model, inputs, metrics=("positive_perturbation_auc",), **common)
    with pytest.raises(ValueError, match=r"ground_truth\['masks'\] scores the one ImageTokens set"):
        compare(model, inputs, metrics=(), ground_truth={"masks": torch.zeros(6, 7, 7, dtype=torch.bool)}, **common)
    with pytest.raises(ValueError, match=r"is a mapping from the batch key"):
        compare(model, inputs, metrics=(), ground_truth=data["alignment"], **common)
    with pytest.raises(ValueError, match=r"fit it alike; pass set_inputs="):
        compare(model, inputs, metrics=(), methods=("gae",), modality=modality)


def _clip_streams():
    return Streams(self_attention={"text": ["model.text_model.*"], "image": ["model.vision_model.*"]},
                   query_set="image", queries={"text": "last", "image": 0})


def test_clip_at_equal_token_counts_scores_each_tower_with_its_own_truth():
    torch.manual_seed(0)
    model = ShapeCLIP(image_size=32, patch_size=8, max_length=17, hidden_size=32, intermediate_size=32, num_layers=2,
                      num_heads=2, projection_dim=16).eval()
    data = make_shapes(6, max_length=17, generator=torch.Generator().manual_seed(2))
    inputs = {k: data[k] for k in ("input_ids", "pixel_values", "attention_mask")}
    text, image = CaptionTokens(), ImageTokens(patch_size=8)
    result = compare(model, inputs, target=image_text_similarity, methods=("gae", "rollout", "random"), metrics=(),
                     modality={"text": text, "image": image}, streams=_clip_streams(), batch_size=4,
                     ground_truth={"masks": data["masks"], "rationales": data["rationales"]})
    assert sorted(result.sets) == ["image", "text"]
    for method in ("gae", "rollout"):
        exp = explain(model, inputs, target=image_text_similarity, method=method, streams=_clip_streams())
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
        compare(model, inputs, target=image_text_similarity, methods=("gae",), metrics=(), streams=_clip_streams(),
                modality={"text": text, "image": image}, ground_truth={"alignment": torch.zeros(6, 17, dtype=torch.long)})


def _small_config(config, root):
    """The recipe's config with its callback, on a smaller model and data set, explaining with GAE alone."""
    settings = yaml.safe_load((ROOT / "configs" / f"{config}.yaml").read_text())
    (callback,) = settings["trainer"]["callbacks"]
    callback["init_args"].update(methods=["gae"], num_samples=2)
    settings["model"]["init_args"].update(SMALL_MODELS[config])
    settings["data"]["init_args"].update(num_train=64, num_val=32)
    path = root / f"{config}.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


SMALL_MODELS = {
    "seq2seq": {"d_model": 32, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 32},
    "dual_encoder": {"hidden_size": 32, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "projection_dim": 16},
}


def _fit(config, root):
    main(["fit", "--config", str(config), "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
          "--trainer.limit_val_batches=1", f"--trainer.logger.init_args.save_dir={root / 'runs'}",
          f"--trainer.default_root_dir={root}"])
    (path,) = root.glob("runs/*/version_*/checkpoints/*.ckpt")
    return path


@pytest.mark.parametrize("config,columns", [
    ("seq2seq", {"encoder/alignment_accuracy"}),
    ("dual_encoder", {"image/segmentation_miou", "text/rationale_auprc"}),
], ids=["seq2seq", "dual_encoder"])
def test_the_cli_compares_a_recipes_token_sets(config, columns, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = _small_config(config, tmp_path)
    checkpoint = _fit(small, tmp_path)
    with pytest.warns(UserWarning, match="saliency"):
        main(["compare", "--config", str(small), "--ckpt_path", str(checkpoint), "--output", "out", "--num_samples", "5",
              "--methods", "gae", "random", "saliency"])
    report = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert len(report["sets"]) == 2 and set(report["skipped"]) == {"saliency"} and report["num_samples"] == 5
    assert list(report["methods"]) == ["gae", "random"]
    for scores in report["methods"].values():
        assert columns <= set(scores)
    assert "token set" in (tmp_path / "out" / "comparison.md").read_text()
    picture = matplotlib.image.imread(tmp_path / "out" / "comparison.png")
    # The first 4 samples one under another, each at least a 256 px panel for GAE (and the inputs, for CLIP).
    assert picture.shape[0] >= 4 * 256
