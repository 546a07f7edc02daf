"""Hostile scenarios for the suffix trie (``specfsm._core.suffix_trie`` and its twin),
registered in ``runner.SCENARIOS`` by ``scenarios(runner)``.

``trie_inputs`` (one thread): a compiled trie and a twin trie kept alike, every method
(``extend``, ``close``, ``speculate``, the properties, ``len``, ``repr``, pickling, a
second ``__init__``) called on both with arguments most of which are broken: extreme
integers, floats, bools and strings for the sequence key and the counts, every layout
and dtype of tokens and contexts (lists, tuples, numpy integers, int8 to uint64,
big-endian, float, bool and object arrays, strided, Fortran-order, 0-d, 3-D, subclassed
arrays), odd factors and probabilities (NaN, infinities, negatives), and keys or token
ids whose ``__index__`` extends, closes or reads the same trie while they are converted.
The batches ``extend_tries`` and ``speculate_tries`` are called on both alike, over
the pair's trie and a few more of mixed depths (repeated in a call, ``others``
overlapping ``tries``), with broken ``tries`` lists (other objects, objects that lie
about their class, uninitialised tries, the other implementation's), keys, tokens,
offsets and limits, and entries whose ``__index__`` calls the tries or rewrites the
caller's lists and arrays while they are converted.
The results, or the exception types, and the tries after every call must be equal
(strictly: a refusal the twin does not make is a mismatch); objects made with
``__new__`` and unbound calls with a ``self`` of another type must be refused.

``trie_threads``: threads extending one shared trie under several keys (reopening them
after closing), speculating from it and reading its properties, and batches over it and
a second trie (``extend_tries`` with both repeated, ``speculate_tries`` with the shared
trie repeated and both in ``others``), while other threads rewrite the caller's token,
context, offset and limit arrays with values that break every bound. Every call
returns or raises one of ``ALLOWED``; at the end each trie has counted exactly the
tokens of the calls that returned, its node capacity follows the rule, and every draft
it gave was within its limits.
"""

from __future__ import annotations

import pickle
import time

import numpy as np

from scenarios_recycling import _LAYOUTS, _Hooked, _layout


def scenarios(runner):
    """The scenarios, bound to the runner module's helpers (``race``, ``EXTREME``)."""
    return {
        "trie_inputs": lambda impl, rng, seconds: scenario_trie_inputs(runner, impl, rng, seconds),
        "trie_threads": lambda impl, rng, seconds: scenario_trie_threads(runner, impl, rng, seconds),
    }


CONTEXTS = ([0], [1], [0, 1], [2, 1, 0], [1, 1, 1, 1])


def _state(t):
    """What a caller can read off a trie (a refused read is its exception type)."""
    try:
        drafts = [t.speculate(c, t.depth, f, 0.0) for c in CONTEXTS for f in (0, 1.5)]
        return len(t), t.n_nodes, t.open_sequences, t.nbytes, repr(t), drafts
    except Exception as exc:  # noqa: BLE001 - compared as a type
        return type(exc).__name__


class _Pair:
    """A compiled and a twin trie built alike, each call made on both and compared; with
    each, a few more tries built alike for the batches (the pair's trie first)."""

    def __init__(self, runner, impl, depth, ties, more=()):
        self.runner, self.impl = runner, impl
        self.mods = [impl["suffix_trie"]] + ([impl.twin["suffix_trie"]] if impl.kind == "compiled" else [])
        self.tries = [m.SuffixTrie(depth, ties) for m in self.mods]
        self.pools = [[t] + [m.SuffixTrie(d, ties) for d in more] for m, t in zip(self.mods, self.tries)]

    def call(self, label, make, rng):
        """``make(trie)`` -> (callable, args), each drawing from ``rng`` alike: the
        outcome on each trie, compared."""
        return self._compare(label, [lambda t=t: make(t) for t in self.tries], rng, [[t] for t in self.tries])

    def call_batch(self, label, make, rng):
        """``make(module, pool)`` -> (callable, args), each drawing from ``rng`` alike:
        the outcome on each implementation's tries, compared."""
        return self._compare(label, [lambda m=m, p=p: make(m, p) for m, p in zip(self.mods, self.pools)], rng,
                             self.pools)

    def _compare(self, label, makers, rng, pools):
        state = rng.getstate()
        outs = []
        for make, pool in zip(makers, pools):
            rng.setstate(state)
            fn, args = make()
            got = self.runner.attempt(fn, *args)
            outs.append((got[0], self.runner.canon(got[1]) if got[0] == "ok" else got[1], [_state(t) for t in pool]))
        if len(outs) == 2 and outs[0] != outs[1]:
            self.impl.mismatches.append(f"{label}: compiled {self.runner.short(outs[0])}, "
                                        f"twin {self.runner.short(outs[1])}")
        return outs[0]


