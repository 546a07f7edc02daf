"""The type stubs ``specfsm/_core/<name>.pyi`` describe the compiled modules as they are.

Each stub is read with ``ast`` (no type checker needed) and held to its pure-Python twin
(``specfsm._impl.kernels("python", name)``): the same ``__all__``, every exported name defined, and every
public function, method and property with the twin's parameters (names, kinds, defaults).
Where the compiled module is built, its exported names, its classes' public members and
the signatures Cython exposes are held to the same stub. ``.ci/typecheck`` then runs mypy
over the package, stubs included.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from specfsm import _impl

CORE = Path(__file__).resolve().parent.parent / "specfsm" / "_core"
MODULES = list(_impl.KERNEL_MODULES)  # the one list of kernel modules
# members every class has, that a stub need not repeat
IGNORED_MEMBERS = {"__reduce__", "__repr__", "__setattr__", "__eq__", "__hash__", "__getstate__", "__setstate__"}


def _stub(name: str) -> ast.Module:
    path = CORE / f"{name}.pyi"
    assert path.is_file(), f"no stub for the compiled module specfsm._core.{name}: write {path}"
    return ast.parse(path.read_text(), filename=str(path))


def _stub_all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("the stub has no __all__")


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def _params(fn: ast.FunctionDef) -> list[tuple[str, str, Any]]:
    """``(name, kind, default)`` for each parameter, as ``inspect`` spells them."""
    a = fn.args
    positional = [(p, "POSITIONAL_ONLY") for p in a.posonlyargs] + [
        (p, "POSITIONAL_OR_KEYWORD") for p in a.args
    ]
    defaults: list[Any] = [inspect.Parameter.empty] * (len(positional) - len(a.defaults))
    defaults += [ast.literal_eval(d) for d in a.defaults]
    out = [(p.arg, kind, d) for (p, kind), d in zip(positional, defaults)]
    if a.vararg is not None:
        out.append((a.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((p.arg, "KEYWORD_ONLY", inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    if a.kwarg is not None:
        out.append((a.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return out


def _runtime_params(fn: Any) -> list[tuple[str, str, Any]] | None:
    """The same for a runtime callable, or None when it exposes no real signature
    (a Cython ``__init__`` shows ``(self, /, *args, **kwargs)``; a C slot such as
    ``__len__`` shows its positional-only C form)."""
    if type(fn).__name__ in ("wrapper_descriptor", "method-wrapper", "slot wrapper"):
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = [(p.name, p.kind.name, p.default) for p in sig.parameters.values()]
    kinds = [k for _, k, _ in params]
    if kinds[-2:] == ["VAR_POSITIONAL", "VAR_KEYWORD"] and len(params) <= 3:
        return None
    return params


def _stub_members(cls: ast.ClassDef) -> tuple[dict[str, ast.FunctionDef], set[str]]:
    methods, properties = {}, set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            if _is_property(node):
                properties.add(node.name)
            else:
                methods[node.name] = node
    return methods, properties


def _runtime_members(cls: type) -> tuple[dict[str, Any], set[str]]:
    methods, properties = {}, set()
    members = {k: v for c in reversed(cls.__mro__[:-1]) for k, v in vars(c).items()}  # inherited too
    for name, value in members.items():
        if name.startswith("_") and name not in ("__init__", "__len__"):
            continue
        if name in IGNORED_MEMBERS:
            continue
        if isinstance(value, property) or type(value).__name__ in ("getset_descriptor", "member_descriptor"):
            properties.add(name)
        elif callable(value):
            methods[name] = value
    return methods, properties


def _compiled(name: str):
    """The compiled module, None when the compiled core is switched off (a module that
    does not import is an error here, not a skip: a broken build must not pass)."""
    if _impl.NO_EXTENSIONS:
        return None
    return _impl.kernels("compiled", name)


@pytest.mark.parametrize("name", MODULES)
def test_every_compiled_module_has_a_stub_that_exports_the_twins_names(name):
    tree = _stub(name)
    twin = _impl.kernels("python", name)
    exported = _stub_all(tree)
    assert exported == list(twin.__all__)
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    assert sorted(set(exported) - defined) == [], "exported by __all__ but not declared in the stub"
    public = {n for n in defined if not n.startswith("_")}
    assert sorted(public - set(exported)) == [], "declared in the stub but not exported"


@pytest.mark.parametrize("name", MODULES)
def test_stub_signatures_match_the_twin(name):
    tree = _stub(name)
    twin = _impl.kernels("python", name)
    checked = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert _params(node) == _runtime_params(getattr(twin, node.name)), node.name
            checked += 1
        elif isinstance(node, ast.ClassDef):
            cls = getattr(twin, node.name)
            methods, properties = _stub_members(node)
            r_methods, r_properties = _runtime_members(cls)
            assert sorted(methods) == sorted(r_methods), f"{node.name} methods"
            assert sorted(properties) == sorted(r_properties), f"{node.name} properties"
            for m, fn in methods.items():
                assert _params(fn) == _runtime_params(r_methods[m]), f"{node.name}.{m}"
                checked += 1
    assert checked, "the stub declares no function"


@pytest.mark.parametrize("name", MODULES)
def test_stub_matches_the_compiled_module(name):
    compiled = _compiled(name)
    if compiled is None:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled module to compare the stub with")
    tree = _stub(name)
    assert _stub_all(tree) == list(compiled.__all__)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            params = _runtime_params(getattr(compiled, node.name))
            if params is not None:
                assert _params(node) == params, node.name
        elif isinstance(node, ast.ClassDef):
            cls = getattr(compiled, node.name)
            methods, properties = _stub_members(node)
            r_methods, r_properties = _runtime_members(cls)
            assert sorted(set(methods) | properties) == sorted(set(r_methods) | r_properties), node.name
            for m, fn in methods.items():
                params = _runtime_params(r_methods[m])
                if params is not None:
                    assert _params(fn) == params, f"{node.name}.{m}"


def test_the_signature_check_can_fail():
    good = ast.parse("def f(a, b=1, *, c=None): ...").body[0]
    bad = ast.parse("def f(a, b=2, *, c=None): ...").body[0]

    def f(a, b=1, *, c=None):
        pass

    assert _params(good) == _runtime_params(f)
    assert _params(bad) != _runtime_params(f)
