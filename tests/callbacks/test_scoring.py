"""GAECallback scores its explanations: the faithfulness subset (its schedule, batches, standard errors, eval mode),
the papers' protocols, ground truth in the batch (masks, rationales) and Captum baselines beside GAE."""

import re
import math
import warnings

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import seed_everything
from tensorboard.util import tensor_util
from torch.utils.data import DataLoader, Dataset

from lightning_gae import ImageTokens, TextTokens, explain
from lightning_gae.callbacks import BatchOptions, FaithfulnessOptions, GAECallback
from lightning_gae.metrics import PositivePerturbationAUC, random_attribution
from lightning_gae.metrics.functional import relevance_segmentation
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier
from tests.helpers.models import small_vit


@pytest.mark.slow
def test_perturbation_aucs_are_logged_for_every_method_and_random(tmp_path, make_trainer, read_events):
    seed_everything(0)
    callback = GAECallback(num_samples=4, methods=("gae", "rollout"),
                           faithfulness=FaithfulnessOptions(every_n_explanations=1))
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=4)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    logged = read_events(trainer.logger.log_dir).scalar_values()
    for method in ("gae", "rollout", "random"):
        for metric in ("positive_perturbation_auc", "negative_perturbation_auc"):
            values = logged[f"{metric}/{method}"]
            assert len(values) == 2, (method, metric)
            assert all(0.0 <= v <= 90.0 for v in values)
    assert not [tag for tag in logged if "heatmap" in tag]


class ModeRecordingViT(ViTClassifier):
    """Records, for every forward in inference mode (validation, the callback's metrics), whether dropout was on."""

    def __init__(self):
        super().__init__(dim=32, depth=2, heads=2, dropout=0.5)
        self.inference_modes = []

    def forward(self, x):
        if torch.is_inference_mode_enabled():
            self.inference_modes.append(self.training)
        return super().forward(x)


@pytest.mark.slow
@pytest.mark.parametrize("every,scored", [(None, [3]), (1, [0, 1, 2, 3]), (2, [0, 2, 3])],
                         ids=["None: when fit ends", "every step", "every second step and the end"])
def test_the_faithfulness_subset_is_scored_on_its_schedule_and_on_the_final_weights(tmp_path, every, scored, make_trainer,
                                                                                    read_events):
    # Explanation steps at the end of epochs 0-3. The subset is scored at the first explanation step and every
    # n-th after it; the final weights (those of the last explanation step here) are always scored, once.
    seed_everything(0)
    callback = GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(samples=16, every_n_explanations=every))
    trainer = make_trainer(tmp_path, [callback], max_epochs=4, limit_train_batches=2)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    acc = read_events(trainer.logger.log_dir)
    pictures = acc.scalar_steps("relevance_concentration/gae")
    assert len(pictures) == 4
    for tag in ("positive_perturbation_auc/gae", "negative_perturbation_auc/random",
                "positive_perturbation_auc/gae/stderr"):
        assert [e.step for e in acc.Scalars(tag)] == [pictures[i] for i in scored], tag
    # The GAE tab's curves are written with the scalars, at steps where the tab has pictures to show beside them.
    curve = "gae_dashboard/curve/positive_perturbation_auc/gae"
    assert [e.step for e in acc.Tensors(curve)] == [pictures[i] for i in scored]
    # So is the Text tab's table of every method's scores (what a chart of one point cannot tell apart).
    tables = acc.Tensors("gae_faithfulness")
    assert [e.step for e in tables] == [pictures[i] for i in scored]
    lines = tensor_util.make_ndarray(tables[-1].tensor_proto).item().decode().splitlines()
    # The table escapes names for markdown (negative\\_perturbation\\_auc): read each cell as the user sees it.
    header = [re.sub(r"\\(.)", r"\1", c.strip()) for c in lines[0].strip("|").split("|")]
    assert header == ["method", "negative_perturbation_auc", "positive_perturbation_auc"]
    rows = {cells[0]: cells[1:] for cells in ([re.sub(r"\\(.)", r"\1", c.strip()) for c in line.strip("|").split("|")]
                                              for line in lines[2:]
                                              if line.startswith("|"))}
    count = lines.index("value ± standard error over 16 validation samples")
    # Then, where every method ties on a metric, why (on 16 samples of a model trained 8 steps, they may).
    assert all(line.startswith("ties: ") for line in lines[count + 1:] if line)
    assert set(rows) == {"gae", "random"}
    for method, cells in rows.items():
        for metric, cell in zip(header[1:], cells):
            value, error = (float(x) for x in cell.split(" ± "))
            assert value == pytest.approx(acc.Scalars(f"{metric}/{method}")[-1].value, rel=1e-3)
            assert error == pytest.approx(acc.Scalars(f"{metric}/{method}/stderr")[-1].value, rel=0.06)  # 2 digits


