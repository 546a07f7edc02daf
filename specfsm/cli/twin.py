"""The pure-Python twin's replay runs in a child process: ``specfsm replay`` measures the
twin beside the compiled core by running ``orchestrate.speculative_runs`` again under
``SPECFSM_NO_EXTENSIONS=1``, where every public class is the twin's (an implementation
is chosen once per process, at import). ``run_twin`` is the parent's side; the child
(``python -m specfsm.cli.orchestrate``) calls ``serve_child``: it reads the pickled
workload and settings on stdin and writes the pickled outcome on stdout."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ..serving.loop import RequestResult
from ..machine.state import Done
from ..serving.workload import Workload

__all__ = ["run_twin", "serve_child"]


def run_twin(workload: Workload, settings: dict[str, Any]) -> tuple[float | None, list[RequestResult], int]:
    """``speculative_runs(workload, **settings)`` on the twin, in a child process:
    ``(best control-plane µs per token, that run's results, runs made)``. An exception
    the child raised is raised here."""
    import specfsm

    root = os.path.dirname(os.path.dirname(os.path.abspath(specfsm.__file__)))
    env = dict(os.environ, SPECFSM_NO_EXTENSIONS="1")
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-m", "specfsm.cli.orchestrate"],
        input=pickle.dumps((workload, settings)), capture_output=True, env=env, check=False,
    )
    try:
        status, value = pickle.loads(proc.stdout)
    except Exception:  # noqa: BLE001 - the child died before answering
        raise RuntimeError(
            f"the python twin's replay process failed (exit status {proc.returncode}): "
            f"{proc.stderr.decode(errors='replace').strip()[-2000:]}"
        ) from None
    if status == "error":
        raise value
    best, rows, done = value
    return best, [RequestResult(out, stats, Done(cache)) for out, stats, cache in rows], done


def serve_child(runs: Callable[..., tuple[float | None, list[RequestResult], int]]) -> None:
    """The child's side: ``runs(workload, **settings)`` on the pickled pair read from
    stdin, its outcome (or the exception it raised) pickled to stdout."""
    workload, settings = pickle.loads(sys.stdin.buffer.read())
    try:
        best, results, done = runs(workload, **settings)
        # every result ends in Done, whose cache is the teacher-forced target's position
        rows = [(r.output, r.stats, getattr(r.state, "cache", None)) for r in results]
        answer: tuple[str, Any] = ("ok", (best, rows, done))
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        answer = ("error", exc)
    sys.stdout.buffer.write(pickle.dumps(answer))
