"""The hostile harness: one scenario against one implementation, for a bounded time.

    python tests/hostile/runner.py IMPL SCENARIO SECONDS [SEED]

IMPL is ``compiled`` or ``python``; the public wrappers (``specfsm.*``) use whatever
implementation the package picked, so run the ``python`` case with
``SPECFSM_NO_EXTENSIONS=1``. Every call must return, or raise one of ``ALLOWED``; any
other exception exits 3 with a traceback and the seed, a compiled result that the twin
refuses or computes differently (single-threaded scenarios only) exits 4, a crash kills
the process (a negative exit status, or an AddressSanitizer report under ``.ci/asan``).
Scenarios run in a subprocess of their own (``tests/test_hostile.py``) so that a crash is
a reported failure, not a dead test run.

The scenarios attack every compiled entry point with: threads that rewrite caller-owned
arrays while calls run, conversion callbacks (``__index__``, ``__float__``, ``__bool__``,
``__eq__``) that rewrite arguments already passed, extreme integers, hostile list
subclasses and mixed types, and concurrent use of ``NgramIndex`` objects.
"""

from __future__ import annotations

import copy
import faulthandler
import os
import pickle
import random
import sys
import threading
import time
import traceback

import numpy as np

import specfsm
from specfsm import _impl
from specfsm.errors import IllegalTransition

ALLOWED = (TypeError, ValueError, IndexError, OverflowError, RuntimeError, IllegalTransition)

I64 = 2**63 - 1
I64MIN = -(2**63)
EXTREME = [
    0, 1, 2, 3, -1, -2, 7, 2**31 - 2, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**62,
    I64 - 1, I64, I64 + 1, 2**64, 2**64 + 5, I64MIN, I64MIN + 1, I64MIN + 2, -(2**31), 10**30,
]
HUGE_COUNTS = [2**31 - 1, 2**31, 2**32, 2**62, I64, I64 + 1, 2**64, 10**30]


class Failure(Exception):
    """A call broke the rule (an exception outside ALLOWED is reported as itself)."""


class LyingArray(np.ndarray):
    """An ndarray subclass whose item access answers otherwise than its memory: a kernel
    that reads it a second time (instead of its converted copy) returns other values."""

    def __getitem__(self, key):
        return np.full(3, 2**31 - 7, dtype=np.int64)


class RewritingGenerator(np.random.Generator):
    """A Generator subclass whose ``random`` (Python code the kernel runs after its
    checks) reshapes, retypes or rewrites the probability rows it was given."""

    victim = None
    how = "reshape"

    def random(self, size=None, dtype=np.float64, out=None):
        a = self.victim
        if a is not None and a.size:
            if self.how == "reshape" and a.shape[1] % 2 == 0:
                a.shape = (a.shape[0] * 2, a.shape[1] // 2)
            elif self.how == "retype":
                a.dtype = np.float32
            else:
                a[:] = np.nan if self.how == "nan" else 0.0
        return np.full(size, 0.25)


# --------------------------------------------------------------------------------------
# calling and comparing
# --------------------------------------------------------------------------------------
def attempt(fn, *args, **kwargs):
    """``("ok", result)`` or ``("err", exception class)``; other exceptions propagate."""
    try:
        return "ok", fn(*args, **kwargs)
    except ALLOWED as exc:
        return "err", type(exc)


def canon(x, depth=0):
    """A comparable rendering of a kernel result (values and shapes, not dtypes)."""
    if depth > 6:
        return "..."
    if isinstance(x, np.ndarray):
        return ("array", x.shape, x.tolist())
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [canon(v, depth + 1) for v in x])
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    if type(x).__name__ == "NgramIndex":
        st = dict(x.stats() if callable(x.stats) else x.stats)
        # the compiled index caps draft_len at MAX_INDEX_TOKENS, a draft's longest
        # possible length, so both propose the same drafts; only the number reported differs
        cap = 2**31 - 2
        st["draft_len"] = min(st.get("draft_len", 0), cap)
        return ("index", len(x), x.tokens.tolist(), sorted(st.items()), x.propose(None), x.propose(3))
    return x


