"""Hostile scenarios for the vLLM proposers (``specfsm.vllm``), registered in
``runner.SCENARIOS`` by ``scenarios(runner)``.

``vllm_rows`` (one thread): generated ``propose`` calls on batches whose rows are cut
back, moved, swapped, reused by other requests, in a ``token_ids_cpu`` narrower or wider
than before (strided, copied, int32 or int64, fewer rows), interleaved with arguments that
do not fit (lengths past the width, negative or extreme lengths, float / object / string
arrays, ragged lists, ``sampled_token_ids`` entries that are not lists, tensors whose
``.numpy()`` fails). Every call returns or raises one of ``ALLOWED``; with
``verify="full"`` every draft of every well-formed call must equal a fresh index's over the
row's history (so a refused call left nothing behind), with ``"sparse"`` every draft must
have the promised shape. Between proposers, the steady-step kernel itself
(``rows.steady_rows``) is called directly on steady batches with extreme values put into
every argument: every integer argument from ``EXTREME`` and odd types, extreme int64
values inside every array (remembered lengths near 2**63 with ``num_tokens`` their wrapped
sum, positions, anchors, tokens, filter values), every array in other layouts (lists,
strided, Fortran, 0-d, wrong ndim, other dtypes, byte-swapped, unaligned, a subclass);
the compiled kernel must give the twin's answer or raise the twin's exception type.

``vllm_threads``: threads rewrite ``token_ids_cpu``, ``num_tokens_no_spec`` and the
``sampled_token_ids`` list while others call ``propose`` (concurrent calls on one
proposer are refused with RuntimeError) and ``reset``; afterwards, with the arrays valid
again, a ``verify="full"`` proposer must draft what a fresh index drafts.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np

from specfsm import vllm as sv


def scenarios(runner):
    """The scenarios, bound to the runner module's helpers (``ALLOWED``, ``attempt``,
    ``Failure``, ``run_threads``, ``toggler``, ``EXTREME``)."""
    return {
        "vllm_rows": lambda impl, rng, seconds: scenario_vllm_rows(runner, impl, rng, seconds),
        "vllm_threads": lambda impl, rng, seconds: scenario_vllm_threads(runner, impl, rng, seconds),
    }


def _proposer(impl, rng, verify=None):
    k = rng.choice([1, 2, 3, 5])
    cap = rng.choice([None, None, 40, 300])
    verify = verify or rng.choice(["sparse", "full"])
    if rng.random() < 0.5:
        lo = rng.randrange(1, 4)
        # (the active implementation's kernels: impl's, as the python case runs with SPECFSM_NO_EXTENSIONS=1)
        return sv.SpecfsmNgramProposer(min_n=lo, max_n=lo + rng.randrange(3), prefer=rng.choice(["earliest", "latest"]),
                                       num_speculative_tokens=k, max_model_len=cap, verify=verify)
    return sv.SpecfsmSuffixProposer(min_n=rng.randrange(1, 3), max_n=rng.choice([None, 4]),
                                    prefer=rng.choice(["earliest", "latest"]),
                                    num_speculative_tokens=k, max_model_len=cap, verify=verify)


class _Batch:
    """Requests in rows: each row's history, and the moves vLLM makes on them."""

    def __init__(self, rng, vocab, cap):
        self.rng = rng
        self.vocab = vocab
        self.cap = cap  # longest history
        self.rows: list[list[int]] = []

    def _history(self, n):
        base = [self.rng.randrange(self.vocab) for _ in range(max(1, n // 3))]
        return (base * 3 + [self.rng.randrange(self.vocab) for _ in range(3)])[:n]

    def move(self):
        r, rows = self.rng, self.rows
        kind = r.randrange(8)
        if kind == 0 or not rows:  # a new request (appended or into a freed row)
            h = self._history(r.choice([1, 3, 9, 40, 150, 260]) if self.cap >= 260 else r.randrange(1, self.cap))
            if rows and r.random() < 0.5:
                rows[r.randrange(len(rows))] = h
            elif len(rows) < 12:
                rows.append(h)
        elif kind == 1 and len(rows) >= 2:  # swap_states
            i, j = r.sample(range(len(rows)), 2)
            rows[i], rows[j] = rows[j], rows[i]
        elif kind == 2 and rows:  # cut back in place
            i = r.randrange(len(rows))
            rows[i] = rows[i][: r.randrange(len(rows[i]) + 1)]
        elif kind == 3 and len(rows) >= 2:  # a request finishes, the last row moves into its hole
            i = r.randrange(len(rows))
            last = rows.pop()
            if i < len(rows):
                rows[i] = last
        elif kind == 4 and rows:  # shared prompt: a row restarts as a prefix of another
            a, b = r.randrange(len(rows)), r.randrange(len(rows))
            rows[a] = list(rows[b][: r.randrange(1, len(rows[b]) + 1)]) if rows[b] else [1]
        # otherwise: nothing moves this step (the steady path)

    def grow(self):
        """Each row samples 1 to 3 tokens (or none: a partial prefill); the counts."""
        sampled = []
        for h in self.rows:
            n = 0 if self.rng.random() < 0.1 else self.rng.randrange(1, 4)
            n = min(n, self.cap - len(h))
            new = [h[self.rng.randrange(len(h))] if h and self.rng.random() < 0.6 else self.rng.randrange(self.vocab)
                   for _ in range(n)]
            h += new
            sampled.append(new)
        return sampled

    def arrays(self, width_extra, dtype, few_rows):
        lens = np.array([len(h) for h in self.rows], dtype=np.int64)
        need = int(lens.max()) if lens.size else 0
        width = max(need + width_extra, 0)
        nrows = len(self.rows) if few_rows else len(self.rows) + self.rng.randrange(3)
        tok = np.full((max(nrows, len(self.rows)), width), -7, dtype=dtype)
        for i, h in enumerate(self.rows):
            tok[i, : len(h)] = h
        return lens, tok


class _BadTensor:
    def numpy(self):
        raise RuntimeError("can't convert cuda:0 device type tensor to numpy")


def _bad_call(runner, rng, b, lens, tok):
    """Arguments that do not fit, one way or another."""
    big = rng.choice(runner.EXTREME)
    sampled = [[1]] * b
    kind = rng.randrange(14)
    if kind == 0:
        L = lens.copy()
        if b:
            L[rng.randrange(b)] = tok.shape[1] + rng.randrange(1, 5)
        return sampled, L, tok
    if kind == 1:
        L = lens.astype(object)
        if b:
            L[rng.randrange(b)] = big
        try:
            return sampled, np.array(L.tolist()), tok
        except OverflowError:
            return sampled, L, tok
    if kind == 2:
        return sampled, lens, tok.astype(rng.choice([np.float32, np.float64, object, bool]))
    if kind == 3:
        return sampled, lens.astype(rng.choice([np.float64, object, np.uint64])), tok
    if kind == 4:
        return sampled, lens, [[1, 2.5], [3]]  # ragged, floats
    if kind == 5:
        return sampled, lens, [["a", "b"]] * max(b, 1)
    if kind == 6:
        return [rng.choice([1, None, 2.5, "ab", b"x"]) for _ in range(max(b, 1))], lens, tok
    if kind == 7:
        return sampled, lens, _BadTensor()
    if kind == 8:
        return sampled, _BadTensor(), tok
    if kind == 9:
        return sampled, lens, tok.reshape(-1)  # 1-D
    if kind == 10:
        return sampled + [[1]], lens, tok[: max(b - 1, 0)]  # more batch rows than rows
    if kind == 11:
        return sampled, lens[: max(b - 1, 0)], tok  # fewer lengths than rows
    if kind == 12:
        return "not a list", lens, tok
    return sampled, lens.reshape(-1, 1) if b else lens, tok.reshape(1, -1, 1)


def _check(runner, p, sampled, lens, tok, out, exact):
    K = p.num_speculative_tokens
    cap = p.max_model_len
    if type(out) is not list or len(out) != len(sampled):
        raise runner.Failure(f"propose returned {type(out).__name__} of {len(out)} for {len(sampled)} rows")
    for i, d in enumerate(out):
        L = int(lens[i])
        limit = K if cap is None else max(min(K, cap - L), 0)
        if type(d) is not list or len(d) > limit or any(type(t) is not int for t in d):
            raise runner.Failure(f"row {i}: draft {d!r} is not a list of at most {limit} ints")
        if not exact:
            continue
        if not sampled[i] or L == 0 or (cap is not None and L >= cap) or K == 0:
            want = []
        else:
            want = p.rescan(np.asarray(tok[i, :L], dtype=np.int64), limit)
        if d != want:
            raise runner.Failure(f"{p!r}: row {i} ({L} tokens) drafted {d}, a fresh index {want}")


_ROW_T, _ROW_S = 8, 7  # a proposer's tail and spread
#: the positions of steady_rows' array arguments, and of its integer ones
_ROW_ARRAYS = (1, 2, 3, 4, 5, 6, 7, 8, 13, 14)
_ROW_INTS = (9, 10, 11, 12)
_LAYOUTS = ("list", "strided", "reversed", "fortran", "0d", "ndim+", "ndim-", "int32", "uint64", "int64", "float64",
            "object", "byteswap", "unaligned", "subclass", "short", "empty", "none")


class _Sub(np.ndarray):
    pass


class _Index:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def _steady_args(rng, b, width, dtype):
    """steady_rows' arguments for a batch of ``b`` rows every one of which is steady."""
    g = np.random.default_rng(rng.randrange(2**32))
    T, S = _ROW_T, _ROW_S
    tok = g.integers(0, 4, size=(b + 1, width)).astype(dtype)
    n_old = g.integers(T + 1, width - 4, size=b + 1).astype(np.int64)
    L = n_old + g.integers(1, 4, size=b + 1)
    sampled = [tok[r, n_old[r] : L[r]].tolist() for r in range(b)]
    tail = np.ascontiguousarray(np.stack([tok[r, n_old[r] - T : n_old[r]] for r in range(b + 1)]).T.astype(np.int64))
    anc = g.integers(-2, width, size=b + 1).astype(np.int64)
    spos = np.ascontiguousarray(g.integers(0, width, size=(b + 1, S)).T)
    spread = np.ascontiguousarray(np.stack([tok[r, spos[:, r]] for r in range(b + 1)]).T.astype(np.int64))
    mul = np.array([int(g.integers(0, 2**62)) * 2 + 1 for _ in range(3)], dtype=np.uint64)
    return [sampled, L, tok, n_old, n_old.copy(), tail, spos, spread, anc, rng.randrange(3), rng.randrange(1, 4),
            rng.choice([0, 5, T]), rng.choice([2**62, width + 1, width]), np.zeros(0, dtype=np.uint64), mul]


def _wrapped(v, dtype):
    """``v`` as an array of ``dtype`` stores it: wrapped, as C wraps."""
    u = np.array([v % 2**64], dtype=np.uint64)
    return (u.view(np.int64) if np.dtype(dtype).kind == "i" else u).astype(dtype)[0]


def _relayout(rng, a, kind):
    if kind == "list":
        return a.tolist()
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
    if kind in ("int32", "uint64", "int64", "float64", "object"):
        return a.astype(kind)
    if kind == "byteswap":
        return a.astype(a.dtype.newbyteorder())
    if kind == "unaligned":
        u = np.zeros(a.nbytes + 1, dtype=np.uint8)[1:].view(a.dtype).reshape(a.shape)
        u[...] = a
        return u
    if kind == "subclass":
        return a.view(_Sub)
    if kind == "short":
        k = rng.randrange(3)
        return a[:k].copy() if a.ndim == 1 or rng.random() < 0.5 else a[:, :k].copy()
    if kind == "empty":
        return a[..., :0].copy()
    return None


def _hostile_rows_call(runner, rng, b, width, dtype):
    """A steady batch, then extreme values put into one to three arguments."""
    args = _steady_args(rng, b, width, dtype)
    big = runner.EXTREME
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(6)
        if kind == 0:  # an integer argument: extreme, or not an integer
            args[rng.choice(_ROW_INTS)] = rng.choice(big + [1.5, None, "3", np.float64(2.0), np.uint64(2**64 - 1),
                                                            _Index(rng.choice(big)), np.True_])
        elif kind == 1:  # remembered lengths near 2**63, num_tokens their int64-wrapped sum
            r = rng.randrange(b)
            n0 = rng.choice([runner.I64, runner.I64 - 1, runner.I64 - 2, runner.I64 - 7, 2**62, runner.I64MIN, -1])
            L, n_old, seen = args[1], args[3], args[4]
            if all(isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind == "i" and len(x) > r for x in (L, n_old, seen)):
                n_old[r] = _wrapped(n0, n_old.dtype)
                seen[r] = _wrapped(n0, seen.dtype)
                L[r] = _wrapped(n0 + len(args[0][r]), L.dtype)
        elif kind in (2, 3):  # an extreme value inside an array
            at = rng.choice(_ROW_ARRAYS)
            a = args[at]
            if isinstance(a, np.ndarray) and a.ndim in (1, 2) and a.size and a.dtype.kind in "iu" and a.flags.writeable:
                a[tuple(rng.randrange(d) for d in a.shape)] = _wrapped(rng.choice(big), a.dtype)
                if at == 13:
                    a.sort()  # the pool is sorted
            elif at == 13:
                args[13] = np.sort(np.array([v % 2**64 for v in rng.sample(big, 3)], dtype=np.uint64))
        elif kind == 4:  # an array in another layout, dtype or shape
            at = rng.choice(_ROW_ARRAYS)
            a = args[at]
            if type(a) is np.ndarray and a.ndim in (1, 2) and a.dtype.kind in "iu":  # (not twice)
                args[at] = _relayout(rng, a, rng.choice(_LAYOUTS))
        elif isinstance(args[0], list):  # sampled's rows
            r = rng.randrange(b)
            if rng.random() < 0.5:
                args[0][r] = rng.choice([[], (1,), np.array([1])])
            else:
                args[0] = tuple(args[0])
    return args


def _rows_extremes(runner, impl, rng):
    """steady_rows called directly with extreme arguments: no crash, and on the compiled
    kernel the twin's answer (or the twin's exception type)."""
    kern = impl["rows"].steady_rows
    for _ in range(20):
        b = rng.randrange(1, 6)
        args = _hostile_rows_call(runner, rng, b, rng.choice([24, 60]), rng.choice([np.int32, np.int64]))
        got = runner.attempt(kern, *args)
        if impl.kind != "compiled":
            continue
        want = runner.attempt(impl.twin["rows"].steady_rows, *args)
        if got[0] != want[0] or (got[0] == "err" and got[1] is not want[1]) or (
                got[0] == "ok" and runner.canon(got[1]) != runner.canon(want[1])):
            raise runner.Failure(f"rows.steady_rows gave {runner.short(got)}, the twin {runner.short(want)}; "
                                 f"arguments {runner.short(args, 2000)}")


def scenario_vllm_rows(runner, impl, rng, seconds):
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        _rows_extremes(runner, impl, rng)
        p = _proposer(impl, rng)
        exact = p.verify == "full"
        batch = _Batch(rng, rng.choice([2, 3, 50]), rng.choice([60, 400]))
        for _ in range(rng.randrange(5, 40)):
            n += 1
            for _ in range(rng.randrange(3)):
                batch.move()
            sampled = batch.grow()
            lens, tok = batch.arrays(rng.choice([0, 0, 1, 5]), rng.choice([np.int32, np.int64]), rng.random() < 0.5)
            if rng.random() < 0.3 and tok.shape[1]:
                tok = tok[:, : int(lens.max()) if lens.size else 0]  # a strided view, as narrow as it can be
            if rng.random() < 0.3:  # a refused call first: it must leave nothing behind
                b = len(sampled)
                runner.attempt(p.propose, *_bad_call(runner, rng, b, lens, tok))
            got = runner.attempt(p.propose, sampled, lens, tok)
            if got[0] == "err":
                raise runner.Failure(
                    f"{p!r} refused a well-formed call ({got[1].__name__}): rows {[len(h) for h in batch.rows]}, "
                    f"token_ids_cpu {tok.shape} {tok.dtype}"
                )
            _check(runner, p, sampled, lens, tok, got[1], exact)
            if rng.random() < 0.05:
                p.reset()
    return n


def scenario_vllm_threads(runner, impl, rng, seconds):
    rows, width = 24, 400
    gen = np.random.default_rng(rng.randrange(2**32))
    tok = gen.integers(0, 6, size=(rows, width)).astype(rng.choice([np.int32, np.int64]))
    good_tok = tok.copy()
    lens = np.array([rng.randrange(130, 300) for _ in range(rows)], dtype=np.int64)
    good_lens = lens.copy()
    sampled = [[1] for _ in range(rows)]
    shared = [_proposer(impl, random.Random(rng.randrange(2**32)), verify=v) for v in ("sparse", "full")]
    stop = threading.Event()

    def caller(seed):
        r = random.Random(seed)

        def body():
            p = r.choice(shared)
            out = p.propose(sampled, lens, tok)
            if type(out) is not list:
                raise runner.Failure(f"propose returned {type(out).__name__}")
            if r.random() < 0.3:  # a narrower, strided view of the same memory
                p.propose(sampled, lens, tok[:, : r.randrange(1, width)])
            if r.random() < 0.02:
                p.reset()

        return body

    def lists(seed):
        r = random.Random(seed)

        def body():
            if r.random() < 0.5 and len(sampled) > 1:
                sampled.pop()
                sampled.append([])
            else:
                sampled[r.randrange(len(sampled))] = r.choice([[1], [], [2, 3], [4, 5, 6]])
            if len(sampled) < rows:
                sampled.append([1])

        return body

    bodies = [runner.toggler(tok, good_tok, random.Random(rng.randrange(2**32))),
              runner.toggler(lens, good_lens, random.Random(rng.randrange(2**32))),
              lists(rng.randrange(2**32))]
    bodies += [caller(rng.randrange(2**32)) for _ in range(3)]
    runner.run_threads(bodies, seconds, stop)
    # the arrays valid again: the exact proposer drafts what a fresh index drafts
    tok[...] = good_tok
    lens[...] = good_lens
    sampled[:] = [[1] for _ in range(rows)]
    full = shared[1]
    for step in range(3):
        out = full.propose(sampled, lens, tok)
        _check(runner, full, sampled, lens, tok, out, exact=True)
        for i in range(rows):
            if lens[i] < width:
                lens[i] += 1
    return 1
