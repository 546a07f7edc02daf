# cython: language_level=3
"""Unbounded longest-match drafting over a suffix automaton (compiled).

Same names and behaviour as the twin ``specfsm._py.suffix_index``; both take their
argument checks from ``specfsm._validate``, so both raise the same errors.

Layout (about 30 bytes per token on source code: the history, 4 bytes per position,
and what repeats add). A suffix automaton built online creates one state per position,
plus "clones" where a repeat splits a state. The state created for position ``i`` gets
the id ``i + 1`` (id 0 is the root, the empty prefix): its length is its id, its first
end position is ``id - 1``, and its transition on the next token, ``tok[id]``, goes to
state ``id + 1`` and is never redirected, so only its suffix link is stored (4 bytes).
Clones (ids from ``CLONE`` on) are 16-byte records: length, suffix link, first end
position and the target of their transition on ``tok[first + 1]`` (every state has
that one: the token after its first occurrence). All other transitions (those of
clones with two or more, and the rare extra ones of position states, the root's
first) are 12-byte edges (target, next edge of the same source, the token's low 32
bits) found through one open-addressing table of 8-byte slots (source, edge) at a load
of at most 3/4; a table keyed by state holds the first edge of each state that has
any (a bit per position and a bit in the clone's length say which do). The history is
kept as int32 while every token fits, as int64 from the first one that does not (the
edge's 32 bits then only pick candidates: the whole token is read from the history).
``prefer="latest"`` adds a 4-byte last end position per state.

Thread safety: the shared guard protocol (``_core/_guard.pxd``). ``extend``,
``append``, ``extend_batch`` (and the serving-step policy, ``suffix_serve``)
hold the writer flag from before they convert their arguments (that conversion, numpy
copies and the nogil indexing may let other threads run) until they are done; while it
is held every other call on the index, properties included, raises RuntimeError.
Readers that may let other threads run (``tokens``, ``last_tokens``, pickling,
``propose_batch``) count themselves and writers refuse to start while one is counted;
the other reads never release the GIL after their check and only check. An index made
with ``__new__``, or whose ``__init__`` failed, refuses every call; so does one that ran
out of memory part way through an extend.
"""

import numpy as np

from specfsm._validate import (
    GROW_STEP,
    MAX_SUFFIX_TOKENS,
    SHRINK_STEP,
    UNBOUNDED,
    as_ids,
    check_anchor,
    check_batch_counts,
    check_count,
    check_draft_limits,
    check_prefer,
    check_record,
    check_suffix_range,
    check_suffix_stats as _check_index_stats,
    _check_total,
    own_batch_arrays,
    validate_offsets,
)

from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memset

from _seq cimport Py_SIZE
from _guard cimport (
    GUARD_READY,
    guard_begin_init,
    guard_break,
    guard_check,
    guard_done_read,
    guard_done_write,
    guard_end_init,
    guard_read,
    guard_t,
    guard_write,
)
from _index_stats cimport index_stats_t, stats_fits, stats_init, stats_limit, stats_record

__all__ = ["SuffixIndex", "extend_batch", "propose_batch", "record_batch", "serve_batch"]

NAME = "SuffixIndex"           # the guard's refusals name the class
WHAT = "a SuffixIndex"         # ... and messages name an instance

cdef extern from "prefetch.h" nogil:
    void SFX_PREFETCH "NGI_PREFETCH" (const void* p)

cdef enum:
    PREFETCH_AHEAD = 8    # _grow_slots: slots between the prefetch stages
    PIPE_AHEAD = 4        # extend_batch: indexes between the prefetch stages
    NOGIL_MIN = 512       # extends shorter than this keep the GIL
    SMALL_LIST = 64       # extend() converts lists up to this long without numpy
    MIN_SLOTS = 16
    CLONE = 1 << 30       # state ids from here on are clones; below it, positions + 1
    REF_SOLID = -2        # _find: a position state's transition on the next token
    REF_FIRST = -3        # _find: a clone's transition on the token after its first end
    LEN_MASK = (1 << 30) - 1
    HAS_EDGES = 1 << 30   # in clone_t.len: the clone has table edges

cdef int64_t INT32_LO = -2147483648
cdef int64_t INT32_HI = 2147483647
cdef int64_t MAX_TOKENS_C = MAX_SUFFIX_TOKENS

include "_index_common.pxi"
include "_serve.pxi"

ctypedef struct clone_t:
    int32_t len           # length of the clone's longest string; bit 30: has table edges
    int32_t link          # suffix link
    int32_t first         # first end position (inclusive) of its strings
    int32_t dst           # target of its transition on tok[first + 1], -1: none

ctypedef struct edge_t:
    int32_t dst
    int32_t sib           # next edge of the same source, -1: none
    int32_t tok           # its token's low 32 bits (the token itself while narrow)

ctypedef struct slot_t:
    int32_t src           # the edge's source state
    int32_t edge          # -1: empty

ctypedef struct head_t:   # the edge list of a state that has table edges
    int32_t state         # -1: empty
    int32_t head

ctypedef struct sam_t:
    int32_t* t32          # the history (the index's numpy buffer), int32 while narrow
    int64_t* t64          # ... or int64 once wide
    bint wide
    int64_t npos          # positions indexed: position states 0..npos exist
    int32_t* plink        # per position state: suffix link
    int32_t* plast        # per position state: last end position (prefer="latest" only)
    uint8_t* pbits        # per position state, one bit: it has edges in the table
    clone_t* cl
    int32_t* clast        # per clone: last end position (prefer="latest" only)
    int64_t n_cl, cap_cl
    edge_t* ed
    int64_t n_ed, cap_ed
    slot_t* sl
    int64_t cap_sl        # any size >= MIN_SLOTS (home slot by multiply-shift)
    head_t* hd
    int64_t n_hd, cap_hd  # any size >= 8 (home slot by multiply-shift)
    int32_t tail          # the state of the whole history
    int32_t cursor        # the state of the current (capped) match
    int64_t match_len     # its length
    int64_t match_end     # end (exclusive) of the chosen occurrence, -1: none
    int64_t min_n, max_n
    int64_t anchor_n      # anchor: set by matches of at least anchor_n tokens,
    int64_t anchor_span   # drafts for anchor_span tokens after,
    int64_t anchor_misses # while at most anchor_misses of them differed
    int64_t anchor        # where the anchored continuation has got to, -1: none
    int64_t carry         # tokens appended since the anchor was set
    int64_t misses        # of which differed from the anchored text
    bint earliest
    bint unbounded        # max_n=None

