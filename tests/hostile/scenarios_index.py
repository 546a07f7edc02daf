"""Hostile scenarios for the drafting indexes (``SuffixIndex``, ``NgramIndex``) and the
shared suffix cache (``specfsm.drafting.suffix_index.SharedSuffixCache``), run by ``runner.py``.

``index_reentry`` (one thread): every public method and batch function of both index
kinds (``serve``, ``serve_batch``, ``serve_batch_lists``, ``propose_tree``,
``propose_tree_batch``, ``longest_match`` and ``longest_match_batch`` included) and of
the cache, called with extreme integers (int64's and int32's edges, just past them,
huge Python ints) in every integer argument, every layout and dtype in every sequence
argument (lists, tuples, other sequences, numpy integers, bools and floats, int8 to
uint64, big-endian, float, bool and object arrays, strided, 2-D, 0-d, read-only and
subclassed arrays), statistics at int64's edge, unbound methods called with a ``self``
of another type (which must be refused with TypeError), and arguments whose conversion
(``__index__``, ``__eq__``, ``__len__``, ``__getitem__``) calls methods of the same index
back (a second ``__init__`` included), on ready instances and on ones made with
``__new__`` or whose ``__init__`` failed; the compiled run also replays random call
sequences on a compiled and a twin index built alike and requires equal results (or the
same exception type) and equal indexes. ``index_threads``: threads extending,
batch-extending, serving, proposing, recording, reading every property, pickling,
re-initialising and clearing or growing the lists being extended, all at once on a few
shared indexes and a shared cache (dropped drafter sessions included). Every call
returns or raises one of the runner's ``ALLOWED``; the indexes left at the end must
equal fresh ones built from their own tokens.
"""

from __future__ import annotations

import copy
import gc
import pickle
import random
import sys
import threading
import time

import numpy as np

BIG = [0, 1, 3, 2**31, 2**40, 2**62, 2**63 - 1, 2**63, -(2**63), -1, 10**30]
#: every integer argument gets these too
EDGE = [2**63 - 1, 2**63 - 2, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**64 - 1, 2**31 - 2,
        2**31 - 1, 2**31, 2**30 - 1, 2**30, -(2**31), 2**32, 2**62, 10**30, -(10**30), -1, 0]
#: statistics at int64's edge (steps, drafted, accepted, full accepts)
STATS = [(0, 0, 0, 0), (3, 10, 4, 1), (2**63 - 1, 5, 2, 1), (9, 2**63 - 1, 3, 2),
         (2**63 - 2, 2**63 - 3, 0, 0), (2**63 - 1, 2**63 - 1, 2**63 - 1, 2**63 - 1)]
#: ``self`` of another type for unbound calls
FOREIGN = [object(), 7, "x" * 64, [0] * 32, b"\x00" * 64]


def _r():
    """The runner's helpers (``attempt``, ``run_threads``, ``Failure``, ``ALLOWED``):
    the running script's own module when it is the runner, so that its ``Failure``
    is the one it catches."""
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "run_threads") and hasattr(main, "Failure"):
        return main
    import runner

    return runner


class Call:
    """An argument whose conversion runs ``action`` first: an int-like (``__index__``),
    a comparable entry (``__eq__``) and a sized sequence (``__len__``/``__getitem__``)."""

    def __init__(self, value, action, items=(1, 2, 3)):
        self.value = value
        self.action = action
        self.items = list(items)

    def _run(self):
        try:
            self.action()
        except _r().ALLOWED:
            pass

    def __index__(self):
        self._run()
        return int(self.value)

    def __eq__(self, other):
        self._run()
        return self.value == other

    __hash__ = None

    def __len__(self):
        self._run()
        return len(self.items)

    def __getitem__(self, i):
        self._run()
        return self.items[i]


class CallingSeq:
    """A token sequence (``collections.abc.Sequence`` by registration) whose reads run
    ``action``."""

    def __init__(self, items, action):
        self.items = list(items)
        self.action = action

    def __len__(self):
        try:
            self.action()
        except _r().ALLOWED:
            pass
        return len(self.items)

    def __getitem__(self, i):
        try:
            self.action()
        except _r().ALLOWED:
            pass
        return self.items[i]


from collections.abc import Sequence  # noqa: E402

Sequence.register(CallingSeq)


class LenList(list):
    """A list subclass whose ``__len__`` runs ``action`` (extend's slow path)."""

    action = None

    def __len__(self):
        if self.action is not None:
            try:
                self.action()
            except _r().ALLOWED:
                pass
        return list.__len__(self)


