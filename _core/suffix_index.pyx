# cython: language_level=3
"""Unbounded longest-match drafting over a suffix automaton (compiled).

Same names and behaviour as the twin ``specfsm._py.suffix_index`` (whose argument checks
this module imports, so both raise the same errors; the rule is in its docstring).

Layout. States are 16-byte records (length, suffix link, first end position, first
outgoing edge), plus a 4-byte last end position for ``prefer="latest"``. Edges are 8-byte records (target, next sibling of the same source) in
one array; an edge's token is not stored: it is the token at the target's first end
position. One open-addressing table of 8-byte slots (source state, edge number), at a
load factor of at most 2/3, maps (state, token) to the edge. Positions and state
numbers are 32-bit.

Thread safety. ``extend`` sets a writing flag before it converts its argument (that
conversion and the nogil indexing may let other threads run) and clears it last; while
it is set every other call on the index raises RuntimeError. ``propose_batch`` counts
itself as a reader for its nogil section and ``extend`` refuses to start while a reader
is counted, so no reader ever sees a buffer being moved or freed.
"""

import numpy as np

from specfsm._validate import check_count
from specfsm._py.ngram_index import (
    GROW_STEP,
    SHRINK_STEP,
    _as_ids,
    _check_batch_k,
    _check_draft_limits,
    _check_prefer,
    _check_record,
)
from specfsm._py.suffix_index import (
    MAX_SUFFIX_TOKENS,
    UNBOUNDED,
    _check_anchor,
    _check_restore,
    _check_suffix_range,
)

from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset

from _seq cimport Py_SIZE

__all__ = ["SuffixIndex", "propose_batch", "record_batch"]

cdef enum:
    NOGIL_MIN = 512       # extends shorter than this keep the GIL
    SMALL_LIST = 64       # extend() converts lists up to this long without numpy
    MIN_BITS = 4

ctypedef struct state_t:
    int32_t len           # length of the state's longest string
    int32_t link          # suffix link (-1 for the root)
    int32_t first         # first end position (inclusive) of its strings
    int32_t head          # first outgoing edge, -1: none

ctypedef struct edge_t:
    int32_t dst
    int32_t sib           # next edge of the same source, -1: none

ctypedef struct slot_t:
    int32_t src           # the edge's source state
    int32_t edge          # -1: empty

ctypedef struct sam_t:
    int64_t* tok          # the index's token buffer (owned by the numpy array _buf)
    state_t* st
    int32_t* last         # per state, its last end position (prefer="latest" only)
    int64_t n_st, cap_st
    edge_t* ed
    int64_t n_ed, cap_ed
    slot_t* sl
    int64_t cap_sl        # a power of two
    int shift             # 64 - log2(cap_sl): home slot = hash >> shift
    int32_t tail          # the state of the whole history
    int32_t s             # the state of the current (capped) match
    int64_t n             # its length
    int64_t end           # end (exclusive) of the chosen occurrence, -1: none
    int64_t lo, hi
    int64_t an, aspan     # anchor: set by matches >= an, drafts for aspan tokens after
    int64_t amiss
    int64_t anchor, carry, misses
    bint earliest
    bint unbounded        # max_n=None

ctypedef struct view_t:
    const int64_t* tok
    int64_t end
    int64_t k


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    x ^= x >> 30
    x *= <uint64_t>0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= <uint64_t>0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef inline uint64_t _hash(int32_t src, int64_t c) noexcept nogil:
    return _mix(<uint64_t>c * <uint64_t>0x9e3779b97f4a7c15ULL + <uint64_t><uint32_t>src)


cdef inline int32_t _find(const sam_t* m, int32_t src, int64_t c) noexcept nogil:
    """The edge (src, c), or -1."""
    cdef uint64_t mask = <uint64_t>(m.cap_sl - 1)
    cdef uint64_t idx = _hash(src, c) >> m.shift
    cdef int32_t e
    while True:
        e = m.sl[idx].edge
        if e < 0:
            return -1
        if m.sl[idx].src == src and m.tok[m.st[m.ed[e].dst].first] == c:
            return e
        idx = (idx + 1) & mask


