"""The counted suffix trie (``SuffixTrie``).

Both implementations against ``Reference`` below, written straight from the rule in
``specfsm.drafting._suffix_trie_py``'s docstring: every substring of at most ``depth``
tokens of each sequence counted in a dict, with the steps at which it was counted, the
best child read off those steps (among the children of the highest count, the one that
reached it first, or most recently), and ``speculate`` scored from the counts. Compiled
== twin == reference on worked examples and on hypothesis' programs of extends, closes
and reopened keys, depths 2..10, both ties, every ``max_k``, ``factor`` (0 and
non-integers included) and ``min_prob``. Then the refusals (the same exception and
message on both, nothing changed), ``nbytes``, unbound calls with another object,
re-entrant conversions, and pickling (refused). The guard (an object made with
``__new__``, a second or failed ``__init__``, ``_hold_guard`` refusing every call) is
checked on every method and property by ``tests/test_guard.py``'s row for the trie.

The batches (``extend_tries``, ``speculate_tries``): compiled == twin == the same calls
made one trie at a time (``extend`` per row in order; ``speculate`` after each row's
sequence's last ``depth - 1`` tokens, kept by ``Reference``, then each of ``others``
taken when it scores strictly higher) == ``Reference``, on hypothesis' programs over a
few tries of mixed depths (tries repeated in a call, ``others`` overlapping them,
closed and unknown sequences, one ``max_k`` or one per row with zeros), and on large
batches; then their refusals, the room for all of a trie's tokens, a busy or
uninitialised trie among several (nothing changed in any, every guard given back), and
conversions that call the tries.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import _impl
from specfsm.drafting import _checks as drafting_checks
from specfsm.drafting._checks import MAX_TRIE_DEPTH, TRIE_NODE_BYTES
from test_recycling import DeviceTensor, HostTensor

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I64 = 2**63 - 1


@pytest.fixture
def trie(impl):
    """The SuffixTrie class of one implementation."""
    return impl.module("suffix_trie").SuffixTrie


def modules():
    """The twin's module, then the compiled one unless the compiled core is switched off."""
    out = [_impl.kernels("python", "suffix_trie")]
    if not _impl.NO_EXTENSIONS:
        out.append(_impl.kernels("compiled", "suffix_trie"))
    return out


def classes():
    """The twin's class, then the compiled one unless the compiled core is switched off."""
    return [m.SuffixTrie for m in modules()]


# --------------------------------------------------------------------------------------
# the reference
# --------------------------------------------------------------------------------------
class Reference:
    """The rule, written plainly: each string's count steps, each open sequence's tokens."""

    def __init__(self, depth: int, ties: str) -> None:
        self.depth, self.ties = depth, ties
        self.steps: dict[tuple[int, ...], list[int]] = {}   # string -> the steps that counted it
        self.kids: dict[tuple[int, ...], set[int]] = {}
        self.open: dict[int, list[int]] = {}                # sequence -> its tokens since opened
        self.fed = 0

    def extend(self, seq: int, tokens) -> None:
        seen = self.open.setdefault(seq, [])
        for t in tokens:
            seen.append(int(t))
            self.fed += 1
            for n in range(1, min(self.depth, len(seen)) + 1):
                s = tuple(seen[-n:])
                self.steps.setdefault(s, []).append(self.fed)
                self.kids.setdefault(s[:-1], set()).add(s[-1])

    def close(self, seq: int) -> None:
        self.open.pop(seq, None)

    def count(self, s: tuple[int, ...]) -> int:
        return len(self.steps[s])

    def best(self, s: tuple[int, ...]) -> tuple[int, ...] | None:
        """Of the children of the highest count, the one that reached that count first
        (``"first"``) or most recently (``"last"``)."""
        kids = [s + (t,) for t in self.kids.get(s, ())]
        if not kids:
            return None
        top = max(self.count(c) for c in kids)
        reached = {c: self.steps[c][top - 1] for c in kids if self.count(c) == top}
        pick = min if self.ties == "first" else max
        return pick(reached, key=reached.__getitem__)

    def speculate(self, context, max_k: int, factor: float, min_prob: float):
        ctx = [int(t) for t in context]
        max_k = min(max_k, self.depth)
        out: tuple[list[int], float, int] = ([], 0.0, 0)
        for m in range(1, min(len(ctx), self.depth) + 1):
            node = tuple(ctx[len(ctx) - m:])
            if node not in self.steps:
                break
            k = max_k if factor == 0 else min(max_k, math.floor(m * factor))
            p, score, draft = 1.0, 0.0, []
            while len(draft) < k:
                child = self.best(node)
                if child is None:
                    break
                p = p * (self.count(child) / self.count(node))
                if p < min_prob:
                    break
                draft.append(child[-1])
                score += p
                node = child
            if score >= out[1]:
                out = (draft, score, m)
        return out

    def state(self) -> tuple:
        cap = 64
        while cap < len(self.steps):
            cap *= 2
        return self.fed, len(self.steps), len(self.open), TRIE_NODE_BYTES * cap


def state(t) -> tuple:
    """What a caller can read off a trie (the reference's ``state`` first)."""
    return len(t), t.n_nodes, t.open_sequences, t.nbytes, t.depth, t.ties, repr(t)


def exact(result):
    """``speculate``'s result with its score as its exact bits (and its types checked)."""
    draft, score, m = result
    assert type(draft) is list and all(type(x) is int for x in draft)
    assert type(score) is float and type(m) is int
    return draft, score.hex(), m


# --------------------------------------------------------------------------------------
# worked examples
# --------------------------------------------------------------------------------------
def test_a_worked_example(trie):
    t = trie(3)
    t.extend(0, [1, 2, 3, 1, 2, 4, 1, 2, 3])
    # m = 1: "2" -> "2 3" (2 of 3), k = 1; m = 2: "1 2" -> "1 2 3" (2 of 3), k = 2, then
    # "1 2 3" is 3 long (no children); the equal scores go to the longer match
    assert exact(t.speculate([1, 2], 3)) == ([3], (2 / 3).hex(), 2)
    # factor 0: k = max_k; m = 1 goes on "2 3" -> "2 3 1" (1 of 2): 2/3 + 1/3
    assert t.speculate([1, 2], 3, 0) == ([3, 1], 2 / 3 + (2 / 3) * (1 / 2), 1)
    assert t.speculate([1, 2], 3, 0, 0.5) == ([3], 2 / 3, 2)       # 1/3 < 0.5 stops m = 1
    assert t.speculate([9, 1, 2], 3, 0) == ([3, 1], 1.0, 1)          # "9 1 2" is no node
    assert t.speculate([9], 3) == ([], 0.0, 0)
    assert t.speculate([], 3) == ([], 0.0, 0)
    assert t.speculate([4], 0) == ([], 0.0, 1)                       # a node, an empty draft
    assert (len(t), t.n_nodes, t.open_sequences) == (9, 4 + 5 + 6, 1)


