# The n-gram index's batch API (compiled): ``propose_batch``, ``record_batch``,
# ``serve_batch`` and ``extend_batch``, the serving-step policy ``ngram_serve`` the batch
# step cimports, and extend_batch's software pipeline (hash, peek and prefetch ahead
# across the batch's positions, so the cache misses of different indexes overlap).
# Included (``include "_ngram_batch.pxi"``) by ngram_index.pyx, after its NgramIndex.

ctypedef struct view_t:   # what a batch proposal needs from one index, read without the GIL
    const int64_t* tok
    const int32_t* answers
    int64_t n_levels
    int64_t k


cdef inline object _copy_int64(object a):
    """A fresh copy of a 1-D C-contiguous int64 ndarray (numpy C API, no Python call)."""
    cdef cnp.npy_intp n = array_len(a)
    out = cnp.PyArray_EMPTY(1, &n, cnp.NPY_INT64, 0)
    if n:
        memcpy(cnp.PyArray_DATA(<cnp.ndarray>out), array_data(a), <size_t>n * sizeof(int64_t))
    return out


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
    # every argument converted (Python code may run) before any index is touched
    cdef list index_list = _index_list(indexes)
    cdef int64_t b = len(index_list), i, k, end, bound = 0, one_k = -1, marked = 0
    cdef const int64_t[::1] kv
    cdef NgramIndex ix
    if max_k is None:
        pass
    elif type(max_k) is int and max_k >= 0:
        one_k = max_k if max_k < MAX_TOKENS_C else MAX_TOKENS_C
    elif isinstance(max_k, (np.ndarray, list, tuple)):
        kv = check_batch_limits(max_k, b)     # an owned, validated copy
    else:
        one_k = min(check_count(max_k, "max_k"), MAX_TOKENS_C)
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
    return _record_batch(indexes, proposed, accepted)


def serve_batch(indexes, tokens, offsets, drafted, accepted, max_k=None):
    return _serve_batch(ngram_serve, indexes, tokens, offsets, drafted, accepted, max_k,
                        MAX_TOKENS_C)


def serve_batch_lists(indexes, tokens, offsets, drafted, accepted, max_k=None):
    return _serve_batch(ngram_serve, indexes, tokens, offsets, drafted, accepted, max_k,
                        MAX_TOKENS_C, True)


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
    # every argument converted (Python code may run) and copied before any index is touched
    cdef list index_list = _index_list(indexes)
    cdef int64_t b = len(index_list), i, n
    # plain int64 arrays (the usual arguments) copied without the shared checks' calls
    if plain_int_width(tokens) == 8:
        src = _copy_int64(tokens)
    else:
        src = np.array(token_ids(tokens, "tokens"), dtype=np.int64, copy=True)
    if plain_int_width(offsets) == 8 and array_len(offsets) >= 1:
        off = _copy_int64(offsets)
    else:
        off = batch_offsets(offsets)
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
    cdef int64_t i, marked = 0, total
    cdef job_t* jobs = NULL
    cdef int32_t* job_of = NULL
    cdef tags_t* ring = NULL
    cdef int64_t* lim = NULL
    _batch_stamp += 1
    try:
        _hold_writes(index_list, b, _batch_stamp, &marked)
        total = off[b] - off[0]
        jobs = <job_t*>malloc((b if b else 1) * sizeof(job_t))
        job_of = <int32_t*>malloc((total if total else 1) * sizeof(int32_t))
        ring = <tags_t*>malloc(PIPE_RING * sizeof(tags_t))
        if jobs == NULL or job_of == NULL or ring == NULL:
            raise MemoryError()
        _make_jobs(index_list, b, off, jobs, job_of)
        if drafted != NULL:
            _check_totals(index_list, b, drafted)
        if drafts != NULL:
            lim = <int64_t*>malloc((b if b else 1) * sizeof(int64_t))
            if lim == NULL:
                raise MemoryError()
            _record_limits(index_list, b, drafted, accepted, limits, lim)
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


