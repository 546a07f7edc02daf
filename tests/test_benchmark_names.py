"""The benchmarks' and scripts' imports from specfsm name what exists.

The benchmark scripts import specfsm's names inside their functions (torch and the model
load only when a part runs), so a renamed or removed name breaks them only when someone
runs them. This reads every ``from specfsm... import name`` in ``benchmarks/`` and
checks, on the source of the module it names (``ast``, nothing imported, so no torch),
that the module defines or imports that name, or holds a submodule of that name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specfsm

ROOT = Path(specfsm.__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _module_file(name: str) -> Path | None:
    """The source of module ``name`` (``specfsm.x.y``) in this tree, or None."""
    base = ROOT.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".pyi")):
        if cand.exists():
            return cand
    return None


def defined_names(path: Path) -> set[str]:
    """The names a module's top level binds (functions, classes, assignments, imports,
    and names bound under a top-level ``if``/``try``), and its submodules if a package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    out.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
    visit(tree.body)
    if path.name == "__init__.py":
        out.update(p.stem for p in path.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    return out


def specfsm_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` for every ``from specfsm... import name`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "specfsm" or node.module.startswith("specfsm.")):
            out.extend((node.lineno, node.module, a.name) for a in node.names if a.name != "*")
    return out


def missing(path: Path) -> list[str]:
    bad = []
    for line, mod, name in specfsm_imports(path):
        src = _module_file(mod)
        if src is None:
            bad.append(f"{path.name}:{line}: no module {mod}")
        elif name not in defined_names(src):
            bad.append(f"{path.name}:{line}: {mod} has no {name}")
    return bad


@pytest.mark.skipif(not BENCH.is_dir(), reason="benchmarks/ is not here (an installed copy)")
def test_every_benchmark_import_names_what_exists():
    files = sorted(BENCH.glob("*.py"))
    assert files
    bad = [m for f in files for m in missing(f)]
    assert not bad, "\n".join(bad)


def test_the_checker_can_fail(tmp_path):
    f = tmp_path / "bench.py"
    f.write_text("def part():\n    from specfsm.hf.cli import compare, _no_such_name\n"
                 "    from specfsm.no_such_module import x\n    from specfsm import drafting\n")
    assert missing(f) == ["bench.py:2: specfsm.hf.cli has no _no_such_name", "bench.py:3: no module specfsm.no_such_module"]
