"""The one place that picks the compiled core or its pure-Python twin.

The twin is used when ``SPECFSM_NO_EXTENSIONS`` is set to a true value (anything but
empty, ``0``, ``false``, ``no``, ``off``), on interpreters other than CPython, or when
the compiled modules fail to import (a source checkout that was never built). Kernel
module ``specfsm._core.<name>`` has its twin in ``specfsm._py.<name>``, with the same
names and behaviour; everything else in the package reaches the kernels through
``load(name)`` or this module's attributes.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = [
    "NO_EXTENSIONS",
    "USE_EXTENSIONS",
    "IMPORT_ERROR",
    "load",
    "module",
    "common_prefix",
    "prompt_lookup",
    "settle",
]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


NO_EXTENSIONS: bool = _env_flag("SPECFSM_NO_EXTENSIONS") or sys.implementation.name != "cpython"
IMPORT_ERROR: ImportError | None = None


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


def load(name: str) -> ModuleType:
    """The active implementation of kernel module ``name`` (compiled unless the rule says not)."""
    global IMPORT_ERROR
    if not NO_EXTENSIONS:
        try:
            return module("compiled", name)
        except ImportError as exc:  # a source tree that was never built
            IMPORT_ERROR = exc
    return module("python", name)


if TYPE_CHECKING:  # type checkers read the twin: typed Python with the same names
    from ._py import ngram as _ngram
    from ._py import prefix as _prefix
    from ._py import settle as _settle
else:
    _prefix = load("prefix")
    _ngram = load("ngram")
    _settle = load("settle")

USE_EXTENSIONS: bool = _prefix.__name__.startswith("specfsm._core.")

common_prefix = _prefix.common_prefix
prompt_lookup = _ngram.prompt_lookup
settle = _settle.settle