class _Sub(np.ndarray):
    """An ndarray subclass."""


def _layout(rng, vals):
    """``vals`` (Python ints) in a random layout or dtype; one that cannot hold them
    gives an object array."""
    vals = list(vals)
    how = rng.randrange(18)
    if how == 0:
        return vals
    if how == 1:
        return tuple(vals)
    if how == 2:
        return CallingSeq(vals, lambda: None)
    if how == 3:
        return [np.int64(v) if -(2**63) <= v < 2**63 else v for v in vals]
    if how == 4:
        return [bool(v % 2) for v in vals]
    if how == 5:
        return [float(v) for v in vals]
    dtype = [np.int64, np.int32, np.uint64, np.int8, np.uint16, ">i8", ">i4", np.float64,
             np.bool_, object][how - 6] if how < 16 else np.int64
    try:
        a = np.array(vals, dtype=dtype)
    except (OverflowError, ValueError):
        return np.array(vals + [None], dtype=object)[:-1]
    if how < 16 or a.dtype == object:
        return a
    kind = rng.randrange(6)
    if kind == 0:
        return np.repeat(a, 2)[::2]
    if kind == 1:
        return np.asfortranarray(np.stack([a, a]))
    if kind == 2:
        return np.array(vals[0] if vals else 0)
    if kind == 3:
        a.flags.writeable = False
        return a
    if kind == 4:
        return a.view(_Sub)
    return a.reshape(1, -1)


def _int(rng, valid):
    """An integer argument: ``valid`` mostly, else an extreme value or another scalar."""
    r = rng.random()
    if r < 0.5:
        return valid
    if r < 0.85:
        return rng.choice(EDGE)
    return rng.choice([True, 2.0, None, "3", np.int64(2), np.uint64(2**64 - 1), np.array([1]), [1]])


def _new_suffix(mod, rng):
    return mod.SuffixIndex(rng.choice([1, 2]), rng.choice([None, 4, 16]), rng.choice(["latest", "earliest"]),
                           draft_len=4, adaptive=rng.random() < 0.5, anchor_n=rng.choice([0, 3]))


def _new_ngram(mod, rng):
    return mod.NgramIndex(1, rng.choice([1, 3, 5]), rng.choice(["latest", "earliest"]), draft_len=4)


def _tokens(rng, n, vocab=5):
    kind = rng.randrange(4)
    toks = [rng.randrange(vocab) for _ in range(n)]
    if kind == 0:
        return toks
    if kind == 1:
        return np.array(toks, dtype=rng.choice([np.int32, np.int64]))
    if kind == 2 and toks:
        toks[rng.randrange(len(toks))] = rng.choice(BIG)   # may widen, or be refused
        return toks
    return tuple(toks)


def index_calls(mod, kind, ix, rng, others):
    """``(label, thunk)`` for every public method and property of an index ``ix`` of
    ``kind`` ("suffix" or "ngram"), module ``mod``, and the module's batch calls over
    ``ix`` and ``others``; arguments drawn from ``rng`` (extreme ones included)."""
    big = rng.choice(BIG)
    k = rng.choice([None, 0, 2, 8, big])
    batch = [ix] + others[: rng.randrange(len(others) + 1)]
    rng.shuffle(batch)
    calls = [
        ("extend", lambda: ix.extend(_tokens(rng, rng.choice([0, 1, 5, 70, 600])))),
        ("append", lambda: ix.append(rng.choice([1, 2, big]))),
        ("propose", lambda: ix.propose(k)),
        ("match_length", lambda: ix.match_length()),
        ("record", lambda: ix.record(rng.choice([1, 4, big]), rng.choice([0, 1]))),
        ("len", lambda: len(ix)),
        ("repr", lambda: repr(ix)),
        ("pickle", lambda: pickle.loads(pickle.dumps(ix))),
        ("copy", lambda: copy.copy(ix)),
        ("deepcopy", lambda: copy.deepcopy(ix)),
        ("init", lambda: ix.__init__(1)),
        ("propose_batch", lambda: mod.propose_batch(batch, rng.choice([None, 3, [2] * len(batch), big]))),
        ("record_batch", lambda: mod.record_batch(batch, [rng.choice([1, 2**62])] * len(batch), [0] * len(batch))),
        ("extend_batch", lambda: mod.extend_batch(batch, [1] * (2 * len(batch)),
                                                   list(range(0, 2 * len(batch) + 1, 2)))),
    ]
    props = ["min_n", "max_n", "prefer", "adaptive", "draft_len", "tokens", "nbytes", "bytes_per_token", "stats"]
    if kind == "suffix":
        props += ["n_edges", "n_states", "anchor_n", "anchor_span", "anchor_misses"]
        calls += [
            ("lookup", lambda: ix.lookup(_tokens(rng, rng.randrange(12)), k)),
            ("match_end", lambda: ix.match_end()),
            ("last_tokens", lambda: ix.last_tokens(rng.choice([0, 3, big]))),
        ]
    calls += [(p, lambda p=p: getattr(ix, p)) for p in props]
    calls += hostile_calls(mod, kind, ix, rng, batch)
    return calls


