"""The hostile harness: every compiled entry point (and its twin, and the public
wrappers) attacked by threads that rewrite caller-owned arrays during calls, conversion
callbacks that rewrite arguments already passed, extreme integers, hostile lists and
concurrent ``NgramIndex`` use. The rule: each call returns (what the twin returns, in the
single-threaded scenarios) or raises TypeError, ValueError, IndexError, OverflowError,
RuntimeError or IllegalTransition; it never crashes the process.

Each scenario runs in a subprocess of its own (``tests/hostile/runner.py``), so a
segfault is a failed test with its Python stack (faulthandler), not a dead test run.
``SPECFSM_HOSTILE_SECONDS`` sets the time per scenario (default 2; ``.ci/asan`` runs it
under AddressSanitizer, where any report is a failure); ``SPECFSM_HOSTILE_SEED`` replays
one seed (the failure message names it).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from isolated import child_env

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile", "runner.py")
SECONDS = float(os.environ.get("SPECFSM_HOSTILE_SECONDS", "2"))
SCENARIOS = [
    "extreme_ints",
    "callbacks",
    "lists",
    "threads_accept",
    "threads_match",
    "threads_place",
    "ngram_threads",
    "public",
    "vllm_rows", "vllm_threads",  # tests/hostile/scenarios_vllm.py
    "batch",  # tests/hostile/scenarios_batch.py
    "tree_inputs", "tree_threads",  # tests/hostile/scenarios_tree.py
    "recycling_inputs", "recycling_threads",  # tests/hostile/scenarios_recycling.py
    "trie_inputs", "trie_threads",  # tests/hostile/scenarios_suffix_trie.py
    "index_reentry",
    "index_threads",
]


def run_scenario(kind: str, scenario: str) -> subprocess.CompletedProcess:
    env = child_env()  # the same specfsm as this run
    if kind == "python":
        env["SPECFSM_NO_EXTENSIONS"] = "1"  # the public wrappers use the twin too
    else:
        env.pop("SPECFSM_NO_EXTENSIONS", None)
    args = [sys.executable, RUNNER, kind, scenario, str(SECONDS)]
    if os.environ.get("SPECFSM_HOSTILE_SEED"):
        args.append(os.environ["SPECFSM_HOSTILE_SEED"])
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=SECONDS * 4 + 120)


def test_scenarios_are_the_runners():
    sys.path.insert(0, os.path.dirname(RUNNER))
    try:
        import runner
    finally:
        sys.path.pop(0)
    assert sorted(runner.SCENARIOS) == sorted(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_hostile(impl, scenario):
    proc = run_scenario(impl.name, scenario)
    tail = (proc.stdout + proc.stderr)[-6000:]
    current = proc.stderr.find("Current thread")  # faulthandler: the thread that crashed
    if current >= 0:
        tail = proc.stderr[current : current + 3000] + "\n...\n" + tail[-2000:]
    if proc.returncode < 0 or proc.returncode > 128:
        pytest.fail(f"{scenario} [{impl.name}] CRASHED (exit status {proc.returncode}):\n{tail}")
    assert proc.returncode == 0, f"{scenario} [{impl.name}] broke the rule:\n{tail}"
    assert "survived" in proc.stdout
    assert "ERROR: AddressSanitizer" not in proc.stderr, tail
