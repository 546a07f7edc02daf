# cython: language_level=3
"""Longest-match n-gram drafting and an incremental n-gram index (compiled).

Same names and behaviour as the twin ``specfsm._py.ngram_index``; both take their
argument checks from ``specfsm._validate``, so both raise the same errors.

The index keeps, for each n in [min_n, max_n], an open-addressing hash table over the
n-grams seen so far. A slot is 8 bytes: a 32-bit hash tag and the end position of one
occurrence (the latest, or the first for ``prefer="earliest"``); the n-gram itself is
read back from the token buffer to confirm a tag match, so no key is stored. Appending a
token hashes its trailing n-grams for every n incrementally (one mixing step per n),
looks each up *before* inserting it, and remembers the answer: the end of the chosen
occurrence other than the trailing one. ``propose`` then only reads those answers.
Tables keep a load factor of at most 2/3 and are indexed by the tag's high bits, so
growing them never re-reads tokens.
"""

import numpy as np

from specfsm._validate import (
    GROW_STEP,
    MAX_INDEX_TOKENS,
    SHRINK_STEP,
    as_ids,
    check_batch_counts,
    check_draft_limits,
    _check_index_range,
    _check_ngram_range,
    _check_offsets,
    check_prefer,
    check_record,
    _check_stats as _check_index_stats,
    _check_total,
    own_batch_arrays,
    own_offsets,
    validate_offsets,
    check_count,
)

from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

from _typedefs cimport token_t
from _arrays cimport plain_int_width, array_data, array_len
cimport numpy as cnp

cnp.import_array()


cdef inline object _copy_int64(object a):
    """A fresh copy of a 1-D C-contiguous int64 ndarray (numpy C API, no Python call)."""
    cdef cnp.npy_intp n = array_len(a)
    out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
    if n:
        memcpy(cnp.PyArray_DATA(<cnp.ndarray>out), array_data(a), <size_t>n * sizeof(int64_t))
    return out
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

ctypedef struct slot_t:
    uint32_t tag          # high 32 bits of the n-gram's hash
    int32_t end           # end (exclusive) of the stored occurrence; -1: empty slot

ctypedef struct level_t:
    slot_t* slots
    int64_t cap           # a power of two
    int64_t count
    int shift             # 32 - log2(cap): home slot = tag >> shift

ctypedef struct view_t:   # what a batch proposal needs from one index, read without the GIL
    const int64_t* tok
    const int32_t* answers
    int64_t n_levels
    int64_t k


# ------------------------------------------------------------------------------------
# hashing
# ------------------------------------------------------------------------------------

cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    x ^= x >> 30
    x *= <uint64_t>0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= <uint64_t>0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef inline uint64_t _step(uint64_t h, int64_t t) noexcept nogil:
    """Hash of an n-gram from the hash of its last n - 1 tokens and its first token."""
    return _mix(h ^ (<uint64_t>t * <uint64_t>0x9e3779b97f4a7c15ULL + <uint64_t>0x632be59bd9b4e019ULL))


cdef inline bint _same(const int64_t* tok, int64_t e, int64_t f, int64_t n) noexcept nogil:
    """tok[e - n:e] == tok[f - n:f]"""
    cdef int64_t i
    for i in range(1, n + 1):
        if tok[e - i] != tok[f - i]:
            return False
    return True


# The rolling hash (indexes with min_n > ROLL_MIN_N): H(L, n) = sum over i < n of
# x(tok[L - 1 - i]) * RB**i (mod 2**64), x a mixed token. H(L, min_n) rolls forward in
# O(1) per token and each longer n adds one term, so a token costs O(max_n - min_n + 1)
# whatever min_n is (the chained hash above costs O(max_n)).
cdef uint64_t RB = <uint64_t>0x9E3779B97F4A7C15ULL | 1


cdef inline uint64_t _x(int64_t t) noexcept nogil:
    return _mix(<uint64_t>t * <uint64_t>0xD6E8FEB86659FD93ULL + <uint64_t>0x632be59bd9b4e019ULL)


cdef inline uint64_t _fin(uint64_t h) noexcept nogil:
    return _mix(h ^ <uint64_t>0x2545F4914F6CDD1DULL)


cdef uint64_t _pow(uint64_t b, int64_t e) noexcept nogil:
    cdef uint64_t r = 1
    while e > 0:
        if e & 1:
            r *= b
        b *= b
        e >>= 1
    return r


cdef inline bint _verify(const int64_t* tok, int64_t e, int64_t L, int64_t d, int32_t prev,
                         uint64_t* work) noexcept nogil:
    """tok[e - d:e] == tok[L - d:L] for a slot whose tag matched. ``prev`` is this level's
    answer at position L - 1 (so tok[prev - d:prev] == tok[L - 1 - d:L - 1] when
    prev >= 0): a candidate continuing that match needs one comparison instead of d,
    which keeps long n-grams over repetitive streams O(1) per token."""
    if d >= CHAIN_MIN_N and prev >= 0 and e == prev + 1:
        work[0] += 1
        return tok[e - 1] == tok[L - 1]
    work[0] += <uint64_t>d
    return _same(tok, e, L, d)


cdef inline void _probe(level_t* lv, uint32_t tag, const int64_t* tok, int64_t L, int64_t d,
                        bint earliest, int32_t* a, uint64_t* work) noexcept nogil:
    """Look up the d-gram ending at L (tag ``tag``) in its level, insert it, and set the
    level's answer ``a[0]``: the end of the chosen earlier occurrence, or -1."""
    cdef uint64_t mask = <uint64_t>(lv.cap - 1)
    cdef uint64_t idx = (<uint64_t>tag) >> lv.shift if lv.shift < 32 else 0
    cdef int32_t found = -1
    cdef int32_t prev = a[0]
    cdef slot_t* s
    while True:
        s = &lv.slots[idx]
        if s.end < 0:
            s.tag = tag
            s.end = <int32_t>L
            lv.count += 1
            break
        if s.tag == tag and _verify(tok, s.end, L, d, prev, work):
            found = s.end
            if not earliest:
                s.end = <int32_t>L
            break
        idx = (idx + 1) & mask
    a[0] = found


