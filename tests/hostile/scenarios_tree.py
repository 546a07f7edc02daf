"""Hostile scenarios for the tree kernels (``specfsm._core.tree`` and its twin), registered in
``runner.SCENARIOS`` by ``scenarios(runner)``.

``tree_inputs`` (one thread): random trees, rows, offsets, caches and paths, most of them
broken (parents out of range or after their node, extreme integers, equal siblings,
offsets that do not tile, paths past the cache), every call compared with the twin (the
same result, or a refusal both make).

Every call there is compared strictly (a refusal the twin does not make, or makes with
another exception type, is a mismatch too), with the arrays in every layout and dtype
(lists, int32 to uint64 and int8, big-endian, strided, subclasses, 2-D, 0-d), bases
whose conversion rewrites the path and the cache already passed, and
``sample_tree_batch`` given offsets that change on every read (it must sample as with
the first reading, or refuse without drawing).

``tree_threads``: threads rewrite the caller's tokens, parents, offsets, row tokens, bases
and paths with values that break every bound while other threads call every kernel; each
call returns or raises one of ``ALLOWED`` and never reads or writes outside its buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def scenarios(runner):
    """The scenarios, bound to the runner module's helpers (``race``, ``EXTREME``)."""
    return {
        "tree_inputs": lambda impl, rng, seconds: scenario_tree_inputs(runner, impl, rng, seconds),
        "tree_threads": lambda impl, rng, seconds: scenario_tree_threads(runner, impl, rng, seconds),
    }


def _tree(rng, n, broken):
    parents = [rng.randrange(-1, i) if i else -1 for i in range(n)]
    tokens = [1000 + i for i in range(n)]
    if broken and n:
        i = rng.randrange(n)
        what = rng.randrange(4)
        if what == 0:
            parents[i] = rng.choice([i, i + 1, n + 5, -2, -(2**63)])
        elif what == 1:
            tokens[i] = rng.choice([-1, -(2**63)])
        elif what == 2 and n > 1:
            j = rng.randrange(n)
            parents[j] = parents[i] if j > parents[i] else parents[j]
            tokens[j] = tokens[i]
        else:
            parents[i] = rng.choice([2**63 - 1, 2**31])
    return tokens, parents


class _Sub(np.ndarray):
    """An ndarray subclass whose item access answers otherwise than its memory."""

    def __getitem__(self, key):
        return np.zeros(3, dtype=np.int64)


_LAYOUTS = [np.int64, np.int32, None, np.uint64, np.int8, ">i8", "strided", "subclass", "2d", "0d"]


def _layout(x, how):
    """``x`` (a list of ints) as layout ``how``; a dtype that cannot hold it gives a list."""
    if how is None:
        return list(x)
    try:
        a = np.array(x, dtype=np.int64 if isinstance(how, str) and not how.startswith(">") else how)
    except OverflowError:
        return list(x)
    if how == "strided":
        return np.repeat(a, 2)[::2]
    if how == "subclass":
        return a.view(_Sub)
    if how == "2d":
        return a.reshape(1, -1)
    if how == "0d":
        return np.array(x[0] if x else 0)
    return a


class _Shifting(Sequence):
    """A sequence whose every pass (iteration) after the first reads other values."""

    def __init__(self, first, later):
        self.values = [list(first), list(later)]
        self.passes = 0

    def _now(self):
        return self.values[min(self.passes, 1)]

    def __len__(self):
        return len(self._now())

    def __getitem__(self, i):
        return self._now()[i]

    def __iter__(self):
        out = list(self._now())
        self.passes += 1
        return iter(out)


def _shifting_offsets(runner, rng):
    """``sample_tree_batch`` (the public layer, the active implementation) with offsets
    that change after the first read: it samples as with the first reading, or refuses
    (one of ALLOWED) without drawing."""
    from specfsm.tree.sampling import sample_tree_batch

    B = rng.randrange(1, 4)
    trees = [_tree(rng, rng.randrange(1, 5), False) for _ in range(B)]
    t = [x for tr in trees for x in tr[0]]
    p = [x for tr in trees for x in tr[1]]
    off = [0]
    for tr in trees:
        off.append(off[-1] + len(tr[0]))
    later = [rng.choice(runner.EXTREME + [0, 1, len(t)]) for _ in off]
    probs = runner.probs(rng, len(t) + B, 1010)
    seed = rng.randrange(2**32)
    want = sample_tree_batch(np.array(t), np.array(p), np.array(off), probs, np.random.default_rng(seed))
    g = np.random.default_rng(seed)
    state = g.bit_generator.state
    try:
        got = sample_tree_batch(t, p, _Shifting(off, later), probs, g)
    except runner.ALLOWED:
        if g.bit_generator.state != state:
            raise runner.Failure("sample_tree_batch refused after drawing") from None
        return
    for a, b in zip(got, want):
        if not np.array_equal(a, b):
            raise runner.Failure(f"sample_tree_batch read offsets twice: {got} against {want}")


def _rows(rng, tokens, n_rows):
    return [rng.choice(tokens) if tokens and rng.random() < 0.7 else rng.randrange(50) for _ in range(n_rows)]