@pytest.mark.parametrize("ties, want", [("first", 1), ("last", 2)])
def test_ties(trie, ties, want):
    t = trie(2, ties)
    t.extend(0, [5, 1, 5, 2])       # "5 1" and "5 2" once each: 1 reached it first
    assert t.speculate([5], 1, 0) == ([want], 0.5, 1)
    t.extend(0, [5, 1])             # "5 1" twice
    assert t.speculate([5], 1, 0) == ([1], 2 / 3, 1)
    assert t.ties == ties


def test_sequences_are_kept_apart_and_reopened_afresh(trie):
    t = trie(4)
    t.extend(0, [1])
    t.extend(1, [2])
    t.extend(0, [3])                # "1 3", not "2 3"
    assert t.speculate([1], 1) == ([3], 1.0, 1)
    assert t.speculate([2], 1) == ([], 0.0, 1)
    t.close(0)
    t.close(7)                      # not open: nothing
    t.extend(0, [4])                # a new sequence: no "3 4"
    assert t.speculate([3], 1) == ([], 0.0, 1)
    assert t.open_sequences == 2 and len(t) == 4
    t.extend(9, [])                 # an empty extend opens the sequence
    assert t.open_sequences == 3 and len(t) == 4


def test_the_longest_string_is_depth_tokens(trie):
    t = trie(2)
    t.extend(0, [1, 2, 3, 1, 2, 3])
    assert t.n_nodes == 3 + 3       # no string of 3 tokens
    # m = 1: "3" -> "3 1" (1 of 2); m = 2: "2 3" is 2 long, no children, an empty draft
    assert t.speculate([1, 2, 3], 5, 0) == ([1], 0.5, 1)
    assert t.speculate([2], 5, 0) == ([3], 1.0, 1)


@pytest.mark.parametrize("nodes, nbytes", [(0, 2048), (63, 2048), (64, 2048), (65, 4096), (129, 8192)])
def test_nbytes_doubles_from_64_nodes(trie, nodes, nbytes):
    t = trie(2)
    # k distinct tokens in one sequence: k strings of one token, k - 1 of two
    k = (nodes + 1) // 2
    t.extend(0, list(range(k)))
    if t.n_nodes < nodes:
        t.extend(1, [k])
    assert t.n_nodes == nodes and t.nbytes == nbytes


def test_a_large_trie_grows_alike():
    rng = np.random.default_rng(5)
    got = []
    for cls in classes():
        t = cls(8, "last")
        for i in range(20):
            t.extend(i % 3, rng.integers(0, 30, 500) if i % 2 else rng.integers(0, 6, 500).astype(np.int32))
            if i % 7 == 6:
                t.close(i % 3)
        ctxs = [rng.integers(0, 30, 8) for _ in range(50)] + [rng.integers(0, 6, 8) for _ in range(50)]
        got.append((state(t), [exact(t.speculate(c, 8, f, p)) for c in ctxs for f, p in ((0, 0.0), (1.5, 0.1))]))
        rng = np.random.default_rng(5)
    assert all(g == got[0] for g in got)
    assert got[0][0][1] > 10_000 and got[0][0][3] == 32 * 2 ** math.ceil(math.log2(got[0][0][1]))


# --------------------------------------------------------------------------------------
# compiled == twin == reference
# --------------------------------------------------------------------------------------
TOKENS = st.one_of(st.integers(0, 3), st.integers(0, 3), st.sampled_from([-1, I64, -I64 - 1, 2**31]))
FACTORS = st.one_of(st.sampled_from([0, 0.0, 0.5, 1, 1.0, 1.5, 2, 2.5, 0.25]), st.floats(0, 5))
MIN_PROBS = st.one_of(st.sampled_from([0, 0.0, 0.1, 0.25, 1 / 3, 0.5, 1.0, 1]), st.floats(0, 1))
OPS = st.one_of(
    st.tuples(st.just("extend"), st.integers(-1, 3), st.lists(TOKENS, max_size=12),
              st.sampled_from(["list", "int64", "int32", "tuple"])),
    st.tuples(st.just("extend"), st.integers(-1, 3), st.lists(st.integers(0, 1), max_size=20), st.just("list")),
    st.tuples(st.just("close"), st.integers(-1, 4)),
    st.tuples(st.just("speculate"), st.lists(TOKENS, max_size=12), st.integers(0, 12), FACTORS, MIN_PROBS),
)


def _tokens(tokens, how):
    if how == "int32" and all(-(2**31) <= x < 2**31 for x in tokens):
        return np.array(tokens, dtype=np.int32)
    if how in ("int64", "int32"):
        return np.array(tokens, dtype=np.int64)
    return tuple(tokens) if how == "tuple" else list(tokens)


def _layout(values, how):
    """``values`` (ints) as tokens in layout ``how`` (the compiled fast path reads lists,
    tuples and native int32/int64 arrays of at most 256 plain ints; the rest goes through
    the checks' converter)."""
    if how in ("list", "long"):
        return list(values)
    if how == "tuple":
        return tuple(values)
    if how == "npints":
        return [np.int64(v) for v in values]
    if how == "strided":
        return np.repeat(np.array(values, dtype=np.int64), 2)[::2]
    if how == "readonly":
        a = np.array(values, dtype=np.int64)
        a.flags.writeable = False
        return a
    return np.array(values, dtype=how)


LAYOUTS = ["list", "long", "tuple", "int64", "int32", "uint16", ">i8", "<i4", "npints", "strided", "readonly"]


@pytest.mark.parametrize("how", LAYOUTS)
def test_every_layout_of_tokens_and_context_is_read_alike(trie, how):
    rng = np.random.default_rng(3)
    toks = rng.integers(0, 5, 900).tolist()
    ref, t = Reference(6, "last"), trie(6, "last")
    step = 300 if how == "long" else 150       # (300 tokens: past the fast path's 256)
    for i in range(0, len(toks), step):
        ref.extend(i % 4, toks[i:i + step])
        t.extend(np.int64(i % 4) if how == "npints" else i % 4, _layout(toks[i:i + step], how))
    assert state(t)[:4] == ref.state()
    for ctx in ([4], toks[-3:], toks[:7], toks[-300:], toks[-257:], toks[-256:], []):
        want = exact(ref.speculate(ctx, 5, 0.5, 0.05))
        assert exact(t.speculate(_layout(ctx, how), 5, 0.5, 0.05)) == want


