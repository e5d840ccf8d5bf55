"""lightning_gae.callbacks.batch_layout and the modality inferred at fit start: the batch formats users have (Hugging
Face mappings of images, text and features, dataclasses of the same, tuples, a forward that takes the batch) work
without arguments; what the forward's signature cannot tell stops the run at its start with a reader that works when
passed (the tests pass it)."""

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader

import lightning_gae as lg
from lightning_gae.callbacks import BatchOptions, FaithfulnessOptions, GAECallback
from lightning_gae.callbacks.batch_layout import fit_to_forward
from tests.helpers.hf_modules import Batches, HFModule, TextByName, ids_and_mask, images, tiny_bert, tiny_vit
from tests.helpers.trainer import heatmap_tag, no_skipped_explanation

pytest.importorskip("transformers")

SCORED = ("positive_perturbation_auc/gae", "negative_perturbation_auc/gae")


class ImagesByName(HFModule):
    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values=pixel_values).logits


class TakesTheBatch(HFModule):
    def forward(self, batch: dict) -> Tensor:
        return self.model(pixel_values=batch["pixel_values"]).logits


class ImagesAsX(HFModule):
    """``forward(x)`` with mapping batches: x may be the images or the batch; the signature cannot tell."""

    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=x).logits


class MappingAsX(HFModule):
    def forward(self, x) -> Tensor:
        return self.model(pixel_values=x["pixel_values"]).logits


def _fit(tmp_path, make_trainer, module, make, collate_fn=None, **callback):
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(samples=4), **callback)
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    loader = DataLoader(Batches(make), batch_size=4, collate_fn=collate_fn)
    trainer.fit(module, loader, loader)
    return trainer, callback


def _assert_explained(trainer, callback, read_events):
    acc = read_events(trainer.logger.log_dir)
    for sample in callback.sample_indices:
        assert acc.image_steps(heatmap_tag(sample)) == [1]
    assert set(SCORED) <= set(acc.Tags()["scalars"])
    assert "faithfulness (4 validation samples" in callback.summary


def _image_batch(i):
    return {"pixel_values": images(i), "labels": torch.tensor(i % 3)}


@pytest.mark.slow
@pytest.mark.parametrize("module", [ImagesByName, TakesTheBatch], ids=["forward(pixel_values)", "forward(batch)"])
def test_hugging_face_image_batches_are_explained_without_arguments(tmp_path, make_trainer, read_events, module):
    # {"pixel_values", "labels"} used to infer ImageTokens, then stop the run with "'dict' object has no attribute
    # 'shape'"; a forward(self, batch) was refused with advice that could not work.
    with no_skipped_explanation():
        trainer, callback = _fit(tmp_path, make_trainer, module(tiny_vit()), _image_batch)
    _assert_explained(trainer, callback, read_events)


@pytest.mark.slow
def test_hugging_face_text_batches_infer_text_tokens_and_are_scored(tmp_path, make_trainer, read_events):
    def make(i):
        ids, mask = ids_and_mask(i)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(i % 2)}

    with no_skipped_explanation(), pytest.warns(UserWarning, match=r"the inputs are token ids, so modality=TextTokens"
                                                                   r".*removal='attention'.*TextTokens\(tokenizer\)"):
        trainer, callback = _fit(tmp_path, make_trainer, TextByName(tiny_bert()), make)
    _assert_explained(trainer, callback, read_events)