cdef int _grow_slots(sam_t* m) noexcept nogil:
    """Double the slot table (rehashing each edge by its source and token); -1 when out
    of memory."""
    cdef int64_t cap = m.cap_sl * 2
    cdef int shift = m.shift - 1
    if shift < 32:
        return -1
    cdef slot_t* new = <slot_t*>malloc(cap * sizeof(slot_t))
    if new == NULL:
        return -1
    memset(new, 0xFF, cap * sizeof(slot_t))
    cdef uint64_t mask = <uint64_t>(cap - 1)
    cdef uint64_t i, j
    for i in range(<uint64_t>m.cap_sl):
        if m.sl[i].edge >= 0:
            j = _hash(m.sl[i].src, m.tok[m.st[m.ed[m.sl[i].edge].dst].first]) >> shift
            while new[j].edge >= 0:
                j = (j + 1) & mask
            new[j] = m.sl[i]
    free(m.sl)
    m.sl = new
    m.cap_sl = cap
    m.shift = shift
    return 0


cdef int _add_edge(sam_t* m, int32_t src, int64_t c, int32_t dst) noexcept nogil:
    """Insert edge (src, c) -> dst, known to be absent; -1 when out of memory."""
    cdef edge_t* ne
    cdef int64_t cap
    if (m.n_ed + 1) * 3 > m.cap_sl * 2:
        if _grow_slots(m) < 0:
            return -1
    if m.n_ed >= 0x7FFFFFFF:
        return -1         # edge numbers are 32-bit
    if m.n_ed == m.cap_ed:
        cap = m.cap_ed + (m.cap_ed >> 1)
        ne = <edge_t*>realloc(m.ed, cap * sizeof(edge_t))
        if ne == NULL:
            return -1
        m.ed = ne
        m.cap_ed = cap
    cdef int32_t e = <int32_t>m.n_ed
    m.n_ed += 1
    m.ed[e].dst = dst
    m.ed[e].sib = m.st[src].head
    m.st[src].head = e
    cdef uint64_t mask = <uint64_t>(m.cap_sl - 1)
    cdef uint64_t idx = _hash(src, c) >> m.shift
    while m.sl[idx].edge >= 0:
        idx = (idx + 1) & mask
    m.sl[idx].src = src
    m.sl[idx].edge = e
    return 0


cdef int32_t _new_state(sam_t* m, int32_t ln, int32_t link, int32_t first, int32_t last) noexcept nogil:
    cdef state_t* ns
    cdef int32_t* nl
    cdef int64_t cap
    if m.n_st >= 0x7FFFFFFF:
        return -1
    if m.n_st == m.cap_st:
        cap = m.cap_st + (m.cap_st >> 1)
        if m.last != NULL:
            nl = <int32_t*>realloc(m.last, cap * sizeof(int32_t))
            if nl == NULL:
                return -1
            m.last = nl
        ns = <state_t*>realloc(m.st, cap * sizeof(state_t))
        if ns == NULL:
            return -1     # m.last may be larger than cap_st: harmless
        m.st = ns
        m.cap_st = cap
    cdef int32_t v = <int32_t>m.n_st
    m.n_st += 1
    m.st[v].len = ln
    m.st[v].link = link
    m.st[v].first = first
    if m.last != NULL:
        m.last[v] = last
    m.st[v].head = -1
    return v


