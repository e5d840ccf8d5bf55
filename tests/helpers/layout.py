"""Reads a copy of the package as text (ast) and reports what breaks its layout: reaches into another module's
private names in any form, import cycles, imports inside functions, imports against the layers' order.

Everything takes the package's folder, so that the layout test can run the same checks on a temporary copy with a
probe module in it and see them fire.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

# Modules that may import inside a function, and why.
LAZY_IMPORTS = {
    "lightning_gae.cli.compare_command": "the command imports torch and Lightning only for the subcommand it runs, so "
                                         "that `lightning-gae --help` answers at once",
    "lightning_gae.cli.lightning_commands": "the same, for fit, validate, test and predict",
    "lightning_gae.engine.lean": "Triton's import takes seconds and only a backward that opted into the kernel needs it",
}

# The layers of the data flow, lowest first: a module imports from its own layer or lower ones, never higher.
# A name is a module or a package prefix; the longest prefix that matches a module decides its layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    # batch plumbing and the drawing primitives (display's figures, panels and colour maps): they import nothing of
    # the package but each other
    ("lightning_gae._structures", "lightning_gae.display"),
    # the engine: capture, token sets, rules, readout and the recorded forward every attention method shares
    ("lightning_gae.engine",),
    # the LRP methods' own forward and backward, on the engine's readout
    ("lightning_gae.lrp",),
    # the methods: one file each and the registry, and explain(), which runs them by their facts
    ("lightning_gae.methods",),
    # what a token is in the input (each modality maps, removes and draws its own, with display's primitives), and
    # language models
    ("lightning_gae.modalities", "lightning_gae.language"),
    # what scores explanations through a modality, and the Captum classes
    ("lightning_gae.metrics", "lightning_gae.attribution"),
    # the one scoring pipeline compare and the callback share: methods x metrics x ground truth x regions
    ("lightning_gae.evaluation",),
    # consumers that compare, and the options they share with the callback
    ("lightning_gae.compare", "lightning_gae.options"),
    # the faces: TensorBoard (its views lay out what the modalities draw), the callback, the command, the package's
    # own re-exports
    ("lightning_gae.tensorboard", "lightning_gae.callbacks", "lightning_gae.cli", "lightning_gae"),
)


def module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path) -> dict[str, Path]:
    return {module_name(package, p): p for p in sorted(package.rglob("*.py"))}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, module and class variables, attributes it sets."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return {n for n in found if _is_private(n)}


def _module_aliases(tree: ast.AST, known: set[str]) -> dict[str, str]:
    """Local name -> package module, for every way a module object of the package is bound to a name."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lightning_gae"):
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "lightning_gae"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_gae"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    aliases[alias.asname or alias.name] = full
    return aliases


def private_reaches(package: Path, paired: dict[str, str] | None = None) -> dict[str, list[str]]:
    """``module -> ["<how>: <name>", ...]`` for every private name of another module of the package it touches.

    The forms: ``from lightning_gae.x import _name``; ``x._name`` where ``x`` is a module of the package however it
    was imported (``import lightning_gae.x as x``, ``from lightning_gae import x``, ``from lightning_gae.p import x``);
    ``sys.modules[...]`` and ``importlib.import_module(...)`` naming the package; ``getattr(obj, "_name")`` and
    ``obj._name`` where ``_name`` is defined by another module of the package and not by this one (a private
    attribute of another module's object). ``paired``: module -> the one other module whose privates it may use
    (a metric class and its functional twin).
    """
    paired = paired or {}
    mods = modules(package)
    trees = {name: ast.parse(path.read_text()) for name, path in mods.items()}
    defined = {name: _defined_privates(tree) for name, tree in trees.items()}
    offences: dict[str, list[str]] = {}
    for name, tree in trees.items():
        own = defined[name] | defined.get(paired.get(name, ""), set())
        elsewhere = set().union(*(d for other, d in defined.items() if other != name)) - own
        aliases = _module_aliases(tree, set(mods))
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_gae"):
                if node.module != name and paired.get(name) != node.module:
                    found += [f"import: {node.module}.{a.name}" for a in node.names if _is_private(a.name)]
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and base.id in aliases and aliases[base.id] != name:
                    found.append(f"module attribute: {aliases[base.id]}.{node.attr}")
                elif node.attr in elsewhere:
                    found.append(f"attribute of another module's object: {ast.unparse(node)}")
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
                key = node.slice
                if isinstance(key, ast.Constant) and str(key.value).startswith("lightning_gae"):
                    found.append(f"sys.modules: {key.value}")
            elif isinstance(node, ast.Call):
                func = ast.unparse(node.func)
                consts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if func in ("importlib.import_module", "import_module", "__import__", "sys.modules.get"):
                    found += [f"{func}: {c}" for c in consts if c.startswith("lightning_gae")]
                elif func in ("getattr", "setattr", "hasattr") and len(node.args) > 1 and node.args[1] is not None:
                    attr = node.args[1]
                    if isinstance(attr, ast.Constant) and isinstance(attr.value, str) and attr.value in elsewhere:
                        found.append(f"{func}: {attr.value}")
        if found:
            offences[name] = found
    return offences


