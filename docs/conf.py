"""Sphinx configuration of the lightning-gae documentation (Markdown pages through MyST, the API from docstrings).

Intersphinx: the inventories of Python, PyTorch, Lightning, torchmetrics and Captum are read only when the
environment sets ``LIGHTNING_GAE_DOCS_ONLINE=1`` (a build for publishing). Without it the build runs offline,
as CI's does: no inventory is fetched and references to those packages' names render as code without a link
(``nitpick_ignore_regex`` below), while ``nitpicky`` still fails the build (``-W``) on every unresolved reference
to this package's own public names. See the contributing page.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's lightning_gae and recipes/, also without an editable install
sys.path.insert(0, str(ROOT / "docs" / "_ext"))  # this site's own extensions

import lightning_gae  # noqa: E402

project = "lightning-gae"
author = "The lightning-gae authors"
copyright = "2026, the lightning-gae authors"
release = version = lightning_gae.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "mathml",  # docs/_ext/mathml.py: formulas as MathML written at build time, no script, no network
    "arguments",  # docs/_ext/arguments.py: GAECallback's arguments and defaults, read from the code
]
html_math_renderer = "mathml"
# The copy button copies the commands and code, not the prompts of shell sessions and doctests.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store", "evidence/results"]  # tables the pages include
templates_path = ["_templates"]

myst_enable_extensions = ["dollarmath", "colon_fence", "deflist", "attrs_block"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked by the build

autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

nitpicky = True
# Names outside this package: linked through intersphinx when online, plain code when offline.
EXTERNAL = [
    r"torch(\..*)?", r"lightning(\..*)?", r"pytorch_lightning(\..*)?", r"torchmetrics(\..*)?", r"captum(\..*)?",
    r"transformers(\..*)?", r"numpy(\..*)?", r"np\..*", r"matplotlib(\..*)?", r"PIL(\..*)?", r"scipy(\..*)?",
    r"jsonargparse(\..*)?", r"tensorboard(\..*)?", r"collections\.abc\..*", r"typing(_extensions)?\..*",
    r"contextlib\..*", r"enum\..*", r"dataclasses\..*", r"pathlib\..*", r"os\..*", r"logging\..*",
    r"Tensor", r"nn\..*", r"Module", r"Path", r"LightningModule", r"Trainer", r"Callback", r"Metric",
    r"(int|float|str|bool|bytes|dict|list|tuple|set|type|object|callable|Callable|Any|Sequence|Mapping|Iterable|"
    r"Iterator|Literal|Self|None|NoneType|Exception|ValueError|TypeError|RuntimeError|UserWarning|"
    r"Optional|Union|Generator|ContextManager|TracebackType|slice|range|frozenset|complex)",
]
# This package's own names that are not pages of the API reference: private bases (show-inheritance), type
# aliases of signatures, and modules below the public ones (engine/, lrp/, language/, display/, ...), which
# docstrings name to say where something lives.
INTERNAL = [
    r"lightning_gae\..*\._\w+.*", r"lightning_gae\.(engine|lrp|language|display|modalities|tensorboard)(\..*)?",
    r"lightning_gae\.attribution\.(attention|gradients)", r"lightning_gae\.metrics\.functional\..*",
    r"Query", r"InterpolateMode", r"Score", r"AnswerRows", r"PROTOCOLS", r"ATTENTION_FLOW_MAX_SECONDS",
    r"MetricSource", r"SetScorers",
    r"abc\.ABC",
]
ONLINE = os.environ.get("LIGHTNING_GAE_DOCS_ONLINE") == "1"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
    "torch": ("https://docs.pytorch.org/docs/stable", None),
    "lightning": ("https://lightning.ai/docs/pytorch/stable", None),
    "torchmetrics": ("https://lightning.ai/docs/torchmetrics/stable", None),
    "captum": ("https://captum.ai/api", None),
} if ONLINE else {}
# Intersphinx resolves what its inventories hold before this list is consulted, so online the external names link
# and only those the inventories lack stay plain; offline all of them do.
nitpick_ignore_regex = [(kind, name) for kind in ("py:class", "py:obj", "py:func", "py:meth", "py:mod", "py:data",
                                                  "py:attr", "py:exc") for name in EXTERNAL + INTERNAL]

html_theme = "furo"
html_title = f"lightning-gae {release}"
html_static_path = ["_static"]
# The pictures of recipes/figures at the site's root, full size, for the links from their crops (the index's).
html_extra_path = ["../recipes/figures"]
html_css_files = ["tables.css"]


def _attribute_docstring(app, what, name, obj, options, lines):
    """A constant re-exported by a package (``lightning_gae.METHODS``) gets the docstring written where it is defined.

    autodoc reads an attribute's docstring from the module it is documented under; for a re-exported one it
    finds none there and falls back to the docstring of the value's type (``tuple``, ``dict``).
    """
    if what != "data" or lines != (type(obj).__doc__ or "").splitlines()[: len(lines)]:
        return
    from sphinx.pycode import ModuleAnalyzer

    attribute = name.rsplit(".", 1)[1]
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("lightning_gae") or getattr(module, attribute, None) is not obj:
            continue
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except Exception:  # a module without source
            continue
        if ("", attribute) in docs:
            lines[:] = list(docs[("", attribute)])
            return


# Methods a framework calls, whose contract is the framework's: Lightning's hooks on the callback, and a metric's
# update/compute, which each metric's own docstring describes in its "Update" and "Compute" sections.
_FRAMEWORK_METHODS = {"setup", "teardown", "state_dict", "load_state_dict", "state_key", "update", "compute"}


def _skip_framework_methods(app, what, name, obj, skip, options):
    if what == "class" and (name in _FRAMEWORK_METHODS or name.startswith("on_")) and not getattr(obj, "__doc__", None):
        return True
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _attribute_docstring)
    app.connect("autodoc-skip-member", _skip_framework_methods)
