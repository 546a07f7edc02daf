"""``specfsm.hf.linears``: the packed linear layers give the stock layer's values (one row
and several, 2-D and 3-D inputs, with and without bias), fall back to the stock forward
wherever the packed one does not apply (gradients, other dtypes, a weight replaced or
rewritten after packing), leave greedy decoding and specfsm's outputs equal to plain
greedy's, undo cleanly, and are part of the head measurement's key."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_helpers import one_thread  # noqa: E402, F401 (a module-wide fixture)
from hf_helpers import generate_json, reference, tiny_llama  # noqa: E402

from specfsm.hf.evaluate import HeadRows  # noqa: E402
from specfsm.hf.linears import LINEARS, linears_of, pack_linears, unpack_linears  # noqa: E402

VOCAB = 59

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


def _layer(bias, n_in=24, n_out=40, seed=3):
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out, bias=bias).eval()


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (2, 24), (5, 24), (1, 7, 24), (3, 4, 24), (33, 24)])
def test_a_packed_layer_gives_the_stock_values(bias, shape):
    layer = _layer(bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        want = layer(x)
        assert pack_linears(layer) == 1 and linears_of(layer) == "packed"
        got = layer(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert unpack_linears(layer) == 1 and linears_of(layer) == "stock" and "forward" not in layer.__dict__


@needs_onednn
def test_packing_twice_packs_nothing_new_and_other_layers_are_left_alone():
    model = torch.nn.Sequential(_layer(False), torch.nn.ReLU(), _layer(True, 40, 8), torch.nn.Linear(8, 8).double())
    assert pack_linears(model) == 2  # the float64 layer stays stock
    assert pack_linears(model) == 0
    assert "forward" not in model[3].__dict__
    x = torch.randn(3, 24)
    with torch.no_grad():
        torch.testing.assert_close(model[:3](x), torch.relu(x @ model[0].weight.T) @ model[2].weight.T + model[2].bias)
    assert unpack_linears(model) == 2 and unpack_linears(model) == 0


@needs_onednn
def test_gradients_take_the_stock_forward_and_flow():
    layer = _layer(True)
    stock = _layer(True)
    pack_linears(layer)
    x = torch.randn(4, 24)
    layer(x).square().sum().backward()
    stock(x).square().sum().backward()
    torch.testing.assert_close(layer.weight.grad, stock.weight.grad)
    torch.testing.assert_close(layer.bias.grad, stock.bias.grad)


def _rewrite(layer, change):
    if change == "in place":
        layer.weight.mul_(2.0)
    elif change == "storage":  # new storage, the same version
        layer.weight.data = torch.randn(40, 24)
    elif change == "replaced":
        layer.weight = torch.nn.Parameter(torch.randn(40, 24))
    else:  # another dtype: the stock forward
        layer.double()


@needs_onednn
@pytest.mark.parametrize("change", ["in place", "storage", "replaced", "dtype"])
@pytest.mark.parametrize("rows", [1, 6])
def test_a_weight_rewritten_or_replaced_after_packing_is_read_as_it_is_now(rows, change):
    layer = _layer(False)
    pack_linears(layer)
    x = torch.randn(rows, 24)
    with torch.no_grad():
        layer(x)
        _rewrite(layer, change)
        if change == "dtype":
            x = x.double()
        torch.testing.assert_close(layer(x), x @ layer.weight.T)


@needs_onednn
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_greedy_and_specfsm_on_a_packed_model_equal_greedy_on_the_stock_model(impl):
    from specfsm.hf.generate import SpeculativeGenerator

    stock = tiny_llama(VOCAB, impl, seed=1)
    packed = tiny_llama(VOCAB, impl, seed=1)
    assert pack_linears(packed) == len(_linears(packed)) == 15  # 2 layers x 7, and the head
    prompts = [[5, 6, 7, 8, 9] * 6, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3] * 3]
    want = [reference(stock, p, 40) for p in prompts]
    assert [reference(packed, p, 40) for p in prompts] == want
    for k in ("adaptive", 4):
        gen = SpeculativeGenerator(packed, k=k)
        assert [o.tokens for o in gen.generate(prompts, 40)] == want


def test_load_model_refuses_unknown_linears_before_loading():
    from specfsm.hf.loading import load_model

    with pytest.raises(ValueError, match="linears must be one of packed, stock, not 'fast'"):
        load_model("/nonexistent", linears="fast")
    assert LINEARS == ("packed", "stock")


@needs_onednn
def test_the_head_measurement_is_keyed_by_linears():
    model = tiny_llama(VOCAB)
    head = model.get_output_embeddings()
    stock = HeadRows._key(head)
    pack_linears(model)
    assert HeadRows._key(head) == stock.replace(" stock|", " packed|") != stock


@pytest.mark.parametrize("linears", LINEARS)
def test_the_command_line_takes_linears(tmp_path, capsys, linears):
    summary = generate_json(tmp_path, capsys, "--linears", linears)
    want = linears if torch.backends.mkldnn.is_available() else "stock"
    assert summary["model"]["linears"] == want
