"""GAECallback on models with several token sets: real fits, real event files read back.

Both models are built so that the two sets have EQUAL token counts (source and target of 7 tokens;
16 image patches + CLS and 17 caption tokens), so a shape check alone could not tell the sets apart:
every test compares numbers with ``explain`` run directly.
"""

from pathlib import Path

import pytest
import torch
from lightning.pytorch import seed_everything

from lightning_gae import ImageTokens, TextTokens, explain
from lightning_gae.callbacks import EngineOptions, FaithfulnessOptions, GAECallback
from lightning_gae.metrics import AlignmentAccuracy, RationaleAgreement, RelevanceSegmentation
from lightning_gae.tensorboard import metadata
from recipes.dual_encoder import ShapeCLIP, image_text_similarity
from recipes.seq2seq import PAD, CopyTaskDataModule, Seq2SeqCopier
from recipes.shapes import BOS_ID, EOS_ID, MASK_ID, PAD_ID, VOCAB, ShapesDataModule
from tests.helpers.models import shape_clip_streams
from tests.helpers.processes import get_json, tensorboard_server

SEQ_METHODS = ("gae", "raw_attention")
CLIP_METHODS = ("gae", "raw_attention")
PANEL = 256


def _copy_vocab():
    return [str(i) for i in range(31)]


def _seq2seq_callback(**kwargs):
    text = TextTokens(vocab=_copy_vocab(), pad_id=PAD)
    return GAECallback(num_samples=3, methods=SEQ_METHODS, modality={"encoder": text, "decoder": text}, **kwargs,
                       faithfulness=FaithfulnessOptions(metrics=()))


def _seq2seq_model():
    return Seq2SeqCopier(d_model=32, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32)


def _copy_data(source_length=7):
    # copy_length 6 + EOS: 7 target positions, as many as the 7 source tokens when source_length=7.
    return CopyTaskDataModule(num_train=128, num_val=32, source_length=source_length, copy_length=6, batch_size=16)


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory, make_trainer, read_events):
    root = tmp_path_factory.mktemp("seq2seq")
    seed_everything(0)
    callback = _seq2seq_callback(engine=EngineOptions(set_inputs={"encoder": "src", "decoder": "tgt_in"}))
    model, data = _seq2seq_model(), _copy_data()
    trainer = make_trainer(root, [callback], name="s2s", max_epochs=1, limit_val_batches=1)
    trainer.fit(model, data)
    index = torch.tensor(callback.sample_indices)
    batch = {k: v[index] for k, v in data.val_set.tensors.items()}
    return {"acc": read_events(trainer.logger.log_dir), "logdir": Path(trainer.logger.log_dir), "callback": callback,
            "model": model, "batch": batch}


def _direct_rows(model, batch, method):
    """``[B, T, S]``: row t is explain(..., query=t)'s encoder relevance, t over every target position."""
    rows = [explain(model, (batch["src"], batch["tgt_in"]), query=t, method=method).relevance["encoder"]
            for t in range(batch["tgt_in"].shape[1])]
    return torch.stack(rows, dim=1)


@pytest.mark.slow
def test_seq2seq_rows_are_the_per_position_explanations_at_equal_lengths(seq2seq_run):
    acc, callback, model, batch = seq2seq_run["acc"], seq2seq_run["callback"], seq2seq_run["model"], seq2seq_run["batch"]
    assert batch["src"].shape[1] == batch["tgt_in"].shape[1] == 7
    for method in SEQ_METHODS:
        direct = _direct_rows(model, batch, method)
        decoder = torch.stack([explain(model, (batch["src"], batch["tgt_in"]), query=t, method=method).relevance["decoder"]
                               for t in range(7)], dim=1)
        assert direct.abs().max() > 0
        for k, index in enumerate(callback.sample_indices):
            logged = torch.from_numpy(acc.tensor(f"gae_dashboard/set_rows/{method}/encoder/val_{index}"))
            assert logged.shape == (7, 7)
            torch.testing.assert_close(logged, direct[k], rtol=1e-5, atol=1e-7)
            logged_decoder = torch.from_numpy(acc.tensor(f"gae_dashboard/set_rows/{method}/decoder/val_{index}"))
            torch.testing.assert_close(logged_decoder, decoder[k], rtol=1e-5, atol=1e-7)
            # Source and target rows differ here, so a swap of the sets would fail the comparisons above.
            assert not torch.allclose(logged, logged_decoder)


