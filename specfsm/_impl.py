"""The one place that picks the compiled core or its pure-Python twin.

The twin is used when ``SPECFSM_NO_EXTENSIONS`` is set to a true value (anything but
empty, ``0``, ``false``, ``no``, ``off``), on interpreters other than CPython, or when
the compiled modules fail to import (a source checkout that was never built). Everything
else in the package reaches the kernels through this module's attributes.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import TYPE_CHECKING

__all__ = [
    "USE_EXTENSIONS",
    "IMPORT_ERROR",
    "common_prefix",
    "prompt_lookup",
    "settle",
    "implementation",
]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


NO_EXTENSIONS: bool = _env_flag("SPECFSM_NO_EXTENSIONS") or sys.implementation.name != "cpython"
IMPORT_ERROR: ImportError | None = None

from ._py import ngram as _py_ngram
from ._py import prefix as _py_prefix
from ._py import settle as _py_settle

# Type checkers read the twin: typed Python with the same names as the compiled modules.
_ngram, _prefix, _settle = _py_ngram, _py_prefix, _py_settle
if not TYPE_CHECKING:
    if not NO_EXTENSIONS:
        try:
            from ._core import ngram as _ngram
            from ._core import prefix as _prefix
            from ._core import settle as _settle
        except ImportError as exc:  # a source tree that was never built
            IMPORT_ERROR = exc
            _ngram, _prefix, _settle = _py_ngram, _py_prefix, _py_settle

USE_EXTENSIONS: bool = _prefix.__name__.startswith("specfsm._core.")

common_prefix = _prefix.common_prefix
prompt_lookup = _ngram.prompt_lookup
settle = _settle.settle


def implementation(name: str) -> SimpleNamespace:
    """The kernels of one implementation, ``"compiled"`` or ``"python"``, for tests and benchmarks.

    Raises ImportError when ``"compiled"`` is asked for and the core is not built.
    """
    if name == "python":
        mods = (_py_prefix, _py_ngram, _py_settle)
    elif name == "compiled":
        from ._core import ngram, prefix, settle as settle_mod

        mods = (prefix, ngram, settle_mod)
    else:
        raise ValueError(f"implementation must be 'compiled' or 'python', got {name!r}")
    prefix_mod, ngram_mod, settle_mod = mods
    return SimpleNamespace(
        name=name,
        common_prefix=prefix_mod.common_prefix,
        prompt_lookup=ngram_mod.prompt_lookup,
        settle=settle_mod.settle,
    )