@pytest.mark.parametrize("max_k, factor, min_prob", [
    (np.int64(5), np.float64(0.5), np.float64(0.05)),
    (5, np.float32(0.5), np.float32(0.05)),
    (5, 0.5, np.float16(0.05)),
    (2**70, 0.5, 0.05),                       # max_k beyond int64: capped at depth
    (np.uint64(2**64 - 1), 0.5, 0.05),
    (5, 2**60, 0.05),                         # factor an int beyond 2**53
    (5, 0, 0),
    (5, 0, 1),
    (5, -0.0, 0.05),
    (5, 1e300, 5e-324),
])
def test_limits_in_any_form_are_read_alike(max_k, factor, min_prob):
    toks = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 3, 3, 3]
    ref = Reference(6, "first")
    ref.extend(0, toks)
    want = [exact(ref.speculate(c, int(min(max_k, 6)), float(factor), float(min_prob)))
            for c in ([3], [1, 2], [2, 3, 1, 2], [3, 3])]
    for cls in classes():
        t = cls(6)
        t.extend(0, toks)
        assert [exact(t.speculate(c, max_k, factor, min_prob)) for c in ([3], [1, 2], [2, 3, 1, 2], [3, 3])] == want


@SETTINGS
@given(depth=st.integers(2, 10), ties=st.sampled_from(["first", "last"]), ops=st.lists(OPS, max_size=30),
       factor=FACTORS, min_prob=MIN_PROBS)
def test_compiled_twin_and_reference_agree(depth, ties, ops, factor, min_prob):
    ref = Reference(depth, ties)
    tries = [cls(depth, ties) for cls in classes()]
    for op in ops:
        if op[0] == "extend":
            ref.extend(op[1], op[2])
            for t in tries:
                t.extend(op[1], _tokens(op[2], op[3]))
        elif op[0] == "close":
            ref.close(op[1])
            for t in tries:
                t.close(op[1])
        else:
            want = ref.speculate(*op[1:])
            assert [exact(t.speculate(*op[1:])) for t in tries] == [exact(want)] * len(tries), op
        assert [state(t)[:4] for t in tries] == [ref.state()] * len(tries)
    # every string counted, as a context
    for s in list(ref.steps)[:150]:
        want = exact(ref.speculate(s, depth, factor, min_prob))
        assert [exact(t.speculate(list(s), depth, factor, min_prob)) for t in tries] == [want] * len(tries)
    assert len({state(t) for t in tries}) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(2, 10), vocab=st.sampled_from([2, 5, 40]))
def test_longer_sequences_agree_with_the_reference(seed, depth, vocab):
    rng = np.random.default_rng(seed)
    ties = ["first", "last"][seed % 2]
    ref = Reference(depth, ties)
    tries = [cls(depth, ties) for cls in classes()]
    for i in range(12):
        key, toks = int(rng.integers(0, 4)), rng.integers(0, vocab, int(rng.integers(0, 60)))
        ref.extend(key, toks)
        for t in tries:
            t.extend(key, toks)
        if rng.random() < 0.2:
            ref.close(key)
            for t in tries:
                t.close(key)
    for t in tries:
        assert state(t)[:4] == ref.state()
    for _ in range(40):
        ctx = rng.integers(0, vocab, int(rng.integers(0, 14))).tolist()
        args = (int(rng.integers(0, 12)), float(rng.choice([0, 0.5, 1, 1.5, 3])), float(rng.choice([0, 0.05, 0.3])))
        want = exact(ref.speculate(ctx, *args))
        assert [exact(t.speculate(ctx, *args)) for t in tries] == [want] * len(tries)


def test_scores_are_summed_in_the_rule_order():
    """Counts whose ratios round: the score is ``p`` multiplied step by step and added in
    order, bit for bit on both."""
    toks = [0, 1, 2, 3, 4, 5, 6] * 3 + [0, 1, 2, 3, 9] + [0, 1, 2, 8] * 7 + [0, 1, 7] * 11
    ref = Reference(8, "first")
    ref.extend(0, toks)
    want = exact(ref.speculate([0], 8, 0, 0.0))
    assert len(want[0]) >= 3
    for cls in classes():
        t = cls(8)
        t.extend(0, toks)
        assert exact(t.speculate([0], 8, 0, 0.0)) == want


# --------------------------------------------------------------------------------------
# refusals: the same exception and message on both, nothing changed
# --------------------------------------------------------------------------------------
REFUSED_INIT = [
    ((1,), ValueError, "depth must be in 2..64, got 1"),
    ((65,), ValueError, "depth must be in 2..64, got 65"),
    ((-1,), ValueError, "depth must be a non-negative integer, got -1"),
    ((8.0,), TypeError, "depth must be a non-negative integer, got float 8.0"),
    ((True,), TypeError, "depth must be a non-negative integer, got bool True"),
    (("8",), TypeError, "depth must be a non-negative integer, got str '8'"),
    ((None,), TypeError, "depth must be a non-negative integer, got NoneType None"),
    ((2**64,), ValueError, f"depth must be in 2..64, got {2**64}"),
    ((8, "middle"), ValueError, "ties must be 'first' or 'last', got 'middle'"),
    ((8, "First"), ValueError, "ties must be 'first' or 'last', got 'First'"),
    ((8, None), ValueError, "ties must be 'first' or 'last', got None"),
    ((8, b"first"), ValueError, "ties must be 'first' or 'last', got b'first'"),
]


@pytest.mark.parametrize("args, exc, message", REFUSED_INIT)
def test_bad_settings_are_refused(trie, args, exc, message):
    with pytest.raises(exc) as info:
        trie(*args)
    assert str(info.value) == message


def test_settings_in_range_are_taken(trie):
    assert [trie(d).depth for d in (2, MAX_TRIE_DEPTH, np.int64(5))] == [2, MAX_TRIE_DEPTH, 5]
    assert trie().depth == 8 and trie().ties == "first" and trie(ties="last").ties == "last"
    assert repr(trie(3, "last")) == "SuffixTrie(depth=3, ties='last', tokens=0, nodes=0)"


