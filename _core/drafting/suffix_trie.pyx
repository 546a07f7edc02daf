# cython: language_level=3
"""A counted suffix trie of bounded depth: drafts from how often each continuation
recurred (compiled).

Same names, behaviour, results and messages as the twin
``specfsm.drafting._suffix_trie_py``, whose module docstring states the rule (counts,
best children, ``speculate``'s scoring, ``nbytes``); both take their argument checks from
``specfsm.drafting._checks``.

Layout (``trie_t``): node arrays indexed by node number, the root 0 and the nodes 1..n
in the order they were created: token (int64), count (int64), parent (int32) and best
child (int32, -1: none), each of ``capacity + 1`` entries (the root's too); and an
open-addressing hash table of ``2 * capacity`` int32 node numbers (0: empty, as the root
is nobody's child) keyed by (parent, token), compared through the node arrays, probed
linearly. The capacity starts at 64 and doubles when a node would not fit (the twin's
rule, so ``nbytes`` is the same); the table is rebuilt from the node arrays then, its
load never above one half. Each open sequence keeps its open suffixes (at most
``depth - 1`` node numbers, by length) in a small bytearray of a dict keyed by the
sequence, created before a call's loop, so a loop that ends writes them back in place.

Arguments: the usual ones (a plain int key; tokens and contexts of at most 256 plain
ints in a list or tuple, or in a native int32/int64 array; plain ints and floats the
checks take as ``max_k``, ``factor`` and ``min_prob``) are read in C into memory of the
call's own (``fast_len``/``fast_read`` of ``_core/common/_arrays.pxd``); anything else
goes through the checks of ``specfsm.drafting._checks``, which raise the one message.

Thread safety: the shared guard protocol (``_core/common/_guard.pxd``). ``extend`` and
``close`` convert their arguments, then hold the writer flag; ``extend``'s loop runs
without the GIL (unless short: under 256 tokens x depth), and a node array that fails to
grow part way breaks the trie (every later call refused). ``speculate`` checks the guard,
converts, then counts itself a reader around its loop (without the GIL). Properties
check the guard and read at once. A trie made with ``__new__``, or whose ``__init__``
failed, refuses every call.

Batches (``extend_tries``, ``speculate_tries``): every argument converted into memory
of the call's own first (read in C when it is a usual one: a list or tuple of tries of
exactly this class, keys, tokens, offsets and limits as ``fast_read`` takes them and
held to their contract, plain numbers; else through the checks); then, in one loop
that runs no Python code unless it refuses, each distinct trie (by identity, in order
of first appearance; a trie of ``others`` that is also a row's counts once) takes its
guard once, a writer's or a reader's, all or nothing (``_take_guards``).
``extend_tries`` checks every trie's room for all its tokens and makes the storage of
each sequence it opens before anything changes, then runs the rows in order over an
array of ``row_t`` (trie, tokens, open suffixes) without the GIL (unless short, as
``extend``); ``speculate_tries`` reads each row's longest open suffix node with the
GIL, then walks the tails and drafts without it (unless under 16 drafts), and builds
its lists once the guards are given back (always in a ``finally``).
"""

import numpy as np

from specfsm._checks import ragged, token_ids
from specfsm.drafting._checks import (
    MAX_TRIE_DEPTH,
    MAX_TRIE_NODES,
    TRIE_NODE_BYTES,
    check_batch_limits,
    check_trie_args,
    check_trie_draft,
    check_trie_list,
    check_trie_room,
    check_trie_rows,
    check_trie_seq,
    check_trie_speculate,
)

cimport cython
cimport numpy as cnp
from libc.math cimport isfinite
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.ref cimport PyObject

from _arrays cimport array_data, fast_len, fast_read
from _offsets cimport longest_row
from _guard cimport (guard_t, GUARD_READY, guard_begin_init, guard_break, guard_end_init, guard_check,
                     guard_hold, guard_self, guard_read, guard_done_read, guard_write, guard_done_write)

cnp.import_array()   # (the fast readers use the C API)

__all__ = ["SuffixTrie", "extend_tries", "speculate_tries"]

NAME = "SuffixTrie"   # the guard's refusals name the class
WHAT = "a SuffixTrie"   # ... and a method called unbound names an instance

cdef enum:
    MAX_DEPTH = 64          # = _checks.MAX_TRIE_DEPTH
    FIRST_CAPACITY = 64     # the twin's FIRST_CAPACITY
    NODE_BYTES = 32         # = _checks.TRIE_NODE_BYTES
    FAST_MAX = 256          # the most entries of an argument the fast path reads
    NOGIL_WORK = 256        # tokens x depth from which extend releases the GIL
    NOGIL_ROWS = 16         # drafts (rows x tries each) from which speculate_tries releases it

