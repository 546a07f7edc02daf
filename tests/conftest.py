"""Every test that takes ``impl`` (or ``fsm``) runs once per implementation: the compiled
core (marked ``compiled``) and the pure-Python twin.

With ``SPECFSM_NO_EXTENSIONS`` set the compiled parameter is skipped; otherwise a
compiled core that fails to import is a test failure, not a skip, so a broken build
cannot hide behind the twin.
"""

from __future__ import annotations

import pytest

from specfsm import _impl

IMPLEMENTATIONS = [
    pytest.param("compiled", marks=pytest.mark.compiled, id="compiled"),
    pytest.param("python", id="python"),
]


@pytest.fixture(scope="session", params=IMPLEMENTATIONS)
def impl(request):
    """The kernels of one implementation (``impl.name`` is ``"compiled"`` or ``"python"``)."""
    if request.param == "compiled":
        if _impl.NO_EXTENSIONS:
            pytest.skip("SPECFSM_NO_EXTENSIONS is set: the compiled core is switched off")
        try:
            return _impl.implementation("compiled")
        except ImportError as exc:  # pragma: no cover - a broken build
            pytest.fail(f"the compiled core does not import ({exc}); build it or set SPECFSM_NO_EXTENSIONS=1")
    return _impl.implementation("python")


@pytest.fixture
def fsm(impl, monkeypatch):
    """Routes the state machine (and every public wrapper) through ``impl``'s kernels."""
    for name in ("common_prefix", "prompt_lookup", "settle"):
        monkeypatch.setattr(_impl, name, getattr(impl, name))
    return impl