ctypedef struct view_t:
    const int32_t* t32
    const int64_t* t64
    bint wide
    int64_t end
    int64_t k

ctypedef struct job_t:    # one index's share of extend_batch, read without the GIL
    sam_t* m
    const int64_t* src    # its new tokens (in the call's own copy)
    int64_t start, stop, done


# ------------------------------------------------------------------------------------
# the automaton
# ------------------------------------------------------------------------------------

cdef inline int64_t _tk(const sam_t* m, int64_t i) noexcept nogil:
    """The token at position i."""
    if m.wide:
        return m.t64[i]
    return m.t32[i]


cdef inline int32_t _len(const sam_t* m, int32_t v) noexcept nogil:
    if v >= CLONE:
        return m.cl[v - CLONE].len & LEN_MASK
    return v


cdef inline int32_t _link(const sam_t* m, int32_t v) noexcept nogil:
    if v >= CLONE:
        return m.cl[v - CLONE].link
    return m.plink[v]


cdef inline int32_t _first(const sam_t* m, int32_t v) noexcept nogil:
    if v >= CLONE:
        return m.cl[v - CLONE].first
    return v - 1


cdef inline int32_t _last(const sam_t* m, int32_t v) noexcept nogil:
    if v >= CLONE:
        return m.clast[v - CLONE]
    return m.plast[v]


cdef inline void _set_last(sam_t* m, int32_t v, int32_t x) noexcept nogil:
    if v >= CLONE:
        m.clast[v - CLONE] = x
    else:
        m.plast[v] = x


cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    x ^= x >> 30
    x *= <uint64_t>0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= <uint64_t>0x94d049bb133111ebULL
    x ^= x >> 31
    return x


cdef inline uint64_t _home(int32_t src, uint32_t c32, int64_t cap) noexcept nogil:
    """The home slot of edge (src, c) in a table of cap slots, from the token's low 32
    bits (tokens agreeing there share a home; lookups compare whole tokens)."""
    cdef uint64_t h = _mix(((<uint64_t>c32) << 32) | <uint64_t><uint32_t>src)
    return ((h >> 32) * <uint64_t>cap) >> 32


cdef inline bint _has_edges(const sam_t* m, int32_t v) noexcept nogil:
    """Whether v has edges in the table."""
    if v >= CLONE:
        return (m.cl[v - CLONE].len & HAS_EDGES) != 0
    return (m.pbits[v >> 3] >> (v & 7)) & 1


cdef inline uint64_t _head_home(int32_t v, int64_t cap) noexcept nogil:
    return ((_mix(<uint64_t><uint32_t>v) >> 32) * <uint64_t>cap) >> 32


cdef inline int32_t _head(const sam_t* m, int32_t v) noexcept nogil:
    """The first table edge of v, -1: none."""
    cdef uint64_t idx
    if not _has_edges(m, v):
        return -1
    idx = _head_home(v, m.cap_hd)
    while m.hd[idx].state >= 0:
        if m.hd[idx].state == v:
            return m.hd[idx].head
        idx += 1
        if idx == <uint64_t>m.cap_hd:
            idx = 0
    return -1


cdef int _set_head(sam_t* m, int32_t v, int32_t e) noexcept nogil:
    """Make e the first table edge of v; -1 when out of memory."""
    cdef uint64_t idx
    cdef head_t* nh
    cdef int64_t cap, i
    if (m.n_hd + 1) * 4 > m.cap_hd * 3:
        cap = m.cap_hd + (m.cap_hd >> 1)
        if cap >= (<int64_t>1 << 32):
            return -1
        nh = <head_t*>malloc(cap * sizeof(head_t))
        if nh == NULL:
            return -1
        memset(nh, 0xFF, cap * sizeof(head_t))
        for i in range(m.cap_hd):
            if m.hd[i].state >= 0:
                idx = _head_home(m.hd[i].state, cap)
                while nh[idx].state >= 0:
                    idx += 1
                    if idx == <uint64_t>cap:
                        idx = 0
                nh[idx] = m.hd[i]
        free(m.hd)
        m.hd = nh
        m.cap_hd = cap
    idx = _head_home(v, m.cap_hd)
    while m.hd[idx].state >= 0:
        if m.hd[idx].state == v:
            m.hd[idx].head = e
            return 0
        idx += 1
        if idx == <uint64_t>m.cap_hd:
            idx = 0
    m.hd[idx].state = v
    m.hd[idx].head = e
    m.n_hd += 1
    if v >= CLONE:
        m.cl[v - CLONE].len |= HAS_EDGES
    else:
        m.pbits[v >> 3] |= <uint8_t>(1 << (v & 7))
    return 0


cdef inline int32_t _find(const sam_t* m, int32_t v, int64_t c, int32_t* ref) noexcept nogil:
    """The target of v's transition on c, -1: none; ``ref`` says where it is stored
    (REF_SOLID, REF_FIRST, or an edge number)."""
    cdef const clone_t* r
    cdef uint64_t idx
    cdef int32_t e, d
    if v >= CLONE:
        r = &m.cl[v - CLONE]
        if r.dst >= 0 and _tk(m, r.first + 1) == c:
            ref[0] = REF_FIRST
            return r.dst
        if not r.len & HAS_EDGES:
            return -1
    else:
        if v < m.npos and _tk(m, v) == c:
            ref[0] = REF_SOLID
            return v + 1
        if not (m.pbits[v >> 3] >> (v & 7)) & 1:
            return -1
    idx = _home(v, <uint32_t>c, m.cap_sl)
    while True:
        e = m.sl[idx].edge
        if e < 0:
            return -1
        if m.sl[idx].src == v and m.ed[e].tok == <int32_t>c:
            d = m.ed[e].dst
            if (_tk(m, _first(m, d)) == c) if m.wide else (<int64_t>m.ed[e].tok == c):
                ref[0] = e
                return d
        idx += 1
        if idx == <uint64_t>m.cap_sl:
            idx = 0


