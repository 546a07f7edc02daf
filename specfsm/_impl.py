"""The one place that picks the compiled core or its pure-Python twin.

The twin is used when ``SPECFSM_NO_EXTENSIONS`` is set to a true value (anything but
empty, ``0``, ``false``, ``no``, ``off``), on interpreters other than CPython, or when
the compiled modules fail to import (a source checkout that was never built). Kernel
module ``specfsm._core.<name>`` has its twin in ``specfsm._py.<name>``, with the same
names and behaviour; everything else in the package reaches the kernels through
``load(name)`` or this module's attributes.

The choice is made once per kernel module, at import time. ``USE_EXTENSIONS`` is true
only when every kernel module in ``KERNEL_MODULES`` is compiled; ``extensions()`` says
which are and why any is not. A partial fallback (some modules compiled, some not, for
example one that failed to build or to load) warns once with a ``RuntimeWarning``; a
source checkout that was never built (the ``.pyx`` sources beside the package, no
compiled module) warns once too, saying how to build it or silence the warning.

Running one implementation on purpose (tests and benchmarks compare the two): the
public layer (``state``, ``accept_rule``, ``drafting``) reaches the kernels through
``current()``, the ``Implementation`` of the running context, which is ``ACTIVE``
unless a ``with using("python"):`` (or ``"compiled"``) block says otherwise. The choice
is a ``contextvars.ContextVar``: it holds in that block, in that thread or task only,
and nothing process-wide is rebound.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

__all__ = [
    "KERNEL_MODULES",
    "NO_EXTENSIONS",
    "NEVER_BUILT",
    "USE_EXTENSIONS",
    "IMPORT_ERROR",
    "ModuleStatus",
    "Implementation",
    "ACTIVE",
    "extensions",
    "load",
    "module",
    "implementation",
    "current",
    "using",
    "common_prefix",
    "prompt_lookup",
    "settle",
]

# Every compiled module of the core (``_core/<name>.pyx``); each has its twin in ``_py``.
KERNEL_MODULES: tuple[str, ...] = ("accept", "batch", "ngram", "ngram_index", "place", "prefix", "settle", "suffix_index")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


NO_EXTENSIONS: bool = _env_flag("SPECFSM_NO_EXTENSIONS") or sys.implementation.name != "cpython"
IMPORT_ERROR: ImportError | None = None  # the first compiled module that failed to import


class ModuleStatus(NamedTuple):
    """Which implementation of one kernel module is active, and why."""

    name: str  #: the kernel module, e.g. ``"accept"``
    compiled: bool  #: True when ``specfsm._core.<name>`` is the active one
    module: str  #: the active module's full name
    error: ImportError | None  #: why the compiled module did not import (None when it did or was switched off)


def module(kind: str, name: str) -> ModuleType:
    """Kernel module ``name`` of one implementation, ``"compiled"`` or ``"python"``.

    For tests and benchmarks that compare the two; raises ImportError when the compiled
    module is asked for and not built.
    """
    if kind == "compiled":
        return import_module(f"specfsm._core.{name}")
    if kind == "python":
        return import_module(f"specfsm._py.{name}")
    raise ValueError(f"kind must be 'compiled' or 'python', got {kind!r}")


_ACTIVE: dict[str, ModuleType] = {}
_ERRORS: dict[str, ImportError] = {}


def load(name: str) -> ModuleType:
    """The active implementation of kernel module ``name`` (compiled unless the rule says
    not). The choice is made on the first call and kept, so every caller gets the same."""
    global IMPORT_ERROR
    active = _ACTIVE.get(name)
    if active is not None:
        return active
    if not NO_EXTENSIONS:
        try:
            active = module("compiled", name)
        except ImportError as exc:  # a source tree that was never built, or a broken build
            _ERRORS[name] = exc
            if IMPORT_ERROR is None:
                IMPORT_ERROR = exc
    if active is None:
        active = module("python", name)
    _ACTIVE[name] = active
    return active


def extensions() -> dict[str, ModuleStatus]:
    """Every kernel module's status: compiled, or fallen back to the twin and why.

    ``error`` holds the ImportError of a compiled module that failed to import; it is None
    for a compiled module and for every module when the compiled core is switched off
    (``SPECFSM_NO_EXTENSIONS`` or a non-CPython interpreter, see ``NO_EXTENSIONS``).
    """
    out = {}
    for name in KERNEL_MODULES:
        active = load(name)
        out[name] = ModuleStatus(
            name, active.__name__.startswith("specfsm._core."), active.__name__, _ERRORS.get(name)
        )
    return out


def _never_built_checkout() -> bool:
    """Whether this package is a source checkout whose compiled core was never built:
    the ``.pyx`` sources sit in ``_core/`` beside the package directory and no kernel
    module imported compiled."""
    root = Path(__file__).resolve().parent.parent
    return (root / "_core" / "accept" / "prefix.pyx").is_file() and len(_ERRORS) == len(KERNEL_MODULES)


for _name in KERNEL_MODULES:
    load(_name)

USE_EXTENSIONS: bool = all(s.compiled for s in extensions().values())
#: True in a source checkout whose compiled core was never built (and not switched off):
#: every kernel runs on the twin, and importing the package warns once.
NEVER_BUILT: bool = not NO_EXTENSIONS and _never_built_checkout()

if not NO_EXTENSIONS and _ERRORS and len(_ERRORS) < len(KERNEL_MODULES):
    warnings.warn(
        "specfsm: the compiled core is only partly available; these kernel modules run on "
        "the pure-Python twin: "
        + "; ".join(f"{name} ({exc})" for name, exc in _ERRORS.items())
        + ". specfsm.USE_EXTENSIONS is False; see specfsm.extensions().",
        RuntimeWarning,
        stacklevel=1,
    )
elif NEVER_BUILT:
    warnings.warn(
        "specfsm: running from a source checkout whose compiled core was never built, so "
        "every kernel runs on the pure-Python twin (slow). Build it in place with "
        "`python setup.py build_ext --inplace` (or `pip install -e .`), or set "
        "SPECFSM_NO_EXTENSIONS=1 to use the twin on purpose.",
        RuntimeWarning,
        stacklevel=1,
    )


class Implementation:
    """The kernels of one implementation, as the public layer calls them.

    ``kind`` is ``"compiled"`` or ``"python"`` (``ACTIVE`` has the kind of its prefix
    kernel); ``common_prefix``, ``prompt_lookup`` and ``settle`` are the kernel
    functions; ``accept`` and ``place`` the kernel modules.
    """

    __slots__ = ("kind", "common_prefix", "prompt_lookup", "settle", "accept", "place")

    def __init__(self, kind: str, modules: dict[str, ModuleType]) -> None:
        self.kind = kind
        self.common_prefix = modules["prefix"].common_prefix
        self.prompt_lookup = modules["ngram"].prompt_lookup
        self.settle = modules["settle"].settle
        self.accept = modules["accept"]
        self.place = modules["place"]

    def __repr__(self) -> str:
        return f"<specfsm kernels: {self.kind}>"


_USED = ("prefix", "ngram", "settle", "accept", "place")
ACTIVE: Implementation = Implementation(
    "compiled" if load("prefix").__name__.startswith("specfsm._core.") else "python",
    {name: load(name) for name in _USED},
)
_BY_KIND: dict[str, Implementation] = {}


def implementation(kind: str) -> Implementation:
    """The kernels of ``"compiled"`` or ``"python"`` (ImportError when the compiled core
    is asked for and not built)."""
    found = _BY_KIND.get(kind)
    if found is None:
        found = _BY_KIND[kind] = Implementation(kind, {name: module(kind, name) for name in _USED})
    return found


_CURRENT: ContextVar[Implementation] = ContextVar("specfsm_implementation", default=ACTIVE)
current = _CURRENT.get
"""``current()``: the kernels the public layer calls in the running context (``ACTIVE``
outside any ``using`` block)."""


@contextmanager
def using(kind: str | Implementation) -> Iterator[Implementation]:
    """Run the public layer on one implementation inside the ``with`` block, in this
    context only (other threads and tasks keep theirs): ``with using("python"): ...``."""
    chosen = kind if isinstance(kind, Implementation) else implementation(kind)
    token = _CURRENT.set(chosen)
    try:
        yield chosen
    finally:
        _CURRENT.reset(token)


if TYPE_CHECKING:  # type checkers read the twin: typed Python with the same names
    from ._py.ngram import prompt_lookup
    from ._py.prefix import common_prefix
    from ._py.settle import settle
else:
    # For callers outside the public layer: the running context's kernel, whatever
    # ``using`` block they run in (a function, so that no assignment to these names, a
    # test's monkeypatch undone included, can pin one implementation here).

    def common_prefix(draft, row_tokens):
        """``current().common_prefix``: the running context's kernel."""
        return _CURRENT.get().common_prefix(draft, row_tokens)

    def prompt_lookup(history, ngram, max_k):
        """``current().prompt_lookup``: the running context's kernel."""
        return _CURRENT.get().prompt_lookup(history, ngram, max_k)

    def settle(draft_len, accepted, n_row_tokens, n_row_caches, attempted):
        """``current().settle``: the running context's kernel."""
        return _CURRENT.get().settle(draft_len, accepted, n_row_tokens, n_row_caches, attempted)
