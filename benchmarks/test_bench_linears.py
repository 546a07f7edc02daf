"""The packed linear layers (``specfsm.hf.linears``) against torch's stock ``nn.Linear``,
by rows, on one torch thread (needs torch).

The layers are SmolLM2-135M's (30 blocks of q, k, v, o, gate, up and down: 576 wide,
1536 inside, 106 M float32 weights, random, so no download), evaluated one after the
other as a forward does, at 1 row (a decode), 2, 4 and 8 (verifies). What a verify costs
over a decode is what speculative decoding has to earn back; docs/numbers.md, "Packed
linear layers", has the figures."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specfsm.hf.linears import pack_linears  # noqa: E402

HIDDEN, INNER, KV, BLOCKS = 576, 1536, 192, 30


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _blocks():
    torch.manual_seed(0)
    shapes = [(HIDDEN, HIDDEN), (HIDDEN, KV), (HIDDEN, KV), (HIDDEN, HIDDEN), (HIDDEN, INNER), (HIDDEN, INNER),
              (INNER, HIDDEN)]
    return torch.nn.ModuleList(torch.nn.Linear(i, o, bias=False) for _ in range(BLOCKS) for i, o in shapes).eval()


@pytest.fixture(scope="module", params=["stock", "packed"])
def layers(request):
    mods = _blocks()
    if request.param == "packed" and pack_linears(mods) == 0:
        pytest.skip("torch built without oneDNN")
    return request.param, mods


@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_linear_layers_by_rows(benchmark, layers, rows):
    kind, mods = layers
    benchmark.group = f"SmolLM2's linear layers, {rows} row{'s' if rows > 1 else ''}"
    x = {HIDDEN: torch.randn(rows, HIDDEN), INNER: torch.randn(rows, INNER)}

    def run():
        with torch.inference_mode():
            for m in mods:
                m(x[m.in_features])

    benchmark.pedantic(run, rounds=7, iterations=1, warmup_rounds=1)