cdef inline bint _points_to(const sam_t* m, int32_t v, int64_t c, int32_t q, int32_t* ref) noexcept nogil:
    """Whether v's transition on c goes to q (``ref`` as for ``_find``). Every
    transition into q is on the same token, c, so a first transition to q needs no
    look at its token."""
    cdef const clone_t* r
    cdef uint64_t idx
    cdef int32_t e
    if v >= CLONE:
        r = &m.cl[v - CLONE]
        if r.dst == q:
            ref[0] = REF_FIRST
            return True
        if not r.len & HAS_EDGES:
            return False
    else:
        if v < m.npos and v + 1 == q:
            ref[0] = REF_SOLID
            return True
        if not (m.pbits[v >> 3] >> (v & 7)) & 1:
            return False
    idx = _home(v, <uint32_t>c, m.cap_sl)
    while True:
        e = m.sl[idx].edge
        if e < 0:
            return False
        if m.sl[idx].src == v and m.ed[e].dst == q:
            ref[0] = e
            return True
        idx += 1
        if idx == <uint64_t>m.cap_sl:
            idx = 0


cdef int _grow_slots(sam_t* m) noexcept nogil:
    """Grow the slot table by half, rehashing each edge by its source and token; -1
    when out of memory. A first pass computes every slot's new home with its edge
    prefetched a few slots ahead, a second pass inserts."""
    cdef int64_t cap = m.cap_sl + (m.cap_sl >> 1)
    if cap >= (<int64_t>1 << 32):
        return -1
    cdef slot_t* new = <slot_t*>malloc(cap * sizeof(slot_t))
    cdef uint32_t* hs = <uint32_t*>malloc(m.cap_sl * sizeof(uint32_t))
    if new == NULL or hs == NULL:
        free(new)
        free(hs)
        return -1
    memset(new, 0xFF, cap * sizeof(slot_t))
    cdef int64_t i, old = m.cap_sl
    cdef uint64_t j
    cdef int32_t e, d
    for i in range(old + PREFETCH_AHEAD):
        if i < old and m.sl[i].edge >= 0:
            SFX_PREFETCH(&m.ed[m.sl[i].edge])
        if i >= PREFETCH_AHEAD:
            j = <uint64_t>(i - PREFETCH_AHEAD)
            e = m.sl[j].edge
            if e >= 0:
                hs[j] = <uint32_t>_home(m.sl[j].src, <uint32_t>m.ed[e].tok, cap)
    for i in range(old):
        e = m.sl[i].edge
        if e >= 0:
            j = hs[i]
            while new[j].edge >= 0:
                j += 1
                if j == <uint64_t>cap:
                    j = 0
            new[j] = m.sl[i]
    free(hs)
    free(m.sl)
    m.sl = new
    m.cap_sl = cap
    return 0


cdef int _add_edge(sam_t* m, int32_t src, int64_t c, int32_t dst) noexcept nogil:
    """Insert the table edge (src, c) -> dst, known to be absent; -1 when out of memory."""
    cdef edge_t* ne
    cdef int64_t cap
    if (m.n_ed + 1) * 4 > m.cap_sl * 3:
        if _grow_slots(m) < 0:
            return -1
    if m.n_ed >= 0x7FFFFFFF:
        return -1         # edge numbers are 32-bit
    if m.n_ed == m.cap_ed:
        cap = m.cap_ed + (m.cap_ed >> 3) + 64
        ne = <edge_t*>realloc(m.ed, cap * sizeof(edge_t))
        if ne == NULL:
            return -1
        m.ed = ne
        m.cap_ed = cap
    cdef int32_t e = <int32_t>m.n_ed
    m.ed[e].dst = dst
    m.ed[e].tok = <int32_t>c
    m.ed[e].sib = _head(m, src)
    if _set_head(m, src, e) < 0:
        return -1
    m.n_ed += 1
    cdef uint64_t idx = _home(src, <uint32_t>c, m.cap_sl)
    while m.sl[idx].edge >= 0:
        idx += 1
        if idx == <uint64_t>m.cap_sl:
            idx = 0
    m.sl[idx].src = src
    m.sl[idx].edge = e
    return 0


cdef int32_t _new_clone(sam_t* m, int32_t q, int32_t ln) noexcept nogil:
    """A clone of q with length ln (its first end position, first transition and last
    end position copied; the caller copies the table edges); -1 when out of memory."""
    cdef clone_t* nc
    cdef int32_t* nl
    cdef int64_t cap
    if m.n_cl >= CLONE - 1:
        return -1
    if m.n_cl == m.cap_cl:
        cap = m.cap_cl + (m.cap_cl >> 3) + 64
        if m.clast != NULL or not m.earliest:
            nl = <int32_t*>realloc(m.clast, cap * sizeof(int32_t))
            if nl == NULL:
                return -1
            m.clast = nl
        nc = <clone_t*>realloc(m.cl, cap * sizeof(clone_t))
        if nc == NULL:
            return -1     # m.clast may be larger than cap_cl: harmless
        m.cl = nc
        m.cap_cl = cap
    cdef int64_t j = m.n_cl
    cdef clone_t* r = &m.cl[j]
    r.len = ln                       # no table edges yet
    r.link = _link(m, q)
    r.first = _first(m, q)
    if q >= CLONE:
        r.dst = m.cl[q - CLONE].dst
    else:
        r.dst = q + 1 if q < m.npos else -1
    if not m.earliest:
        m.clast[j] = _last(m, q)
    m.n_cl += 1
    return <int32_t>(CLONE + j)