#: (label, call on a depth-4 trie fed two sequences) refused with (exception, message)
REFUSED_CALLS = [
    ("seq float", lambda t: t.extend(1.5, [1]), TypeError, "seq must be an integer, got float 1.5"),
    ("seq bool", lambda t: t.extend(True, [1]), TypeError, "seq must be an integer, got bool True"),
    ("seq np.bool_", lambda t: t.extend(np.bool_(False), [1]), TypeError, "seq must be an integer, got bool "),
    ("seq str", lambda t: t.extend("1", [1]), TypeError, "seq must be an integer, got str '1'"),
    ("seq None", lambda t: t.extend(None, [1]), TypeError, "seq must be an integer, got NoneType None"),
    ("seq np.float", lambda t: t.extend(np.float64(1), [1]), TypeError, "seq must be an integer, got float64 "),
    ("seq > int64", lambda t: t.extend(2**63, [1]), OverflowError, f"seq={2**63} is beyond int64"),
    ("seq < int64", lambda t: t.extend(-(2**63) - 1, [1]), OverflowError, f"seq={-(2**63) - 1} is beyond int64"),
    ("seq uint64", lambda t: t.extend(np.uint64(2**64 - 1), [1]), OverflowError, f"seq={2**64 - 1} is beyond int64"),
    ("close float", lambda t: t.close(0.0), TypeError, "seq must be an integer, got float 0.0"),
    ("close > int64", lambda t: t.close(2**64), OverflowError, f"seq={2**64} is beyond int64"),
    ("tokens float", lambda t: t.extend(0, [1, 2.0]), TypeError, "tokens[1] must be an integer token id, got float 2.0"),
    ("tokens bool", lambda t: t.extend(0, [True]), TypeError, "tokens[0] must be an integer token id, got bool True"),
    ("tokens > int64", lambda t: t.extend(0, [1, 2**63]), OverflowError, f"tokens[1]={2**63} is beyond int64"),
    ("tokens float array", lambda t: t.extend(0, np.array([1.0])), TypeError, "tokens has unsupported dtype float64"),
    ("tokens bool array", lambda t: t.extend(0, np.array([True])), TypeError, "tokens has unsupported dtype bool"),
    ("tokens 2-D", lambda t: t.extend(0, np.array([[1]])), ValueError, "tokens must be 1-D, got a 2-D array"),
    ("tokens nested", lambda t: t.extend(0, [[1]]), ValueError, "tokens must be 1-D, got a list at tokens[0]"),
    ("tokens scalar", lambda t: t.extend(0, 5), TypeError, "tokens must be a list, tuple or 1-D integer numpy array"),
    ("tokens str", lambda t: t.extend(0, "12"), TypeError, "tokens must be a list, tuple or 1-D integer numpy array"),
    ("tokens None", lambda t: t.extend(0, None), TypeError, "tokens must be a list, tuple or 1-D integer numpy array"),
    ("tokens uint64", lambda t: t.extend(0, np.array([2**64 - 1], dtype=np.uint64)), OverflowError,
     "tokens holds ids beyond int64"),
    ("tokens device", lambda t: t.extend(0, DeviceTensor()), TypeError, "tokens is a DeviceTensor in device memory"),
    ("context float", lambda t: t.speculate([1.0], 2), TypeError, "context[0] must be an integer token id"),
    ("context bool", lambda t: t.speculate([1, False], 2), TypeError, "context[1] must be an integer token id"),
    ("context > int64", lambda t: t.speculate([-(2**63) - 1], 2), OverflowError, "context[0]="),
    ("context 2-D", lambda t: t.speculate(np.zeros((1, 2), dtype=np.int64), 2), ValueError, "context must be 1-D"),
    ("context scalar", lambda t: t.speculate(3, 2), TypeError, "context must be a list, tuple or 1-D integer"),
    ("max_k negative", lambda t: t.speculate([1], -1), ValueError, "max_k must be a non-negative integer, got -1"),
    ("max_k float", lambda t: t.speculate([1], 2.0), TypeError, "max_k must be a non-negative integer, got float 2.0"),
    ("max_k bool", lambda t: t.speculate([1], True), TypeError, "max_k must be a non-negative integer, got bool True"),
    ("max_k None", lambda t: t.speculate([1], None), TypeError, "max_k must be a non-negative integer, got NoneType"),
    ("factor negative", lambda t: t.speculate([1], 2, -0.5), ValueError, "factor must be finite and >= 0, got -0.5"),
    ("factor nan", lambda t: t.speculate([1], 2, float("nan")), ValueError, "factor must be finite and >= 0, got nan"),
    ("factor inf", lambda t: t.speculate([1], 2, float("inf")), ValueError, "factor must be finite and >= 0, got inf"),
    ("factor bool", lambda t: t.speculate([1], 2, True), TypeError, "factor must be a real number, got bool True"),
    ("factor str", lambda t: t.speculate([1], 2, "1"), TypeError, "factor must be a real number, got str '1'"),
    ("factor None", lambda t: t.speculate([1], 2, None), TypeError, "factor must be a real number, got NoneType"),
    ("min_prob above 1", lambda t: t.speculate([1], 2, 1.0, 1.5), ValueError, "min_prob must be in [0, 1], got 1.5"),
    ("min_prob negative", lambda t: t.speculate([1], 2, 1.0, -0.1), ValueError, "min_prob must be in [0, 1], got -0.1"),
    ("min_prob nan", lambda t: t.speculate([1], 2, 1.0, float("nan")), ValueError, "min_prob must be in [0, 1], got nan"),
    ("min_prob big int", lambda t: t.speculate([1], 2, 1.0, 2), ValueError, "min_prob must be in [0, 1], got 2.0"),
    ("min_prob bool", lambda t: t.speculate([1], 2, 1.0, False), TypeError, "min_prob must be a real number, got bool"),
    ("min_prob str", lambda t: t.speculate([1], 2, 1.0, "0.1"), TypeError, "min_prob must be a real number, got str"),
]


def _fed(cls):
    t = cls(4)
    t.extend(0, [1, 2, 1, 2, 3])
    t.extend(5, [2, 1])
    return t


def _snapshot(t) -> tuple:
    return state(t), [exact(t.speculate(c, 4, 0, 0.0)) for c in ([1], [2], [2, 1], [1, 2, 1, 2])]


@pytest.mark.parametrize("label, call, exc, message", REFUSED_CALLS, ids=[c[0] for c in REFUSED_CALLS])
def test_bad_calls_are_refused_alike_and_change_nothing(label, call, exc, message):
    seen = []
    for cls in classes():
        t = _fed(cls)
        before = _snapshot(t)
        with pytest.raises(exc) as info:
            call(t)
        assert str(info.value).startswith(message), str(info.value)
        assert _snapshot(t) == before
        seen.append((type(info.value), str(info.value)))
    assert len(set(seen)) == 1, seen


@pytest.mark.parametrize("call", [
    lambda t: t.speculate([1, 2], 2**64),              # max_k is capped at depth
    lambda t: t.speculate([1, 2], 4, 0.0, 1),          # an int min_prob in range
    lambda t: t.speculate([1, 2], 4, np.float32(1.5), np.float64(0.2)),
    lambda t: t.speculate(np.array([1, 2], dtype=np.uint8), np.int64(4), 2, 0),
    lambda t: t.extend(-(2**63), np.array([1, 2], dtype=">i8")),
    lambda t: t.extend(np.int32(3), (1, 2)),
])
def test_edge_arguments_are_taken_alike(call):
    got = []
    for cls in classes():
        t = _fed(cls)
        out = call(t)
        got.append((exact(out) if out is not None else None, _snapshot(t)))
    assert all(g == got[0] for g in got)


