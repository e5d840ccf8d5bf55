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
from dataclasses import fields
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


API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
API_MODULES = ["lightning_gae", "lightning_gae.methods", "lightning_gae.callbacks", "lightning_gae.metrics",
               "lightning_gae.modalities", "lightning_gae.modalities.regions", "lightning_gae.attribution",
               "lightning_gae.compare"]


def _autosummary_entries() -> list[tuple[str, str]]:
    """(module, name) of every autosummary entry of the API pages, under the ``currentmodule`` it is listed in."""
    entries = []
    for page in API_PAGES:
        module = None
        for line in page.read_text().splitlines():
            if found := re.match(r"^\.\. currentmodule:: ([\w.]+)$", line):
                module = found.group(1)
            elif found := re.match(r"^   (\w+)$", line):
                entries.append((module, found.group(1)))
    return entries


@pytest.mark.parametrize("module", API_MODULES)
def test_every_public_name_is_on_the_api_pages(module):
    pages = "\n".join(p.read_text() for p in API_PAGES)
    imported = importlib.import_module(module)
    # A module among the names (lightning_gae.metrics, metrics.functional) is documented on a page of its own.
    names = [n for n in imported.__all__ if not inspect.ismodule(getattr(imported, n))]
    # Listed in an autosummary, or, re-exported from another package, as an alias of this module pointing to it.
    missing = [name for name in names if not re.search(rf"^   {re.escape(name)}$", pages, re.M)
               and not re.search(rf"^\.\. py:\w+:: {re.escape(name)}\n   :module: {re.escape(module)}$", pages, re.M)]
    assert names
    assert missing == []


def test_the_api_reference_documents_each_object_once():
    objects: dict[int, str] = {}
    for module, name in _autosummary_entries():
        obj = getattr(importlib.import_module(module), name)
        if isinstance(obj, (int, float, str, tuple, frozenset)) or obj is None:  # constants may be equal by value
            continue
        assert id(obj) not in objects, f"{module}.{name} is {objects[id(obj)]}: document it once, alias the other"
        objects[id(obj)] = f"{module}.{name}"
    assert len(objects) > 50


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


# --- what the README and the guides say, against the code --------------------------------------------------------

README = ROOT / "README.md"
GUIDES = ROOT / "docs" / "guides"
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def _user_pages() -> dict[str, str]:
    """The README and every page of the site, by path (not the generated API pages or the included result tables)."""
    pages = [README, *(ROOT / "docs").rglob("*.md")]
    return {str(p.relative_to(ROOT)): p.read_text() for p in pages
            if not {"_build", "_api", "results"} & set(p.relative_to(ROOT).parts)}


def test_the_docs_name_every_option_group():
    from lightning_gae import options

    groups = options.__all__
    for path, text in _user_pages().items():
        for count in re.findall(r"\b(\w+) (?:option )?groups\b", text):
            if count in NUMBERS:
                assert NUMBERS[count] == len(groups), f"{path} says {count} groups; there are {len(groups)}: {groups}"
    for path in ("README.md", "docs/guides/callback.md"):
        named = [g for g in groups if f"{g}`" in _user_pages()[path]]  # `Name` or {class}`~path.Name`
        assert named == groups, f"{path} names {named} of the option groups {groups}"


def _quoted_methods(sentence: str) -> tuple[str, ...]:
    return tuple(re.findall(r'`"?(\w+)"?`', sentence))


def test_the_docs_list_the_methods_explain_accepts():
    from lightning_gae.methods import method_names

    accepted = method_names("attention", "lrp")
    guide = (GUIDES / "explain.md").read_text()
    sentence = re.search(r"^`method` is one of the methods that explain.*?(?=\n\n| Any other)", guide, re.M | re.S).group(0)
    listed = [m for m in _quoted_methods(sentence) if m not in ("method", "attention", "lrp")]
    assert tuple(listed) == accepted, f"docs/guides/explain.md lists {listed}; explain accepts {accepted}"
    readme = README.read_text()
    sentence = re.search(r"^`method=` takes the methods that explain tokens.*?\.(?= )", readme, re.M | re.S).group(0)
    listed = [m for m in _quoted_methods(sentence.split(":", 1)[1]) if m not in ("method",)]
    assert tuple(listed) == accepted, f"README.md lists {listed}; explain accepts {accepted}"


def test_the_stated_callback_overhead_is_the_measured_one():
    import json

    rows = json.loads((ROOT / "docs" / "evidence" / "results" / "bench_cpu.json").read_text())["results"]
    fits = {r["method"]: r["seconds"] for r in rows if r["case"] == "main_job"}
    measured = round((fits["fit_with_callback"] / fits["fit_without_callback"] - 1) * 100)
    stated = re.findall(r"adds (\d+)% to the fit", (GUIDES / "callback.md").read_text())
    assert stated == [str(measured)], f"docs/guides/callback.md states {stated}% for the callback; bench_cpu.json: {measured}%"
    assert "few percent to the fit" not in "\n".join(_user_pages().values())