class FeatureTransformer(LightningModule):
    """One token per feature after a CLS token, on ``{"features": [B, 6], "labels"}`` batches."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.cls = nn.Linear(1, 16), nn.Parameter(torch.zeros(1, 1, 16))
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(16, 2)

    def forward(self, features: Tensor) -> Tensor:
        tokens = self.embed(features[..., None])
        return self.head(self.encoder(torch.cat([self.cls.expand(len(tokens), -1, -1), tokens], 1))[:, 0])

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch["features"]), batch["labels"])

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.slow
def test_feature_batches_infer_tabular_tokens_and_are_scored(tmp_path, make_trainer, read_events):
    def make(i):
        return {"features": torch.randn(6, generator=torch.Generator().manual_seed(i)), "labels": torch.tensor(i % 2),
                "index": torch.tensor(i)}  # a key the forward does not take: left out

    with no_skipped_explanation(), pytest.warns(UserWarning, match=r"6 features, one token each.*TabularTokens\("
                                                                   r"feature_names=\[\.\.\.\], means=\[\.\.\.\]\)"):
        trainer, callback = _fit(tmp_path, make_trainer, FeatureTransformer(), make)
    _assert_explained(trainer, callback, read_events)


def _followed(message: str) -> list[BatchOptions]:
    """Every ``batches=BatchOptions(...)`` the message offers, built as a user would paste it."""
    offered = []
    for found in re.finditer(r"batches=(BatchOptions\()", message):
        start, depth = found.start(1), 0
        for end in range(found.end(1) - 1, len(message)):
            depth += {"(": 1, ")": -1}.get(message[end], 0)
            if depth == 0:
                break
        offered.append(eval(message[start : end + 1]))
    return offered


@pytest.mark.slow
def test_a_forward_whose_signature_cannot_tell_is_refused_with_readers_that_work_when_passed(tmp_path, make_trainer,
                                                                                           read_events):
    # forward(x) with mapping batches: x may be the images or the batch itself.
    offered = {}
    for module in (ImagesAsX, MappingAsX):
        with pytest.raises(ValueError, match=r"ImagesAsX|MappingAsX") as refused:
            _fit(tmp_path / "refused", make_trainer, module(tiny_vit()), _image_batch)
        message = str(refused.value)
        assert "forward(x) takes none of them by name" in message and "batches=BatchOptions(inputs=" in message
        offered[module] = _followed(message)
        assert len(offered[module]) == 2, message
    # The first reader is right for forward(images), the second for forward(batch): each, passed, explains the run.
    for module, options in ((ImagesAsX, offered[ImagesAsX][0]), (MappingAsX, offered[MappingAsX][1])):
        with no_skipped_explanation():
            trainer, callback = _fit(tmp_path / module.__name__, make_trainer, module(tiny_vit()), _image_batch,
                                     batches=options)
        _assert_explained(trainer, callback, read_events)


class TwoInputs(LightningModule):
    """``forward(x, mask)`` on ``(x, mask, y)`` tuples: the default reader passes ``x`` alone."""

    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_bert()

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.model(input_ids=x, attention_mask=mask).logits

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0], batch[1]), batch[2])

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.slow
def test_a_tuple_batch_whose_forward_takes_more_than_its_first_item_is_refused_with_a_reader_that_works(
        tmp_path, make_trainer, read_events):
    def make(i):
        return (*ids_and_mask(i), torch.tensor(i % 2))

    text = lg.TextTokens(pad_id=0)
    with pytest.raises(ValueError, match=r"forward takes x, mask: pass batches=BatchOptions\(inputs=") as refused:
        _fit(tmp_path / "refused", make_trainer, TwoInputs(), make, modality=text)
    (options,) = _followed(str(refused.value))
    with no_skipped_explanation():
        trainer, callback = _fit(tmp_path / "followed", make_trainer, TwoInputs(), make, modality=text, batches=options)
    _assert_explained(trainer, callback, read_events)


def test_the_forward_signature_decides_how_a_mapping_is_passed():
    batch = {"pixel_values": torch.zeros(2, 3, 4, 4), "index": torch.arange(2)}
    assert fit_to_forward(ImagesByName(nn.Identity()), batch).keys() == {"pixel_values"}
    assert fit_to_forward(TakesTheBatch(nn.Identity()), batch) == (batch,)
    assert fit_to_forward(HFModule(nn.Identity()), batch) is batch  # LightningModule.forward(*args, **kwargs)
    assert fit_to_forward(ImagesByName(nn.Identity()), batch["pixel_values"]) is batch["pixel_values"]
    with pytest.raises(ValueError, match=r"ImagesAsX.forward\(x\)"):
        fit_to_forward(ImagesAsX(nn.Identity()), batch)


# Dataclass batches: a collate_fn builds them (Lightning moves them to the device field by field).


@dataclasses.dataclass
class ImageBatch:
    pixel_values: Tensor
    labels: Tensor


@dataclasses.dataclass
class TextBatch:
    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor


@dataclasses.dataclass
class XYBatch:
    x: Tensor
    y: Tensor


def _stacked(kind):
    """The collate_fn of dataclass samples of ``kind``: each field stacked."""
    def collate(samples):
        return kind(*(torch.stack([getattr(s, f.name) for s in samples]) for f in dataclasses.fields(kind)))
    return collate


class DataclassModule(HFModule):
    """A Hugging Face classifier trained on dataclass batches (its fields as the model's keyword arguments)."""

    def training_step(self, batch, batch_idx):
        return self.model(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}).loss

    def validation_step(self, batch, batch_idx):
        pass


