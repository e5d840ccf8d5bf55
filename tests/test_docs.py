"""The documentation's checks that the Sphinx build does not make: doctests, error messages' anchors, README links.

The build itself (``sphinx-build -W``, nitpicky) runs in CI (``.ci/run``); it checks the links and anchors between
the pages. Here: the docstrings' examples run, every ``docs/<page>.md#<anchor>`` that the library's messages name
exists, and every relative link of the README points to a file of the repository.
"""

from __future__ import annotations

import doctest
import inspect
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lightning_gae"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


WITH_EXAMPLES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if ">>>" in p.read_text())


@pytest.mark.parametrize("module", WITH_EXAMPLES)
def test_docstring_examples_run(module):
    found = doctest.DocTestFinder().find(importlib.import_module(module))
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in found:
        runner.run(test)
    assert sum(len(t.examples) for t in found) > 0, f"{module} has '>>>' outside its docstrings"
    assert runner.failures == 0, f"{runner.failures} docstring example(s) of {module} failed (output above)"


def _anchors(page: Path) -> set[str]:
    """A page's explicit MyST targets, ``(name)=``, which Sphinx turns into the section's id."""
    return set(re.findall(r"^\(([\w-]+)\)=$", page.read_text(), re.M))


def test_error_messages_name_anchors_that_exist():
    named = {(page, anchor) for p in PACKAGE.rglob("*.py")
             for page, anchor in re.findall(r"docs/([\w/-]+\.md)#([\w-]+)", p.read_text())}
    assert named, "no message names a documentation anchor"
    for page, anchor in sorted(named):
        assert (ROOT / "docs" / page).exists(), f"docs/{page} does not exist"
        assert anchor in _anchors(ROOT / "docs" / page), f"docs/{page} has no anchor ({anchor})="


def test_no_message_points_to_the_readme_for_documentation():
    for p in PACKAGE.rglob("*.py"):
        assert "Known limits" not in p.read_text(), f"{p.relative_to(ROOT)} points to the README's old section"


def test_readme_links_point_to_files():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(((?!https?://)[^)#\s]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"


@pytest.mark.parametrize("module", ["lightning_gae", "lightning_gae.methods", "lightning_gae.callbacks", "lightning_gae.metrics",
                                    "lightning_gae.modalities",
                                    "lightning_gae.modalities.regions", "lightning_gae.attribution",
                                    "lightning_gae.compare"])
def test_every_public_name_is_on_the_api_page(module):
    import importlib

    page = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    imported = importlib.import_module(module)
    # A module among the names (lightning_gae.metrics, metrics.functional) is documented on a page of its own.
    names = [n for n in imported.__all__ if not inspect.ismodule(getattr(imported, n))]
    missing = [name for name in names if not re.search(rf"^   {re.escape(name)}$", page, re.M)]
    assert names
    assert missing == []


def test_result_tables_are_what_their_generator_makes_of_the_committed_results():
    from benchmarks import tables

    assert tables.faithfulness_sources(), f"no result files in {tables.RESULTS}"
    made = {}
    for source in tables.sources():
        made |= tables.render(source)
    for table, text in made.items():
        assert table.exists() and table.read_text() == text, (
            f"{table.relative_to(ROOT)} differs from what its results make: run `python -m benchmarks.tables`")
    assert made


def test_every_result_table_is_on_a_page():
    from benchmarks import tables

    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md") if tables.RESULTS not in p.parents)
    for table in tables.RESULTS.rglob("*.md"):
        assert re.search(r"```\{include\} [\w./]*" + re.escape(table.name), pages), f"no page includes {table.name}"


def test_the_table_generator_divides_by_the_training_step_of_the_same_setting():
    from benchmarks import tables

    rows = [{"case": c, "method": m, "batch": b, "tokens": n, "seconds": s, "peak_memory_mb": mb}
            for c, m, b, n, s, mb in [("bert", "forward_backward", 2, 2, 0.5, 1024.0), ("bert", "gae", 2, 2, 0.25, 512.0),
                                      ("bert", "forward_backward", 1, 2, 1.0, 2048.0), ("bert", "gae", 1, 2, 3.0, 2048.0),
                                      ("vit", "forward_backward", 2, 2, 2.0, 1024.0), ("vit", "saliency", 2, 2, 1.0, 256.0)]]
    lines = tables.bench_table(rows).splitlines()
    assert lines[0] == "{.numbers}"
    assert lines[1] == "| model | batch | N | training step | `gae` | `saliency` |"
    # Batch == tokens in the first row: the columns must still come from the right keys.
    assert lines[3:] == ["| ViT | 2 | 2 | 2 s / 1.0 GiB | - | 0.50x / 0.25x |",
                         "| BERT | 1 | 2 | 1 s / 2.0 GiB | 3.00x / 1.00x | - |",
                         "| BERT | 2 | 2 | 500 ms / 1.0 GiB | 0.50x / 0.50x | - |"]
    with pytest.raises(ValueError, match="no forward_backward row"):
        tables.bench_table(rows[1:2])


def test_the_flow_and_fit_tables_divide_the_right_rows():
    from benchmarks import tables

    rows = [{"case": "flow", "method": m, "batch": 1, "tokens": n, "seconds": s, "peak_memory_mb": 1.0}
            for n, m, s in [(17, "attention_flow", 0.5), (17, "gae", 0.25), (17, "rollout", 0.1),
                            (65, "attention_flow", 4.0), (65, "gae", 0.5), (65, "rollout", 2.0)]]
    rows += [{"case": "main_job", "method": m, "batch": 17, "tokens": 17, "seconds": s, "cpu_seconds": c,
              "peak_memory_mb": 1.0} for m, s, c in [("fit_without_callback", 20.0, 40.0), ("fit_with_callback", 22.0, 42.0)]]
    assert tables.flow_table(rows).splitlines()[3:] == ["| 17 | 500 ms | 2.0x | 5.0x |", "| 65 | 4 s | 8.0x | 2.0x |"]
    assert tables.fit_table(rows).splitlines()[3] == "| 20 s | 22 s | 1.10x | 1.05x |"


def test_the_subset_ranks_and_token_set_tables_read_their_own_keys():
    from benchmarks import tables

    row = {"dim": 64, "depth": 4, "strategy": "ddp", "processes": 2, "repeats": 3, "same_scores": True,
           "one": {"seconds": 2.0, "cpu_seconds": 1.0}, "many": {"seconds": 1.0, "cpu_seconds": 0.75}}
    assert tables.subset_ranks_table([row]).splitlines()[3] == (
        "| ViT width 64, 4 blocks | DDP | 2.00 s wall, 1.00 s CPU | 2: 1.00 s wall, 0.75 s CPU | 0.50 | 0.75 | yes |")
    shares = {"gae": {"image_in_mask": 0.5, "text_on_content_words": 0.25},
              "uniform": {"image_in_mask": 0.75, "text_on_content_words": 0.125}}
    made = tables.token_set_tables({"seq2seq_alignment_accuracy": {"gae": 0.9, "rollout": 0.8, "token_accuracy": 1.0},
                                    "dual_encoder_shares": shares, "coattention_shares": shares})
    assert made["alignment"].splitlines()[3:5] == ["| gae | **0.900** |", "| rollout | 0.800 |"]
    # The uniform floor is never bold, even where it is the largest value.
    assert made["shares"].splitlines()[3:] == ["| gae | **0.500** | **0.250** | **0.500** | **0.250** |",
                                               "| uniform | 0.750 | 0.125 | 0.750 | 0.125 |"]
