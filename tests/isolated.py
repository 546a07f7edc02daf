"""Run a test body in a child interpreter, so that a kernel that crashes the process (a
segfault, an abort) fails the one test instead of killing the whole run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import specfsm

TESTS = Path(__file__).resolve().parent
#: where the specfsm under test was imported from: the installed package in CI, the
#: checkout for an in-place build; the child imports the same one
PACKAGE_ROOT = Path(specfsm.__file__).resolve().parent.parent


def child_env() -> dict[str, str]:
    """The environment of a child interpreter that imports the same specfsm as this one
    (and the tests' helper modules). Run it with ``cwd=TESTS``: ``python -c`` puts its
    working directory first on ``sys.path``, and a source checkout's never-built
    ``specfsm`` there would shadow the installed one."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_ROOT), str(TESTS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def run_isolated(code: str, impl_name: str, timeout: float = 120.0) -> str:
    """Run ``code`` (dedented) with ``IMPL`` bound to ``impl_name`` ("compiled" or
    "python") and the same specfsm importable; assert it exits cleanly and return
    its stdout. A crash shows up as a negative return code (the signal) in the message."""
    body = f"IMPL = {impl_name!r}\n" + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", body], capture_output=True, text=True, timeout=timeout,
        cwd=str(TESTS), env=child_env(),
    )
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode} (negative: killed by that signal)\n"
        f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return proc.stdout