cdef int _add(sam_t* m, int64_t i) noexcept nogil:
    """Index the token at position i (already in the buffer); -1 when out of memory."""
    cdef int64_t c = m.tok[i]
    cdef int32_t cur, p, q, clone, e, s, v
    cdef int64_t n
    cur = _new_state(m, m.st[m.tail].len + 1, -1, <int32_t>i, <int32_t>i)
    if cur < 0:
        return -1
    p = m.tail
    e = -1
    while p != -1:
        e = _find(m, p, c)
        if e >= 0:
            break
        if _add_edge(m, p, c, cur) < 0:
            return -1
        p = m.st[p].link
    s = m.s
    n = m.n
    if p == -1:
        m.st[cur].link = 0
    else:
        q = m.ed[e].dst
        if m.st[p].len + 1 == m.st[q].len:
            m.st[cur].link = q
        else:
            clone = _new_state(m, m.st[p].len + 1, m.st[q].link, m.st[q].first,
                               m.last[q] if m.last != NULL else -1)
            if clone < 0:
                return -1
            e = m.st[q].head
            while e >= 0:
                if _add_edge(m, clone, m.tok[m.st[m.ed[e].dst].first], m.ed[e].dst) < 0:
                    return -1
                e = m.ed[e].sib
            while p != -1:
                e = _find(m, p, c)
                if e < 0 or m.ed[e].dst != q:
                    break
                m.ed[e].dst = clone
                p = m.st[p].link
            m.st[q].link = clone
            m.st[cur].link = clone
            if s == q and n <= m.st[clone].len:
                s = clone
    m.tail = cur
    if m.unbounded:
        s = m.st[cur].link
        n = m.st[s].len
    else:
        while True:
            e = _find(m, s, c)
            if e >= 0 and m.ed[e].dst != cur:
                s = m.ed[e].dst
                n += 1
                break
            if s == 0:
                n = 0
                break
            s = m.st[s].link
            n = m.st[s].len
        if n > m.hi:
            n = m.hi
            if m.st[m.st[s].link].len >= n:
                s = m.st[s].link
    m.s = s
    m.n = n
    if n >= m.lo:
        m.end = (m.st[s].first if m.earliest else m.last[s]) + 1
    else:
        m.end = -1
    if m.an:
        if m.end >= 0 and n >= m.an:
            m.anchor = m.end
            m.carry = 0
            m.misses = 0
        elif m.anchor >= 0 and m.carry <= m.aspan and m.misses <= m.amiss:
            if m.tok[m.anchor] != c:
                m.misses += 1
            m.anchor += 1
            m.carry += 1
    if not m.earliest:
        v = s
        while v > 0 and m.st[v].len >= m.lo:
            m.last[v] = <int32_t>i
            v = m.st[v].link
    return 0


cdef inline int64_t _start(const sam_t* m) noexcept nogil:
    """Where the draft starts: the anchor while it applies, else the match's end."""
    if m.an and m.anchor >= 0 and m.carry <= m.aspan and m.misses <= m.amiss:
        return m.anchor
    return m.end


cdef int64_t _add_range(sam_t* m, int64_t start, int64_t stop) noexcept nogil:
    """Index positions start..stop-1; returns the first position not indexed."""
    cdef int64_t i
    for i in range(start, stop):
        if _add(m, i) < 0:
            return i
    return stop