def hostile_calls(mod, kind, ix, rng, batch):
    """``(label, thunk)`` for extreme integers and every layout in each argument of each
    method and batch function (thunks draw their arguments when called)."""
    b = len(batch)

    def toks(n=None):
        return [rng.randrange(4) for _ in range(rng.randrange(8) if n is None else n)]

    def flat_off():
        sizes = [rng.randrange(4) for _ in range(b)]
        off = [0]
        for n in sizes:
            off.append(off[-1] + n)
        if rng.random() < 0.3:
            off[rng.randrange(len(off))] = rng.choice(EDGE)
        return _layout(rng, toks(off[-1] if off[-1] >= 0 and off[-1] < 64 else 3)), _layout(rng, off)

    def counts(valid):
        return rng.choice([_int(rng, valid), _layout(rng, [_int(rng, valid) for _ in range(b)])])

    def limit():
        return rng.choice([None, _int(rng, 3), _layout(rng, [_int(rng, 3) for _ in range(b)])])

    def serve_batch(fn):
        t, off = flat_off()
        return getattr(mod, fn)(batch, t, off, counts(2), counts(1), limit())

    def unbound():
        names = ["extend", "append", "propose", "serve", "record", "match_length", "_restore_stats",
                 "_hold_guard", "__reduce__"] + (["propose_tree", "lookup", "last_tokens", "match_end"]
                                                 if kind == "suffix" else [])
        name = rng.choice(names)
        cls = type(ix)
        try:
            getattr(cls, name)(rng.choice(FOREIGN), *([1] * rng.randrange(3)))
        except TypeError:
            return None
        raise _r().Failure(f"{cls.__name__}.{name} called with a self of another type did not refuse it")

    calls = [
        ("extend(layout)", lambda: ix.extend(_layout(rng, toks() + [rng.choice(EDGE)] * rng.randrange(2)))),
        ("append(edge)", lambda: ix.append(_int(rng, 1))),
        ("propose(edge)", lambda: ix.propose(_int(rng, 3))),
        ("record(edge)", lambda: ix.record(_int(rng, 3), _int(rng, 1))),
        ("serve(edge)", lambda: ix.serve(_layout(rng, toks()), _int(rng, 2), _int(rng, 1), _int(rng, 3))),
        ("restore_stats", lambda: ix._restore_stats(rng.choice(STATS))),
        ("stats+record", lambda: (ix.stats, ix.record(rng.choice([0, 1, 2**62]), 0))),
        ("serve_batch(edge)", lambda: serve_batch("serve_batch")),
        ("serve_batch_lists(edge)", lambda: serve_batch("serve_batch_lists")),
        ("extend_batch(edge)", lambda: mod.extend_batch(batch, *flat_off())),
        ("propose_batch(edge)", lambda: mod.propose_batch(batch, limit())),
        ("record_batch(edge)", lambda: mod.record_batch(batch, counts(3), counts(1))),
        ("unbound", unbound),
    ]
    if kind == "suffix":
        calls += [
            ("propose_tree(edge)", lambda: ix.propose_tree(_int(rng, 8), rng.choice([None, _int(rng, 3)]),
                                                           rng.choice([None, _int(rng, 2)]))),
            ("propose_tree_batch(edge)", lambda: mod.propose_tree_batch(batch, _int(rng, 6), rng.choice([None, _int(rng, 3)]),
                                                                        rng.choice([None, _int(rng, 2)]))),
            ("lookup(layout)", lambda: ix.lookup(_layout(rng, toks() + [rng.choice(EDGE)]), _int(rng, 3))),
            ("last_tokens(edge)", lambda: ix.last_tokens(_int(rng, 3))),
        ]
    else:
        calls += [
            ("longest_match(edge)", lambda: mod.longest_match(_layout(rng, toks(12)), _int(rng, 1), _int(rng, 3),
                                                              _int(rng, 3), rng.choice(["latest", "earliest"]))),
            ("longest_match_batch(edge)", lambda: mod.longest_match_batch(*flat_off(), _int(rng, 1), _int(rng, 2),
                                                                          counts(3))),
        ]
    return calls


