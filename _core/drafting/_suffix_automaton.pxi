# The suffix automaton (compiled): its records (positions, clones, edges, the two
# open-addressing tables), their lookups and growth, and the online construction that
# adds one position at a time with its match and anchor state. No Python code: every
# function runs without the GIL and reports running out of room by its return value.
# Included (``include "_suffix_automaton.pxi"``) by suffix_index.pyx, whose SuffixIndex
# and batch calls run it.

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
