"""Benchmarks of the kernels run each case on the compiled core and on the pure-Python twin
in the same process (``kernel_kind``: ``specfsm._impl.kernels(kind, name)``), so their
ratio is measured side by side (``--benchmark-group-by=group``). Benchmarks of the
public layer (``kind``) run on the active implementation, the one ``specfsm._impl``'s
rule chose at import; the other kind is skipped, so run the suite a second time with
``SPECFSM_NO_EXTENSIONS=1`` for the twin's numbers in the same groups.

A run whose ``specfsm`` is the twin without that variable set stops before collecting
anything: the benchmarks name the compiled core, so timing the twin by accident (a
checkout that was never built, put first on ``sys.path`` by ``python -m pytest``, or a
partial build) would print wrong numbers under the right names. With the variable set the
run goes on, under a banner saying the public layer's numbers are the twin's."""

from __future__ import annotations

import os

import numpy as np
import pytest

import specfsm
from specfsm import _impl

from _twin_check import active_refusal

#: the implementation the public layer runs on in this process
ACTIVE_KIND = "python" if _impl.NO_EXTENSIONS else "compiled"
#: the directory the imported specfsm package came from
SPECFSM_DIR = os.path.dirname(os.path.abspath(specfsm.__file__))

TWIN_BANNER = (
    "SPECFSM_NO_EXTENSIONS is set: the public layer runs on the pure-Python twin; "
    "'compiled' cases are skipped and these are the twin's numbers"
)


def pytest_sessionstart(session):
    refusal = active_refusal()
    if refusal is not None:
        pytest.exit(refusal, returncode=4)


def pytest_report_header(config):
    lines = [f"specfsm: {SPECFSM_DIR} ({'compiled core' if _impl.USE_EXTENSIONS else 'pure-Python twin'})"]
    if _impl.NO_EXTENSIONS:
        lines.append("!" * 20 + " " + TWIN_BANNER + " " + "!" * 20)
    return lines


def pytest_terminal_summary(terminalreporter):
    if _impl.NO_EXTENSIONS:  # shown under -q too, where the header is not
        terminalreporter.write_sep("!", TWIN_BANNER, red=True, bold=True)


@pytest.fixture(params=["compiled", "python"])
def kind(request):
    """The public layer's implementation: the active one (the other is skipped)."""
    if request.param != ACTIVE_KIND:
        pytest.skip(
            f"the public layer runs on the {ACTIVE_KIND} implementation in this process"
            + ("" if ACTIVE_KIND == "python" else "; SPECFSM_NO_EXTENSIONS=1 runs it on the twin")
        )
    return request.param


@pytest.fixture(params=["compiled", "python"])
def kernel_kind(request):
    """One implementation's kernels (``specfsm._impl.kernels(kernel_kind, name)``)."""
    if request.param == "compiled" and _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set")
    return request.param


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread while a module's benchmarks run (``pytestmark`` of the torch
    benchmarks): figures that compare, and CI's cores are shared."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def repetitive_stream(length: int, vocab: int = 32_000, seed: int = 0) -> np.ndarray:
    """A code-editing-like token stream: spans copied from earlier in the stream (what
    prompt lookup feeds on) interleaved with fresh Zipf-distributed tokens."""
    rng = np.random.default_rng(seed)
    out = np.empty(length, dtype=np.int64)
    n = 0
    while n < length:
        if n > 64 and rng.random() < 0.6:
            span = int(rng.integers(8, 64))
            start = int(rng.integers(0, n - 8))
            piece = out[start : min(start + span, n)]
        else:
            piece = np.minimum(rng.zipf(1.3, size=int(rng.integers(4, 32))), vocab - 1)
        take = min(len(piece), length - n)
        out[n : n + take] = piece[:take]
        n += take
    return out


def unique_stream(length: int) -> np.ndarray:
    """No token repeats, so no n-gram ever matches: the full backward scan."""
    return np.arange(length, dtype=np.int64)