def test_an_extend_that_could_pass_the_node_limit_is_refused(monkeypatch):
    """``check_trie_room`` (each token makes at most ``depth`` nodes), with the limit
    lowered so that a test can reach it: the same message, nothing changed."""
    monkeypatch.setattr(drafting_checks, "MAX_TRIE_NODES", 40)
    seen = []
    for cls in classes():
        t = _fed(cls)                         # 11 nodes
        t.extend(0, [9] * 6)                  # 11 + 6 * 4 <= 40: taken (10 new nodes)
        t.close(0)
        before = _snapshot(t)
        assert t.n_nodes == 21
        with pytest.raises(ValueError) as info:
            t.extend(1, [7] * 5)              # 21 + 5 * 4 > 40, whatever it would make
        assert _snapshot(t) == before
        t.extend(1, [])                       # no tokens: nothing to refuse
        seen.append(str(info.value))
    assert seen[0] == ("tokens: 5 more tokens could take the trie past its 40 nodes (it has 21); "
                       "start another trie")
    assert len(set(seen)) == 1


def test_host_tensors_are_read_through_dlpack(trie):
    t = trie(3)
    t.extend(0, HostTensor(np.array([1, 2, 1, 2], dtype=np.int32)))
    assert t.speculate(HostTensor(np.array([1])), 2) == ([2], 1.0, 1)


# --------------------------------------------------------------------------------------
# the guard, re-entrant conversions, pickling
# --------------------------------------------------------------------------------------
def test_repr_says_when_a_trie_cannot_be_read(trie):
    """(The guard itself, on every method and property: ``tests/test_guard.py``'s row.)"""
    assert repr(trie.__new__(trie)) == "SuffixTrie(<not initialised or unusable>)"
    t = _fed(trie)
    t._hold_guard(True)
    try:
        with pytest.raises(RuntimeError, match="SuffixTrie is being changed"):
            repr(t)                      # as the twin's, which reads ``ties``
    finally:
        t._hold_guard(False)
    assert repr(t) == "SuffixTrie(depth=4, ties='first', tokens=7, nodes=11)"


@pytest.mark.parametrize("name", ["extend", "close", "speculate", "_hold_guard", "__reduce__", "__len__"])
def test_unbound_calls_with_another_object_are_refused(trie, name):
    for other in (object(), 7, [0] * 8, "x" * 64, np.zeros(8)):
        with pytest.raises(TypeError):
            getattr(trie, name)(other, *([1] * {"extend": 2, "close": 1, "speculate": 2, "_hold_guard": 1}.get(name, 0)))


def test_unbound_calls_with_the_other_implementation_are_refused():
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled core")
    twin, comp = classes()
    for a, b in ((twin, comp), (comp, twin)):
        with pytest.raises(TypeError, match="needs a SuffixTrie of the same implementation"):
            a.extend(b(4), 0, [1])
        with pytest.raises(TypeError, match="needs a SuffixTrie of the same implementation"):
            a.speculate(b(4), [1], 2)


@pytest.mark.parametrize("how", ["pickle", "copy", "deepcopy"])
def test_not_picklable(trie, how):
    t = _fed(trie)
    call = {"pickle": lambda: pickle.dumps(t), "copy": lambda: copy.copy(t), "deepcopy": lambda: copy.deepcopy(t)}
    with pytest.raises(TypeError, match=r"SuffixTrie cannot be pickled or copied \(build one and feed it"):
        call[how]()


def test_conversions_that_call_the_trie_see_it_whole(trie):
    """A ``seq`` and a token whose ``__index__`` extend or speculate on the same trie while
    the outer call converts its arguments: the inner calls run to their end first, then
    the outer one, as in the twin and the reference."""
    results = []
    for cls in classes():
        t = cls(3)
        seen = []

        class Key:
            def __index__(self):
                t.extend(1, [4, 5])
                seen.append(t.speculate([4], 2))
                return 1

        class Tok(np.int64):
            def __index__(self):
                t.extend(1, [4])
                return 6

        t.extend(Key(), [Tok(6), 7])
        t.speculate([Tok(6)], 2)
        seen.append(t.speculate([4], 2, 0))
        results.append((_snapshot(t), seen))
    ref = Reference(3, "first")
    ref.extend(1, [4, 5])
    ref.extend(1, [4])
    ref.extend(1, [6, 7])
    ref.extend(1, [4])
    assert results[0][0][0][:4] == ref.state()
    assert results[0][1][-1] == ref.speculate([4], 2, 0, 0.1)
    assert all(r == results[0] for r in results)



# --------------------------------------------------------------------------------------
# batches: extend_tries and speculate_tries
# --------------------------------------------------------------------------------------
def _flat(rows):
    """Per-row token lists as (tokens, offsets)."""
    off = [0]
    for r in rows:
        off.append(off[-1] + len(r))
    return [t for r in rows for t in r], off


def _tail(ref: Reference, seq: int) -> list[int]:
    """Sequence ``seq``'s last ``depth - 1`` tokens, as ``Reference`` kept them."""
    return ref.open.get(seq, [])[-(ref.depth - 1):]


def one_by_one(tries, refs, seqs, ks, others, factor, min_prob):
    """``speculate_tries`` made of single calls: ``tries[i].speculate(tail, ks[i], ...)``
    with the tail from ``refs[i]``, replaced by each of ``others`` that scores strictly
    higher, in order (works alike for References and tries)."""
    out = []
    for t, ref, seq, k in zip(tries, refs, seqs, ks):
        if not k:
            out.append([])
            continue
        tail = _tail(ref, seq)
        best, score, _ = t.speculate(tail, k, factor, min_prob)
        for o in others:
            d, sc, _ = o.speculate(tail, k, factor, min_prob)
            if sc > score:
                best, score = d, sc
        out.append(best)
    return out


def _drafts(out):
    assert type(out) is list and all(type(d) is list and all(type(x) is int for x in d) for d in out)
    return out


def _arg(values, how):
    """Keys, tokens, offsets or limits in layout ``how``: the ones the compiled batches
    read in C (lists, tuples, native int32/int64 arrays) or others, which go through the
    checks (numpy ints in a list, big-endian, strided)."""
    if how in ("npints", ">i8", "strided"):
        return _layout(values, how)
    return _tokens(values, how)


