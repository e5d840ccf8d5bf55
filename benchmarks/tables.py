"""The docs' performance and faithfulness tables, made from the result files their measuring commands write.

Each ``docs/evidence/results/NAME.json`` (``python -m benchmarks.bench --output``: one row per case and method) has its
tables beside it (``NAME.md``, and ``NAME_flow.md``/``NAME_fit.md`` where it measured attention flow or the main job's
fit); each ``docs/evidence/results/faithfulness/CONFIG/`` (the ``predicted`` and ``target`` runs of
``lightning-gae compare --output``) has ``CONFIG.md`` beside the folder. The pages include the tables.
``python -m benchmarks.tables`` writes every table from its JSON;
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
    "gae_matrix": "`gae`, dense maps",
    "per_sample_loop": "`gae`, one sample at a time",
    "saliency": "`saliency`",
    "rollout": "`rollout`",
    "attnlrp": "`attnlrp`",
    "transformer_attribution": "`transformer_attribution`",
    "integrated_gradients": "`integrated_gradients`",
}
_CASES = {"vit": "ViT", "bert": "BERT", "llama": "Llama (decoder)"}


def bench_table(rows: Sequence[dict]) -> str:
    """Markdown (MyST, the right-aligned ``numbers`` style): per model case, one training step's time and peak memory, then each method's time and memory as
    multiples of it (``time x / memory x``); ``-`` where the run did not measure a method on that case. More than
    :data:`_WIDEST` methods make several tables of at most three, GAE's forms first, so that none scrolls on a page."""
    found = {(r["case"], r["batch"], r["tokens"], r["method"]): r for r in rows}
    settings = sorted({(r["case"], r["batch"], r["tokens"]) for r in rows if r["case"] in _CASES},
                      key=lambda s: (list(_CASES).index(s[0]), s[2], s[1]))
    methods = [m for m in _COLUMNS if any((*s, m) in found for s in settings)]
    groups = [methods]
    if len(methods) > _WIDEST:
        family = [m for m in methods if m.startswith("gae") or m == "per_sample_loop"]
        others = [m for m in methods if m not in family]
        groups = [part[i:i + 3] for part in (family, others) for i in range(0, len(part), 3)]
    return "\n".join(_bench_rows(found, settings, group) for group in groups)


_WIDEST = 4


def _bench_rows(found: dict, settings: Sequence[tuple], methods: Sequence[str]) -> str:
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
        lines.append(f"| {_CASES[case]} | {batch} | {tokens} | {_seconds(floor['seconds'])} / "
                     f"{_memory(floor['peak_memory_mb'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def flow_table(rows: Sequence[dict]) -> str:
    """Attention flow on one sample per token count: its time, and as multiples of ``gae``'s and ``rollout``'s."""
    found = {(r["tokens"], r["method"]): r["seconds"] for r in rows if r["case"] == "flow"}
    lines = ["{.numbers}", "| N | `attention_flow` | vs `gae` | vs `rollout` |", "| ---: | ---: | ---: | ---: |"]
    for tokens in sorted({n for n, _ in found}):
        flow = found[(tokens, "attention_flow")]
        lines.append(f"| {tokens} | {_seconds(flow)} | {flow / found[(tokens, 'gae')]:.1f}x | "
                     f"{flow / found[(tokens, 'rollout')]:.1f}x |")
    return "\n".join(lines) + "\n"


def fit_table(rows: Sequence[dict]) -> str:
    """The main job's fit without and with ``GAECallback`` (medians), and their ratio in seconds and CPU seconds."""
    found = {r["method"]: r for r in rows if r["case"] == "main_job"}
    without, with_ = found["fit_without_callback"], found["fit_with_callback"]
    return "\n".join([
        "{.numbers}", "| fit without `GAECallback` | fit with it | ratio | ratio in CPU seconds |",
        "| ---: | ---: | ---: | ---: |",
        f"| {_seconds(without['seconds'])} | {_seconds(with_['seconds'])} | {with_['seconds'] / without['seconds']:.2f}x | "
        f"{with_['cpu_seconds'] / without['cpu_seconds']:.2f}x |"]) + "\n"


def _seconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.3g} s"


def _memory(megabytes: float) -> str:
    return f"{megabytes:.0f} MB" if megabytes < 1024 else f"{megabytes / 1024:.1f} GiB"


def faithfulness_table(folder: Path) -> str:
    """The faithfulness tables of one recipe from its two ``lightning-gae compare`` runs (``folder/predicted`` and
    ``folder/target``, each a ``comparison.json``), as :func:`recipes.faithfulness_tables.table` makes it."""
    from recipes.faithfulness_tables import table

    parts = table(Path(folder)).split("\n\n")
    return "\n".join("{.numbers}\n" + part.rstrip("\n") + "\n" for part in parts)


