# cython: language_level=3
"""The recycling table: tree drafts from the target's own earlier predictions (compiled).

Same names, behaviour, results and messages as the twin
``specfsm.drafting._recycling_py``, whose module docstring states the rule (the table,
``update``, the tree's shape, the tree); both take their argument checks from
``specfsm.drafting._tree_checks``, and the rank weights of the shape are read from there
at import into a C array.

Layout: one ``vocab_size x k`` block of int32 ids (malloc'd in ``__init__``), row ``t``
at ``t * k``, its ids first and -1s after them. ``update`` writes the rows in order, so
the last row of a repeated token is the one that stays. The shape is grown best-first
with a binary heap of slots keyed by (score, creation order), exactly the twin's
``heapq`` order; a tree then walks the shape's slots once, reading one id per slot.
``propose_trees`` computes the shape once per call and grows every root's tree along it.

Thread safety: the shared guard protocol (``_core/common/_guard.pxd``). ``update`` holds
the writer flag around its loop (run without the GIL); ``filled``, ``row``, pickling and
``propose_trees`` count themselves as readers; ``propose_tree`` and the properties only
check, and run no Python code between the check and their read. An object made with
``__new__``, or whose ``__init__`` failed, refuses every call.
"""

import numpy as np

from specfsm.drafting._tree_checks import (
    DEFAULT_RECYCLE_K,
    MAX_RECYCLE_K,
    MAX_TREE_NODES,
    RANK_WEIGHTS,
    check_last,
    check_lasts,
    check_updates,
    check_rows,
    check_shape_args,
    check_table_args,
    check_tree_args,
    check_update,
)

cimport cython
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

cimport numpy as cnp
from _guard cimport (guard_t, GUARD_READY, guard_begin_init, guard_end_init, guard_check, guard_hold,
                     guard_self, guard_read, guard_done_read, guard_write, guard_done_write)

cnp.import_array()  # the result arrays are made with the C API

__all__ = ["RecyclingTable", "tree_shape"]

NAME = "RecyclingTable"   # the guard's refusals name the class
WHAT = "a RecyclingTable"   # ... and a method called unbound names an instance

cdef enum:
    MAX_K = 32            # = _tree_checks.MAX_RECYCLE_K
    MAX_NODES = 1024      # = _tree_checks.MAX_TREE_NODES

if (MAX_RECYCLE_K, MAX_TREE_NODES, len(RANK_WEIGHTS)) != (MAX_K, MAX_NODES, MAX_K):
    raise ImportError("recycling.pyx's limits differ from specfsm.drafting._tree_checks'")

cdef double WEIGHTS[MAX_K]   # RANK_WEIGHTS, read once
cdef int _wi
for _wi in range(MAX_K):
    WEIGHTS[_wi] = RANK_WEIGHTS[_wi]


# ------------------------------------------------------------------------------------
# the shape: best-first over (score, creation order)
# ------------------------------------------------------------------------------------
ctypedef struct slot_t:
    double score
    int32_t seq            # creation order (the tie-break)
    int32_t parent         # the parent slot, -1: the root
    int32_t rank
    int32_t depth          # the root's children: 1


cdef inline bint _before(const slot_t* a, const slot_t* b) noexcept nogil:
    return a.score > b.score or (a.score == b.score and a.seq < b.seq)


cdef inline void _push(slot_t* h, int64_t* n, slot_t s) noexcept nogil:
    cdef int64_t i = n[0], up
    n[0] = i + 1
    while i > 0:
        up = (i - 1) >> 1
        if not _before(&s, &h[up]):
            break
        h[i] = h[up]
        i = up
    h[i] = s


cdef inline slot_t _pop(slot_t* h, int64_t* n) noexcept nogil:
    cdef slot_t top = h[0]
    cdef int64_t size = n[0] - 1, i = 0, c
    cdef slot_t last = h[size]
    n[0] = size
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _before(&h[c + 1], &h[c]):
            c += 1
        if not _before(&h[c], &last):
            break
        h[i] = h[c]
        i = c
    if size:
        h[i] = last
    return top