class Pool:
    """Tries of one implementation fed by batch calls, the same tries fed one call at a
    time, and the references."""

    def __init__(self, mod, settings):
        self.mod = mod
        self.batch = [mod.SuffixTrie(d, ties) for d, ties in settings]
        self.single = [mod.SuffixTrie(d, ties) for d, ties in settings]
        self.refs = [Reference(d, ties) for d, ties in settings]

    def extend(self, rows, how):
        idx, seqs, toks = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
        flat, off = _flat(toks)
        self.mod.extend_tries([self.batch[i] for i in idx], _arg(seqs, how), _arg(flat, how), _arg(off, how))
        for i, seq, tk in rows:
            self.single[i].extend(seq, tk)
            self.refs[i].extend(seq, tk)

    def close(self, i, seq):
        for t in (self.batch[i], self.single[i], self.refs[i]):
            t.close(seq)

    def speculate(self, idx, seqs, max_k, oidx, factor, min_prob, how):
        ks = [max_k] * len(idx) if isinstance(max_k, int) else list(max_k)
        ks = [min(k, I64) for k in ks]
        got = _drafts(self.mod.speculate_tries([self.batch[i] for i in idx], _arg(seqs, how),
                                               max_k if isinstance(max_k, int) else _arg(max_k, how),
                                               [self.batch[i] for i in oidx], factor, min_prob))
        refs = [self.refs[i] for i in idx]
        single = one_by_one([self.single[i] for i in idx], refs, seqs, ks, [self.single[i] for i in oidx],
                            factor, min_prob)
        plain = one_by_one(refs, refs, seqs, ks, [self.refs[i] for i in oidx], factor, min_prob)
        assert got == single == plain, (got, single, plain)
        return got

    def states(self):
        b = [state(t) for t in self.batch]
        assert b == [state(t) for t in self.single]
        assert [x[:4] for x in b] == [r.state() for r in self.refs]
        return b


SMALL_TOKENS = st.one_of(st.integers(0, 3), st.integers(0, 3), st.sampled_from([-1, I64, -I64 - 1]))
ROW = st.tuples(st.integers(0, 3), st.integers(-1, 3), st.lists(SMALL_TOKENS, max_size=6))
LIMITS = st.one_of(st.integers(0, 12), st.just(2**64), st.lists(st.integers(0, 12), min_size=8, max_size=8))
BATCH_OPS = st.one_of(
    st.tuples(st.just("extend"), st.lists(ROW, max_size=6),
              st.sampled_from(["list", "int64", "int32", "tuple", "npints", ">i8", "strided"])),
    st.tuples(st.just("close"), st.integers(0, 3), st.integers(-1, 4)),
    st.tuples(st.just("speculate"), st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 4)), max_size=8),
              LIMITS, st.lists(st.integers(0, 3), max_size=4), FACTORS, MIN_PROBS,
              st.sampled_from(["list", "int64", "tuple", "npints", ">i8"])),
)


@SETTINGS
@given(settings_=st.lists(st.tuples(st.integers(2, 10), st.sampled_from(["first", "last"])), min_size=1, max_size=4),
       ops=st.lists(BATCH_OPS, max_size=20))
def test_batches_agree_with_single_calls_and_the_reference(settings_, ops):
    n = len(settings_)
    pools = [Pool(m, settings_) for m in modules()]
    seen = []
    for op in ops:
        if op[0] == "extend":
            rows = [(i % n, seq, tk) for i, seq, tk in op[1]]
            for p in pools:
                p.extend(rows, op[2])
        elif op[0] == "close":
            for p in pools:
                p.close(op[1] % n, op[2])
        else:
            _, rows, max_k, oidx, factor, min_prob, how = op
            idx, seqs = [i % n for i, _ in rows], [seq for _, seq in rows]
            if isinstance(max_k, list):
                max_k = max_k[:len(rows)]
            seen.append([p.speculate(idx, seqs, max_k, [i % n for i in oidx], factor, min_prob, how)
                         for p in pools])
        assert len({repr(p.states()) for p in pools}) == 1
    assert all(s == [s[0]] * len(pools) for s in seen)


