"""ARCHITECTURE.md and the shape of the tree, checked on the code.

The import graph is read statically (``ast`` for the Python modules, the ``import``
lines of the ``_core/**/*.pyx`` sources), every import counted wherever it sits (a
function-local import is still an import) except those under ``if TYPE_CHECKING:``;
``specfsm._impl`` imports every kernel module (it does so by name, at import time).
On that graph: no cycles, and each layer imports only the layers below it; the layers
are the one table ``LAYERS``. The doc's tables name every module of the tree and only
modules that exist. No source file is over ``MAX_LINES`` lines, and each opens with a
comment or docstring saying its concern. A few real imports, each in a fresh
interpreter (in parallel: a child per module), check that every module imports on its
own.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import specfsm
from specfsm import _impl

from isolated import TESTS, child_env

# the checkout this test file sits in (as tests/test_readme.py finds the docs), not the
# installed package: in CI the package is installed, and the document and the Cython
# sources are only in the checkout; the package's sources are the same files
ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specfsm"
SOURCES = ROOT / "_core"
DOC = ROOT / "ARCHITECTURE.md"

# -- the layers (ARCHITECTURE.md, "Which module may import which") ------------------------
#: Each layer and the modules in it: a module belongs to the layer of the longest entry
#: that is the module itself or a package above it (``specfsm.hf`` holds ``specfsm.hf.cli``).
#: The twins named in ``specfsm._impl.TWINS`` and every ``specfsm._core.<name>`` are
#: kernels wherever they sit. Moving modules into packages changes only this table.
LAYERS: dict[str, tuple[str, ...]] = {
    # the concept packages' __init__ files import nothing, so that importing one of their
    # modules (a kernel importing its concept's _checks) runs nothing above it; their
    # _checks modules are foundation with them
    "foundation": ("specfsm.errors", "specfsm._values", "specfsm._checks", "specfsm.machine",
                   "specfsm.accept", "specfsm.drafting", "specfsm.placement", "specfsm.tree"),
    # the twins' own helpers (the twin of _core/common/_guard.pxd, the shared index
    # machinery, the batch step) sit with the twins
    "kernel": ("specfsm._core", "specfsm._guard", "specfsm.drafting._index_py",
               "specfsm.machine._batch_step_py"),
    "dispatch": ("specfsm._impl",),
    "public": (
        "specfsm.machine.state", "specfsm.machine.batch", "specfsm.accept.rules",
        "specfsm.drafting.lookup", "specfsm.drafting.ngram_index", "specfsm.drafting.suffix_index",
        "specfsm.drafting.batch", "specfsm.placement.place", "specfsm.placement._cupy", "specfsm.placement._geometry",
        "specfsm.tree.tree", "specfsm.tree.sampling", "specfsm.machine.tree_state",
    ),
    "package": ("specfsm",),
    "application": (
        "specfsm.gpu", "specfsm.hf", "specfsm.cli", "specfsm._cli_args", "specfsm.vllm", "specfsm.serving",
        "specfsm.__main__",
    ),
}

#: which layers each layer may import
ALLOWED = {
    "foundation": {"foundation"},
    "kernel": {"foundation", "kernel"},
    "dispatch": {"foundation", "kernel"},
    "public": {"foundation", "dispatch", "public"},
    "package": {"foundation", "dispatch", "public"},
    "application": {"foundation", "dispatch", "public", "application", "package"},
}

_OWNER = {entry: name for name, entries in LAYERS.items() for entry in entries}
TWIN_MODULES = frozenset(_impl.TWINS.values())


def is_compiled(module: str) -> bool:
    return module.startswith("specfsm._core.")


def is_twin(module: str) -> bool:
    return module in TWIN_MODULES


def layer(module: str) -> str:
    if is_compiled(module) or is_twin(module):
        return "kernel"
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        found = _OWNER.get(".".join(parts[:i]))
        if found is not None:
            return found
    raise AssertionError(f"{module} is in no layer: place it in ARCHITECTURE.md and in LAYERS")


# -- reading the graph ------------------------------------------------------------------
def python_modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def pyx_modules() -> dict[str, Path]:
    if not SOURCES.is_dir():
        return {}
    return {f"specfsm._core.{p.stem}": p for p in sorted(SOURCES.rglob("*.pyx"))}


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node except the bodies of ``if TYPE_CHECKING:`` (their ``else`` counts)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def python_imports(module: str, path: Path, known: set[str]) -> set[str]:
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return out


_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)
_PYX_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+(?!.*\bcimport\b)(.*)|import\s+([\w.]+))", re.M)


def pyx_imports(path: Path, known: set[str]) -> set[str]:
    """The Python imports of a .pyx file (``cimport`` lines are compile-time: skipped)."""
    text = _DOCSTRING.sub("", path.read_text())  # docstrings and inline C blocks
    out: set[str] = set()
    for m in _PYX_IMPORT.finditer(text):
        if m.group(3):
            out.add(m.group(3))
            continue
        base = m.group(1)
        names = re.findall(r"\w+", m.group(2).split("#")[0])
        out.add(base)
        for name in names:
            if f"{base}.{name}" in known:
                out.add(f"{base}.{name}")
    return out


def import_graph() -> dict[str, set[str]]:
    py, pyx = python_modules(), pyx_modules()
    known = set(py) | set(pyx) | {f"specfsm._core.{k}" for k in _impl.KERNEL_MODULES}
    raw: dict[str, set[str]] = {m: python_imports(m, p, known) for m, p in py.items()}
    raw.update({m: pyx_imports(p, known) for m, p in pyx.items()})
    raw["specfsm._impl"] |= {f"specfsm._core.{name}" for name in _impl.KERNEL_MODULES} | set(TWIN_MODULES)
    graph: dict[str, set[str]] = {}
    for source, targets in raw.items():
        own_ancestors = {source.rsplit(".", i)[0] for i in range(1, source.count(".") + 1)}
        edges = set()
        for target in targets:
            if target != "specfsm" and not target.startswith("specfsm."):
                continue
            # importing a.b.c runs a and a.b first: those count, except this module's own
            # packages (already being imported when it runs)
            chain = [target.rsplit(".", i)[0] for i in range(target.count(".") + 1)]
            edges.update(t for t in chain if t in known and t not in own_ancestors and t != source)
        graph[source] = edges
    return graph


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    bad = set()
    for source, targets in graph.items():
        for target in targets:
            if layer(target) not in ALLOWED[layer(source)]:
                bad.add((source, target))
            # the compiled core and the twin are siblings: neither imports the other
            elif is_compiled(source) and is_twin(target):
                bad.add((source, target))
            elif is_twin(source) and is_compiled(target):
                bad.add((source, target))
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# -- the tests --------------------------------------------------------------------------
def test_every_module_is_in_a_layer():
    for module in import_graph():
        layer(module)


def test_import_rules_hold():
    graph = import_graph()
    found = sorted(violations(graph))
    assert not found, "imports against ARCHITECTURE.md's rules:\n" + "\n".join(
        f"  {a} -> {b} ({layer(a)} may not import {layer(b)})" for a, b in found
    )


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_rules_can_fail():
    """The checker sees a planted violation, a planted cycle and a TYPE_CHECKING import."""
    graph = {m: set(t) for m, t in import_graph().items()}
    twin, compiled = _impl.TWINS["prefix"], "specfsm._core.accept"
    graph[twin].add("specfsm.gpu")
    graph[twin].add(compiled)
    graph["specfsm._checks"].add("specfsm.machine.state")
    assert (twin, "specfsm.gpu") in violations(graph)
    assert (twin, compiled) in violations(graph)
    assert any("specfsm._checks" in c and "specfsm.machine.state" in c for c in cycles(graph))
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import specfsm.gpu\nelse:\n    import specfsm.errors\n")
    seen = {a.name for n in _runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert seen == {"specfsm.errors"}


@pytest.mark.skipif(not SOURCES.is_dir(), reason="the .pyx sources are not beside an installed package")
def test_the_pyx_reader_sees_function_local_imports_and_skips_cimports():
    known = set(pyx_modules())
    graph = import_graph()
    assert "specfsm.accept._checks" in graph["specfsm._core.accept"]
    assert "specfsm.placement._checks" in graph["specfsm._core.place"]
    assert not any(t.startswith("specfsm.gpu") for t in graph["specfsm._core.place"])
    assert "specfsm.errors" in graph["specfsm._core.settle"]
    assert known


def test_required_rules_are_in_the_table():
    """The rules ARCHITECTURE.md states in words, as the table encodes them."""
    for kernel in ("specfsm._core.place", _impl.TWINS["accept"]):
        for app in ("specfsm.gpu", "specfsm.hf", "specfsm.vllm", "specfsm.cli"):
            assert layer(app) not in ALLOWED[layer(kernel)]
    assert "public" not in ALLOWED["kernel"] and "dispatch" not in ALLOWED["kernel"]
    assert "application" not in ALLOWED["public"]


# Modules that need an optional dependency to import at all.
_OPTIONAL = {"specfsm.placement._cupy": "cupy"}


def _loaded_by_the_package(env: dict[str, str]) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, specfsm; print(' '.join(sorted(sys.modules)))"],
        cwd=str(TESTS), env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    return {m for m in out.split() if m == "specfsm" or m.startswith("specfsm.")}


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """``import specfsm.x`` in a fresh interpreter runs the package first, so one child
    covers ``specfsm`` and every module it loads (with the compiled core, and with the
    twin); each other module gets a child of its own, run in parallel."""
    env = child_env()
    env["PYTHONWARNINGS"] = "error::ImportWarning"
    twin_env = dict(env, SPECFSM_NO_EXTENSIONS="1")
    covered = _loaded_by_the_package(env) | _loaded_by_the_package(twin_env)
    modules = [m for m in sorted(python_modules()) if m not in covered and m != "specfsm.__main__"]
    modules = [m for m in modules if m not in _OPTIONAL or _importable(_OPTIONAL[m])]
    assert "specfsm.machine.state" in covered and _impl.TWINS["accept"] in covered  # the twin run loads it
    procs = {}
    failed = []
    limit = max(2, os.cpu_count() or 2)
    pending = list(modules)
    while pending or procs:
        while pending and len(procs) < limit:
            m = pending.pop()
            procs[m] = subprocess.Popen(
                [sys.executable, "-c", f"import {m}"], cwd=str(TESTS), env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
        m, p = next(iter(procs.items()))
        _, err = p.communicate(timeout=120)
        del procs[m]
        if p.returncode:
            failed.append(f"{m}: {err.strip().splitlines()[-1] if err.strip() else p.returncode}")
    assert not failed, "\n".join(failed)


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except Exception:
        return False
    return True


# -- ARCHITECTURE.md's tables against the tree ---------------------------------------------
_TICKED = re.compile(r"`([^`]+)`")


def doc_module_entries(text: str) -> list[str]:
    """The module references of the doc's tables: the backticked names in the first cell
    of each row (header and separator rows skipped). A reference is a dotted module
    (``specfsm.machine.state``, or ``state`` for ``specfsm.machine.state``), a path
    (``specfsm/machine/state.py``, ``_core/drafting/ngram_index.pyx``, relative to the
    repository root or to ``specfsm/``), or either ending in ``*`` for everything under it."""
    entries = []
    for block in re.split(r"\n(?!\|)", text):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        for row in rows[2:] if len(rows) > 1 and set(rows[1]) <= set("|-: ") else []:
            first = row.strip("|").split("|")[0]
            entries.extend(_TICKED.findall(first))
    return entries


def _resolve(entry: str, tree: set[str], files: set[str]) -> set[str]:
    """The tree's modules (dotted) or files (paths) one doc entry names; empty: none.
    ``*`` matches anything, ``/`` and ``.`` included (``_core/*.pyx`` reaches subfolders)."""
    entry = entry.strip()
    if "/" in entry or entry.endswith((".py", ".pyx", ".pxd", ".h")):
        for base in ("", "specfsm/"):
            path = base + entry
            if "*" in path:
                hit = {f for f in files if fnmatch.fnmatchcase(f, path)}
            else:
                hit = {f for f in files if f == path or f.startswith(path.rstrip("/") + "/")}
            if hit:
                return hit
        return set()
    name = entry if entry == "specfsm" or entry.startswith("specfsm.") else f"specfsm.{entry}"
    if "*" in name:
        return {m for m in tree if fnmatch.fnmatchcase(m, name) or (name.endswith(".*") and m == name[:-2])}
    return {m for m in tree if m == name or m.startswith(name + ".")}


def _tree() -> tuple[set[str], set[str]]:
    """The tree's modules (dotted: the package's Python modules, each compiled module) and
    source files (paths relative to the repository root)."""
    modules = set(python_modules()) | set(pyx_modules())
    files = {str(p.relative_to(ROOT)) for p in source_files()}
    return modules, files


def _module_file(module: str) -> str:
    path = python_modules().get(module) or pyx_modules().get(module)
    return str(path.relative_to(ROOT)) if path else module


@pytest.mark.skipif(not DOC.is_file(), reason="ARCHITECTURE.md is not beside an installed package")
def test_the_docs_tables_name_every_module_and_only_modules_that_exist():
    """Every module reference in ARCHITECTURE.md's tables exists in the tree, and every
    module of the tree is named there (itself, a package above it, or a path or pattern
    covering its file). ``__main__`` modules (the ``python -m`` entry) need no entry."""
    modules, files = _tree()
    entries = doc_module_entries(DOC.read_text())
    assert entries, "ARCHITECTURE.md has no table naming modules"
    missing = [e for e in entries if not _resolve(e, modules, files)]
    assert not missing, "ARCHITECTURE.md names modules the tree does not have: " + ", ".join(missing)
    covered: set[str] = set()
    for e in entries:
        covered |= _resolve(e, modules, files)
    absent = sorted(
        m for m in modules
        if m not in covered and _module_file(m) not in covered and not m.endswith(".__main__")
    )
    assert not absent, "modules ARCHITECTURE.md's tables do not name: " + ", ".join(absent)


def test_the_doc_table_reader_can_fail():
    text = (
        "| layer | may import |\n| --- | --- |\n| foundation (`errors`, `nope`) | `state` |\n"
        "\n| module | concern |\n|---|---|\n| `specfsm/_impl.py` | dispatch |\n| `_core/*.pyx` | kernels |\n"
    )
    entries = doc_module_entries(text)
    assert entries == ["errors", "nope", "specfsm/_impl.py", "_core/*.pyx"]  # first cells only
    modules, files = _tree()
    assert _resolve("errors", modules, files) == {"specfsm.errors"}
    assert _resolve("nope", modules, files) == set()
    assert _resolve("specfsm/_impl.py", modules, files) == {"specfsm/_impl.py"}
    assert _resolve("hf", modules, files) >= {"specfsm.hf", "specfsm.hf.generate"}
    if SOURCES.is_dir():
        assert len(_resolve("_core/*.pyx", modules, files)) >= len(_impl.KERNEL_MODULES)


# -- the size and the opening of every source file -----------------------------------------
MAX_LINES = 800
#: Files over MAX_LINES today, split on other branches of this issue. The lead empties
#: this set: an entry that is no longer over the limit fails the test, so it cannot go stale.
OVERSIZED: set[str] = set()


def source_files() -> list[Path]:
    """``specfsm/**/*.py`` and, in a checkout, ``_core/**/*.pyx``, ``*.pxd`` and ``*.h``."""
    found = sorted(PACKAGE.rglob("*.py"))
    if SOURCES.is_dir():
        found += sorted(p for p in SOURCES.rglob("*") if p.suffix in (".pyx", ".pxd", ".h"))
    return found


def test_no_source_file_is_over_the_limit():
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in source_files()}
    over = {f for f, n in lengths.items() if n > MAX_LINES}
    new = sorted(over - OVERSIZED)
    assert not new, f"over {MAX_LINES} lines (split by concern): " + ", ".join(f"{f} ({lengths[f]})" for f in new)
    fixed = sorted(f for f in OVERSIZED - over if f in lengths or SOURCES.is_dir())
    assert not fixed, "no longer over the limit (or gone): remove from OVERSIZED: " + ", ".join(fixed)


def opening_comment(path: Path) -> str:
    """The text of the file's opening docstring or comment ('' when it has none)."""
    text = path.read_text()
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text, str(path))) or ""
    head = text.lstrip()
    if path.suffix == ".h":
        m = re.match(r"/\*(.*?)\*/|((?://[^\n]*\n?)+)", head, re.S)
        return (m.group(1) or m.group(2) or "").strip() if m else ""
    m = re.match(r'(?:"""(.*?)"""|((?:#[^\n]*\n?)+))', head, re.S)  # .pyx / .pxd
    return (m.group(1) or m.group(2) or "").strip("# \n") if m else ""


def test_every_source_file_opens_with_its_concern():
    bare = [str(p.relative_to(ROOT)) for p in source_files() if len(opening_comment(p)) < 10]
    assert not bare, "files without an opening comment or docstring saying their concern: " + ", ".join(bare)


def test_the_opening_reader_can_fail(tmp_path):
    cases = {
        "a.py": ("x = 1\n", ""), "b.py": ('"""Does one thing."""\n', "Does one thing."),
        "c.h": ("#include <x.h>\n", ""), "d.h": ("/* Hash tables. */\n", "Hash tables."),
        "e.pxd": ("# Shared declarations.\ncdef int x\n", "Shared declarations."),
        "f.pyx": ("cimport numpy\n", ""),
    }
    for name, (text, want) in cases.items():
        (tmp_path / name).write_text(text)
        assert opening_comment(tmp_path / name) == want, name