def test_the_explain_signature_in_the_guide_is_the_functions():
    import lightning_gae

    def shown(p: inspect.Parameter) -> str:
        return p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}".replace("'", '"')

    actual = f"explain({', '.join(shown(p) for p in inspect.signature(lightning_gae.explain).parameters.values())})"
    stated = re.findall(r"^`(explain\(.*\))`:$", (GUIDES / "explain.md").read_text(), re.M)
    assert stated == [actual]
    for path in re.findall(r"`(lightning_gae/[\w/]+\.py)`", "\n".join(_user_pages().values())):
        assert (ROOT / path).exists(), f"the docs name {path}, which does not exist"


def test_the_cite_page_names_every_method():
    from lightning_gae.methods import method_names

    page = (ROOT / "docs" / "cite.md").read_text()
    table = page.split("```bibtex")[0]
    keys = set(re.findall(r"^@\w+\{(\w+),$", page, re.M))
    for method in method_names():
        assert f"`{method}`" in table, f"docs/cite.md does not say what to cite for {method}"
    cited = set(re.findall(r"`([a-z]+\d{4}\w*)`", table))
    assert cited and cited <= keys, f"docs/cite.md's table cites {sorted(cited - keys)} without a BibTeX entry"


# --- the screenshots: made by recipes/tensorboard_screenshots.py from the current dashboard ------------------------


def _manifest() -> dict:
    import json

    from recipes.tensorboard_screenshots import MANIFEST

    return json.loads(MANIFEST.read_text())


# Recipes whose picture was not remade from the current dashboard, with why: the only pictures the manifest may lack.
NOT_REMADE: dict[str, str] = {}


def test_every_screenshot_was_made_from_the_current_dashboard():
    from recipes.tensorboard_screenshots import EVERYTHING, RECIPES, dashboard_hash

    manifest = _manifest()
    jobs = manifest["jobs"]
    expected = ["main", *(name for name in RECIPES if name not in NOT_REMADE)]
    assert manifest["command"] == EVERYTHING and list(jobs) == expected, (
        f"recipes/figures/manifest.json lists {list(jobs)}, not {expected}: run `{EVERYTHING}`")
    stale = {name: job for name, job in jobs.items() if job["dashboard_sha256"] != dashboard_hash()}
    assert not stale, "the GAE tab's code ({}) changed after these pictures in recipes/figures were made: {}; commit " \
        "recipes/figures after remaking them".format(", ".join(jobs["main"]["dashboard_files"]), "; ".join(
            f"{', '.join(job['figures'])}: run `{job['command']}`" for job in stale.values()))


def test_the_screenshots_are_the_ones_the_manifest_lists():
    from recipes.tensorboard_screenshots import COMMAND, FIGURES, RECIPES, file_hash

    jobs = _manifest()["jobs"]
    assert jobs["main"]["command"] == COMMAND
    assert {name: job["command"] for name, job in jobs.items() if name != "main"} == {
        name: recipe.command(name) for name, recipe in RECIPES.items() if name not in NOT_REMADE}
    listed = {}
    for job in jobs.values():
        for name, digest in job["figures"].items():
            assert file_hash(FIGURES / name) == digest, f"recipes/figures/{name} is not the one `{job['command']}` made"
            listed[name] = job
    not_remade = {RECIPES[name].picture for name in NOT_REMADE}
    assert {p.name for p in FIGURES.glob("*.png")} == set(listed) | not_remade, "a picture in recipes/figures no command made"
    assert "tensorboard_gae_tab_crop.png" in jobs["main"]["figures"]
    assert all(recipe.picture in jobs[name]["figures"] for name, recipe in RECIPES.items() if name not in NOT_REMADE)


def test_the_callback_guide_quotes_the_fit_the_screenshots_show():
    summary = _manifest()["summary"]
    assert summary, "the main job's screenshots were made from a run given by hand: make them with --fit, which keeps its summary"
    guide = (GUIDES / "callback.md").read_text()
    for line in summary:
        assert line in guide, (f"docs/guides/callback.md's example summary lacks {line!r} of the fit the screenshots "
                               "show: paste that fit's table (recipes/figures/manifest.json, 'summary') into the example")


def test_the_arguments_table_has_every_argument_of_the_callback_and_its_groups():
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import arguments
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    from lightning_gae import options
    from lightning_gae.callbacks import GAECallback

    rows = arguments.argument_rows(GAECallback)
    assert [name for name, _, _ in rows] == [p for p in inspect.signature(GAECallback).parameters]
    assert dict((name, default) for name, default, _ in rows)["num_samples"] == "``8``"
    groups = arguments.option_groups(GAECallback)
    assert sorted(group.__name__ for _, group in groups) == sorted(options.__all__)
    for _, group in groups:
        assert [name for name, _, text in arguments.argument_rows(group) if text] == [f.name for f in fields(group)]