def _busy_program(mod, rng, settings_):
    """A long random program of batch calls on own tries and one shared trie, as the
    vLLM proposer makes them (own tries per row, the shared one repeated, ``others``)."""
    pool = Pool(mod, settings_)
    n = len(settings_)
    out = []
    for step in range(6):
        B = int(rng.integers(20, 300))
        own = rng.integers(1, n, B)
        rows = [(int(own[b]), int(b % 37), rng.integers(0, 6, int(rng.integers(0, 40))).tolist()) for b in range(B)]
        pool.extend(rows, "int64")
        pool.extend([(0, int(b % 37), tk) for _, b, tk in rows[: B // 2]], "list")   # the shared trie
        seqs = [b % 37 for b in range(B)]
        ks = rng.integers(0, 10, B).tolist() if step % 2 else 4
        out.append(pool.speculate(own.tolist(), seqs, ks, [0], 1.0, 0.1, "int64"))
        out.append(pool.speculate([0] * B, seqs, 3, [1, 2, 0], 0.5, 0.0, "list"))
        if step == 3:
            pool.close(1, 5)
    return out, pool.states()


def test_large_batches_agree():
    """Batches long enough to run without the GIL (and short ones), compiled == twin ==
    single calls == the reference."""
    settings_ = [(8, "first"), (4, "last"), (8, "last"), (3, "first")]
    got = [_busy_program(m, np.random.default_rng(11), settings_) for m in modules()]
    assert all(g == got[0] for g in got)
    assert sum(len(d) for out in got[0][0] for d in out) > 100


def test_a_worked_batch(impl):
    mod = impl.module("suffix_trie")
    a, b, c = mod.SuffixTrie(3), mod.SuffixTrie(2), mod.SuffixTrie(3)
    mod.extend_tries([a, b, a, c], [0, 0, 1, 0], [1, 2, 1, 2, 3, 7, 1, 2, 2, 3, 9, 2, 3, 9], [0, 5, 6, 8, 14])
    assert (len(a), len(b), a.open_sequences, b.open_sequences) == (7, 1, 2, 1)
    # a's sequence 0 ends "2 3" (no continuation), 1 ends "1 2"; factor 0: k = 3 for
    # every match; from "2": "2 1" (1 of 3, first of the ties), then "2 1 2" (1 of 1):
    # 1/3 + 1/3 beats "1 2" -> "1 2 1" (1/3); b has no "2", and no sequence 9
    assert mod.speculate_tries([a, a, b, b], [0, 1, 0, 9], 3, factor=0) == [[], [1, 2], [], []]
    # c, after "2 3": "2 3 9" (1.0); after "2" (its "1 2" is no node): "2 3" (1.0), which
    # beats a's 1/3
    assert mod.speculate_tries([a, a], [0, 1], 3, others=[c]) == [[9], [3]]
    assert mod.speculate_tries([a, a, c], [0, 1, 0], [3, 0, 1], others=[b, c, a]) == [[9], [], [2]]
    assert mod.speculate_tries([a, b], [1, 0], 2, others=(b, a), factor=0, min_prob=0.3) == [[1, 2], []]
    mod.extend_tries([], [], [], [0])
    assert mod.speculate_tries([], [], 4, [a]) == []


#: (label, call on the module and two fed tries a and b) refused with (exception, message)
REFUSED_BATCHES = [
    ("tries a trie", lambda m, a, b: m.extend_tries(a, [0], [1], [0, 1]), TypeError,
     "tries must be a list or tuple of SuffixTrie, got SuffixTrie"),
    ("tries a generator", lambda m, a, b: m.speculate_tries((t for t in [a]), [0], 2), TypeError,
     "tries must be a list or tuple of SuffixTrie, got generator"),
    ("tries None", lambda m, a, b: m.extend_tries(None, [], [], [0]), TypeError,
     "tries must be a list or tuple of SuffixTrie, got NoneType"),
    ("tries entry", lambda m, a, b: m.extend_tries([a, 5], [0, 1], [1], [0, 1, 1]), TypeError,
     "tries[1] must be a SuffixTrie of the same implementation, got builtins.int"),
    ("tries entry None", lambda m, a, b: m.speculate_tries([None], [0], 2), TypeError,
     "tries[0] must be a SuffixTrie of the same implementation, got builtins.NoneType"),
    ("tries entry that lies", lambda m, a, b: m.extend_tries([_liar(m)], [0], [1], [0, 1]), TypeError,
     "tries[0] must be a SuffixTrie of the same implementation, got test_suffix_trie.Liar"),
    ("others a trie", lambda m, a, b: m.speculate_tries([a], [0], 2, b), TypeError,
     "others must be a list or tuple of SuffixTrie, got SuffixTrie"),
    ("others entry", lambda m, a, b: m.speculate_tries([a], [0], 2, [b, "b"]), TypeError,
     "others[1] must be a SuffixTrie of the same implementation, got builtins.str"),
    ("others entry that lies", lambda m, a, b: m.speculate_tries([a], [0], 2, [_liar(m)]), TypeError,
     "others[0] must be a SuffixTrie of the same implementation, got test_suffix_trie.Liar"),
    ("seqs short", lambda m, a, b: m.extend_tries([a, b], [0], [1], [0, 1, 1]), ValueError,
     "seqs holds 1 keys for 2 tries"),
    ("seqs long", lambda m, a, b: m.speculate_tries([a], [0, 1], 2), ValueError, "seqs holds 2 keys for 1 tries"),
    ("seqs float", lambda m, a, b: m.speculate_tries([a], [0.5], 2), TypeError, "seqs[0] must be an integer"),
    ("seqs bool", lambda m, a, b: m.extend_tries([a], [True], [], [0, 0]), TypeError, "seqs[0] must be an integer"),
    ("seqs > int64", lambda m, a, b: m.extend_tries([a], [2**63], [], [0, 0]), OverflowError, "seqs[0]="),
    ("seqs scalar", lambda m, a, b: m.extend_tries([a], 0, [], [0, 0]), TypeError, "seqs must be a list, tuple"),
    ("offsets short", lambda m, a, b: m.extend_tries([a, b], [0, 1], [1], [0, 1]), ValueError,
     "offsets holds 2 entries for 2 rows; it needs B + 1 = 3"),
    ("offsets start", lambda m, a, b: m.extend_tries([a], [0], [1], [1, 1]), ValueError, "offsets[0] must be 0, got 1"),
    ("offsets decrease", lambda m, a, b: m.extend_tries([a, b], [0, 1], [1, 2], [0, 2, 1]), ValueError,
     "offsets must be nondecreasing, got offsets[1]=2 > offsets[2]=1"),
    ("offsets end", lambda m, a, b: m.extend_tries([a], [0], [1, 2], [0, 1]), ValueError,
     "offsets[-1]=1 must equal len(tokens)=2"),
    ("offsets float", lambda m, a, b: m.extend_tries([a], [0], [1], [0, 1.0]), TypeError, "offsets[1] must be"),
    ("tokens float", lambda m, a, b: m.extend_tries([a], [0], [1, 2.0], [0, 2]), TypeError,
     "tokens[1] must be an integer token id, got float 2.0"),
    ("tokens > int64", lambda m, a, b: m.extend_tries([a], [0], [2**63], [0, 1]), OverflowError,
     f"tokens[0]={2**63} is beyond int64"),
    ("tokens 2-D", lambda m, a, b: m.extend_tries([a], [0], np.zeros((1, 1), dtype=np.int64), [0, 1]), ValueError,
     "tokens must be 1-D"),
    ("max_k negative", lambda m, a, b: m.speculate_tries([a], [0], -1), ValueError,
     "max_k must be a non-negative integer, got -1"),
    ("max_k None", lambda m, a, b: m.speculate_tries([a], [0], None), TypeError,
     "max_k must be a non-negative integer or one count per request, got None"),
    ("max_k float", lambda m, a, b: m.speculate_tries([a], [0], 2.0), TypeError,
     "max_k must be a non-negative integer, got float 2.0"),
    ("max_k per row short", lambda m, a, b: m.speculate_tries([a, b], [0, 0], [2]), ValueError,
     "max_k holds 1 counts for 2 requests"),
    ("max_k per row negative", lambda m, a, b: m.speculate_tries([a, b], [0, 0], [2, -1]), ValueError,
     "max_k must be non-negative, got max_k[1]=-1"),
    ("factor negative", lambda m, a, b: m.speculate_tries([a], [0], 2, [], -1.0), ValueError,
     "factor must be finite and >= 0, got -1.0"),
    ("factor str", lambda m, a, b: m.speculate_tries([a], [0], 2, [], "1"), TypeError,
     "factor must be a real number, got str '1'"),
    ("min_prob above 1", lambda m, a, b: m.speculate_tries([a], [0], 2, [], 1.0, 2.0), ValueError,
     "min_prob must be in [0, 1], got 2.0"),
    ("the first bad argument", lambda m, a, b: m.speculate_tries([a, 1], [0.5], -1, 5, -1.0, 2.0), TypeError,
     "tries[1] must be a SuffixTrie of the same implementation, got builtins.int"),
    ("the first bad argument after tries", lambda m, a, b: m.speculate_tries([a], [0], -1, 5, -1.0), TypeError,
     "others must be a list or tuple of SuffixTrie, got int"),
]


def liar(cls: type) -> object:
    """An object of a class named Liar that claims to be a ``cls`` (``isinstance``
    believes the ``__class__`` it gives)."""
    return type("Liar", (), {"__class__": property(lambda self: cls)})()


def _liar(mod):
    out = liar(mod.SuffixTrie)
    assert isinstance(out, mod.SuffixTrie)
    return out


def _two(mod):
    """Two fed tries of ``mod``: ``_fed``'s and one of depth 2."""
    a, b = _fed(mod.SuffixTrie), mod.SuffixTrie(2, "last")
    b.extend(3, [4, 4, 2])
    return a, b


@pytest.mark.parametrize("label, call, exc, message", REFUSED_BATCHES, ids=[c[0] for c in REFUSED_BATCHES])
def test_bad_batches_are_refused_alike_and_change_nothing(label, call, exc, message):
    seen = []
    for mod in modules():
        a, b = _two(mod)
        before = [_snapshot(a), _snapshot(b)]
        with pytest.raises(exc) as info:
            call(mod, a, b)
        assert str(info.value).startswith(message), str(info.value)
        assert [_snapshot(a), _snapshot(b)] == before
        seen.append((type(info.value), str(info.value)))
    assert len(set(seen)) == 1, seen


def test_batches_refuse_the_other_implementations_tries():
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled core")
    twin, comp = modules()
    for mine, other in ((twin, comp), (comp, twin)):
        t = other.SuffixTrie(3)
        with pytest.raises(TypeError, match=r"tries\[0\] must be a SuffixTrie of the same implementation"):
            mine.extend_tries([t], [0], [1], [0, 1])
        with pytest.raises(TypeError, match=r"others\[1\] must be a SuffixTrie of the same implementation"):
            mine.speculate_tries([mine.SuffixTrie(3)], [0], 2, [mine.SuffixTrie(2), t])


def test_a_batch_that_could_pass_the_node_limit_is_refused(monkeypatch):
    """The room for all of a trie's tokens in the call (``check_trie_room``, the limit
    lowered as in the single-call test): rows that each fit but together do not are
    refused, the other tries of the call left as they were too."""
    monkeypatch.setattr(drafting_checks, "MAX_TRIE_NODES", 40)
    seen = []
    for mod in modules():
        a, b = _two(mod)                       # a: 11 nodes, depth 4
        before = [_snapshot(a), _snapshot(b)]
        with pytest.raises(ValueError) as info:
            # b first (fits), then a twice: 11 + 4 * 4 fits, 11 + 8 * 4 does not
            mod.extend_tries([b, a, a], [7, 8, 9], [1, 9, 9, 9, 9, 8, 8, 8, 8], [0, 1, 5, 9])
        assert [_snapshot(a), _snapshot(b)] == before
        mod.extend_tries([b, a, a, a], [7, 8, 9, 10], [1, 9, 9, 9, 9, 8, 8, 8], [0, 1, 5, 8, 8])  # 11 + 28
        assert (a.open_sequences, b.open_sequences, len(a), len(b)) == (5, 2, 14, 4)
        seen.append(str(info.value))
    assert seen[0] == ("tokens: 8 more tokens could take the trie past its 40 nodes (it has 11); "
                       "start another trie")
    assert len(set(seen)) == 1


@pytest.mark.parametrize("where", range(3))
@pytest.mark.parametrize("busy", ["held", "raw"])
def test_a_busy_trie_among_several_refuses_the_batch_and_changes_nothing(where, busy):
    """A trie whose guard is held (``_hold_guard``), or one never initialised, anywhere
    among the tries (or ``others``): the batch is refused with the guard's message,
    nothing changes in any trie, and every guard taken is given back (the others are
    then extended and read as usual)."""
    seen, after = [], []
    for mod in modules():
        a, b = _two(mod)
        c = mod.SuffixTrie.__new__(mod.SuffixTrie) if busy == "raw" else _fed(mod.SuffixTrie)
        rows = [a, a, b]
        rows.insert(where, c)
        before = [_snapshot(a), _snapshot(b)] + ([] if busy == "raw" else [_snapshot(c)])
        if busy == "held":
            c._hold_guard(True)
        calls = [lambda: mod.extend_tries(rows, [0, 1, 2, 3], [5, 6, 7, 8], [0, 1, 2, 3, 4]),
                 lambda: mod.speculate_tries(rows, [0, 1, 2, 3], 3, [b, a]),
                 lambda: mod.speculate_tries([a, b], [0, 5], 3, [b, c][::1 if where % 2 else -1])]
        for call in calls:
            with pytest.raises(RuntimeError) as info:
                call()
            seen.append(str(info.value))
        if busy == "held":
            c._hold_guard(False)
        assert [_snapshot(a), _snapshot(b)] + ([] if busy == "raw" else [_snapshot(c)]) == before
        mod.extend_tries([a, b, a], [0, 1, 0], [1, 2, 3], [0, 1, 2, 3])     # every guard given back
        after.append(mod.speculate_tries([a, b], [0, 1], 2, [a]))
    assert after == [[[1], [1]]] * len(after)
    want = ("SuffixTrie is being changed (by another thread, or by a callback inside a call on it)"
            if busy == "held" else "SuffixTrie was not initialised (its __init__ never completed)")
    assert set(seen) == {want}


def test_subclassed_tries_and_numpy_limits_are_taken():
    """Tries of a subclass, numpy scalars and a limit beyond int64 (the checks' path of the
    compiled batches) give what plain ones give."""
    got = []
    for mod in modules():
        class Sub(mod.SuffixTrie):
            pass

        out = []
        for cls, key, k, f in ((mod.SuffixTrie, 0, 3, 1.0), (Sub, np.int64(0), np.int64(3), np.float32(1.0)),
                               (Sub, 0, 2**64, 1)):
            a, b = cls(4), cls(2)
            mod.extend_tries((a, b, a), [key, 1, 2], (1, 2, 1, 2, 3, 1, 2, 1), [0, 5, 6, 8])
            out.append((mod.speculate_tries((a, a, b), [key, 2, 1], k, (b, a), f, np.float64(0.0)),
                        [_snapshot(a), _snapshot(b)]))
        assert out[0] == out[1] and out[0][1] == out[2][1]
        got.append(out)
    assert all(g == got[0] for g in got)


def test_a_trie_in_tries_and_others_is_read_once():
    """A trie repeated in ``tries`` and in ``others`` counts itself a reader once, and
    gives that back (a writer is taken at once after)."""
    for mod in modules():
        a, b = _two(mod)
        assert mod.speculate_tries([a, a, b], [0, 0, 3], 4, [a, b, a], 0, 0.0) == [[], [], [1, 2, 3]]
        a._hold_guard(True)          # no reader left: a writer gets it
        a._hold_guard(False)
        mod.extend_tries([a, a], [0, 0], [1, 2], [0, 1, 2])


def test_conversions_that_call_the_tries_see_them_whole():
    """A ``seqs`` entry and a token whose ``__index__`` extend, close or read the tries
    of the call while it converts its arguments: the inner calls run to their end
    first, then the batch, alike on both."""
    results = []
    for mod in modules():
        a, b = _two(mod)
        seen = []

        class Key(np.int64):
            def __index__(self):
                mod.extend_tries([a, b], [1, 1], [4, 5], [0, 1, 2])
                seen.append(mod.speculate_tries([a, b], [1, 3], 2, [b]))
                return 1

        class Tok(np.int64):
            def __index__(self):
                a.close(0)
                b.extend(3, [2])
                return 6

        mod.extend_tries([a, b, a], [0, Key(1), 1], [1, 2, Tok(6), 7], [0, 1, 2, 4])
        seen.append(mod.speculate_tries([a, b, a], [Key(1), 3, 0], [Key(2), 2, 2], [b, a]))
        results.append(([_snapshot(a), _snapshot(b)], seen))
    assert all(r == results[0] for r in results)