# --------------------------------------------------------------------------------------
# parity: a compiled and a twin index driven alike
# --------------------------------------------------------------------------------------
def _state(ix):
    """What can be read of an index without changing it (results or exception types)."""
    R = _r()
    reads = [lambda: len(ix), lambda: ix.tokens, lambda: ix.stats, lambda: ix.propose(),
             lambda: ix.propose(5), lambda: ix.match_length()]
    if type(ix).__name__ == "SuffixIndex":
        reads += [lambda: ix.match_end(), lambda: ix.propose_tree(8, 4, 2), lambda: ix.last_tokens(3)]
    out = []
    for read in reads:
        got = R.attempt(read)
        out.append((got[0], R.canon(got[1]) if got[0] == "ok" else got[1].__name__))
    return out


def parity_round(impl, rng, kind):
    """Random hostile call sequences on compiled and twin indexes built alike (the same
    draws replayed): each call's outcome (result, or exception type) and the indexes
    after it must be equal; differences go to ``impl.mismatches``."""
    R = _r()
    name = "suffix_index" if kind == "suffix" else "ngram_index"
    make = _new_suffix if kind == "suffix" else _new_ngram
    seed = rng.randrange(2**32)
    logs = []
    for mod in (impl.mods[name], impl.twin[name]):
        r = random.Random(seed)
        ixs = [make(mod, r) for _ in range(3)]
        for ix in ixs:
            ix.extend([r.randrange(4) for _ in range(r.randrange(40))])
        log = []
        for step in range(8):
            calls = [c for c in hostile_calls(mod, kind, ixs[0], r, ixs[: 1 + r.randrange(3)])
                     if c[0] != "unbound"]
            label, thunk = r.choice(calls)
            got = R.attempt(thunk)
            log.append((label, got[0], R.canon(got[1]) if got[0] == "ok" else got[1].__name__,
                        [_state(ix) for ix in ixs]))
        logs.append(log)
    for a, b in zip(*logs):
        if repr(a) != repr(b):
            impl.mismatches.append(f"{kind} parity (seed {seed}) at {a[0]}: compiled {R.short(a)}, twin {R.short(b)}")
            break


def cache_calls(cache, sfx, rng):
    """``(label, thunk)`` for every public method of a SharedSuffixCache, and the
    drafter sessions that hand outputs to it (some dropped without ``close``)."""
    from specfsm.drafting.suffix_index import SuffixDrafter

    def session():
        d = SuffixDrafter(shared=cache, shared_below=rng.choice([0, 8]))
        s = d.session([rng.randrange(5) for _ in range(rng.randrange(20))])
        s.extend([rng.randrange(5) for _ in range(rng.randrange(10))])
        s.propose(rng.choice([0, 4]))
        if rng.random() < 0.5:
            s.close()
        elif rng.random() < 0.5:
            cycle = [s]
            cycle.append(cycle)          # left to the garbage collector

    return [
        ("cache.add", lambda: cache.add(_tokens(rng, rng.randrange(40)))),
        ("cache.lookup", lambda: cache.lookup(_tokens(rng, rng.randrange(10)), rng.choice([0, 4, 2**40]))),
        ("cache.len", lambda: len(cache)),
        ("cache.nbytes", lambda: cache.nbytes),
        ("cache.repr", lambda: repr(cache)),
        ("cache.session", session),
    ]