cdef class SuffixIndex:
    """An incremental longest-match index over one request's verified tokens.

    ``extend`` appends tokens (amortised O(1) per token); ``propose(max_k)`` returns, as
    a list, the tokens that followed the chosen earlier occurrence of the longest
    matching suffix, in O(max_k). ``max_n=None`` puts no cap on the match length. The
    draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. ``anchor_n``, ``anchor_span`` and ``anchor_misses``: see the twin.
    """

    cdef sam_t m
    cdef object _buf                 # int64 ndarray holding the tokens
    cdef int64_t _len, _cap
    cdef int _readers, _writing, _broken
    cdef bint _adaptive
    cdef int64_t _k, _kmin, _kmax
    cdef int64_t _steps, _drafted, _accepted, _full

    def __cinit__(self):
        memset(&self.m, 0, sizeof(sam_t))
        self._writing = 1            # unusable until __init__ completes

    def __init__(self, min_n=1, max_n=None, prefer="earliest", *, draft_len=8, adaptive=False,
                 min_draft=1, max_draft=32, anchor_n=0, anchor_span=64, anchor_misses=4):
        if self.m.st != NULL:
            raise RuntimeError("SuffixIndex.__init__ may be called only once")
        lo, hi = _check_suffix_range(min_n, max_n)
        an, aspan, amiss = _check_anchor(anchor_n, anchor_span, anchor_misses)
        earliest = _check_prefer(prefer) == 1
        k, kmin, kmax = _check_draft_limits(draft_len, min_draft, max_draft)
        adaptive = bool(adaptive)
        self._adaptive = adaptive
        self._k = min(k, MAX_SUFFIX_TOKENS)
        self._kmin = min(kmin, MAX_SUFFIX_TOKENS)
        self._kmax = min(kmax, MAX_SUFFIX_TOKENS)
        self._steps = self._drafted = self._accepted = self._full = 0
        self._len = 0
        self._cap = 64
        self._buf = np.zeros(self._cap, dtype=np.int64)
        cdef int64_t[::1] bv = self._buf
        self.m.tok = &bv[0]
        self.m.lo = lo
        self.m.hi = hi
        self.m.earliest = earliest
        self.m.unbounded = hi >= UNBOUNDED
        self.m.an = an
        self.m.aspan = aspan
        self.m.amiss = amiss
        self.m.misses = 0
        self.m.anchor = -1
        self.m.carry = 0
        self.m.cap_st = 64
        self.m.cap_ed = 64
        self.m.cap_sl = 1 << MIN_BITS
        self.m.shift = 64 - MIN_BITS
        self.m.st = <state_t*>malloc(self.m.cap_st * sizeof(state_t))
        if not earliest:
            self.m.last = <int32_t*>malloc(self.m.cap_st * sizeof(int32_t))
            if self.m.last == NULL:
                raise MemoryError()
            self.m.last[0] = -1
        self.m.ed = <edge_t*>malloc(self.m.cap_ed * sizeof(edge_t))
        self.m.sl = <slot_t*>malloc(self.m.cap_sl * sizeof(slot_t))
        if self.m.st == NULL or self.m.ed == NULL or self.m.sl == NULL:
            raise MemoryError()
        memset(self.m.sl, 0xFF, self.m.cap_sl * sizeof(slot_t))
        self.m.n_st = 1
        self.m.st[0].len = 0
        self.m.st[0].link = -1
        self.m.st[0].first = -1
        self.m.st[0].head = -1
        self.m.n_ed = 0
        self.m.tail = 0
        self.m.s = 0
        self.m.n = 0
        self.m.end = -1
        self._writing = 0

    def __dealloc__(self):
        free(self.m.st)
        free(self.m.last)
        free(self.m.ed)
        free(self.m.sl)

    cdef int _check_ready(self) except -1:
        if self.m.st == NULL:
            raise RuntimeError("SuffixIndex was not initialised")
        if self._writing:
            raise RuntimeError("SuffixIndex is being extended by another thread")
        if self._broken:
            raise RuntimeError("SuffixIndex ran out of memory while extending and is unusable")
        return 0

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self):
        return self.m.lo

    @property
    def max_n(self):
        return None if self.m.hi >= UNBOUNDED else self.m.hi

    @property
    def prefer(self):
        return "earliest" if self.m.earliest else "latest"

    @property
    def adaptive(self):
        return bool(self._adaptive)

    @property
    def draft_len(self):
        """The draft length ``propose()`` uses when ``max_k`` is None."""
        return self._k

    # -- contents -------------------------------------------------------------------
    def __len__(self):
        return self._len

    @property
    def tokens(self):
        """The indexed tokens, as a read-only int64 view of the index's buffer."""
        if self._buf is None:
            return np.zeros(0, dtype=np.int64)
        v = self._buf[: self._len]
        v.flags.writeable = False
        return v

    @property
    def n_edges(self):
        """Transitions of the automaton."""
        return self.m.n_ed

    @property
    def n_states(self):
        """States of the automaton, the root included."""
        return self.m.n_st

    @property
    def nbytes(self):
        """Bytes this index holds: token buffer, states, edges and the edge table."""
        if self.m.st == NULL:
            return 0
        return (self._buf.nbytes + self.m.cap_st * sizeof(state_t)
                + (self.m.cap_st * sizeof(int32_t) if self.m.last != NULL else 0)
                + self.m.cap_ed * sizeof(edge_t) + self.m.cap_sl * sizeof(slot_t))

    @property
    def bytes_per_token(self):
        """``nbytes`` per indexed token (0.0 while empty)."""
        return self.nbytes / (<double>self._len) if self._len else 0.0

    cdef int _grow_buffer(self, int64_t need) except -1:
        cdef int64_t cap = self._cap
        while cap < need:
            cap = cap + (cap >> 1) + 16
        if cap > MAX_SUFFIX_TOKENS + 1:
            cap = MAX_SUFFIX_TOKENS + 1
        new = np.empty(cap, dtype=np.int64)
        new[: self._len] = self._buf[: self._len]
        cdef int64_t[::1] nv = new
        self._buf = new              # views handed out keep the old buffer alive
        self.m.tok = &nv[0]
        self._cap = cap
        return 0

    def extend(self, tokens):
        """Append verified tokens (a list, tuple or 1-D integer array) to the index."""
        cdef int64_t m, i, v
        cdef Py_ssize_t n
        # take the guard first: nothing below may run while another call holds it
        self._check_ready()
        if self._readers:
            raise RuntimeError("SuffixIndex is being read by a batch proposal in another thread")
        self._writing = 1
        try:
            if type(tokens) is list and Py_SIZE(tokens) <= SMALL_LIST:
                n = Py_SIZE(tokens)
                if self._len + n > self._cap and self._len + n <= MAX_SUFFIX_TOKENS:
                    self._grow_buffer(self._len + n)
                if self._len + n <= self._cap and n == Py_SIZE(tokens):
                    for i in range(n):
                        t = (<list>tokens)[i]
                        if type(t) is not int:
                            break
                        try:
                            v = t
                        except OverflowError:
                            break
                        self.m.tok[self._len + i] = v
                    else:
                        self._ingest(n)
                        return
            arr = _as_ids(tokens, "tokens")
            m = arr.shape[0]
            if m == 0:
                return
            if self._len + m > MAX_SUFFIX_TOKENS:
                raise OverflowError(
                    f"a SuffixIndex holds at most {MAX_SUFFIX_TOKENS} tokens; "
                    f"{self._len} + {m} is too many"
                )
            if self._len + m > self._cap:
                self._grow_buffer(self._len + m)
            self._buf[self._len : self._len + m] = arr
            self._ingest(m)
        finally:
            self._writing = 0

    def append(self, token):
        """Append one verified token."""
        cdef int64_t v
        if (type(token) is int and self._len < self._cap and not self._writing
                and not self._readers and not self._broken and self.m.st != NULL):
            try:
                v = token
            except OverflowError:
                pass
            else:
                self._writing = 1
                self.m.tok[self._len] = v
                try:
                    self._ingest(1)
                finally:
                    self._writing = 0
                return
        self.extend([token])

    cdef int _ingest(self, int64_t m) except -1:
        """Index the m tokens already written at positions _len.._len + m - 1 (the
        caller holds the writing flag)."""
        cdef int64_t start = self._len, total = self._len + m, done
        if m == 0:
            return 0
        if m >= NOGIL_MIN:
            with nogil:
                done = _add_range(&self.m, start, total)
        else:
            done = _add_range(&self.m, start, total)
        self._len = done
        if done < total:
            self._broken = 1
            raise MemoryError(
                f"SuffixIndex could not grow its tables (after {done} tokens): out of memory "
                "or past 2**31 - 1 states or edges; the index is unusable now"
            )
        return 0

    def propose(self, max_k=None):
        """The draft: up to ``max_k`` tokens (``draft_len`` when None) that followed the
        chosen earlier occurrence of the longest matching suffix; empty when none."""
        cdef int64_t k, end, i, stop
        if self._writing or self._broken:
            self._check_ready()
        if max_k is None:
            k = self._k
        else:
            if type(max_k) is not int or max_k < 0:
                max_k = check_count(max_k, "max_k")
            k = max_k if max_k < self._len else self._len
        end = _start(&self.m)
        if end < 0 or k <= 0:
            return []
        stop = end + k if end + k < self._len else self._len
        cdef const int64_t* tok = self.m.tok
        return [tok[i] for i in range(end, stop)]

    def lookup(self, context, max_k=None):
        """Match another sequence against the index: the longest suffix of ``context``
        (at least ``min_n``, at most ``max_n`` tokens) that occurs anywhere in the
        indexed tokens, and up to ``max_k`` (``draft_len`` when None) tokens after its
        first occurrence. Returns ``(n, draft)``; ``(0, [])`` when none."""
        cdef int64_t k, n = 0, i, e, stop, c
        cdef int32_t s = 0, ed
        self._check_ready()
        if max_k is None:
            k = self._k
        else:
            k = min(check_count(max_k, "max_k"), MAX_SUFFIX_TOKENS)
        arr = np.ascontiguousarray(_as_ids(context, "context"), dtype=np.int64)
        cdef const int64_t[::1] cv = arr
        # converting may have let another thread in: check again, then keep the GIL
        self._check_ready()
        cdef sam_t* m = &self.m
        for i in range(cv.shape[0]):
            c = cv[i]
            while s != 0 and _find(m, s, c) < 0:
                s = m.st[s].link
                n = m.st[s].len
            ed = _find(m, s, c)
            if ed < 0:
                s = 0
                n = 0
            else:
                s = m.ed[ed].dst
                n += 1
        if n > m.hi:
            n = m.hi
            while m.st[m.st[s].link].len >= n:
                s = m.st[s].link
        if n < m.lo or n == 0:
            return 0, []
        e = m.st[s].first + 1
        stop = e + k if e + k < self._len else self._len
        cdef const int64_t* tok = m.tok
        return n, [tok[i] for i in range(e, stop)]

    def match_length(self):
        """The n of the current match (0 when nothing matches)."""
        self._check_ready()
        return self.m.n if self.m.end >= 0 else 0

    def match_end(self):
        """Where the draft starts: the end (exclusive) of the chosen earlier occurrence,
        or the anchor when it applies; -1 when there is nothing to draft."""
        self._check_ready()
        return _start(&self.m)

    @property
    def anchor_n(self):
        """Matches at least this long set the anchor (0: no anchor)."""
        return self.m.an

    @property
    def anchor_span(self):
        """How many tokens past the last long match the anchor keeps drafting."""
        return self.m.aspan

    @property
    def anchor_misses(self):
        """How many appended tokens may differ from the anchored text before the anchor
        is dropped."""
        return self.m.amiss

    # -- acceptance statistics and the adaptive draft length ---------------------
    def record(self, proposed, accepted):
        """Record that ``accepted`` of ``proposed`` drafted tokens were accepted; returns
        the draft length to use next (changed only when ``adaptive``)."""
        p, a = _check_record(proposed, accepted)
        self._record(p, a)
        return self._k

    cdef void _record(self, int64_t p, int64_t a) noexcept:
        self._steps += 1
        self._drafted += p
        self._accepted += a
        if p > 0 and a == p:
            self._full += 1
        if self._adaptive and p > 0:
            if a == p:
                self._k = min(self._k + GROW_STEP, self._kmax)
            else:
                self._k = max(self._k - SHRINK_STEP, self._kmin)

    @property
    def stats(self):
        """Acceptance statistics: steps recorded, tokens drafted and accepted, fully
        accepted drafts, the acceptance rate and the current draft length."""
        return {
            "steps": self._steps,
            "drafted": self._drafted,
            "accepted": self._accepted,
            "full_accepts": self._full,
            "acceptance_rate": (<double>self._accepted) / self._drafted if self._drafted else 0.0,
            "draft_len": self._k,
        }

    def __repr__(self):
        return (
            f"SuffixIndex(min_n={self.m.lo}, max_n={self.max_n}, prefer={self.prefer!r}, "
            f"len={self._len})"
        )

    def __reduce__(self):
        # pickled (and copied) as its settings, tokens and statistics; re-indexed on load
        self._check_ready()
        return (
            _rebuild,
            (type(self), self.m.lo, self.max_n, self.prefer, self._k, bool(self._adaptive),
             self._kmin, self._kmax, np.array(self.tokens),
             (self._steps, self._drafted, self._accepted, self._full), self.m.an, self.m.aspan,
             self.m.amiss),
        )

    def _restore_stats(self, stats):
        steps, drafted, accepted, full = _check_restore(stats)
        self._steps, self._drafted, self._accepted, self._full = steps, drafted, accepted, full