cdef inline void _probe_at(level_t* lv, uint32_t tag, uint64_t idx, const int64_t* tok,
                           int64_t L, int64_t d, bint earliest, int32_t* a,
                           uint64_t* work) noexcept nogil:
    """``_probe`` starting at slot ``idx`` of the chain (every slot before it holds
    another tag), comparing short n-grams without a loop."""
    cdef uint64_t mask = <uint64_t>(lv.cap - 1)
    cdef int32_t found = -1
    cdef int32_t prev = a[0]
    cdef slot_t* s
    cdef bint same
    while True:
        s = &lv.slots[idx]
        if s.end < 0:
            s.tag = tag
            s.end = <int32_t>L
            lv.count += 1
            break
        if s.tag == tag:
            if d <= 4:
                work[0] += <uint64_t>d
                same = ngi_same_short(tok, s.end, L, d)
            else:
                same = _verify(tok, s.end, L, d, prev, work)
            if same:
                found = s.end
                if not earliest:
                    s.end = <int32_t>L
                break
        idx = (idx + 1) & mask
    a[0] = found


cdef int _reserve(level_t* lv, int64_t need) noexcept nogil:
    """Make room for ``need`` entries at load <= 2/3, rehashing by tag; -1 when out of memory."""
    cdef int64_t cap = lv.cap
    cdef int bits = 32 - lv.shift
    while need * 3 > cap * 2:
        cap *= 2
        bits += 1
    if cap == lv.cap:
        return 0
    if bits > 32:
        return -1
    cdef slot_t* new = <slot_t*>ngi_table_alloc(cap * sizeof(slot_t))
    if new == NULL:
        return -1
    memset(new, 0xFF, cap * sizeof(slot_t))
    cdef int shift = 32 - bits
    cdef uint64_t mask = <uint64_t>(cap - 1)
    cdef uint64_t i, j
    cdef slot_t* old = lv.slots
    for i in range(<uint64_t>lv.cap):
        if old[i].end >= 0:
            j = (<uint64_t>old[i].tag) >> shift if shift < 32 else 0
            while new[j].end >= 0:
                j = (j + 1) & mask
            new[j] = old[i]
    ngi_table_free(old, lv.cap * sizeof(slot_t))
    lv.slots = new
    lv.cap = cap
    lv.shift = shift
    return 0


cdef void _index_tokens(const int64_t* tok, int64_t start, int64_t stop, level_t* levels,
                        int32_t* answers, int64_t lo, int64_t hi, bint earliest,
                        uint64_t* work) noexcept nogil:
    """Index positions start..stop-1 (tables already reserved for stop - start entries)."""
    cdef int64_t L, d, top
    cdef uint64_t h
    cdef level_t* lv
    cdef int64_t P, ptop
    cdef uint64_t w = 0
    for L in range(start + 1, stop + 1):
        P = L + AHEAD
        if P <= stop and stop - start > AHEAD:
            # bulk extends: start loading the slots position P will probe
            ptop = hi if hi < P else P
            h = 0
            for d in range(1, ptop + 1):
                h = _step(h, tok[P - d])
                if d >= lo:
                    lv = &levels[d - lo]
                    NGI_PREFETCH(&lv.slots[(h >> 32) >> lv.shift])
        top = hi if hi < L else L
        h = 0
        w += <uint64_t>top
        for d in range(1, top + 1):
            h = _step(h, tok[L - d])
            if d < lo:
                continue
            _probe(&levels[d - lo], <uint32_t>(h >> 32), tok, L, d, earliest, &answers[d - lo], &w)
        for d in range(top + 1 if top >= lo else lo, hi + 1):
            answers[d - lo] = -1
    work[0] += w


cdef void _index_tokens_roll(const int64_t* tok, int64_t start, int64_t stop, level_t* levels,
                             int32_t* answers, int64_t lo, int64_t hi, bint earliest,
                             uint64_t* roll, uint64_t bpow, uint64_t* work) noexcept nogil:
    """``_index_tokens`` with the rolling hash: ``roll`` holds H(start, lo) on entry and
    H(stop, lo) on return; ``bpow`` is RB**lo."""
    cdef int64_t L, d, top
    cdef uint64_t r = roll[0], h, p
    cdef uint64_t w = 0
    for L in range(start + 1, stop + 1):
        r = r * RB + _x(tok[L - 1])
        if L - 1 >= lo:
            r -= _x(tok[L - 1 - lo]) * bpow
        top = hi if hi < L else L
        w += 2
        if top >= lo:
            h = r
            p = bpow
            _probe(&levels[0], <uint32_t>(_fin(h) >> 32), tok, L, lo, earliest, &answers[0], &w)
            for d in range(lo + 1, top + 1):
                h += _x(tok[L - d]) * p
                p *= RB
                w += 1
                _probe(&levels[d - lo], <uint32_t>(_fin(h) >> 32), tok, L, d, earliest,
                       &answers[d - lo], &w)
        for d in range(top + 1 if top >= lo else lo, hi + 1):
            answers[d - lo] = -1
    roll[0] = r
    work[0] += w


cdef inline void _index_range(const int64_t* tok, int64_t start, int64_t stop,
                              level_t* levels, int32_t* answers, int64_t lo, int64_t hi,
                              bint earliest, bint rolling, uint64_t* roll, uint64_t bpow,
                              uint64_t* work) noexcept nogil:
    if rolling:
        _index_tokens_roll(tok, start, stop, levels, answers, lo, hi, earliest, roll, bpow, work)
    else:
        _index_tokens(tok, start, stop, levels, answers, lo, hi, earliest, work)


cdef inline int64_t _chosen_end(const int32_t* answers, int64_t n_levels) noexcept nogil:
    cdef int64_t j
    for j in range(n_levels - 1, -1, -1):
        if answers[j] >= 0:
            return answers[j]
    return -1


