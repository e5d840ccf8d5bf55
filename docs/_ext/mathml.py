"""Maths as MathML written at build time: the pages render formulas with no script and no network.

Sphinx's default renderer, MathJax, is a script fetched from a CDN when the page opens; offline, a reader sees the raw
TeX. Here each ``:math:`` role and ``.. math::`` block is converted once, while the site is built, by
``latex2mathml`` (the ``docs`` extra), into MathML that browsers draw themselves (MathML Core: Chromium 109+,
Firefox, Safari). Selected in ``conf.py`` by ``html_math_renderer = "mathml"``.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util.math import get_node_equation_number


# latex2mathml's choices that common fonts cannot draw, replaced by the character TeX's own fonts use: \setminus as
# U+29F5 (reverse solidus operator, a box in DejaVu and Liberation) is U+2216 (set minus), an operator.
SUBSTITUTIONS = {"<mi>&#x029F5;</mi>": "<mo>&#x02216;</mo>", "<mo>&#x029F5;</mo>": "<mo>&#x02216;</mo>"}


def _mathml(latex: str, display: bool) -> str:
    try:
        mathml = convert(latex, display="block" if display else "inline")
    except Exception as error:  # a formula latex2mathml cannot read: fail the build, naming it
        raise ExtensionError(f"cannot convert {latex!r} to MathML: {error}") from error
    for found, replacement in SUBSTITUTIONS.items():
        mathml = mathml.replace(found, replacement)
    return mathml


def visit_math(self: Any, node: nodes.math) -> None:
    self.body.append(self.starttag(node, "span", "", CLASS="math notranslate"))
    self.body.append(_mathml(node.astext(), display=False))
    self.body.append("</span>")
    raise nodes.SkipNode


def visit_displaymath(self: Any, node: nodes.math_block) -> None:
    self.body.append(self.starttag(node, "div", CLASS="math notranslate"))
    if node.get("number"):
        self.body.append(f'<span class="eqno">({get_node_equation_number(self, node)})</span>')
    # Paragraphs of a ``.. math::`` block are equations of their own, one under the other.
    for part in (p for p in node.astext().split("\n\n") if p.strip()):
        self.body.append(_mathml(part, display=True))
    self.body.append("</div>\n")
    raise nodes.SkipNode


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_html_math_renderer("mathml", inline_renderers=(visit_math, None), block_renderers=(visit_displaymath, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