@pytest.mark.slow
def test_seq2seq_set_inputs_and_single_set_tensors_keep_each_set(seq2seq_run):
    acc, callback, batch = seq2seq_run["acc"], seq2seq_run["callback"], seq2seq_run["batch"]
    for k, index in enumerate(callback.sample_indices):
        for name, key in (("encoder", "src"), ("decoder", "tgt_in")):
            tokens = [t.decode() for t in acc.tensor(f"gae_dashboard/set_input/{name}/val_{index}").tolist()]
            assert tokens == [str(i) for i in batch[key][k].tolist()]
            description = metadata.decode(acc.SummaryMetadata(f"gae_dashboard/set_input/{name}/val_{index}")
                                          .plugin_data.content)
            assert description["kind"] == "set_input" and description["set"] == name
        # The kinds the current plugin reads hold the query set (the decoder) alone.
        tokens = [t.decode() for t in acc.tensor(f"gae_dashboard/input/val_{index}").tolist()]
        assert tokens == [str(i) for i in batch["tgt_in"][k].tolist()]
        assert acc.tensor(f"gae_dashboard/relevance/gae/val_{index}").shape == (7,)


@pytest.mark.slow
def test_seq2seq_pictures_are_a_matrix_per_method_and_set(seq2seq_run):
    acc, callback = seq2seq_run["acc"], seq2seq_run["callback"]
    assert sorted(acc.Tags()["images"]) == sorted(f"gae_heatmaps/val_{i}" for i in callback.sample_indices)
    shapes = set()
    for index in callback.sample_indices:
        picture = acc.picture(f"gae_heatmaps/val_{index}", "RGB")
        # Two methods (rows) x two sets (columns), each matrix at least 256 px on a side.
        assert picture.shape[0] >= 2 * PANEL and picture.shape[1] >= 2 * PANEL
        assert max(picture.shape[:2]) <= 4096
        shapes.add(picture.shape)
    assert len(shapes) == 1
    table = acc.Tensors(f"gae_tokens/val_{callback.sample_indices[0]}")[-1].tensor_proto.string_val[0].decode()
    assert "gae · encoder" in table and "raw\\_attention · decoder" in table


@pytest.mark.slow
def test_alignment_accuracy_is_the_metric_on_the_explanations(seq2seq_run):
    acc, model, batch = seq2seq_run["acc"], seq2seq_run["model"], seq2seq_run["batch"]
    for method in SEQ_METHODS:
        metric = AlignmentAccuracy()
        metric.update(_direct_rows(model, batch, method), batch["alignment"])
        logged = acc.Scalars(f"alignment_accuracy/{method}")
        assert len(logged) == 1
        assert logged[0].value == pytest.approx(metric.compute().item(), abs=1e-6)


@pytest.mark.slow
def test_the_dashboard_plugin_serves_a_run_with_token_sets(seq2seq_run):
    """The current plugin shows the query set and ignores the per-set kinds; it must not fail on them."""
    logdir, callback = seq2seq_run["logdir"], seq2seq_run["callback"]
    with tensorboard_server(logdir.parent) as base:
        plugin = f"{base}/data/plugin/gae"
        info = get_json(f"{plugin}/run?run={logdir.name}")
        assert info["methods"] == list(SEQ_METHODS)
        assert sorted(s["sample"] for s in info["samples"]) == sorted(callback.sample_indices)
        assert all(s["modality"] == "text" and "set" not in s for s in info["samples"])
        step = get_json(f"{plugin}/step?run={logdir.name}&step={info['steps'][-1]}")
        for index in callback.sample_indices:
            assert set(step["samples"][str(index)]["relevance"]) == set(SEQ_METHODS)


