"""Writes the faithfulness table (docs/evidence/faithfulness.md) of a recipe from two ``lightning-gae compare`` runs on its checkpoint.

Run ``lightning-gae compare`` twice on the same checkpoint, once per protocol::

    lightning-gae compare --config configs/text_rationales.yaml --ckpt_path CKPT --output runs/compare/text_rationales/predicted \\
        --protocol predicted --metrics positive_perturbation_auc negative_perturbation_auc deletion_auc insertion_auc
    lightning-gae compare --config configs/text_rationales.yaml --ckpt_path CKPT --output runs/compare/text_rationales/target \\
        --protocol target --metrics positive_perturbation_auc negative_perturbation_auc
    python -m recipes.faithfulness_tables runs/compare/text_rationales

The tables have a row per method and, each as ``value ± standard error``: positive and negative
perturbation AUC under both protocols, deletion and insertion, and whatever ground-truth scores
the run measured (segmentation, rationale, feature recovery), all from the ``predicted`` run but
the ``target`` protocol's two columns. Nothing is computed here; the best value of a column is bold.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_PERTURBATION = ("positive_perturbation_auc", "negative_perturbation_auc")
_SHORT = {
    "positive_perturbation_auc": "pos. AUC",
    "negative_perturbation_auc": "neg. AUC",
    "deletion_auc": "deletion",
    "insertion_auc": "insertion",
}
# Lower is better for these; every other column is higher-is-better.
_LOWER = {"positive_perturbation_auc", "deletion_auc"}


def _columns(predicted: dict[str, Any], target: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(heading, metric, run)`` in table order."""
    metrics = list(next(iter(predicted["methods"].values())))
    columns = [(f"{_SHORT[m]} (predicted)", m, predicted) for m in _PERTURBATION if m in metrics]
    columns += [(f"{_SHORT[m]} (target)", m, target) for m in _PERTURBATION if m in next(iter(target["methods"].values()))]
    columns += [(_SHORT[m], m, predicted) for m in ("deletion_auc", "insertion_auc") if m in metrics]
    columns += [(m, m, predicted) for m in metrics if m not in _SHORT and m != "seconds_per_sample"]
    return columns


def table(folder: Path) -> str:
    """The markdown table of ``folder/predicted/comparison.json`` and ``folder/target/comparison.json``."""
    predicted = json.loads((folder / "predicted" / "comparison.json").read_text())
    target = json.loads((folder / "target" / "comparison.json").read_text())
    if predicted["num_samples"] != target["num_samples"] or list(predicted["methods"]) != list(target["methods"]):
        raise SystemExit(f"{folder}: the two runs scored different samples or methods; run both with the same arguments")
    columns = _columns(predicted, target)
    best = {}
    for heading, metric, run in columns:
        values = [scores[metric] for scores in run["methods"].values()]
        best[heading] = min(values) if metric in _LOWER else max(values)
    # Three tables of the same rows, so that none is wider than a page: the perturbation AUCs of both protocols;
    # deletion, insertion and ABPC; the ground-truth scores (where the recipe knows the answer).
    groups = [[c for c in columns if c[1] in _PERTURBATION],
              [c for c in columns if c[1] in ("deletion_auc", "insertion_auc", "abpc")]]
    groups.append([c for c in columns if not any(c in g for g in groups)])
    return "\n".join(_rows(predicted, group, best) for group in groups if group)


def _rows(predicted: dict[str, Any], columns: list[tuple[str, str, dict[str, Any]]], best: dict[str, float]) -> str:
    arrows = ["↓" if metric in _LOWER else "↑" for _, metric, _ in columns]
    lines = ["| method | " + " | ".join(f"{h} {a}" for (h, _, _), a in zip(columns, arrows)) + " |",
             "| --- |" + " ---: |" * len(columns)]
    for method in predicted["methods"]:
        cells = []
        for heading, metric, run in columns:
            value, error = run["methods"][method][metric], run["stderr"][method][metric]
            text = f"{value:.3g}" if abs(value) < 1 else f"{value:.1f}"
            spread = f"{error:.2g}" if abs(value) < 1 else f"{error:.1f}"
            cells.append(f"**{text}** ± {spread}" if value == best[heading] else f"{text} ± {spread}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="holds predicted/comparison.json and target/comparison.json")
    args = parser.parse_args(argv)
    print(table(args.folder), end="")


if __name__ == "__main__":
    main()
