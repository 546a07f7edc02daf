# The machinery both index kinds share beyond the C struct of _index_stats.pxd: the
# methods' ``self`` check, the Python faces of the statistics (``record``, ``stats``,
# pickling), the batch calls' index list and guard handling, and ``record_batch``. Included (``include
# "_index_common.pxi"``) by ngram_index.pyx and suffix_index.pyx, because it raises
# through each module's own names, which a .pxd cannot reach. The including module
# defines, before it: ``NAME`` (the class name, for the guard's refusals), ``WHAT``
# ("an NgramIndex" / "a SuffixIndex", for messages), ``_check_index_stats`` (the
# unpickled statistics' check) and, after its class, ``_is_index(o)``,
# ``_guard_of(o)``, ``_stats_of(o)`` and ``_len_of(o)`` (an instance's guard,
# statistics and length, ``o`` known to be an index).

cdef int64_t GROW_C = GROW_STEP       # C copies of the adaptive length's steps
cdef int64_t SHRINK_C = SHRINK_STEP


# -- one index's statistics -----------------------------------------------------------

cdef inline int _check_self(object o) except -1:
    """A method's ``self``, refused (TypeError) unless it is an index of this module's
    class: a method called unbound (``NgramIndex.extend(obj, ...)``) gets any object,
    which Cython does not check, and every method reads its fields as the class's."""
    if not _is_index(o):
        raise TypeError(
            f"a method of {NAME} needs {WHAT} of the same implementation, got "
            f"{type(o).__module__}.{type(o).__name__}"
        )
    return 0


cdef object _record_one(guard_t* g, index_stats_t* s, object proposed, object accepted):
    """``record``: checks the counts (refusing, changing nothing, a drafted total or a
    step count beyond int64), records them and returns the draft length to use next."""
    p, a = check_record(proposed, accepted)
    cdef int64_t pv, av
    if p > INT64_MAX - s.drafted or s.steps == INT64_MAX:
        guard_check(g, NAME)
        check_total(s.drafted, p, s.steps)   # raises
    pv = p
    av = a
    # no Python code runs from the check to the change
    guard_check(g, NAME)
    stats_record(s, pv, av, GROW_C, SHRINK_C)
    return s.draft_len


cdef inline int64_t _propose_limit(const index_stats_t* s, object max_k,
                                  const int64_t* length) except -1:
    """``propose``'s draft limit: ``draft_len`` for None, else ``max_k`` (converted
    first, which may run Python code) clipped to the length read after it."""
    if max_k is None:
        return s.draft_len
    if type(max_k) is not int or max_k < 0:
        max_k = check_count(max_k, "max_k")
    return max_k if max_k < length[0] else length[0]


cdef dict _stats_dict(const guard_t* g, const index_stats_t* s):
    """The ``stats`` property."""
    guard_check(g, NAME)
    return {
        "steps": s.steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "full_accepts": s.full,
        "acceptance_rate": _rate(s),
        "draft_len": s.draft_len,
    }


cdef inline double _rate(const index_stats_t* s) noexcept:
    """The acceptance rate: accepted / drafted as doubles (the twin divides the same
    two doubles), 0.0 before anything was drafted."""
    return (<double>s.accepted) / (<double>s.drafted) if s.drafted else 0.0


cdef int _refuse_total(const index_stats_t* s, int64_t drafted, Py_ssize_t i) except -1:
    """A batch step's refusal of ``indexes[i]``, whose record of ``drafted`` tokens
    ``stats_fits`` refused (the shared check's message, the index named)."""
    try:
        check_total(s.drafted, drafted, s.steps if drafted > 0 else None)   # raises
    except OverflowError as exc:
        raise OverflowError(f"indexes[{i}]: {exc}") from None
    raise OverflowError(f"indexes[{i}]: the record does not fit int64")   # not reached


cdef inline tuple _stats_tuple(const index_stats_t* s):
    """The statistics as pickled: ``(steps, drafted, accepted, full_accepts)``."""
    return (s.steps, s.drafted, s.accepted, s.full)


