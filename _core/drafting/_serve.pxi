# The serving-step policy's Python face, written once for both index kinds: included
# (``include "_serve.pxi"``) by ngram_index.pyx and suffix_index.pyx, because it reads
# each module's own names (its index class's C policy ``ngram_serve``/``suffix_serve``,
# and the accessors _index_common.pxi names: ``_index_list``, ``_guard_of``,
# ``_stats_of``, ``_len_of``, ``WHAT``) and a .pxd cannot hold Python-level functions. Every argument is
# converted and checked here first; the C policy then refuses what the batch calls
# refuse, changing no index.

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport Py_INCREF

ctypedef int (*serve_fn)(list, Py_ssize_t, const int64_t*, const int64_t*, const int64_t*,
                         const int64_t*, const int64_t*, Py_ssize_t, int64_t*,
                         int64_t*) except -1


# -- drafts as Python lists ------------------------------------------------------------
# (a cache of int objects for token ids was tried here and was slower on a real step:
# a step's drafts vary, so its lookups miss the cache where a new int does not)

cdef list _token_list(const int64_t* src, Py_ssize_t n):
    """``src[0:n]`` as a new list of Python ints."""
    cdef list out = PyList_New(n)
    cdef Py_ssize_t j
    cdef object o
    for j in range(n):
        o = src[j]
        Py_INCREF(o)        # (PyList_SET_ITEM takes the reference)
        PyList_SET_ITEM(out, j, o)
    return out


cdef tuple _check_serve_counts(object drafted, object accepted):
    """``(drafted, accepted)`` of one ``serve`` call as counts with accepted <= drafted."""
    d = check_count(drafted, "drafted")
    a = check_count(accepted, "accepted")
    if a > d:
        raise ValueError(f"accepted={a} is beyond the {d} drafted tokens")
    return d, a


cdef object _serve_batch_counts(object drafted, object accepted, Py_ssize_t b):
    """``serve_batch``'s per-index ``(drafted, accepted)`` as owned int64 arrays."""
    dr = check_batch_counts(drafted, b, "drafted")
    ac = check_batch_counts(accepted, b, "accepted")
    cdef const int64_t[::1] dv = dr
    cdef const int64_t[::1] av = ac
    cdef Py_ssize_t i
    for i in range(b):
        if av[i] > dv[i]:
            raise ValueError(f"accepted[{i}]={av[i]} is beyond the {dv[i]} drafted tokens")
    return dr, ac


cdef inline bint _plain_int64(object x) noexcept:
    """A 1-D, C-contiguous, aligned, native-order 8-byte signed integer ndarray."""
    return plain_int_width(x) == 8


cdef object _owned_copy(object x):
    return cnp.PyArray_NewCopy(<cnp.ndarray>x, cnp.NPY_CORDER)


cdef inline const int64_t* _owned_data(object x) except NULL:
    """The data of one of the call's own int64 arrays (made or copied by this module:
    1-D, C-contiguous, native), checked in C instead of through a memoryview."""
    if not _plain_int64(x):
        raise TypeError("internal: expected a 1-D C-contiguous int64 array")
    return <const int64_t*>array_data(x)


cdef inline object _int64_empty(Py_ssize_t n):
    cdef cnp.npy_intp dims = n
    return cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)