def _reentry(t, rng):
    """A call on ``t`` made from inside a conversion (drawn now, so both tries get it)."""
    what, key, toks = rng.randrange(3), rng.randrange(-1, 3), [rng.randrange(4) for _ in range(rng.randrange(4))]
    if what == 0:
        return lambda: t.extend(key, toks)
    if what == 1:
        return lambda: t.close(key)
    return lambda: t.speculate(toks, 3)


def _key(runner, t, rng, broken):
    """A sequence key: a small int, or broken, or one whose conversion calls the trie."""
    if not broken:
        return rng.randrange(-1, 4)
    if rng.random() < 0.3:
        k = _Hooked(rng.randrange(-1, 4))
        k.action = _reentry(t, rng)
        return k
    return rng.choice(runner.EXTREME + [1.0, True, np.bool_(False), "1", None, np.int32(2), np.uint64(2**64 - 1),
                                        np.float64(1.0), [1], np.array(2)])


def _ids(runner, t, rng, broken, n_max=10):
    """Tokens or a context: small ids (so strings repeat), or broken in one of many ways,
    an entry perhaps calling the trie while it is converted."""
    vals = [rng.randrange(4) for _ in range(rng.randrange(n_max))]
    if broken and vals and rng.random() < 0.5:
        vals[rng.randrange(len(vals))] = rng.choice(runner.EXTREME)
    how = rng.choice(_LAYOUTS) if broken else rng.choice([None, np.int64, np.int32])
    out = _layout(vals, how)
    if broken and rng.random() < 0.2 and isinstance(out, list) and out:
        hooked = _Hooked(rng.randrange(4))
        hooked.action = _reentry(t, rng)
        out[-1] = hooked
    return out


def _speculate_args(runner, t, rng, broken):
    ctx = _ids(runner, t, rng, broken, 12)
    args = [rng.randrange(0, 12), rng.choice([0, 0.0, 0.5, 1, 1.5, 2.5]), rng.choice([0, 0.0, 0.1, 0.4, 1.0])]
    if broken:
        pool = [runner.EXTREME + [2.0, True, None, "1"],
                [-1.0, float("nan"), float("inf"), -0.0, 1e308, True, None, "1", np.float32(0.5), 2**1100],
                [-0.1, 1.5, float("nan"), 2, True, None, np.float16(0.25), 1e-320]]
        i = rng.randrange(3)
        args[i] = rng.choice(pool[i])
    return (ctx, *args)


def _liar(cls):
    """An object that claims to be a ``cls`` (``isinstance`` believes its ``__class__``)."""
    return type("Liar", (), {"__class__": property(lambda self: cls)})()


def _trie_list(runner, mods, mod, pool, rng, broken, n_max=6):
    """A batch's ``tries`` or ``others``: tries of ``pool`` (repeats likely), or broken:
    another object, a liar, an uninitialised trie, the other implementation's trie, a
    generator, a single trie, or a list whose conversion-time rewrite the call must not
    see (it holds its own copy)."""
    rows = [rng.choice(pool) for _ in range(rng.randrange(n_max))]
    if not broken or rng.random() < 0.4:
        return rows if rng.random() < 0.8 else tuple(rows)
    cls = mod.SuffixTrie
    other = [m for m in mods if m is not mod]
    what = rng.randrange(7)
    if what == 0:
        return pool[0]
    if what == 1:
        return iter(rows)
    bad = [rng.choice([5, None, "t", object()]), _liar(cls), cls.__new__(cls),
           other[0].SuffixTrie(2) if other else object(), rows][what - 2]
    if what == 6:
        return rows + [bad] if rows else None
    rows.insert(rng.randrange(len(rows) + 1), bad)
    return rows


def _batch_ids(runner, rng, broken, b, reentry):
    """``b`` rows of tokens and their offsets, in a layout; broken: edited tokens or
    offsets (an entry perhaps running ``reentry()``'s action while it is converted)."""
    rows = [[rng.randrange(4) for _ in range(rng.randrange(5))] for _ in range(b)]
    flat = [x for r in rows for x in r]
    off = [0]
    for r in rows:
        off.append(off[-1] + len(r))
    if broken:
        target = flat if rng.random() < 0.5 else off
        if rng.random() < 0.5 and target:
            target[rng.randrange(len(target))] = rng.choice(runner.EXTREME)
        elif rng.random() < 0.5:
            target.append(rng.randrange(4))
    return _ids_layout(rng, broken, flat, reentry), _ids_layout(rng, broken, off, reentry)