# ------------------------------------------------------------------------------------
# stateless longest match
# ------------------------------------------------------------------------------------

cdef inline int64_t _suffix_run(const token_t* p, int64_t e, int64_t last, int64_t cap) noexcept nogil:
    """How many tokens ending at e equal those ending at last (p[e] == p[last] known), up to cap."""
    cdef int64_t m = 1
    while m < cap and p[e - m] == p[last - m]:
        m += 1
    return m


from _scan cimport find_last as _find_last, find_first as _find_first


cdef int64_t _lm_end(const token_t* p, int64_t L, int64_t lo, int64_t hi, bint earliest) noexcept nogil:
    """End (exclusive) of the chosen earlier occurrence of the longest matching suffix, or -1.

    Every candidate end e <= L - 2 whose token equals the last one is measured: the
    longest common run of tokens ending at e and at L - 1, capped at max_n (and at e + 1).
    Visiting candidates newest first (``latest``) or oldest first (``earliest``), the
    first candidate that beats the best run so far marks that run's chosen occurrence;
    the scan stops once a run reaches max_n. Candidates are found by a vectorised search
    for the last token (scan.h).
    """
    if L < lo + 1:
        return -1
    cdef int64_t top = hi if hi < L - 1 else L - 1
    cdef token_t last = p[L - 1]
    cdef int64_t best = lo - 1
    cdef int64_t pos = -1
    cdef int64_t e, m, c
    if not earliest:
        e = L - 2
        while e >= lo - 1:
            e = _find_last(p, lo - 1, e, last)
            if e < 0:
                break
            c = top if top < e + 1 else e + 1
            m = _suffix_run(p, e, L - 1, c)
            if m > best:
                best = m
                pos = e
                if best == top:
                    break
            e -= 1
    else:
        e = lo - 1
        while e <= L - 2:
            e = _find_first(p, e, L - 2, last)
            if e < 0:
                break
            c = top if top < e + 1 else e + 1
            m = _suffix_run(p, e, L - 1, c)
            if m > best:
                best = m
                pos = e
                if best == top:
                    break
            e += 1
    return pos + 1 if pos >= 0 else -1


cdef int64_t _lm_run(const token_t* p, int64_t n, int64_t lo, int64_t hi, bint earliest) noexcept:
    cdef int64_t r
    if n >= NOGIL_MIN:
        with nogil:
            r = _lm_end(p, n, lo, hi, earliest)
    else:
        r = _lm_end(p, n, lo, hi, earliest)
    return r


def longest_match(history, min_n, max_n, max_k, prefer="latest"):
    """Draft up to ``max_k`` tokens that followed the longest (``max_n`` down to
    ``min_n``) earlier occurrence of ``history``'s last tokens.

    ``prefer`` picks that n's most recent occurrence (``"latest"``; with
    ``min_n == max_n`` this is ``prompt_lookup``) or its first (``"earliest"``). A numpy
    ``history`` gives a numpy draft of the same dtype, a list or tuple gives a list.
    """
    cdef int64_t lo, hi, k, end = -1, n
    cdef bint earliest
    cdef const int64_t[::1] h64
    cdef const int32_t[::1] h32
    cdef int width = 0
    # fast paths for the common argument types; anything else takes the shared checks
    if (type(min_n) is int and type(max_n) is int and 1 <= <object>min_n <= <object>max_n
            and <object>max_n <= MAX_INDEX_TOKENS):
        lo_ = min_n
        hi_ = max_n
    else:
        lo_, hi_ = _check_ngram_range(min_n, max_n)
    if type(max_k) is not int or max_k < 0:
        max_k = check_count(max_k, "max_k")
    if type(prefer) is str and prefer == "latest":
        earliest = False
    else:
        earliest = check_prefer(prefer) == 1
    arr = history
    if type(history) is np.ndarray:
        try:
            h64 = history
            width = 8
        except (ValueError, TypeError, BufferError):
            try:
                h32 = history
                width = 4
            except (ValueError, TypeError, BufferError):
                pass
    if width == 0:
        arr = as_ids(history, "history")
        if arr.dtype.itemsize == 8:
            h64 = arr
            width = 8
        else:
            h32 = arr
            width = 4
    n = h64.shape[0] if width == 8 else h32.shape[0]
    lo = lo_ if lo_ < n + 1 else n + 1     # beyond n + 1 nothing can match anyway
    hi = hi_ if hi_ < n + 1 else n + 1
    k = max_k if max_k < n else n
    if k > 0 and n >= lo + 1:
        if width == 8:
            end = _lm_run(&h64[0], n, lo, hi, earliest)
        else:
            end = _lm_run(&h32[0], n, lo, hi, earliest)
    if isinstance(history, np.ndarray):
        if end < 0:
            return history[:0].copy()
        return history[end : end + k].copy()
    if end < 0:
        return []
    return arr[end : end + k].tolist()


cdef void _lm_batch(const token_t* p, const int64_t* off, const int64_t* ks, int64_t b,
                    int64_t lo, int64_t hi, bint earliest, token_t* out, int64_t* out_off,
                    int64_t* lengths) noexcept nogil:
    cdef int64_t i, j, s, L, end, take, w = 0
    out_off[0] = 0
    for i in range(b):
        s = off[i]
        L = off[i + 1] - s
        take = 0
        if ks[i] > 0:
            end = _lm_end(p + s, L, lo, hi, earliest)
            if end >= 0:
                take = L - end
                if ks[i] < take:
                    take = ks[i]
                for j in range(take):
                    out[w + j] = p[s + end + j]
        w += take
        lengths[i] = take
        out_off[i + 1] = w


