"""``steady_rows``, the vLLM proposers' steady-step kernel: compiled == twin == a plain
per-row reference, on steady batches and on batches with one thing wrong; the twin
flag and the anchors to renew; refusals of arrays that do not fit; a caller that
changes its arguments while the call allocates; extreme int64 values in every integer
argument and array (lengths whose int64 sum wraps, a step that wraps the row counter,
anchors whose double wraps) and every layout of every array argument, where compiled,
twin and reference give the same answer or the same exception."""

from __future__ import annotations

import gc
import operator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import _impl
from specfsm.vllm.rows import RowTrackingProposer as R

T, S = 8, 3
MUL = R._FILTER_MUL
I64, I64MIN = 2**63 - 1, -(2**63)
#: the argument names, by position
NAMES = ["sampled", "num_tokens", "tok", "n_old", "seen", "tail", "spos", "spread", "anchors",
         "deep_first", "deep_every", "short", "cap", "pool_filter", "filter_mul"]


def plain_int(x):
    return (isinstance(x, np.ndarray) and x.ndim == 1 and x.flags.c_contiguous and x.flags.aligned
            and x.dtype.isnative and x.dtype.kind == "i" and x.itemsize in (4, 8))


def _int_arg(x):
    """An integer argument as the kernel takes it: by ``__index__``, within int64."""
    v = operator.index(x)
    if not I64MIN <= v <= I64:
        raise OverflowError("out of the int64 range")
    return v


def _strict(x, nd, kind):
    """An ``nd``-D C-contiguous aligned native-order 8-byte integer ndarray (``kind``
    ``"i"`` signed, ``"u"`` unsigned), as a plain ndarray; ValueError otherwise."""
    if not isinstance(x, np.ndarray):
        raise ValueError("not an array")
    if not (x.ndim == nd and x.flags.c_contiguous and x.flags.aligned and x.dtype.isnative
            and x.dtype.kind == kind and x.itemsize == 8):
        raise ValueError("not the layout")
    return np.asarray(x)


def reference(sampled, L, tok, n_old, seen, tail, spos, spread, anc, first, every, short, cap, pool_f, mul):
    """The kernel's contract, one row at a time in Python ints (exceptions: their type)."""
    first, every, short, cap = _int_arg(first), _int_arg(every), _int_arg(short), _int_arg(cap)
    if type(sampled) is not list or type(tok) is not np.ndarray or tok.ndim != 2 or not tok.flags.c_contiguous:
        return None
    if not (tok.flags.aligned and tok.dtype.isnative and tok.dtype.kind == "i" and tok.itemsize in (4, 8)):
        return None
    if not plain_int(L):
        return None
    b = len(sampled)
    n_old, seen, anc = (_strict(x, 1, "i") for x in (n_old, seen, anc))
    tail, spos, spread = (_strict(x, 2, "i") for x in (tail, spos, spread))
    if min(len(n_old), len(seen), len(anc), tail.shape[1], spos.shape[1]) < b:
        raise ValueError("too few rows")
    if spread.shape != spos.shape or tail.shape[0] < 2:
        raise ValueError("spread, tail")
    pool_f, mul = _strict(pool_f, 1, "u"), _strict(mul, 1, "u")
    if len(mul) < 3:
        raise ValueError("mul")
    if first < 0 or every < 1:
        raise ValueError("deep")
    Tn = tail.shape[0]
    if b == 0 or tok.shape[0] < b or L.shape[0] < b:
        return None
    width = tok.shape[1]
    new, offsets, tails, keys = [], [0], [], []
    for r in range(b):
        if type(sampled[r]) is not list:
            return None
    for r in range(b):
        ns, n0, n = len(sampled[r]), int(n_old[r]), int(L[r])
        if not (ns >= 1 and n0 == int(seen[r]) and n0 > short and n0 >= Tn and n == n0 + ns and n <= width
                and n < cap):
            return None
        if tok[r, n0 - Tn : n0].tolist() != tail[:, r].tolist():
            return None
        new += tok[r, n0:n].tolist()
        offsets.append(offsets[-1] + ns)
        tails.append(tok[r, n - Tn : n].tolist())
        m = 2**64
        keys.append((n * int(mul[0]) + int(tails[-1][-2]) % m * int(mul[1]) + int(tails[-1][-1]) % m * int(mul[2])) % m)
    renew = []
    for r in range(first, b, every):
        for j in range(spos.shape[0]):
            p = int(spos[j, r])
            if not 0 <= p < width or tok[r, p] != spread[j, r]:
                return None
        if int(L[r]) >= 2 * int(anc[r]):
            renew.append(r)
    twins = len(set(keys)) < b or bool(set(keys) & set(int(x) for x in pool_f))
    return ([int(x) for x in L[:b]], new, offsets, np.array(tails, dtype=np.int64).T.tolist(),
            max(int(x) for x in L[:b]), twins, renew)


