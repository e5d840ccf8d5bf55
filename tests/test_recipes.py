"""The main job's recipe: data shapes, explainability of its ViT, and the CLI wiring."""

from pathlib import Path

import torch

import lightning_gae as lg
from lightning_gae.cli import main
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "vit_digits.yaml"


def test_digits_are_real_images_in_unit_range():
    dm = DigitsDataModule(batch_size=16)
    dm.setup("fit")
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (16, 1, 8, 8) and x.dtype == torch.float32
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5
    assert y.dtype == torch.int64 and set(y.tolist()) <= set(range(10))


def test_recipe_vit_is_explained_through_its_fused_attention():
    model = ViTClassifier().eval()
    exp = lg.explain(model, torch.rand(4, 1, 8, 8))
    assert exp.tokens.shape == (4, 17)
    assert exp.layers == [f"model.blocks.{i}.attn" for i in range(4)]


def test_cli_fits_the_main_job_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(CONFIG), "--trainer.fast_dev_run", "true"])