cdef object _serve_run(serve_fn fn, list ixs, object src, object off, object dr, object ac,
                       object limits, Py_ssize_t k_cap, bint lists=False):
    """Run the C policy ``fn`` on owned, checked int64 arrays (``limits``: one draft
    limit per index, each at most ``k_cap``); returns ``(drafts, offsets, lengths)`` as
    ``propose_batch`` does, or with ``lists`` one list of token ids per index."""
    cdef Py_ssize_t b = len(ixs), i, j, w = 0
    cdef int64_t z = 0
    cdef const int64_t* sp = _owned_data(src)
    cdef const int64_t* op = _owned_data(off)
    cdef const int64_t* dp = _owned_data(dr)
    cdef const int64_t* ap = _owned_data(ac)
    cdef const int64_t* lp = _owned_data(limits)
    if array_len(off) != b + 1 or array_len(dr) < b or array_len(ac) < b or array_len(limits) < b:
        raise ValueError("internal: the serving step's arrays do not fit its indexes")
    square = _int64_empty(b * k_cap if b * k_cap else 1)
    lengths = _int64_empty(b)
    cdef int64_t* qv = <int64_t*>array_data(square)
    cdef int64_t* lnv = <int64_t*>array_data(lengths)
    fn(ixs, b, sp if array_len(src) else &z, op, dp if b else &z, ap if b else &z,
       lp if b else &z, k_cap, qv, lnv if b else &z)
    if lists:
        rows = PyList_New(b)
        for i in range(b):
            row = _token_list(&qv[i * k_cap], lnv[i])
            Py_INCREF(row)
            PyList_SET_ITEM(rows, i, row)
        return rows
    out_off = _int64_empty(b + 1)
    cdef int64_t* oov = <int64_t*>array_data(out_off)
    oov[0] = 0
    for i in range(b):
        for j in range(lnv[i]):
            qv[w + j] = qv[i * k_cap + j]
        w += lnv[i]
        oov[i + 1] = w
    return square[:w].copy(), out_off, lengths


cdef tuple _serve_args(object tokens, object drafted, object accepted, object max_k,
                       int64_t max_tokens):
    """``serve``'s arguments converted and checked, before the index is looked at:
    ``(tokens as an owned int64 array, drafted, accepted, max_k or -1 for None)``."""
    src = _plain_tokens(tokens)
    if src is None:
        src = np.array(token_ids(tokens, "tokens"), dtype=np.int64, copy=True)
    if type(drafted) is int and type(accepted) is int and 0 <= accepted <= drafted:
        d, a = drafted, accepted
    else:
        d, a = _check_serve_counts(drafted, accepted)
    if max_k is None:
        k = -1
    elif type(max_k) is int and max_k >= 0:
        k = max_k if max_k < max_tokens else max_tokens
    else:
        k = min(check_count(max_k, "max_k"), max_tokens)
    return src, d, a, k


cdef object _plain_tokens(object tokens):
    """``tokens`` as an owned int64 array without the Python-level conversion, for a
    plain int64 array or a list of ints that fit int64; None for anything else (the
    converting path then decides, with its messages)."""
    if _plain_int64(tokens):
        return _owned_copy(tokens)
    if type(tokens) is not list:
        return None
    cdef Py_ssize_t n = PyList_GET_SIZE(tokens), i
    cdef int overflow = 0
    cdef int64_t v
    out = _int64_empty(n)
    cdef int64_t* o = <int64_t*>array_data(out)
    if PyList_GET_SIZE(tokens) != n:
        return None
    for i in range(n):
        x = <object>PyList_GET_ITEM(tokens, i)
        if type(x) is not int:
            return None
        v = PyLong_AsLongLongAndOverflow(x, &overflow)
        if overflow:
            return None
        o[i] = v
    return out


cdef inline int64_t _default_limit(const index_stats_t* st) noexcept:
    """An index's draft limit for ``max_k=None``: ``draft_len``, or for an adaptive
    index the longest ``draft_len`` this step's record can reach (the policy then
    clips the draft to the ``draft_len`` after the record). Every term is at most the
    index's capacity, so nothing overflows."""
    if not st.adaptive:
        return st.draft_len
    return st.draft_len + GROW_C if st.draft_len + GROW_C < st.max_draft else st.max_draft


