"""The option groups: GAECallback's signature reads at a glance, LightningCLI builds the groups from YAML and from
``--trainer.callbacks.<group>.<field>`` overrides, and compare() takes the same groups."""

import inspect
from pathlib import Path

import pytest
import torch
import yaml

from lightning_gae.callbacks import BatchOptions, DisplayOptions, EngineOptions, FaithfulnessOptions, GAECallback
from lightning_gae.cli import main
from lightning_gae.compare import compare
from tests.helpers.models import small_vit

CONFIG = """
seed_everything: 0
trainer:
  accelerator: cpu
  max_epochs: 1
  logger: false
  callbacks:
    - class_path: lightning_gae.callbacks.GAECallback
      init_args:
        num_samples: 4
        methods: [gae, rollout]
        faithfulness:
          metrics: [positive_perturbation_auc]
          samples: 64
        batches:
          seed: 3
          max_scan_batches: 2
        engine:
          streams:
            self_attention: {tokens: ["blocks.*"]}
        display:
          heatmap_scale: fixed
model:
  class_path: recipes.vit.ViTClassifier
  init_args: {dim: 16, depth: 1, heads: 2}
data:
  class_path: recipes.digits.DigitsDataModule
"""


def test_the_signature_has_at_most_15_parameters_and_the_rest_in_groups():
    parameters = list(inspect.signature(GAECallback.__init__).parameters)[1:]
    assert len(parameters) <= 15
    assert parameters[-5:] == ["faithfulness", "batches", "engine", "display", "regions"]
    # What the 11 shipped configs and the README set every day stays flat.
    assert {"num_samples", "every_n_epochs", "methods", "modality", "target", "query", "captum_baselines"} <= set(parameters)


def _printed_config(tmp_path: Path, capsys, *overrides: str) -> dict:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(config), *overrides, "--print_config"])
    assert done.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)["trainer"]["callbacks"][0]["init_args"]


def test_the_cli_reads_the_groups_from_nested_yaml_keys(tmp_path, capsys):
    args = _printed_config(tmp_path, capsys)
    assert args["faithfulness"] == {"metrics": ["positive_perturbation_auc"], "random_baseline": True, "samples": 64,
                                    "interim_samples": 32, "every_n_explanations": 2, "max_batch": 256}
    assert args["batches"]["seed"] == 3 and args["batches"]["max_scan_batches"] == 2
    assert args["engine"]["streams"]["self_attention"] == {"tokens": ["blocks.*"]}
    assert args["display"]["heatmap_scale"] == "fixed"


def test_a_command_line_override_reaches_one_field_of_a_group(tmp_path, capsys):
    args = _printed_config(tmp_path, capsys, "--trainer.callbacks.faithfulness.interim_samples=8",
                           "--trainer.callbacks.display.top_fraction=0.25")
    assert args["faithfulness"]["interim_samples"] == 8
    assert args["faithfulness"]["samples"] == 64  # the rest of the group as the YAML file set it
    assert args["display"] == {"evolution_length": 5, "top_fraction": 0.25, "heatmap_scale": "fixed"}


def test_a_bad_value_in_a_config_fails_before_training_and_names_the_field(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    with pytest.raises((SystemExit, ValueError)) as raised:
        main(["fit", "--config", str(config), "--trainer.callbacks.faithfulness.samples=-1",
              f"--trainer.default_root_dir={tmp_path}"])
    text = str(raised.value) + str(raised.value.__context__ or "")
    if isinstance(raised.value, SystemExit):  # jsonargparse reports the failed instantiation and exits
        assert raised.value.code not in (None, 0)
    else:
        assert "FaithfulnessOptions(samples=-1)" in text
    assert not (tmp_path / "lightning_logs").exists()


def test_the_cli_builds_the_callback_with_its_groups(tmp_path):
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch import LightningDataModule, LightningModule

    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    cli = LightningCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                       run=False, args=["--config", str(config), "--trainer.callbacks.batches.seed=5"])
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, GAECallback))
    assert callback.faithfulness == FaithfulnessOptions(metrics=("positive_perturbation_auc",), samples=64)
    assert callback.batches == BatchOptions(seed=5, max_scan_batches=2)
    assert callback.engine.streams.self_attention == {"tokens": ["blocks.*"]}
    assert callback.display == DisplayOptions(heatmap_scale="fixed")


def test_compare_takes_the_callbacks_groups(tmp_path):
    torch.manual_seed(0)
    model = small_vit().eval()
    images = torch.randn(6, 1, 8, 8)
    faithfulness = FaithfulnessOptions(metrics=("positive_perturbation_auc",), max_batch=4)
    result = compare(model, images, methods=("gae", "random"), faithfulness=faithfulness)
    assert set(result.methods["gae"]) == {"positive_perturbation_auc", "seconds_per_sample"}
    # max_batch only splits the perturbed forwards: the values are those of one large batch.
    whole = compare(model, images, methods=("gae", "random"),
                    faithfulness=FaithfulnessOptions(metrics=("positive_perturbation_auc",)))
    for method in ("gae", "random"):
        assert result.methods[method]["positive_perturbation_auc"] == pytest.approx(
            whole.methods[method]["positive_perturbation_auc"], abs=1e-6)
    with pytest.raises(ValueError, match=r"compare\(engine=EngineOptions\(attention_modules=..., answer_tokens=...\)\)"):
        compare(model, images, methods=("gae",), engine=EngineOptions(attention_modules=["blocks.*"]))
    with pytest.raises(ValueError, match=r"give FaithfulnessOptions"):
        compare(model, images, methods=("gae",), faithfulness={"metrics": ()})
