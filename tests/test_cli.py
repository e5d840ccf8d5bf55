"""The ``lightning-gae`` command: every config through fit, validate and test; the configs' own modules imported
from the working directory; ``lightning-gae compare`` on checkpoints of the main job's config and of the recipes
with several token sets, fit briefly here."""

import json
import math
import re
import os
from pathlib import Path

import matplotlib.image
import pytest
import yaml

from lightning_gae.cli import COMPARE_METRICS, main
from lightning_gae.compare import DEFAULT_METHODS
from tests.helpers.processes import ROOT
from tests.helpers.report import HEADER, assert_printed_as_logged, section, value_and_error

CONFIG = ROOT / "configs" / "vit_digits.yaml"
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# Generated data sets cut down, so that a fast_dev_run does not spend its time generating them.
SMALL_DATA = ["--data.init_args.num_train=128", "--data.init_args.num_val=64"]
SMALL = {"text_rationales", "text_rationales_bert", "tabular", "vit_shapes", "hf_vit", "seq2seq", "dual_encoder",
         "coattention", "causal_lm_recall"}


# --- every config, every subcommand ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("subcommand", ["fit", "validate", "test"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.stem)
def test_every_config_runs_every_subcommand_through_the_cli(config, subcommand, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main([subcommand, "--config", str(config), "--trainer.fast_dev_run=true",
          *(SMALL_DATA if config.stem in SMALL else [])])
    out = capsys.readouterr().out
    # The config's GAECallback printed its summary once, with the module's own logged values of this run.
    ended = {"fit": "the fit ended", "validate": "the validation ended", "test": "the test ended"}[subcommand]
    assert out.count(f"GAECallback: {ended}") == 1 and out.count("GAECallback: the ") == 1, out[-3000:]
    names = [row[0] for row in section(out, "metrics (trainer.callback_metrics)")[1:]]
    expected = {"fit": {"train_loss", "val_loss"}, "validate": {"val_loss"}, "test": {"test_loss"}}[subcommand]
    assert expected <= set(names), names
    if subcommand != "fit":
        stage = "val" if subcommand == "validate" else "test"
        assert all(name.startswith(f"{stage}_") for name in names), names
        assert f"{'Validate' if subcommand == 'validate' else 'Test'} metric" in out, "Lightning's results table"
    # fast_dev_run: one batch, nothing explained, nothing written (no logs, checkpoints or saved config).
    assert "faithfulness: not scored (fast_dev_run replaces the loggers with no-op ones" in out
    assert "event files: none (fast_dev_run writes no logs)" in out
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow
def test_cli_imports_the_configs_modules_from_the_working_directory(tmp_path, run_python):
    """A console script (unlike ``python -m``) does not put the working directory on sys.path: the CLI must."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_data.py").write_text(
        "import pathlib\n"
        "from lightning.pytorch.demos.boring_classes import BoringDataModule\n"
        "class TinyData(BoringDataModule):\n"
        "    def setup(self, stage):\n"
        "        super().setup(stage)\n"
        "        pathlib.Path('setup.txt').write_text(__file__)\n"
    )
    (project / "config.yaml").write_text(
        "trainer: {fast_dev_run: true, logger: false, enable_progress_bar: false, enable_model_summary: false}\n"
        "model: {class_path: lightning.pytorch.demos.boring_classes.BoringModel}\n"
        "data: {class_path: my_data.TinyData}\n"
    )
    # Like the installed `lightning-gae` script: a file elsewhere that calls main(), run from the project.
    launcher = tmp_path / "bin" / "lightning-gae"
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom lightning_gae.cli import main\nmain()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_python([launcher, "validate", "--config", "config.yaml"], cwd=project, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # The data module of the working directory's my_data.py ran its validation set-up, and the one validation batch ran.
    assert (project / "setup.txt").read_text() == str(project / "my_data.py")
    assert "Running in `fast_dev_run` mode: will run the requested loop using 1 batch(es)" in done.stdout + done.stderr
    assert {p.name for p in project.iterdir()} - {"__pycache__"} == {"config.yaml", "my_data.py", "setup.txt"}


@pytest.mark.slow
def test_the_main_job_ends_with_its_summary_under_the_progress_bar(tmp_path, run_python, read_events):
    """What a user sees: the fit through the command line, the summary last, its numbers the logged ones."""
    runs = tmp_path / "runs"
    done = run_python(["-m", "lightning_gae.cli", "fit", "--config", CONFIG, "--trainer.max_epochs=3",
                       "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
                       "--trainer.callbacks.init_args.faithfulness.samples=32", f"--trainer.logger.init_args.save_dir={runs}"],
                      cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert out.count(HEADER) == 1 and out.count("tensorboard --logdir") == 1
    assert out.rstrip().endswith(f"tensorboard --logdir {runs}")
    # Lightning's bar is on (rich draws it on stdout, tqdm on stderr): it ends before the summary starts.
    bar = out.rfind("Epoch 2/2") if "Epoch 2/2" in out else None
    assert bar is None or bar < out.index(HEADER)
    assert bar is not None or "Epoch 2" in done.stderr
    (log_dir,) = runs.glob("vit_digits/version_*")
    assert f"event files: {log_dir}\n" in out
    # No warning is shown twice (the capture once made Python repeat them).
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert not {line for line in lines if lines.count(line) > 1}, done.stderr[-3000:]

    logged = {tag: values[-1] for tag, values in read_events(log_dir).scalar_values().items()}
    metrics = dict(section(out, "metrics (trainer.callback_metrics)")[1:])
    assert {"val_acc", "val_loss"} <= set(metrics)
    for name in ("val_acc", "val_loss"):
        assert_printed_as_logged(metrics[name], logged[name], 4)
    header, *rows = section(out, "faithfulness (32 validation samples, the final weights at step ")
    assert [row[0] for row in rows] == ["gae", "rollout", "raw_attention", "random"]
    for method, *cells in rows:
        for metric, cell in zip((h.split()[0] for h in header[1:]), cells):
            value, error = value_and_error(cell)
            assert_printed_as_logged(str(value), logged[f"{metric}/{method}"], 4)
            assert_printed_as_logged(str(error), logged[f"{metric}/{method}/stderr"], 2)


@pytest.mark.slow
def test_the_validate_command_the_fit_prints_scores_into_the_fits_run_at_its_last_step(tmp_path, run_python,
                                                                                      read_events):
    """The end-of-fit summary's ``lightning-gae validate`` line, run as printed: its whole-subset numbers join the
    fit's curves (the fit's own version folder, the fit's last step), and the fit's saved config stays as it was."""
    fit = run_python(["-m", "lightning_gae.cli", "fit", "--config", CONFIG, "--trainer.max_epochs=2",
                      "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
                      "--trainer.callbacks.init_args.faithfulness.samples=40",
                      "--trainer.callbacks.init_args.faithfulness.interim_samples=8"], cwd=tmp_path, timeout=600)
    assert fit.returncode == 0, fit.stderr[-3000:]
    (command,) = [line.split() for line in fit.stdout.splitlines() if line.strip().startswith("lightning-gae validate")]
    assert command[:3] == ["lightning-gae", "validate", "--config"], command
    (log_dir,) = (tmp_path / "runs" / "vit_digits").iterdir()
    config = (log_dir / "config.yaml").read_text()
    fit_events = read_events(log_dir)
    ((last, part),) = fit_events.scalar_events("faithfulness_samples")["faithfulness_samples"]
    val_steps = fit_events.scalar_steps("val_loss")
    assert part == 8.0 and last > val_steps[-1]

    done = run_python(["-m", "lightning_gae.cli", *command[1:]], cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dirpath has changed" not in done.stderr, done.stderr[-3000:]
    assert f"faithfulness (40 validation samples at step {last};" in done.stdout
    assert [p.name for p in (tmp_path / "runs" / "vit_digits").iterdir()] == [log_dir.name]
    assert (log_dir / "config.yaml").read_text() == config
    events = read_events(log_dir)
    assert events.scalar_events("faithfulness_samples")["faithfulness_samples"] == [(last, 8.0), (last, 40.0)]
    # Lightning's own validation metrics land at the same step: nothing at step 0 hides the fit's curves.
    assert events.scalar_steps("val_loss") == [*val_steps, last]
    assert len(events.scalar_steps("positive_perturbation_auc/gae")) == 2


@pytest.mark.slow
def test_compare_and_validate_take_a_plain_trainers_checkpoint_without_a_yaml(tmp_path, monkeypatch, capsys):
    """A project trained by a plain ``Trainer.fit`` script: the classes by import path, the rest from the checkpoint."""
    from lightning.pytorch import Trainer, seed_everything

    from recipes.digits import DigitsDataModule
    from tests.helpers.models import small_vit

    monkeypatch.chdir(tmp_path)
    seed_everything(0)
    trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1, accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    ckpt = trainer.checkpoint_callback.best_model_path
    classes = ["--model", "recipes.vit.ViTClassifier", "--data", "recipes.digits.DigitsDataModule", "--ckpt_path", ckpt]
    main(["compare", *classes, "--output", "out", "--num_samples", "16", "--methods", "gae", "rollout",
          "--metrics", "positive_perturbation_auc"])
    result = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert result["num_samples"] == 16 and "recipes.vit.ViTClassifier" in (tmp_path / "out" / "comparison.md").read_text()
    capsys.readouterr()
    # validate: the module's saved hyper-parameters (dim=32, depth=2) build it, as Lightning cannot for such a checkpoint.
    main(["validate", *classes, "--trainer.callbacks+=lightning_gae.callbacks.GAECallback",
          "--trainer.callbacks.faithfulness.samples=16", "--trainer.limit_val_batches=1",
          "--trainer.enable_progress_bar=false"])
    out = capsys.readouterr().out
    assert "faithfulness (16 validation samples at step 3;" in out, out[-2000:]
    with pytest.raises(SystemExit):
        main(["compare", "--model", "recipes.vit.NoSuchModel", "--ckpt_path", ckpt, "--output", "out"])
    with pytest.raises(SystemExit):
        main(["compare", "--config", str(CONFIG), *classes, "--output", "out"])


# --- compare on the main job's checkpoint -----------------------------------------------------------------
# Slow: the checkpoint is a fit through LightningCLI (most of the time of the fast part otherwise).


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    main(["fit", "--config", str(CONFIG), "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
          "--trainer.limit_val_batches=1", f"--trainer.logger.init_args.save_dir={root / 'runs'}",
          f"--trainer.default_root_dir={root}"])
    (path,) = root.glob("runs/vit_digits/version_*/checkpoints/*.ckpt")
    return path


@pytest.mark.slow
def test_compare_writes_table_json_and_grid(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["compare", "--config", str(CONFIG), "--ckpt_path", str(checkpoint), "--output", "out", "--num_samples", "16"])

    assert os.listdir(tmp_path) == ["out"], "building the fit's objects leaves no logs or checkpoints behind"
    report = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert set(report) == {"methods", "num_samples", "protocol", "stderr"} and report["num_samples"] == 16
    assert list(report["methods"]) == list(DEFAULT_METHODS) and report["protocol"] == "predicted"
    for method, scores in report["methods"].items():
        assert set(scores) == {*COMPARE_METRICS, "seconds_per_sample"}
        assert 0.0 <= scores["positive_perturbation_auc"] <= 90.0 and scores["seconds_per_sample"] > 0
        assert set(report["stderr"][method]) == set(COMPARE_METRICS)

    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "16 validation samples" in table and "equals its label (protocol `predicted`)" in table
    assert " ± " in table
    assert all(f"\n| {method} |" in table for method in DEFAULT_METHODS)
    assert table.split("\n\n", 1)[1] in capsys.readouterr().out, "the table is printed too"

    picture = matplotlib.image.imread(tmp_path / "out" / "comparison.png")
    assert picture.ndim == 3 and picture.shape[2] in (3, 4)
    # 4 samples x (input + 8 methods), each digit drawn at least 128 pixels wide.
    assert picture.shape[0] >= 4 * 128 and picture.shape[1] >= (1 + len(DEFAULT_METHODS)) * 128


@pytest.mark.slow
def test_compare_takes_chosen_methods_and_metrics(checkpoint, tmp_path, capsys):
    main(["compare", "--config", str(CONFIG), "--ckpt_path", str(checkpoint), "--output", str(tmp_path),
          "--num_samples", "5", "--batch_size", "2", "--methods", "gae", "random", "--metrics", "deletion_auc"])
    report = json.loads((tmp_path / "comparison.json").read_text())
    assert report["num_samples"] == 5
    assert {m: set(s) for m, s in report["methods"].items()} == {
        "gae": {"deletion_auc", "seconds_per_sample"}, "random": {"deletion_auc", "seconds_per_sample"}}
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main(["compare", "--config", str(CONFIG), "--ckpt_path", str(checkpoint), "--output", str(tmp_path / "lime"),
              "--methods", "lime"])
    assert refused.value.code == 2 and "invalid choice: 'lime'" in capsys.readouterr().err
    assert not (tmp_path / "lime").exists()


@pytest.mark.slow
def test_compare_uses_the_modality_of_the_configs_callback(checkpoint, tmp_path):
    config = yaml.safe_load(CONFIG.read_text())
    (callback,) = config["trainer"]["callbacks"]
    # A patching that does not fit the 17 tokens: only a modality actually used can fail this way.
    callback["init_args"]["modality"] = {"class_path": "lightning_gae.modalities.ImageTokens",
                                         "init_args": {"patch_size": 4}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="patch_size=4"):
        main(["compare", "--config", str(path), "--ckpt_path", str(checkpoint), "--output", str(tmp_path / "out"),
              "--num_samples", "2", "--methods", "gae", "--metrics", "deletion_auc"])
    assert not list(tmp_path.glob("out/comparison.*")), "no comparison is written for a modality that does not fit"


@pytest.mark.slow
def test_compare_scores_the_protocol_asked_for_against_the_labels(checkpoint, tmp_path):
    runs = {}
    for protocol in ("predicted", "target"):
        main(["compare", "--config", str(CONFIG), "--ckpt_path", str(checkpoint), "--output", str(tmp_path / protocol),
              "--num_samples", "12", "--methods", "gae", "--metrics", "positive_perturbation_auc", "--protocol", protocol])
        runs[protocol] = json.loads((tmp_path / protocol / "comparison.json").read_text())
        assert runs[protocol]["protocol"] == protocol
    assert "explained for its label" in (tmp_path / "target" / "comparison.md").read_text()
    # A briefly trained model is often wrong: explaining the label is then another explanation than the prediction's.
    assert runs["predicted"]["methods"] != runs["target"]["methods"]


# --- compare on the recipes with several token sets -------------------------------------------------------


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
    "causal_lm_recall": {"hidden_size": 32, "intermediate_size": 64},
    "seq2seq": {"d_model": 32, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 1, "dim_feedforward": 32},
    "dual_encoder": {"hidden_size": 32, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "projection_dim": 16},
}


def _fit(config, root):
    main(["fit", "--config", str(config), "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
          "--trainer.limit_val_batches=1", f"--trainer.logger.init_args.save_dir={root / 'runs'}",
          f"--trainer.default_root_dir={root}"])
    (path,) = root.glob("runs/*/version_*/checkpoints/*.ckpt")
    return path


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_cli_compares_a_causal_lms_answer_tokens(tmp_path, monkeypatch):
    import torch

    from lightning_gae.language.answers import explain_answers
    from recipes.causal_lm_recall import SPECIALS, RecallDataModule, RecallLM

    monkeypatch.chdir(tmp_path)
    small = _small_config("causal_lm_recall", tmp_path)
    checkpoint = _fit(small, tmp_path)
    main(["compare", "--config", str(small), "--ckpt_path", str(checkpoint), "--output", "out", "--num_samples", "6",
          "--methods", "gae", "random", "input_x_gradient"])
    report = json.loads((tmp_path / "out" / "comparison.json").read_text())
    # One scored sample per answer token of the first 6 validation prompts.
    data = RecallDataModule(num_train=64, num_val=32)
    data.setup("validate")
    batch = {k: torch.stack([data.val_set[i][k] for i in range(6)]) for k in ("input_ids", "attention_mask", "labels",
                                                                            "rationales")}
    assert report["num_samples"] == int((batch["labels"][:, 1:] != -100).sum())
    for method in ("gae", "random", "input_x_gradient"):
        assert {"recall_top1", "recall_hit_at_k", "recall_mass", "rationale_token_f1", "positive_perturbation_auc",
                "negative_perturbation_auc"} <= set(report["methods"][method])
    # GAE's recall@1 from the checkpoint's explanations, one answer token at a time, read before the readout token.
    model = RecallLM(**{k: v for k, v in yaml.safe_load(small.read_text())["model"]["init_args"].items()})
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"])
    model.eval()
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    out = explain_answers(model, inputs, batch["labels"], method="gae", target="pred")
    hits = []
    for b in range(6):
        for j in range(int(out.valid[b].sum())):
            readout = int(out.positions[b, j])
            keep = [t for t in range(readout) if int(batch["input_ids"][b, t]) >= len(SPECIALS)]
            best = max(keep, key=lambda t: float(out.relevance[b, j, t]))
            hits.append(float(batch["rationales"][b, best] == 1))
    assert report["methods"]["gae"]["recall_top1"] == pytest.approx(sum(hits) / len(hits), abs=1e-6)


@pytest.mark.slow
def test_the_cli_compares_the_shortcut_recipes_region(tmp_path, monkeypatch, capsys):
    # The datamodule declares its spurious word (`region`); the config's callback declares none: --regions auto takes
    # the datamodule's, and the table, its JSON and the markdown file get a share and a recall column per region.
    monkeypatch.chdir(tmp_path)
    settings = yaml.safe_load((ROOT / "configs" / "shortcut_text.yaml").read_text())
    (callback,) = settings["trainer"]["callbacks"]
    callback["init_args"].update(methods=["gae"], num_samples=2)
    settings["model"]["init_args"].update(dim=32, depth=1, heads=2)
    settings["data"]["init_args"].update(num_train=64, num_val=32)
    small = tmp_path / "shortcut_text.yaml"
    small.write_text(yaml.safe_dump(settings))
    checkpoint = _fit(small, tmp_path)
    capsys.readouterr()
    main(["compare", "--config", str(small), "--ckpt_path", str(checkpoint), "--output", "out", "--num_samples", "16",
          "--methods", "gae", "rollout", "random"])
    printed = capsys.readouterr().out
    assert "region_share_spurious_word ↓" in printed and "region_recall_spurious_word ↓" in printed
    report = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert report["regions"] == {"spurious_word": "suspect"}
    for method in ("gae", "rollout", "random"):
        assert 0.0 <= report["methods"][method]["region_share_spurious_word"] <= 1.0
        assert "region_share_spurious_word" in report["stderr"][method]
    assert "`spurious_word` (suspect)" in (tmp_path / "out" / "comparison.md").read_text()
    main(["compare", "--config", str(small), "--ckpt_path", str(checkpoint), "--output", "none", "--num_samples", "4",
          "--methods", "gae", "--regions", "none"])
    assert "regions" not in json.loads((tmp_path / "none" / "comparison.json").read_text())
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["compare", "--config", str(small), "--ckpt_path", str(checkpoint), "--output", "cb", "--num_samples", "4",
              "--methods", "gae", "--regions", "callback"])
    said = capsys.readouterr().err
    assert exited.value.code == 2 and "--regions callback: the config's GAECallback declares no regions" in said
    assert "Traceback" not in said


# --- issue 34 item 5: compare's arguments at their edges (each exits 2 with argparse's usage and what was wrong) -----


@pytest.mark.parametrize("arguments, message", [
    (["--ckpt_path", "missing.ckpt"], r"--ckpt_path missing\.ckpt: no such file; give a checkpoint of the fit"),
    (["--ckpt_path", "x.ckpt", "--methods", "nope"], r"argument --methods: invalid choice: 'nope' \(choose from 'gae'"),
    (["--ckpt_path", "x.ckpt", "--metrics", "nope"], r"argument --metrics: invalid choice: 'nope' \(choose from"),
    (["--ckpt_path", "x.ckpt", "--num_samples", "0"], r"--num_samples must be >= 1; got 0"),
    (["--ckpt_path", "x.ckpt", "--num_samples", "-3"], r"--num_samples must be >= 1; got -3"),
    (["--ckpt_path", "x.ckpt", "--protocol", "nope"], r"argument --protocol: invalid choice: 'nope' \(choose from 'predicted', 'target'\)"),
    ([], r"the following arguments are required: --ckpt_path"),
])
def test_compare_refuses_bad_arguments_naming_them(arguments, message, tmp_path, monkeypatch, capsys):
    # A missing checkpoint was a FileNotFoundError traceback after the model and data were built.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(["compare", "--config", str(ROOT / "configs" / "vit_digits.yaml"), "--output", "out", *arguments])
    assert stopped.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_compare_and_validate_name_a_config_that_does_not_exist(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for subcommand in (["compare", "--ckpt_path", "x.ckpt", "--output", "out"], ["validate"]):
        with pytest.raises(SystemExit) as stopped:
            main([*subcommand, "--config", "missing.yaml"])
        assert stopped.value.code == 2
        assert "missing.yaml" in capsys.readouterr().err


# --- issue 34 items 1 and 4: compare on Hugging Face-style batches, laid out as the callback lays them out ------------

HF = "tests.helpers.hf_modules"


@pytest.fixture(scope="module")
def batch_checkpoints(tmp_path_factory):
    """Checkpoints of a plain ``Trainer`` fit of a tiny Hugging Face ViT whose forward takes the batch, on mapping and
    on dataclass batches ``{pixel_values, labels}``."""
    from lightning.pytorch import Trainer, seed_everything

    from tests.helpers.hf_modules import ImageData, ViTTakesTheBatch

    found = {}
    for kind in ("mapping", "dataclass"):
        root = tmp_path_factory.mktemp(kind)
        seed_everything(0)
        trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1, accelerator="cpu", logger=False,
                          enable_progress_bar=False, enable_model_summary=False, default_root_dir=root)
        trainer.fit(ViTTakesTheBatch(), ImageData(as_dataclass=kind == "dataclass"))
        found[kind] = trainer.checkpoint_callback.best_model_path
    return found


def _batch_compare(output, *arguments):
    """``comparison.json``'s scores of GAE and saliency on the first 6 samples (6 != 17 tokens != hidden size 32)."""
    main(["compare", *arguments, "--output", output, "--num_samples", "6", "--methods", "gae", "saliency",
          "--metrics", "positive_perturbation_auc", "deletion_auc"])
    report = json.loads((Path(output) / "comparison.json").read_text())
    scores = {(method, name): value for method, columns in report["methods"].items()
              for name, value in columns.items() if name != "seconds_per_sample"}
    assert report["num_samples"] == 6 and len(scores) == 4 and all(math.isfinite(v) for v in scores.values())
    return scores


def _same_scores(found, expected):
    assert found.keys() == expected.keys()
    assert all(found[key] == pytest.approx(expected[key], abs=1e-6) for key in expected), (found, expected)


def _write_config(path, model, as_dataclass, callback=None):
    settings = {"trainer": {"logger": False, "callbacks": [] if callback is None else [callback]},
                "model": {"class_path": f"{HF}.{model}"},
                "data": {"class_path": f"{HF}.ImageData", "init_args": {"as_dataclass": as_dataclass}}}
    path.write_text(yaml.safe_dump(settings))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mapping", "dataclass"])
def test_compare_calls_a_forward_that_takes_the_batch_as_the_callback_does(kind, batch_checkpoints, tmp_path,
                                                                           monkeypatch):
    # forward(self, batch) was called as model(**{"pixel_values": ...}) (a TypeError); a dataclass batch was passed
    # as the images, whatever the forward took.
    monkeypatch.chdir(tmp_path)
    ckpt = batch_checkpoints[kind]
    by_name = _batch_compare("by_name", "--model", f"{HF}.ViTByName", "--data", f"{HF}.ImageData", "--ckpt_path", ckpt)
    whole = _batch_compare("whole", "--model", f"{HF}.ViTTakesTheBatch", "--data", f"{HF}.ImageData",
                           "--ckpt_path", ckpt)
    _same_scores(whole, by_name)
    config = _write_config(tmp_path / "config.yaml", "ViTTakesTheBatch", kind == "dataclass")
    _same_scores(_batch_compare("yaml", "--config", config, "--ckpt_path", ckpt), by_name)


@pytest.mark.slow
def test_compare_refuses_a_layout_the_forward_cannot_tell_with_the_readers_that_fix_it(batch_checkpoints, tmp_path,
                                                                                      monkeypatch, capsys):
    import importlib

    monkeypatch.chdir(tmp_path)
    ckpt = batch_checkpoints["mapping"]
    classes = ["--data", f"{HF}.ImageData", "--ckpt_path", ckpt]
    by_name = _batch_compare("by_name", "--model", f"{HF}.ViTByName", *classes)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        _batch_compare("as_x", "--model", f"{HF}.ViTImagesAsX", *classes)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and not (tmp_path / "as_x").exists()
    assert "ViTImagesAsX.forward(x) takes none of them by name" in err, err
    assert "batches=BatchOptions(inputs=lambda batch: batch['pixel_values'])" in err
    assert "--inputs my_readers.pixels" in err and "init_args: {batches: {inputs: my_readers.pixels}}" in err
    # Followed: the reader the message names, in a module of the working directory, by --inputs and by the YAML.
    (tmp_path / "my_readers.py").write_text("def pixels(batch):\n    return batch['pixel_values']\n")
    importlib.invalidate_caches()
    _same_scores(_batch_compare("flag", "--model", f"{HF}.ViTImagesAsX", *classes, "--inputs", "my_readers.pixels"),
                 by_name)
    callback = {"class_path": "lightning_gae.callbacks.GAECallback",
                "init_args": {"batches": {"inputs": "my_readers.pixels"}}}
    config = _write_config(tmp_path / "config.yaml", "ViTImagesAsX", False, callback)
    _same_scores(_batch_compare("yaml", "--config", config, "--ckpt_path", ckpt), by_name)


@pytest.mark.slow
def test_validate_refuses_a_layout_the_forward_cannot_tell_and_scores_with_the_inputs_it_names(batch_checkpoints,
                                                                                               tmp_path, monkeypatch,
                                                                                               capsys, read_events):
    # validate --model/--data ended with the callback's ValueError, whose advice (a Python lambda) no command line
    # can give; and it took no --inputs.
    import importlib

    monkeypatch.chdir(tmp_path)

    def validate(*extra):
        main(["validate", "--model", f"{HF}.ViTImagesAsX", "--data", f"{HF}.ImageData",
              "--ckpt_path", batch_checkpoints["mapping"], "--trainer.callbacks+=lightning_gae.callbacks.GAECallback",
              "--trainer.callbacks.faithfulness.samples=8", "--trainer.limit_val_batches=1",
              "--trainer.enable_progress_bar=false", *extra])

    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        validate()
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err[-2000:]
    assert "lightning-gae validate: error:" in err and "ViTImagesAsX.forward(x) takes none of them by name" in err
    assert "--inputs my_readers.pixels" in err and "init_args: {batches: {inputs: my_readers.pixels}}" in err
    # Followed: the reader the message names, in a module of the working directory, given as --inputs.
    (tmp_path / "my_readers.py").write_text("def pixels(batch):\n    return batch['pixel_values']\n")
    importlib.invalidate_caches()
    validate("--inputs", "my_readers.pixels")
    out = capsys.readouterr().out
    assert "faithfulness (8 validation samples" in out, out[-2000:]
    runs = sorted({p.parent for p in tmp_path.glob("lightning_logs/version_*/events.out.tfevents.*")})
    scalars = {tag for run in runs for tag in read_events(run).scalar_values()}
    assert "positive_perturbation_auc/gae" in scalars, sorted(scalars)


# --- issue 43 item 2: a command-line mistake exits 2 with one line naming the fix, and no traceback ---------------
# Each of these ended in a Python traceback (or jsonargparse's report of every Union subtype it tried).

BORING = "lightning.pytorch.demos.boring_classes"


@pytest.fixture(scope="module")
def boring_checkpoint(tmp_path_factory):
    """A checkpoint of a model without attention (one linear layer), written after a single training step."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    root = tmp_path_factory.mktemp("boring")
    trainer = Trainer(max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=root)
    trainer.fit(BoringModel())
    trainer.save_checkpoint(root / "boring.ckpt")
    return root / "boring.ckpt"


def _refused(capsys, *arguments):
    """The one error line of ``lightning-gae *arguments``, which must exit 2 without a traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(list(map(str, arguments)))
    err = capsys.readouterr().err
    assert stopped.value.code == 2, err[-3000:]
    assert "Traceback" not in err and "Union subtypes" not in err, err[-3000:]
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert line.startswith(f"lightning-gae {arguments[0]}: error: "), err[-3000:]
    return line


def test_an_option_the_callback_refuses_inside_fit_config_is_one_line(tmp_path, monkeypatch, capsys):
    # Was 83 lines: two tracebacks, then "Does not validate against any of the Union subtypes".
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, "fit", "--config", CONFIG, "--trainer.callbacks.init_args.methods=[nope]")
    assert "GAECallback(methods=['nope']): ['nope'] are not methods; choose from ['gae', 'rollout'" in line
    assert not (tmp_path / "runs").exists()