def _top_level_imports(tree: ast.Module) -> Iterator[ast.stmt]:
    """Import statements a module runs when it is imported (module level, also inside if/try blocks)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    stack.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])


def imports(package: Path, in_functions: bool = False) -> dict[str, set[str]]:
    """``module -> the package's modules it imports when imported`` (``from p import x``: ``p.x`` when ``x`` is a
    module, else ``p`` itself, whose ``__init__`` runs); ``in_functions``: also those imported inside functions."""
    mods = modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges = set()
        tree = ast.parse(path.read_text())
        found = ([n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] if in_functions
                 else _top_level_imports(tree))
        for node in found:
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in mods}
            elif node.module and node.module.startswith("lightning_gae"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    edges.add(full if full in mods else node.module)
        graph[name] = {e for e in edges if e != name}
    return graph


def folders(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the package's folders (a top-level module is a folder of its own): an edge where some
    module of one imports some module of another."""
    def folder(module: str) -> str:
        return ".".join(module.split(".")[:2])

    found: dict[str, set[str]] = {}
    for module, imported in graph.items():
        found.setdefault(folder(module), set()).update(folder(m) for m in imported if folder(m) != folder(module))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, as the modules on it (Tarjan's strongly connected components of size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def function_imports(package: Path) -> dict[str, list[str]]:
    """``module -> package modules it imports inside a function or class body`` (what hides a cycle)."""
    found: dict[str, list[str]] = {}
    for name, path in modules(package).items():
        tree = ast.parse(path.read_text())
        top = set(map(id, _top_level_imports(tree)))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                hidden = [n for n in names if n.startswith("lightning_gae")]
                if hidden:
                    found.setdefault(name, []).extend(hidden)
    return found


# The package's own modalities: code outside lightning_gae/modalities/ asks a modality (its methods), never which one it is.
CONCRETE_MODALITIES = ("ImageTokens", "TextTokens", "TabularTokens")


def _names(node: ast.AST) -> set[str]:
    """The names a class test mentions: ``A``, ``m.A``, ``(A, B)``."""
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _is_type_of(node: ast.AST) -> bool:
    """``type(x)`` or ``x.__class__``."""
    return ((isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
             and len(node.args) == 1) or (isinstance(node, ast.Attribute) and node.attr == "__class__"))


def _annotations(tree: ast.AST) -> set[int]:
    """The ids of every node inside an annotation (a parameter's, a return's, a variable's)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def _looked_up_class(node: ast.AST) -> bool:
    """A class test's class read from data: ``TABLE[key]``, ``entry.modality``, ``modality_class`` (or in a tuple)."""
    if isinstance(node, ast.Tuple):
        return any(_looked_up_class(e) for e in node.elts)
    if isinstance(node, ast.Subscript):
        return True
    # A value (lower case), not a class such as Modality itself.
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name[:1].islower() and "modalit" in name


def modality_switches(package: Path, allowed: str = "modalities") -> dict[str, list[str]]:
    """``module -> ["<line>: <code>", ...]`` for every test of a value against a concrete modality class outside the
    ``allowed`` folder: ``isinstance``/``issubclass`` naming one, ``type(x) is/== ImageTokens``, ``x.__class__ ...``,
    and ``match`` cases ``ImageTokens()``; a class test whose class comes from a table (``isinstance(m, TABLE[key])``,
    ``isinstance(m, entry.modality)``); and the tables themselves: a concrete modality class as a value (in a tuple, a
    dict, an argument, an assignment) rather than built (``ImageTokens(...)``), asked (``ImageTokens.infer``) or named
    in an annotation."""
    found: dict[str, list[str]] = {}
    for name, path in modules(package).items():
        if name.startswith(f"{package.name}.{allowed}"):
            continue
        tree = ast.parse(path.read_text())
        annotated = _annotations(tree)
        # A class name that is called or whose attribute is read is used, not held.
        used = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        used |= {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        tested: set[int] = set()
        hits = []
        for node in ast.walk(tree):
            names: set[str] = set()
            looked_up = False
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
                names = _names(node.args[1])
                looked_up = _looked_up_class(node.args[1])
                tested |= {id(n) for n in ast.walk(node.args[1])}
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_type_of(side) for side in sides):
                    names = set().union(*(_names(side) for side in sides))
                    tested |= {id(n) for side in sides for n in ast.walk(side)}
            elif isinstance(node, ast.MatchClass):
                names = _names(node.cls)
                tested |= {id(n) for n in ast.walk(node.cls)}
            if names & set(CONCRETE_MODALITIES) or looked_up:
                hits.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
                continue
            held = node.id if isinstance(node, ast.Name) else node.attr
            if held in CONCRETE_MODALITIES and id(node) not in annotated | used | tested:
                hits.append((node.lineno, f"{node.lineno}: the class {held} as a value"))
        if hits:
            found[name] = [hit for _, hit in sorted(hits)]
    return found


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), i
    if layer < 0:
        raise ValueError(f"{module} is in no layer of tests/helpers/layout.py's LAYERS: add it where it belongs")
    return layer


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``"a -> b"`` for every import of a higher layer's module by a lower layer's."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a))


