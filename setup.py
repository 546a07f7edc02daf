"""Build the compiled core: every ``_core/<concept>/<name>.pyx`` becomes ``specfsm._core.<name>``.

``_core/`` is organised by concept (``common/`` holds the declarations every module
cimports); module names stay flat, so ``specfsm._core.<name>`` mirrors the twin's
module of the same name. A module's cross-module declarations live beside it in a
``.pxd`` named with the full module name (``specfsm._core.<name>.pxd``), which is how
Cython finds them for ``from specfsm._core.<name> cimport ...``.

Cython directives are set once here for the whole core (bounds and wraparound checks
off: every kernel validates its arguments at the Python boundary, then runs unchecked).
``SPECFSM_CYTHON_DEBUG=1`` at build time turns the checks back on, for hunting an
out-of-bounds access. ``SPECFSM_NO_EXTENSIONS=1`` at build time skips the compiled
core altogether (the package then runs on its pure-Python twin).
"""

import os
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
CORE = "_core"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _extensions():
    if _flag("SPECFSM_NO_EXTENSIONS"):
        return []
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension

    debug = _flag("SPECFSM_CYTHON_DEBUG")
    directives = {
        "language_level": 3,
        "boundscheck": debug,
        "wraparound": debug,
        "initializedcheck": debug,
        "cdivision": True,
        "embedsignature": True,
    }
    # Floating-point contraction off: typical acceptance promises bit-for-bit equality
    # with the twin, whose float64 arithmetic rounds after every multiply and add; a
    # compiler allowed to fuse ``h -= x * log(x)`` into an FMA (GCC's default with -mfma,
    # and on aarch64) would round once and drift in the last bit. MSVC does not contract
    # unless asked (/fp:contract), so it needs no flag.
    compile_args = [] if sys.platform == "win32" else ["-ffp-contract=off"]
    sources = sorted((HERE / CORE).rglob("*.pyx"))
    folders = sorted({str(p.parent.relative_to(HERE)) for p in (HERE / CORE).rglob("*") if p.suffix in (".pyx", ".pxd", ".h")})
    depends = [str(p.relative_to(HERE)) for pat in ("*.h", "*.pxd") for p in sorted((HERE / CORE).rglob(pat))]
    extensions = [
        Extension(
            f"specfsm._core.{src.stem}",
            [str(src.relative_to(HERE))],
            include_dirs=[numpy.get_include(), *folders],
            depends=depends,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
            extra_compile_args=compile_args,
        )
        for src in sources
    ]
    return cythonize(
        extensions,
        include_path=folders,
        compiler_directives=directives,
        build_dir="build/cython",
        quiet=True,
    )


setup(ext_modules=_extensions())
