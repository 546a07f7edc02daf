"""ARCHITECTURE.md and the shape of the tree, checked on the code.

The layers are ARCHITECTURE.md's layer table, read here: each module of the tree must be
named by exactly one layer's patterns (a module no row names fails), and every pattern
must name a module. The import graph is read statically (``ast`` for the Python modules,
the ``import`` lines of the ``_core/**/*.pyx`` sources and the ``.pxi`` files they
include), every import counted wherever it sits (a function-local import is still an
import) except those under ``if TYPE_CHECKING:``; ``specfsm._impl`` imports every kernel
module (by name). On that graph: no cycles, and each layer imports only the layers the
table allows. Then the document's other checkable claims: no source file over
``MAX_LINES`` lines and no function over ``MAX_FUNCTION_LINES``; each file opens with its
concern; no public function only forwards to a kernel; nothing picks an implementation
by a module's name; one C loop checks offsets. A few real imports, each in a fresh
interpreter (a child per module), check that every module imports on its own.
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

# -- the layers: ARCHITECTURE.md's layer table ------------------------------------------
def layer_table(text: str) -> tuple[dict[str, tuple[str, ...]], dict[str, set[str]]]:
    """``({layer: module patterns}, {layer: the layers it may import})`` from the rows of
    the document's table whose header is ``| layer | modules | may import |``."""
    lines = text.splitlines()
    at = next((k for k, line in enumerate(lines) if line.replace(" ", "") == "|layer|modules|mayimport|"), None)
    assert at is not None, "ARCHITECTURE.md has no '| layer | modules | may import |' table"
    layers: dict[str, tuple[str, ...]] = {}
    allowed: dict[str, set[str]] = {}
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        name, modules, may = (cell.strip() for cell in line.strip().strip("|").split("|"))
        layers[name] = tuple(re.findall(r"`([^`]+)`", modules))
        allowed[name] = {w.strip() for w in may.split(",") if w.strip()}
    return layers, allowed


LAYERS, ALLOWED = layer_table(DOC.read_text())
TWIN_MODULES = frozenset(_impl.TWINS.values())


def is_compiled(module: str) -> bool:
    return module.startswith("specfsm._core.")


def is_twin(module: str) -> bool:
    return module in TWIN_MODULES


def layer(module: str, layers: dict[str, tuple[str, ...]] | None = None) -> str:
    """The one layer whose patterns name ``module`` (AssertionError: none, or several)."""
    found = {name for name, patterns in (layers or LAYERS).items()
             if any(fnmatch.fnmatchcase(module, p) for p in patterns)}
    assert found, f"{module} is in no layer: name it in ARCHITECTURE.md's layer table"
    assert len(found) == 1, f"{module} is named by several layers: {sorted(found)}"
    return found.pop()


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
    """The Python imports of a .pyx file and of the .pxi files it includes (``cimport``
    lines are compile-time: skipped)."""
    out: set[str] = set()
    for text in _with_includes(path):
        text = _DOCSTRING.sub("", text)  # docstrings and inline C blocks
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


