"""The docs' performance and faithfulness tables, made from the result files their measuring commands write.

Each ``docs/evidence/results/NAME.json`` (``lightning-gae bench --output``: one row per case and method) has its table
beside it, ``NAME.md``; each ``docs/evidence/results/faithfulness/CONFIG/`` (the ``predicted`` and ``target`` runs of
``lightning-gae compare --output``) has ``CONFIG.md`` beside the folder. The pages include the tables. ``python -m benchmarks.tables`` writes every table from its JSON;
``tests/test_docs.py`` fails when a committed table differs from what this module makes of its JSON, so a number
on a page is always the measured one. To add a measurement: run the bench with ``--output`` into that folder, run
this module, include the new table in a page.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "evidence" / "results"
"""The committed result files and their tables."""

# The methods a table shows beside the floor (forward_backward), in this order, where the run measured them.
_COLUMNS = {
    "gae": "`gae`",
    "gae_chunks": "`gae`, the chunks",
    "gae_triton": "`gae`, first kernel",
    "saliency": "`saliency`",
    "rollout": "`rollout`",
    "attnlrp": "`attnlrp`",
    "transformer_attribution": "`transformer_attribution`",
    "integrated_gradients": "`integrated_gradients`",
}
_CASES = {"vit": "ViT", "bert": "BERT", "llama": "Llama (decoder)"}


def bench_table(rows: Sequence[dict]) -> str:
    """Markdown (MyST, the right-aligned ``numbers`` style): per model case, one training step's time and peak memory, then each method's time and memory as
    multiples of it (``time x / memory x``); ``-`` where the run did not measure a method on that case."""
    found = {(r["case"], r["batch"], r["tokens"], r["method"]): r for r in rows}
    settings = sorted({(r["case"], r["batch"], r["tokens"]) for r in rows if r["case"] in _CASES},
                      key=lambda s: (list(_CASES).index(s[0]), s[2], s[1]))
    methods = [m for m in _COLUMNS if any((*s, m) in found for s in settings)]
    lines = ["{.numbers}", "| model | batch | N | training step | " + " | ".join(_COLUMNS[m] for m in methods) + " |",
             "| --- | ---: | ---: | ---: |" + " ---: |" * len(methods)]
    for case, batch, tokens in settings:
        floor = found.get((case, batch, tokens, "forward_backward"))
        if floor is None:
            raise ValueError(f"{case} batch {batch} N={tokens}: the results have no forward_backward row to divide by")
        cells = []
        for method in methods:
            row = found.get((case, batch, tokens, method))
            cells.append("-" if row is None else f"{row['seconds'] / floor['seconds']:.2f}x / "
                                                 f"{row['peak_memory_mb'] / floor['peak_memory_mb']:.2f}x")
        lines.append(f"| {_CASES[case]} | {batch} | {tokens} | {floor['seconds'] * 1e3:.0f} ms / "
                     f"{floor['peak_memory_mb'] / 1024:.1f} GiB | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def faithfulness_table(folder: Path) -> str:
    """The faithfulness table of one recipe from its two ``lightning-gae compare`` runs (``folder/predicted`` and
    ``folder/target``, each a ``comparison.json``), as :func:`recipes.faithfulness_tables.table` makes it."""
    from recipes.faithfulness_tables import table

    return "{.numbers}\n" + table(Path(folder))


def faithfulness_sources() -> list[Path]:
    """The recipes' committed compare runs: ``results/faithfulness/<config>/``, each table beside it as ``<config>.md``."""
    return sorted(p for p in (RESULTS / "faithfulness").glob("*") if p.is_dir())


def render(source: Path) -> str:
    """The table of one result: a bench result file, or a recipe's folder of compare runs."""
    source = Path(source)
    if source.is_dir():
        return faithfulness_table(source)
    return bench_table(json.loads(source.read_text())["results"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="*", type=Path, help="result files (default: every one in docs/evidence/results)")
    args = parser.parse_args(argv)
    for source in args.sources or [*sorted(RESULTS.glob("*.json")), *faithfulness_sources()]:
        target = source.with_suffix(".md") if source.is_file() else source.parent / f"{source.name}.md"
        target.write_text(render(source))
        print(f"wrote {target}")


if __name__ == "__main__":
    main()