def short(x, limit=300):
    try:
        text = repr(x)
    except Exception as exc:  # a hostile object's repr
        text = f"<unrepresentable {type(x).__name__}: {exc!r}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Impl:
    """The modules of one implementation, and of the twin to compare with."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.mods = {n: _impl.kernels(kind, n) for n in _impl.KERNEL_MODULES}
        self.twin = {n: _impl.kernels("python", n) for n in _impl.KERNEL_MODULES}
        self.mismatches: list[str] = []

    def __getitem__(self, name):
        return self.mods[name]

    def same(self, label, mod, fn, make_args, rng, strict=False):
        """Call ``mod.fn`` on fresh arguments from ``make_args()`` here and in the twin;
        a compiled result the twin refuses or computes differently is recorded in
        ``self.mismatches`` (the run goes on, so that a later crash still shows);
        ``strict`` records a refusal the twin does not make, or makes with another
        exception type, too. ``make_args`` may draw from ``rng``: each call replays the
        same draws."""
        state = rng.getstate()
        args, kwargs = make_args()
        got = attempt(getattr(self.mods[mod], fn), *args, **kwargs)
        if self.kind == "python":
            return got
        after = rng.getstate()
        rng.setstate(state)
        args, kwargs = make_args()
        want = attempt(getattr(self.twin[mod], fn), *args, **kwargs)
        problem = None
        if got[0] == "ok":
            if want[0] == "err":
                problem = f"returned {short(got[1])} where the twin raises {want[1].__name__}"
            elif canon(got[1]) != canon(want[1]):
                problem = f"returned {short(got[1])}, the twin {short(want[1])}"
        elif strict and want[0] == "ok":
            problem = f"raised {got[1].__name__} where the twin returns {short(want[1])}"
        elif strict and got[1] is not want[1]:
            problem = f"raised {got[1].__name__} where the twin raises {want[1].__name__}"
        if problem:
            rng.setstate(state)
            self.mismatches.append(f"{label}: {mod}.{fn} {problem}; arguments {short(make_args())}")
        rng.setstate(after)
        return got


def run_threads(targets, seconds, stop=None):
    """Run the callables in ``targets`` in threads, each looped until ``seconds`` pass;
    re-raise the first exception outside ALLOWED that any of them raised. Returns, per
    target, how many of its calls returned (the others raised one of ALLOWED)."""
    stop = stop or threading.Event()
    errors = []
    returned = [0] * len(targets)

    def loop(i, fn):
        try:
            while not stop.is_set():
                try:
                    fn()
                except ALLOWED:
                    continue
                returned[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((exc, traceback.format_exc()))
            stop.set()

    threads = [threading.Thread(target=loop, args=(i, fn), daemon=True) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(60)
        if t.is_alive():
            raise Failure("a thread did not finish within 60 s of being stopped (a deadlock?)")
    if errors:
        exc, tb = errors[0]
        sys.stderr.write(tb)
        raise exc
    return returned


# --------------------------------------------------------------------------------------
# well-formed inputs
# --------------------------------------------------------------------------------------
def ragged(rng, b, kmax, vocab, dtype=np.int64):
    lens = [rng.randrange(kmax + 1) for _ in range(b)]
    off = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    n = int(off[-1])
    draft = np.array([rng.randrange(vocab) for _ in range(n)], dtype=dtype)
    choices = draft.copy()
    for i in range(n):
        if rng.random() < 0.3:
            choices[i] = rng.randrange(vocab)
    return draft, choices, off


def probs(rng, n, v, dtype=np.float64):
    p = np.random.default_rng(rng.randrange(2**32)).random((n, v)) + 1e-3
    p /= p.sum(axis=1, keepdims=True)
    return p.astype(dtype)


def history(rng, n, vocab=4):
    return [rng.randrange(vocab) for _ in range(n)]


def new_index(mods, rng, lo=1, hi=4):
    return mods["ngram_index"].NgramIndex(lo, hi, rng.choice(["latest", "earliest"]), draft_len=4)


# --------------------------------------------------------------------------------------
# scenario: extreme integers (single thread, compiled compared with the twin)
# --------------------------------------------------------------------------------------
def wrapping_offsets(rng, total):
    """Offsets that decrease but whose int64 differences wrap around to look
    nondecreasing, and other offsets built from extreme values."""
    pool = [0, total, total // 2, 1, -1, I64, I64 - 1, I64MIN, I64MIN + 1, I64MIN + total, 2**62, -(2**62), 2**31]
    kind = rng.randrange(4)
    if kind == 0:  # 0 -> near +2**63 -> near -2**63 (difference wraps positive) -> total
        return [0, I64 - rng.randrange(3), I64MIN + rng.randrange(total + 1), total]
    if kind == 1:
        return [0, 2**62, I64MIN + 2**62 - 1 + rng.randrange(2), total]
    if kind == 2:
        return [0] + [rng.choice(pool) for _ in range(rng.randrange(1, 5))] + [total]
    return [rng.choice(pool) for _ in range(rng.randrange(1, 6))]


def scenario_extreme_ints(impl, rng, seconds):
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        total = rng.randrange(0, 12)
        vocab = rng.randrange(1, 9)
        draft = [rng.randrange(vocab) for _ in range(total)]
        choices = [rng.randrange(vocab) for _ in range(total)]
        offs = wrapping_offsets(rng, total)
        odt = rng.choice([None, np.int64, np.uint64, np.int32])
        big = rng.choice(EXTREME)

        def O():
            if odt is None:
                return list(offs)
            try:
                return np.array(offs, dtype=odt)
            except OverflowError:
                return np.array(offs, dtype=object)

        def D(x=draft):
            return np.array(x, dtype=np.int64)

        b = max(len(offs) - 1, 0)
        p = probs(rng, total, vocab) if total else np.zeros((0, max(vocab, 1)))
        q = probs(rng, total, vocab) if total else None
        u = np.array([rng.random() for _ in range(total + b)], dtype=np.float64)
        impl.same("offsets", "accept", "exact_batch", lambda: ((D(), D(choices), O()), {}), rng)
        impl.same("offsets", "accept", "min_run_batch", lambda: ((D(), D(choices), O(), rng.choice([0, 1, 2, big]) if big >= 0 else 1), {}), rng)
        impl.same("offsets", "accept", "speculative_batch", lambda: ((D(), O(), p.copy(), None if q is None else q.copy(), u.copy()), {}), rng)
        impl.same("offsets", "accept", "typical_batch", lambda: ((D(), O(), p.copy()), {}), rng)
        impl.same("offsets", "ngram_index", "longest_match_batch", lambda: ((D(), O(), 1, 3, rng.choice([0, 1, 3])), {}), rng)
        # extreme ids, counts and lengths everywhere
        bad_draft = list(draft) + [big]
        impl.same("ids", "accept", "exact_batch", lambda: ((bad_draft, bad_draft, [0, len(bad_draft)]), {}), rng)
        uu = np.array([0.5] * (len(bad_draft) + 1))
        pp = probs(rng, len(bad_draft), vocab)
        impl.same("ids", "accept", "speculative_batch", lambda: ((np.array(bad_draft, dtype=object) if abs(big) > I64 else np.array(bad_draft), [0, len(bad_draft)], pp.copy(), None, uu.copy()), {}), rng)
        impl.same("ids", "accept", "typical_batch", lambda: ((bad_draft, [0, len(bad_draft)], pp.copy(), rng.choice([0.0, 0.5, 1e308]), 0.3), {}), rng)
        impl.same("ids", "accept", "check_probs", lambda: ((pp.copy(),), {}), rng)
        impl.same("counts", "ngram", "prompt_lookup", lambda: ((draft + [big], rng.choice([1, 2, big]), rng.choice(HUGE_COUNTS + [big])), {}), rng)
        impl.same("counts", "ngram_index", "longest_match", lambda: ((D(draft), rng.choice([1, big]), rng.choice([3, big]), rng.choice(HUGE_COUNTS + [big])), {}), rng)
        impl.same("counts", "ngram_index", "longest_match", lambda: ((draft + [big], 1, 2, big), {}), rng)
        impl.same("counts", "ngram_index", "longest_match_batch", lambda: ((draft, [0, total], 1, 2, [big]), {}), rng)
        impl.same("counts", "prefix", "common_prefix", lambda: ((draft + [big], draft + [big]), {}), rng)
        impl.same("counts", "prefix", "common_prefix", lambda: ((D(draft), np.array(choices, dtype=np.int32)), {}), rng)
        impl.same("counts", "settle", "settle", lambda: ((rng.choice([0, 1, 5, I64]), big, rng.choice([0, 5, I64]), rng.choice([1, 5, I64]), "accept"), {}), rng)
        impl.same("counts", "place", "settle_index", lambda: (([big, 0, 1], [big, rng.choice([0, 1, big]), 1]), {}), rng)
        # one rule per argument: compared strictly (the same result, or the same refusal)
        odd = [big, True, 2.5, None, np.uint64(2**64 - 1), np.int64(3), "3"]
        impl.same("counts", "accept", "min_run_batch", lambda: ((D(), D(choices), [0, total], rng.choice(HUGE_COUNTS + [big, 0, 2])), {}), rng, strict=True)
        impl.same("counts", "settle", "settle", lambda: ((rng.choice([3, big] + odd), rng.choice([0, 3, big]), rng.choice([3, big] + odd), rng.choice([3, big] + odd), rng.choice(["accept", "accept", None, 5])), {}), rng, strict=True)
        impl.same("names", "accept", "check_probs", lambda: ((pp.copy(), rng.choice(["probs", None, big, b"p"])), {}), rng, strict=True)
        hist = np.array(draft + draft[:2], dtype=rng.choice([np.int64, np.int32, np.uint8, np.uint64]))
        impl.same("history", "ngram", "prompt_lookup", lambda: ((rng.choice([hist.copy(), np.repeat(hist, 2)[::2], hist.view(LyingArray)]), rng.choice([1, 2]), rng.choice([3, big if big >= 0 else 3])), {}), rng, strict=True)
        src = np.arange(2 * 3 * 4, dtype=np.int64).reshape(2, 3, 4)
        impl.same("index", "place", "place_rows", lambda: ((src.copy(), [big, rng.choice([-1, 0, 2, big])], np.zeros((2, 4), dtype=np.int64)), {}), rng)
        impl.same("index", "place", "place_rows", lambda: ((src.copy(), np.array([I64MIN, I64MIN + 1]), np.zeros((2, 4), dtype=np.int64)), {}), rng)
        # the index: construction, counts, batches, pickling with made-up state
        kw = dict(draft_len=rng.choice([0, 1, 4, big]), min_draft=rng.choice([0, 1, big]), max_draft=rng.choice([16, big]))
        impl.same("index", "ngram_index", "NgramIndex", lambda: ((rng.choice([1, 2, big]), rng.choice([None, 3, big])), dict(kw)), rng)

        def index_ops():
            ix = new_index(impl.mods, random.Random(n))
            ix.extend(draft)
            out = [attempt(ix.extend, [big]), attempt(ix.append, big), attempt(ix.propose, big)]
            out.append(attempt(ix.record, big, rng.choice([0, 1, big])))
            out.append(attempt(impl.mods["ngram_index"].propose_batch, [ix, ix], [big, 1]))
            out.append(attempt(impl.mods["ngram_index"].record_batch, [ix], [big], [big]))
            return out

        attempt(index_ops)
        stats = {
            "steps": big, "drafted": rng.choice([big, 3]), "accepted": rng.choice([big, 2, -1]),
            "full": rng.choice([big, 0]), "draft_len": rng.choice([big, 4]),
        }
        for kind in ("compiled", "python") if impl.kind == "compiled" else ("python",):
            mod = _impl.kernels(kind, "ngram_index")
            if hasattr(mod, "_rebuild"):
                attempt(
                    mod._rebuild, mod.NgramIndex, rng.choice([1, big]), rng.choice([3, big]),
                    rng.choice(["latest", "earliest", big]), rng.choice([4, big]), False,
                    rng.choice([1, big]), rng.choice([16, big]), np.array(draft, dtype=np.int64), dict(stats),
                )
    return n


# --------------------------------------------------------------------------------------
# scenario: callbacks that rewrite what was already passed
# --------------------------------------------------------------------------------------
class Rewriter:
    """An integer-like / float-like / bool-like value whose conversion runs ``action``
    (rewriting another argument) before answering ``value``."""

    def __init__(self, value, action):
        self.value = value
        self.action = action

    def _run(self):
        try:
            self.action()
        except ALLOWED:
            pass

    def __index__(self):
        self._run()
        return int(self.value)

    def __int__(self):
        self._run()
        return int(self.value)

    def __float__(self):
        self._run()
        return float(self.value)

    def __bool__(self):
        self._run()
        return bool(self.value)

    def __len__(self):
        self._run()
        return 0

    def __eq__(self, other):
        self._run()
        return self.value == other

    __hash__ = None


def poison(arr, rng):
    """Rewrite a numpy array in place with values that break every bound checked before."""
    info = np.iinfo(arr.dtype) if arr.dtype.kind in "iu" else None

    def act():
        if arr.size == 0:
            return
        if info is None:
            arr.reshape(-1)[:] = rng.choice([np.nan, -1.0, 1e300, 0.0])
            return
        flat = arr.reshape(-1)
        choice = rng.randrange(4)
        if choice == 0:
            flat[:] = info.max
        elif choice == 1:
            flat[:] = info.min
        elif choice == 2:
            flat[::-1] = np.arange(flat.size, dtype=arr.dtype) * (info.max // max(flat.size, 1))
        else:
            flat[rng.randrange(flat.size)] = rng.choice([info.min, info.max, -1])

    return act


def scenario_callbacks(impl, rng, seconds):
    deadline = time.monotonic() + seconds
    acc, ngi, pl = impl["accept"], impl["ngram_index"], impl["place"]
    n = 0
    while time.monotonic() < deadline:
        n += 1
        B = rng.randrange(1, 40)
        vocab = rng.randrange(2, 50)
        draft, choices, off = ragged(rng, B, 6, vocab)
        N = draft.shape[0]
        p = probs(rng, N, vocab)
        u = np.array([rng.random() * 0.999 for _ in range(N + B)])
        target = rng.choice(["offsets", "draft", "choices", "probs"])
        victim = {"offsets": off, "draft": draft, "choices": choices, "probs": p}[target]
        act = poison(victim, rng)
        attempt(acc.min_run_batch, draft, choices, off, Rewriter(2, act))
        act = poison(rng.choice([off, draft, p]), rng)
        attempt(acc.typical_batch, draft, off, p, Rewriter(0.09, act), Rewriter(0.3, act))
        draft, choices, off = ragged(rng, B, 6, vocab)
        p = probs(rng, draft.shape[0], vocab)
        u = np.array([rng.random() * 0.999 for _ in range(draft.shape[0] + B)])
        attempt(acc.speculative_batch, draft, off, p, None, u, Rewriter(True, poison(rng.choice([off, draft, p, u]), rng)))
        # lists whose entries rewrite the other lists / arrays during conversion
        draft, choices, off = ragged(rng, B, 6, vocab)
        lst_off = off.tolist()
        lst_off[rng.randrange(len(lst_off))] = Rewriter(int(off[-1]), poison(draft, rng))
        attempt(acc.exact_batch, draft, choices, lst_off)
        # the index: counts that extend the index while it is being read or written
        ix = new_index(impl.mods, rng)
        ix.extend(history(rng, rng.randrange(0, 200)))
        grow = lambda: ix.extend(history(rng, rng.randrange(1, 5000)))  # noqa: E731
        attempt(ix.propose, Rewriter(rng.choice([3, 10**6]), grow))
        attempt(ix.record, Rewriter(3, grow), Rewriter(1, grow))
        attempt(ix.extend, [1, 2, Rewriter(3, grow), 4] * rng.randrange(1, 300))
        attempt(ix.extend, np.array([1, 2, 3]) if rng.random() < 0.5 else [Rewriter(1, grow)])
        attempt(ix.append, Rewriter(5, grow))
        ix2 = new_index(impl.mods, rng)
        attempt(ngi.propose_batch, [ix, ix2, ix], [Rewriter(5, grow), 3, Rewriter(7, grow)])
        attempt(ngi.record_batch, [ix, ix2], [Rewriter(5, grow), 5], [Rewriter(2, grow), 1])
        # stateless longest match / prompt lookup: counts that rewrite the history
        h = np.array(history(rng, rng.randrange(0, 400)), dtype=rng.choice([np.int32, np.int64]))
        act = poison(h, rng)
        attempt(ngi.longest_match, h, Rewriter(1, act), Rewriter(4, act), Rewriter(8, act))
        toks = np.array(history(rng, 300), dtype=np.int64)
        bo = np.array(sorted(rng.randrange(301) for _ in range(rng.randrange(1, 20))) + [300], dtype=np.int64)
        bo[0] = 0
        act = poison(rng.choice([toks, bo]), rng)
        attempt(ngi.longest_match_batch, toks, bo, Rewriter(1, act), Rewriter(3, act), Rewriter(8, act))
        attempt(ngi.longest_match_batch, toks, bo, 1, 3, [Rewriter(8, act)] * (bo.shape[0] - 1))
        hl = history(rng, rng.randrange(0, 300))
        attempt(impl["ngram"].prompt_lookup, hl, Rewriter(2, lambda: hl.clear()), Rewriter(5, lambda: hl.clear()))
        ha = np.array(hl or [1], dtype=np.int64)
        attempt(impl["ngram"].prompt_lookup, ha, Rewriter(2, poison(ha, rng)), 8)
        # placement: index entries that rewrite the index array / the source
        src = np.zeros((B, 4, 3), dtype=np.float32)
        dst = np.zeros((B, 3), dtype=np.float32)
        idx = np.array([rng.randrange(-1, 4) for _ in range(B)], dtype=np.int64)
        idx_list = idx.tolist()
        idx_list[rng.randrange(B)] = Rewriter(1, poison(idx, rng))
        attempt(pl.place_rows, src, idx_list, dst)
        a = [rng.randrange(3) for _ in range(B)]
        d = [x + rng.randrange(3) for x in a]
        d_arr = np.array(d, dtype=np.int64)
        a[0] = Rewriter(0, poison(d_arr, rng))
        attempt(pl.settle_index, a, d_arr)
        attempt(impl["settle"].settle, 5, Rewriter(2, lambda: None), 5, 5, "accept")
        impl.same("callbacks", "settle", "settle", lambda: ((Rewriter(rng.choice([3, -1, 2**63]), lambda: None), Rewriter(rng.choice([1, 3, 2.5]), lambda: None), 3, Rewriter(3, lambda: None), "accept"), {}), rng, strict=True)

        # a Generator subclass whose draw rewrites the probability rows already checked:
        # the kernels read their own copies, so both answer as for the rows passed
        def rewriting_draw():
            r = random.Random(rng.randrange(2**32))
            d2, _, o2 = ragged(r, r.randrange(1, 5), 4, 6)
            p2 = probs(r, d2.shape[0], 6)
            q2 = probs(r, d2.shape[0], 6) if r.random() < 0.5 else None
            gen = RewritingGenerator(np.random.PCG64(r.randrange(2**32)))
            gen.victim = p2 if q2 is None or r.random() < 0.5 else q2
            gen.how = r.choice(["reshape", "retype", "nan", "zero"])
            return (d2, o2, p2, q2, gen, r.random() < 0.5), {}

        got = impl.same("generator", "accept", "speculative_batch", rewriting_draw, rng, strict=True)
        if got[0] == "ok" and (got[1][0] >= 6).any():
            raise Failure(f"speculative_batch emitted a token beyond the checked vocabulary: {got[1][0]}")
        # counts whose conversion rewrites the numpy history already passed
        def hooked_lookup():
            h2 = np.array(history(rng, rng.randrange(0, 60)) or [1], dtype=rng.choice([np.int64, np.uint16]))
            h2 = h2[:: rng.choice([1, 2])]
            return (h2, Rewriter(2, poison(h2, rng)), Rewriter(5, poison(h2, rng))), {}

        impl.same("callbacks", "ngram", "prompt_lookup", hooked_lookup, rng, strict=True)
    return n


# --------------------------------------------------------------------------------------
# scenario: lists whose __eq__ shrinks or grows them, list subclasses, mixed types
# --------------------------------------------------------------------------------------
class Shrinker:
    """A list entry whose comparison empties (or regrows) the lists it belongs to."""

    def __init__(self, value, lists, rng):
        self.value = value
        self.lists = lists
        self.rng = rng

    def __eq__(self, other):
        for lst in self.lists:
            r = self.rng.randrange(3)
            if r == 0:
                del lst[: max(len(lst) - 1, 0)]
            elif r == 1:
                lst.clear()
            else:
                lst.extend([0] * self.rng.randrange(1, 50))
        return self.value == getattr(other, "value", other)

    def __hash__(self):
        return hash(self.value)

    def __index__(self):
        for lst in self.lists:
            lst.clear()
        return self.value


class LyingList(list):
    """A list subclass whose length, iteration and indexing disagree."""

    def __len__(self):
        return super().__len__() + 1000

    def __iter__(self):
        return iter(list(list.__iter__(self))[:1])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list.__getitem__(self, i)
        return list.__getitem__(self, i % max(list.__len__(self), 1)) if list.__len__(self) else 0


class GrowingList(list):
    """A list subclass that grows every time it is iterated or measured."""

    def __len__(self):
        self.append(1)
        return list.__len__(self)

    def __iter__(self):
        self.extend([2, 3])
        return list.__iter__(self)


def mixed_entries(rng, n):
    pool = [0, 1, 2, -1, 2**63, I64MIN, 1.5, True, "a", None, np.int64(3), np.int32(-4), np.uint64(2**64 - 1), object(), 10**40]
    return [rng.choice(pool) if rng.random() < 0.3 else rng.randrange(4) for _ in range(n)]


def scenario_lists(impl, rng, seconds):
    deadline = time.monotonic() + seconds
    ngram, prefix, ngi, acc, pl = impl["ngram"], impl["prefix"], impl["ngram_index"], impl["accept"], impl["place"]
    n = 0
    while time.monotonic() < deadline:
        n += 1
        L = rng.randrange(0, 200)
        base = history(rng, L)
        # __eq__ that shrinks or grows the list being searched
        h = list(base)
        for _ in range(rng.randrange(1, 6)):
            if h:
                h[rng.randrange(len(h))] = Shrinker(rng.randrange(4), [h], rng)
        h += [Shrinker(1, [h], rng), Shrinker(2, [h], rng)]
        attempt(ngram.prompt_lookup, h, rng.randrange(1, 4), rng.randrange(0, 10))
        a = list(base)
        b = list(base)
        if a:
            a[rng.randrange(len(a))] = Shrinker(0, [a, b], rng)
        b.append(Shrinker(0, [a, b], rng))
        attempt(prefix.common_prefix, a, b)
        attempt(prefix.common_prefix, tuple(a), b)
        h = list(base) + [Shrinker(1, [], rng)]
        h[rng.randrange(len(h))] = Shrinker(2, [h], rng)
        attempt(ngi.longest_match, h, 1, 3, 5)
        ix = new_index(impl.mods, rng)
        t = list(base)
        t.append(Shrinker(1, [t], rng))
        attempt(ix.extend, t)
        attempt(ix.extend, [Shrinker(1, [t], rng)] * 3)
        attempt(ngi.propose_batch, [ix, ix], [Shrinker(1, [], rng), 2])
        # subclasses and mixed types everywhere
        for lst in (LyingList(base), GrowingList(base), mixed_entries(rng, L), LyingList(mixed_entries(rng, L))):
            attempt(ngram.prompt_lookup, lst, 2, 5)
            attempt(prefix.common_prefix, lst, list(base))
            attempt(prefix.common_prefix, list(base), lst)
            attempt(ngi.longest_match, lst, 1, 3, 5)
            attempt(ngi.longest_match_batch, lst, [0, len(base)], 1, 3, 5)
            attempt(ix.extend, lst)
            attempt(acc.exact_batch, lst, lst, [0, len(base)])
            attempt(acc.exact_batch, base, base, LyingList([0, len(base)]))
            attempt(pl.settle_index, lst, lst)
            attempt(pl.place_rows, np.zeros((3, 2, 2)), LyingList([0, 1, 5]), np.zeros((3, 2)))
            attempt(ngi.propose_batch, LyingList([ix]), 3)
            attempt(ngi.propose_batch, GrowingList([ix]), GrowingList([3]))
            attempt(ngi.record_batch, LyingList([ix, ix]), LyingList([1, 1]), [0, 0])
        attempt(ngi.propose_batch, [ix, "x", None], 3)
        attempt(ngi.propose_batch, [ix, new_index(impl.twin if impl.kind == "compiled" else impl.mods, rng)], 3)
        attempt(ngi.record_batch, [ix], [1.5], [True])
        attempt(impl["settle"].settle, 5, True, 5, 5, "accept")
        attempt(impl["settle"].settle, 5, 2.0, 5, 5, None)
    return n


# --------------------------------------------------------------------------------------
# scenarios: threads rewriting caller-owned arrays while calls run
# --------------------------------------------------------------------------------------
def toggler(arr, good, rng):
    """A thread body: flip ``arr`` between its valid contents and hostile ones (held for
    a while, so that a kernel running without the GIL reads them)."""
    flat = arr.reshape(-1)
    good_flat = good.reshape(-1).copy()
    n = flat.size
    if arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        g = good_flat.astype(object)
        bad_sets = [
            np.full(n, info.max, dtype=arr.dtype),
            np.full(n, info.min, dtype=arr.dtype),
            np.linspace(info.max // 2, info.min // 2, n).astype(arr.dtype) if n else np.zeros(0, arr.dtype),
            (np.arange(n)[::-1] * 1000003).astype(arr.dtype),
            # still nondecreasing, but far outside every buffer
            np.array([min(x + info.max // 4, info.max) for x in g], dtype=arr.dtype),
            np.array([min(x * 1000003, info.max) for x in g], dtype=arr.dtype),
            np.array([max(x - info.max // 2, info.min) for x in g], dtype=arr.dtype),
        ]
    else:
        bad_sets = [np.full(n, v, dtype=arr.dtype) for v in (np.nan, -5.0, 1e30, 0.0)]

    def body():
        bad = rng.choice(bad_sets)
        if n == 0:
            return
        if rng.random() < 0.5:
            flat[:] = bad
            for _ in range(rng.randrange(1, 200)):  # hold it a while
                flat[0] = bad[0]
            flat[:] = good_flat
        else:
            for _ in range(rng.randrange(1, 50)):
                i = rng.randrange(n)
                flat[i] = bad[i]
            flat[:] = good_flat

    return body


def race(impl, seconds, calls, arrays, rng, n_mutators=1):
    """Call each of ``calls`` in a loop while mutator threads rewrite ``arrays``."""
    bodies = []
    for arr in arrays:
        for _ in range(n_mutators):
            bodies.append(toggler(arr, arr.copy(), random.Random(rng.randrange(2**32))))
    returned = run_threads(bodies + list(calls), seconds)[len(bodies):]
    # the mutators restore the arrays at once: a rule that refused every call would pass
    # the harness without running a kernel, so some calls must have returned
    if not any(returned):
        raise Failure(f"every call of the race was refused ({len(calls)} callables, {seconds:.1f} s)")


def scenario_threads_accept(impl, rng, seconds):
    acc = impl["accept"]
    B, vocab = 3000, 64
    draft, choices, off = ragged(rng, B, 8, vocab)
    N = draft.shape[0]
    p = probs(rng, N, vocab, np.float32)
    q = probs(rng, N, vocab, np.float32)
    u = np.array([rng.random() * 0.999 for _ in range(N + B)])
    draft32 = draft.astype(np.int32)
    calls = [
        lambda: acc.exact_batch(draft, choices, off),
        lambda: acc.min_run_batch(draft32, choices.astype(np.int32), off, 2),
        lambda: acc.speculative_batch(draft, off, p, q, u, False),
        lambda: acc.speculative_batch(draft32, off, p, None, u, True),
        lambda: acc.typical_batch(draft, off, p, 0.09, 0.3),
        lambda: acc.check_probs(p),
    ]
    race(impl, seconds, calls, [off, draft, draft32, choices, p, q, u], rng)
    return 1


def scenario_threads_match(impl, rng, seconds):
    ngi, ngram, prefix = impl["ngram_index"], impl["ngram"], impl["prefix"]
    B = 400
    toks = np.array(history(rng, 40_000, 6), dtype=np.int64)
    toks32 = toks.astype(np.int32)
    bounds = sorted(rng.randrange(toks.size) for _ in range(B - 1))
    off = np.array([0] + bounds + [toks.size], dtype=np.int64)
    ks = np.array([rng.randrange(1, 9) for _ in range(B)], dtype=np.int64)
    h = np.array(history(rng, 20_000, 3), dtype=np.int64)
    other = h.copy()
    calls = [
        lambda: ngi.longest_match_batch(toks, off, 1, 4, ks),
        lambda: ngi.longest_match_batch(toks32, off, 2, 3, 5, "earliest"),
        lambda: ngi.longest_match(h, 1, 6, 8),
        lambda: ngram.prompt_lookup(h, 3, 8),
        lambda: prefix.common_prefix(h, other),
    ]
    race(impl, seconds, calls, [off, ks, toks, toks32, h, other], rng)
    return 1


def scenario_threads_place(impl, rng, seconds):
    pl = impl["place"]
    B, K = 2000, 6
    src = np.arange(B * K * 8, dtype=np.float32).reshape(B, K, 8)
    dst = np.zeros((B, 8), dtype=np.float32)
    idx = np.array([rng.randrange(-1, K) for _ in range(B)], dtype=np.int64)
    idx32 = idx.astype(np.int32)
    a = np.array([rng.randrange(4) for _ in range(B)], dtype=np.int64)
    d = a + np.array([rng.randrange(3) for _ in range(B)], dtype=np.int64)
    calls = [
        lambda: pl.place_rows(src, idx, dst),
        lambda: pl.place_rows(src, idx32, dst),
        lambda: pl.settle_index(a, d),
    ]
    race(impl, seconds, calls, [idx, idx32, a, d], rng, n_mutators=2)
    return 1


# --------------------------------------------------------------------------------------
# scenario: NgramIndex objects used from several threads at once
# --------------------------------------------------------------------------------------
def scenario_ngram_threads(impl, rng, seconds):
    ngi = impl["ngram_index"]
    shared = [new_index(impl.mods, rng, 1, 5) for _ in range(3)]
    lock = threading.Lock()

    def pick(r):
        with lock:
            ix = r.choice(shared)
            if len(ix) > 400_000:  # start over, to bound memory
                shared[shared.index(ix)] = ix = new_index(impl.mods, r, 1, 5)
        return ix

    def extender(seed):
        r = random.Random(seed)

        def body():
            ix = pick(r)
            m = r.choice([1, 3, 50, 2000, 20_000])
            t = np.array(history(r, m, 5), dtype=r.choice([np.int32, np.int64]))
            if r.random() < 0.5:
                ix.extend(t)
            else:
                ix.extend(t.tolist())
            ix.append(r.randrange(5))

        return body

    def proposer(seed):
        r = random.Random(seed)

        def body():
            ixs = [pick(r) for _ in range(r.randrange(1, 6))]
            drafts, offs, lens = ngi.propose_batch(ixs, r.choice([None, 8, [3] * len(ixs)]))
            if offs.shape[0] != len(ixs) + 1 or drafts.shape[0] != offs[-1]:
                raise Failure(f"propose_batch returned inconsistent shapes {drafts.shape} {offs.shape}")
            ngi.record_batch(ixs, [2] * len(ixs), [1] * len(ixs))

        return body

    def single(seed):
        r = random.Random(seed)

        def body():
            ix = pick(r)
            d = ix.propose(r.choice([None, 4, 64]))
            ix.record(len(d), r.randrange(len(d) + 1))
            ix.match_length()
            if r.random() < 0.05:
                copy.copy(ix)
                pickle.loads(pickle.dumps(ix))
                ix.tokens.sum()
                repr(ix), ix.nbytes, ix.bytes_per_token, len(ix)
                ix.stats() if callable(ix.stats) else ix.stats

        return body

    bodies = [extender(1), extender(2), extender(3), proposer(4), proposer(5), single(6)]
    returned = run_threads(bodies, seconds)
    if not any(returned):  # busy refusals are allowed; refusing every call is not
        raise Failure(f"every call on the shared indexes was refused ({len(bodies)} threads)")
    for ix in shared:  # the index must still be whole: its own view equals a rebuilt one
        t = ix.tokens.copy()
        fresh = type(ix)(ix.min_n, ix.max_n, ix.prefer)
        fresh.extend(t)
        for k in (1, 4, 16):
            if ix.propose(k) != fresh.propose(k):
                raise Failure(
                    f"NgramIndex torn by concurrent use: propose({k}) gives {ix.propose(k)}, "
                    f"a fresh index over the same {t.size} tokens {fresh.propose(k)}"
                )
    return 1


# --------------------------------------------------------------------------------------
# scenario: the public wrappers (whatever implementation the package picked)
# --------------------------------------------------------------------------------------
def scenario_public(impl, rng, seconds):
    from specfsm.accept import rules as accept_rule
    from specfsm.drafting import ngram_index
    from specfsm.placement import place as gplace

    deadline = time.monotonic() + seconds / 2
    n = 0
    while time.monotonic() < deadline:
        n += 1
        L = rng.randrange(0, 50)
        base = history(rng, L)
        big = rng.choice(EXTREME)
        h = list(base) + [Shrinker(1, [], rng)]
        h[rng.randrange(len(h))] = Shrinker(2, [h], rng)
        attempt(specfsm.prompt_lookup, h, 2, rng.choice([3, big]))
        attempt(specfsm.common_prefix, base + [big], [Shrinker(0, [base], rng)] + base)
        attempt(ngram_index.longest_match, base, 1, rng.choice([2, big]), rng.choice([3, big]))
        attempt(ngram_index.longest_match_batch, np.array(base, dtype=np.int64), wrapping_offsets(rng, L), 1, 2, 3)
        d = np.array(base, dtype=np.int64)
        offs = wrapping_offsets(rng, L)
        attempt(accept_rule.Exact().accept_batch, d, d.copy(), offs)
        attempt(accept_rule.MinRun(2).accept_batch, d, d.copy(), offs)
        attempt(accept_rule.TypicalAcceptance().accept_batch, d, offs, probs(rng, L, 4))
        attempt(accept_rule.SpeculativeSampling(seed=1).sample_batch, d, offs, probs(rng, L, 4))
        attempt(gplace.settle_index, [big, 1], [big, 2])
        attempt(gplace.place_rows, np.zeros((2, 3, 2)), [big, rng.choice([0, big])], np.zeros((2, 2)))
        ix = ngram_index.NgramIndex(1, 3)
        attempt(ix.extend, base + [big])
        attempt(ngram_index.propose_batch, [ix, ix], [big, 1])
        attempt(ngram_index.record_batch, [ix], [big], [1])
    # the public NgramIndex and kernels under threads
    shared = ngram_index.NgramIndex(1, 4)
    draft, choices, off = ragged(rng, 2000, 6, 32)
    calls = [
        lambda: shared.extend(np.array(history(rng, 5000), dtype=np.int64)),
        lambda: ngram_index.propose_batch([shared, shared], 8),
        lambda: shared.extend(history(rng, 30)),
        lambda: accept_rule.Exact().accept_batch(draft, choices, off),
    ]
    race(impl, seconds / 2, calls, [off, draft], rng)
    return n


SCENARIOS = {
    "extreme_ints": scenario_extreme_ints,
    "callbacks": scenario_callbacks,
    "lists": scenario_lists,
    "threads_accept": scenario_threads_accept,
    "threads_match": scenario_threads_match,
    "threads_place": scenario_threads_place,
    "ngram_threads": scenario_ngram_threads,
    "public": scenario_public,
    "batch": __import__("scenarios_batch").scenario_batch,    # BatchState, StepResult
    **__import__("scenarios_index").SCENARIOS,  # index_reentry, index_threads (tests/hostile/scenarios_index.py)
}
SCENARIOS.update(__import__("scenarios_vllm").scenarios(sys.modules[__name__]))  # the vLLM proposers
SCENARIOS.update(__import__("scenarios_tree").scenarios(sys.modules[__name__]))  # the tree kernels
SCENARIOS.update(__import__("scenarios_recycling").scenarios(sys.modules[__name__]))  # the recycling table
SCENARIOS.update(__import__("scenarios_suffix_trie").scenarios(sys.modules[__name__]))  # the suffix trie


def main(argv):
    kind, name, seconds = argv[0], argv[1], float(argv[2])
    seed = int(argv[3]) if len(argv) > 3 else random.randrange(2**32)
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings per second
    rng = random.Random(seed)
    impl = Impl(kind)
    started = time.monotonic()
    faulthandler.enable(all_threads=True)  # a crash prints every thread's Python stack
    try:
        rounds = SCENARIOS[name](impl, rng, seconds)
        if impl.mismatches:
            raise Failure(
                f"{len(impl.mismatches)} results differ from the twin's:\n  "
                + "\n  ".join(impl.mismatches[:10])
            )
    except Failure as exc:
        print(f"hostile {name} [{kind}] seed {seed}: RULE BROKEN: {exc}", file=sys.stderr)
        return 4
    except BaseException as exc:  # noqa: BLE001 - the report is the point
        traceback.print_exc()
        print(
            f"hostile {name} [{kind}] seed {seed}: raised {type(exc).__name__}, which is not "
            f"one of {', '.join(e.__name__ for e in ALLOWED)}",
            file=sys.stderr,
        )
        return 3
    print(f"hostile {name} [{kind}] seed {seed}: {rounds} rounds in {time.monotonic() - started:.1f} s, survived")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