cdef int _stats_restore(const guard_t* g, index_stats_t* s, object stats) except -1:
    """``_restore_stats``: pickled statistics, checked, put back."""
    steps, drafted, accepted, full = _check_index_stats(stats)
    guard_check(g, NAME)
    s.steps, s.drafted, s.accepted, s.full = steps, drafted, accepted, full
    return 0


# -- batches of indexes ---------------------------------------------------------------

cdef int _refuse(guard_t* g, Py_ssize_t i, bint write) except -1:
    """The guard's refusal of ``indexes[i]`` in a batch call, the index named (the
    callers test the guard inline first: this runs only when it refuses)."""
    try:
        if write:
            guard_write(g, NAME)
            guard_done_write(g)      # not reached: the caller saw a refusal coming
        else:
            guard_check(g, NAME)
    except RuntimeError as exc:
        raise RuntimeError(f"indexes[{i}]: {exc}") from None
    return 0


cdef inline int _take_write(guard_t* g, int64_t* held_by, int64_t stamp,
                            Py_ssize_t i) except -1:
    """A batch writer's guard on ``indexes[i]``: refuses an index in use, or one this
    call (``stamp``, kept in ``held_by``) already holds; runs no Python code unless it
    refuses."""
    if g.phase != GUARD_READY or g.writing or g.readers:
        if g.writing and held_by[0] == stamp:
            raise ValueError(
                f"indexes[{i}] appears twice in the batch; a batch call takes each "
                "index once"
            )
        _refuse(g, i, True)
    g.writing = 1
    held_by[0] = stamp
    return 0


cdef list _index_list(object indexes):
    """A batch call's ``indexes`` as a list, every item an index of this module."""
    if _is_index(indexes):
        raise TypeError(f"indexes must be a sequence of {NAME}, got a single {NAME}")
    try:
        out = list(indexes)
    except TypeError:
        raise TypeError(
            f"indexes must be a sequence of {NAME}, got {type(indexes).__name__}"
        ) from None
    cdef Py_ssize_t i
    for i in range(len(out)):
        if not _is_index(out[i]):
            ix = out[i]
            raise TypeError(
                f"indexes[{i}] must be {WHAT} of the same implementation, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )
    return out


cdef int _check_run_offsets(object off, const int64_t* ov, Py_ssize_t b,
                            int64_t n) except -1:
    """An owned copy ``off`` (its data ``ov``) of B + 1 offsets into ``n`` tokens,
    held to the contract in C; only a bad one goes through the shared check, for the
    twin's exact message."""
    if longest_row(ov, b + 1, n, 0) < 0:
        index_offsets(off, n)
        raise ValueError("offsets must be nondecreasing and within the tokens given")
    return 0


cdef object _record_batch(object indexes, object proposed, object accepted):
    """``record_batch``: ``record`` for B indexes, all or nothing; returns the next
    draft lengths (int64)."""
    cdef list ixs = _index_list(indexes)
    cdef int64_t b = len(ixs), i
    p = check_batch_counts(proposed, b, "proposed")
    a = check_batch_counts(accepted, b, "accepted")
    cdef const int64_t[::1] pv = p
    cdef const int64_t[::1] av = a
    for i in range(b):
        if av[i] > pv[i]:
            raise ValueError(f"accepted[{i}]={av[i]} is beyond the {pv[i]} drafted tokens")
    out = np.empty(b, dtype=np.int64)
    cdef int64_t[::1] ov = out
    cdef guard_t* g
    cdef index_stats_t* s
    # all or nothing: every index's guard and every total (an index listed twice adds
    # up) checked before any changes; no Python code runs from here to the last change
    for i in range(b):
        g = _guard_of(ixs[i])
        if g.phase != GUARD_READY or g.writing:
            _refuse(g, i, False)
        s = _stats_of(ixs[i])
        s.pending = 0
        s.pending_steps = 0
    for i in range(b):
        s = _stats_of(ixs[i])
        if not stats_fits(s, pv[i], s.pending, s.pending_steps + 1):
            check_total(s.drafted + s.pending, pv[i], (<object>s.steps) + s.pending_steps)  # raises
        s.pending += pv[i]
        s.pending_steps += 1
    for i in range(b):
        s = _stats_of(ixs[i])
        stats_record(s, pv[i], av[i], GROW_C, SHRINK_C)
        ov[i] = s.draft_len
    return out
