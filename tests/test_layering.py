"""The import structure of both packages, read with ``ast`` and checked against the layers docs/design.md draws.

Every ``import`` counts, also those inside functions: a lazy import hides a dependency from the reader, not from
the design. Imports under ``if TYPE_CHECKING:`` are annotations only and do not count.
"""
from __future__ import annotations

import ast
import pathlib
import re
from typing import Dict, List, Set

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"tether": ROOT / "src" / "tether", "tether_rpc": ROOT / "rpc_server" / "tether_rpc"}
DEVICE_ALLOWED = {"numpy", "msgpack"}  # besides the standard library


def _module_files() -> Dict[str, pathlib.Path]:
    modules = {}
    for top, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([top] + parts)] = path
    return modules


MODULES = _module_files()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(module: str, tree: ast.AST, is_package: bool) -> Set[str]:
    """Absolute names of everything ``module`` imports (``from x import y`` yields ``x.y`` if that is a module)."""
    names: Set[str] = set()
    skip: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                # `from pkg import sub` depends on the submodule; `from mod import name` on the module
                names.add(stem + "." + alias.name if (stem + "." + alias.name) in MODULES else stem)
    return names


def _resolve(name: str) -> str | None:
    """The most specific module of ours that ``name`` denotes, or None for a third-party or stdlib name."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {_resolve(n) for n in _imported_names(module, tree, path.name == "__init__.py")}
        graph[module] = {t for t in targets if t and t != module}
    return graph


GRAPH = _graph()


def _layers() -> List[List[str]]:
    """The ```layers block of docs/design.md: one line per layer, lowest first, each a list of module prefixes."""
    text = (ROOT / "docs" / "design.md").read_text()
    match = re.search(r"```layers\n(.*?)```", text, re.S)
    assert match, "docs/design.md has no ```layers block"
    layers = []
    for line in match.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            layers.append(line.split())
    return layers


LAYERS = _layers()


def _place(module: str) -> tuple:
    """(layer index, entry) of the longest layer entry that is ``module`` or a package containing it."""
    best = None
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            # a top-level package (``tether``, ``tether_rpc``) names its __init__ only, so that no module falls
            # into the facade's layer by default
            if module == entry or ("." in entry and module.startswith(entry + ".")):
                if best is None or len(entry) > len(best[1]):
                    best = (index, entry)
    return best


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _place(m) is None)
    assert not missing, "modules with no layer in docs/design.md's ```layers block: %s" % ", ".join(missing)


def test_layer_entries_name_real_modules():
    stale = sorted(e for entries in LAYERS for e in entries if e not in MODULES)
    assert not stale, "docs/design.md's ```layers block names modules that do not exist: %s" % ", ".join(stale)


def test_imports_follow_the_layers():
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        here = _place(module)
        for target in sorted(targets):
            there = _place(target)
            if here is None or there is None or there[1] == here[1]:
                continue  # inside one entry only cycles are checked (below)
            if module.startswith(target + ".") and MODULES[target].name == "__init__.py":
                continue  # a package's own __init__ is part of it
            if there[0] >= here[0]:
                wrong.append("%s (layer %d, %s) imports %s (layer %d, %s)"
                             % (module, here[0], here[1], target, there[0], there[1]))
    assert not wrong, "imports against the direction docs/design.md draws:\n  " + "\n  ".join(wrong)


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _package_edges(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """Drop the edges from a package's __init__ to its own submodules: re-exporting is not a dependency cycle."""
    out = {}
    for module, targets in graph.items():
        is_pkg = MODULES[module].name == "__init__.py"
        out[module] = {t for t in targets if not (is_pkg and t.startswith(module + "."))}
    return out


def test_no_import_cycles():
    cycles = _cycles(_package_edges(GRAPH))
    assert not cycles, "import cycles between modules:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_the_device_package_imports_only_stdlib_numpy_msgpack():
    import sys
    stdlib = set(sys.stdlib_module_names)
    wrong = []
    for module, path in MODULES.items():
        if not module.startswith("tether_rpc"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for name in _imported_names(module, tree, path.name == "__init__.py"):
            top = name.split(".")[0]
            if top in ("", "tether_rpc", "__future__") or top in stdlib or top in DEVICE_ALLOWED:
                continue
            wrong.append("%s imports %s" % (module, name))
    assert not wrong, "the device package must need only stdlib + numpy + msgpack:\n  " + "\n  ".join(sorted(wrong))


@pytest.mark.parametrize("name", ["tether.tir", "tether.codegen"])
def test_compiler_lower_layers_never_import_te(name):
    users = sorted(m for m, targets in GRAPH.items() if (m == name or m.startswith(name + "."))
                   and any(t == "tether.te" or t.startswith("tether.te.") for t in targets))
    assert not users, "%s must not import tether.te (te lowers to tir; codegen reads tir only): %s" % (name, users)