def longest_match_batch(tokens, offsets, min_n, max_n, max_k, prefer="latest"):
    """``longest_match`` for B histories stored back to back in one flat array.

    History ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets`` holds B + 1
    nondecreasing boundaries); ``max_k`` is one count or one per request. Returns
    ``(drafts, draft_offsets, lengths)``: draft ``i`` is
    ``drafts[draft_offsets[i]:draft_offsets[i + 1]]`` and has ``lengths[i]`` tokens;
    ``drafts`` has the dtype of ``tokens`` (int32 or int64). The whole batch runs
    without the GIL.
    """
    # convert every argument first (Python code may run), copying the control arrays
    lo_, hi_ = _check_ngram_range(min_n, max_n)
    cdef bint earliest = check_prefer(prefer) == 1
    arr = as_ids(tokens, "tokens")
    off = own_offsets(offsets)
    cdef int64_t b = off.shape[0] - 1
    ks = check_batch_counts(max_k, b, None)          # an owned, validated copy
    cdef const int32_t[::1] t32
    cdef const int64_t[::1] t64
    cdef int64_t n
    # the token buffer is pinned by its view; its length is read once, from the view
    if arr.dtype.itemsize == 4:
        t32 = arr
        n = t32.shape[0]
    else:
        t64 = arr
        n = t64.shape[0]
    validate_offsets(off, n)                    # the copy, compared neighbour to neighbour
    cdef const int64_t[::1] offv = off
    cdef const int64_t[::1] kv = ks
    # an upper bound on the drafts' total, so one allocation serves the whole batch
    cdef int64_t bound = 0, i, span
    for i in range(b):
        span = offv[i + 1] - offv[i]
        bound += kv[i] if kv[i] < span else span
    cdef int64_t lo = min(lo_, n + 1)
    cdef int64_t hi = min(hi_, n + 1)
    out = np.empty(bound, dtype=arr.dtype)
    out_off = np.empty(b + 1, dtype=np.int64)
    lengths = np.empty(b, dtype=np.int64)
    cdef int64_t[::1] oo = out_off
    cdef int64_t[::1] ln = lengths
    cdef int32_t[::1] o32
    cdef int64_t[::1] o64
    cdef int32_t z32 = 0
    cdef int64_t z64 = 0
    if arr.dtype.itemsize == 4:
        o32 = out
        with nogil:
            _lm_batch(&t32[0] if n else &z32, &offv[0], &kv[0] if b else &z64, b,
                      lo, hi, earliest, &o32[0] if bound else &z32, &oo[0],
                      &ln[0] if b else &z64)
    else:
        o64 = out
        with nogil:
            _lm_batch(&t64[0] if n else &z64, &offv[0], &kv[0] if b else &z64, b,
                      lo, hi, earliest, &o64[0] if bound else &z64, &oo[0],
                      &ln[0] if b else &z64)
    return out[: out_off[b]], out_off, lengths


# ------------------------------------------------------------------------------------
# the incremental index
# ------------------------------------------------------------------------------------