def test_the_traceback_of_a_command_line_mistake_is_shown_on_request(tmp_path, monkeypatch, capsys):
    from lightning_gae.cli import CommandLineError

    monkeypatch.chdir(tmp_path)
    arguments = ["fit", "--config", str(CONFIG), "--trainer.callbacks.init_args.num_samples=0"]
    with pytest.raises(CommandLineError, match=r"GAECallback\(num_samples=0\)") as raised:
        main([*arguments, "--traceback"])
    # The callback's own ValueError is its cause, with the traceback to where it was raised.
    causes = []
    found = raised.value.__cause__
    while found is not None:
        causes.append(found)
        found = found.__cause__
    assert any(isinstance(e, ValueError) and str(e).startswith("GAECallback(num_samples=0)") for e in causes)
    monkeypatch.setenv("LIGHTNING_GAE_DEBUG", "1")
    with pytest.raises(CommandLineError):
        main(arguments)


@pytest.mark.slow
def test_the_installed_command_prints_one_line_for_a_refused_option(tmp_path, run_python):
    """The entry point as a user runs it: exit 2, the callback's message, nothing of the traceback."""
    done = run_python(["-m", "lightning_gae.cli", "fit", "--config", CONFIG,
                       "--trainer.callbacks.init_args.methods=[nope]"], cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert "GAECallback(methods=['nope']): ['nope'] are not methods; choose from" in line and "--traceback" in line


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_validate_and_test_name_a_checkpoint_that_does_not_exist(subcommand, tmp_path, monkeypatch, capsys):
    # Was a FileNotFoundError traceback from the trainer, after the model and data were built.
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, subcommand, "--config", CONFIG, "--ckpt_path", "missing.ckpt")
    assert "--ckpt_path missing.ckpt: no such file; give a checkpoint of the fit" in line


