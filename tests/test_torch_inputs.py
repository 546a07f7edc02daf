"""A PyTorch backend's own tensors in, numpy out: CPU tensors are read as views of their
memory (DLPack) wherever numpy arrays are accepted, with the same rules and the same
results as the numpy path; tensors in device memory are refused by the host-side calls
with a message that says to pass host memory."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specfsm._checks import host_array, token_ids  # noqa: E402


class DeviceTensor:
    """A stand-in for a CUDA tensor (DLPack says device type 2, kDLCUDA): this machine
    may have no GPU, and the host-side refusal reads nothing but the device."""

    def __dlpack__(self, stream=None):
        raise AssertionError("a host-side call must not export device memory")

    def __dlpack_device__(self):
        return (2, 0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_cpu_tensors_convert_as_the_numpy_arrays_they_view(dtype):
    t = torch.tensor([3, 1, 4, 1, 5], dtype=dtype)
    got = token_ids(t, "tokens")
    assert got.tolist() == [3, 1, 4, 1, 5]
    assert got.dtype == token_ids(t.numpy(), "tokens").dtype


def test_a_native_cpu_tensor_is_read_in_place_not_copied():
    t = torch.arange(8, dtype=torch.int64)
    view = host_array(t, "x")
    assert isinstance(view, np.ndarray) and np.shares_memory(view, t.numpy())
    assert np.shares_memory(token_ids(t, "x"), t.numpy())        # no copy where numpy makes none


def test_device_tensors_and_unexportable_ones_are_refused_by_name():
    with pytest.raises(TypeError, match=r"row_tokens is a DeviceTensor in device memory .*pass host memory"):
        host_array(DeviceTensor(), "row_tokens")
    with pytest.raises(TypeError, match=r"probs: cannot read this Tensor"):
        host_array(torch.ones(3, requires_grad=True), "probs")
    with pytest.raises(TypeError, match="tokens"):
        token_ids(torch.ones(3, dtype=torch.bfloat16), "tokens")


def _run(batch_cls, conv):
    """Admit, prefill, verify and step a 3-slot batch with every array argument passed
    through ``conv``; returns everything the caller sees."""
    b = batch_cls(3, 4, True)
    b.admit(conv([0, 1, 2]), conv([5, 6, 7, 5, 6, 1]), conv([0, 2, 5, 6]), conv([10, 11, 12]))
    slots, inputs, off = b.pending()
    r1 = b.step(conv([9, 2, 5, 4, 3, 8]))
    b_v = [int(s) for s in r1.slots]
    assert b_v == [0, 1, 2]
    b.enter_verify(conv([0]), conv([2, 3]), conv([0, 2]))
    slots, inputs, off = b.pending()
    r2 = b.step(conv(list(range(int(off[-1])))))
    out = []
    for r in (r1, r2):
        for name in ("slots", "emitted", "emitted_offsets", "accepted", "resume_rows"):
            a = getattr(r, name)
            assert type(a) is np.ndarray       # outputs stay numpy
            out.append(a.tolist())
    return out, b.states.tolist(), b.tokens.tolist()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_batch_state_takes_cpu_tensors_everywhere_and_answers_as_with_numpy(fsm, dtype):
    import specfsm

    want = _run(specfsm.BatchState, lambda v: np.asarray(v, dtype=np.int64))
    got = _run(specfsm.BatchState, lambda v: torch.tensor(v, dtype=dtype))
    assert got == want


def test_batch_step_refuses_a_device_tensor_and_changes_nothing(fsm):
    import specfsm

    b = specfsm.BatchState(2)
    b.admit([0], [1, 2], [0, 2], [0])
    before = (b.states.tolist(), b.tokens.tolist())
    with pytest.raises(TypeError, match="pass host memory"):
        b.step(DeviceTensor())
    assert (b.states.tolist(), b.tokens.tolist()) == before
    assert b.step(torch.tensor([0, 3])).emitted.tolist() == [3]


PLACE_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", PLACE_DTYPES, ids=str)
def test_place_rows_and_snapshot_on_cpu_tensors_equal_the_numpy_path(fsm, dtype):
    import specfsm

    g = torch.Generator().manual_seed(7)
    src = (torch.randn(5, 4, 3, 2, generator=g) * 50).to(dtype)
    dst = torch.zeros(5, 3, 2, dtype=dtype)
    index = torch.tensor([3, -1, 0, 2, 1])
    want = dst.clone()
    for b, k in enumerate(index.tolist()):
        if k >= 0:
            want[b] = src[b, k]
    assert specfsm.place_rows(src, index, dst) is dst          # the caller's tensor, written in place
    assert torch.equal(dst, want)
    out = torch.empty_like(src)
    assert specfsm.snapshot(src, out) is out and torch.equal(out, src)
    if dtype is not torch.bfloat16:                            # numpy has no bfloat16
        n_src, n_dst = src.numpy().copy(), np.zeros((5, 3, 2), dtype=src.numpy().dtype)
        specfsm.place_rows(n_src, index.numpy(), n_dst)
        assert np.array_equal(n_dst, dst.numpy())


def test_host_placement_refuses_a_device_tensor_and_copies_nothing(fsm):
    import specfsm

    src, dst = torch.ones(2, 3, 4), torch.zeros(2, 4)
    with pytest.raises(TypeError, match=r"index is a DeviceTensor in device memory"):
        specfsm.place_rows(src, DeviceTensor(), dst)
    assert not dst.any()


@pytest.mark.gpu
def test_place_rows_on_cuda_tensors_runs_on_the_device():
    cupy = pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    del cupy
    import specfsm

    src = torch.arange(2 * 3 * 4, dtype=torch.float16, device="cuda").reshape(2, 3, 4)
    dst = torch.zeros(2, 4, dtype=torch.float16, device="cuda")
    assert specfsm.place_rows(src, torch.tensor([2, -1]), dst) is dst
    torch.cuda.synchronize()
    assert dst.cpu().tolist() == [[8, 9, 10, 11], [0, 0, 0, 0]]
    out = torch.empty_like(src)
    specfsm.snapshot(src, out)
    torch.cuda.synchronize()
    assert torch.equal(out, src)


def test_numpy_arrays_and_their_subclasses_are_not_taken_through_dlpack():
    """numpy arrays export DLPack too; they keep numpy's own path (a big-endian array,
    which DLPack cannot describe, converts as before)."""

    class Sub(np.ndarray):
        pass

    big = np.arange(4, dtype=">i8").view(Sub)
    assert host_array(big, "x") is big
    assert token_ids(big, "x").tolist() == [0, 1, 2, 3]


def test_acceptance_rules_take_cpu_probability_tensors_as_numpy(fsm):
    from specfsm import SpeculativeSampling

    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, 10, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(2, 10, generator=g, dtype=torch.float64), -1)
    got = SpeculativeSampling(seed=5).sample_rows(torch.tensor([1, 2]), p, q)
    want = SpeculativeSampling(seed=5).sample_rows([1, 2], p.numpy(), q.numpy())
    assert got == want
    with pytest.raises(TypeError, match="target_probs is a DeviceTensor in device memory"):
        SpeculativeSampling(seed=5).sample_rows([1, 2], DeviceTensor(), q)


def test_batch_step_takes_probability_tensors(fsm):
    import specfsm
    from specfsm import SpeculativeSampling

    g = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(2, 10, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(2, 10, generator=g, dtype=torch.float64), -1)
    out = []
    for conv in (lambda t: t.numpy(), lambda t: t):
        b = specfsm.BatchState(2, 4)
        b.admit([0], [1, 2], [0, 2], [0])
        b.advance_prefill([0], [3], [0])
        b.enter_verify([0], [4, 5], [0, 2])
        res = b.step(conv(torch.tensor([4, 1])), probs=conv(p), rule=SpeculativeSampling(seed=0),
                     draft_probs=conv(q))
        out.append((res.emitted.tolist(), res.accepted.tolist()))
    assert out[0] == out[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_tree_calls_and_place_path_take_cpu_tensors(fsm, dtype):
    from specfsm import accept_tree, check_tree, place_path, place_path_batch

    t, par = torch.tensor([5, 6, 7]), torch.tensor([-1, -1, 0])
    assert [a.tolist() for a in check_tree(t, par)] == [[5, 6, 7], [-1, -1, 0]]
    assert accept_tree(t, par, torch.tensor([5, 7, 1, 2])).tolist() == [0, 2]
    cache = torch.arange(2 * 5 * 3).reshape(2, 5, 3).to(dtype)
    want = cache.clone()
    want[0, 1:3] = cache[0, [1, 3]]
    assert place_path(cache[0], 0, torch.tensor([0, 2])) is not None
    assert torch.equal(cache[0], want[0])
    batch = torch.arange(2 * 5 * 3).reshape(2, 5, 3).to(dtype)
    ref = batch.clone()
    ref[1, 1:2] = batch[1, 3]
    assert place_path_batch(batch, torch.tensor([0, 0]), torch.tensor([2]), torch.tensor([0, 0, 1])) is batch
    assert torch.equal(batch, ref)