# --------------------------------------------------------------------------------------
# scenario: re-entrant calls from argument conversions (one thread)
# --------------------------------------------------------------------------------------
def scenario_index_reentry(impl, rng, seconds):
    R = _r()
    from specfsm.drafting.suffix_index import SharedSuffixCache

    sfx, ngi = impl["suffix_index"], impl["ngram_index"]
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        kind = rng.choice(["suffix", "ngram"])
        mod = sfx if kind == "suffix" else ngi
        make = _new_suffix if kind == "suffix" else _new_ngram
        cls = mod.SuffixIndex if kind == "suffix" else mod.NgramIndex
        ix = make(mod, rng)
        R.attempt(ix.extend, [rng.randrange(4) for _ in range(rng.randrange(30))])
        # uninitialised, and failed-__init__ instances among the others
        raw = cls.__new__(cls)
        failed = cls.__new__(cls)
        R.attempt(failed.__init__, 0)
        others = [make(mod, rng), raw, failed][: rng.randrange(4)]
        calls = index_calls(mod, kind, ix, rng, others)
        # a callback calls a random method of the same index (or a second __init__)
        def action(calls=calls):
            label, thunk = rng.choice(calls)
            thunk()

        t = [rng.randrange(4) for _ in range(rng.randrange(1, 70))]
        arg = rng.randrange(6)
        if arg == 0:
            R.attempt(ix.extend, CallingSeq(t, action))
        elif arg == 1:
            lst = LenList(t)
            lst.action = action
            R.attempt(ix.extend, lst)
        elif arg == 2:
            R.attempt(ix.propose, Call(rng.choice([0, 3, 2**40]), action))
        elif arg == 3:
            R.attempt(ix.record, Call(3, action), Call(1, action))
        elif arg == 4:
            R.attempt(mod.extend_batch, [ix], CallingSeq(t, action), [0, len(t)])
        else:
            R.attempt(mod.propose_batch, [ix], Call(2, action))
        if kind == "suffix":
            R.attempt(ix.lookup, CallingSeq(t, action), Call(2, action))
            R.attempt(ix.last_tokens, Call(3, action))
        R.attempt(ix.__init__, Call(1, action))                 # refused: second __init__
        for label, thunk in calls:                             # every method, plain
            R.attempt(thunk)
        for label, thunk in index_calls(mod, kind, raw, rng, []):   # refused: uninitialised
            if label == "init":
                continue  # initialising it is what __init__ is for
            got = R.attempt(thunk)
            # (calls that do not touch the index: its repr, unbound calls, the stateless
            # module functions)
            if got[0] == "ok" and label not in ("repr", "unbound", "longest_match(edge)",
                                                "longest_match_batch(edge)"):
                raise R.Failure(f"{kind} index made with __new__ allowed {label}: {got[1]!r}")
        # the shared cache, its arguments calling it back
        cache = SharedSuffixCache(max_tokens=200, generations=2)
        ccalls = cache_calls(cache, sfx, rng)

        def caction(ccalls=ccalls):
            label, thunk = rng.choice(ccalls)
            thunk()

        R.attempt(cache.add, CallingSeq(t, caction))
        R.attempt(cache.lookup, CallingSeq(t[:5], caction), Call(3, caction))
        for label, thunk in ccalls:
            R.attempt(thunk)
        if n % 50 == 0:
            gc.collect()
        # integrity: the index equals a fresh one over its own tokens
        _check_whole(R, kind, ix, mod)
        if impl.kind == "compiled":
            parity_round(impl, rng, kind)
    return n


def _check_whole(R, kind, ix, mod):
    try:
        toks = ix.tokens.copy()
    except RuntimeError:
        return  # broken (out of memory) or refused: nothing to compare
    fresh = (mod.SuffixIndex(ix.min_n, ix.max_n, ix.prefer, anchor_n=ix.anchor_n) if kind == "suffix"
             else mod.NgramIndex(ix.min_n, ix.max_n, ix.prefer))
    fresh.extend(toks)
    for k in (1, 4, 16):
        if ix.propose(k) != fresh.propose(k):
            raise R.Failure(
                f"{kind} index torn: propose({k}) gives {ix.propose(k)}, a fresh index over "
                f"the same {toks.size} tokens {fresh.propose(k)}"
            )
    if ix.match_length() != fresh.match_length():
        raise R.Failure(f"{kind} index torn: match_length {ix.match_length()} != {fresh.match_length()}")


