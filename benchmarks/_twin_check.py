"""Whether a benchmark may time the imported specfsm: the pytest suites (``conftest.py``)
and the stand-alone scripts (``hf_generate.py``, ``vllm_serve.py``) refuse to start when
it runs on the pure-Python twin without ``SPECFSM_NO_EXTENSIONS`` set, which would print
the twin's numbers under the compiled core's name. No pytest here: the scripts run
without it."""

from __future__ import annotations

import os
import sys

import specfsm
from specfsm import _impl


def twin_refusal(use_extensions: bool, explicit: bool, never_built: bool,
                 broken: dict[str, str], where: str) -> str | None:
    """Why a benchmark run must not start, or None when it may: the imported specfsm
    runs (in part or whole) on the twin and ``SPECFSM_NO_EXTENSIONS`` was not set."""
    if use_extensions or explicit:
        return None
    if never_built:
        why = "a source checkout whose compiled core was never built"
    elif broken:
        why = "these compiled modules do not import: " + "; ".join(
            f"specfsm._core.{name} ({err})" for name, err in broken.items())
    else:
        why = "the compiled core is not active"
    return (
        f"specfsm imported from {where} runs on the pure-Python twin ({why}), so these "
        "benchmarks would time the twin under the compiled core's name. Two ways out:\n"
        "    build the compiled core in place, then run as you did:\n"
        '        pip install "setuptools>=77" "Cython>=3.0.8" numpy\n'
        "        python setup.py build_ext --inplace\n"
        "    or install the package and run the pytest command (python -m pytest and\n"
        "    PYTHONPATH=. put the checkout's specfsm/ ahead of the installed one):\n"
        '        pip install ".[test,bench]"\n'
        "        pytest -c benchmarks/pytest.ini benchmarks/test_bench_step.py\n"
        "To time the twin on purpose, set SPECFSM_NO_EXTENSIONS=1."
    )


def active_refusal() -> str | None:
    """``twin_refusal`` for the specfsm this process imported."""
    return twin_refusal(
        _impl.USE_EXTENSIONS,
        _impl._env_flag("SPECFSM_NO_EXTENSIONS"),
        _impl.NEVER_BUILT,
        {name: str(st.error) for name, st in _impl.extensions().items() if st.error is not None},
        os.path.dirname(os.path.abspath(specfsm.__file__)),
    )


def exit_if_twin(script: str) -> None:
    """A stand-alone benchmark's first call: stop with exit status 4 and the reason
    when it would time the twin by accident; a loud line when the twin is asked for."""
    refusal = active_refusal()
    if refusal is not None:
        print(f"{script}: {refusal}", file=sys.stderr)
        raise SystemExit(4)
    if not _impl.USE_EXTENSIONS:
        print(f"{script}: SPECFSM_NO_EXTENSIONS is set: these are the pure-Python twin's numbers",
              file=sys.stderr)