if (MAX_TRIE_DEPTH, TRIE_NODE_BYTES) != (MAX_DEPTH, NODE_BYTES) or MAX_TRIE_NODES >= 2**31:
    raise ImportError("suffix_trie.pyx's limits differ from specfsm.drafting._checks'")


# ------------------------------------------------------------------------------------
# the trie in C
# ------------------------------------------------------------------------------------
ctypedef struct trie_t:
    int64_t* tok        # per node: its last token (the root: -1)
    int64_t* cnt        # per node: its occurrences (the root: the tokens fed)
    int32_t* par        # per node: its parent (the root: -1)
    int32_t* best       # per node: its best child (-1: none)
    int32_t* slots      # 2 * cap node numbers, 0: empty
    int64_t n           # nodes, the root not counted
    int64_t cap         # node capacity (the twin's rule)
    uint64_t mask       # 2 * cap - 1
    int32_t depth
    bint last           # ties="last"


cdef inline uint64_t _slot(int64_t parent, int64_t t) noexcept nogil:
    """Where the probe for (parent, token) starts (before the mask)."""
    cdef uint64_t x = <uint64_t>t * <uint64_t>0x9E3779B97F4A7C15ULL + <uint64_t>parent
    x ^= x >> 31
    x *= <uint64_t>0xD6E8FEB86659FD93ULL
    x ^= x >> 32
    return x


cdef inline int32_t _find(const trie_t* tr, int32_t parent, int64_t t) noexcept nogil:
    """The node of token ``t`` under ``parent``, or 0 when there is none."""
    cdef uint64_t h = _slot(parent, t) & tr.mask
    cdef int32_t nd
    while True:
        nd = tr.slots[h]
        if nd == 0 or (tr.par[nd] == parent and tr.tok[nd] == t):
            return nd
        h = (h + 1) & tr.mask


cdef inline void _place(int32_t* slots, uint64_t mask, int32_t parent, int64_t t, int32_t nd) noexcept nogil:
    cdef uint64_t h = _slot(parent, t) & mask
    while slots[h] != 0:
        h = (h + 1) & mask
    slots[h] = nd


cdef int _alloc(trie_t* tr, int64_t cap) noexcept nogil:
    """Node arrays of ``cap + 1`` entries (grown in place, their contents kept) and a
    hash table of ``2 * cap`` slots rebuilt from them; 0, or -1 when out of memory (the
    trie then as it was, its arrays perhaps larger)."""
    cdef size_t m = <size_t>cap + 1
    cdef int32_t* slots = <int32_t*>calloc(2 * <size_t>cap, sizeof(int32_t))
    cdef void* p
    cdef int64_t i
    if slots == NULL:
        return -1
    p = realloc(tr.tok, m * sizeof(int64_t))
    if p != NULL:
        tr.tok = <int64_t*>p
        p = realloc(tr.cnt, m * sizeof(int64_t))
    if p != NULL:
        tr.cnt = <int64_t*>p
        p = realloc(tr.par, m * sizeof(int32_t))
    if p != NULL:
        tr.par = <int32_t*>p
        p = realloc(tr.best, m * sizeof(int32_t))
    if p == NULL:
        free(slots)
        return -1
    tr.best = <int32_t*>p
    for i in range(1, tr.n + 1):
        _place(slots, 2 * <uint64_t>cap - 1, tr.par[i], tr.tok[i], <int32_t>i)
    free(tr.slots)
    tr.slots = slots
    tr.cap = cap
    tr.mask = 2 * <uint64_t>cap - 1
    return 0


cdef inline int32_t _count(trie_t* tr, int32_t parent, int64_t t) noexcept nogil:
    """Count one occurrence of ``t`` under ``parent`` (the node made if new), its
    parent's best child updated; the node, or -1 when out of memory (nothing changed)."""
    cdef int32_t c = _find(tr, parent, t), b
    if c == 0:
        if tr.n == tr.cap and _alloc(tr, 2 * tr.cap) < 0:
            return -1
        tr.n += 1
        c = <int32_t>tr.n
        tr.tok[c] = t
        tr.cnt[c] = 0
        tr.par[c] = parent
        tr.best[c] = -1
        _place(tr.slots, tr.mask, parent, t, c)
    tr.cnt[c] += 1
    b = tr.best[parent]
    if b < 0 or tr.cnt[c] > tr.cnt[b] or (tr.last and tr.cnt[c] == tr.cnt[b]):
        tr.best[parent] = c
    return c


