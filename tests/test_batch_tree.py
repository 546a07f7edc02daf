"""Tree slots of ``BatchState``: ``enter_verify_tree``, ``pending_trees`` and the
step's greedy tree settle, against ``ServingState``'s ``VerifyTree`` (and ``Verify`` for the
chain slots beside them) per request, the compiled batch against its twin, a chain as a
tree against a chain with the bonus row, and every refusal leaving the batch intact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import _impl
from specfsm.accept.rules import MinRun
from specfsm.errors import IllegalTransition
from impls import over
from specfsm.machine.batch import DECODE, DONE, VERIFY
from specfsm.machine.state import Accept, Decode, Rollback, Verify, VerifyTree

ALPHABET = 8          # token ids 0..7: more than any node's children, so siblings can differ
KMAX = 6


# --------------------------------------------------------------------------------------
# random trees, chains and target rows
# --------------------------------------------------------------------------------------
def random_tree(rng: np.random.RandomState, n: int) -> tuple[list[int], list[int]]:
    """A tree of ``n`` nodes: each parent an earlier node or the root, sibling tokens
    distinct (drawn from the tokens the parent's children do not hold yet)."""
    tokens: list[int] = []
    parents: list[int] = []
    used: dict[int, set[int]] = {}
    for i in range(n):
        q = int(rng.randint(-1, i)) if i else -1
        free = [t for t in range(ALPHABET) if t not in used.setdefault(q, set())]
        t = int(rng.choice(free))
        used[q].add(t)
        tokens.append(t)
        parents.append(q)
    return tokens, parents


def tree_rows(rng: np.random.RandomState, tokens: list[int], parents: list[int]) -> list[int]:
    """N + 1 target rows that often follow a child (so paths of every length occur)."""
    rows = []
    for r in range(len(tokens) + 1):
        kids = [c for c, q in enumerate(parents) if q == r - 1]
        if kids and rng.rand() < 0.75:
            rows.append(tokens[int(rng.choice(kids))])
        else:
            rows.append(int(rng.randint(ALPHABET)))
    return rows


def chain_rows(rng: np.random.RandomState, draft: list[int], n_rows: int) -> list[int]:
    return [draft[r] if r < len(draft) and rng.rand() < 0.75 else int(rng.randint(ALPHABET))
            for r in range(n_rows)]


def chain_parents(k: int) -> list[int]:
    return list(range(-1, k - 1))


# --------------------------------------------------------------------------------------
# one random run, checked against the per-request state machine
# --------------------------------------------------------------------------------------
def reference(slot_state, kind, draft, parents, rows, bonus):
    """What ``ServingState`` makes of one slot's verify: (emitted, resume row, rolled back,
    accepted, drafted, the state after resume/rollback). Row caches are the row numbers,
    so the settled cache is the resume row."""
    caches = list(range(len(rows)))
    if kind == "tree" or bonus:       # a chain with the bonus row settles as a chain tree
        ps = parents if kind == "tree" else chain_parents(len(draft))
        v = slot_state.enter_verify_tree(draft, ps)
        assert isinstance(v, VerifyTree)
        path = v.path(rows)
        out = v.accept(rows, caches)
        r = path[-1] + 1 if path else 0
        emitted = [draft[c] for c in path] + [rows[r]]
        m = len(path)
    else:
        v = slot_state.enter_verify(draft)
        assert isinstance(v, Verify)
        out = v.accept(rows, caches)
        m = out.n if isinstance(out, Accept) else _prefix(draft, rows)
        emitted = list(draft) if isinstance(out, Accept) else list(draft[:m]) + [rows[m]]
    rolled = isinstance(out, Rollback)
    resume_row = out.snapshot if rolled else out.cache
    after = out.rollback() if rolled else out.resume()
    return emitted, resume_row, rolled, m, len(draft), after


def _prefix(d, r):
    n = 0
    while n < len(d) and d[n] == r[n]:
        n += 1
    return n


def drive(cls, seed: int, capacity: int, bonus: bool, with_index: bool, ngram, suffix=None) -> list:
    """A random run on one implementation's ``BatchState``: slots admitted, then rounds
    where each Decode slot decodes, drafts a chain or drafts a tree, each step checked
    slot by slot against ``reference``; returns the run's trace (results and states)."""
    rng = np.random.RandomState(seed)
    b = cls(capacity, KMAX, bonus=bonus)
    prompts = [[int(x) for x in rng.randint(ALPHABET, size=rng.randint(1, 4))] for _ in range(capacity)]
    budgets = [int(rng.randint(1, 30)) for _ in range(capacity)]
    eos = int(rng.randint(ALPHABET)) if rng.rand() < 0.3 else None
    indexes = None
    if with_index:
        indexes = []
        for q, p in enumerate(prompts):
            # n-gram indexes, and with ``suffix`` (a SuffixIndex module) adaptive suffix
            # indexes on every other slot
            if suffix is not None and q % 2:
                ix = suffix.SuffixIndex(1, None, "earliest", adaptive=True)
            else:
                ix = ngram.NgramIndex(1, 3)
            ix.extend(p)
            indexes.append(ix)
    off = np.cumsum([0] + [len(p) for p in prompts])
    b.admit(list(range(capacity)), [t for p in prompts for t in p], off, caches=list(range(capacity)),
            max_tokens=budgets, eos=eos, indexes=indexes)
    trace: list = []
    for _ in range(8):
        slots, inputs, offsets = b.pending()
        if len(slots) == 0:
            break
        # this round's verifies: slots left in Verify by the last step's drafts, and new
        # chains and trees for some of the Decode slots
        states = b.states
        dec = [s for s in slots.tolist() if states[s] == DECODE]
        chains, trees = {}, {}
        for s in dec:
            u = rng.rand()
            n = int(rng.randint(1, KMAX + 1))
            if u < 0.4:
                trees[s] = random_tree(rng, n)
            elif u < 0.6:
                chains[s] = [int(x) for x in rng.randint(ALPHABET, size=n)]
        if chains:
            ks = sorted(chains)
            b.enter_verify(ks, [t for s in ks for t in chains[s]],
                           np.cumsum([0] + [len(chains[s]) for s in ks]))
        if trees:
            ks = sorted(trees)
            b.enter_verify_tree(ks, [t for s in ks for t in trees[s][0]], [q for s in ks for q in trees[s][1]],
                                np.cumsum([0] + [len(trees[s][0]) for s in ks]))
        before = {s: b.state_of(s) for s in slots.tolist()}
        remaining = b.remaining
        slots, inputs, offsets = b.pending()
        tslots, tpar, toff = b.pending_trees()
        assert sorted(trees) == [s for s in tslots.tolist() if s in trees]
        assert all(isinstance(before[s], VerifyTree) for s in tslots.tolist())
        rows_of: dict[int, list[int]] = {}
        for j, s in enumerate(slots.tolist()):
            lo, hi = int(offsets[j]), int(offsets[j + 1])
            seg = inputs[lo:hi].tolist()
            st_ = before[s]
            if isinstance(st_, VerifyTree):
                q = tslots.tolist().index(s)
                assert tpar[toff[q]:toff[q + 1]].tolist() == list(st_.parents)
                assert seg == [int(b.tokens[s])] + list(st_.tokens)       # root, then the nodes
                rows_of[s] = tree_rows(rng, list(st_.tokens), list(st_.parents))
            elif isinstance(st_, Verify):
                rows_of[s] = chain_rows(rng, list(st_.draft), hi - lo)
            else:
                rows_of[s] = [int(rng.randint(ALPHABET)) for _ in range(hi - lo)]
        res = b.step(np.array([t for s in slots.tolist() for t in rows_of[s]], dtype=np.int64))
        trace.append([res.slots.tolist(), res.emitted.tolist(), res.emitted_offsets.tolist(),
                      res.accepted.tolist(), res.drafted.tolist(), res.resume_rows.tolist(),
                      res.rolled_back.tolist(), res.finished.tolist(), res.drafts.tolist(),
                      res.draft_offsets.tolist(), b.states.tolist(), b.tokens.tolist()])
        by_slot = res.emitted_by_slot()
        for j, s in enumerate(res.slots.tolist()):
            st_ = before[s]
            if not isinstance(st_, (Verify, VerifyTree)):
                continue
            dec_state = Decode(int(inputs[int(offsets[j])]), int(st_.cache))   # last: row 0's input
            kind = "tree" if isinstance(st_, VerifyTree) else "chain"
            draft = list(st_.tokens) if kind == "tree" else list(st_.draft)
            parents = list(st_.parents) if kind == "tree" else None
            emitted, row, rolled, m, k, after = reference(dec_state, kind, draft, parents, rows_of[s], bonus)
            # budgets and eos cut the emission as for any slot
            room = int(remaining[s])
            cut = emitted[:room]
            stop = len(emitted) >= room
            if eos is not None and eos in cut:
                cut = cut[: cut.index(eos) + 1]
                stop = True
            assert by_slot[s] == cut
            assert int(res.resume_rows[j]) == row
            assert bool(res.rolled_back[j]) == rolled
            assert int(res.accepted[j]) == m and int(res.drafted[j]) == k
            if stop:
                assert b.states[s] == DONE and s in res.finished.tolist()
            else:
                got = b.state_of(s)
                assert int(b.tokens[s]) == after.last
                assert isinstance(got, Decode) or (isinstance(got, Verify) and with_index)
        b.release(res.finished)
    return trace


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), capacity=st.integers(1, 5), bonus=st.booleans(),
       with_index=st.booleans())
