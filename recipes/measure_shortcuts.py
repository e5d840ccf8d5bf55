"""Does the shortcut recipe's model learn the shortcut, does GAE's relevance show it, and does GAECallback alert?

For each data set (``images``: watermarked digits and the recipe ViT; ``text``: reviews with a spurious word and
the recipe's encoder), each variant (shortcut, clean) and each seed: the accuracy on the training set (which
carries the shortcut) and on the shortcut-free validation set; the mean share of GAE's relevance on the suspect
region over validation samples that hold it, before training and after, beside the share chance puts there (each
sample's region tokens over the tokens a region can hold) with the mean excess and its standard error; the drops of
the predicted class's probability when the region, or a random region of its size, is removed; and what
``GAECallback`` decides during the same fit, with the recipe config's samples, methods, schedule and the default
:class:`~lightning_gae.options.RegionOptions` (chance as the yardstick): which methods it alerted for, at which step.
Run from the repo root (a few minutes on one thread)::

    python -m recipes.measure_shortcuts --data images text --seeds 0 1 --output docs/evidence/results/shortcuts.json
    python -m benchmarks.tables docs/evidence/results/shortcuts.json

The result file's table is ``docs/evidence/results/shortcuts.md`` (:func:`table`), which the callback guide includes.
The clean reviews' training accuracy is ~0.8 by construction (``sentiment_noise=0.2``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor, nn

import lightning_gae as lg
from lightning_gae.callbacks import BatchOptions, FaithfulnessOptions, GAECallback, RegionOptions
from lightning_gae.metrics.functional import region_removal_drop, region_share
from lightning_gae.metrics.regions import STDERR_MULTIPLE, chance_shares, excess_over_chance
from lightning_gae.modalities.regions import region_token_mask
from recipes.shortcuts import SpuriousReviewsDataModule, WatermarkedDigitsDataModule
from recipes.text_rationales import ReviewClassifier, ReviewTokens
from recipes.vit import ViTClassifier

__all__ = ["CALLBACK", "EPOCHS", "accuracy", "build", "gae_share", "measure", "removal", "table"]

EPOCHS: dict[str, int] = {"images": 30, "text": 3}
"""Epochs per data set: the clean variant reaches its usual validation accuracy (digits ~0.97, as the main job,
reviews ~1.0); about 30 s and 12 s on one CPU thread."""

CALLBACK: dict[str, dict[str, Any]] = {
    "images": {"num_samples": 10, "every_n_epochs": 6, "methods": ("gae", "rollout", "raw_attention")},
    "text": {"num_samples": 8, "every_n_epochs": 1, "methods": ("gae", "rollout", "raw_attention", "attn_gradcam")},
}
"""GAECallback's arguments as ``configs/shortcut_images.yaml`` and ``configs/shortcut_text.yaml`` set them."""


def build(data: str, shortcut: bool, seed: int) -> tuple[pl.LightningModule, pl.LightningDataModule, lg.Modality]:
    """The recipe's model, data module and modality, seeded."""
    pl.seed_everything(seed, verbose=False)
    if data == "images":
        return (ViTClassifier(), WatermarkedDigitsDataModule(shortcut=shortcut, seed=seed),
                lg.ImageTokens(patch_size=2, prefix_tokens=1))
    if data == "text":
        return ReviewClassifier(), SpuriousReviewsDataModule(shortcut=shortcut, seed=seed), ReviewTokens()
    raise ValueError(f"data={data!r}; use 'images' or 'text'")


def _inputs(batch: Any) -> tuple[Any, Tensor]:
    if isinstance(batch, dict):
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}, batch["labels"]
    return batch[0], batch[1]


def _call(model: nn.Module, inputs: Any) -> Tensor:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


@torch.no_grad()
def accuracy(model: nn.Module, loader: Any) -> float:
    """The share of samples whose prediction is their label, in eval mode."""
    model.eval()
    hits = total = 0
    for batch in loader:
        inputs, labels = _inputs(batch)
        hits += int((_call(model, inputs).argmax(dim=1) == labels).sum())
        total += len(labels)
    return hits / total


def gae_share(model: nn.Module, datamodule: Any, modality: lg.Modality, method: str = "gae") -> dict[str, float]:
    """Over the validation samples that hold the data module's region (a sample without it has no share) and whose
    relevance has positive mass: ``method``'s mean share on it, the share chance puts there and the mean excess with
    its standard error, over the tokens a region can hold (the modality's removable tokens), as GAECallback's alert
    counts them (:func:`~lightning_gae.metrics.regions.excess_over_chance`)."""
    model.eval()
    shares, chances = [], []
    for batch in datamodule.val_dataloader():
        inputs, _ = _inputs(batch)
        tokens = lg.explain(model, inputs, method=method).tokens
        mask = region_token_mask(datamodule.region, modality, inputs)
        valid = modality.removable_tokens(inputs)
        holds = mask.any(dim=1)
        shares.append(region_share(tokens, mask, valid)[holds])
        chances.append(chance_shares(mask, valid)[holds])
    found = excess_over_chance(torch.cat(shares), torch.cat(chances))
    return {"share": found.share, "chance": found.chance, "excess": found.excess, "stderr": found.stderr,
            "samples": found.samples}