def _with_includes(path: Path, seen: set[Path] | None = None) -> list[str]:
    """``path``'s text and that of every file it ``include``s, recursively."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    text = path.read_text()
    found = [text]
    for name in re.findall(r'^\s*include\s+"([^"]+)"', text, re.M):
        found += _with_includes(path.parent / name, seen)
    return found


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


# -- ARCHITECTURE.md's layer table against the tree -----------------------------------------
def test_every_layer_pattern_names_a_module():
    modules = set(import_graph())
    stale = [(name, p) for name, patterns in LAYERS.items() for p in patterns
             if not any(fnmatch.fnmatchcase(m, p) for m in modules)]
    assert not stale, f"ARCHITECTURE.md's layer table names modules the tree does not have: {stale}"


def test_the_layer_table_reader_can_fail():
    text = (
        "intro\n\n| layer | modules | may import |\n| --- | --- | --- |\n"
        "| low | `specfsm.errors` `specfsm.x.*` | low |\n| high | `specfsm.hf` | low, high |\n\nafter\n"
    )
    layers, allowed = layer_table(text)
    assert layers == {"low": ("specfsm.errors", "specfsm.x.*"), "high": ("specfsm.hf",)}
    assert allowed == {"low": {"low"}, "high": {"low", "high"}}
    assert layer("specfsm.x.y", layers) == "low"
    with pytest.raises(AssertionError, match="in no layer"):
        layer("specfsm.hf.new_module", layers)      # an unlisted module fails
    with pytest.raises(AssertionError, match="several layers"):
        layer("specfsm.x.y", {**layers, "other": ("specfsm.x.y",)})
    with pytest.raises(AssertionError, match="has no"):
        layer_table("no table here")


# -- the size and the opening of every source file -----------------------------------------
MAX_LINES = 800
MAX_FUNCTION_LINES = 100


def source_files() -> list[Path]:
    """``specfsm/**/*.py`` and ``_core/**/*.pyx``, ``*.pxi``, ``*.pxd`` and ``*.h``."""
    assert SOURCES.is_dir(), f"no _core/ beside {PACKAGE}"
    return sorted(PACKAGE.rglob("*.py")) + sorted(
        p for p in SOURCES.rglob("*") if p.suffix in (".pyx", ".pxi", ".pxd", ".h"))


def test_no_source_file_is_over_the_limit():
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in source_files()}
    over = sorted(f for f, n in lengths.items() if n > MAX_LINES)
    assert not over, f"over {MAX_LINES} lines (split by concern): " + ", ".join(f"{f} ({lengths[f]})" for f in over)


_CY_DEF = re.compile(r"^(\s*)(?:cdef|cpdef|def)\s+(?:inline\s+)?(?:[\w\[\]:,\s\*\.]+?\s+)?(\w+)\s*\(")


def function_lengths(path: Path) -> list[tuple[str, int]]:
    """``(name, lines)`` for every function of a source file, from its ``def`` line to
    its last line of code: ``ast`` for Python; for Cython, a ``def``/``cdef``/``cpdef``
    whose signature ends in ``:`` up to the last non-blank, non-comment line indented
    deeper than it (declarations without a body are not functions)."""
    text = path.read_text()
    if path.suffix == ".py":
        return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(text, str(path)))
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        m = _CY_DEF.match(line)
        if not m:
            continue
        j = i
        while j < len(lines) - 1 and not lines[j].rstrip().endswith(":") and not lines[j].rstrip().endswith(
                ("nogil", "noexcept", "except -1", "except *", ")")):
            j += 1
        if not lines[j].rstrip().endswith(":"):
            continue  # a declaration
        depth, last = len(m.group(1)), j
        for k in range(j + 1, len(lines)):
            code = lines[k].strip()
            if code and not code.startswith("#"):
                if len(lines[k]) - len(lines[k].lstrip()) <= depth:
                    break
                last = k
        found.append((m.group(2), last - i + 1))
    return found


def test_no_function_is_over_the_limit():
    long = [f"{p.relative_to(ROOT)} {name} ({n})" for p in source_files() if p.suffix != ".h"
            for name, n in function_lengths(p) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split by concern): " + ", ".join(long)


def test_the_function_reader_can_fail(tmp_path):
    body = "".join(f"    x = {i}\n" for i in range(3))
    (tmp_path / "a.pyx").write_text(
        "cdef int f(int a) noexcept nogil\n"          # a declaration: no body
        f"cdef inline int g(int a,\n                  int b) except -1:\n{body}    # note\n\nx = 1\n"
        f"def h(a):\n{body}"
    )
    (tmp_path / "b.py").write_text(f"def k():\n{body}")
    assert function_lengths(tmp_path / "a.pyx") == [("g", 5), ("h", 4)]
    assert function_lengths(tmp_path / "b.py") == [("k", 4)]


# -- no layer between the two implementations ----------------------------------------------
def forwarding_functions(tree: ast.Module) -> list[str]:
    """Top-level functions whose whole body (after a docstring) hands their own
    parameters, in order, to one call of an attribute of another object: a public
    function that only forwards to a kernel."""
    found = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
            continue
        body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
        if len(body) != 1 or not isinstance(body[0], (ast.Return, ast.Expr)):
            continue
        call = body[0].value
        if not (isinstance(call, ast.Call) and isinstance(call.func, (ast.Attribute, ast.Name))):
            continue
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        passed = [a.id for a in call.args if isinstance(a, ast.Name)] + [
            k.value.id for k in call.keywords if isinstance(k.value, ast.Name)]
        if params and passed == params and len(call.args) + len(call.keywords) == len(params):
            found.append(fn.name)
    return found


def test_no_public_function_only_forwards_to_a_kernel():
    modules = python_modules()
    found = [f"{m}.{name}" for m in sorted(modules) if layer(m) in ("public", "package")
             for name in forwarding_functions(ast.parse(modules[m].read_text()))]
    assert not found, "public functions that only forward (export the kernel's object instead): " + ", ".join(found)
    planted = ast.parse('def f(a, b=1):\n    """Doc."""\n    return _k.f(a, b)\n\ndef g(a):\n    return a + 1\n')
    assert forwarding_functions(planted) == ["f"]


_BY_MODULE_NAME = re.compile(r"__module__\s*[!=]=\s*[\"']specfsm|[\"']specfsm[\w.]*[\"']\s*[!=]=\s*\w+[\w.()]*\.__module__")


def test_nothing_picks_an_implementation_by_module_name():
    found = [str(p.relative_to(ROOT)) for p in source_files() if _BY_MODULE_NAME.search(p.read_text())]
    assert not found, "module-name checks: " + ", ".join(found)
    assert _BY_MODULE_NAME.search('if type(rule).__module__ != "specfsm.accept.rules":')


_NEIGHBOURS = re.compile(r"(\w+)\[(\w+)\]\s*>\s*\1\[\2 \+ 1\]")


def test_one_c_loop_holds_offsets_to_their_contract():
    """``longest_row`` (``_core/common/_offsets.pxd``) is the one place C compares
    neighbouring offsets; the compiled modules that read offsets cimport it."""
    c_files = [p for p in source_files() if p.suffix in (".pyx", ".pxi", ".pxd")]
    compares = [str(p.relative_to(ROOT)) for p in c_files if _NEIGHBOURS.search(p.read_text())]
    assert compares == ["_core/common/_offsets.pxd"], compares
    users = [str(p.relative_to(ROOT)) for p in c_files if "longest_row(" in p.read_text()]
    assert len(users) >= 6, users
    assert _NEIGHBOURS.search("if o[k] > o[k + 1]:") and not _NEIGHBOURS.search("if a[k] > b[k + 1]:")


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