def test_equal_lengths_without_set_inputs_stop_the_run_and_ask_for_them(tmp_path, make_trainer):
    seed_everything(0)
    trainer = make_trainer(tmp_path, [_seq2seq_callback()], name="s2s", max_epochs=1, limit_val_batches=1)
    with pytest.raises(ValueError, match=r"fit it alike; pass EngineOptions\(set_inputs="):
        trainer.validate(_seq2seq_model(), _copy_data())


@pytest.mark.slow
def test_unequal_lengths_find_each_sets_input(tmp_path, make_trainer, read_events):
    seed_everything(0)
    callback = _seq2seq_callback()
    trainer = make_trainer(tmp_path, [callback], name="s2s", max_epochs=1, limit_val_batches=1)
    model, data = _seq2seq_model(), _copy_data(source_length=9)
    trainer.validate(model, data)
    acc = read_events(trainer.logger.log_dir)
    index = callback.sample_indices[0]
    for name, key in (("encoder", "src"), ("decoder", "tgt_in")):
        tokens = [t.decode() for t in acc.tensor(f"gae_dashboard/set_input/{name}/val_{index}").tolist()]
        assert tokens == [str(i) for i in data.val_set.tensors[key][index].tolist()]
    assert acc.tensor(f"gae_dashboard/set_rows/gae/encoder/val_{index}").shape == (7, 9)


def test_perturbation_metrics_on_token_sets_stop_the_run_with_the_fix(tmp_path, make_trainer):
    text = TextTokens(vocab=_copy_vocab(), pad_id=PAD)
    callback = GAECallback(num_samples=2, modality={"encoder": text, "decoder": text},
                           engine=EngineOptions(set_inputs={"encoder": "src", "decoder": "tgt_in"}))
    with pytest.raises(ValueError, match=r"token sets \['encoder', 'decoder'\].*Pass faithfulness=FaithfulnessOptions\(metrics=\(\)\)"):
        make_trainer(tmp_path, [callback], name="s2s", max_epochs=1, limit_val_batches=1).validate(_seq2seq_model(),
                                                                                               _copy_data())


# --- a CLIP dual encoder with as many caption tokens as image tokens ----------------------------------


def _shape_text():
    return TextTokens(vocab=VOCAB, pad_id=PAD_ID, special_ids=[PAD_ID, BOS_ID, EOS_ID, MASK_ID], mask_id=MASK_ID)


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory, make_trainer, read_events):
    root = tmp_path_factory.mktemp("clip")
    seed_everything(0)
    # 32 px images in 8 px patches: 16 patches + CLS = 17 tokens, as many as the 17 caption positions.
    callback = GAECallback(num_samples=2, methods=CLIP_METHODS, target=image_text_similarity,
                           modality={"text": _shape_text(), "image": ImageTokens(patch_size=8)},
                           faithfulness=FaithfulnessOptions(metrics=()),
                           engine=EngineOptions(streams=shape_clip_streams()))
    model = ShapeCLIP(image_size=32, patch_size=8, max_length=17, hidden_size=32, intermediate_size=32, num_layers=2,
                      num_heads=2, projection_dim=16)
    data = ShapesDataModule(task="contrastive", num_train=64, num_val=16, max_length=17, batch_size=16)
    trainer = make_trainer(root, [callback], name="clip", max_epochs=1, limit_val_batches=1)
    trainer.fit(model, data)
    index = torch.tensor(callback.sample_indices)
    batch = {k: v[index] for k, v in data.val_set.tensors.items()}
    return {"acc": read_events(trainer.logger.log_dir), "callback": callback, "model": model, "batch": batch}


def _clip_explain(model, batch, method):
    inputs = {k: batch[k] for k in ("input_ids", "pixel_values", "attention_mask")}
    return explain(model, inputs, target=image_text_similarity, method=method, streams=shape_clip_streams())