@pytest.mark.parametrize("subcommand", ["compare", "validate"])
def test_a_ckpt_path_that_is_no_checkpoint_is_named(subcommand, tmp_path, monkeypatch, capsys):
    # compare: "IndexError: pop from empty list" from torch.load reading the YAML.
    monkeypatch.chdir(tmp_path)
    extra = ["--output", "out"] if subcommand == "compare" else []
    line = _refused(capsys, subcommand, "--config", CONFIG, "--ckpt_path", CONFIG, *extra)
    assert f"--ckpt_path {CONFIG}: not a checkpoint" in line and "give a .ckpt file Lightning saved" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("subcommand", ["compare", "validate"])
def test_a_checkpoint_of_another_model_is_named(subcommand, boring_checkpoint, tmp_path, monkeypatch, capsys):
    # Was load_state_dict's RuntimeError: a traceback, then every missing and unexpected key.
    monkeypatch.chdir(tmp_path)
    extra = ["--output", "out"] if subcommand == "compare" else []
    line = _refused(capsys, subcommand, "--config", CONFIG, "--ckpt_path", boring_checkpoint, *extra)
    assert f"--ckpt_path {boring_checkpoint}: its weights are not those of ViTClassifier" in line
    assert "missing (e.g. model." in line and "2 unexpected (e.g. layer.weight)" in line
    assert "give a checkpoint of this model's fit" in line