cdef int64_t _shape(int64_t budget, int64_t max_depth, int64_t width, int32_t* parents,
                    int32_t* ranks) noexcept nogil:
    """The shape's slots in the order they are taken (at most ``budget``; checked limits)
    into ``parents`` and ``ranks``; -1 when out of memory."""
    cdef slot_t* h = <slot_t*>malloc(<size_t>(width * (budget + 1)) * sizeof(slot_t))
    cdef int64_t n = 0, taken = 0, r
    cdef int32_t seq = 0
    cdef slot_t s, c
    if h == NULL:
        return -1
    for r in range(width):
        s.score = WEIGHTS[r]
        s.seq = seq
        s.parent = -1
        s.rank = <int32_t>r
        s.depth = 1
        _push(h, &n, s)
        seq += 1
    while n and taken < budget:
        s = _pop(h, &n)
        parents[taken] = s.parent
        ranks[taken] = s.rank
        if s.depth < max_depth:
            for r in range(width):
                c.score = s.score * WEIGHTS[r]
                c.seq = seq
                c.parent = <int32_t>taken
                c.rank = <int32_t>r
                c.depth = s.depth + 1
                _push(h, &n, c)
                seq += 1
        taken += 1
    free(h)
    return taken


cdef int64_t _shape_of(int64_t budget, int64_t max_depth, int64_t width, int32_t* parents,
                       int32_t* ranks) except -1:
    cdef int64_t ns
    with nogil:
        ns = _shape(budget, max_depth, width, parents, ranks)
    if ns < 0:
        raise MemoryError()
    return ns


def tree_shape(budget, max_depth, width):
    cdef int64_t b, d, w, ns, i
    cdef int32_t parents[MAX_NODES]
    cdef int32_t ranks[MAX_NODES]
    b, d, w = check_shape_args(budget, max_depth, width)
    ns = _shape_of(b, d, w, parents, ranks)
    return [parents[i] for i in range(ns)], [ranks[i] for i in range(ns)]


# ------------------------------------------------------------------------------------
# the tree along the shape, and the rows' update
# ------------------------------------------------------------------------------------
cdef int64_t _grow(const int32_t* tab, int64_t k, int64_t root, const int32_t* sp,
                   const int32_t* sr, int64_t ns, int32_t* node, int64_t* toks,
                   int64_t* pars) noexcept nogil:
    """The tree after ``root`` along the shape's ``ns`` slots: nodes written to ``toks``
    and ``pars`` (room for ``ns``), their count returned; ``node`` (room for ``ns``) maps
    each slot to its node, -1 when not kept."""
    cdef int64_t i, n = 0, pt
    cdef int32_t ps, pn, t
    if tab[root * k] < 0:          # an empty row: no slot is kept
        return 0
    for i in range(ns):
        ps = sp[i]
        if ps < 0:
            pn = -1
            pt = root
        else:
            pn = node[ps]
            if pn < 0:
                node[i] = -1
                continue
            pt = toks[pn]
        t = tab[pt * k + sr[i]]
        if t < 0:
            node[i] = -1
            continue
        node[i] = <int32_t>n
        toks[n] = t
        pars[n] = pn
        n += 1
    return n


cdef void _write_rows(int32_t* tab, int64_t k, const int64_t* t, const int64_t* x, int64_t n,
                      int64_t m) noexcept nogil:
    """Each row ``i`` (checked ids) replaces row ``t[i]`` with its distinct ids in order, at
    most ``k``, padded with -1; rows in order, so a repeated token keeps its last row."""
    cdef int64_t i, j, q, cnt
    cdef int32_t v
    cdef int32_t* row
    cdef const int64_t* src
    for i in range(n):
        row = tab + t[i] * k
        src = x + i * m
        cnt = 0
        for j in range(m):
            v = <int32_t>src[j]
            for q in range(cnt):
                if row[q] == v:
                    break
            else:
                row[cnt] = v
                cnt += 1
                if cnt == k:
                    break
        for q in range(cnt, k):
            row[q] = -1


cdef inline object _int64_array(const int64_t* src, int64_t n):
    cdef cnp.npy_intp dims = n
    a = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
    if n:
        memcpy(cnp.PyArray_DATA(<cnp.ndarray>a), src, n * sizeof(int64_t))
    return a


cdef inline int64_t* _int64_data(object a) noexcept:
    return <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline bint _plain_limit(object x):
    """``x`` is a plain int in 1..MAX_NODES (what ``check_tree_args`` returns as it is)."""
    return type(x) is int and 1 <= x <= MAX_NODES


cdef inline int _check_self(object o) except -1:
    return guard_self(o, RecyclingTable, NAME, WHAT)


