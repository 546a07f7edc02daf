"""The serving loop's control-plane cost: replaying code-editing requests built from the
standard library against a teacher-forced target.

The loop runs on the active implementation (``specfsm._impl``'s choice at import), so each
run measures one: the compiled core by default, the twin under ``SPECFSM_NO_EXTENSIONS=1``
(the other ``kind`` is skipped).

Run: pytest benchmarks/test_bench_loop.py --benchmark-group-by=group --benchmark-columns=median,iqr,rounds
Each round replays the same requests; ``extra_info`` records control-plane µs per output
token (the time outside the target), which is the figure ``specfsm replay`` prints.
"""

from __future__ import annotations

import pytest

from specfsm import _impl
from specfsm.drafting.lookup import PromptLookupDrafter
from specfsm.serving.loop import Request, SpeculativeLoop
from specfsm.drafting.ngram_index import NgramDrafter
from specfsm.serving.workload import TeacherForcedTarget, stdlib_workload

WORKLOAD = stdlib_workload(4)


def requests():
    return [
        Request(t.prompt, len(t.output), target=TeacherForcedTarget(t.prompt, t.output))
        for t in WORKLOAD.traces
    ]


def _replay(benchmark, loop, kind):
    active = "python" if _impl.NO_EXTENSIONS else "compiled"
    if kind != active:
        pytest.skip(f"the loop runs on the active implementation ({active}); "
                    "SPECFSM_NO_EXTENSIONS=1 measures the twin")
    reqs = requests()
    rounds = 5 if kind == "compiled" else 1
    results = benchmark.pedantic(loop.run_batch, args=(reqs,), rounds=rounds, iterations=1)
    toks = sum(r.stats.output_tokens for r in results)
    benchmark.extra_info["control_us_per_token"] = sum(r.stats.control_ns for r in results) / 1e3 / toks
    benchmark.extra_info["tokens"] = toks
    benchmark.extra_info["evaluations"] = sum(r.stats.evaluations for r in results)
    assert [r.output for r in results] == [t.output for t in WORKLOAD.traces]


def test_replay_prompt_lookup(benchmark, kind):
    benchmark.group = "replay 4 stdlib edits, prompt lookup n=3, k=5"
    _replay(benchmark, SpeculativeLoop(None, PromptLookupDrafter(3), k=5), kind)


def test_replay_ngram_index(benchmark, kind):
    benchmark.group = "replay 4 stdlib edits, n-gram index 2..4, k=5"
    _replay(benchmark, SpeculativeLoop(None, NgramDrafter(2, 4), k=5), kind)


def test_replay_plain_greedy(benchmark, kind):
    benchmark.group = "replay 4 stdlib edits, plain greedy"
    _replay(benchmark, SpeculativeLoop(None), kind)
