"""What GAECallback prints when a fit ends: the run's metrics, each method's faithfulness ± standard error, where the
event files are; the numbers are the ones logged (read back with TensorBoard's reader)."""

from __future__ import annotations

from pathlib import Path

import torch

import pytest
from lightning.pytorch import seed_everything

from torch.utils.data import DataLoader

from lightning_gae import TextTokens
from lightning_gae.callbacks import FaithfulnessOptions, GAECallback
from lightning_gae.tensorboard.ranks import at_chance, rank_labels, tie_note
from recipes.digits import DigitsDataModule
from tests.helpers.hf_modules import Batches, TextByName, ids_and_mask, tiny_bert
from tests.helpers.models import small_vit
from tests.helpers.report import HEADER, assert_printed_as_logged, section, value_and_error


@pytest.mark.slow
def test_fit_prints_the_metrics_and_faithfulness_it_logged_and_where(tmp_path, make_trainer, read_events, capsys):
    seed_everything(0)
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"), faithfulness=FaithfulnessOptions(samples=32))
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=3)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    out = capsys.readouterr().out
    assert out.count(HEADER) == 1 and out.rstrip().endswith(f"tensorboard --logdir {tmp_path}")
    assert f"event files: {trainer.logger.log_dir}\n" in out
    assert callback.summary is not None and callback.summary in out
    logged = {tag: values[-1] for tag, values in read_events(trainer.logger.log_dir).scalar_values().items()}

    header, *rows = section(out, "metrics (trainer.callback_metrics)")
    assert header == ["name", "value"]
    metrics = dict(rows)
    assert set(metrics) == set(trainer.callback_metrics) == {"train_loss", "val_acc", "val_loss"}
    for name in ("val_acc", "val_loss"):
        assert_printed_as_logged(metrics[name], logged[name], 4)
    assert_printed_as_logged(metrics["train_loss"], float(trainer.callback_metrics["train_loss"]), 4)

    assert "faithfulness (32 validation samples, the final weights at step 5;" in out
    header, *rows = section(out, "faithfulness (")
    assert header == ["method", "negative_perturbation_auc ↑", "positive_perturbation_auc ↓"]
    assert [row[0] for row in rows] == ["gae", "rollout", "random"]
    for method, *cells in rows:
        for metric, cell in zip(("negative_perturbation_auc", "positive_perturbation_auc"), cells):
            value, error = value_and_error(cell)
            assert_printed_as_logged(str(value), logged[f"{metric}/{method}"], 4)
            assert_printed_as_logged(str(error), logged[f"{metric}/{method}/stderr"], 2)
            # Its rank, shared ("#k=") with the methods the standard errors do not tell it from.
            assert cell.endswith(" " + rank_labels(logged)[metric][method])


@pytest.mark.slow
def test_the_summary_says_why_nothing_was_scored_or_written(tmp_path, make_trainer, capsys):
    seed_everything(0)
    trainer = make_trainer(tmp_path, [GAECallback(num_samples=2)], fast_dev_run=True)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    out = capsys.readouterr().out
    assert out.count(HEADER) == 1
    assert "faithfulness: not scored (fast_dev_run replaces the loggers with no-op ones" in out
    assert "event files: none (fast_dev_run writes no logs)" in out and "tensorboard --logdir" not in out

    trainer = make_trainer(tmp_path, [GAECallback(num_samples=2, faithfulness=FaithfulnessOptions(metrics=()))], max_epochs=1)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    out = capsys.readouterr().out
    assert "faithfulness: not scored (FaithfulnessOptions(metrics=()) and the validation batches carry no ground truth)" in out
    assert f"event files: {trainer.logger.log_dir}\n" in out


@pytest.mark.slow
def test_print_summary_false_prints_nothing_and_keeps_the_text(tmp_path, make_trainer, capsys):
    seed_everything(0)
    callback = GAECallback(num_samples=2, print_summary=False, faithfulness=FaithfulnessOptions(samples=8))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    assert HEADER not in capsys.readouterr().out
    assert callback.summary.strip().startswith(HEADER) and "faithfulness (8 validation samples" in callback.summary


@pytest.mark.slow
def test_scores_of_the_last_explanation_step_are_the_ones_printed(tmp_path, make_trainer, read_events, capsys):
    """metric_samples=0 scores the tracked samples at every explanation step: the summary shows the last step's."""
    seed_everything(0)
    callback = GAECallback(num_samples=3, methods=("gae",),
                           faithfulness=FaithfulnessOptions(samples=0, metrics=("deletion_auc",)))
    trainer = make_trainer(tmp_path, [callback])
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    out = capsys.readouterr().out
    events = read_events(trainer.logger.log_dir).scalar_events("deletion_auc/")
    last_step, last = events["deletion_auc/gae"][-1]
    assert len(events["deletion_auc/gae"]) == 2
    assert f"faithfulness (the 3 tracked validation samples at step {last_step};" in out
    rows = dict((row[0], row[1]) for row in section(out, "faithfulness (")[1:])
    assert_printed_as_logged(str(value_and_error(rows["gae"])[0]), last, 4)


