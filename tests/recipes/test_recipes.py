"""The main job's recipe (digits and the ViT), and the wheel leaving recipes/ out."""

import tomllib

import torch
from setuptools import find_packages

import lightning_gae as lg
from recipes.digits import DigitsDataModule
from recipes.vit import ViTClassifier
from tests.helpers.processes import ROOT


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


def test_the_wheel_installs_no_top_level_recipes_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = find_packages(str(ROOT), **config["tool"]["setuptools"]["packages"]["find"])
    assert "lightning_gae" in found and "lightning_gae.metrics" in found
    assert not [name for name in found if name.split(".")[0] in ("recipes", "tests")], found