cdef int64_t _extend(trie_t* tr, const int64_t* toks, int64_t n, int32_t* open_, int32_t* n_open) noexcept nogil:
    """Append ``n`` tokens to the sequence whose open suffixes (by length) are
    ``open_[:n_open]``, updated in place; the tokens appended (``n``, fewer when out of
    memory part way)."""
    cdef int32_t a[MAX_DEPTH]
    cdef int32_t b[MAX_DEPTH]
    cdef int32_t* grown = a
    cdef int32_t* out = b
    cdef int32_t* swap
    cdef int32_t c, j, m = n_open[0], k, keep = tr.depth - 1
    cdef int64_t i
    memcpy(grown, open_, m * sizeof(int32_t))
    for i in range(n):
        c = _count(tr, 0, toks[i])
        if c < 0:
            return i
        out[0] = c
        k = 1
        for j in range(m):     # (by length: the last child may be ``depth`` long)
            c = _count(tr, grown[j], toks[i])
            if c < 0:
                return i
            if k < keep:
                out[k] = c
                k += 1
        swap = grown
        grown = out
        out = swap
        m = k
        tr.cnt[0] += 1
    memcpy(open_, grown, m * sizeof(int32_t))
    n_open[0] = m
    return n


cdef int32_t _speculate(const trie_t* tr, const int64_t* ctx, int32_t L, int64_t max_k, double f,
                        double least, int64_t* draft, int32_t* n_draft, double* score) noexcept nogil:
    """The rule's ``speculate`` over the context's last ``L <= depth`` tokens ``ctx``:
    the draft kept in ``draft[:n_draft]`` (room for ``max_k <= depth``), its score, and
    its match length returned (0: none)."""
    cdef int64_t d[MAX_DEPTH]
    cdef int32_t m, i, nd, c, out_m = 0
    cdef int64_t k, n
    cdef double x, p, s
    n_draft[0] = 0
    score[0] = 0.0
    for m in range(1, L + 1):
        nd = 0
        for i in range(L - m, L):
            nd = _find(tr, nd, ctx[i])
            if nd == 0:
                break
        if nd == 0:
            break
        x = m * f
        k = max_k if (f == 0.0 or x >= <double>max_k) else <int64_t>x
        p = 1.0
        s = 0.0
        n = 0
        while n < k:
            c = tr.best[nd]
            if c < 0:
                break
            p = p * (<double>tr.cnt[c] / <double>tr.cnt[nd])
            if p < least:
                break
            d[n] = tr.tok[c]
            n += 1
            s += p
            nd = c
        if s >= score[0]:
            memcpy(draft, d, n * sizeof(int64_t))
            n_draft[0] = <int32_t>n
            score[0] = s
            out_m = m
    return out_m


cdef inline object _owned_int64(object a):
    """An owned int32/int64 array from ``token_ids`` as an int64 one."""
    return a if a.dtype == np.int64 else a.astype(np.int64)


cdef inline int _plain_int(object x, int64_t* out) except -1:
    """1 and ``x`` in ``out`` when ``x`` is an exact int within int64 (a sequence key as
    ``check_trie_seq`` returns it), else 0 (the general path decides). Runs no Python code."""
    cdef int ovf = 0
    if not PyLong_CheckExact(x):
        return 0
    out[0] = PyLong_AsLongLongAndOverflow(x, &ovf)
    return ovf == 0


cdef inline int _plain_real(object x, double* out) except -1:
    """1 and ``float(x)`` in ``out`` for an exact float, or an exact int of at most 2**53
    (converted exactly), else 0. Runs no Python code."""
    cdef int64_t v
    if PyFloat_CheckExact(x):
        out[0] = PyFloat_AS_DOUBLE(x)
        return 1
    if _plain_int(x, &v) and -(<int64_t>1 << 53) <= v <= (<int64_t>1 << 53):
        out[0] = <double>v
        return 1
    return 0


cdef int _fast_limits(object max_k, object factor, object min_prob, int64_t depth, int64_t* k, double* f,
                      double* least) except -1:
    """1 and what ``check_trie_speculate`` returns, for plain ints and floats it takes;
    else 0, for the general path to convert (and refuse) them. Runs no Python code."""
    cdef int64_t v
    cdef int ovf = 0
    if not PyLong_CheckExact(max_k):
        return 0
    v = PyLong_AsLongLongAndOverflow(max_k, &ovf)
    if ovf < 0 or (ovf == 0 and v < 0):
        return 0
    k[0] = depth if ovf > 0 or v > depth else v
    return _fast_draft(factor, min_prob, f, least)


