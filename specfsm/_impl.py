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
example one that failed to build or to load) warns once with a ``RuntimeWarning``.
"""

from __future__ import annotations

import os
import sys
import warnings
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

__all__ = [
    "KERNEL_MODULES",
    "NO_EXTENSIONS",
    "USE_EXTENSIONS",
    "IMPORT_ERROR",
    "ModuleStatus",
    "extensions",
    "load",
    "module",
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


for _name in KERNEL_MODULES:
    load(_name)

USE_EXTENSIONS: bool = all(s.compiled for s in extensions().values())

if not NO_EXTENSIONS and _ERRORS and len(_ERRORS) < len(KERNEL_MODULES):
    warnings.warn(
        "specfsm: the compiled core is only partly available; these kernel modules run on "
        "the pure-Python twin: "
        + "; ".join(f"{name} ({exc})" for name, exc in _ERRORS.items())
        + ". specfsm.USE_EXTENSIONS is False; see specfsm.extensions().",
        RuntimeWarning,
        stacklevel=1,
    )

if TYPE_CHECKING:  # type checkers read the twin: typed Python with the same names
    from ._py import ngram as _ngram
    from ._py import prefix as _prefix
    from ._py import settle as _settle
else:
    _prefix = load("prefix")
    _ngram = load("ngram")
    _settle = load("settle")

common_prefix = _prefix.common_prefix
prompt_lookup = _ngram.prompt_lookup
settle = _settle.settle