def as_plain(got):
    if got is None:
        return None
    lengths, new, offsets, tails, lmax, twins, renew = got
    for a in (lengths, new, offsets, tails):
        assert type(a) is np.ndarray and a.dtype == np.int64
    assert tails.flags.c_contiguous and type(renew) is list
    return lengths.tolist(), new.tolist(), offsets.tolist(), tails.tolist(), int(lmax), bool(twins), renew


def steady_batch(rng, b, width=400, dtype=np.int32, spare=2):
    """A batch every row of which is steady: its arguments as a list."""
    tok = rng.integers(0, 50, size=(b + spare, width)).astype(dtype)
    n_old = rng.integers(T + 20, width - 40, size=b + spare).astype(np.int64)
    grown = rng.integers(1, 6, size=b + spare)
    L = (n_old + grown).astype(np.int64)
    sampled = [tok[r, n_old[r] : L[r]].tolist() for r in range(b)]
    tail = np.ascontiguousarray(np.stack([tok[r, n_old[r] - T : n_old[r]] for r in range(b + spare)]).T.astype(np.int64))
    anc = rng.integers(1, width, size=b + spare).astype(np.int64)
    spos = np.ascontiguousarray(((anc.reshape(-1, 1) * np.arange(1, S + 1)) // (S + 1)).T)
    spread = np.ascontiguousarray(np.stack([tok[r, spos[:, r]] for r in range(b + spare)]).T.astype(np.int64))
    return [sampled, L, tok, n_old.copy(), n_old.copy(), tail, spos, spread, anc, 0, 3, 16, 10**9,
            np.zeros(0, dtype=np.uint64), MUL.copy()]  # (a copy: the hostile tests write into it)


def run_all(impl, args):
    kern = impl.module("rows")
    got = as_plain(kern.steady_rows(*args))
    assert got == reference(*args)
    return got


BREAKS = ["none", "len32", "lenu32", "lenlist", "lenshort", "tail", "seen", "short", "grown", "width", "cap", "spread", "spos", "item", "tuple",
          "dtype", "strided", "twin", "pool", "empty"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), brk=st.sampled_from(BREAKS),
       int64=st.booleans(), first=st.integers(0, 4), every=st.integers(1, 5))
def test_steady_rows_equals_the_reference(impl, b, seed, brk, int64, first, every):
    rng = np.random.default_rng(seed)
    args = steady_batch(rng, b, dtype=np.int64 if int64 else np.int32)
    args[9], args[10] = first, every
    sampled, L, tok, n_old, seen, tail, spos, spread = args[:8]
    r = int(rng.integers(0, b))
    if brk == "len32":
        args[1] = L.astype(np.int32)
    elif brk == "lenu32":
        args[1] = L.astype(np.uint32)
    elif brk == "lenlist":
        args[1] = L.tolist()
    elif brk == "lenshort":
        args[1] = L[: b - 1].copy()
    elif brk == "tail":
        tok[r, n_old[r] - 1 - int(rng.integers(0, T))] += 1
    elif brk == "seen":
        seen[r] -= 1
    elif brk == "short":
        args[11] = int(n_old[r])
    elif brk == "grown":
        sampled[r] = sampled[r] + [1]
    elif brk == "width":
        args[2] = np.ascontiguousarray(tok[:, : int(L[r]) - 1])
    elif brk == "cap":
        args[12] = int(L[r])
    elif brk == "spread":
        spread[:, r] += 1
    elif brk == "spos":
        spos[0, r] = tok.shape[1] + int(rng.integers(0, 3)) if rng.random() < 0.5 else -1
    elif brk == "item":
        sampled[r] = tuple(sampled[r])
    elif brk == "tuple":
        args[0] = tuple(sampled)
    elif brk == "dtype":
        args[2] = tok.astype(np.int16 if rng.random() < 0.5 else np.uint32)
    elif brk == "strided":
        args[2] = np.asfortranarray(tok)
    elif brk == "twin" and b >= 2:
        # row 0 becomes row r's twin: the same length and last two tokens
        r = max(r, 1)
        L[0] = L[r]
        n_old[0] = seen[0] = L[0] - len(sampled[0])
        tok[0, : L[0]] = tok[r, : L[0]]
        tail[:, 0] = tok[0, n_old[0] - T : n_old[0]]
        spread[:, 0] = tok[0, spos[:, 0]]
    elif brk == "pool":
        n = int(L[r])
        key = (n * int(MUL[0]) + int(tok[r, n - 2]) * int(MUL[1]) + int(tok[r, n - 1]) * int(MUL[2])) % 2**64
        args[13] = np.sort(np.array([1, key, 2**64 - 1], dtype=np.uint64))
    elif brk == "empty":
        args[0] = []
    got = run_all(impl, args)
    if brk in ("none", "twin", "pool", "len32"):
        assert got is not None
    if brk == "pool" or (brk == "twin" and b >= 2):
        assert got[5]  # a made twin is always found
    if brk in ("lenu32", "lenlist", "lenshort", "tail", "seen", "short", "grown", "width", "cap", "item", "tuple", "dtype", "strided", "empty"):
        assert got is None
    if brk in ("spread", "spos"):
        assert (got is None) == ((r - first) % every == 0 and r >= first)


def test_steady_rows_answers_the_new_tokens_tails_and_renewals(impl):
    rng = np.random.default_rng(7)
    args = steady_batch(rng, 6)
    args[8][:] = 1  # every anchor tiny: every checked row renews
    args[9], args[10] = 1, 2
    lengths, new, offsets, tails, lmax, twins, renew = run_all(impl, args)
    sampled, L, tok = args[0], args[1], args[2]
    assert lengths == L[:6].tolist()
    assert new == [t for s in sampled for t in s]
    assert offsets == [0, *np.cumsum([len(s) for s in sampled]).tolist()]
    assert tails == [[int(tok[r, L[r] - T + j]) for r in range(6)] for j in range(T)]
    assert lmax == int(L[:6].max()) and renew == [1, 3, 5] and twins is False


def test_steady_rows_refuses_arrays_that_do_not_fit(impl):
    kern = impl.module("rows")
    rng = np.random.default_rng(3)
    base = steady_batch(rng, 4, spare=0)
    bad = {3: base[3][:3], 4: base[4][:3], 5: base[5][:, :3], 6: base[6][:, :3],
           7: base[7][:2], 8: base[8][:3]}
    for at, value in bad.items():
        args = list(base)
        args[at] = np.ascontiguousarray(value)
        with pytest.raises(ValueError):
            kern.steady_rows(*args)
    for at, value in ((9, -1), (10, 0), (14, MUL[:2].copy())):
        args = list(base)
        args[at] = value
        with pytest.raises(ValueError):
            kern.steady_rows(*args)
    args = list(base)
    args[5] = np.ascontiguousarray(base[5][:1])  # a tail of one token
    with pytest.raises(ValueError):
        kern.steady_rows(*args)
    args = list(base)
    args[3] = base[3].astype(np.int32)  # the row arrays are int64
    with pytest.raises(ValueError):
        kern.steady_rows(*args)


def test_steady_rows_survives_a_caller_that_empties_its_rows_while_it_allocates(impl):
    """A collection while the call allocates runs the caller's code, which here empties
    ``sampled``: the call answers None, or the rows it read, or refuses cleanly, and never
    reads past them. (The compiled call makes no object a collection counts before its
    checks, so there the callback may never fire; the twin's allocations fire it.)"""
    kern = impl.module("rows")
    rng = np.random.default_rng(5)
    args = steady_batch(rng, 30)
    sampled = args[0]
    fired = []

    def clear(phase, info):
        if phase == "start" and not fired:
            fired.append(1)
            sampled.clear()

    old = gc.get_threshold()
    gc.callbacks.append(clear)
    try:
        gc.set_threshold(1)
        try:
            got = kern.steady_rows(*args)
        except ValueError:
            got = None
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(clear)
    assert fired or impl.name == "compiled"
    assert got is None or len(got[2]) == 31


# --------------------------------------------------------------------------------------
# extreme values and every layout: compiled == twin == reference
# --------------------------------------------------------------------------------------
def outcome(fn, args, message=False):
    """``("ok", plain result)`` or ``("err", exception type[, message])``."""
    try:
        got = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type is the answer
        return ("err", type(exc), str(exc)) if message else ("err", type(exc))
    return "ok", got if fn is reference else as_plain(got)


def zeros_batch(b, width=64, dtype=np.int64, ns=1):
    """A steady batch of zero tokens whose arrays are row slices of larger zero arrays:
    a kernel that indexes a little before any of them reads zeros it may mistake for a
    match (and stays inside the allocation), so a wrong answer shows as an answer."""
    tok = np.zeros((b + 1, width), dtype=dtype)[1:]
    n_old = np.full(b + 1, 20, dtype=np.int64)[1:]
    L = n_old + ns
    return [[[0] * ns for _ in range(b)], L, tok, n_old, n_old.copy(), np.zeros((T + 1, b), dtype=np.int64)[1:],
            np.zeros((S + 1, b), dtype=np.int64)[1:], np.zeros((S + 1, b), dtype=np.int64)[1:],
            np.zeros(b + 1, dtype=np.int64)[1:], 0, 1, 4, 10**9, np.zeros(0, dtype=np.uint64), MUL]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n0, ns", [(I64, 1), (I64 - 1, 2), (I64 - 2, 3), (I64 - 7, 9), (2**62, 1)])
def test_steady_rows_lengths_whose_int64_sum_wraps_are_not_steady(impl, dtype, n0, ns):
    """``num_tokens[r]`` equal to ``n_old[r] + ns`` only after wrapping around int64: not
    steady (the sum is not the length), and nothing is read."""
    kern = impl.module("rows")
    for r in range(2):
        args = zeros_batch(2, dtype=dtype, ns=ns)
        assert run_all(impl, args) is not None
        args[3][r] = args[4][r] = n0
        args[1][r] = _wrap(n0 + ns, np.int64)  # the sum, wrapped as int64 wraps
        assert outcome(kern.steady_rows, args) == ("ok", None)
        assert reference(*args) is None


def test_steady_rows_a_huge_step_does_not_wrap_the_row_counter(impl):
    """``deep_first + k * deep_every`` past int64: the rows checked are those below B
    (``range(deep_first, B, deep_every)``), nothing before row 0."""
    kern = impl.module("rows")
    for first, every in [(1, I64), (1, I64 - 1), (2, I64 - 1), (3, I64 - 2), (I64, 1), (I64, I64), (0, I64), (2, 2**62)]:
        args = zeros_batch(4)
        args[9], args[10] = first, every
        got = outcome(kern.steady_rows, args)
        assert got == ("ok", reference(*args))
        assert got[1][6] == list(range(first, 4, every))


@pytest.mark.parametrize("anchor", [2**62, 2**62 + 1, I64 - 1, I64, -(2**62) - 1, I64MIN, I64MIN + 1, -1, 0, 10, 11, 12])
def test_steady_rows_renews_an_anchor_by_its_exact_double(impl, anchor):
    """A checked row renews when its length reached twice its anchor, the double taken
    exactly (not in int64, where 2 * 2**62 is negative)."""
    kern = impl.module("rows")
    args = zeros_batch(2)  # lengths 21
    args[8][:] = anchor
    got = outcome(kern.steady_rows, args)
    assert got == ("ok", reference(*args))
    assert got[1][6] == ([0, 1] if 21 >= 2 * anchor else [])


class Index:
    """An integer by ``__index__`` only."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v

    def __repr__(self):
        return f"Index({self.v})"


class IntOnly:
    """``int()`` converts it; ``__index__`` does not."""

    def __init__(self, v):
        self.v = v

    def __int__(self):
        return self.v

    def __repr__(self):
        return f"IntOnly({self.v})"


class Sub(np.ndarray):
    pass


IN_RANGE = [0, 1, 2, 3, 7, 8, 9, 16, 21, -1, -2, 2**31 - 1, 2**31, 2**32, 2**62, 2**62 + 1, -(2**62) - 1,
            I64 - 2, I64 - 1, I64, I64MIN, I64MIN + 1, -(2**31)]
OUTSIDE = [I64 + 1, I64MIN - 1, 2**64, 2**64 + 5, 10**30, -(10**30)]
NOT_INTS = [1.5, 2.0, np.float64(3.0), None, "3", b"3", True, np.True_, np.int64(3), np.int32(-1),
            np.uint64(2**64 - 1), Index(3), Index(I64 + 1), Index(-1), IntOnly(3), [3], 1 + 0j]
#: the array arguments, by position
ARRAYS = [1, 2, 3, 4, 5, 6, 7, 8, 13, 14]
#: the axis of an array argument that runs over the rows (tail, spos, spread: position-major)
ROWS_AXIS = {5: 1, 6: 1, 7: 1}
LAYOUTS = ["list", "tuple", "strided", "reversed", "fortran", "0d", "ndim+", "ndim-", "int32", "int16", "int8",
           "uint64", "uint32", "int64", "longlong", "ulonglong", "float64", "bool", "object", "timedelta",
           "byteswap", "unaligned", "subclass", "readonly", "short", "empty", "scalar", "none"]


def relayout(a, kind, rows_axis=0):
    """``a`` (an ndarray) in another layout, type or shape (``"short"``: two rows, along
    ``rows_axis``); a 0-d array (an earlier mutation's) is left as it is."""
    if a.ndim == 0:
        return a
    if kind == "list":
        return a.tolist()
    if kind == "tuple":
        return tuple(a.tolist())
    if kind == "strided":
        return np.repeat(a, 2, axis=-1)[..., ::2]
    if kind == "reversed":
        return a[..., ::-1]
    if kind == "fortran":
        return np.asfortranarray(a)
    if kind == "0d":
        return np.array(a.flat[0] if a.size else 0, dtype=a.dtype)
    if kind == "ndim+":
        return a[None]
    if kind == "ndim-":
        return a.reshape(-1) if a.ndim == 2 else a.reshape(-1, 1)
    if kind in ("int32", "int16", "int8", "uint64", "uint32", "int64", "longlong", "ulonglong", "float64", "bool",
                "object"):
        return a.astype(kind)
    if kind == "timedelta":
        return a.astype("m8[s]")
    if kind == "byteswap":
        return a.astype(a.dtype.newbyteorder())
    if kind == "unaligned":
        buf = np.zeros(a.nbytes + 1, dtype=np.uint8)
        u = buf[1:].view(a.dtype).reshape(a.shape)
        u[...] = a
        return u
    if kind == "subclass":
        return a.view(Sub)
    if kind == "readonly":
        c = a.copy()
        c.flags.writeable = False
        return c
    if kind == "short":
        return a[:2].copy() if rows_axis == 0 else a[:, :2].copy()
    if kind == "empty":
        return a[..., :0].copy()
    if kind == "scalar":
        return a.flat[0] if a.size else 0
    return None


def _wrap(v, dtype):
    """``v`` stored in an array of ``dtype``, wrapping as C does."""
    return np.array([v % 2**64], dtype=np.uint64).view(np.int64).astype(dtype)[0] if np.dtype(dtype).kind == "i" \
        else np.array([v % 2**64], dtype=np.uint64).astype(dtype)[0]


mutation = st.one_of(
    st.tuples(st.just("int"), st.sampled_from([9, 10, 11, 12]), st.sampled_from(IN_RANGE + OUTSIDE + NOT_INTS)),
    st.tuples(st.just("value"), st.sampled_from(ARRAYS), st.integers(0, 9), st.integers(0, 9), st.sampled_from(IN_RANGE)),
    st.tuples(st.just("wrap"), st.integers(0, 9), st.sampled_from([I64, I64 - 1, I64 - 2, I64 - 7, 2**62, I64MIN])),
    st.tuples(st.just("layout"), st.sampled_from(ARRAYS), st.sampled_from(LAYOUTS)),
    st.tuples(st.just("sampled"), st.sampled_from(["tuple", "subclass", "item-tuple", "item-array", "empty-item"]),
              st.integers(0, 9)),
)


class ListSub(list):
    pass


def mutate(args, m):
    b = len(args[0]) if isinstance(args[0], list) else 1
    kind = m[0]
    if kind == "int":
        args[m[1]] = m[2]
    elif kind == "value":
        a = args[m[1]]
        if isinstance(a, np.ndarray) and a.ndim in (1, 2) and a.size and a.dtype.kind in "iu" and a.flags.writeable:
            at = (m[2] % a.shape[0], m[3] % a.shape[1]) if a.ndim == 2 else m[2] % a.shape[0]
            a[at] = _wrap(m[4], a.dtype)
            if m[1] == 13:
                a.sort()  # the pool is sorted
    elif kind == "wrap":  # a huge remembered length with num_tokens its wrapped sum
        r = m[1] % b
        L, n_old, seen = args[1], args[3], args[4]
        if isinstance(L, np.ndarray) and isinstance(n_old, np.ndarray) and isinstance(seen, np.ndarray):
            ns = len(args[0][r]) if isinstance(args[0], list) and isinstance(args[0][r], list) else 1
            if (L.ndim == n_old.ndim == seen.ndim == 1 and r < min(len(L), len(n_old), len(seen))
                    and all(x.dtype.kind in "iu" and x.flags.writeable for x in (L, n_old, seen))):
                n_old[r] = _wrap(m[2], n_old.dtype)       # each in its own dtype: a layout
                seen[r] = _wrap(m[2], seen.dtype)         # mutation may have changed one
                L[r] = _wrap(m[2] + ns, L.dtype)
    elif kind == "layout":
        if isinstance(args[m[1]], np.ndarray):
            args[m[1]] = relayout(args[m[1]], m[2], ROWS_AXIS.get(m[1], 0))
    elif isinstance(args[0], list):
        sampled, r = args[0], m[2] % b
        if m[1] == "tuple":
            args[0] = tuple(sampled)
        elif m[1] == "subclass":
            args[0] = ListSub(sampled)
        elif sampled and m[1] == "item-tuple":
            sampled[r] = tuple(sampled[r])
        elif sampled and m[1] == "item-array":
            sampled[r] = np.array(sampled[r], dtype=np.int64)
        elif sampled:
            sampled[r] = []


@st.composite
def hostile_calls(draw):
    """A steady batch, then one to three things changed: an integer argument, a value in
    an array, a remembered length whose sum wraps, an array's layout, ``sampled``."""
    b = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    args = steady_batch(rng, b, width=100, dtype=draw(st.sampled_from([np.int32, np.int64])))
    args[9], args[10] = draw(st.integers(0, 3)), draw(st.integers(1, 3))
    if draw(st.booleans()):
        args[8][:] = rng.integers(-3, 80, size=len(args[8]))  # anchors below and above the lengths
    for m in draw(st.lists(mutation, min_size=1, max_size=3)):
        mutate(args, m)
    return args


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=hostile_calls())
def test_steady_rows_on_extreme_values_and_layouts_is_the_reference(impl, args):
    """The answer, or the type of the exception, is the reference's."""
    kern = impl.module("rows")
    assert outcome(kern.steady_rows, args) == outcome(reference, args)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=hostile_calls())