def test_compare_on_a_model_without_attention_says_so(boring_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, "compare", "--model", f"{BORING}.BoringModel", "--data", f"{BORING}.BoringDataModule",
                    "--ckpt_path", boring_checkpoint, "--output", "out", "--num_samples", "4", "--methods", "gae")
    assert "no attention was recorded from BoringModel" in line and "attention_modules=" in line


def test_compare_refuses_an_output_that_is_a_file(boring_checkpoint, tmp_path, monkeypatch, capsys):
    # Was FileExistsError from mkdir, after every method had been scored.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.md").write_text("mine\n")
    line = _refused(capsys, "compare", "--config", CONFIG, "--ckpt_path", boring_checkpoint, "--output", "taken.md")
    assert "--output taken.md: a file, not a directory" in line
    assert (tmp_path / "taken.md").read_text() == "mine\n"


@pytest.mark.parametrize("subcommand", ["fit", "validate", "compare"])
def test_a_malformed_yaml_is_named_with_its_line(subcommand, boring_checkpoint, tmp_path, monkeypatch, capsys):
    # Was 'in "<unicode string>", line 3, column 2': the line but not the file.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.yaml").write_text("trainer:\n  max_epochs: 1\n model: [\n")
    extra = ["--ckpt_path", boring_checkpoint, "--output", "out"] if subcommand == "compare" else []
    line = _refused(capsys, subcommand, "--config", "broken.yaml", *extra)
    assert "--config broken.yaml: not valid YAML, line 3, column 2:" in line