def _ids_layout(rng, broken, vals, reentry):
    """``vals`` in a layout (any, when ``broken``, the last entry of a list perhaps
    running ``reentry()``'s action when converted)."""
    how = rng.choice(_LAYOUTS) if broken else rng.choice([None, np.int64, np.int32])
    out = _layout(vals, how)
    if broken and rng.random() < 0.2 and isinstance(out, list) and out:
        hooked = _Hooked(rng.randrange(4))
        hooked.action = reentry()
        out[-1] = hooked
    return out


def _batch_reentry(mod, pool, args, rng):
    """An action run inside a batch's conversion (drawn now, so both implementations get
    it): a single call or a batch on the tries, or a rewrite of the caller's ``tries``
    list (``args[0]``, once the call has its own copy)."""
    what = rng.randrange(5)
    if what <= 1:
        return _reentry(rng.choice(pool), rng)
    seqs = [rng.randrange(-1, 3) for _ in pool]
    if what == 2:
        toks = [rng.randrange(4) for _ in pool]
        return lambda: mod.extend_tries(list(pool), seqs, toks, list(range(len(pool) + 1)))
    if what == 3:
        return lambda: mod.speculate_tries(list(pool), seqs, 3, pool[:1])
    return lambda: args[0].clear() if type(args[0]) is list else None


def _batch_call(runner, mods, mod, pool, rng, broken, extend):
    """``extend_tries`` or ``speculate_tries`` of ``mod`` (one of ``mods``, the pair's
    implementations) on ``pool``'s tries, arguments drawn from ``rng`` (perhaps broken)."""
    args: list = []
    reentry = lambda: _batch_reentry(mod, pool, args, rng)  # noqa: E731
    tries = _trie_list(runner, mods, mod, pool, rng, broken)
    b = len(tries) if type(tries) in (list, tuple) else 1
    if broken and rng.random() < 0.2:
        b = max(b + rng.choice([-1, 1]), 0)
    args += [tries, _ids_layout(rng, broken, [rng.randrange(-1, 4) for _ in range(b)], reentry)]
    if extend:
        return mod.extend_tries, (*args, *_batch_ids(runner, rng, broken, b, reentry))
    others = _trie_list(runner, mods, mod, pool, rng, broken, 4)
    max_k = (rng.randrange(0, 12) if rng.random() < 0.5
             else _ids_layout(rng, broken, [rng.randrange(0, 12) for _ in range(b)], reentry))
    if broken and rng.random() < 0.3:
        max_k = rng.choice(runner.EXTREME + [2.0, True, None, "1", -1])
    _, _, factor, min_prob = _speculate_args(runner, pool[0], rng, broken)
    return mod.speculate_tries, (*args, max_k, others, factor, min_prob)


def _refusals(runner, impl, rng):
    """Objects made with ``__new__`` and unbound calls on a ``self`` of another type."""
    cls = impl["suffix_trie"].SuffixTrie
    raw = cls.__new__(cls)
    for call in (lambda: raw.extend(0, [1]), lambda: raw.close(0), lambda: raw.speculate([1], 2),
                 lambda: raw.n_nodes, lambda: raw.nbytes, lambda: len(raw), lambda: pickle.dumps(raw)):
        try:
            call()
        except RuntimeError:
            continue
        raise runner.Failure("a SuffixTrie made with __new__ allowed a call")
    others = [object(), 7, [0] * 8, "x" * 64]
    if impl.kind == "compiled":
        others.append(impl.twin["suffix_trie"].SuffixTrie(2))     # the other implementation's
    for name in ("extend", "close", "speculate", "__reduce__", "_hold_guard", "__len__"):
        for other in others:
            try:
                getattr(cls, name)(other, *([1] * rng.randrange(0, 3)))
            except TypeError:
                continue
            raise runner.Failure(f"SuffixTrie.{name} took a self of type {type(other).__name__}")


def scenario_trie_inputs(runner, impl, rng, seconds):
    end = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < end:
        rounds += 1
        pair = _Pair(runner, impl, rng.choice([2, 3, 4, 8]), rng.choice(["first", "last"]),
                     [rng.choice([2, 3, 8]) for _ in range(rng.randrange(3))])
        for _ in range(rng.randrange(1, 16)):
            broken = rng.random() < 0.4
            what = rng.randrange(9)
            if what >= 7:
                pair.call_batch("extend_tries" if what == 7 else "speculate_tries",
                                lambda m, p: _batch_call(runner, pair.mods, m, p, rng, broken, what == 7), rng)
                continue
            if what <= 2:
                pair.call("extend", lambda t: (t.extend, (_key(runner, t, rng, broken), _ids(runner, t, rng, broken))),
                          rng)
            elif what == 3:
                pair.call("close", lambda t: (t.close, (_key(runner, t, rng, broken),)), rng)
            elif what <= 5:
                pair.call("speculate", lambda t: (t.speculate, _speculate_args(runner, t, rng, broken)), rng)
            else:
                pair.call("init", lambda t: (t.__init__, (rng.choice([2, 8, 0, 65, 2.0]), "last")), rng)
                pair.call("pickle", lambda t: (pickle.dumps, (t,)), rng)
                pair.call("reads", lambda t: (lambda: (t.depth, t.ties, t.open_sequences, repr(t)), ()), rng)
        _refusals(runner, impl, rng)
    return rounds