cdef int _fast_draft(object factor, object min_prob, double* f, double* least) except -1:
    """1 and what ``check_trie_draft`` returns, for plain ints and floats it takes; else
    0. Runs no Python code."""
    if not (_plain_real(factor, f) and isfinite(f[0]) and f[0] >= 0.0):
        return 0
    return _plain_real(min_prob, least) and 0.0 <= least[0] <= 1.0


cdef inline int _check_self(object o) except -1:
    return guard_self(o, SuffixTrie, NAME, WHAT)


# ------------------------------------------------------------------------------------
# the class
# ------------------------------------------------------------------------------------
@cython.embedsignature(False)   # the signature heads the docstring (__text_signature__)
cdef class SuffixTrie:
    """SuffixTrie(depth=8, ties='first')
--

    Every suffix of at most ``depth`` tokens of the sequences fed to it, with how often
    each occurred, and drafts that follow the most frequent continuation of the longest
    contexts that occurred (Arctic's suffix decoding, with a bounded depth). ``ties`` is
    ``"first"`` or ``"last"``: which of two equally frequent continuations a draft takes
    (the one that reached that count first, or most recently). The rule:
    ``specfsm.drafting._suffix_trie_py``. Refuses bad settings and bad arguments with
    TypeError, ValueError or OverflowError naming the argument, changing nothing; a call on
    an object being changed by another thread is refused with RuntimeError, and one made
    with ``__new__`` (or whose ``__init__`` failed) refuses every call. Not picklable.
    """

    cdef trie_t _t
    cdef dict _open             # sequence -> bytearray: int32 count, then the open suffixes
    cdef guard_t _g             # the shared guard protocol (_core/common/_guard.pxd)
    cdef uint64_t _stamp        # the batch call that last took this trie's guard (_take_guards)
    cdef Py_ssize_t _slot       # ... and the trie's place among that call's distinct tries

    def __cinit__(self):
        self._t.tok = NULL      # (the rest, and the guard, are zeroed: UNINIT)
        self._t.cnt = NULL
        self._t.par = NULL
        self._t.best = NULL
        self._t.slots = NULL

    def __init__(self, depth=8, ties="first"):
        guard_begin_init(&self._g, NAME)    # a second __init__ is refused, changing nothing
        d, last = check_trie_args(depth, ties)
        if _alloc(&self._t, FIRST_CAPACITY) < 0:
            raise MemoryError(f"cannot allocate a {NAME}")
        self._t.depth = d
        self._t.last = last
        self._t.n = 0
        self._t.tok[0] = -1
        self._t.cnt[0] = 0
        self._t.par[0] = -1
        self._t.best[0] = -1
        self._open = {}
        guard_end_init(&self._g)

    def __dealloc__(self):
        free(self._t.tok)
        free(self._t.cnt)
        free(self._t.par)
        free(self._t.best)
        free(self._t.slots)

    def _hold_guard(self, on):
        """Tests only: ``guard_hold`` (``_core/common/_guard.pxd``) on this trie's guard."""
        _check_self(self)
        guard_hold(&self._g, NAME, on)

    @property
    def depth(self):
        """The longest string the trie counts."""
        guard_check(&self._g, NAME)
        return self._t.depth

    @property
    def ties(self):
        """``"first"`` or ``"last"``: which of two equally frequent continuations wins."""
        guard_check(&self._g, NAME)
        return "last" if self._t.last else "first"

    @property
    def n_nodes(self):
        """The distinct strings counted (the root not included)."""
        guard_check(&self._g, NAME)
        return self._t.n

    @property
    def open_sequences(self):
        """The sequences fed and not closed."""
        guard_check(&self._g, NAME)
        return len(self._open)

    @property
    def nbytes(self):
        """The node storage: ``32`` bytes times the node capacity (the module docstring)."""
        guard_check(&self._g, NAME)
        return NODE_BYTES * self._t.cap

    def __len__(self):
        _check_self(self)
        guard_check(&self._g, NAME)
        return self._t.cnt[0]

    def extend(self, seq, tokens):
        cdef int64_t scratch[FAST_MAX]
        cdef int64_t k
        cdef Py_ssize_t n = fast_len(tokens)
        _check_self(self)
        if 0 <= n <= FAST_MAX and _plain_int(seq, &k) and fast_read(tokens, n, scratch) == 0:
            # plain ints (what the checks return, and no Python code has run)
            self._add(seq, scratch, n)
            return
        key = check_trie_seq(seq)
        new = _owned_int64(token_ids(tokens, "tokens", own=True))   # a fresh array no one else holds
        self._add(key, <const int64_t*>array_data(new), new.shape[0])

    cdef int _add(self, object key, const int64_t* tp, int64_t n) except -1:
        """``extend``'s change, its arguments converted: ``n`` tokens at ``tp`` (memory of
        the call's own) appended to sequence ``key`` (an exact int)."""
        cdef int32_t open_[MAX_DEPTH]
        cdef int32_t n_open
        cdef int64_t done
        guard_write(&self._g, NAME)
        try:
            check_trie_room(self._t.n, n, self._t.depth)
            buf = self._seq_buf(key)
            memcpy(&n_open, PyByteArray_AS_STRING(buf), sizeof(int32_t))
            memcpy(open_, PyByteArray_AS_STRING(buf) + 4, n_open * sizeof(int32_t))
            if n * self._t.depth >= NOGIL_WORK:
                with nogil:
                    done = _extend(&self._t, tp, n, open_, &n_open)
            else:
                done = _extend(&self._t, tp, n, open_, &n_open)
            if done < n:
                guard_break(&self._g)
                raise MemoryError(f"{NAME} could not grow its nodes (after {done} of {n} tokens): out of "
                                  "memory; the trie is unusable now")
            memcpy(PyByteArray_AS_STRING(buf), &n_open, sizeof(int32_t))
            memcpy(PyByteArray_AS_STRING(buf) + 4, open_, n_open * sizeof(int32_t))
        finally:
            guard_done_write(&self._g)
        return 0

    cdef bytearray _seq_buf(self, object key):
        """Sequence ``key``'s storage (an exact int; the writer flag held): its bytearray,
        made and stored when the sequence is new (before anything else changes)."""
        buf = self._open.get(key)
        if buf is None:
            buf = bytearray(4 * self._t.depth)
            self._open[key] = buf
        return <bytearray>buf

    def close(self, seq):
        _check_self(self)
        key = check_trie_seq(seq)
        guard_write(&self._g, NAME)
        try:
            self._open.pop(key, None)
        finally:
            guard_done_write(&self._g)

    def speculate(self, context, max_k, factor=1.0, min_prob=0.1):
        cdef int64_t scratch[FAST_MAX]
        cdef int64_t ctx[MAX_DEPTH]
        cdef int64_t draft[MAX_DEPTH]
        cdef const int64_t* cp = scratch
        cdef int64_t k, L, i, depth
        cdef Py_ssize_t n = fast_len(context)
        cdef int32_t n_draft = 0, m
        cdef double f, least, score = 0.0
        _check_self(self)
        guard_check(&self._g, NAME)
        depth = self._t.depth
        if not (0 <= n <= FAST_MAX and _fast_limits(max_k, factor, min_prob, depth, &k, &f, &least)
                and fast_read(context, n, scratch) == 0):
            arr = _owned_int64(token_ids(context, "context", own=True))   # may run Python code
            k, f, least = check_trie_speculate(max_k, factor, min_prob, depth)
            cp = <const int64_t*>array_data(arr)
            n = arr.shape[0]
        L = min(<int64_t>n, depth)
        memcpy(ctx, cp + n - L, L * sizeof(int64_t))
        guard_read(&self._g, NAME)
        try:
            with nogil:
                m = _speculate(&self._t, ctx, <int32_t>L, k, f, least, draft, &n_draft, &score)
        finally:
            guard_done_read(&self._g)
        return [draft[i] for i in range(n_draft)], score, m

    def __repr__(self):
        if self._g.phase != GUARD_READY:
            return f"{NAME}(<not initialised or unusable>)"
        guard_check(&self._g, NAME)   # as the twin's, which reads ``ties``
        return (f"{NAME}(depth={self._t.depth}, ties={'last' if self._t.last else 'first'!r}, "
                f"tokens={self._t.cnt[0]}, nodes={self._t.n})")

    def __reduce__(self):
        _check_self(self)
        guard_check(&self._g, NAME)
        raise TypeError(f"{NAME} cannot be pickled or copied (build one and feed it the sequences)")


include "_trie_batch.pxi"   # extend_tries and speculate_tries