def test_mixed_chain_and_tree_slots_match_the_state_machine_per_request(bm, impl, seed, capacity, bonus,
                                                                         with_index):
    drive(bm.BatchState, seed, capacity, bonus, with_index, impl.module("ngram_index"))


def _sides():
    if _impl.NO_EXTENSIONS:
        pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled core to compare the twin with")
    return [(over(_impl.kernels(k, "batch")), _impl.kernels(k, "ngram_index")) for k in ("compiled", "python")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), capacity=st.integers(1, 5), bonus=st.booleans(),
       with_index=st.booleans())
def test_the_compiled_batch_and_its_twin_run_tree_slots_alike(seed, capacity, bonus, with_index):
    (ca, na), (cb, nb) = _sides()
    assert drive(ca, seed, capacity, bonus, with_index, na) == drive(cb, seed, capacity, bonus, with_index, nb)


# --------------------------------------------------------------------------------------
# a chain as a tree, the layout, a tree slot's index
# --------------------------------------------------------------------------------------
def _decoding(cls, n, bonus=False, k_max=KMAX, indexes=None):
    b = cls(n, k_max, bonus=bonus)
    b.admit(list(range(n)), [1] * n, list(range(n + 1)), caches=list(range(10, 10 + n)), indexes=indexes)
    b.step(np.full(n, 3, dtype=np.int64))       # every slot decodes from last = 3
    return b