def _private_path(dotted: str) -> bool:
    """``lightning_gae.a._b.c``: a dotted name of the package with a private part."""
    return dotted.startswith("lightning_gae") and any(_is_private(part) for part in dotted.split("."))


def outside_reaches(package: Path, folders: Iterable[Path]) -> dict[str, list[str]]:
    """``file -> ["<how>: <name>", ...]`` for every private module or name of the package that a file of ``folders``
    (the repository's tests, recipes and benchmarks) imports, in any form: ``import lightning_gae.x._y``,
    ``from lightning_gae.x._y import z``, ``from lightning_gae.x import _y`` (a private module or name),
    ``x._name``, ``getattr(x, "_name")`` and ``monkeypatch.setattr(x, "_name", ...)`` where ``x`` is a module of the
    package however it was imported, ``importlib.import_module(...)`` and ``sys.modules[...]`` naming one. Files are named relative to the folder that holds the package."""
    known = set(modules(package))
    found: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text())
            aliases = _module_aliases(tree, known)
            hits = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    hits += [f"import: {a.name}" for a in node.names if _private_path(a.name)]
                elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_gae"):
                    if _private_path(node.module):
                        hits.append(f"import: {node.module}")
                    else:
                        hits += [f"import: {node.module}.{a.name}" for a in node.names if _is_private(a.name)]
                elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                    base = node.value
                    if isinstance(base, ast.Name) and base.id in aliases:
                        hits.append(f"module attribute: {aliases[base.id]}.{node.attr}")
                    elif ast.unparse(base) in known:
                        hits.append(f"module attribute: {ast.unparse(node)}")
                elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
                    key = node.slice
                    if isinstance(key, ast.Constant) and _private_path(str(key.value)):
                        hits.append(f"sys.modules: {key.value}")
                elif isinstance(node, ast.Call):
                    func = ast.unparse(node.func)
                    if func in ("importlib.import_module", "import_module", "__import__", "sys.modules.get"):
                        hits += [f"{func}: {a.value}" for a in node.args
                                 if isinstance(a, ast.Constant) and isinstance(a.value, str) and _private_path(a.value)]
                    elif func.split(".")[-1] in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1:
                        owner, attr = node.args[0], node.args[1]
                        if (isinstance(owner, ast.Name) and owner.id in aliases and isinstance(attr, ast.Constant)
                                and isinstance(attr.value, str) and _is_private(attr.value)):
                            hits.append(f"{func}: {aliases[owner.id]}.{attr.value}")
            if hits:
                found[str(path.relative_to(package.parent))] = hits
    return found


def long_functions(package: Path, limit: int) -> dict[str, int]:
    """``"path:Class.function" -> lines`` for every function of the package longer than ``limit`` lines, from its
    ``def`` to its last line (docstring and comments included; decorators not); ``path`` relative to the folder that
    holds the package."""
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = f"{prefix}{child.name}" if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.ClassDef)) else prefix.rstrip(".")
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[f"{path.relative_to(package.parent)}:{name}"] = lines
                stack.append((child, f"{name}." if name else ""))
    return found