cdef int _add(sam_t* m, int64_t i) noexcept nogil:
    """Index the token at position i (already in the buffer; the position arrays hold
    room for state i + 1); -1 when out of memory."""
    cdef int64_t c = _tk(m, i)
    cdef int32_t cur = <int32_t>(i + 1), p, q, clone, e, s, v, d, ref, shortest
    cdef int64_t n
    m.plink[cur] = 0
    if not m.earliest:
        m.plast[cur] = <int32_t>i
    m.npos = i + 1                   # the tail's transition to cur exists from here
    p = _link(m, m.tail)
    q = -1
    while p != -1:
        q = _find(m, p, c, &ref)
        if q >= 0:
            break
        if _add_edge(m, p, c, cur) < 0:
            return -1
        p = _link(m, p)
    s = m.cursor
    n = m.match_len
    if p != -1:
        if _len(m, p) + 1 == _len(m, q):
            m.plink[cur] = q
        else:
            clone = _new_clone(m, q, _len(m, p) + 1)
            if clone < 0:
                return -1
            e = _head(m, q)
            while e >= 0:
                d = m.ed[e].dst
                if _add_edge(m, clone, m.ed[e].tok, d) < 0:
                    return -1
                e = m.ed[e].sib
            # redirect to the clone: p (found above), then its suffix-link ancestors
            # while their transition on c goes to q, which is while they are at least
            # as long as q's suffix link (a state's transition on c goes to the state
            # of its longest string + c, and q holds the suffixes of its longest string
            # longer than its link's): the first shorter one is not looked up
            shortest = _len(m, m.cl[clone - CLONE].link)
            while True:
                if ref == REF_FIRST:
                    m.cl[p - CLONE].dst = clone
                elif ref >= 0:
                    m.ed[ref].dst = clone
                p = _link(m, p)
                if p == -1 or _len(m, p) < shortest or not _points_to(m, p, c, q, &ref):
                    break
            if q >= CLONE:
                m.cl[q - CLONE].link = clone
            else:
                m.plink[q] = clone
            m.plink[cur] = clone
            if s == q and n <= _len(m, clone):
                s = clone
    m.tail = cur
    if m.unbounded:
        s = m.plink[cur]
        n = _len(m, s)
    else:
        while True:
            d = _find(m, s, c, &ref)
            if d >= 0 and d != cur:
                s = d
                n += 1
                break
            if s == 0:
                n = 0
                break
            s = _link(m, s)
            n = _len(m, s)
        if n > m.max_n:
            n = m.max_n
            if _len(m, _link(m, s)) >= n:
                s = _link(m, s)
    m.cursor = s
    m.match_len = n
    if n >= m.min_n:
        m.match_end = (_first(m, s) if m.earliest else _last(m, s)) + 1
    else:
        m.match_end = -1
    if m.anchor_n:
        if m.match_end >= 0 and n >= m.anchor_n:
            m.anchor = m.match_end
            m.carry = 0
            m.misses = 0
        elif m.anchor >= 0 and m.carry <= m.anchor_span and m.misses <= m.anchor_misses:
            if _tk(m, m.anchor) != c:
                m.misses += 1
            m.anchor += 1
            m.carry += 1
    if not m.earliest:
        v = s
        while v > 0 and _len(m, v) >= m.min_n:
            _set_last(m, v, <int32_t>i)
            v = _link(m, v)
    return 0


cdef inline int64_t _start(const sam_t* m) noexcept nogil:
    """Where the draft starts: the anchor while it applies, else the match's end."""
    if m.anchor_n and m.anchor >= 0 and m.carry <= m.anchor_span and m.misses <= m.anchor_misses:
        return m.anchor
    return m.match_end


cdef int64_t _add_range(sam_t* m, int64_t start, int64_t stop) noexcept nogil:
    """Index positions start..stop-1; returns the first position not indexed."""
    cdef int64_t i
    for i in range(start, stop):
        if _add(m, i) < 0:
            return i
    return stop


cdef inline void _peek_state(const sam_t* m) noexcept nogil:
    """Prefetch what the next token's first lookup reads: the record of the current
    match's state (its transitions are tried first)."""
    cdef int32_t v = m.cursor
    if v >= CLONE:
        SFX_PREFETCH(&m.cl[v - CLONE])
    elif m.wide:
        SFX_PREFETCH(&m.t64[v])
    else:
        SFX_PREFETCH(&m.t32[v])
    SFX_PREFETCH(&m.plink[m.npos])


cdef inline void _peek_token(const sam_t* m) noexcept nogil:
    """Prefetch the token after the match state's first occurrence (its first
    transition's token) and the anchored token."""
    cdef int32_t v = m.cursor
    cdef int64_t at = m.cl[v - CLONE].first + 1 if v >= CLONE else -1
    if m.wide:
        if at >= 0:
            SFX_PREFETCH(&m.t64[at])
        if m.anchor >= 0:
            SFX_PREFETCH(&m.t64[m.anchor])
    else:
        if at >= 0:
            SFX_PREFETCH(&m.t32[at])
        if m.anchor >= 0:
            SFX_PREFETCH(&m.t32[m.anchor])


cdef void _add_jobs(job_t* jobs, int64_t b) noexcept nogil:
    """Write each job's tokens into its index's buffer (which has room, and is int64
    when a token needs it), then index them. Indexes are taken in order, the first
    loads of the ones PIPE_AHEAD, 2 * PIPE_AHEAD and 3 * PIPE_AHEAD places later
    prefetched meanwhile (each a dependent step further), so the cache misses of
    different indexes overlap."""
    cdef int64_t i, j, k
    cdef sam_t* m
    for i in range(b + 3 * PIPE_AHEAD):
        if i < b:
            SFX_PREFETCH(jobs[i].m)
            SFX_PREFETCH(<char*>jobs[i].m + 64)
            SFX_PREFETCH(<char*>jobs[i].m + 128)
        k = i - PIPE_AHEAD
        if 0 <= k < b:
            _peek_state(jobs[k].m)
        k = i - 2 * PIPE_AHEAD
        if 0 <= k < b:
            _peek_token(jobs[k].m)
        k = i - 3 * PIPE_AHEAD
        if k < 0 or k >= b:
            continue
        m = jobs[k].m
        if m.wide:
            for j in range(jobs[k].stop - jobs[k].start):
                m.t64[jobs[k].start + j] = jobs[k].src[j]
        else:
            for j in range(jobs[k].stop - jobs[k].start):
                m.t32[jobs[k].start + j] = <int32_t>jobs[k].src[j]
        jobs[k].done = _add_range(m, jobs[k].start, jobs[k].stop)


