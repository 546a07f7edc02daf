"""The one rule that picks the compiled core or its pure-Python twin, once per kernel module.

The twin is used when ``SPECFSM_NO_EXTENSIONS`` is set to a true value (anything but
empty, ``0``, ``false``, ``no``, ``off``), on interpreters other than CPython, or when
the compiled module fails to import (a source checkout that was never built), as
propcache and yarl decide. Kernel module ``specfsm._core.<name>`` has its twin named in
``TWINS`` (the one list of kernel modules), with the same names and behaviour.

The choice is made once per kernel module, when this module is imported, and never
changes: ``load(name)`` returns the chosen module, and every public class and function
binds its kernels from it at import. ``USE_EXTENSIONS`` is true only when every kernel
module is compiled; ``extensions()`` says which are and why any is not. A partial
fallback (some modules compiled, some not, for example one that failed to build or to
load) warns once with a ``RuntimeWarning``; a source checkout that was never built (the
``.pyx`` sources beside the package, no compiled module) warns once too, saying how to
build it or silence the warning.

Tests and benchmarks that compare the two implementations ask ``kernels(kind, name)``
for one implementation's kernel module by name; nothing else selects one.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

__all__ = [
    "TWINS",
    "KERNEL_MODULES",
    "NO_EXTENSIONS",
    "NEVER_BUILT",
    "USE_EXTENSIONS",
    "IMPORT_ERROR",
    "ModuleStatus",
    "extensions",
    "load",
    "exports",
    "kernels",
    "common_prefix",
    "prompt_lookup",
    "settle",
]

#: Every kernel module: its name (the compiled module is ``specfsm._core.<name>``) and
#: the module path of its pure-Python twin. The one list of kernel modules: the tests,
#: the stub checks and ``.ci/typecheck`` read it from here.
TWINS: dict[str, str] = {
    "accept": "specfsm.accept._accept_py",
    "batch": "specfsm.machine._batch_py",
    "ngram": "specfsm.drafting._ngram_py",
    "ngram_index": "specfsm.drafting._ngram_index_py",
    "place": "specfsm.placement._place_py",
    "prefix": "specfsm.accept._prefix_py",
    "recycling": "specfsm.drafting._recycling_py",
    "rows": "specfsm.drafting._rows_py",
    "settle": "specfsm.machine._settle_py",
    "suffix_index": "specfsm.drafting._suffix_index_py",
    "suffix_trie": "specfsm.drafting._suffix_trie_py",
    "tree": "specfsm.tree._tree_py",
}
KERNEL_MODULES: tuple[str, ...] = tuple(TWINS)


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


def kernels(kind: str, name: str) -> ModuleType:
    """Kernel module ``name`` of one implementation, ``"compiled"`` or ``"python"``.

    For tests and benchmarks that compare the two, whatever the rule chose; raises
    ImportError when the compiled module is asked for and not built, and KeyError for a
    name that is not a kernel module.
    """
    if name not in TWINS:
        raise KeyError(f"{name!r} is not a kernel module; they are {', '.join(KERNEL_MODULES)}")
    if kind == "compiled":
        return import_module(f"specfsm._core.{name}")
    if kind == "python":
        return import_module(TWINS[name])
    raise ValueError(f"kind must be 'compiled' or 'python', got {kind!r}")


_ACTIVE: dict[str, ModuleType] = {}
_ERRORS: dict[str, ImportError] = {}


def _compiled(name: str) -> ModuleType | None:
    """The compiled module of kernel module ``name``, or None where the rule gives the
    twin: switched off, or the compiled module does not import (its error is kept)."""
    global IMPORT_ERROR
    if NO_EXTENSIONS:
        return None
    try:
        return kernels("compiled", name)
    except ImportError as exc:  # a source tree that was never built, or a broken build
        _ERRORS[name] = exc
        if IMPORT_ERROR is None:
            IMPORT_ERROR = exc
        return None


def _share_docs(compiled: ModuleType, twin: ModuleType) -> ModuleType:
    """``compiled``, its functions and methods given the twin's docstrings.

    Every docstring of a kernel function or method is written once, in the twin (plain
    Python, readable wherever the package is); a compiled function (a Cython function,
    whose ``__doc__`` is writable) that has none takes the twin's here, so ``help()``
    shows the same text on both implementations. Class docstrings and properties of
    compiled classes are fixed at build time and written in the ``.pyx``."""
    for name in twin.__all__:
        mine, theirs = getattr(compiled, name, None), getattr(twin, name)
        if isinstance(theirs, type) and isinstance(mine, type):
            for attr, value in vars(mine).items():
                _give_doc(value, getattr(theirs, attr, None))
        else:
            _give_doc(mine, theirs)
    return compiled


def _give_doc(target: object, source: object) -> None:
    """``source``'s docstring on the Cython function ``target`` when it has none of its
    own: nothing, or only the signature line Cython embeds (kept first, as help() and
    ``inspect.signature`` read it)."""
    doc = getattr(source, "__doc__", None)
    if not doc or type(target).__name__ != "cython_function_or_method":
        return
    own = target.__doc__
    if own is None:
        target.__doc__ = doc
    elif "\n" not in own.strip() and own.strip().endswith(")") and "(" in own:
        target.__doc__ = own.strip() + "\n\n" + inspect.cleandoc(doc)


def load(name: str) -> ModuleType:
    """The active implementation of kernel module ``name``: the one the rule chose when
    ``specfsm._impl`` was imported (KeyError for a name that is not a kernel module).
    The twin is imported on the first call that needs it (for the docstrings it gives
    the compiled module, or to run), never by this module's own import."""
    active = _ACTIVE.get(name)
    if active is None:
        compiled = _COMPILED[name]
        twin = kernels("python", name)
        active = _ACTIVE[name] = twin if compiled is None else _share_docs(compiled, twin)
    return active


