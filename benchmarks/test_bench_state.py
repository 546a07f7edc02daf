"""Foundation benchmarks: state transitions and prompt lookup, compiled vs twin.

Run: pytest benchmarks/test_bench_state.py --benchmark-group-by=group --benchmark-columns=median,iqr,rounds
Targets: verify cycle at K = 5 under 2 µs compiled; prompt_lookup at 128k
tokens at least 100x faster than the twin and under 60 µs.
"""

from __future__ import annotations

import numpy as np
import pytest

import specfsm
from specfsm import ServingState

from conftest import repetitive_stream, unique_stream

DECODE = ServingState.start([1, 2, 3], 0).advance_prefill(4, 1)


def test_advance_decode(benchmark, kind):
    benchmark.group = "advance_decode"
    state = DECODE
    benchmark(state.advance_decode, 5, 2)


@pytest.mark.parametrize("outcome", ["accept", "rollback"])
def test_verify_cycle_k5(benchmark, kind, outcome):
    """enter_verify + accept + resume (all 5 rows accepted) or rollback (rejected at row 3)."""
    benchmark.group = f"verify cycle K=5 ({outcome})"
    draft = [11, 12, 13, 14, 15]
    rows = draft if outcome == "accept" else [11, 12, 13, 99, 99]
    caches = [10, 11, 12, 13, 14]
    state = DECODE

    def cycle():
        settled = state.enter_verify(draft).accept(rows, caches)
        return settled.resume() if outcome == "accept" else settled.rollback()

    result = benchmark(cycle)
    assert result.last == (15 if outcome == "accept" else 99)


LENGTHS = [1_000, 8_000, 32_000, 128_000]


@pytest.mark.parametrize("length", LENGTHS, ids=lambda n: f"{n // 1000}k")
@pytest.mark.parametrize("stream", ["repetitive", "nomatch"])
@pytest.mark.parametrize("container", ["numpy", "list"])
def test_prompt_lookup(benchmark, kind, length, stream, container):
    benchmark.group = f"prompt_lookup {stream} {container} {length // 1000}k"
    history = repetitive_stream(length) if stream == "repetitive" else unique_stream(length)
    if container == "list":
        history = history.tolist()
    lookup = specfsm.prompt_lookup  # the public function, on the active implementation
    slow = kind == "python" and (stream == "nomatch" or length >= 32_000)
    if slow:
        benchmark.pedantic(lookup, args=(history, 3, 5), rounds=3, iterations=1)
    else:
        benchmark(lookup, history, 3, 5)