# ------------------------------------------------------------------------------------
# the index
# ------------------------------------------------------------------------------------

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
    cdef object _buf                 # int32 (or, once wide, int64) ndarray of the tokens
    cdef int64_t _len, _cap          # tokens held, room in _buf and the position arrays
    cdef guard_t _g                  # the shared guard protocol (_core/_guard.pxd)
    cdef int64_t _wstamp             # the extend_batch call holding the writer flag (duplicates)
    cdef index_stats_t _st           # acceptance statistics, the adaptive draft length

    def __cinit__(self):
        memset(&self.m, 0, sizeof(sam_t))   # the guard is zeroed too: UNINIT

    def __init__(self, min_n=1, max_n=None, prefer="earliest", *, draft_len=8, adaptive=False,
                 min_draft=1, max_draft=32, anchor_n=0, anchor_span=64, anchor_misses=4):
        guard_begin_init(&self._g, NAME)    # a second __init__ is refused, changing nothing
        lo, hi = check_suffix_range(min_n, max_n)
        an, aspan, amiss = check_anchor(anchor_n, anchor_span, anchor_misses)
        earliest = check_prefer(prefer)
        k, kmin, kmax = check_draft_limits(draft_len, min_draft, max_draft)
        stats_init(&self._st, bool(adaptive), min(k, MAX_SUFFIX_TOKENS),
                   min(kmin, MAX_SUFFIX_TOKENS), min(kmax, MAX_SUFFIX_TOKENS))
        self._len = 0
        self._cap = 0
        self._buf = np.zeros(0, dtype=np.int32)
        self.m.min_n = lo
        self.m.max_n = hi
        self.m.earliest = earliest
        self.m.unbounded = hi >= UNBOUNDED
        self.m.anchor_n = an
        self.m.anchor_span = aspan
        self.m.anchor_misses = amiss
        self.m.misses = 0
        self.m.anchor = -1
        self.m.carry = 0
        self.m.cap_sl = MIN_SLOTS
        self.m.cap_hd = 8
        self.m.sl = <slot_t*>malloc(self.m.cap_sl * sizeof(slot_t))
        self.m.hd = <head_t*>malloc(self.m.cap_hd * sizeof(head_t))
        if self.m.sl == NULL or self.m.hd == NULL:
            raise MemoryError()
        memset(self.m.sl, 0xFF, self.m.cap_sl * sizeof(slot_t))
        memset(self.m.hd, 0xFF, self.m.cap_hd * sizeof(head_t))
        self._grow_buffer(56)        # also makes the root's position entries
        self.m.plink[0] = -1
        if not earliest:
            self.m.plast[0] = -1
        self.m.npos = 0
        self.m.tail = 0
        self.m.cursor = 0
        self.m.match_len = 0
        self.m.match_end = -1
        guard_end_init(&self._g)

    def __dealloc__(self):
        free(self.m.plink)
        free(self.m.plast)
        free(self.m.pbits)
        free(self.m.cl)
        free(self.m.clast)
        free(self.m.ed)
        free(self.m.sl)
        free(self.m.hd)

    def _hold_guard(self, on):
        """Tests only: take the writer flag as a writer would (refusing like one), or,
        with ``on`` false, release it."""
        if on:
            guard_write(&self._g, NAME)
        else:
            guard_done_write(&self._g)

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self):
        guard_check(&self._g, NAME)
        return self.m.min_n

    @property
    def max_n(self):
        guard_check(&self._g, NAME)
        return None if self.m.max_n >= UNBOUNDED else self.m.max_n

    @property
    def prefer(self):
        guard_check(&self._g, NAME)
        return "earliest" if self.m.earliest else "latest"

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
        """The indexed tokens as a read-only int64 array (a view of the index's buffer
        once it holds int64, else a copy)."""
        guard_read(&self._g, NAME)   # the copy may let other threads run
        try:
            if self.m.wide:
                v = self._buf[: self._len]
            else:
                v = self._buf[: self._len].astype(np.int64)
        finally:
            guard_done_read(&self._g)
        v.flags.writeable = False
        return v

    def last_tokens(self, count):
        """The last ``count`` indexed tokens (all when fewer), as a new int64 array."""
        k = check_count(count, "count")
        guard_read(&self._g, NAME)
        try:
            start = self._len - k if k < self._len else 0
            return self._buf[start : self._len].astype(np.int64)
        finally:
            guard_done_read(&self._g)

    @property
    def n_edges(self):
        """Transitions of the automaton."""
        guard_check(&self._g, NAME)  # the count below runs no Python code
        cdef int64_t i, total = self.m.npos + self.m.n_ed
        for i in range(self.m.n_cl):
            if self.m.cl[i].dst >= 0:
                total += 1
        return total

    @property
    def n_states(self):
        """States of the automaton, the root included."""
        guard_check(&self._g, NAME)
        return self.m.npos + 1 + self.m.n_cl

    @property
    def nbytes(self):
        """Bytes this index holds: the tokens, the position and clone records, the edges
        and both tables."""
        guard_check(&self._g, NAME)
        cdef int64_t per_pos = 4 + (4 if not self.m.earliest else 0)
        cdef int64_t per_clone = sizeof(clone_t) + (4 if not self.m.earliest else 0)
        return (self._buf.nbytes + (self._cap + 1) * per_pos + ((self._cap + 8) >> 3)
                + self.m.cap_cl * per_clone + self.m.cap_ed * sizeof(edge_t)
                + self.m.cap_sl * sizeof(slot_t) + self.m.cap_hd * sizeof(head_t))

    @property
    def bytes_per_token(self):
        """``nbytes`` per indexed token (0.0 while empty)."""
        guard_check(&self._g, NAME)
        return self.nbytes / (<double>self._len) if self._len else 0.0

    cdef int _set_buffer(self, object buf) except -1:
        """Make ``buf`` (int32 or int64, already holding the tokens) the token buffer."""
        cdef int32_t[::1] v32
        cdef int64_t[::1] v64
        self._buf = buf              # views handed out keep the old buffer alive
        if buf.dtype == np.int64:
            v64 = buf
            self.m.t64 = &v64[0]
            self.m.t32 = NULL
            self.m.wide = True
        else:
            v32 = buf
            self.m.t32 = &v32[0]
            self.m.t64 = NULL
            self.m.wide = False
        return 0

    cdef int _grow_buffer(self, int64_t need) except -1:
        """Room for ``need`` tokens: the token buffer and the position arrays (one entry
        more: state i + 1 belongs to position i)."""
        cdef int64_t cap = self._cap + (self._cap >> 1) + 16
        cdef int32_t* nl
        cdef uint8_t* nb
        if cap < need:
            cap = need
        if cap > MAX_SUFFIX_TOKENS:
            cap = MAX_SUFFIX_TOKENS
        if cap <= self._cap:
            return 0
        new = np.empty(cap, dtype=np.int64 if self.m.wide else np.int32)
        new[: self._len] = self._buf[: self._len]
        nl = <int32_t*>realloc(self.m.plink, (cap + 1) * sizeof(int32_t))
        if nl == NULL:
            raise MemoryError()
        self.m.plink = nl
        if not self.m.earliest:
            nl = <int32_t*>realloc(self.m.plast, (cap + 1) * sizeof(int32_t))
            if nl == NULL:
                raise MemoryError()
            self.m.plast = nl
        nb = <uint8_t*>realloc(self.m.pbits, (cap + 8) >> 3)
        if nb == NULL:
            raise MemoryError()
        memset(nb + ((self._cap + 8) >> 3), 0, ((cap + 8) >> 3) - ((self._cap + 8) >> 3))
        if self._cap == 0:
            nb[0] = 0
        self.m.pbits = nb
        self._set_buffer(new)
        self._cap = cap
        return 0

    cdef int _widen(self) except -1:
        """Hold the tokens as int64 from now on (a token beyond int32 is coming)."""
        if not self.m.wide:
            self._set_buffer(self._buf.astype(np.int64))
        return 0

    cdef int _store(self, object arr, int64_t at) except -1:
        """Write the converted tokens ``arr`` (int32 or int64 from ``as_ids``, possibly
        the caller's array) at positions at.. of the buffer, widening it when a token
        does not fit int32. The buffer has room."""
        cdef int64_t m = arr.shape[0]
        if not self.m.wide and arr.dtype != np.int32:
            arr = np.array(arr, dtype=np.int64, copy=True)   # ours: checked is what is stored
            if m and (arr.min() < INT32_LO or arr.max() > INT32_HI):
                self._widen()
        self._buf[at : at + m] = arr
        return 0

    def extend(self, tokens):
        """Append verified tokens (a list, tuple or 1-D integer array) to the index."""
        cdef int64_t m, i, v
        cdef Py_ssize_t n
        # take the guard first: nothing below may run while another call holds it
        guard_write(&self._g, NAME)
        try:
            if type(tokens) is list and Py_SIZE(tokens) <= SMALL_LIST:
                # a few exact ints, read in C. Growing the buffer may run Python code or
                # let other threads run (numpy), so the list's size is read again after
                # it; the loop itself runs none (a token that needs the int64 buffer, or
                # anything but an exact int, leaves for the general path, which converts
                # the list into memory of its own before reading it)
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
                        if self.m.wide:
                            self.m.t64[self._len + i] = v
                        elif INT32_LO <= v <= INT32_HI:
                            self.m.t32[self._len + i] = <int32_t>v
                        else:
                            break
                    else:
                        self._ingest(n)
                        return
            arr = as_ids(tokens, "tokens")
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
            self._store(arr, self._len)
            self._ingest(m)
        finally:
            guard_done_write(&self._g)

    def append(self, token):
        """Append one verified token."""
        cdef int64_t v
        if (type(token) is int and self._len < self._cap and self._g.phase == GUARD_READY
                and not self._g.writing and not self._g.readers):
            try:
                v = token
            except OverflowError:
                pass
            else:
                if self.m.wide or INT32_LO <= v <= INT32_HI:
                    self._g.writing = 1
                    try:
                        if self.m.wide:
                            self.m.t64[self._len] = v
                        else:
                            self.m.t32[self._len] = <int32_t>v
                        self._ingest(1)
                    finally:
                        guard_done_write(&self._g)
                    return
        self.extend([token])

    cdef int _ingest(self, int64_t m) except -1:
        """Index the m tokens already written at positions _len.._len + m - 1 (the
        caller holds the writer flag)."""
        cdef int64_t start = self._len, total = self._len + m, done
        if m == 0:
            return 0
        if m >= NOGIL_MIN:
            with nogil:
                done = _add_range(&self.m, start, total)
        else:
            done = _add_range(&self.m, start, total)
        self._settle(done, total)
        return 0

    cdef int _settle(self, int64_t done, int64_t total) except -1:
        """After indexing up to ``total``: ``done`` positions were indexed."""
        self._len = done
        if done < total:
            guard_break(&self._g)
            raise MemoryError(
                f"SuffixIndex could not grow its tables (after {done} tokens): out of memory "
                "or past 2**30 - 1 states or 2**31 - 1 edges; the index is unusable now"
            )
        return 0

    def propose(self, max_k=None):
        """The draft: up to ``max_k`` tokens (``draft_len`` when None) that followed the
        chosen earlier occurrence of the longest matching suffix; empty when none."""
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
        end = _start(&self.m)
        if end < 0 or k <= 0:
            return []
        stop = end + k if end + k < self._len else self._len
        if self.m.wide:
            return [self.m.t64[i] for i in range(end, stop)]
        return [self.m.t32[i] for i in range(end, stop)]

    def lookup(self, context, max_k=None):
        """Match another sequence against the index: the longest suffix of ``context``
        (at least ``min_n``, at most ``max_n`` tokens) that occurs anywhere in the
        indexed tokens, and up to ``max_k`` (``draft_len`` when None) tokens after its
        first occurrence. Returns ``(n, draft)``; ``(0, [])`` when none."""
        cdef int64_t k, n = 0, i, e, stop, c
        cdef int32_t s = 0, d, ref
        guard_check(&self._g, NAME)
        if max_k is None:
            k = self._st.draft_len
        else:
            k = min(check_count(max_k, "max_k"), MAX_SUFFIX_TOKENS)
        arr = np.array(as_ids(context, "context"), dtype=np.int64, copy=True)
        cdef const int64_t[::1] cv = arr
        # converting may have let another thread in: check again, then keep the GIL
        guard_check(&self._g, NAME)
        cdef sam_t* m = &self.m
        for i in range(cv.shape[0]):
            c = cv[i]
            while s != 0 and _find(m, s, c, &ref) < 0:
                s = _link(m, s)
                n = _len(m, s)
            d = _find(m, s, c, &ref)
            if d < 0:
                s = 0
                n = 0
            else:
                s = d
                n += 1
        if n > m.max_n:
            n = m.max_n
            while _len(m, _link(m, s)) >= n:
                s = _link(m, s)
        if n < m.min_n or n == 0:
            return 0, []
        e = _first(m, s) + 1
        stop = e + k if e + k < self._len else self._len
        return n, [_tk(m, i) for i in range(e, stop)]

    def serve(self, tokens, drafted=0, accepted=0, max_k=None):
        """One serving step of this index's request: records the verified draft
        (``drafted`` tokens of which ``accepted`` were accepted; nothing when 0) as
        ``record`` does, extends by ``tokens`` as ``extend`` does, and returns the next
        draft, ``propose(min(draft_len, max_k))`` when adaptive, else
        ``propose(max_k)``. Refuses what those refuse, changing nothing."""
        src, d, a, k = _serve_args(tokens, drafted, accepted, max_k, MAX_TOKENS_C)
        return _serve_one(suffix_serve, self, src, d, a, k, MAX_TOKENS_C)

    def match_length(self):
        """The n of the current match (0 when nothing matches)."""
        guard_check(&self._g, NAME)
        return self.m.match_len if self.m.match_end >= 0 else 0

    def match_end(self):
        """Where the draft starts: the end (exclusive) of the chosen earlier occurrence,
        or the anchor when it applies; -1 when there is nothing to draft."""
        guard_check(&self._g, NAME)
        return _start(&self.m)

    @property
    def anchor_n(self):
        """Matches at least this long set the anchor (0: no anchor)."""
        guard_check(&self._g, NAME)
        return self.m.anchor_n

    @property
    def anchor_span(self):
        """How many tokens past the last long match the anchor keeps drafting."""
        guard_check(&self._g, NAME)
        return self.m.anchor_span

    @property
    def anchor_misses(self):
        """How many appended tokens may differ from the anchored text before the anchor
        is dropped."""
        guard_check(&self._g, NAME)
        return self.m.anchor_misses

    # -- acceptance statistics and the adaptive draft length ---------------------
    def record(self, proposed, accepted):
        """Record that ``accepted`` of ``proposed`` drafted tokens were accepted; returns
        the draft length to use next (changed only when ``adaptive``). Refuses
        (OverflowError, changing nothing) a record that would take the drafted-token
        count beyond int64, as ``NgramIndex`` does."""
        return _record_one(&self._g, &self._st, proposed, accepted)

    @property
    def stats(self):
        """Acceptance statistics: steps recorded, tokens drafted and accepted, fully
        accepted drafts, the acceptance rate and the current draft length."""
        return _stats_dict(&self._g, &self._st)

    def __repr__(self):
        if self._g.phase != GUARD_READY:
            return "SuffixIndex(<not initialised or unusable>)"
        hi = None if self.m.max_n >= UNBOUNDED else self.m.max_n
        prefer = "earliest" if self.m.earliest else "latest"
        return f"SuffixIndex(min_n={self.m.min_n}, max_n={hi}, prefer={prefer!r}, len={self._len})"

    def __reduce__(self):
        # pickled (and copied) as its settings, tokens and statistics; re-indexed on load
        guard_read(&self._g, NAME)   # the token copy may let other threads run
        try:
            return (
                _rebuild,
                (type(self), self.m.min_n, None if self.m.max_n >= UNBOUNDED else self.m.max_n,
                 "earliest" if self.m.earliest else "latest", self._st.draft_len,
                 bool(self._st.adaptive), self._st.min_draft, self._st.max_draft,
                 np.array(self.tokens), _stats_tuple(&self._st), self.m.anchor_n,
                 self.m.anchor_span, self.m.anchor_misses),
            )
        finally:
            guard_done_read(&self._g)

    def _restore_stats(self, stats):
        _stats_restore(&self._g, &self._st, stats)


