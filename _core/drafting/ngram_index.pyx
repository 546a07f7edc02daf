# cython: language_level=3
"""Longest-match n-gram drafting and an incremental n-gram index (compiled).

Same names and behaviour as the twin ``specfsm._py.ngram_index``; both take their
argument checks from ``specfsm._checks`` and the concept's check module, so both raise the same errors.

The index keeps, for each n in [min_n, max_n], an open-addressing hash table over the
n-grams seen so far. A slot is 8 bytes: a 32-bit hash tag and the end position of one
occurrence (the latest, or the first for ``prefer="earliest"``); the n-gram itself is
read back from the token buffer to confirm a tag match, so no key is stored. Appending a
token hashes its trailing n-grams for every n incrementally (one mixing step per n),
looks each up *before* inserting it, and remembers the answer: the end of the chosen
occurrence other than the trailing one. ``propose`` then only reads those answers.
Tables keep a load factor of at most 2/3 and are indexed by the tag's high bits, so
growing them never re-reads tokens.

This file holds the module's declarations and the NgramIndex class; the rest of the
module is included from files of one concern each: _ngram_table.pxi (hashing and the
slot tables), _ngram_match.pxi (the stateless ``longest_match``), _ngram_batch.pxi (the
batch API, the serving-step policy and the extend_batch pipeline), and, shared with
suffix_index.pyx, _index_common.pxi (statistics, record, the batch calls' guards) and
_serve.pxi (``serve``/``serve_batch``); the statistics' C struct is in _index_stats.pxd.
"""

import numpy as np

from specfsm._checks import check_count, token_ids
from specfsm.drafting._checks import (
    GROW_STEP,
    MAX_INDEX_TOKENS,
    SHRINK_STEP,
    batch_offsets,
    batch_tokens,
    check_batch_counts,
    check_batch_limits,
    check_draft_limits,
    check_prefer,
    check_record,
    check_stats as _check_index_stats,
    check_total,
    checked_offsets,
    index_offsets,
    index_range,
    ngram_range,
)

cimport cython
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

from _typedefs cimport token_t
from _arrays cimport plain_int_width, array_data, array_len
from _offsets cimport longest_row
cimport numpy as cnp

cnp.import_array()


from _seq cimport Py_SIZE
from _guard cimport (
    GUARD_READY,
    guard_begin_init,
    guard_check,
    guard_done_read,
    guard_done_write,
    guard_end_init,
    guard_read,
    guard_t,
    guard_write,
)
from _index_stats cimport index_stats_t, stats_fits, stats_init, stats_limit, stats_record

NAME = "NgramIndex"            # the guard's refusals name the class
WHAT = "an NgramIndex"         # ... and messages name an instance

cdef extern from "prefetch.h" nogil:
    void NGI_PREFETCH(const void* p)
    void NGI_PREFETCH_W(const void* p)
    void NGI_PREFETCH_KEEP(const void* p)

cdef extern from "ngram_probe.h" nogil:
    bint ngi_same_short(const int64_t* tok, int64_t e, int64_t L, int64_t d)

# Slot tables come from an arena of 2 MiB chunks the kernel is asked to back with huge
# pages (Linux, madvise): a batch update touches random slots of hundreds of tables,
# and with 4 KiB pages nearly every one of those touches also misses the TLB. Tables
# up to 1 MiB are carved from the chunks in power-of-two blocks and recycled through
# per-size free lists (never returned to the system); larger ones get their own
# mapping. Every call is made with the GIL held, which serialises the arena.
cdef extern from "arena.h" nogil:
    void* ngi_table_alloc(size_t n)
    void ngi_table_free(void* p, size_t n)
    size_t ngi_round(size_t n)