cdef list _serve_one(serve_fn fn, object ix, object src, object d_obj, object a_obj, int64_t k,
                     int64_t max_tokens):
    """``serve`` for one index: refuses as ``extend`` and ``record`` do (their messages),
    then runs the C policy ``fn``. The counts arrive as Python ints (checked non-negative,
    ``a_obj <= d_obj``, any size): the drafted total and the step count are checked
    before they become C integers, so a count beyond int64 gets ``record``'s overflow
    message."""
    cdef int64_t d, a
    # the list first: from reading the index below to the policy, no Python code runs
    cdef list ixs = [ix]
    cdef guard_t* g = _guard_of(ix)
    cdef const index_stats_t* st = _stats_of(ix)
    cdef int64_t m = src.shape[0], lim, length
    guard_write(g, NAME)            # refuses as extend does; released at once
    guard_done_write(g)
    length = _len_of(ix)
    if m > max_tokens - length:
        raise OverflowError(f"{WHAT} holds at most {max_tokens} tokens; {length} + {m} is too many")
    if d_obj > INT64_MAX - st.drafted or (d_obj > 0 and st.steps == INT64_MAX):
        check_total(st.drafted, d_obj, st.steps if d_obj > 0 else None)   # raises
    d = d_obj
    a = a_obj
    lim = _default_limit(st) if k < 0 else k
    cdef int64_t k_cap = lim if lim < length + m else length + m
    off = _int64_empty(2)
    counts = _int64_empty(3)      # drafted, accepted, the limit
    cdef int64_t* op = <int64_t*>array_data(off)
    cdef int64_t* cp = <int64_t*>array_data(counts)
    op[0] = 0
    op[1] = m
    cp[0] = d
    cp[1] = a
    cp[2] = lim if lim < k_cap else k_cap
    return _serve_run(fn, ixs, src, off, counts[0:1], counts[1:2], counts[2:3], k_cap, True)[0]


cdef object _plain_batch_args(Py_ssize_t b, object tokens, object offsets, object drafted,
                              object accepted, object max_k, int64_t max_tokens):
    """``_serve_batch_args``'s answer without its Python-level conversions, for the
    usual call: ``tokens``, ``offsets``, ``drafted`` and ``accepted`` plain int64 arrays
    of the right lengths, ``max_k`` None, a plain int or a plain int64 array of B
    counts. Copies first, then checks the copies in C; None for any other call or any
    check that fails (the converting path then decides, with its own messages)."""
    if not (_plain_int64(tokens) and _plain_int64(offsets) and _plain_int64(drafted)
            and _plain_int64(accepted)):
        return None
    if array_len(offsets) != b + 1 or array_len(drafted) != b or array_len(accepted) != b:
        return None
    cdef bint per_index = max_k is not None and type(max_k) is not int
    if per_index and not (_plain_int64(max_k) and array_len(max_k) == b):
        return None
    if max_k is not None and not per_index and max_k < 0:
        return None
    src = _owned_copy(tokens)
    off = _owned_copy(offsets)
    dr = _owned_copy(drafted)
    ac = _owned_copy(accepted)
    lims = None
    cdef int64_t k = 0
    if per_index:
        lims = _owned_copy(max_k)
    elif max_k is not None:
        k = max_k if max_k < max_tokens else max_tokens
        lims = _int64_empty(b)
    cdef const int64_t* ov = <const int64_t*>array_data(off)
    cdef const int64_t* dv = <const int64_t*>array_data(dr)
    cdef const int64_t* av = <const int64_t*>array_data(ac)
    cdef int64_t* lv
    cdef Py_ssize_t i
    if longest_row(ov, b + 1, array_len(src), 0) < 0:
        return None
    for i in range(b):
        if dv[i] < 0 or av[i] < 0 or av[i] > dv[i]:
            return None
    if lims is not None:
        lv = <int64_t*>array_data(lims)
        for i in range(b):
            if not per_index:
                lv[i] = k
            elif lv[i] < 0:
                return None
            elif lv[i] > max_tokens:
                lv[i] = max_tokens
    return src, off, dr, ac, lims