class ImagesByNameDC(DataclassModule):
    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.model(pixel_values=pixel_values).logits


class TakesImageBatch(DataclassModule):
    def forward(self, images: ImageBatch) -> Tensor:  # not a batch name: the annotation says it
        return self.model(pixel_values=images.pixel_values).logits


class TextByNameDC(DataclassModule):
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


class TakesTextBatch(DataclassModule):
    def forward(self, batch) -> Tensor:
        return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits


def _image_dataclass(i):
    return ImageBatch(images(i), torch.tensor(i % 3))


def _text_dataclass(i):
    return TextBatch(*ids_and_mask(i), torch.tensor(i % 2))


@pytest.mark.slow
@pytest.mark.parametrize("module", [ImagesByNameDC, TakesImageBatch],
                         ids=["forward(pixel_values)", "forward(images: ImageBatch)"])
def test_dataclass_image_batches_are_explained_without_arguments(tmp_path, make_trainer, read_events, module):
    with no_skipped_explanation():
        trainer, callback = _fit(tmp_path, make_trainer, module(tiny_vit()), _image_dataclass,
                                 collate_fn=_stacked(ImageBatch))
    _assert_explained(trainer, callback, read_events)


@pytest.mark.slow
@pytest.mark.parametrize("module", [TextByNameDC, TakesTextBatch], ids=["forward(input_ids, attention_mask)",
                                                                        "forward(batch)"])
def test_dataclass_text_batches_infer_text_tokens_and_are_scored(tmp_path, make_trainer, read_events, module):
    with no_skipped_explanation(), pytest.warns(UserWarning, match=r"modality=TextTokens.*removal='attention'"):
        trainer, callback = _fit(tmp_path, make_trainer, module(tiny_bert()), _text_dataclass,
                                 collate_fn=_stacked(TextBatch))
    _assert_explained(trainer, callback, read_events)


