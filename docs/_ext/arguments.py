"""``{arguments}``: a table of a callable's arguments and their defaults, written from the code when the site is built.

``.. arguments:: lightning_gae.callbacks.GAECallback`` reads the signature (``inspect.signature``) for the names and
defaults and the docstring's Google-style ``Args:`` section for what each one does, so the table cannot drift
from the code. With ``:groups:``, every argument whose type is a dataclass (the option groups) gets a table of its
own below, from the dataclass's fields and its own ``Args:`` section. An argument the docstring does not describe
fails the build.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective


def _object(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def documented_arguments(obj: Any) -> dict[str, str]:
    """The ``Args:`` section of ``obj``'s docstring: argument -> its text (continuation lines joined)."""
    found: dict[str, list[str]] = {}
    lines = inspect.getdoc(obj).splitlines() if inspect.getdoc(obj) else []
    inside, current, indent = False, None, None
    for line in lines:
        if line.strip() == "Args:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the next section (Raises:, Example:, ...)
            break
        entry = re.match(r"^( +)(\*{0,2}\w+)(?: \(.*?\))?: (.*)$", line)
        if entry and (indent is None or len(entry.group(1)) == indent):
            indent, current = len(entry.group(1)), entry.group(2)
            found[current] = [entry.group(3)]
        elif current is not None and line.strip():
            found[current].append(line.strip())
    return {name: " ".join(text) for name, text in found.items()}


def _default(value: Any) -> str:
    return "required" if value is inspect.Parameter.empty else f"``{value!r}``"


def argument_rows(obj: Any) -> list[tuple[str, str, str]]:
    """(name, default, what it does) for every argument of ``obj`` (a dataclass: its fields), in order."""
    texts = documented_arguments(obj)
    if dataclasses.is_dataclass(obj):
        defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
                             else f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty)
                    for f in dataclasses.fields(obj)}
    else:
        defaults = {p.name: p.default for p in inspect.signature(obj).parameters.values() if p.name != "self"}
    missing = [name for name in defaults if name not in texts]
    if missing:
        raise ExtensionError(f"{obj.__qualname__}'s docstring describes no {missing} under Args:")
    return [(name, _default(default), texts[name]) for name, default in defaults.items()]


def option_groups(obj: Any) -> list[tuple[str, type]]:
    """(argument, dataclass) for each argument of ``obj`` whose type is a dataclass or None."""
    hints = typing.get_type_hints(obj.__init__ if inspect.isclass(obj) else obj)
    groups = []
    for name, hint in hints.items():
        kinds = [k for k in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(k)]
        if kinds:
            groups.append((name, kinds[0]))
    return groups


def _table(obj: Any, groups: frozenset[str] = frozenset()) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 20 20 60", "",
             "   * - argument", "     - default", "     - what it does"]
    for name, default, text in argument_rows(obj):
        if name in groups and default == "``None``":
            default = "``None``: the group's defaults, below"
        lines += [f"   * - ``{name}``", f"     - {default}", f"     - {text}"]
    return lines + [""]


class Arguments(SphinxDirective):
    required_arguments = 1
    option_spec = {"groups": directives.flag}

    def run(self) -> list[nodes.Node]:
        obj = _object(self.arguments[0])
        lines = [f".. currentmodule:: {self.arguments[0].rpartition('.')[0]}", ""]  # the docstrings' short references
        groups = option_groups(obj) if "groups" in self.options else []
        lines += _table(obj, frozenset(argument for argument, _ in groups))
        for argument, group in groups:
            lines += [f".. rubric:: ``{argument}=``: :class:`~{group.__module__}.{group.__qualname__}`", ""]
            lines += _table(group)
        container = nodes.container(classes=["arguments"])
        self.state.nested_parse(StringList(lines, source=self.arguments[0]), self.content_offset, container)
        return [container]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("arguments", Arguments)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