cdef tuple _serve_batch_args(list ixs, object tokens, object offsets, object drafted,
                             object accepted, object max_k, int64_t max_tokens):
    """``serve_batch``'s arguments converted, copied and checked: ``(tokens, offsets
    starting at 0, drafted, accepted, limits or None for each index's default)``."""
    cdef Py_ssize_t b = len(ixs)
    plain = _plain_batch_args(b, tokens, offsets, drafted, accepted, max_k, max_tokens)
    if plain is not None:
        return plain
    src, off = batch_tokens(tokens, offsets, b)
    cdef const int64_t[::1] ov = off
    _check_run_offsets(off, &ov[0], b, src.shape[0])
    dr, ac = _serve_batch_counts(drafted, accepted, b)
    lims = check_batch_limits(max_k, b)
    if lims is not None:
        lims = np.minimum(lims, max_tokens)
    return src, off, dr, ac, lims


cdef object _serve_batch(serve_fn fn, object indexes, object tokens, object offsets,
                         object drafted, object accepted, object max_k, int64_t max_tokens,
                         bint lists=False):
    """``serve_batch`` (``serve_batch_lists`` with ``lists``): the arguments checked,
    each index's draft limit (its own default where ``max_k`` is None) and the drafts'
    row width found, the C policy ``fn`` run."""
    cdef list ixs = _index_list(indexes)
    src, off, dr, ac, lims = _serve_batch_args(ixs, tokens, offsets, drafted, accepted,
                                               max_k, max_tokens)
    cdef Py_ssize_t b = len(ixs), i
    cdef const index_stats_t* st
    cdef int64_t k_cap = 0, room
    cdef const int64_t* ov = _owned_data(off)
    cdef int64_t* lv
    if array_len(off) != b + 1:
        raise ValueError("internal: the offsets do not fit the indexes")
    if lims is None:
        lims = _int64_empty(b)
        lv = <int64_t*>array_data(lims)
        for i in range(b):
            lv[i] = _default_limit(_stats_of(ixs[i]))
    else:
        lv = <int64_t*>_owned_data(lims)     # (the call's own array: clipped in place)
        if array_len(lims) != b:
            raise ValueError("internal: the limits do not fit the indexes")
    for i in range(b):
        room = _len_of(ixs[i]) + ov[i + 1] - ov[i]
        room = lv[i] if lv[i] < room else room
        if room > k_cap:
            k_cap = room
    for i in range(b):
        if lv[i] > k_cap:
            lv[i] = k_cap
    return _serve_run(fn, ixs, src, off, dr, ac, lims, k_cap, lists)


cdef int _check_serve_c(list indexes, Py_ssize_t b, const int64_t* offsets,
                        const int64_t* drafted, const int64_t* accepted,
                        const int64_t* limits, Py_ssize_t k_cap) except -1:
    """The C policy's own checks of what its caller (``serve``, ``serve_batch``, the
    batch step) hands it; ``drafted`` and ``accepted`` may be NULL (nothing recorded)."""
    cdef Py_ssize_t i
    if len(indexes) != b or k_cap < 0:
        raise ValueError(f"the update got {len(indexes)} indexes for {b} token runs")
    for i in range(b):
        o = indexes[i]
        if not _is_index(o):
            raise TypeError(
                f"indexes[{i}] must be {WHAT} of the same implementation, "
                f"got {type(o).__module__}.{type(o).__name__}"
            )
        if drafted != NULL and (drafted[i] < 0 or accepted[i] < 0 or accepted[i] > drafted[i]):
            raise ValueError(
                f"accepted[{i}]={accepted[i]} is not within the {drafted[i]} drafted tokens"
            )
        if limits[i] < 0:
            raise ValueError(f"limits[{i}] must be >= 0, got {limits[i]}")
    if longest_row(offsets, b + 1, offsets[b], 0) < 0:
        raise ValueError("offsets must be nondecreasing and start at 0")
    return 0