class FeaturesAsX(FeatureTransformer):
    """``forward(x)`` on ``XYBatch(x=[B, 6], y)`` batches: x is the one field it takes by name."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch.x), batch.y)


@pytest.mark.slow
def test_an_x_y_dataclass_passes_x_by_name(tmp_path, make_trainer, read_events):
    def make(i):
        return XYBatch(torch.randn(6, generator=torch.Generator().manual_seed(i)), torch.tensor(i % 2))

    with no_skipped_explanation(), pytest.warns(UserWarning, match=r"6 features, one token each"):
        trainer, callback = _fit(tmp_path, make_trainer, FeaturesAsX(), make, collate_fn=_stacked(XYBatch))
    _assert_explained(trainer, callback, read_events)


class ImagesAsXDC(DataclassModule):
    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=x).logits


class DataclassAsX(DataclassModule):
    def forward(self, x) -> Tensor:
        return self.model(pixel_values=x.pixel_values).logits


@pytest.mark.slow
def test_a_dataclass_forward_whose_signature_cannot_tell_is_refused_with_readers_that_work_when_passed(
        tmp_path, make_trainer, read_events):
    offered = {}
    for module in (ImagesAsXDC, DataclassAsX):
        with pytest.raises(ValueError, match=r"ImagesAsXDC|DataclassAsX") as refused:
            _fit(tmp_path / "refused", make_trainer, module(tiny_vit()), _image_dataclass,
                 collate_fn=_stacked(ImageBatch))
        message = str(refused.value)
        assert "ImageBatch dataclasses with the fields ['pixel_values']" in message, message
        assert "forward(x) takes none of them by name" in message
        offered[module] = _followed(message)
        assert len(offered[module]) == 2, message
    # The first reader (batch.pixel_values) is right for forward(images), the second ((batch,)) for forward(batch).
    for module, options in ((ImagesAsXDC, offered[ImagesAsXDC][0]), (DataclassAsX, offered[DataclassAsX][1])):
        with no_skipped_explanation():
            trainer, callback = _fit(tmp_path / module.__name__, make_trainer, module(tiny_vit()), _image_dataclass,
                                     collate_fn=_stacked(ImageBatch), batches=options)
        _assert_explained(trainer, callback, read_events)


def test_the_forward_signature_decides_how_a_dataclass_is_passed():
    batch = TextBatch(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), torch.zeros(2))
    by_name = fit_to_forward(TextByNameDC(nn.Identity()), batch)
    assert by_name.keys() == {"input_ids", "attention_mask"} and by_name["input_ids"] is batch.input_ids
    assert fit_to_forward(TakesTextBatch(nn.Identity()), batch) == (batch,)
    assert fit_to_forward(HFModule(nn.Identity()), batch).keys() == {"input_ids", "attention_mask"}  # **kwargs
    images = ImageBatch(torch.zeros(2, 3, 4, 4), torch.zeros(2))
    assert fit_to_forward(TakesImageBatch(nn.Identity()), images) == (images,)
    with pytest.raises(ValueError, match=r"ImagesAsXDC.forward\(x\).*lambda batch: batch.pixel_values"):
        fit_to_forward(ImagesAsXDC(nn.Identity()), images)


class TakesTheTextBatch(HFModule):
    def forward(self, batch: dict) -> Tensor:
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _logged(read_events, trainer) -> tuple[dict, dict]:
    """Every scalar of the run and every tensor (the token tables with their relevance), read back."""
    acc = read_events(trainer.logger.log_dir)
    return acc.scalar_values(), {tag: acc.tensor(tag).tolist() for tag in acc.Tags()["tensors"]}


@pytest.mark.slow
@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "padded under the mask"])
@pytest.mark.parametrize("captum", [(), ("saliency", "input_x_gradient", "integrated_gradients")],
                         ids=["attention methods", "and Captum baselines"])
def test_a_text_forward_taking_the_batch_logs_what_forward_by_name_logs(tmp_path, make_trainer, read_events, padded,
                                                                        captum):
    # The same BERT (batch 5, 7 tokens, hidden 32) called as forward(input_ids, attention_mask) and forward(batch):
    # padding read from the batch's attention mask must leave out the same positions, so every scalar and every token
    # table is the same. Padded ids are not the pad id: only the mask says they are padding.
    def make(i):
        ids = torch.randint(5, 50, (7,), generator=torch.Generator().manual_seed(i))
        ids[0] = 2
        mask = torch.ones(7, dtype=torch.long)
        if padded and i % 3:
            mask[6 - i % 3:] = 0
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(i % 2)}

    logged = []
    for module in (TextByName, TakesTheTextBatch):
        torch.manual_seed(0)
        bert = tiny_bert(initializer_range=0.5)  # logits that depend on the tokens
        callback = GAECallback(num_samples=3, methods=("gae", "raw_attention"), captum_baselines=captum,
                               faithfulness=FaithfulnessOptions(samples=5), modality=lg.TextTokens(pad_id=0))
        trainer = make_trainer(tmp_path / module.__name__, [callback], max_epochs=1)
        loader = DataLoader(Batches(make, n=10), batch_size=5)
        with no_skipped_explanation():
            trainer.fit(module(bert), loader, loader)
        logged.append(_logged(read_events, trainer))
    (scalars, tables), (scalars_whole, tables_whole) = logged
    assert set(SCORED) <= set(scalars) and len({v[0] for k, v in scalars.items() if k in SCORED}) > 1
    assert scalars_whole == scalars
    assert tables_whole == tables
    # The token tables list the real tokens only: some tracked samples show fewer than 7 when padded.
    rows = [sum(line.startswith("| ") for line in table.decode().splitlines()) - 2
            for tag, table in tables.items() if tag.startswith("gae_tokens/")]
    assert len(rows) == 3 and (min(rows) < 7 if padded else set(rows) == {7}), rows