@pytest.mark.slow
def test_validate_after_fit_prints_the_whole_subset_it_scored_where_fit_printed_its_part(tmp_path, make_trainer,
                                                                                       read_events, capsys):
    seed_everything(0)
    callback = GAECallback(num_samples=2, methods=("gae",),
                           faithfulness=FaithfulnessOptions(samples=40, interim_samples=8))
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=3)
    model, data = small_vit(), DigitsDataModule(batch_size=32)
    trainer.fit(model, data)
    out = capsys.readouterr().out
    assert "faithfulness (8 validation samples, the final weights at step" in out
    # No checkpoint and no saved config here: the hint is the Python call.
    assert "these are 8 of the 40 samples of the faithfulness subset" in out and "trainer.validate(trainer.lightning_module, datamodule=trainer.datamodule)" in out
    trainer.validate(model, data)
    out = capsys.readouterr().out
    assert out.count("GAECallback: the validation ended") == 1 and "these are" not in out
    assert "faithfulness (40 validation samples at step" in out
    # The validation's own event file: the newest (file names do not sort by creation).
    newest = max(Path(trainer.logger.log_dir).glob("events.out.tfevents.*"), key=lambda f: f.stat().st_mtime_ns)
    logged = {tag: values[-1] for tag, values in read_events(newest).scalar_values().items()}
    assert logged["faithfulness_samples"] == 40.0
    header, *rows = section(out, "faithfulness (")
    printed = {row[0]: dict(zip(header[1:], row[1:])) for row in rows}
    assert set(printed) == {"gae", "random"}
    for method, cells in printed.items():
        for name, cell in cells.items():
            value, error = value_and_error(cell)
            metric = name.rstrip(" ↑↓")
            assert_printed_as_logged(str(value), logged[f"{metric}/{method}"], 4)
            assert_printed_as_logged(str(error), logged[f"{metric}/{method}/stderr"], 2)


@pytest.mark.slow
def test_a_fit_on_loaders_is_told_to_validate_on_loaders_and_the_hint_works_when_followed(tmp_path, make_trainer, capsys):
    seed_everything(0)
    callback = GAECallback(num_samples=2, methods=("gae",),
                           faithfulness=FaithfulnessOptions(samples=40, interim_samples=8))
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=3)
    data = DigitsDataModule(batch_size=32)
    data.setup()
    model, val_dataloader = small_vit(), data.val_dataloader()
    trainer.fit(model, train_dataloaders=data.train_dataloader(), val_dataloaders=val_dataloader)
    out = capsys.readouterr().out
    hint = [line.strip() for line in out.splitlines() if line.strip().startswith("trainer.validate(")]
    # Only `trainer` is named (the README's example has no `model` or `val_dataloader` variable).
    assert hint == ["trainer.validate(trainer.lightning_module, dataloaders=trainer.val_dataloaders)"]
    eval(hint[0], {"trainer": trainer})  # as printed
    assert "faithfulness (40 validation samples at step" in capsys.readouterr().out


def test_a_model_that_predicts_one_class_says_why_every_method_ties(tmp_path, make_trainer, read_events, capsys):
    # A Hugging Face BERT whose classifier's bias always picks class 0: removing tokens in any order leaves every
    # prediction as it was, so every method, random included, scores the accuracy of class 0 with the same error.
    seed_everything(0)
    model = TextByName(tiny_bert())
    with torch.no_grad():
        model.model.classifier.bias.copy_(torch.tensor([1e3, -1e3]))

    def sample(i):
        ids, mask = ids_and_mask(i)
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(int(i % 3 == 0))}

    callback = GAECallback(num_samples=2, methods=("gae", "rollout"), modality=TextTokens(special_ids=[2], pad_id=0),
                           faithfulness=FaithfulnessOptions(samples=24, interim_samples=0))
    trainer = make_trainer(tmp_path, [callback], max_epochs=1, limit_train_batches=1, limit_val_batches=None)
    trainer.fit(model, train_dataloaders=DataLoader(Batches(sample, n=8), batch_size=8),
                val_dataloaders=DataLoader(Batches(sample, n=24), batch_size=8))
    out = capsys.readouterr().out
    assert "#k= where the errors over 24 samples do not tell methods apart" in out
    header, *rows = section(out, "faithfulness (")
    assert {cell.rsplit(" ", 1)[1] for _, *cells in rows for cell in cells} == {"#1="}
    (ties,) = [line for line in out.splitlines() if line.startswith("ties: ")]
    assert "every method, random included, scores the same on negative_perturbation_auc (" in ties
    assert "over 24 samples)" in ties and "the model predicts one class for all 24 of these samples" in ties
    # The Text tab's table says the same.
    events = read_events(trainer.logger.log_dir)
    tables = [e.tensor_proto.string_val[0].decode() for e in events.Tensors("gae_faithfulness")]
    assert tables and all("ties: every method, random included, scores the same" in t for t in tables)