def test_steady_rows_compiled_and_twin_agree_on_extreme_values_and_layouts(compiled, args):
    """The same answer, or the same exception with the same message."""
    twin = _impl.kernels("python", "rows").steady_rows
    assert outcome(compiled.module("rows").steady_rows, args, True) == outcome(twin, args, True)


@pytest.mark.parametrize("at", ARRAYS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_steady_rows_takes_every_layout_as_the_reference_does(impl, at, layout):
    """Each array argument in each layout: the reference's answer or exception type, on
    both implementations; a refused layout of a row array is a ValueError naming it."""
    kern = impl.module("rows")
    args = steady_batch(np.random.default_rng(at), 3, width=100)
    args[at] = relayout(args[at], layout, ROWS_AXIS.get(at, 0))
    got = outcome(kern.steady_rows, args, True)
    want = outcome(reference, args)
    assert got[:2] == want
    if got[0] == "err" and layout not in ("short", "empty"):
        assert got[1] is ValueError and NAMES[at] in got[2]


@pytest.mark.parametrize("at", [9, 10, 11, 12])
@pytest.mark.parametrize("value", IN_RANGE + OUTSIDE + NOT_INTS, ids=repr)
def test_steady_rows_takes_integer_arguments_as_the_reference_does(impl, at, value):
    """deep_first, deep_every, short, cap: an int (by ``__index__``) within int64, else
    TypeError / OverflowError, on both implementations alike."""
    kern = impl.module("rows")
    args = steady_batch(np.random.default_rng(at), 3, width=100)
    args[at] = value
    assert outcome(kern.steady_rows, args) == outcome(reference, args)


def test_steady_rows_refusals_are_the_same_exception_with_the_same_message(compiled):
    twin = _impl.kernels("python", "rows").steady_rows
    comp = compiled.module("rows").steady_rows
    for at in ARRAYS + [9, 10, 11, 12]:
        for change in LAYOUTS + IN_RANGE + OUTSIDE + NOT_INTS:
            args = steady_batch(np.random.default_rng(at), 3, width=100)
            if at in ARRAYS and isinstance(change, str):
                args[at] = relayout(args[at], change, ROWS_AXIS.get(at, 0))
            elif at >= 9 and not isinstance(change, str):
                args[at] = change
            assert outcome(comp, args, True) == outcome(twin, args, True), (NAMES[at], change)