@pytest.mark.slow
def test_fit_that_ends_between_explanation_steps_scores_the_final_weights_in_eval_mode(tmp_path, make_trainer,
                                                                                      read_events):
    # every_n_epochs=2 over 3 epochs: one explanation step (epoch 1). The last epoch's weights are scored when
    # fit ends, at the step Lightning logs then, with dropout off like every other forward of the callback.
    seed_everything(0)
    callback = GAECallback(num_samples=2, every_n_epochs=2,
                           faithfulness=FaithfulnessOptions(samples=16, every_n_explanations=None))
    trainer = make_trainer(tmp_path, [callback], max_epochs=3, limit_train_batches=2)
    model = ModeRecordingViT()
    trainer.fit(model, DigitsDataModule(batch_size=32))
    acc = read_events(trainer.logger.log_dir)
    pictures = acc.scalar_steps("relevance_concentration/gae")
    final = trainer.fit_loop.epoch_loop._batches_that_stepped
    assert len(pictures) == 1 and pictures[0] < final
    assert [e.step for e in acc.Scalars("positive_perturbation_auc/gae")] == [final]
    assert model.inference_modes and not any(model.inference_modes)


@pytest.mark.slow
def test_explanations_between_training_steps_score_in_eval_mode(tmp_path, make_trainer, read_events):
    # on_train_batch_end sees the module in training mode: the metrics' forwards must not run with dropout.
    seed_everything(0)
    callback = GAECallback(num_samples=2, every_n_epochs=None, every_n_train_steps=3,
                           faithfulness=FaithfulnessOptions(samples=16, every_n_explanations=1))
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=4)
    model = ModeRecordingViT()
    trainer.fit(model, DigitsDataModule(batch_size=32))
    acc = read_events(trainer.logger.log_dir)
    scored = acc.scalar_steps("positive_perturbation_auc/gae")
    # Optimizer steps 3 and 6, and the final weights of step 8 (fit ended between explanation steps).
    assert len(scored) == 3 and scored[-1] == trainer.fit_loop.epoch_loop._batches_that_stepped
    assert model.inference_modes and not any(model.inference_modes)


@pytest.mark.slow
def test_validate_in_inference_mode_scores_with_metrics_on_the_module_device(tmp_path, make_trainer, read_events):
    callback = GAECallback(num_samples=3,
                           faithfulness=FaithfulnessOptions(metrics=("deletion_auc", "insertion_auc", "comprehensiveness")))
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=4, inference_mode=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.validate(small_vit(), DigitsDataModule(batch_size=32))
    assert not [w for w in caught if "was skipped" in str(w.message)]
    logged = read_events(trainer.logger.log_dir).scalar_values()
    for metric in ("deletion_auc", "insertion_auc", "comprehensiveness"):
        assert math.isfinite(logged[f"{metric}/gae"][0]) and f"{metric}/random" in logged
    assert "positive_perturbation_auc/gae" not in logged
    assert all(m.device.type == "cpu" for m in callback.run.state.metric_objects.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "target,with_labels,protocol",
    [("pred", True, "predicted"), ("pred", False, "target"), ("label", True, "target")],
    ids=["prediction checked against labels", "prediction without labels", "label"],
)
def test_perturbation_metrics_follow_the_papers_protocol_for_the_explained_class(tmp_path, target, with_labels, protocol,
                                                                                make_trainer, read_events):
    # Chefer et al. (CVPR 2021, Table 1): explaining the prediction, a perturbed input counts as correct
    # while the model still predicts the label ("predicted": the 0% step is the accuracy); explaining
    # the label (or the prediction, when there are no labels) it counts while the model predicts that class.
    seed_everything(0)
    options = {} if with_labels else {"batches": BatchOptions(labels=lambda batch: None)}
    # FaithfulnessOptions(samples=0): the displayed samples are scored, so the test can rebuild exactly what was scored.
    callback = GAECallback(num_samples=8, target=target, **options,
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",), random_baseline=False, samples=0))
    model = small_vit()
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=4)
    data = DigitsDataModule(batch_size=32)
    trainer.validate(model, data)
    x, labels = data.val_set[callback.sample_indices]
    exp = explain(model, x, target=labels if target == "label" else None)
    modality = ImageTokens(patch_size=2)
    metric = PositivePerturbationAUC(model, modality, protocol=protocol)
    metric.update(x, exp.tokens, labels if with_labels else None)
    logged = read_events(trainer.logger.log_dir).scalar_values()["positive_perturbation_auc/gae"]
    assert logged == [pytest.approx(metric.compute().item(), abs=1e-4)]
    if protocol == "predicted":
        # The untrained model mispredicts some samples, so scoring its prediction as the class differs.
        assert (exp.logits.argmax(dim=1) != labels).any()
        as_target = PositivePerturbationAUC(model, modality, protocol="target")
        as_target.update(x, exp.tokens, exp.target)
        assert logged[0] != pytest.approx(as_target.compute().item(), abs=1e-3)