@pytest.mark.slow
def test_compare_reads_a_text_project_as_validate_does(tmp_path, monkeypatch, capsys):
    """``--model/--data`` of a text model: the token ids are text, as the callback infers them (compare asked for a
    ``modality=`` no command line can give); ``--modality`` names one by import path."""
    from lightning.pytorch import Trainer, seed_everything

    from recipes.text_rationales import ReviewClassifier, ReviewsDataModule

    monkeypatch.chdir(tmp_path)
    seed_everything(0)
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, accelerator="cpu", logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(ReviewClassifier(dim=16, depth=1, heads=2), ReviewsDataModule(num_train=64, num_val=32, batch_size=16))
    classes = ["--model", "recipes.text_rationales.ReviewClassifier", "--data",
               "recipes.text_rationales.ReviewsDataModule", "--ckpt_path", trainer.checkpoint_callback.best_model_path,
               "--num_samples", "8", "--methods", "gae", "rollout", "--metrics", "positive_perturbation_auc"]
    main(["compare", *classes, "--output", "inferred"])
    main(["compare", *classes, "--output", "named", "--modality", "recipes.text_rationales.ReviewTokens"])
    for output in ("inferred", "named"):
        report = json.loads((tmp_path / output / "comparison.json").read_text())
        # Text: scored against the batches' rationales too, as the callback scores them.
        assert report["num_samples"] == 8 and "rationale_auprc" in report["methods"]["gae"], report
    line = _refused(capsys, "compare", *classes, "--output", "bad", "--modality", "lightning_gae.explain")
    assert "--modality lightning_gae.explain: not a Modality class or instance" in line


