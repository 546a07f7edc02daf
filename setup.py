"""Build the compiled core: every ``_core/*.pyx`` becomes ``specfsm._core.<name>``.

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
    sources = sorted((HERE / CORE).glob("*.pyx"))
    extensions = [
        Extension(
            f"specfsm._core.{src.stem}",
            [f"{CORE}/{src.name}"],
            include_dirs=[numpy.get_include(), CORE],
            depends=[str(p.relative_to(HERE)) for pat in ("*.h", "*.pxd") for p in sorted((HERE / CORE).glob(pat))],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
            extra_compile_args=compile_args,
        )
        for src in sources
    ]
    return cythonize(
        extensions,
        include_path=[CORE],
        compiler_directives=directives,
        build_dir="build/cython",
        quiet=True,
    )


setup(ext_modules=_extensions())