def test_ties_that_the_errors_make_name_the_samples_and_what_to_do():
    scalars = {"positive_perturbation_auc/gae": 40.0, "positive_perturbation_auc/gae/stderr": 8.0,
               "positive_perturbation_auc/random": 48.0, "positive_perturbation_auc/random/stderr": 8.0,
               "faithfulness_samples": 32.0}
    note = tie_note(scalars)
    assert note is not None
    assert "no method is told apart from another, random included, on positive_perturbation_auc" in note
    assert "over 32 samples" in note and "FaithfulnessOptions(samples=" in note and "at chance" in note
    # Told apart: nothing to explain.
    assert tie_note({**scalars, "positive_perturbation_auc/gae/stderr": 0.5,
                     "positive_perturbation_auc/random/stderr": 0.5}) is None
    # Equal values whose curves still move are not a model that ignores the removal: a tie of the errors.
    curves = {"positive_perturbation_auc": {m: ([0.0, 0.5], torch.tensor([1.0, 0.4])) for m in ("gae", "random")}}
    same = {**scalars, "positive_perturbation_auc/gae": 48.0}
    assert tie_note(same, curves).startswith("no method is told apart")
    flat = {"positive_perturbation_auc": {m: ([0.0, 0.5], torch.tensor([0.45, 0.45])) for m in ("gae", "random")}}
    assert tie_note(same, flat).startswith("every method, random included, scores the same")


@pytest.mark.slow
@pytest.mark.parametrize("batches,epochs,at_chance", [(40, 3, True), (45, 8, False)])
def test_the_tie_note_says_when_the_model_is_at_chance_with_its_accuracy(tmp_path, make_trainer, read_events, capsys,
                                                                        batches, epochs, at_chance):
    # The digits ViT barely trained (its predictions vary, its accuracy is a chance's 0.1 of 10 classes) and trained
    # (well above it): the methods tie on 32 samples either way, and only the first is said to be at chance.
    seed_everything(0)
    callback = GAECallback(num_samples=2, methods=("gae", "rollout"),
                           faithfulness=FaithfulnessOptions(samples=32, interim_samples=0))
    trainer = make_trainer(tmp_path, [callback], limit_train_batches=batches, max_epochs=epochs, limit_val_batches=None)
    trainer.fit(small_vit(lr=1e-2 if not at_chance else 3e-3), DigitsDataModule(batch_size=32))
    out = capsys.readouterr().out
    logged = {tag: values[-1] for tag, values in read_events(trainer.logger.log_dir).scalar_values().items()}
    accuracy = logged["faithfulness_accuracy"]
    assert logged["faithfulness_classes"] == 10 and logged["faithfulness_predicted_classes"] > 1
    (ties,) = [line for line in out.splitlines() if line.startswith("ties: ")]
    assert ties.startswith("ties: no method is told apart from another")
    if at_chance:
        assert accuracy < 0.1 + 2 * (0.1 * 0.9 / 32) ** 0.5
        assert (f"the model is at chance: the model's accuracy on these 32 samples is {accuracy:.2f} (chance with 10 "
                "classes: 0.10; not above it by 2 standard errors of 0.053)") in ties
    else:
        assert accuracy > 0.3
        assert "at chance" not in ties.replace("is not at chance", "")
        assert "the standard errors over 32 samples are wider than the differences" in ties
        assert f"(the model is not at chance: its accuracy is {accuracy:.2f})" in ties


def test_at_chance_needs_the_evidence_and_names_it():
    base = {"faithfulness_samples": 32.0, "faithfulness_classes": 2.0, "faithfulness_predicted_classes": 2.0}
    assert at_chance({**base, "faithfulness_accuracy": 0.5}).startswith(
        "the model's accuracy on these 32 samples is 0.50 (chance with 2 classes: 0.50")
    # 0.5 + 2 x 0.088 = 0.677: above it is no longer chance.
    assert at_chance({**base, "faithfulness_accuracy": 0.65}) is not None
    assert at_chance({**base, "faithfulness_accuracy": 0.70}) is None
    # One class predicted throughout: at chance whatever the labels say, and without labels.
    assert at_chance({**base, "faithfulness_predicted_classes": 1.0}) == (
        "the model predicts one class for all 32 of these samples")
    # Nothing known: nothing said.
    assert at_chance({"faithfulness_samples": 32.0}) is None
    assert at_chance({**base}) is None