def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats, an=0, aspan=64, amiss=4):
    if not (isinstance(cls, type) and issubclass(cls, SuffixIndex)):
        raise TypeError(f"cannot rebuild a SuffixIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=bool(adaptive), min_draft=kmin,
             max_draft=kmax, anchor_n=an, anchor_span=aspan, anchor_misses=amiss)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix


# ------------------------------------------------------------------------------------
# batches of indexes
# ------------------------------------------------------------------------------------

# what _index_common.pxi and _serve.pxi ask of this module's index class
cdef inline bint _is_index(object o):
    return type(o) is SuffixIndex or isinstance(o, SuffixIndex)


cdef inline guard_t* _guard_of(object o) noexcept:
    return &(<SuffixIndex>o)._g


cdef inline index_stats_t* _stats_of(object o) noexcept:
    return &(<SuffixIndex>o)._st


cdef inline int64_t _len_of(object o) noexcept:
    return (<SuffixIndex>o)._len


cdef void _copy_views(const view_t* views, int64_t b, int64_t* out, int64_t* out_off,
                      int64_t* lengths) noexcept nogil:
    cdef int64_t i, j, w = 0
    out_off[0] = 0
    for i in range(b):
        if views[i].wide:
            for j in range(views[i].k):
                out[w + j] = views[i].t64[views[i].end + j]
        else:
            for j in range(views[i].k):
                out[w + j] = views[i].t32[views[i].end + j]
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
    ks = check_batch_counts(max_k, b, [(<SuffixIndex>x)._st.draft_len for x in ixs])
    cdef const int64_t[::1] kv = ks
    cdef view_t* views = <view_t*>malloc((b if b else 1) * sizeof(view_t))
    if views == NULL:
        raise MemoryError()
    cdef int64_t taken = 0
    try:
        # count every index as read before looking at any, so none can move under us
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            guard_read(&ix._g, NAME)
            taken += 1
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            end = _start(&ix.m)
            k = kv[i]
            if end < 0:
                k = 0
            elif k > ix._len - end:
                k = ix._len - end
            views[i].t32 = ix.m.t32
            views[i].t64 = ix.m.t64
            views[i].wide = ix.m.wide
            views[i].end = end if end >= 0 else 0
            views[i].k = k
            bound += k
        out = np.empty(bound, dtype=np.int64)
        out_off = np.empty(b + 1, dtype=np.int64)
        lengths = np.empty(b, dtype=np.int64)
        _run_views(views, b, out, out_off, lengths)
    finally:
        for i in range(taken):
            guard_done_read(&(<SuffixIndex>ixs[i])._g)
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
    return _record_batch(indexes, proposed, accepted)


