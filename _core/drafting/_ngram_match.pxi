# Stateless longest-match drafting (compiled): ``longest_match`` and
# ``longest_match_batch``, a scan of the history (scan.h, through _scan.pxd) with no
# index kept. Included (``include "_ngram_match.pxi"``) by ngram_index.pyx, which
# exports both.

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
    cdef int64_t lo, hi, k, end = -1, n
    cdef bint earliest
    cdef const int64_t[::1] h64
    cdef const int32_t[::1] h32
    cdef int width = 0
    # fast paths for the common argument types; anything else takes the shared checks
    if (type(min_n) is int and type(max_n) is int and 1 <= <object>min_n <= <object>max_n
            and <object>max_n <= MAX_TOKENS_C):
        lo_ = min_n
        hi_ = max_n
    else:
        lo_, hi_ = ngram_range(min_n, max_n)
    if type(max_k) is not int or max_k < 0:
        max_k = check_count(max_k, "max_k")
    if type(prefer) is str and prefer == "latest":
        earliest = False
    else:
        earliest = check_prefer(prefer) == 1
    # the history last, once: a plain int64 or int32 array is pinned in place, anything
    # else converted; the draft is cut from what was read (in the history's dtype for an
    # array), never by indexing ``history`` again
    dt = history.dtype if isinstance(history, np.ndarray) else None
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
        arr = token_ids(history, "history")
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
    if end < 0:
        k = 0
        end = 0
    elif k > n - end:
        k = n - end
    if width == 8:
        out = np.asarray(h64[end : end + k]) if k else np.zeros(0, dtype=np.int64)
    else:
        out = np.asarray(h32[end : end + k]) if k else np.zeros(0, dtype=np.int32)
    if dt is not None:
        return out.astype(dt)
    return out.tolist()


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
    # convert every argument first (Python code may run), copying the control arrays,
    # and the tokens (read in place) last, so that no conversion runs after them
    lo_, hi_ = ngram_range(min_n, max_n)
    cdef bint earliest = check_prefer(prefer) == 1
    off = batch_offsets(offsets)
    cdef int64_t b = off.shape[0] - 1
    ks = check_batch_limits(max_k, b, False)         # an owned, validated copy
    arr = token_ids(tokens, "tokens")
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
    index_offsets(off, n)                    # the copy, compared neighbour to neighbour
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
