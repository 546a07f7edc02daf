"""Each compiled module exposes what its pure-Python twin does, with the same signatures.

Type checkers read the twins (each public module imports its twin under
``TYPE_CHECKING``), so the twin's signatures are the package's typed API; here every
compiled module (``specfsm._impl.kernels("compiled", name)``) is held to its twin
(``kernels("python", name)``): the same ``__all__``, every class with the same public
methods and properties, and every function and method whose signature Cython exposes
with the twin's parameters (names, kinds, defaults).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from specfsm import _impl

MODULES = list(_impl.KERNEL_MODULES)  # the one list of kernel modules
# members every class has, that need not match
IGNORED_MEMBERS = {"__reduce__", "__repr__", "__setattr__", "__eq__", "__hash__", "__getstate__", "__setstate__"}


def _params(fn: Any) -> list[tuple[str, str, Any]] | None:
    """``(name, kind, default)`` for each parameter, or None when the callable exposes
    no real signature (a Cython ``__init__`` shows ``(self, /, *args, **kwargs)``; a C
    slot such as ``__len__`` shows its positional-only C form)."""
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


def _members(cls: type) -> tuple[dict[str, Any], set[str]]:
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
    """The compiled module (a module that does not import is an error here, not a skip:
    a broken build must not pass)."""
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled module to compare the twin with")
    return _impl.kernels("compiled", name)


@pytest.mark.parametrize("name", MODULES)
def test_the_twin_exports_what_it_defines(name):
    twin = _impl.kernels("python", name)
    assert twin.__all__ and all(hasattr(twin, n) for n in twin.__all__)


@pytest.mark.parametrize("name", MODULES)
def test_the_compiled_module_matches_its_twin(name):
    compiled, twin = _compiled(name), _impl.kernels("python", name)
    assert list(compiled.__all__) == list(twin.__all__)
    checked = 0
    for export in twin.__all__:
        want, got = getattr(twin, export), getattr(compiled, export)
        if isinstance(want, type):
            assert isinstance(got, type), export
            methods, properties = _members(want)
            c_methods, c_properties = _members(got)
            assert sorted(set(methods) | properties) == sorted(set(c_methods) | c_properties), export
            pairs = [(f"{export}.{m}", fn, c_methods[m]) for m, fn in methods.items()]
        elif callable(want):
            pairs = [(export, want, got)]
        else:
            assert type(got) is type(want) and got == want, export
            continue
        for label, fn, c_fn in pairs:
            params = _params(c_fn)
            if params is not None:
                assert params == _params(fn), label
                checked += 1
    assert checked, "no signature compared"


def test_the_signature_check_can_fail():
    def f(a, b=1, *, c=None):
        pass

    def g(a, b=2, *, c=None):
        pass

    assert _params(f) == _params(f) and _params(f) != _params(g)


def public_surface(module: str, cls_name: str) -> tuple[dict[str, list[inspect.Parameter]], set[str]]:
    """The twin class's public methods (``__init__`` and ``__len__`` included) with their
    parameters after ``self``, and its properties: what the structural tests enumerate
    (every method and property, on both implementations)."""
    methods, properties = _members(getattr(_impl.kernels("python", module), cls_name))
    return {m: list(inspect.signature(fn).parameters.values())[1:] for m, fn in methods.items()}, properties