def serve_batch(indexes, tokens, offsets, drafted, accepted, max_k=None):
    """``SuffixIndex.serve`` for B distinct indexes in one call: index ``i`` records
    ``(drafted[i], accepted[i])`` (nothing when 0), takes
    ``tokens[offsets[i]:offsets[i + 1]]`` and drafts at most ``max_k`` (one count, one
    per index, or None for ``draft_len``; adaptive indexes at most their ``draft_len``)
    tokens. Returns ``(drafts, offsets, lengths)`` as ``propose_batch`` does. All or
    nothing: refuses what ``extend_batch`` and ``record_batch`` refuse, changing no index."""
    return _serve_batch(suffix_serve, indexes, tokens, offsets, drafted, accepted, max_k,
                        MAX_TOKENS_C)


cdef int64_t _batch_stamp = 0


def extend_batch(indexes, tokens, offsets):
    """``extend`` for B indexes in one call: index ``i`` gets
    ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets``: B + 1 nondecreasing
    boundaries), the indexing of the whole batch done without the GIL. All or nothing:
    refuses the whole batch, changing no index, when an index appears twice
    (ValueError) or is in use by another call (RuntimeError), or when one would exceed
    its capacity (OverflowError).
    """
    # every argument converted (Python code may run) and copied before any index is touched
    cdef list ixs = _index_list(indexes)
    cdef int64_t b = len(ixs), i, n, z = 0
    src, off = own_batch_arrays(tokens, offsets, b)
    cdef const int64_t[::1] sv = src
    n = sv.shape[0]
    cdef const int64_t[::1] ov = off
    _check_run_offsets(off, &ov[0], b, n)
    _extend_core(ixs, b, &sv[0] if n else &z, &ov[0], NULL, NULL, NULL, 0, NULL, NULL)


