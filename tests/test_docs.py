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


@pytest.mark.parametrize("module", ["lightning_gae", "lightning_gae.callbacks", "lightning_gae.metrics",
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

    sources = sorted(tables.RESULTS.glob("*.json"))
    assert sources and tables.faithfulness_sources(), f"no result files in {tables.RESULTS}"
    for source in [*sources, *tables.faithfulness_sources()]:
        table = source.with_suffix(".md") if source.is_file() else source.parent / f"{source.name}.md"
        assert table.exists() and table.read_text() == tables.render(source), (
            f"{table.relative_to(ROOT)} differs from what its results make: run `python -m benchmarks.tables`")


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
    assert lines[3:] == ["| ViT | 2 | 2 | 2000 ms / 1.0 GiB | - | 0.50x / 0.25x |",
                         "| BERT | 1 | 2 | 1000 ms / 2.0 GiB | 3.00x / 1.00x | - |",
                         "| BERT | 2 | 2 | 500 ms / 1.0 GiB | 0.50x / 0.50x | - |"]
    with pytest.raises(ValueError, match="no forward_backward row"):
        tables.bench_table(rows[1:2])