def exports(name: str) -> dict[str, object]:
    """The active implementation of kernel module ``name``, as the names it exports: what
    a concept's public module takes as its own (``globals().update(exports(name))``), so
    each public class and function is the implementation's object itself."""
    module = load(name)
    return {n: getattr(module, n) for n in module.__all__}


def extensions() -> dict[str, ModuleStatus]:
    """Every kernel module's status: compiled, or fallen back to the twin and why.

    ``error`` holds the ImportError of a compiled module that failed to import; it is None
    for a compiled module and for every module when the compiled core is switched off
    (``SPECFSM_NO_EXTENSIONS`` or a non-CPython interpreter, see ``NO_EXTENSIONS``).
    """
    return {
        name: ModuleStatus(name, compiled is not None, f"specfsm._core.{name}" if compiled is not None else TWINS[name],
                           _ERRORS.get(name))
        for name, compiled in _COMPILED.items()
    }


def _never_built_checkout() -> bool:
    """Whether this package is a source checkout whose compiled core was never built:
    the ``.pyx`` sources sit in ``_core/`` beside the package directory and no kernel
    module imported compiled."""
    core = Path(__file__).resolve().parent.parent / "_core"
    return core.is_dir() and any(core.rglob("*.pyx")) and len(_ERRORS) == len(KERNEL_MODULES)


# the rule, applied at import: which compiled modules are used (the kernel layer only;
# the twins, inside the concept packages, are imported by ``load`` when asked for)
_COMPILED: dict[str, ModuleType | None] = {name: _compiled(name) for name in KERNEL_MODULES}

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

# The foundation kernels, for callers outside the public layer (the active ones), bound on
# first use.
if TYPE_CHECKING:  # type checkers read the twin: typed Python with the same names
    from .drafting._ngram_py import prompt_lookup
    from .accept._prefix_py import common_prefix
    from .machine._settle_py import settle
else:
    _FOUNDATION = {"common_prefix": "prefix", "prompt_lookup": "ngram", "settle": "settle"}

    def __getattr__(name: str) -> object:
        kernel = _FOUNDATION.get(name)
        if kernel is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(load(kernel), name)