def removal(model: nn.Module, datamodule: Any, modality: lg.Modality, num_random: int = 8) -> dict[str, float]:
    """The mean drop of the predicted class's probability when the region is removed, and when random regions of
    its size are, over the validation samples that hold it (:func:`region_removal_drop`)."""
    region, random = [], []
    generator = torch.Generator().manual_seed(0)
    for batch in datamodule.val_dataloader():
        inputs, _ = _inputs(batch)
        mask = region_token_mask(datamodule.region, modality, inputs)
        holds = mask.any(dim=1)
        out = region_removal_drop(model, inputs, mask, modality, num_random=num_random, generator=generator)
        region.append(out.region[holds])
        random.append(out.random[holds].mean(dim=1))
    return {"region": float(torch.cat(region).mean()), "random": float(torch.cat(random).mean())}


def _callback(data: str, datamodule: Any, modality: lg.Modality, seed: int) -> GAECallback:
    """GAECallback as the recipe's config builds it, with the default RegionOptions on the data module's region and no
    faithfulness metric (the alert does not read them)."""
    return GAECallback(**CALLBACK[data], modality=modality, regions=RegionOptions(regions=[datamodule.region]),
                       faithfulness=FaithfulnessOptions(metrics=()), batches=BatchOptions(seed=seed))


def measure(data: str, shortcut: bool, seed: int, epochs: int | None = None) -> dict[str, Any]:
    """Train one variant with GAECallback watching the region; its accuracies, GAE's region shares before and
    after, the removal drops, and the callback's alerts."""
    model, datamodule, modality = build(data, shortcut, seed)
    datamodule.setup("fit")
    start = gae_share(model, datamodule, modality)
    model.train()  # Lightning trains the modules in the mode it finds them in
    callback = _callback(data, datamodule, modality, seed)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as logs:
        trainer = pl.Trainer(max_epochs=epochs or EPOCHS[data], accelerator="cpu", devices=1,
                             logger=TensorBoardLogger(logs, name="shortcuts"), callbacks=[callback],
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0)
        trainer.fit(model, datamodule=datamodule)
    seconds = time.perf_counter() - began
    end = gae_share(model, datamodule, modality)
    drops = removal(model, datamodule, modality)
    return {
        "data": data, "variant": "shortcut" if shortcut else "clean", "seed": seed, "seconds": round(seconds, 1),
        "train_acc": accuracy(model, datamodule.train_dataloader()), "val_acc": accuracy(model, datamodule.val_dataloader()),
        "share_start": start["share"], "share_end": end["share"], "chance": end["chance"], "excess": end["excess"],
        "excess_stderr": end["stderr"], "samples": end["samples"],
        "drop_region": drops["region"], "drop_random": drops["random"],
        "alerts": [{"step": a.step, "method": a.method, "share": a.share, "chance": a.floor, "excess": a.excess,
                    "stderr": a.stderr, "samples": a.count, "rule": a.rule} for a in callback.run.alerts],
    }


def _alerts(alerts: Sequence[dict[str, Any]]) -> str:
    """The alerts of one fit, step by step: each method with its excess over chance ± its standard error."""
    if not alerts:
        return "none"
    steps: dict[tuple[int, int], list[str]] = {}
    for a in alerts:
        steps.setdefault((a["step"], a["samples"]), []).append(f"{a['method']} {a['excess']:+.2f} ± {a['stderr']:.2f}")
    return "; ".join(f"step {step} (n={n}): " + ", ".join(cells) for (step, n), cells in steps.items())


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The measurements as a Markdown table (MyST's ``numbers`` style), one row per data set, variant and seed."""
    lines = ["{.numbers}",
             "| data | variant | seed | train acc | val acc (shortcut-free) | GAE share start | GAE share end | chance | "
             "excess ± SE (n) | drop, region removed | drop, random region | GAECallback's alerts: excess ± SE |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['data']} | {r['variant']} | {r['seed']} | {r['train_acc']:.3f} | {r['val_acc']:.3f} | "
                     f"{r['share_start']:.3f} | {r['share_end']:.3f} | {r['chance']:.3f} | "
                     f"{r['excess']:+.3f} ± {r['excess_stderr']:.3f} ({r['samples']}) | {r['drop_region']:.3f} | "
                     f"{r['drop_random']:.3f} | {_alerts(r['alerts'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["images", "text"], choices=["images", "text"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--epochs", type=int, default=None, help="default: EPOCHS of the data set")
    parser.add_argument("--output", type=Path, default=None, help="write the measurements as JSON (benchmarks.tables)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for data in args.data:
        for seed in args.seeds:
            for shortcut in (True, False):
                rows.append(measure(data, shortcut, seed, args.epochs))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    if args.output is not None:
        settings = {"margin": RegionOptions().margin, "stderr_multiple": STDERR_MULTIPLE}
        args.output.write_text(json.dumps({"shortcuts": rows, "rule": settings}, indent=1) + "\n")


if __name__ == "__main__":
    main()
