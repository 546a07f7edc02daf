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


cdef inline void _peek_rec(const sam_t* m, int32_t v) noexcept nogil:
    """Prefetch what a lookup from state v reads first: a clone's record, or a
    position state's next token and suffix link."""
    if v >= CLONE:
        SFX_PREFETCH_KEEP(&m.cl[v - CLONE])
    else:
        if m.wide:
            SFX_PREFETCH_KEEP(&m.t64[v])
        else:
            SFX_PREFETCH_KEEP(&m.t32[v])
        SFX_PREFETCH_KEEP(&m.plink[v])


cdef inline void _peek_first(const sam_t* m, int32_t v, int64_t c) noexcept nogil:
    """Prefetch the lookup of v's transition on c: its edge-table slot (its address
    needs no load) and its edge bit."""
    SFX_PREFETCH_KEEP(&m.sl[_home(v, <uint32_t>c, m.cap_sl)])
    if v < CLONE:
        SFX_PREFETCH_KEEP(&m.pbits[v >> 3])


cdef inline void _peek_dst(const sam_t* m, int32_t q) noexcept nogil:
    """Prefetch the record of a transition's target q (a clone's, or a position
    state's suffix link)."""
    if q >= CLONE:
        SFX_PREFETCH_KEEP(&m.cl[q - CLONE])
    elif q > 0:
        SFX_PREFETCH_KEEP(&m.plink[q])


cdef inline void _peek_edge(const sam_t* m, int32_t v, int64_t c) noexcept nogil:
    """With v's record and slot in cache: prefetch the token after a clone's first
    end and the edge v's slot for c holds."""
    cdef int32_t e
    if v >= CLONE:
        if m.wide:
            SFX_PREFETCH_KEEP(&m.t64[m.cl[v - CLONE].first + 1])
        else:
            SFX_PREFETCH_KEEP(&m.t32[m.cl[v - CLONE].first + 1])
    e = m.sl[_home(v, <uint32_t>c, m.cap_sl)].edge
    if e >= 0:
        SFX_PREFETCH_KEEP(&m.ed[e])


cdef inline void _peek(const sam_t* m, int64_t stop, int level) noexcept nogil:
    """Prefetch, for the index's next append (of the token c at ``npos``, below
    ``stop``), what its stage ``level`` needs, each stage reading only what the ones
    before brought in (extend_batch runs them PIPE_AHEAD indexes apart). The append
    starts at p, the tail's suffix link, and looks up p's transition on c, then, where
    there is none, its suffix link w's, and so on; where the transition found reaches
    a state q too long for p, q is cloned and the links from p on are redirected to the
    clone while they point to q. 1: p's record, the slot of (p, c), where the append
    writes (the next clone and edge records, the new state's link) and the anchored
    token; 2: from those, the token after a clone p's first end, the slot's edge, the
    record of p's first transition's target, and w's record and slot; 3: p's
    transition on c found (q), q's record, w's token and edge, and p's edge list where
    p gets an edge; 4: from q's record, its suffix link's record (which bounds a
    clone's redirects) and q's edge list (a clone copies it). A stage keeps no state,
    so stages 3 and 4 each look p's transition up again (from lines in cache). Reads
    only states, slots and edges that exist; writes nothing."""
    cdef int32_t p, q, w, ref
    cdef int64_t c
    if m.tail <= 0:
        return
    p = m.plink[m.tail]
    c = _tk(m, m.npos if m.npos < stop else stop - 1)
    w = _link(m, p) if level == 2 or level == 3 else -1
    if level == 1:
        _peek_rec(m, p)
        _peek_first(m, p, c)
        # where the append writes: the next clone and edge records, cur's link
        if m.n_cl < m.cap_cl:
            SFX_PREFETCH_KEEP(&m.cl[m.n_cl])
        if m.n_ed < m.cap_ed:
            SFX_PREFETCH_KEEP(&m.ed[m.n_ed])
        if m.npos < stop:
            SFX_PREFETCH_KEEP(&m.plink[m.npos + 1])
        if m.anchor >= 0:
            if m.wide:
                SFX_PREFETCH_KEEP(&m.t64[m.anchor])
            else:
                SFX_PREFETCH_KEEP(&m.t32[m.anchor])
    elif level == 2:
        _peek_edge(m, p, c)
        if p >= CLONE:
            _peek_dst(m, m.cl[p - CLONE].dst)
        if w >= 0:
            _peek_rec(m, w)
            _peek_first(m, w, c)
    elif level == 3:
        q = _find(m, p, c, &ref)
        _peek_dst(m, q)
        if q < 0 and _has_edges(m, p):   # p gets an edge on c: its edge list's head
            SFX_PREFETCH_KEEP(&m.hd[_head_home(p, m.cap_hd)])
        if w >= 0:
            _peek_edge(m, w, c)
    else:
        q = _find(m, p, c, &ref)
        if q < 0 or _len(m, p) + 1 == _len(m, q):
            return
        _peek_dst(m, _link(m, q))
        if _has_edges(m, q):
            SFX_PREFETCH_KEEP(&m.hd[_head_home(q, m.cap_hd)])


