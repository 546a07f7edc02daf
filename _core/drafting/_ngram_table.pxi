# The n-gram index's hash tables (compiled): the n-gram hashes (chained and rolling),
# the open-addressing slot tables, their probe, insertion and growth, and the indexing
# of a run of positions. Included (``include "_ngram_table.pxi"``) by ngram_index.pyx,
# before its NgramIndex (whose fields are these tables) and batch calls; the constants
# it reads (the enum of ngram_index.pyx) are that module's.

ctypedef struct slot_t:
    uint32_t tag          # high 32 bits of the n-gram's hash
    int32_t end           # end (exclusive) of the stored occurrence; -1: empty slot

ctypedef struct level_t:
    slot_t* slots
    int64_t cap           # a power of two
    int64_t count
    int shift             # 32 - log2(cap): home slot = tag >> shift


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