cdef class NgramIndex:
    """An incremental n-gram index over one request's verified tokens.

    ``extend`` appends tokens (amortised O(max_n - min_n + 1) table updates per token);
    ``propose(max_k)`` returns, as a list, exactly what ``longest_match`` returns on
    everything extended so far, in O(max_n - min_n + max_k) whatever the length.
    Drafts are never extended into the index, so a rejected draft needs no undo.

    The draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. Acceptance statistics are kept either way.
    """

    cdef int64_t _lo, _hi, _n_levels
    cdef bint _earliest
    cdef object _buf                 # int64 ndarray holding the tokens (capacity >= _len)
    cdef int64_t* _tok
    cdef int64_t _len, _cap
    cdef level_t* _levels
    cdef int32_t* _answers
    # The guard (the shared protocol, _core/_guard.pxd). Every change of it happens with
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
        lo, hi = _check_index_range(min_n, max_n)
        earliest = check_prefer(prefer) == 1
        k, kmin, kmax = check_draft_limits(draft_len, min_draft, max_draft)
        self._lo = lo
        self._hi = hi
        self._n_levels = hi - lo + 1
        self._rolling = lo > ROLL_MIN_N
        self._roll = 0
        self._bpow = _pow(RB, lo)
        self._work = 0
        self._earliest = earliest
        stats_init(&self._st, bool(adaptive), min(k, MAX_INDEX_TOKENS),
                   min(kmin, MAX_INDEX_TOKENS), min(kmax, MAX_INDEX_TOKENS))
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
        """The indexed tokens, as a read-only int64 view of the index's buffer."""
        guard_check(&self._g, NAME)     # slicing lets no other thread run
        v = self._buf[: self._len]
        v.flags.writeable = False
        return v

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
        if cap > MAX_INDEX_TOKENS + 1:
            cap = MAX_INDEX_TOKENS + 1
        new = _token_array(&cap)
        new[: self._len] = self._buf[: self._len]
        cdef int64_t[::1] nv = new
        self._buf = new              # views handed out keep the old buffer alive
        self._tok = &nv[0]
        self._cap = cap
        return 0

    def extend(self, tokens):
        """Append verified tokens (a list, tuple or 1-D integer array) to the index.

        Refuses (RuntimeError) while another extend or a batch proposal uses the index."""
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
            if self._len + n > self._cap and self._len + n <= MAX_INDEX_TOKENS:
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
        arr = as_ids(tokens, "tokens")
        m = arr.shape[0]
        if m == 0:
            return 0
        if self._len + m > MAX_INDEX_TOKENS:
            raise OverflowError(
                f"an NgramIndex holds at most {MAX_INDEX_TOKENS} tokens; "
                f"{self._len} + {m} is too many"
            )
        if self._len + m > self._cap:
            self._grow_buffer(self._len + m)
        self._buf[self._len : self._len + m] = arr
        self._ingest(m)
        return 0

    def append(self, token):
        """Append one verified token."""
        cdef int64_t v
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
        if total > MAX_INDEX_TOKENS:
            raise OverflowError(
                f"an NgramIndex holds at most {MAX_INDEX_TOKENS} tokens; "
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
        """The draft ``longest_match(tokens, min_n, max_n, max_k, prefer)`` gives, as a
        list; ``max_k=None`` uses ``draft_len``."""
        cdef int64_t k, end, i, stop
        if max_k is None:
            k = self._st.draft_len
        else:
            if type(max_k) is not int or max_k < 0:
                max_k = check_count(max_k, "max_k")   # may run Python code: before the check
            k = max_k if max_k < self._len else self._len
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
        """One serving step of this index's request: records the verified draft
        (``drafted`` tokens of which ``accepted`` were accepted; nothing when 0) as
        ``record`` does, extends by ``tokens`` as ``extend`` does, and returns the next
        draft, ``propose(min(draft_len, max_k))`` when adaptive, else
        ``propose(max_k)``. Refuses what those refuse, changing nothing."""
        src, d, a, k = _serve_args(tokens, drafted, accepted, max_k, MAX_TOKENS_C)
        return _serve_one(ngram_serve, self, src, d, a, k, MAX_TOKENS_C)

    def match_length(self):
        """The n of the current match (0 when nothing matches)."""
        cdef int64_t j
        guard_check(&self._g, NAME)
        for j in range(self._n_levels - 1, -1, -1):
            if self._answers[j] >= 0:
                return self._lo + j
        return 0

    # -- acceptance statistics and the adaptive draft length ---------------------
    def record(self, proposed, accepted):
        """Record that ``accepted`` of ``proposed`` drafted tokens were accepted; returns
        the draft length to use next (changed only when ``adaptive``)."""
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


cdef void _propose_views(const view_t* views, int64_t b, int64_t* out, int64_t* out_off,
                         int64_t* lengths) noexcept nogil:
    cdef int64_t i, j, end, take, w = 0
    cdef const view_t* v
    out_off[0] = 0
    for i in range(b):
        v = &views[i]
        end = _chosen_end(v.answers, v.n_levels)
        take = 0
        if end >= 0 and v.k > 0:
            take = v.k
            for j in range(take):
                out[w + j] = v.tok[end + j]
        w += take
        lengths[i] = take
        out_off[i + 1] = w


def propose_batch(indexes, max_k=None):
    """``propose`` for B indexes in one call, without the GIL for the whole batch.

    ``max_k`` is one count, one count per index, or None for each index's
    ``draft_len``. Returns ``(drafts, offsets, lengths)`` as ``longest_match_batch``
    does, ``drafts`` being int64. Refuses (RuntimeError) an index being extended.
    """
    # every argument converted (Python code may run) before any index is touched
    cdef list index_list = _index_list(indexes)
    cdef int64_t b = len(index_list), i, k, end, bound = 0, one_k = -1, marked = 0
    cdef const int64_t[::1] kv
    cdef NgramIndex ix
    if max_k is None:
        pass
    elif type(max_k) is int and max_k >= 0:
        one_k = max_k if max_k < MAX_INDEX_TOKENS else MAX_INDEX_TOKENS
    elif isinstance(max_k, (np.ndarray, list, tuple)):
        kv = check_batch_counts(max_k, b, None)     # an owned, validated copy
    else:
        one_k = min(check_count(max_k, "max_k"), MAX_INDEX_TOKENS)
    cdef view_t* views = <view_t*>malloc((b if b else 1) * sizeof(view_t))
    if views == NULL:
        raise MemoryError()
    try:
        # the read guard on every index, before anything can release the GIL or run
        # Python code (numpy allocations below may run a collection, hence finalizers)
        # (no Python code runs in this loop: each index is marked, then its view taken)
        for i in range(b):
            ix = <NgramIndex>index_list[i]
            guard_read(&ix._g, NAME)
            marked += 1
            if max_k is None:
                k = ix._st.draft_len
            elif one_k >= 0:
                k = one_k
            else:
                k = kv[i]
            views[i].tok = ix._tok
            views[i].answers = ix._answers
            views[i].n_levels = ix._n_levels
            # clip k to the tokens after the chosen occurrence now, so the nogil pass
            # needs no length (and the output's size is exact)
            end = _chosen_end(ix._answers, ix._n_levels)
            if end < 0 or k < 0:
                k = 0
            elif k > ix._len - end:
                k = ix._len - end
            views[i].k = k
            bound += k
        out = np.empty(bound, dtype=np.int64)
        out_off = np.empty(b + 1, dtype=np.int64)
        lengths = np.empty(b, dtype=np.int64)
        _run_views(views, b, out, out_off, lengths)
    finally:
        for i in range(marked):
            guard_done_read(&(<NgramIndex>index_list[i])._g)
        free(views)
    return out, out_off, lengths


cdef int _run_views(const view_t* views, int64_t b, object out, object out_off, object lengths) except -1:
    cdef int64_t[::1] o = out
    cdef int64_t[::1] oo = out_off
    cdef int64_t[::1] ln = lengths
    cdef int64_t z = 0
    with nogil:
        _propose_views(views, b, &o[0] if o.shape[0] else &z, &oo[0], &ln[0] if b else &z)
    return 0


def record_batch(indexes, proposed, accepted):
    """``record`` for B indexes: ``proposed`` and ``accepted`` hold one count per index.
    Returns the next draft lengths (int64)."""
    return _record_batch(indexes, proposed, accepted)


def serve_batch(indexes, tokens, offsets, drafted, accepted, max_k=None):
    """``NgramIndex.serve`` for B distinct indexes in one call: index ``i`` records
    ``(drafted[i], accepted[i])`` (nothing when 0), takes
    ``tokens[offsets[i]:offsets[i + 1]]`` and drafts at most ``max_k`` (one count, one
    per index, or None for ``draft_len``; adaptive indexes at most their ``draft_len``)
    tokens. Returns ``(drafts, offsets, lengths)`` as ``propose_batch`` does. All or
    nothing: refuses what ``extend_batch`` and ``record_batch`` refuse, changing no index."""
    return _serve_batch(ngram_serve, indexes, tokens, offsets, drafted, accepted, max_k,
                        MAX_TOKENS_C)


# ------------------------------------------------------------------------------------
# extend for a batch of indexes
# ------------------------------------------------------------------------------------

ctypedef struct job_t:    # one index's share of extend_batch, read without the GIL
    int64_t* tok
    level_t* levels
    int32_t* answers
    int64_t start         # the index's length before the call
    int64_t first         # its tokens are src[first:first + stop - start]
    int64_t stop
    int64_t lo, hi
    uint64_t* roll
    uint64_t* work
    uint64_t bpow
    int64_t n_levels
    bint earliest, rolling, piped

ctypedef struct tags_t:
    uint32_t tag[PIPE_LEVELS]
    uint32_t at[PIPE_LEVELS]  # the slot each level's probe starts from
    int lower                 # earliest: the shorter n's are to be peeked at too

cdef int64_t _batch_stamp = 0


cdef inline uint64_t _home(const level_t* lv, uint32_t tag) noexcept nogil:
    return (<uint64_t>tag) >> lv.shift if lv.shift < 32 else 0


cdef inline void _job_tags(const job_t* jb, int64_t L, tags_t* rg) noexcept nogil:
    """Stage 1 for the n-grams ending at L (a chained-hash job): their tags and home
    slots, and a prefetch of the home slots the probe will need first: every level's,
    or with ``prefer="earliest"`` only the longest n's (see ``_job_probe``)."""
    cdef int64_t d, top = jb.hi if jb.hi < L else L
    cdef uint64_t h = 0
    cdef const level_t* lv
    cdef uint32_t t
    rg.lower = 0
    for d in range(1, top + 1):
        h = _step(h, jb.tok[L - d])
        if d >= jb.lo:
            lv = &jb.levels[d - jb.lo]
            t = <uint32_t>(h >> 32)
            rg.tag[d - jb.lo] = t
            rg.at[d - jb.lo] = <uint32_t>_home(lv, t)
            if not jb.earliest or d == top:
                NGI_PREFETCH(&lv.slots[rg.at[d - jb.lo]])


cdef inline bint _peek_level(const job_t* jb, int64_t d, tags_t* rg,
                             uintptr_t* last) noexcept nogil:
    """Walk level d's chain from ``rg.at`` (its line prefetched a stage ago; linear
    probing puts about half the matches past the home slot) to the slot a probe will
    stop at and, where its tag matches, prefetch the history the compare will read:
    tok[e - d:e], one or two cache lines, each line once. The slot it stopped at is
    kept in ``rg.at``: slots never empty and tags never change during a pass, so every
    slot before it still holds another tag when the probe comes. True on a tag match."""
    cdef const level_t* lv = &jb.levels[d - jb.lo]
    cdef uint64_t mask = <uint64_t>(lv.cap - 1)
    cdef uint64_t idx = rg.at[d - jb.lo]
    cdef uint32_t tag = rg.tag[d - jb.lo]
    cdef const slot_t* sl
    cdef int steps
    cdef int32_t e
    cdef uintptr_t line
    cdef bint hit = False
    for steps in range(PEEK_STEPS):
        sl = &lv.slots[idx]
        e = sl.end
        if e < 0:
            break
        if sl.tag == tag:
            hit = True
            if e >= d:
                line = (<uintptr_t>&jb.tok[e - 1]) >> 6
                if line != last[0]:
                    NGI_PREFETCH_KEEP(&jb.tok[e - 1])
                    last[0] = line
                line = (<uintptr_t>&jb.tok[e - d]) >> 6
                if line != last[0]:
                    NGI_PREFETCH_KEEP(&jb.tok[e - d])
            break
        idx = (idx + 1) & mask
    rg.at[d - jb.lo] = <uint32_t>idx
    return hit


cdef inline void _job_peek_top(const job_t* jb, int64_t L, tags_t* rg) noexcept nogil:
    """Stage 2, ``prefer="earliest"`` only: peek at the longest n. Without a tag match
    there the shorter n's will be probed too: their home slots are prefetched now."""
    cdef int64_t d, top = jb.hi if jb.hi < L else L
    cdef uintptr_t last = 0
    if top < jb.lo:
        return
    if not _peek_level(jb, top, rg, &last):
        rg.lower = 1
        for d in range(jb.lo, top):
            NGI_PREFETCH(&jb.levels[d - jb.lo].slots[rg.at[d - jb.lo]])


cdef inline void _job_peek(const job_t* jb, int64_t L, tags_t* rg) noexcept nogil:
    """Stage 3: peek at every level still to be looked at (all of them for ``latest``;
    for ``earliest``, the shorter n's when the longest had no tag match)."""
    cdef int64_t d, top = jb.hi if jb.hi < L else L
    cdef uintptr_t last = 0
    if jb.earliest:
        if rg.lower:
            for d in range(top - 1, jb.lo - 1, -1):
                if _peek_level(jb, d, rg, &last):
                    break
    else:
        for d in range(jb.lo, top + 1):
            _peek_level(jb, d, rg, &last)


cdef inline void _job_probe(const job_t* jb, int64_t L, const tags_t* rg,
                            uint64_t* w) noexcept nogil:
    """Stage 4: probe (and insert) the n-grams ending at L. With ``prefer="earliest"``
    the longest n goes first and the probe stops at the first n found: every shorter
    n-gram ending at L is a suffix of that earlier occurrence, so its table already
    holds it (at its first occurrence, which earliest never moves) and nothing needs
    writing; those levels' answers are left unknown (-1), which nothing reads while a
    longer n has an answer."""
    cdef int64_t d, top = jb.hi if jb.hi < L else L
    if jb.earliest:
        d = top
        while d >= jb.lo:
            _probe_at(&jb.levels[d - jb.lo], rg.tag[d - jb.lo], rg.at[d - jb.lo], jb.tok, L,
                      d, True, &jb.answers[d - jb.lo], w)
            if jb.answers[d - jb.lo] >= 0:
                break
            d -= 1
        while d > jb.lo:
            d -= 1
            jb.answers[d - jb.lo] = -1
    else:
        for d in range(jb.lo, top + 1):
            _probe_at(&jb.levels[d - jb.lo], rg.tag[d - jb.lo], rg.at[d - jb.lo], jb.tok, L,
                      d, False, &jb.answers[d - jb.lo], w)
    for d in range(top + 1 if top >= jb.lo else jb.lo, jb.hi + 1):
        jb.answers[d - jb.lo] = -1
    w[0] += <uint64_t>top


cdef void _extend_jobs(job_t* jobs, int64_t b, const int64_t* src, const int32_t* job_of,
                       int64_t total, tags_t* ring) noexcept nogil:
    """Index every job's new tokens, positions of all jobs in one software pipeline:
    position p + PIPE_HASH is hashed and its first home slots prefetched, position
    p + PIPE_TOP peeks at its longest n (earliest), position p + PIPE_VERIFY's matching
    slots have their tokens prefetched, and position p is probed, so the cache misses of
    different requests overlap. Each job's positions are still probed in order, so the
    result equals one extend per index."""
    cdef int64_t i, p, q
    cdef job_t* jb
    cdef uint64_t w
    # the new tokens into each buffer
    for i in range(b):
        if i + 4 < b:
            NGI_PREFETCH_W(&jobs[i + 4].tok[jobs[i + 4].start])
        jb = &jobs[i]
        if jb.stop > jb.start:
            memcpy(&jb.tok[jb.start], &src[jb.first], <size_t>(jb.stop - jb.start) * sizeof(int64_t))
    for p in range(-PIPE_HASH, total):
        q = p + PIPE_HASH
        if q < total:
            jb = &jobs[job_of[q]]
            if jb.piped:
                _job_tags(jb, jb.start + (q - jb.first) + 1, &ring[q & (PIPE_RING - 1)])
        q = p + PIPE_TOP
        if 0 <= q < total:
            jb = &jobs[job_of[q]]
            if jb.piped and jb.earliest:
                _job_peek_top(jb, jb.start + (q - jb.first) + 1, &ring[q & (PIPE_RING - 1)])
        q = p + PIPE_VERIFY
        if 0 <= q < total:
            jb = &jobs[job_of[q]]
            if jb.piped:
                _job_peek(jb, jb.start + (q - jb.first) + 1, &ring[q & (PIPE_RING - 1)])
        if p >= 0:
            jb = &jobs[job_of[p]]
            if jb.piped:
                w = 0
                _job_probe(jb, jb.start + (p - jb.first) + 1, &ring[p & (PIPE_RING - 1)], &w)
                jb.work[0] += w
            elif p == jb.first:
                _index_range(jb.tok, jb.start, jb.stop, jb.levels, jb.answers, jb.lo, jb.hi,
                             jb.earliest, jb.rolling, jb.roll, jb.bpow, jb.work)


def extend_batch(indexes, tokens, offsets):
    """``extend`` for B indexes in one call: index ``i`` gets
    ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets``: B + 1 nondecreasing
    boundaries). The whole batch is indexed without the GIL, the hash-table cache
    misses of different indexes overlapping. All or nothing: refuses the whole batch,
    changing no index, when an index appears twice (ValueError) or is in use by
    another call (RuntimeError), or when one would exceed its capacity.
    """
    # every argument converted (Python code may run) and copied before any index is touched
    cdef list index_list = _index_list(indexes)
    cdef int64_t b = len(index_list), i, n
    # plain int64 arrays (the usual arguments) copied without the shared checks' calls
    if plain_int_width(tokens) == 8:
        src = _copy_int64(tokens)
    else:
        src = np.array(as_ids(tokens, "tokens"), dtype=np.int64, copy=True)
    if plain_int_width(offsets) == 8 and array_len(offsets) >= 1:
        off = _copy_int64(offsets)
    else:
        off = own_offsets(offsets)
    if off.shape[0] != b + 1:
        raise ValueError(
            f"offsets holds {off.shape[0]} entries for {b} indexes; it needs B + 1 = {b + 1}"
        )
    cdef const int64_t[::1] sv = src
    n = sv.shape[0]
    cdef const int64_t[::1] ov = off
    _check_run_offsets(off, &ov[0], b, n)
    cdef int64_t z = 0
    _extend_core(index_list, b, &sv[ov[0]] if ov[b] > ov[0] else &z, &ov[0], NULL, NULL, NULL, 0,
                 NULL, NULL)


cdef int _extend_core(list index_list, int64_t b, const int64_t* src, const int64_t* off,
                      const int64_t* drafted, const int64_t* accepted, const int64_t* limits,
                      int64_t kmax, int64_t* drafts, int64_t* lengths) except -1:
    """``extend_batch``'s work on checked arguments the caller owns: index ``i`` (every
    entry of ``index_list`` an NgramIndex) gets ``src[off[i] - off[0]:off[i + 1] -
    off[0]]``, ``off`` holding B + 1 nondecreasing entries. With ``drafts`` not NULL it
    also serves (``ngram_serve``): index ``i`` with ``drafted[i] > 0`` (``drafted`` not
    NULL) records its verified draft, then, in the same pass without the GIL as the
    extend, its draft of at most ``limits[i]`` tokens (clipped to ``kmax``, and to its
    ``draft_len`` when adaptive and ``drafted`` is not NULL) goes to
    ``drafts[i * kmax:]`` and its length to ``lengths[i]``."""
    global _batch_stamp
    cdef int64_t i, j, marked = 0, m, total, base
    cdef NgramIndex ix
    cdef int64_t stamp
    cdef job_t* jobs = NULL
    cdef int32_t* job_of = NULL
    cdef tags_t* ring = NULL
    cdef int64_t* lim = NULL
    _batch_stamp += 1
    stamp = _batch_stamp
    try:
        # the write guard on every index, all or nothing; no Python code runs in this loop
        for i in range(b):
            ix = <NgramIndex>index_list[i]
            _take_write(&ix._g, &ix._write_stamp, stamp, i)
            marked += 1
            # start loading what the next passes read
            NGI_PREFETCH(ix._levels)
            NGI_PREFETCH(ix._answers)
            if ix._len > 0:
                NGI_PREFETCH(&ix._tok[ix._len - 1])
        total = off[b] - off[0]
        base = off[0]
        jobs = <job_t*>malloc((b if b else 1) * sizeof(job_t))
        job_of = <int32_t*>malloc((total if total else 1) * sizeof(int32_t))
        ring = <tags_t*>malloc(PIPE_RING * sizeof(tags_t))
        if jobs == NULL or job_of == NULL or ring == NULL:
            raise MemoryError()
        # capacities checked and made (no index's content changes before the nogil pass,
        # so a refusal here leaves every index as it was)
        for i in range(b):
            ix = <NgramIndex>index_list[i]
            m = off[i + 1] - off[i]
            if ix._len + m > MAX_TOKENS_C:
                raise OverflowError(
                    f"an NgramIndex holds at most {MAX_INDEX_TOKENS} tokens; "
                    f"indexes[{i}] has {ix._len} + {m}, too many"
                )
            if ix._len + m > ix._cap:
                ix._grow_buffer(ix._len + m)
            for j in range(ix._n_levels):
                if (ix._levels[j].count + m) * 3 > ix._levels[j].cap * 2:
                    if _reserve(&ix._levels[j], ix._levels[j].count + m) < 0:
                        raise MemoryError(f"indexes[{i}]: NgramIndex could not grow its tables")
            jobs[i].tok = ix._tok
            jobs[i].levels = ix._levels
            jobs[i].answers = ix._answers
            jobs[i].n_levels = ix._n_levels
            jobs[i].start = ix._len
            jobs[i].first = off[i] - base
            jobs[i].stop = ix._len + m
            jobs[i].lo = ix._lo
            jobs[i].hi = ix._hi
            jobs[i].roll = &ix._roll
            jobs[i].work = &ix._work
            jobs[i].bpow = ix._bpow
            jobs[i].earliest = ix._earliest
            jobs[i].rolling = ix._rolling
            jobs[i].piped = not ix._rolling and ix._n_levels <= PIPE_LEVELS
            for j in range(off[i] - base, off[i + 1] - base):
                job_of[j] = <int32_t>i
        if drafted != NULL:
            # every total checked before the first record (an index is listed once)
            for i in range(b):
                ix = <NgramIndex>index_list[i]
                if not stats_fits(&ix._st, drafted[i], 0):
                    _check_total(ix._st.drafted, drafted[i])   # raises
        if drafts != NULL:
            lim = <int64_t*>malloc((b if b else 1) * sizeof(int64_t))
            if lim == NULL:
                raise MemoryError()
            # nothing below refuses: the verified drafts recorded, the limits set
            for i in range(b):
                lim[i] = limits[i]
                if drafted != NULL:
                    ix = <NgramIndex>index_list[i]
                    if drafted[i] > 0:
                        stats_record(&ix._st, drafted[i], accepted[i], GROW_C, SHRINK_C)
                    lim[i] = stats_limit(&ix._st, lim[i])
        with nogil:
            _extend_jobs(jobs, b, src, job_of, total, ring)
            if drafts != NULL:
                _propose_jobs(jobs, b, lim, kmax, drafts, lengths)
        for i in range(b):
            (<NgramIndex>index_list[i])._len = jobs[i].stop
    finally:
        for i in range(marked):
            guard_done_write(&(<NgramIndex>index_list[i])._g)
        free(jobs)
        free(job_of)
        free(ring)
        free(lim)
    return 0


cdef void _propose_jobs(const job_t* jobs, int64_t b, const int64_t* limits, int64_t kmax,
                        int64_t* drafts, int64_t* lengths) noexcept nogil:
    """``propose`` for every job after its extend: the draft of job ``i`` (at most
    ``min(limits[i], kmax)`` tokens) into ``drafts[i * kmax:]``, its length into
    ``lengths[i]``. The chosen occurrences' tokens are prefetched a few jobs ahead."""
    cdef int64_t i, j, k, end
    cdef const job_t* jb
    for i in range(b):          # the chosen ends first (each index's answers are cached)
        jb = &jobs[i]
        end = _chosen_end(jb.answers, jb.n_levels)
        lengths[i] = end
        if end >= 0:
            NGI_PREFETCH(&jb.tok[end])
    for i in range(b):
        jb = &jobs[i]
        end = lengths[i]
        k = limits[i] if limits[i] < kmax else kmax
        if end < 0 or k < 0:
            k = 0
        elif k > jb.stop - end:
            k = jb.stop - end
        for j in range(k):
            drafts[i * kmax + j] = jb.tok[end + j]
        lengths[i] = k


cdef int ngram_serve(list indexes, Py_ssize_t b, const int64_t* tokens,
                     const int64_t* offsets, const int64_t* drafted, const int64_t* accepted,
                     const int64_t* limits, Py_ssize_t k_cap, int64_t* out_tokens,
                     int64_t* out_lens) except -1:
    """The serving-step policy for B indexes (declared in
    ``specfsm._core.ngram_index.pxd``; ``serve``, ``serve_batch`` and the batch step
    run it): each index with ``drafted[i] > 0`` records ``(drafted[i], accepted[i])``,
    takes ``tokens[offsets[i] - offsets[0]:offsets[i + 1] - offsets[0]]``, and proposes
    at most ``min(limits[i], k_cap)`` tokens (and at most its ``draft_len`` when it is
    adaptive) into ``out_tokens[i * k_cap:]``, the count into ``out_lens[i]``. With
    ``drafted`` NULL nothing is recorded and ``draft_len`` does not bound the draft
    (the batch step's NgramIndex slots). Buffers are the caller's own (never changed
    meanwhile). Refuses what ``extend_batch`` and ``record_batch`` refuse, changing no
    index."""
    _check_serve_c(indexes, b, offsets, drafted, accepted, limits, k_cap)
    return _extend_core(indexes, b, tokens, offsets, drafted, accepted, limits, k_cap,
                        out_tokens, out_lens)