@given(seed=st.integers(0, 2**31 - 1))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_chain_as_a_tree_settles_as_a_chain_with_the_bonus_row(bm, seed):
    rng = np.random.RandomState(seed)
    k = int(rng.randint(1, KMAX + 1))
    draft = [int(x) for x in rng.randint(ALPHABET, size=k)]
    rows = chain_rows(rng, draft, k + 1)
    chain = _decoding(bm.BatchState, 1, bonus=True)
    chain.enter_verify([0], draft, [0, k])
    tree = _decoding(bm.BatchState, 1, bonus=False)       # a tree slot ignores the batch's bonus
    tree.enter_verify_tree([0], draft, chain_parents(k), [0, k])
    assert tree.pending()[1].tolist() == chain.pending()[1].tolist() == [3] + draft
    a, b = chain.step(np.array(rows)), tree.step(np.array(rows))
    for f in ("slots", "emitted", "emitted_offsets", "accepted", "drafted", "resume_rows",
              "rolled_back", "finished", "drafts", "draft_offsets"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f
    assert chain.state_of(0) == tree.state_of(0)


def test_pending_lays_out_trees_beside_chains_and_decodes(bm):
    b = _decoding(bm.BatchState, 4)
    b.enter_verify([1], [5, 6], [0, 2])
    b.enter_verify_tree([0, 3], [4, 5, 6, 7], [-1, -1, 0, -1], [0, 3, 4])
    slots, inputs, offsets = b.pending()
    assert slots.tolist() == [0, 1, 2, 3]
    assert offsets.tolist() == [0, 4, 6, 7, 9]               # tree: N + 1 rows, chain: K rows
    assert inputs.tolist() == [3, 4, 5, 6, 3, 5, 3, 3, 7]
    ts, par, toff = b.pending_trees()
    assert ts.tolist() == [0, 3] and par.tolist() == [-1, -1, 0, -1] and toff.tolist() == [0, 3, 4]
    assert b.state_of(0) == VerifyTree((4, 5, 6), (-1, -1, 0), 10, 10)
    assert b.slot_tree(3) == ([7], [-1]) and b.slot_tree(1) is None and b.slot_tree(2) is None
    assert b.draft(0) == [4, 5, 6] and b.draft_lens.tolist() == [3, 2, 0, 1]
    # slot 0 follows node 1 (a leaf): Accept; slot 3's root row picks no child: Rollback
    res = b.step(np.array([5, 9, 8, 9,   5, 6,   2,   4, 1]))
    assert res.emitted_by_slot() == {0: [5, 8], 1: [5, 6], 2: [2], 3: [4]}
    assert res.resume_rows.tolist() == [2, 1, 0, 0]
    assert res.rolled_back.tolist() == [False, False, False, True]
    assert res.accepted.tolist() == [1, 2, 0, 0] and res.drafted.tolist() == [3, 2, 0, 1]
    assert [b.state_of(s) for s in range(4)] == [Decode(8, 10), Decode(6, 11), Decode(2, 12), Decode(4, 13)]
    assert b.pending_trees()[0].tolist() == [] and b.slot_tree(0) is None
    # decodes again next step
    assert b.pending()[2].tolist() == [0, 1, 2, 3, 4]


def test_a_tree_slot_extends_its_index_and_drafts_a_chain_next(bm, impl):
    ng = impl.module("ngram_index")
    ix, ref = ng.NgramIndex(1, 3), ng.NgramIndex(1, 3)
    for x in (ix, ref):
        x.extend([1, 2, 3, 4, 1, 2])
    b = bm.BatchState(1, KMAX)
    b.admit([0], [1, 2, 3, 4, 1, 2], [0, 6], caches=[0], indexes=[ix])
    b.step(np.array([0, 0, 0, 0, 0, 9]))               # emits 9: no continuation known
    ref.extend([9])
    assert b.states.tolist() == [DECODE]
    b.enter_verify_tree([0], [1, 3, 2], [-1, -1, 0], [0, 3])
    res = b.step(np.array([1, 2, 0, 3]))               # root -> node 0 (1) -> node 2 (2) -> 3
    assert res.emitted.tolist() == [1, 2, 3] and res.resume_rows.tolist() == [3]
    ref.extend([1, 2, 3])
    want = ref.propose(KMAX)
    assert res.drafts.tolist() == list(want) and (b.states[0] == VERIFY) == bool(len(want))
    assert b.slot_tree(0) is None                       # the next draft is a chain


def test_a_tree_can_fill_k_max_and_budgets_cut_its_emission(bm):
    b = bm.BatchState(1, 4)
    b.admit([0], [1], [0, 1], caches=[0], max_tokens=3)
    b.step(np.array([2]))
    b.enter_verify_tree([0], [5, 6, 7, 8], [-1, 0, 1, 2], [0, 4])
    res = b.step(np.array([5, 6, 7, 8, 9]))
    assert res.emitted.tolist() == [5, 6] and res.finished.tolist() == [0]
    assert res.rolled_back.tolist() == [False] and res.accepted.tolist() == [4]
    assert b.states.tolist() == [DONE]


# --------------------------------------------------------------------------------------
# refusals: the batch left as it was, the same message on both implementations
# --------------------------------------------------------------------------------------
def snapshot(b):
    c = b.capacity
    return (b.states.tolist(), b.tokens.tolist(), b.caches.tolist(), b.draft_lens.tolist(),
            b.remaining.tolist(), [b.state_of(i) for i in range(c)], [b.draft(i) for i in range(c)],
            [a.tolist() for a in b.pending()], [a.tolist() for a in b.pending_trees()])


BAD_TREES = [
    # (slots, tokens, parents, offsets) -> the error and a fragment of its message
    (([0, 1], [1, 2], [-1, -1], [0, 1, 2]), IllegalTransition, "slot 1 is in verify"),
    (([0, 2], [1, 2], [-1], [0, 1, 2]), ValueError, "tokens has 2 nodes and parents 1"),
    (([0, 2], [1, 2], [-1, -1], [0, 2, 2]), ValueError, "the tree for slot 2 is empty"),
    (([0], [1] * 7, [-1, 0, 1, 2, 3, 4, 5], [0, 7]), ValueError, "holds 7 nodes, more than k_max=6"),
    (([0, 2], [1, 2, 2], [-1, -1, -1], [0, 1, 3]), ValueError,
     "slot 2: nodes 0 and 1 are siblings (parent -1) with the same token 2"),
    (([2], [1, 2], [-1, 1], [0, 2]), ValueError, "slot 2: parents[1]=1 is not before node 1"),
    (([2], [1, 2], [-1, -3], [0, 2]), ValueError, "slot 2: parents[1]=-3 is out of range"),
    (([2], [1, -2], [-1, 0], [0, 2]), ValueError, "slot 2: tokens[1]=-2 is negative"),
    (([0], [1, 2], [-1, 0], [0, 1]), ValueError, "offsets"),
    (([0], [1, 2], [-1, 0.5], [0, 2]), TypeError, "parents"),
    (([0, 0], [1, 2], [-1, -1], [0, 1, 2]), ValueError, "distinct"),
    (([9], [1], [-1], [0, 1]), IndexError, "outside"),
]


@pytest.mark.parametrize("args,err,fragment", BAD_TREES)
def test_a_refused_tree_changes_nothing(bm, args, err, fragment):
    b = _decoding(bm.BatchState, 3)
    b.enter_verify([1], [4], [0, 1])
    before = snapshot(b)
    with pytest.raises(err) as got:
        b.enter_verify_tree(*args)
    assert fragment in str(got.value)
    assert snapshot(b) == before


def test_step_refuses_a_rule_or_probabilities_while_a_tree_is_pending(bm):
    b = _decoding(bm.BatchState, 2)
    b.enter_verify_tree([1], [4, 5], [-1, -1], [0, 2])
    before = snapshot(b)
    rows = np.zeros(4, dtype=np.int64)
    for kw in ({"rule": MinRun(1)}, {"probs": np.full((4, 8), 1 / 8)}, {"draft_probs": np.zeros((2, 8))}):
        with pytest.raises(ValueError, match="slot 1 is in a tree verify, which settles greedily only"):
            b.step(rows, **kw)
        assert snapshot(b) == before
    with pytest.raises(ValueError, match="row_tokens holds 3 rows; this step evaluates 4"):
        b.step(rows[:3])
    assert snapshot(b) == before
    assert b.step(rows).emitted_by_slot() == {0: [0], 1: [0]}   # then the greedy step runs


def test_accept_and_accept_rows_refuse_a_tree_slot(bm):
    b = _decoding(bm.BatchState, 2)
    b.enter_verify_tree([0], [4], [-1], [0, 1])
    before = snapshot(b)
    with pytest.raises(IllegalTransition, match="slot 0 \\(verify\\): the slot is in a tree verify") as e:
        b.accept([0], [4], [0, 1], [7], [0, 1])
    assert e.value.slots == [0]
    with pytest.raises(IllegalTransition, match="the slot is in a tree verify"):
        b.accept_rows([0], [1], [4], [0, 1], [7], [0, 1])
    assert snapshot(b) == before
    b.finish([0])                                   # finish still leaves it
    assert b.states.tolist()[0] == DONE and b.slot_tree(0) is None


@pytest.mark.parametrize("args,err,fragment", BAD_TREES)
def test_both_implementations_refuse_a_tree_with_one_message(args, err, fragment):
    msgs = []
    for cls, _ in _sides():
        b = _decoding(cls, 3)
        b.enter_verify([1], [4], [0, 1])
        with pytest.raises(err) as got:
            b.enter_verify_tree(*args)
        msgs.append((type(got.value), str(got.value)))
    assert msgs[0] == msgs[1]


def test_the_tree_methods_take_the_guard(bm):
    b = _decoding(bm.BatchState, 2)
    b.enter_verify_tree([1], [4], [-1], [0, 1])
    before = snapshot(b)
    b._hold_guard(True)
    try:
        for call in (lambda: b.enter_verify_tree([0], [1], [-1], [0, 1]), b.pending_trees,
                     lambda: b.slot_tree(1), lambda: b.state_of(1)):
            with pytest.raises(RuntimeError, match="BatchState is being changed"):
                call()
    finally:
        b._hold_guard(False)
    assert snapshot(b) == before
    fresh = bm.BatchState.__new__(bm.BatchState)
    for call in (lambda: fresh.enter_verify_tree([0], [1], [-1], [0, 1]), fresh.pending_trees,
                 lambda: fresh.slot_tree(0)):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()


@pytest.mark.parametrize("convert", [
    lambda x: x, tuple, lambda x: np.array(x, dtype=np.int32), lambda x: np.array(x, dtype=np.int64),
    lambda x: np.array(x, dtype=np.int16), lambda x: [np.int64(v) for v in x],
], ids=["list", "tuple", "int32", "int64", "int16", "numpy-ints"])
def test_every_argument_kind_enters_the_same_tree(bm, convert):
    """The compiled batch's fast path (plain arrays and lists of ints) and its general path
    (anything else) give the same batch; so does the twin."""
    b = _decoding(bm.BatchState, 3)
    ref = _decoding(bm.BatchState, 3)
    args = ([2, 0], [4, 5, 6, 7], [-1, 0, -1, -1], [0, 3, 4])
    ref.enter_verify_tree(*args)
    b.enter_verify_tree(*[convert(a) for a in args])
    assert snapshot(b) == snapshot(ref)
    assert b.state_of(2) == VerifyTree((4, 5, 6), (-1, 0, -1), 12, 12)


@settings(max_examples=300, deadline=None)
@given(trees=st.lists(st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-1, 3), min_size=n, max_size=n),
    st.lists(st.integers(-2, 5), min_size=n, max_size=n))), min_size=1, max_size=3),
    general=st.booleans())