@pytest.mark.slow
@pytest.mark.parametrize("logs", ["lightning_logs", "runs/plain"])
def test_validate_of_a_plain_fits_checkpoint_logs_into_its_run(logs, tmp_path, monkeypatch, capsys, read_events):
    """``validate --model/--data --ckpt_path <run>/checkpoints/...``: into the fit's version at its last step (was a
    new version_1 at step + 1), and ``tensorboard --logdir`` names that run (was the whole project); the fit's
    logger Lightning's default or its own TensorBoardLogger."""
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import TensorBoardLogger

    from recipes.digits import DigitsDataModule
    from tests.helpers.models import small_vit

    monkeypatch.chdir(tmp_path)
    seed_everything(0)
    logger = True if logs == "lightning_logs" else TensorBoardLogger(tmp_path / "runs", name="plain")
    trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1, accelerator="cpu", logger=logger,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(small_vit(), DigitsDataModule(batch_size=32))
    ckpt = Path(trainer.checkpoint_callback.best_model_path)
    run = ckpt.parent.parent
    assert run == tmp_path / logs / "version_0"
    last = trainer.global_step
    capsys.readouterr()
    main(["validate", "--model", "recipes.vit.ViTClassifier", "--data", "recipes.digits.DigitsDataModule",
          "--ckpt_path", str(ckpt.relative_to(tmp_path)), "--trainer.callbacks+=lightning_gae.callbacks.GAECallback",
          "--trainer.callbacks.faithfulness.samples=16", "--trainer.limit_val_batches=1",
          "--trainer.enable_progress_bar=false"])
    out = capsys.readouterr().out
    assert f"faithfulness (16 validation samples at step {last};" in out, out[-2000:]
    assert [p.name for p in (tmp_path / logs).iterdir()] == ["version_0"]
    assert not (tmp_path / "lightning_logs").exists() or logs == "lightning_logs"
    assert out.rstrip().endswith(f"tensorboard --logdir {logs}/version_0") and out.count("tensorboard --logdir") == 1
    events = read_events(run)
    assert events.scalar_events("faithfulness_samples")["faithfulness_samples"] == [(last, 16.0)]
    assert events.scalar_steps("val_loss")[-1] == last


def test_compare_says_an_option_the_configs_callback_refuses_in_one_line(boring_checkpoint, tmp_path, monkeypatch,
                                                                         capsys):
    monkeypatch.chdir(tmp_path)
    settings = yaml.safe_load(CONFIG.read_text())
    settings["trainer"]["callbacks"][0]["init_args"]["num_samples"] = 0
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(settings))
    line = _refused(capsys, "compare", "--config", "config.yaml", "--ckpt_path", boring_checkpoint, "--output", "out")
    assert "GAECallback(num_samples=0)" in line