# ------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------
@cython.embedsignature(False)   # the signature heads the docstring (__text_signature__)
cdef class RecyclingTable:
    """RecyclingTable(vocab_size, k=8)
--

    For every token id, the ids the target ranked highest after it when it was last
    evaluated (Token Recycling's adjacency table, ``vocab_size x k`` int32 ids: 4 bytes
    each), fed from every forward's top-k (``update``) and shared by all the requests of
    one model; ``propose_tree`` / ``propose_trees`` grow tree drafts from it (the rule:
    ``specfsm.drafting._recycling_py``). Refuses bad settings and bad rows with
    TypeError or ValueError naming the argument, changing nothing; a call on an object
    being changed by another thread is refused with RuntimeError, and one made with
    ``__new__`` (or whose ``__init__`` failed) refuses every call.
    """

    cdef int32_t* _tab          # vocab_size * k ids, -1: empty
    cdef int64_t _vocab, _k
    cdef object _updates        # a Python int, as the twin's (a restored count may be any int)
    cdef guard_t _g             # the shared guard protocol (_core/common/_guard.pxd)

    def __cinit__(self):
        self._tab = NULL            # (the guard is zeroed: UNINIT)

    def __init__(self, vocab_size, k=DEFAULT_RECYCLE_K):
        guard_begin_init(&self._g, NAME)    # a second __init__ is refused, changing nothing
        v, kk = check_table_args(vocab_size, k)
        self._tab = <int32_t*>malloc(<size_t>v * <size_t>kk * sizeof(int32_t))
        if self._tab == NULL:
            raise MemoryError(f"cannot allocate a {NAME} of {v} x {kk} ids")
        memset(self._tab, 0xFF, <size_t>v * <size_t>kk * sizeof(int32_t))   # every id -1
        self._vocab = v
        self._k = kk
        self._updates = 0
        guard_end_init(&self._g)

    def __dealloc__(self):
        free(self._tab)

    def _hold_guard(self, on):
        """Tests only: ``guard_hold`` (``_core/common/_guard.pxd``) on this table's guard."""
        _check_self(self)
        guard_hold(&self._g, NAME, on)

    @property
    def vocab_size(self):
        """The token ids the table has a row for: ``0..vocab_size - 1``."""
        guard_check(&self._g, NAME)
        return self._vocab

    @property
    def k(self):
        """The most ids a row keeps."""
        guard_check(&self._g, NAME)
        return self._k

    @property
    def nbytes(self):
        """The table's memory: ``vocab_size * k * 4`` bytes."""
        guard_check(&self._g, NAME)
        return self._vocab * self._k * 4

    @property
    def updates(self):
        """The rows ``update`` has taken so far (every row counted, a repeated token too)."""
        guard_check(&self._g, NAME)
        return self._updates

    def filled(self):
        cdef int64_t i, n = 0
        _check_self(self)
        guard_read(&self._g, NAME)
        try:
            with nogil:
                for i in range(self._vocab):
                    if self._tab[i * self._k] >= 0:
                        n += 1
        finally:
            guard_done_read(&self._g)
        return n

    def row(self, token):
        cdef int64_t t, n = 0
        cdef int64_t ids[MAX_K]
        _check_self(self)
        guard_check(&self._g, NAME)
        t = check_last(token, self._vocab, "token")
        guard_read(&self._g, NAME)
        try:
            while n < self._k and self._tab[t * self._k + n] >= 0:
                ids[n] = self._tab[t * self._k + n]
                n += 1
            return _int64_array(ids, n)
        finally:
            guard_done_read(&self._g)

    def update(self, tokens, topk):
        cdef int64_t n, m
        _check_self(self)
        guard_check(&self._g, NAME)
        t, x = check_update(tokens, topk, self._vocab)   # fresh arrays, every id checked
        n = t.shape[0]
        m = x.shape[1]
        cdef const int64_t[::1] tv = t
        cdef const int64_t[:, ::1] xv = x
        guard_write(&self._g, NAME)
        try:
            if n:
                with nogil:
                    _write_rows(self._tab, self._k, &tv[0], &xv[0, 0], n, m)
            self._updates = self._updates + n
        finally:
            guard_done_write(&self._g)

    cdef int64_t _width(self, object max_width, int64_t w) noexcept:
        return self._k if max_width is None or w > self._k else w

    def propose_tree(self, last, budget, max_depth=None, max_width=None):
        cdef int64_t root, b, d, w, ns, n
        cdef int32_t sp[MAX_NODES]
        cdef int32_t sr[MAX_NODES]
        cdef int32_t node[MAX_NODES]
        cdef int64_t toks[MAX_NODES]
        cdef int64_t pars[MAX_NODES]
        _check_self(self)
        guard_check(&self._g, NAME)
        if (type(last) is int and 0 <= last < self._vocab and _plain_limit(budget)
                and (max_depth is None or _plain_limit(max_depth))
                and (max_width is None or _plain_limit(max_width))):
            root = last     # the common call: plain ints in range or None, no Python code runs
            b = budget
            d = b if max_depth is None else max_depth
            w = self._width(max_width, 0 if max_width is None else max_width)
        else:
            root = check_last(last, self._vocab)
            b, d, w = check_tree_args(budget, max_depth, max_width)   # may run Python code
            w = self._width(max_width, w)
        ns = _shape_of(b, d, w, sp, sr)
        guard_check(&self._g, NAME)   # then nothing runs Python code until the tree is built
        n = _grow(self._tab, self._k, root, sp, sr, ns, node, toks, pars)
        return _int64_array(toks, n), _int64_array(pars, n)

    def propose_trees(self, lasts, budget, max_depth=None, max_width=None):
        cdef int64_t b, d, w, ns, nr, i, total = 0, cap
        cdef int32_t sp[MAX_NODES]
        cdef int32_t sr[MAX_NODES]
        cdef int32_t node[MAX_NODES]
        _check_self(self)
        guard_check(&self._g, NAME)
        roots = check_lasts(lasts, self._vocab)   # a fresh int64 array, every root checked
        b, d, w = check_tree_args(budget, max_depth, max_width)
        w = self._width(max_width, w)
        ns = _shape_of(b, d, w, sp, sr)
        nr = roots.shape[0]
        cdef const int64_t[::1] rv = roots
        cdef cnp.npy_intp dims = nr + 1
        off = cnp.PyArray_ZEROS(1, &dims, cnp.NPY_INT64, 0)
        cdef int64_t* ov = _int64_data(off)
        cap = nr * ns
        if cap > (1 << 20):
            cap = 1 << 20    # grown by doubling (the trees of a sparse table are small)
        dims = cap
        a = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
        p = cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)
        cdef int64_t* at = _int64_data(a)
        cdef int64_t* pt = _int64_data(p)
        i = 0
        guard_read(&self._g, NAME)
        try:
            while True:
                with nogil:
                    while i < nr and total + ns <= cap:
                        total += _grow(self._tab, self._k, rv[i], sp, sr, ns, node, at + total, pt + total)
                        i += 1
                        ov[i] = total
                if i >= nr:
                    break
                cap = 2 * cap if 2 * cap >= total + ns else total + ns
                a.resize(cap, refcheck=False)
                p.resize(cap, refcheck=False)
                at = _int64_data(a)
                pt = _int64_data(p)
        finally:
            guard_done_read(&self._g)
        if total < cap:
            a.resize(total, refcheck=False)
            p.resize(total, refcheck=False)
        return a, p, off

    def __repr__(self):
        if self._g.phase != GUARD_READY:
            return f"{NAME}(<not initialised or unusable>)"
        return f"{NAME}(vocab_size={self._vocab}, k={self._k})"

    def __reduce__(self):
        # pickled (and copied) as its settings, its rows and its update count
        cdef cnp.npy_intp dims[2]
        _check_self(self)
        guard_read(&self._g, NAME)   # the copy may let other threads run
        try:
            dims[0] = self._vocab
            dims[1] = self._k
            rows = cnp.PyArray_EMPTY(2, dims, cnp.NPY_INT32, 0)
            memcpy(cnp.PyArray_DATA(<cnp.ndarray>rows), self._tab,
                   <size_t>self._vocab * <size_t>self._k * sizeof(int32_t))
            return _rebuild, (type(self), self._vocab, self._k, rows, self._updates)
        finally:
            guard_done_read(&self._g)


def _rebuild(cls, vocab, k, table, updates):
    cdef RecyclingTable t
    if not (isinstance(cls, type) and issubclass(cls, RecyclingTable)):
        raise TypeError(f"cannot rebuild a {NAME} as {cls!r}")
    t = cls(vocab, k)
    guard_check(&t._g, NAME)   # a subclass whose __init__ did not run is refused here
    rows = np.ascontiguousarray(check_rows(table, t._vocab, t._k), dtype=np.int32)
    count = check_updates(updates)
    guard_write(&t._g, NAME)
    try:
        memcpy(t._tab, cnp.PyArray_DATA(<cnp.ndarray>rows), <size_t>t._vocab * <size_t>t._k * sizeof(int32_t))
        t._updates = count
    finally:
        guard_done_write(&t._g)
    return t