def scenario_tree_inputs(runner, impl, rng, seconds):
    import time

    end = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < end:
        rounds += 1
        n = rng.randrange(0, 10)
        broken = rng.random() < 0.5
        dtype = rng.choice(_LAYOUTS if rng.random() < 0.5 else [np.int64, np.int32, None])

        def arr(x):
            return _layout(x, dtype)

        def one():
            t, p = _tree(rng, n, broken)
            rows = _rows(rng, t, n + 1 + (rng.randrange(-1, 2) if broken else 0))
            return (arr(t), arr(p), arr(rows)), {}

        impl.same("accept_tree", "tree", "accept_tree", one, rng, strict=True)
        impl.same("check_tree", "tree", "check_tree", lambda: (one()[0][:2], {}), rng, strict=True)

        def batch():
            B = rng.randrange(0, 5)
            trees = [_tree(rng, rng.randrange(1, 6), broken and rng.random() < 0.3) for _ in range(B)]
            t = [x for tr in trees for x in tr[0]]
            p = [x for tr in trees for x in tr[1]]
            off = [0]
            for tr in trees:
                off.append(off[-1] + len(tr[0]))
            if broken and rng.random() < 0.5 and len(off) > 1:
                k = rng.randrange(len(off))
                off[k] = rng.choice(runner.EXTREME)
            rows = _rows(rng, t, len(t) + B + (rng.randrange(-1, 2) if broken else 0))
            return (arr(t), arr(p), arr(off) if rng.random() < 0.3 else off, arr(rows)), {}

        impl.same("accept_tree_batch", "tree", "accept_tree_batch", batch, rng, strict=True)

        def place():
            L = rng.randrange(1, 8)
            cache = np.arange(L * 3, dtype=np.float64).reshape(L, 3)
            base = rng.choice([0, 1, L - 1, L, -1, 2**63 - 1, 2**64]) if broken else rng.randrange(L)
            room = max(L - 1 - (base if isinstance(base, int) and 0 <= base < L else 0), 0)
            path = sorted(rng.sample(range(room), rng.randrange(room + 1))) if room else []
            if broken and path:
                path[rng.randrange(len(path))] = rng.choice(runner.EXTREME)
            if broken and rng.random() < 0.3:  # base's conversion rewrites the path and the cache
                path = list(path)

                def rewrite(cache=cache, path=path):
                    path[:] = [0, 2**62, -1]
                    cache.shape = (cache.shape[0] * 3,)

                base = runner.Rewriter(base if isinstance(base, int) else 0, rewrite)
            else:
                path = arr(path) if rng.random() < 0.3 else path
            return (cache, base, path), {}

        impl.same("place_path", "tree", "place_path", place, rng, strict=True)

        def place_batch():
            B, L = rng.randrange(0, 4), rng.randrange(1, 7)
            cache = np.arange(B * L * 2, dtype=np.int32).reshape(B, L, 2)
            bases = [rng.randrange(L) for _ in range(B)]
            paths = [sorted(rng.sample(range(L - 1 - b), rng.randrange(L - b))) for b in bases]
            flat = [v for pth in paths for v in pth]
            off = [0]
            for pth in paths:
                off.append(off[-1] + len(pth))
            if broken and B:
                what = rng.randrange(3)
                if what == 0:
                    bases[rng.randrange(B)] = rng.choice(runner.EXTREME)
                elif what == 1 and flat:
                    flat[rng.randrange(len(flat))] = rng.choice(runner.EXTREME)
                else:
                    off[rng.randrange(len(off))] = rng.choice(runner.EXTREME)
            if rng.random() < 0.3:
                bases, flat, off = arr(bases), arr(flat), arr(off)
            return (cache, bases, flat, off), {}

        impl.same("place_path_batch", "tree", "place_path_batch", place_batch, rng, strict=True)
        _shifting_offsets(runner, rng)
    return rounds


def scenario_tree_threads(runner, impl, rng, seconds):
    tr = impl["tree"]
    B, N = 100, 16
    parents, tokens = [], []
    for _ in range(B):
        t, p = _tree(rng, N, False)
        tokens += t
        parents += p
    t64 = np.array(tokens, dtype=np.int64)
    p64 = np.array(parents, dtype=np.int64)
    t32, p32 = t64.astype(np.int32), p64.astype(np.int32)
    off = np.arange(B + 1, dtype=np.int64) * N
    rows = np.array(_rows(rng, tokens, B * (N + 1)), dtype=np.int64)
    one_t, one_p, one_r = t64[:N].copy(), p64[:N].copy(), rows[: N + 1].copy()
    counts, _, path, poff = tr.accept_tree_batch(t64, p64, off, rows)
    L = N + 4
    cache = np.zeros((B, L, 4), dtype=np.float32)
    base = np.full(B, 2, dtype=np.int64)
    single = np.zeros((L, 4), dtype=np.float32)
    one_path = np.array([0, 1, 2], dtype=np.int64)
    accept_calls = [
        lambda: tr.accept_tree_batch(t64, p64, off, rows),
        lambda: tr.accept_tree_batch(t32, p32, off, rows),
        lambda: tr.accept_tree(one_t, one_p, one_r),
        lambda: tr.check_tree(one_t, one_p),
    ]
    place_calls = [
        lambda: tr.place_path_batch(cache, base, path, poff),
        lambda: tr.place_path(single, 1, one_path),
    ]
    # two races, each over the arrays its calls read (a call must see them valid at times)
    runner.race(impl, seconds, accept_calls, [t64, p32, off, rows, one_p, one_r], rng)
    runner.race(impl, seconds, place_calls, [path, poff, base, one_path], rng)
    return 2