@pytest.mark.slow
def test_clip_sets_are_logged_apart_at_equal_token_counts(clip_run):
    acc, callback, model, batch = clip_run["acc"], clip_run["callback"], clip_run["model"], clip_run["batch"]
    for method in CLIP_METHODS:
        exp = _clip_explain(model, batch, method)
        assert exp.relevance["text"].shape == exp.relevance["image"].shape == (2, 17)
        for k, index in enumerate(callback.sample_indices):
            for name in ("text", "image"):
                logged = torch.from_numpy(acc.tensor(f"gae_dashboard/set_relevance/{method}/{name}/val_{index}"))
                torch.testing.assert_close(logged, exp.relevance[name][k], rtol=1e-5, atol=1e-7)
            assert not torch.allclose(exp.relevance["text"][k], exp.relevance["image"][k])


@pytest.mark.slow
def test_clip_ground_truth_scores_each_set_with_its_own_truth(clip_run):
    acc, model, batch = clip_run["acc"], clip_run["model"], clip_run["batch"]
    text = _shape_text()
    text_inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    for method in CLIP_METHODS:
        exp = _clip_explain(model, batch, method)
        segmentation = RelevanceSegmentation(ImageTokens(patch_size=8))
        segmentation.update(exp.relevance["image"], batch["masks"])
        rationale = RationaleAgreement()
        rationale.update(text.unit_scores(exp.relevance["text"], text_inputs), batch["rationales"],
                         text.removable(text_inputs))
        # The callback explains every method from one recorded forward, explain() GAE on its lean path:
        # the relevance agrees to float32 rounding, which can move the scores' last digits.
        for key, value in segmentation.compute().items():
            assert acc.Scalars(f"segmentation_{key}/{method}")[-1].value == pytest.approx(value.item(), rel=1e-4, abs=1e-6)
        for key, value in rationale.compute().items():
            assert acc.Scalars(f"rationale_{key}/{method}")[-1].value == pytest.approx(value.item(), rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_clip_picture_puts_the_heatmap_beside_the_tokens(clip_run):
    acc, callback = clip_run["acc"], clip_run["callback"]
    for index in callback.sample_indices:
        picture = acc.picture(f"gae_heatmaps/val_{index}", "RGB")
        # The inputs, then one line per method; the image panel and the text strip side by side.
        assert picture.shape[0] >= (1 + len(CLIP_METHODS)) * PANEL
        assert picture.shape[1] >= 3 * PANEL
        table = acc.Tensors(f"gae_tokens/val_{index}")[-1].tensor_proto.string_val[0].decode()
        assert "**text**" in table and "**image**" not in table


def test_sets_that_cannot_be_told_apart_stop_the_run_and_name_the_fix(tmp_path, make_trainer):
    # 16 caption tokens fit the 32 px images in 8 px patches without a CLS token, so both sets could be images.
    seed_everything(0)
    model = ShapeCLIP(image_size=32, patch_size=8, hidden_size=32, intermediate_size=32, num_layers=1, num_heads=2,
                      projection_dim=16)
    data = ShapesDataModule(task="contrastive", num_train=64, num_val=16, max_length=16, batch_size=16)
    guessed = GAECallback(num_samples=2, target=image_text_similarity, faithfulness=FaithfulnessOptions(metrics=()),
                          engine=EngineOptions(streams=shape_clip_streams()))
    with pytest.raises(ValueError, match=r"\['pixel_values'\] more than once; pass modality="):
        make_trainer(tmp_path, [guessed], name="clip", max_epochs=1, limit_val_batches=1).validate(model, data)
    pointed = GAECallback(num_samples=2, target=image_text_similarity, faithfulness=FaithfulnessOptions(metrics=()),
                          engine=EngineOptions(streams=shape_clip_streams(), set_inputs={"text": "input_ids"}))
    with pytest.raises(ValueError, match=r"cannot infer the modality of token set 'text'"):
        make_trainer(tmp_path, [pointed], name="clip", max_epochs=1, limit_val_batches=1).validate(model, data)
