"""Hostile scenarios for the tree kernels (``specfsm._core.tree`` and its twin), registered in
``runner.SCENARIOS`` by ``scenarios(runner)``.

``tree_inputs`` (one thread): random trees, rows, offsets, caches and paths, most of them
broken (parents out of range or after their node, extreme integers, equal siblings,
offsets that do not tile, paths past the cache), every call compared with the twin (the
same result, or a refusal both make).

``tree_threads``: threads rewrite the caller's tokens, parents, offsets, row tokens, bases
and paths with values that break every bound while other threads call every kernel; each
call returns or raises one of ``ALLOWED`` and never reads or writes outside its buffers.
"""

from __future__ import annotations

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
        dtype = rng.choice([np.int64, np.int32, None])

        def arr(x):
            if dtype is None:
                return list(x)
            try:
                return np.array(x, dtype=dtype)
            except OverflowError:
                return list(x)

        def one():
            t, p = _tree(rng, n, broken)
            rows = _rows(rng, t, n + 1 + (rng.randrange(-1, 2) if broken else 0))
            return (arr(t), arr(p), arr(rows)), {}

        impl.same("accept_tree", "tree", "accept_tree", one, rng)
        impl.same("check_tree", "tree", "check_tree", lambda: (one()[0][:2], {}), rng)

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
            return (arr(t), arr(p), off, arr(rows)), {}

        impl.same("accept_tree_batch", "tree", "accept_tree_batch", batch, rng)

        def place():
            L = rng.randrange(1, 8)
            cache = np.arange(L * 3, dtype=np.float64).reshape(L, 3)
            base = rng.choice([0, 1, L - 1, L, -1, 2**63 - 1, 2**64]) if broken else rng.randrange(L)
            room = max(L - 1 - (base if isinstance(base, int) and 0 <= base < L else 0), 0)
            path = sorted(rng.sample(range(room), rng.randrange(room + 1))) if room else []
            if broken and path:
                path[rng.randrange(len(path))] = rng.choice(runner.EXTREME)
            return (cache, base, path), {}

        impl.same("place_path", "tree", "place_path", place, rng)

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
            return (cache, bases, flat, off), {}

        impl.same("place_path_batch", "tree", "place_path_batch", place_batch, rng)
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