def token_set_tables(scores: dict) -> dict[str, str]:
    """``recipes.measure_token_sets --output``'s scores as two tables: the seq2seq recipe's alignment accuracy per
    method (``alignment``), and the two-tower recipes' relevance shares on the known answer (``shares``)."""
    alignment = scores["seq2seq_alignment_accuracy"]
    methods = [m for m in alignment if m != "token_accuracy"]
    best = max(alignment[m] for m in methods)
    lines = ["{.numbers}", "| method | alignment accuracy ↑ |", "| --- | ---: |"]
    lines += [f"| {m} | " + (f"**{alignment[m]:.3f}**" if alignment[m] == best else f"{alignment[m]:.3f}") + " |"
              for m in methods]
    lines.append(f"\nThe model's own token accuracy on these samples: {alignment['token_accuracy']:.3f}.")
    columns = [(recipe, part) for recipe in ("dual_encoder", "coattention") for part in ("image", "text")]
    keys = {"image": "image_in_mask", "text": "text_on_content_words"}
    shares = ["{.numbers}", "| method | " + " | ".join(f"{r} {p} ↑" for r, p in columns) + " |",
              "| --- |" + " ---: |" * len(columns)]
    rows = [m for m in scores["dual_encoder_shares"]]
    tops = {c: max(scores[f"{c[0]}_shares"][m][keys[c[1]]] for m in rows if m != "uniform") for c in columns}
    for method in rows:
        cells = []
        for column in columns:
            value = scores[f"{column[0]}_shares"][method][keys[column[1]]]
            cells.append(f"**{value:.3f}**" if value == tops[column] and method != "uniform" else f"{value:.3f}")
        shares.append(f"| {method} | " + " | ".join(cells) + " |")
    return {"alignment": "\n".join(lines) + "\n", "shares": "\n".join(shares) + "\n"}


def subset_ranks_table(rows: Sequence[dict]) -> str:
    """``python -m benchmarks.subset_ranks --output``'s rows: the subset's scoring on one process and on several."""
    names = {"ddp": "DDP", "fsdp2": "FSDP2", "fsdp1": "FSDP1"}
    lines = ["{.numbers}", "| model | strategy | 1 process | N processes | wall-clock ratio | CPU ratio | same scores |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(rows, key=lambda r: (r["dim"], r["depth"], list(names).index(r["strategy"]), r["processes"])):
        one, many = r["one"], r["many"]
        lines.append(f"| ViT width {r['dim']}, {r['depth']} blocks | {names[r['strategy']]} | "
                     f"{one['seconds']:.2f} s wall, {one['cpu_seconds']:.2f} s CPU | "
                     f"{r['processes']}: {many['seconds']:.2f} s wall, {many['cpu_seconds']:.2f} s CPU | "
                     f"{many['seconds'] / one['seconds']:.2f} | {many['cpu_seconds'] / one['cpu_seconds']:.2f} | "
                     f"{'yes' if r['same_scores'] else 'no'} |")
    return "\n".join(lines) + "\n"


def sources() -> list[Path]:
    """Every committed result: the bench files, the recipes' compare folders and the token-set scores."""
    return [*sorted(RESULTS.glob("*.json")), *faithfulness_sources(), *sorted((RESULTS / "faithfulness").glob("*.json"))]


def faithfulness_sources() -> list[Path]:
    """The recipes' committed compare runs: ``results/faithfulness/<config>/``, each table beside it as ``<config>.md``."""
    return sorted(p for p in (RESULTS / "faithfulness").glob("*") if p.is_dir())


def render(source: Path) -> dict[Path, str]:
    """The tables of one result, by the file each is written to: a recipe's folder of compare runs makes
    ``<folder>.md``; a bench result ``NAME.json`` makes ``NAME.md`` (the model cases), ``NAME_flow.md`` (attention
    flow) and ``NAME_fit.md`` (the main job's fit), each where the run measured such cases."""
    source = Path(source)
    if source.is_dir():
        return {source.parent / f"{source.name}.md": faithfulness_table(source)}
    data = json.loads(source.read_text())
    if "shortcuts" in data:
        from recipes.measure_shortcuts import table

        return {source.with_suffix(".md"): table(data["shortcuts"])}
    if "subset_ranks" in data:
        return {source.with_suffix(".md"): subset_ranks_table(data["subset_ranks"])}
    if "results" not in data:
        return {source.with_name(f"{source.stem}_{part}.md"): text for part, text in token_set_tables(data).items()}
    rows = data["results"]
    kinds = {r["case"] for r in rows}
    made = {}
    if kinds & set(_CASES):
        made[source.with_suffix(".md")] = bench_table(rows)
    if "flow" in kinds:
        made[source.with_name(f"{source.stem}_flow.md")] = flow_table(rows)
    if "main_job" in kinds:
        made[source.with_name(f"{source.stem}_fit.md")] = fit_table(rows)
    return made


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="*", type=Path, help="result files (default: every one in docs/evidence/results)")
    args = parser.parse_args(argv)
    for source in args.sources or sources():
        for target, text in render(source).items():
            target.write_text(text)
            print(f"wrote {target}")


if __name__ == "__main__":
    main()