def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats, an=0, aspan=64, amiss=4):
    if not (isinstance(cls, type) and issubclass(cls, SuffixIndex)):
        raise TypeError(f"cannot rebuild a SuffixIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=bool(adaptive), min_draft=kmin,
             max_draft=kmax, anchor_n=an, anchor_span=aspan, anchor_misses=amiss)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix


cdef list _index_list(object indexes):
    if isinstance(indexes, SuffixIndex):
        raise TypeError("indexes must be a sequence of SuffixIndex, got a single SuffixIndex")
    try:
        out = list(indexes)
    except TypeError:
        raise TypeError(
            f"indexes must be a sequence of SuffixIndex, got {type(indexes).__name__}"
        ) from None
    cdef Py_ssize_t i
    for i in range(len(out)):
        if not isinstance(out[i], SuffixIndex):
            ix = out[i]
            raise TypeError(
                f"indexes[{i}] must be a SuffixIndex of the same implementation, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )
    return out


cdef void _copy_views(const view_t* views, int64_t b, int64_t* out, int64_t* out_off,
                      int64_t* lengths) noexcept nogil:
    cdef int64_t i, j, w = 0
    out_off[0] = 0
    for i in range(b):
        for j in range(views[i].k):
            out[w + j] = views[i].tok[views[i].end + j]
        w += views[i].k
        lengths[i] = views[i].k
        out_off[i + 1] = w


def propose_batch(indexes, max_k=None):
    """``propose`` for B indexes in one call, the copying done without the GIL.

    ``max_k`` is one count, one per index, or None for each index's ``draft_len``.
    Returns ``(drafts, offsets, lengths)`` (int64).
    """
    cdef list ixs = _index_list(indexes)
    cdef int64_t b = len(ixs), i, k, end, bound = 0
    cdef SuffixIndex ix
    ks = _check_batch_k(max_k, b, [(<SuffixIndex>x)._k for x in ixs])
    cdef const int64_t[::1] kv = ks
    cdef view_t* views = <view_t*>malloc((b if b else 1) * sizeof(view_t))
    if views == NULL:
        raise MemoryError()
    cdef int64_t taken = 0
    try:
        # count every index as read before looking at any, so none can move under us
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            ix._check_ready()
            ix._readers += 1
            taken += 1
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            end = _start(&ix.m)
            k = kv[i]
            if end < 0:
                k = 0
            elif k > ix._len - end:
                k = ix._len - end
            views[i].tok = ix.m.tok
            views[i].end = end if end >= 0 else 0
            views[i].k = k
            bound += k
        out = np.empty(bound, dtype=np.int64)
        out_off = np.empty(b + 1, dtype=np.int64)
        lengths = np.empty(b, dtype=np.int64)
        _run_views(views, b, out, out_off, lengths)
    finally:
        for i in range(taken):
            (<SuffixIndex>ixs[i])._readers -= 1
        free(views)
    return out, out_off, lengths


cdef int _run_views(const view_t* views, int64_t b, object out, object out_off, object lengths) except -1:
    cdef int64_t[::1] o = out
    cdef int64_t[::1] oo = out_off
    cdef int64_t[::1] ln = lengths
    cdef int64_t z = 0
    with nogil:
        _copy_views(views, b, &o[0] if o.shape[0] else &z, &oo[0], &ln[0] if b else &z)
    return 0


def record_batch(indexes, proposed, accepted):
    """``record`` for B indexes: one count each in ``proposed`` and ``accepted``.
    Returns the next draft lengths (int64)."""
    cdef list ixs = _index_list(indexes)
    cdef int64_t b = len(ixs), i
    p = _check_batch_k(proposed, b, None, "proposed")
    a = _check_batch_k(accepted, b, None, "accepted")
    cdef const int64_t[::1] pv = p
    cdef const int64_t[::1] av = a
    for i in range(b):
        if av[i] > pv[i]:
            raise ValueError(f"accepted[{i}]={av[i]} is beyond the {pv[i]} drafted tokens")
    out = np.empty(b, dtype=np.int64)
    cdef int64_t[::1] ov = out
    cdef SuffixIndex ix
    for i in range(b):
        ix = <SuffixIndex>ixs[i]
        ix._record(pv[i], av[i])
        ov[i] = ix._k
    return out