# --- ground truth in the batch: segmentation masks ------------------------------------------------


class Squares(Dataset):
    """8x8 noise with a 4x4 square in a random quadrant; the label is bright or dim, the mask the square.

    The only evidence of the label is inside the square (a quadrant label could also be read from
    the dark quadrants, so it would not say where a faithful explanation must look).
    """

    def __init__(self, count, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 2, (count,), generator=g)
        quadrants = torch.randint(0, 4, (count,), generator=g)
        self.images = torch.rand(count, 1, 8, 8, generator=g) * 0.3
        self.masks = torch.zeros(count, 8, 8)
        for i, (q, bright) in enumerate(zip(quadrants.tolist(), self.labels.tolist())):
            r, c = 4 * (q // 2), 4 * (q % 2)
            self.images[i, 0, r:r + 4, c:c + 4] += 0.7 if bright else 0.35
            self.masks[i, r:r + 4, c:c + 4] = 1

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"pixel_values": self.images[i], "labels": self.labels[i], "masks": self.masks[i]}


class SquaresViT(ViTClassifier):
    def forward(self, pixel_values):
        return self.model(pixel_values)

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch["pixel_values"]), batch["labels"])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch["pixel_values"]), batch["labels"]))

    def train_dataloader(self):
        return DataLoader(Squares(512, 0), batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(Squares(64, 1), batch_size=32)


@pytest.mark.slow
def test_segmentation_is_scored_when_the_batch_has_masks(tmp_path, make_trainer, read_events):
    seed_everything(0)
    callback = GAECallback(num_samples=8, methods=("gae",), faithfulness=FaithfulnessOptions(metrics=(), samples=0))
    trainer = make_trainer(tmp_path, [callback], max_epochs=3, limit_train_batches=16)
    model = SquaresViT(num_classes=4, dim=32, depth=2, heads=2, dropout=0.0, lr=3e-3)
    trainer.fit(model)
    logged = read_events(trainer.logger.log_dir).scalar_values()
    for method in ("gae", "random"):
        for key in ("pixel_accuracy", "miou", "mean_ap"):
            values = logged[f"segmentation_{key}/{method}"]
            assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)
    # Each tracked sample's map is scored against its own mask: the last step's scalars are those of
    # the trained model's explanations of exactly these samples. No margin over random is asserted:
    # measured over seeds 0-2, after the first epoch (accuracy near chance) GAE segments the bright
    # square (mIoU 0.80-0.91, random 0.385), but once trained (accuracy 1.0) GAE credits the
    # background for the bright class (so does the dense float64 GAE of tests/oracle.py) and the last
    # step's mean AP is 0.50-0.65 against random's 0.594, its mIoU and pixel accuracy below random's.
    data = Squares(64, 1)
    index = torch.tensor(callback.sample_indices)
    images, masks = data.images[index], data.masks[index]
    tokens = explain(model, images, method="gae").tokens
    expected = {"gae": tokens, "random": random_attribution(tokens, callback.batches.seed)}
    for method, relevance in expected.items():
        direct = relevance_segmentation(ImageTokens(patch_size=2).to_input(relevance, images), masks)
        for key, value in direct.items():
            assert logged[f"segmentation_{key}/{method}"][-1] == pytest.approx(value.item(), abs=1e-5), (method, key)
    # Against other samples' masks the same maps score differently: the pairing is what was checked.
    shifted = relevance_segmentation(ImageTokens(patch_size=2).to_input(tokens, images), masks.roll(1, dims=0))
    assert shifted["mean_ap"].item() != pytest.approx(logged["segmentation_mean_ap/gae"][-1], abs=1e-3)


# --- ground truth in the batch: rationales ---------------------------------------------------------


class Marked(Dataset):
    """Token sequences; the label says whether token 7 occurs, the rationale marks where."""

    def __init__(self, count, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(10, 30, (count, 10), generator=g)
        self.ids[:, 0], self.ids[:, -1] = 1, 2
        self.labels = torch.randint(0, 2, (count,), generator=g)
        for i in range(count):
            if self.labels[i]:
                self.ids[i, int(torch.randint(1, 9, (1,), generator=g))] = 7
        lengths = torch.randint(7, 11, (count,), generator=g)
        self.mask = (torch.arange(10)[None] < lengths[:, None]).long()
        self.ids[:, -1] = 2
        self.ids = torch.where(self.mask.bool(), self.ids, torch.zeros_like(self.ids))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i],
                "rationales": (self.ids[i] == 7).long()}


class TextClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        import transformers

        config = transformers.BertConfig(vocab_size=30, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=16, num_labels=2)
        self.bert = transformers.BertForSequenceClassification(config)

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).logits

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch["input_ids"], batch["attention_mask"]), batch["labels"]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)

    def train_dataloader(self):
        return DataLoader(Marked(256, 0), batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(Marked(64, 1), batch_size=32)


@pytest.mark.slow
def test_rationale_agreement_is_scored_when_the_batch_has_rationales(tmp_path, make_trainer, read_events):
    pytest.importorskip("transformers")
    seed_everything(0)
    modality = TextTokens(vocab=[f"w{i}" for i in range(30)], special_ids=[1, 2], pad_id=0, mask_id=3)
    callback = GAECallback(num_samples=8, modality=modality,
                           faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",)))
    trainer = make_trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=8)
    trainer.fit(TextClassifier())
    logged = read_events(trainer.logger.log_dir).scalar_values()
    for method in ("gae", "random"):
        assert all(0.0 <= v <= 1.0 for v in logged[f"rationale_token_f1/{method}"])
        assert all(0.0 <= v <= 1.0 for v in logged[f"rationale_auprc/{method}"])
        assert 0.0 <= logged[f"positive_perturbation_auc/{method}"][-1] <= 90.0


@pytest.mark.slow
def test_captum_baselines_share_the_grid_and_the_metric_tags(tmp_path, make_trainer, read_events):
    callback = GAECallback(num_samples=2, captum_baselines=("saliency", "integrated_gradients"))
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=4, inference_mode=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.validate(small_vit(), DigitsDataModule(batch_size=32))
    assert not [w for w in caught if "was skipped" in str(w.message)]
    acc = read_events(trainer.logger.log_dir)
    sample = callback.sample_indices[0]
    assert f"gae_heatmaps/val_{sample}" in acc.Tags()["images"]
    for method in ("saliency", "integrated_gradients"):
        assert f"positive_perturbation_auc/{method}" in acc.Tags()["scalars"]
    # One picture per sample, one panel per method, input first; gae + 2 baselines = 4 panels of equal width.
    only_gae = GAECallback(num_samples=2, batches=BatchOptions(sample_indices=callback.sample_indices))
    plain = make_trainer(tmp_path / "plain", [only_gae], limit_train_batches=4, inference_mode=True)
    plain.validate(small_vit(), DigitsDataModule(batch_size=32))
    plain_acc = read_events(plain.logger.log_dir)
    tag = f"gae_heatmaps/val_{sample}"
    assert acc.Images(tag)[0].width > plain_acc.Images(tag)[0].width * 1.5


@pytest.mark.slow
def test_faithfulness_is_scored_on_its_own_subset_in_batches_with_standard_errors(tmp_path, make_trainer,
                                                                                 read_events):
    # 16 samples read and all 16 scored, in batches of 5 (uneven), separately from the 2 shown.
    seed_everything(0)
    callback = GAECallback(num_samples=2,
                           faithfulness=FaithfulnessOptions(samples=16, max_batch=5, metrics=("positive_perturbation_auc",), random_baseline=False),
                           batches=BatchOptions(max_scan_batches=1))
    data = DigitsDataModule(batch_size=16)
    model = small_vit()
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=2)
    trainer.fit(model, data)
    logged = read_events(trainer.logger.log_dir).scalar_values()
    value, stderr = logged["positive_perturbation_auc/gae"][-1], logged["positive_perturbation_auc/gae/stderr"][-1]

    from lightning_gae.compare import infer_modality
    x, y = next(iter(data.val_dataloader()))
    model.eval()
    modality = infer_modality(model, x)
    tokens = explain(model, x, method="gae").tokens
    per_sample, curves = [], []
    for i in range(16):
        metric = PositivePerturbationAUC(model, modality, protocol="predicted")
        metric.update(x[i:i + 1], tokens[i:i + 1], y[i:i + 1])
        per_sample.append(metric.compute().double().item())
        curves.append(metric.curve().double())
    per_sample = torch.tensor(per_sample, dtype=torch.float64)
    # AUC is linear in the curve: the mean of per-sample AUCs is the AUC of the mean curve.
    mean_curve = torch.stack(curves).mean(dim=0)
    fractions = torch.tensor(metric.fractions, dtype=torch.float64)
    auc_of_mean = 100 * float(((mean_curve[1:] + mean_curve[:-1]) / 2 * fractions.diff()).sum())
    assert per_sample.mean().item() == pytest.approx(auc_of_mean, abs=1e-9)
    assert value == pytest.approx(auc_of_mean, abs=1e-4)
    assert stderr == pytest.approx((per_sample.std(unbiased=True) / math.sqrt(16)).item(), abs=1e-4)
    assert stderr > 0