cdef void _add_jobs(job_t* jobs, int64_t b) noexcept nogil:
    """Write each job's tokens into its index's buffer (which has room, and is int64
    when a token needs it), then index them, index by index. Meanwhile the first
    appends of the indexes PIPE_AHEAD, 2, 3 and 4 times PIPE_AHEAD places later get
    ``_peek``'s stages 4, 3, 2 and 1 (the index's own record before), each a dependent
    step further, so that the cold misses of an index's first append overlap the work
    on others (its later appends find most of their lines in cache)."""
    cdef int64_t i, j, k, lv
    cdef sam_t* m
    for k in range(b):
        m = jobs[k].m
        if m.wide:
            for j in range(jobs[k].stop - jobs[k].start):
                m.t64[jobs[k].start + j] = jobs[k].src[j]
        else:
            for j in range(jobs[k].stop - jobs[k].start):
                m.t32[jobs[k].start + j] = <int32_t>jobs[k].src[j]
    for i in range(b + PIPE_STAGES * PIPE_AHEAD):
        if i < b:
            SFX_PREFETCH(jobs[i].m)
            SFX_PREFETCH(<char*>jobs[i].m + 64)
        for lv in range(1, PIPE_STAGES):
            k = i - lv * PIPE_AHEAD
            if 0 <= k < b and jobs[k].stop > jobs[k].start:
                _peek(jobs[k].m, jobs[k].stop, <int>lv)
        k = i - PIPE_STAGES * PIPE_AHEAD
        if 0 <= k < b:
            jobs[k].done = _add_range(jobs[k].m, jobs[k].start, jobs[k].stop)


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
    # every argument converted (Python code may run) before any index is looked at
    cdef list ixs = _index_list(indexes)
    cdef int64_t b = len(ixs), i, k, end, bound = 0
    cdef SuffixIndex ix
    ks = check_batch_limits(max_k, b)       # an owned, validated copy, or None
    cdef const int64_t* kv = _owned_data(ks) if ks is not None else NULL
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
            k = kv[i] if kv != NULL else ix._st.draft_len
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
    return _record_batch(indexes, proposed, accepted)


def serve_batch(indexes, tokens, offsets, drafted, accepted, max_k=None):
    return _serve_batch(suffix_serve, indexes, tokens, offsets, drafted, accepted, max_k,
                        MAX_TOKENS_C)


def serve_batch_lists(indexes, tokens, offsets, drafted, accepted, max_k=None):
    return _serve_batch(suffix_serve, indexes, tokens, offsets, drafted, accepted, max_k,
                        MAX_TOKENS_C, True)


cdef int64_t _batch_stamp = 0


def extend_batch(indexes, tokens, offsets):
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
    nondecreasing offsets, index ``i`` getting ``sv[ov[i] - ov[0]:ov[i + 1] - ov[0]]``;
    every item a SuffixIndex). When ``drafts`` is
    not NULL (the serving step's update), after the extend each index with
    ``drafted[i] > 0`` records ``(drafted[i], accepted[i])`` and proposes at most
    ``min(limits[i], kmax)`` tokens (and at most its ``draft_len`` when adaptive) into
    ``drafts[i * kmax:]``, the count into ``lengths[i]``, all under the write guard."""
    global _batch_stamp
    cdef SuffixIndex ix
    cdef job_t* jobs = NULL
    cdef int64_t stamp, i, j, m, k, end, marked = 0
    cdef int64_t z = 0, base = ov[0]
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
            if m > MAX_TOKENS_C - ix._len:
                raise OverflowError(
                    f"a SuffixIndex holds at most {MAX_TOKENS_C} tokens; "
                    f"indexes[{i}] has {ix._len} + {m}, too many"
                )
            if drafted != NULL and not stats_fits(&ix._st, drafted[i], 0, drafted[i] > 0):
                _refuse_total(&ix._st, drafted[i], i)
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
                for j in range(ov[i] - base, ov[i + 1] - base):
                    if sv[j] < INT32_LO or sv[j] > INT32_HI:
                        ix._widen()
                        break
            jobs[i].m = &ix.m
            jobs[i].src = sv + (ov[i] - base) if m else &z
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
                if drafted != NULL and drafted[i] > 0:
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