cdef int _extend_core(list ixs, int64_t b, const int64_t* sv, const int64_t* ov,
                      const int64_t* drafted, const int64_t* accepted, const int64_t* limits,
                      int64_t kmax, int64_t* drafts, int64_t* lengths) except -1:
    """``extend_batch`` on arguments already owned and checked (``ov``: B + 1
    nondecreasing offsets into ``sv``; every item a SuffixIndex). When ``drafts`` is
    not NULL (the serving step's update), after the extend each index with
    ``drafted[i] > 0`` records ``(drafted[i], accepted[i])`` and proposes at most
    ``min(limits[i], kmax)`` tokens (and at most its ``draft_len`` when adaptive) into
    ``drafts[i * kmax:]``, the count into ``lengths[i]``, all under the write guard."""
    global _batch_stamp
    cdef SuffixIndex ix
    cdef job_t* jobs = NULL
    cdef int64_t stamp, i, j, m, k, end, marked = 0
    cdef int64_t z = 0
    cdef bint failed = False
    _batch_stamp += 1
    stamp = _batch_stamp
    try:
        # the write guard on every index, all or nothing; no Python code runs in this loop
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            _take_write(&ix._g, &ix._wstamp, stamp, i)
            marked += 1
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            m = ov[i + 1] - ov[i]
            if ix._len + m > MAX_SUFFIX_TOKENS:
                raise OverflowError(
                    f"a SuffixIndex holds at most {MAX_SUFFIX_TOKENS} tokens; "
                    f"indexes[{i}] has {ix._len} + {m}, too many"
                )
            if drafts != NULL and not stats_fits(&ix._st, drafted[i], 0):
                raise OverflowError(
                    f"indexes[{i}]: proposed={drafted[i]} would take the drafted-token "
                    f"count beyond int64 (already {ix._st.drafted})"
                )
        jobs = <job_t*>malloc((b if b else 1) * sizeof(job_t))
        if jobs == NULL:
            raise MemoryError()
        # room made, and int64 buffers where a token needs one (no index's contents
        # change before the nogil pass)
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            m = ov[i + 1] - ov[i]
            if ix._len + m > ix._cap:
                ix._grow_buffer(ix._len + m)
            if not ix.m.wide:
                for j in range(ov[i], ov[i + 1]):
                    if sv[j] < INT32_LO or sv[j] > INT32_HI:
                        ix._widen()
                        break
            jobs[i].m = &ix.m
            jobs[i].src = sv + ov[i] if m else &z
            jobs[i].start = ix._len
            jobs[i].stop = ix._len + m
            jobs[i].done = ix._len
        with nogil:
            _add_jobs(jobs, b)
        for i in range(b):
            ix = <SuffixIndex>ixs[i]
            ix._len = jobs[i].done
            if jobs[i].done < jobs[i].stop:
                guard_break(&ix._g)
                failed = True
        if failed:
            raise MemoryError(
                "extend_batch: a SuffixIndex could not grow its tables (out of memory or past "
                "2**30 - 1 states or 2**31 - 1 edges); that index is unusable now"
            )
        if drafts != NULL:
            # what the drafter session does after a step: record, then propose (each
            # index still held; a few tokens each, copied with the GIL)
            for i in range(b):
                ix = <SuffixIndex>ixs[i]
                if drafted[i] > 0:
                    stats_record(&ix._st, drafted[i], accepted[i], GROW_C, SHRINK_C)
                k = stats_limit(&ix._st, limits[i] if limits[i] < kmax else kmax)
                end = _start(&ix.m)
                if end < 0 or k < 0:
                    k = 0
                elif k > ix._len - end:
                    k = ix._len - end
                if ix.m.wide:
                    for j in range(k):
                        drafts[i * kmax + j] = ix.m.t64[end + j]
                else:
                    for j in range(k):
                        drafts[i * kmax + j] = ix.m.t32[end + j]
                lengths[i] = k
    finally:
        for i in range(marked):
            guard_done_write(&(<SuffixIndex>ixs[i])._g)
        free(jobs)
    return 0


cdef int suffix_serve(list indexes, Py_ssize_t b, const int64_t* tokens,
                      const int64_t* offsets, const int64_t* drafted, const int64_t* accepted,
                      const int64_t* limits, Py_ssize_t k_cap, int64_t* out_tokens,
                      int64_t* out_lens) except -1:
    """The serving-step policy for B indexes (declared in
    ``specfsm._core.suffix_index.pxd``; ``serve``, ``serve_batch`` and the batch step
    run it): ``extend_batch``, then ``record`` for each index that verified a draft
    (``drafted[i] > 0``), then ``propose`` of at most ``min(limits[i], k_cap)`` tokens
    (and ``draft_len`` when adaptive) into ``out_tokens[i * k_cap:]`` (``b * k_cap``
    entries) with the count in ``out_lens[i]``, in one call on buffers the caller owns
    (never changed meanwhile). Refuses what ``extend_batch`` and ``record_batch``
    refuse, changing no index."""
    _check_serve_c(indexes, b, offsets, drafted, accepted, limits, k_cap)
    return _extend_core(indexes, b, tokens, offsets, drafted, accepted, limits, k_cap,
                        out_tokens, out_lens)