def test_random_trees_are_refused_or_entered_alike_on_both_implementations(trees, general):
    """Random, often malformed trees: both implementations (the compiled fast path for
    lists, its general path for int16 arrays) enter the same ones, and refuse the others
    with ``check_tree``'s message for the first bad tree, naming its slot."""
    from specfsm.tree import _tree_py

    toks = [t for tr in trees for t in tr[0]]
    pars = [q for tr in trees for q in tr[1]]
    off = list(np.cumsum([0] + [len(tr[0]) for tr in trees]))
    slots = list(range(len(trees)))
    want = None
    for s, (t, p) in enumerate(trees):
        try:
            _tree_py.check_tree(t, p)
        except ValueError as e:
            want = f"slot {s}: {e}"
            break
    conv = (lambda x: np.array(x, dtype=np.int16)) if general else (lambda x: x)
    seen = []
    for cls, _ in _sides():
        b = _decoding(cls, 3)
        try:
            b.enter_verify_tree(conv(slots), conv(toks), conv(pars), conv(off))
            seen.append(("ok", snapshot(b)))
        except ValueError as e:
            seen.append(("err", str(e)))
    assert seen[0] == seen[1]
    assert seen[0][0] == ("ok" if want is None else "err")
    if want is not None:
        assert seen[0][1] == want


def test_a_large_batch_runs_tree_slots_alike_on_both_implementations():
    """Capacity 300 (the compiled step's loops then run without the GIL), n-gram and
    suffix indexes mixed: the same run on both implementations, each checked against
    the state machine."""
    runs = []
    for k in ("compiled", "python"):
        if k == "compiled" and _impl.NO_EXTENSIONS:
            pytest.skip("SPECFSM_NO_EXTENSIONS is set: no compiled core to compare the twin with")
        runs.append(drive(over(_impl.kernels(k, "batch")), 11, 300, False, True,
                          _impl.kernels(k, "ngram_index"), _impl.kernels(k, "suffix_index")))
    assert runs[0] == runs[1]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), capacity=st.integers(1, 5), bonus=st.booleans())
def test_tree_slots_with_suffix_indexes_run_alike_on_both_implementations(seed, capacity, bonus):
    (ca, na), (cb, nb) = _sides()
    sa, sb = _impl.kernels("compiled", "suffix_index"), _impl.kernels("python", "suffix_index")
    assert drive(ca, seed, capacity, bonus, True, na, sa) == drive(cb, seed, capacity, bonus, True, nb, sb)