def _check_draft(runner, out, max_k, depth):
    draft, score, m = out
    if not (len(draft) <= min(max_k, depth) and 0.0 <= score <= len(draft) and 0 <= m <= depth):
        raise runner.Failure(f"a draft beyond its limits: {out!r} (max_k {max_k}, depth {depth})")


def _check_rule(runner, t, fed, depth):
    """``t`` counted exactly ``fed`` tokens (None: any), and its nodes follow the rule."""
    cap = 64
    while cap < t.n_nodes:
        cap *= 2
    if (fed is not None and len(t) != fed) or t.nbytes != 32 * cap or not 0 <= t.n_nodes <= len(t) * depth:
        raise runner.Failure(f"the trie broke its rule under threads: {len(t)} tokens counted, "
                             f"{fed} fed; {t.n_nodes} nodes, nbytes {t.nbytes}")


def scenario_trie_threads(runner, impl, rng, seconds):
    depth = 8
    mod = impl["suffix_trie"]
    t = mod.SuffixTrie(depth, rng.choice(["first", "last"]))
    u, w = mod.SuffixTrie(4, "last"), mod.SuffixTrie(3)
    t.extend(0, [rng.randrange(16) for _ in range(2000)])
    fed = [2000]     # the tokens of every call that returned, into t (list.append is atomic) ...
    fed_u = [0]      # ... and into u
    toks = np.array([rng.randrange(16) for _ in range(64)], dtype=np.int64)
    toks32 = toks.astype(np.int32)
    ctx = np.array([rng.randrange(16) for _ in range(12)], dtype=np.int64)
    # the batches: rows t, u, t, u with fixed offsets (so the tokens each trie gets are
    # known) and keys, tokens and limits rewritten; w's offsets rewritten too
    seqs = np.array([1, 7, 2, 8], dtype=np.int64)
    off = np.array([0, 3, 3, 10, 12], dtype=np.int64)
    off_w = off.copy()
    btoks = toks[:12].copy()
    B = 32
    bseqs = np.array([rng.randrange(1, 6) for _ in range(B)], dtype=np.int64)
    ks = np.array([rng.randrange(0, 9) for _ in range(B)], dtype=np.int64)

    def extend(key, arr):
        n = len(arr)
        t.extend(key, arr)
        fed.append(n)

    def speculate(c, max_k, factor):
        _check_draft(runner, t.speculate(c, max_k, factor, 0.0), max_k, depth)

    def extend_batch():
        mod.extend_tries([t, u, t, u], seqs, btoks, off)
        fed.append(10)
        fed_u.append(2)

    def speculate_batch(tries, others):
        out = mod.speculate_tries(tries, bseqs, ks, others, 1.0, 0.0)
        if len(out) != B or any(len(d) > depth or any(type(x) is not int for x in d) for d in out):
            raise runner.Failure(f"speculate_tries gave a draft beyond its limits: {out!r}")

    calls = [
        lambda: extend(1, toks),
        lambda: extend(2, toks32),
        lambda: extend(rng.randrange(3, 6), toks[: rng.randrange(64)]),
        lambda: t.close(rng.randrange(1, 6)),
        lambda: speculate(ctx, 4, 1.0),
        lambda: speculate(ctx[:3], 8, 0),
        lambda: speculate(toks, 2, 0.5),
        lambda: (len(t), t.n_nodes, t.nbytes, t.open_sequences, repr(t)),
        lambda: pickle.dumps(t),
        extend_batch,
        lambda: mod.extend_tries([w, w, w, w], seqs, btoks, off_w),
        lambda: speculate_batch([t] * B, [u, t]),
        lambda: speculate_batch([u, t] * (B // 2), [t]),
        lambda: u.close(rng.choice([7, 8])),
    ]
    runner.race(impl, seconds, calls, [toks, toks32, ctx, seqs, btoks, off_w, bseqs, ks], rng, n_mutators=2)
    _check_rule(runner, t, sum(fed), depth)
    _check_rule(runner, u, sum(fed_u), 4)
    _check_rule(runner, w, None, 3)
    return 1