# --------------------------------------------------------------------------------------
# scenario: every method from other threads while extends and batch calls run
# --------------------------------------------------------------------------------------
def scenario_index_threads(impl, rng, seconds):
    R = _r()
    from specfsm.drafting.suffix_index import SharedSuffixCache

    sfx, ngi = impl["suffix_index"], impl["ngram_index"]
    pools = {
        "suffix": (sfx, [_new_suffix(sfx, rng) for _ in range(3)]),
        "ngram": (ngi, [_new_ngram(ngi, rng) for _ in range(3)]),
    }
    cache = SharedSuffixCache(max_tokens=5000, generations=3)
    shared_lists = [[rng.randrange(5) for _ in range(60)] for _ in range(3)]
    lock = threading.Lock()

    def pick(r, kind=None):
        kind = kind or r.choice(["suffix", "ngram"])
        mod, pool = pools[kind]
        with lock:
            i = r.randrange(len(pool))
            ix = pool[i]
            try:
                big = len(ix) > 300_000
            except RuntimeError:
                big = False
            if big:  # start over, to bound memory
                pool[i] = ix = (_new_suffix if kind == "suffix" else _new_ngram)(mod, r)
        return kind, mod, ix, pool

    def extender(seed):
        r = random.Random(seed)

        def body():
            kind, mod, ix, pool = pick(r)
            m = r.choice([1, 5, 60, 3000, 40_000])
            t = np.array([r.randrange(5) for _ in range(m)], dtype=r.choice([np.int32, np.int64]))
            if r.random() < 0.3:
                t[r.randrange(m)] = 2**40 if kind == "suffix" else 7  # the int64 widening
            how = r.randrange(3)
            if how == 0:
                ix.extend(t)
            elif how == 1:
                ix.extend(r.choice(shared_lists))    # a list other threads clear and grow
            else:
                ix.extend(t.tolist()[:64])
            ix.append(r.randrange(5))

        return body

    def batcher(seed):
        r = random.Random(seed)

        def body():
            kind = r.choice(["suffix", "ngram"])
            mod, pool = pools[kind]
            ixs = r.sample(pool, r.randrange(1, len(pool) + 1))
            sizes = [r.choice([0, 3, 500]) for _ in ixs]
            off = np.zeros(len(ixs) + 1, dtype=np.int64)
            np.cumsum(sizes, out=off[1:])
            mod.extend_batch(ixs, np.array([r.randrange(5) for _ in range(int(off[-1]))]), off)
            d, o, ln = mod.propose_batch(ixs, r.choice([None, 4, [3] * len(ixs)]))
            if o.shape[0] != len(ixs) + 1 or d.shape[0] != o[-1]:
                raise R.Failure(f"propose_batch returned inconsistent shapes {d.shape} {o.shape}")
            mod.record_batch(ixs, [2] * len(ixs), [1] * len(ixs))

        return body

    def reader(seed):
        r = random.Random(seed)

        def body():
            kind, mod, ix, pool = pick(r)
            for label, thunk in index_calls(mod, kind, ix, r, [p for p in pool if p is not ix]):
                if label in ("extend", "extend_batch") and r.random() < 0.7:
                    continue  # the readers mostly read
                try:
                    thunk()
                except R.ALLOWED:
                    pass

        return body

    def mutator(seed):
        r = random.Random(seed)

        def body():
            lst = r.choice(shared_lists)
            what = r.randrange(4)
            if what == 0:
                lst.clear()
            elif what == 1:
                lst.extend([r.randrange(5) for _ in range(r.randrange(1, 40))])
            elif what == 2:
                del lst[: r.randrange(len(lst) + 1)]
            else:
                lst[:] = [r.randrange(5) for _ in range(r.randrange(70))]
            if len(lst) > 200:
                del lst[100:]

        return body

    def reiniter(seed):
        r = random.Random(seed)

        def body():
            kind, mod, ix, pool = pick(r)
            try:
                ix.__init__(1)
            except RuntimeError:
                pass
            else:
                raise R.Failure(f"a second __init__ of a {kind} index was allowed")

        return body

    def cacher(seed):
        r = random.Random(seed)
        calls = cache_calls(cache, sfx, r)

        def body():
            label, thunk = r.choice(calls)
            thunk()
            if r.random() < 0.01:
                gc.collect()

        return body

    bodies = [extender(1), extender(2), batcher(3), batcher(4), reader(5), reader(6),
              mutator(7), reiniter(8), cacher(9), cacher(10)]
    returned = R.run_threads(bodies, seconds)
    if not any(returned):  # busy refusals are allowed; refusing every call is not
        raise R.Failure(f"every call on the shared indexes was refused ({len(bodies)} threads)")
    for kind, (mod, pool) in pools.items():
        for ix in pool:
            _check_whole(R, kind, ix, mod)
    gc.collect()
    len(cache)
    return 1


SCENARIOS = {
    "index_reentry": scenario_index_reentry,
    "index_threads": scenario_index_threads,
}
