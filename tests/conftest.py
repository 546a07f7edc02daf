"""Two fixtures pick what a test runs on.

``impl``: a kernel-level test runs once per implementation, the compiled core (marked
``compiled``) and the pure-Python twin, reaching one implementation's kernel modules
through ``impl.module(name)`` (``specfsm._impl.kernels``). With ``SPECFSM_NO_EXTENSIONS``
set the compiled parameter is skipped, with that reason; otherwise a compiled module that
fails to import is a test failure, not a skip, so a broken build cannot hide behind the
twin. A source checkout that was never built stops the run at once with one message
saying what to do (build in place, or set the variable), rather than failing every
compiled test.

``fsm``: a test of the public layer (``ServingState``, the rules, the drafters, ``BatchState``)
runs once, on the active implementation: the one ``specfsm._impl``'s rule chose at import.
CI runs the whole suite twice, compiled and then with ``SPECFSM_NO_EXTENSIONS=1``, so the
public layer is tested on both.
"""

from __future__ import annotations

import os

import pytest

from specfsm import _impl

IMPLEMENTATIONS = [
    pytest.param("compiled", marks=pytest.mark.compiled, id="compiled"),
    pytest.param("python", marks=pytest.mark.twin, id="python"),
]


class Implementation:
    """One implementation's kernels: ``impl.name`` and ``impl.module("ngram")`` (its kernel
    module, ``specfsm._impl.kernels(impl.name, "ngram")``) etc.

    Attribute access reaches the foundation kernels directly: ``impl.common_prefix``,
    ``impl.prompt_lookup``, ``impl.settle``.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def module(self, name: str):
        try:
            return _impl.kernels(self.name, name)
        except ImportError as exc:
            if self.name == "compiled":
                pytest.fail(
                    f"the compiled module specfsm._core.{name} does not import ({exc}); "
                    "build it (pip install . or python setup.py build_ext --inplace) "
                    "or set SPECFSM_NO_EXTENSIONS=1"
                )
            raise

    @property
    def common_prefix(self):
        return self.module("prefix").common_prefix

    @property
    def prompt_lookup(self):
        return self.module("ngram").prompt_lookup

    @property
    def settle(self):
        return self.module("settle").settle

    def __repr__(self) -> str:
        return f"Implementation({self.name!r})"


NEVER_BUILT_MESSAGE = (
    "specfsm's compiled core was never built in this checkout ({where}), so there is "
    "nothing to test the twin against. Build it in place first:\n"
    "    python setup.py build_ext --inplace     (or: pip install -e .)\n"
    "or test the pure-Python twin alone:\n"
    "    SPECFSM_NO_EXTENSIONS=1 python -m pytest"
)


def pytest_sessionstart(session):
    if _impl.NEVER_BUILT:
        import specfsm

        where = os.path.dirname(os.path.dirname(os.path.abspath(specfsm.__file__)))
        pytest.exit(NEVER_BUILT_MESSAGE.format(where=where), returncode=4)


@pytest.fixture(scope="session", params=IMPLEMENTATIONS)
def impl(request):
    """One implementation, compiled or python (see ``Implementation``)."""
    if request.param == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: the compiled core is switched off")
    return Implementation(request.param)


#: the implementation the public layer runs on in this process
ACTIVE_KIND = "python" if _impl.NO_EXTENSIONS else "compiled"


@pytest.fixture(scope="session")
def fsm():
    """The active implementation (an ``Implementation``), which every public class and
    function runs on. A partly built core fails here, naming what does not import."""
    broken = {name: st.error for name, st in _impl.extensions().items() if st.error is not None}
    if broken:
        pytest.fail(
            "the compiled core is only partly built, so the public layer runs on a mix: "
            + "; ".join(f"specfsm._core.{name} ({exc})" for name, exc in broken.items())
        )
    return Implementation(ACTIVE_KIND)


@pytest.fixture(scope="session")
def compiled(request):
    """The compiled core, for a test that compares it with the twin
    (``specfsm._impl.kernels("python", name)``): skipped, with the reason, on the twin run,
    where there is nothing to compare; a compiled module that does not import fails."""
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled core to compare the twin with")
    return Implementation("compiled")


def pytest_collection_modifyitems(items):
    for item in items:  # a test on the compiled core is selectable as such (-m compiled)
        if "compiled" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.compiled)


class BatchKernels:
    """One implementation's batch kernel module, with ``BatchState`` the public class
    over its kernel class (``tests/impls.py``'s ``over``: ``state_of`` builds state values);
    every other name is the module's (``kernels``: the module itself)."""

    def __init__(self, kernels) -> None:
        from specfsm.machine import batch

        self.kernels = kernels
        from impls import over  # (here: a copied conftest runs without it)

        self.BatchState = over(kernels)

    def __getattr__(self, name: str):
        return getattr(self.kernels, name)


@pytest.fixture
def bm(impl):
    """``impl``'s batch kernels with the public ``BatchState`` (see ``BatchKernels``)."""
    return BatchKernels(impl.module("batch"))