cdef class _Block:
    """Arena memory lent to a numpy array (the token buffer), given back when the last
    array over it goes away."""
    cdef void* ptr
    cdef size_t nbytes
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __dealloc__(self):
        ngi_table_free(self.ptr, self.nbytes)
        self.ptr = NULL

    def __getbuffer__(self, Py_buffer* buf, int flags):
        self.shape[0] = <Py_ssize_t>(self.nbytes // 8)
        self.strides[0] = 8
        buf.buf = self.ptr
        buf.obj = self
        buf.len = <Py_ssize_t>self.nbytes
        buf.readonly = 0
        buf.itemsize = 8
        buf.format = b"q"
        buf.ndim = 1
        buf.shape = self.shape
        buf.strides = self.strides
        buf.suboffsets = NULL
        buf.internal = NULL

    def __releasebuffer__(self, Py_buffer* buf):
        pass


cdef object _token_array(int64_t* cap):
    """An int64 array of at least cap[0] entries in arena memory (cap[0] is raised to
    what the block holds)."""
    cdef size_t n = ngi_round(<size_t>cap[0] * 8)
    cdef _Block blk = _Block.__new__(_Block)
    blk.ptr = ngi_table_alloc(n)
    if blk.ptr == NULL:
        raise MemoryError()
    blk.nbytes = n
    cap[0] = <int64_t>(n // 8)
    return np.frombuffer(blk, dtype=np.int64)

__all__ = [
    "extend_batch",
    "longest_match",
    "longest_match_batch",
    "NgramIndex",
    "propose_batch",
    "record_batch",
    "serve_batch",
    "serve_batch_lists",
]

cdef int64_t MAX_TOKENS_C = MAX_INDEX_TOKENS   # a C copy: no Python comparison per index

include "_index_common.pxi"
include "_serve.pxi"

cdef enum:
    NOGIL_MIN = 2048      # shorter work than this keeps the GIL (a release costs more)
    CHUNK = 4096          # tokens appended per table-reservation round in extend
    SMALL_LIST = 64       # extend() converts lists up to this long without numpy
    AHEAD = 8             # bulk extend prefetches the slots of the position this far ahead
    MIN_CAP_BITS = 4      # a level's table starts with 16 slots
    ROLL_MIN_N = 32       # an index with min_n beyond this hashes with a rolling window
    CHAIN_MIN_N = 9       # n-grams this long are confirmed by continuing the last match
    PIPE_LEVELS = 8       # extend_batch pipelines indexes with at most this many levels
    PIPE_HASH = 24        # extend_batch hashes and prefetches slots this many positions ahead
    PIPE_TOP = 16         # ... peeks at the longest n this far (earliest) ...
    PIPE_VERIFY = 8       # ... and prefetches the tokens a tag match will compare this far
    PIPE_RING = 32        # a power of two above PIPE_HASH
    PEEK_STEPS = 8        # slots of a probe chain the token prefetch follows at most


include "_ngram_table.pxi"
include "_ngram_match.pxi"


# ------------------------------------------------------------------------------------
# the incremental index
# ------------------------------------------------------------------------------------

@cython.embedsignature(False)   # the signature heads the docstring (__text_signature__)
cdef class NgramIndex:
    """NgramIndex(min_n, max_n=None, prefer="latest", *, draft_len=4, adaptive=False, min_draft=1, max_draft=16)
--

    An incremental n-gram index over one request's verified tokens.

    It drafts from the longest n-gram of the last tokens, ``min_n <= n <= max_n``
    (``max_n=None``: ``min_n``), that occurred before, copying what followed its
    ``"latest"`` or ``"earliest"`` earlier occurrence (``prefer``). ``extend`` appends
    tokens (amortised O(max_n - min_n + 1) table updates per token); ``propose(max_k)``
    returns, as a list, exactly what ``longest_match`` returns on everything extended so
    far, in O(max_n - min_n + max_k) whatever the length. Drafts are never extended into
    the index, so a rejected draft needs no undo.

    The draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. Acceptance statistics are kept either way. ``serve``
    is one serving step (record, extend, propose). A call that meets another changing
    the index (another thread, a callback) raises RuntimeError; an instance made with
    ``__new__`` (or whose ``__init__`` failed) refuses every call, and a second
    ``__init__`` is refused.
    """

    cdef int64_t _lo, _hi, _n_levels
    cdef bint _earliest
    cdef object _buf                 # int64 ndarray holding the tokens (capacity >= _len)
    cdef int64_t* _tok
    cdef int64_t _len, _cap
    cdef level_t* _levels
    cdef int32_t* _answers
    # The guard (the shared protocol, _core/common/_guard.pxd). Every change of it happens with
    # the GIL held and no Python code in between check and change: an extend takes the
    # writer flag before anything that can release the GIL or run Python code (argument
    # conversion, numpy copies, the nogil indexing) and drops it last; a batch proposal
    # and pickling count themselves as readers for every index before they read any,
    # and out after they are done; every other method and property checks it.
    cdef guard_t _g
    cdef int64_t _write_stamp        # the extend_batch call holding the writer flag (duplicates)
    cdef bint _rolling               # min_n > ROLL_MIN_N: the rolling hash
    cdef uint64_t _roll, _bpow       # its state H(_len, min_n) and RB**min_n
    cdef uint64_t _work              # hashing and comparison steps so far (tests)
    cdef index_stats_t _st           # acceptance statistics, the adaptive draft length

    def __cinit__(self):
        self._levels = NULL
        self._answers = NULL
        self._n_levels = 0

    def __init__(self, min_n, max_n=None, prefer="latest", *, draft_len=4, adaptive=False,
                 min_draft=1, max_draft=16):
        guard_begin_init(&self._g, NAME)    # a second __init__ is refused, changing nothing
        lo, hi = index_range(min_n, max_n)
        earliest = check_prefer(prefer) == 1
        k, kmin, kmax = check_draft_limits(draft_len, min_draft, max_draft, MAX_TOKENS_C)
        self._lo = lo
        self._hi = hi
        self._n_levels = hi - lo + 1
        self._rolling = lo > ROLL_MIN_N
        self._roll = 0
        self._bpow = _pow(RB, lo)
        self._work = 0
        self._earliest = earliest
        stats_init(&self._st, bool(adaptive), k, kmin, kmax)
        self._len = 0
        self._cap = 64
        self._buf = _token_array(&self._cap)
        cdef int64_t[::1] bv = self._buf
        self._tok = &bv[0]
        self._levels = <level_t*>malloc(self._n_levels * sizeof(level_t))
        self._answers = <int32_t*>malloc(self._n_levels * sizeof(int32_t))
        if self._levels == NULL or self._answers == NULL:
            raise MemoryError()
        cdef int64_t j
        for j in range(self._n_levels):
            self._levels[j].slots = NULL
            self._answers[j] = -1
        for j in range(self._n_levels):
            self._levels[j].cap = 1 << MIN_CAP_BITS
            self._levels[j].count = 0
            self._levels[j].shift = 32 - MIN_CAP_BITS
            self._levels[j].slots = <slot_t*>ngi_table_alloc((1 << MIN_CAP_BITS) * sizeof(slot_t))
            if self._levels[j].slots == NULL:
                raise MemoryError()
            memset(self._levels[j].slots, 0xFF, (1 << MIN_CAP_BITS) * sizeof(slot_t))
        guard_end_init(&self._g)

    def __dealloc__(self):
        cdef int64_t j
        if self._levels != NULL:
            for j in range(self._n_levels):
                ngi_table_free(self._levels[j].slots, self._levels[j].cap * sizeof(slot_t))
            free(self._levels)
        free(self._answers)

    cdef int _begin_write(self) except -1:
        """Takes the writer flag (refusing when anyone holds the index); no Python code
        runs between the checks and the mark."""
        guard_write(&self._g, NAME)
        self._write_stamp = 0
        return 0

    def _hold_guard(self, on):
        """Tests only: take the writer flag as a writer would (refusing like one), or,
        with ``on`` false, release it."""
        _check_self(self)
        if on:
            self._begin_write()
        else:
            guard_done_write(&self._g)

    @property
    def _work_done(self):
        """Hashing and comparison steps spent by every extend so far (for tests that
        check the cost per token without timing it)."""
        return self._work

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self):
        guard_check(&self._g, NAME)
        return self._lo

    @property
    def max_n(self):
        guard_check(&self._g, NAME)
        return self._hi

    @property
    def prefer(self):
        guard_check(&self._g, NAME)
        return "earliest" if self._earliest else "latest"

    @property
    def adaptive(self):
        guard_check(&self._g, NAME)
        return bool(self._st.adaptive)

    @property
    def draft_len(self):
        """The draft length ``propose()`` uses when ``max_k`` is None."""
        guard_check(&self._g, NAME)
        return self._st.draft_len

    # -- contents -------------------------------------------------------------------
    def __len__(self):
        guard_check(&self._g, NAME)
        return self._len

    @property
    def tokens(self):
        """The indexed tokens, as a read-only int64 view of the index's buffer (through a
        read-only memoryview: its WRITEABLE flag cannot be set back)."""
        guard_check(&self._g, NAME)     # slicing lets no other thread run
        return np.asarray(memoryview(self._buf[: self._len]).toreadonly())

    @property
    def nbytes(self):
        """Bytes this index holds: the token buffer and every level's hash table."""
        cdef int64_t total = 0, j
        guard_check(&self._g, NAME)
        total += self._buf.nbytes
        total += self._n_levels * (sizeof(level_t) + sizeof(int32_t))
        for j in range(self._n_levels):
            total += self._levels[j].cap * sizeof(slot_t)
        return total

    @property
    def bytes_per_token(self):
        """``nbytes`` per indexed token (0.0 while empty)."""
        guard_check(&self._g, NAME)
        return self.nbytes / (<double>self._len) if self._len else 0.0

    cdef int _grow_buffer(self, int64_t need) except -1:
        cdef int64_t cap = self._cap
        while cap < need:
            cap = cap + (cap >> 1) + 16
        if cap > MAX_TOKENS_C + 1:
            cap = MAX_TOKENS_C + 1
        new = _token_array(&cap)
        new[: self._len] = self._buf[: self._len]
        cdef int64_t[::1] nv = new
        self._buf = new              # views handed out keep the old buffer alive
        self._tok = &nv[0]
        self._cap = cap
        return 0

    def extend(self, tokens):
        _check_self(self)
        self._begin_write()
        try:
            self._extend(tokens)
        finally:
            guard_done_write(&self._g)

    cdef int _extend(self, object tokens) except -1:
        """extend's work; the caller holds the write guard."""
        cdef int64_t m, i, v
        cdef Py_ssize_t n
        if type(tokens) is list and Py_SIZE(tokens) <= SMALL_LIST:
            # the serving loop's case, a few accepted tokens: no numpy round trip. Only
            # exact ints are read (no Python code runs), so the list cannot change here.
            n = Py_SIZE(tokens)
            if self._len + n > self._cap and self._len + n <= MAX_TOKENS_C:
                self._grow_buffer(self._len + n)
            if self._len + n <= self._cap and Py_SIZE(tokens) == n:
                for i in range(n):
                    t = (<list>tokens)[i]
                    if type(t) is not int:
                        break
                    try:
                        v = t
                    except OverflowError:
                        break
                    self._tok[self._len + i] = v
                else:
                    self._ingest(n)
                    return 0
        arr = token_ids(tokens, "tokens")
        m = arr.shape[0]
        if m == 0:
            return 0
        if m > MAX_TOKENS_C - self._len:
            raise OverflowError(
                f"an NgramIndex holds at most {MAX_TOKENS_C} tokens; "
                f"{self._len} + {m} is too many"
            )
        if self._len + m > self._cap:
            self._grow_buffer(self._len + m)
        self._buf[self._len : self._len + m] = arr
        self._ingest(m)
        return 0

    def append(self, token):
        cdef int64_t v
        _check_self(self)
        if type(token) is int and self._len < self._cap and self._g.phase == GUARD_READY \
                and not self._g.writing and not self._g.readers:
            try:
                v = token
            except OverflowError:
                pass
            else:
                self._g.writing = 1
                self._write_stamp = 0
                try:
                    self._tok[self._len] = v
                    self._ingest(1)
                finally:
                    guard_done_write(&self._g)
                return
        self.extend([token])

    cdef int _ingest(self, int64_t m) except -1:
        """Index the m tokens already written at positions _len.._len + m - 1 (the
        caller holds the write guard)."""
        cdef int64_t start = self._len, stop, j, lo = self._lo, hi = self._hi
        cdef int64_t total = self._len + m
        cdef bint earliest = self._earliest
        cdef level_t* levels = self._levels
        cdef int32_t* answers = self._answers
        cdef const int64_t* tok = self._tok
        cdef bint rolling = self._rolling
        cdef uint64_t bpow = self._bpow
        cdef int rc = 0
        if m == 0:
            return 0
        if total > MAX_TOKENS_C:
            raise OverflowError(
                f"an NgramIndex holds at most {MAX_TOKENS_C} tokens; "
                f"{self._len} + {m} is too many"
            )
        try:
            while start < total:
                stop = min(start + CHUNK, total)
                for j in range(self._n_levels):
                    if _reserve(&levels[j], levels[j].count + (stop - start)) < 0:
                        rc = -1
                        break
                if rc < 0:
                    break
                if stop - start >= NOGIL_MIN // 4:
                    with nogil:
                        _index_range(tok, start, stop, levels, answers, lo, hi, earliest,
                                     rolling, &self._roll, bpow, &self._work)
                else:
                    _index_range(tok, start, stop, levels, answers, lo, hi, earliest,
                                 rolling, &self._roll, bpow, &self._work)
                start = stop
        finally:
            self._len = start        # every position below start is fully indexed
        if rc < 0:
            raise MemoryError(f"NgramIndex could not grow its tables (after {start} tokens)")
        return 0

    def propose(self, max_k=None):
        cdef int64_t k, end, i, stop
        _check_self(self)
        k = _propose_limit(&self._st, max_k, &self._len)   # may run Python code: before the check
        # checked after the conversion; the copy below lets no other thread run (it
        # allocates no object the garbage collector tracks but the list itself, first)
        if self._g.phase != GUARD_READY or self._g.writing:
            guard_check(&self._g, NAME)
        end = _chosen_end(self._answers, self._n_levels)
        if end < 0 or k <= 0:
            return []
        stop = end + k if end + k < self._len else self._len
        cdef const int64_t* tok = self._tok
        return [tok[i] for i in range(end, stop)]

    def serve(self, tokens, drafted=0, accepted=0, max_k=None):
        _check_self(self)
        src, d, a, k = _serve_args(tokens, drafted, accepted, max_k, MAX_TOKENS_C)
        return _serve_one(ngram_serve, self, src, d, a, k, MAX_TOKENS_C)

    def match_length(self):
        cdef int64_t j
        _check_self(self)
        guard_check(&self._g, NAME)
        for j in range(self._n_levels - 1, -1, -1):
            if self._answers[j] >= 0:
                return self._lo + j
        return 0

    # -- acceptance statistics and the adaptive draft length ---------------------
    def record(self, proposed, accepted):
        _check_self(self)
        return _record_one(&self._g, &self._st, proposed, accepted)

    @property
    def stats(self):
        """Acceptance statistics: steps recorded, tokens drafted and accepted, fully
        accepted drafts, the acceptance rate and the current draft length."""
        return _stats_dict(&self._g, &self._st)

    def __repr__(self):
        if self._g.phase != GUARD_READY:
            return "NgramIndex(<not initialised>)"
        prefer = "earliest" if self._earliest else "latest"
        return f"NgramIndex(min_n={self._lo}, max_n={self._hi}, prefer={prefer!r}, len={self._len})"

    def __reduce__(self):
        # pickled as its settings, tokens and statistics; unpickling re-indexes the tokens
        _check_self(self)
        guard_read(&self._g, NAME)   # the token copy may let other threads run
        try:
            return (
                _rebuild,
                (type(self), self._lo, self._hi, "earliest" if self._earliest else "latest",
                 self._st.draft_len, bool(self._st.adaptive), self._st.min_draft,
                 self._st.max_draft, np.array(self._buf[: self._len]), _stats_tuple(&self._st)),
            )
        finally:
            guard_done_read(&self._g)

    def _restore_stats(self, stats):
        _check_self(self)
        _stats_restore(&self._g, &self._st, stats)


def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats):
    """The unpickler: a new index of class ``cls`` built from checked settings, tokens
    and statistics (made-up statistics are refused)."""
    if not (isinstance(cls, type) and issubclass(cls, NgramIndex)):
        raise TypeError(f"cannot rebuild an NgramIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=adaptive, min_draft=kmin, max_draft=kmax)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix


# what _index_common.pxi and _serve.pxi ask of this module's index class
cdef inline bint _is_index(object o):
    return type(o) is NgramIndex or isinstance(o, NgramIndex)


cdef inline guard_t* _guard_of(object o) noexcept:
    return &(<NgramIndex>o)._g


cdef inline index_stats_t* _stats_of(object o) noexcept:
    return &(<NgramIndex>o)._st


cdef inline int64_t _len_of(object o) noexcept:
    return (<NgramIndex>o)._len


include "_ngram_batch.pxi"
