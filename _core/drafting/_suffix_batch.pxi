# The suffix index's batch API (compiled): ``propose_batch``, ``record_batch``,
# ``serve_batch`` and ``extend_batch``, the serving-step policy ``suffix_serve`` the
# batch step cimports, and extend_batch's pipeline (the first loads of indexes a few
# places ahead prefetched while one is indexed). Included (``include
# "_suffix_batch.pxi"``) by suffix_index.pyx, after its SuffixIndex.

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
    src, off = batch_tokens(tokens, offsets, b)
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