cdef int _hold_writes(list index_list, int64_t b, int64_t stamp, int64_t* marked) except -1:
    """The write guard on every index, all or nothing (``marked[0]`` counts the ones held,
    for the caller to let go); no Python code runs unless one refuses. Each index's
    tables, answers and last token start loading for the passes that follow."""
    cdef int64_t i
    cdef NgramIndex ix
    for i in range(b):
        ix = <NgramIndex>index_list[i]
        _take_write(&ix._g, &ix._write_stamp, stamp, i)
        marked[0] += 1
        NGI_PREFETCH(ix._levels)
        NGI_PREFETCH(ix._answers)
        if ix._len > 0:
            NGI_PREFETCH(&ix._tok[ix._len - 1])
    return 0


cdef int _make_jobs(list index_list, int64_t b, const int64_t* off, job_t* jobs,
                    int32_t* job_of) except -1:
    """Each index's capacities checked and made for its ``off[i + 1] - off[i]`` new
    tokens (OverflowError past MAX_TOKENS_C, MemoryError where a table cannot grow), its
    job filled (``jobs[i]``) and each of its new tokens' positions mapped to it
    (``job_of``). No index's content changes before the nogil pass, so a refusal here
    leaves every index as it was."""
    cdef int64_t i, j, m, base = off[0]
    cdef NgramIndex ix
    cdef job_t* jb
    for i in range(b):
        ix = <NgramIndex>index_list[i]
        m = off[i + 1] - off[i]
        if m > MAX_TOKENS_C - ix._len:
            raise OverflowError(
                f"an NgramIndex holds at most {MAX_TOKENS_C} tokens; "
                f"indexes[{i}] has {ix._len} + {m}, too many"
            )
        if ix._len + m > ix._cap:
            ix._grow_buffer(ix._len + m)
        for j in range(ix._n_levels):
            if (ix._levels[j].count + m) * 3 > ix._levels[j].cap * 2:
                if _reserve(&ix._levels[j], ix._levels[j].count + m) < 0:
                    raise MemoryError(f"indexes[{i}]: NgramIndex could not grow its tables")
        jb = &jobs[i]
        jb.tok = ix._tok
        jb.levels = ix._levels
        jb.answers = ix._answers
        jb.n_levels = ix._n_levels
        jb.start = ix._len
        jb.first = off[i] - base
        jb.stop = ix._len + m
        jb.lo = ix._lo
        jb.hi = ix._hi
        jb.roll = &ix._roll
        jb.work = &ix._work
        jb.bpow = ix._bpow
        jb.earliest = ix._earliest
        jb.rolling = ix._rolling
        jb.piped = not ix._rolling and ix._n_levels <= PIPE_LEVELS
        for j in range(off[i] - base, off[i + 1] - base):
            job_of[j] = <int32_t>i
    return 0


cdef int _check_totals(list index_list, int64_t b, const int64_t* drafted) except -1:
    """Every index's record of ``drafted[i]`` tokens checked before the first is made
    (an index is listed once): OverflowError naming the index where one does not fit."""
    cdef int64_t i
    cdef NgramIndex ix
    for i in range(b):
        ix = <NgramIndex>index_list[i]
        if not stats_fits(&ix._st, drafted[i], 0, drafted[i] > 0):
            _refuse_total(&ix._st, drafted[i], i)
    return 0


cdef int _record_limits(list index_list, int64_t b, const int64_t* drafted,
                        const int64_t* accepted, const int64_t* limits,
                        int64_t* lim) except -1:
    """The serving step's bookkeeping, which nothing refuses (``_check_totals`` ran):
    each verified draft recorded (``drafted`` not NULL), each index's draft limit
    (``limits[i]``, within its ``draft_len`` where adaptive) into ``lim``."""
    cdef int64_t i
    cdef NgramIndex ix
    for i in range(b):
        lim[i] = limits[i]
        if drafted != NULL:
            ix = <NgramIndex>index_list[i]
            if drafted[i] > 0:
                stats_record(&ix._st, drafted[i], accepted[i], GROW_C, SHRINK_C)
            lim[i] = stats_limit(&ix._st, lim[i])
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
