"""Run a test body in a child interpreter, so that a kernel that crashes the process (a
segfault, an abort) fails the one test instead of killing the whole run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_isolated(code: str, impl_name: str, timeout: float = 120.0) -> str:
    """Run ``code`` (dedented) with ``IMPL`` bound to ``impl_name`` ("compiled" or
    "python") and the repository root importable; assert it exits cleanly and return
    its stdout. A crash shows up as a negative return code (the signal) in the message."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONFAULTHANDLER", "1")
    body = f"IMPL = {impl_name!r}\n" + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", body], capture_output=True, text=True, timeout=timeout,
        cwd=str(ROOT), env=env,
    )
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode} (negative: killed by that signal)\n"
        f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return proc.stdout
