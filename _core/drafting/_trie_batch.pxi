# The suffix trie's batches (compiled): ``extend_tries`` and ``speculate_tries``, B rows
# per call over the tries given (one trie may serve several rows), their arguments read
# into memory of the call's own (``_Scratch``), each distinct trie's guard taken once
# (``_take_guards``), the rows run in C over an array of ``row_t``. Included (``include
# "_trie_batch.pxi"``) by suffix_trie.pyx, after its SuffixTrie; the design is in that
# module's docstring.

ctypedef struct row_t:      # one row of a batch call, read without the GIL
    trie_t* tr
    const int64_t* toks     # extend: its tokens (in the call's own copy) ...
    int64_t n               # ... and their count; speculate: the row's draft limit
    int32_t* buf            # extend: its sequence's storage (int32 count, then the open suffixes)
    int32_t tail            # speculate: its sequence's longest open suffix (0: none)


cdef uint64_t _batch_stamp = 0


cdef Py_ssize_t _take_guards(list tries, Py_ssize_t n, bint write, PyObject** uniq,
                             Py_ssize_t* slots) except -1:
    """The guards of the distinct tries among ``tries[:n]`` (SuffixTries, by identity,
    in order of first appearance), each taken once (a writer's, or a reader's): the
    count of them, each in ``uniq`` (borrowed: ``tries`` holds them) and, when ``slots``
    is not NULL, each row's place among them in ``slots[i]``. On a refusal the guards
    taken are given back first. Runs no Python code unless it refuses, so no other call
    can take a guard or move a stamp in between."""
    global _batch_stamp
    cdef Py_ssize_t i, u = 0
    cdef SuffixTrie t
    _batch_stamp += 1
    cdef uint64_t stamp = _batch_stamp
    try:
        for i in range(n):
            t = <SuffixTrie?>tries[i]   # (checked already: check_trie_list)
            if t._stamp != stamp:
                if write:
                    guard_write(&t._g, NAME)
                else:
                    guard_read(&t._g, NAME)
                t._stamp = stamp
                t._slot = u
                uniq[u] = <PyObject*>t
                u += 1
            if slots != NULL:
                slots[i] = t._slot
    except BaseException:
        _give_back(uniq, u, write)
        raise
    return u


cdef void _give_back(PyObject** uniq, Py_ssize_t u, bint write) noexcept:
    cdef Py_ssize_t i
    for i in range(u):
        if write:
            guard_done_write(&(<SuffixTrie>uniq[i])._g)
        else:
            guard_done_read(&(<SuffixTrie>uniq[i])._g)


cdef class _Scratch:
    """The converted arguments and C arrays of one batch call of ``b`` rows and
    ``n_others`` other tries, freed with it: the rows' tries and keys, the distinct
    tries; for ``extend_tries`` the tokens and offsets, each row's place among the
    distinct tries and each one's tokens; for ``speculate_tries`` the limits, the other
    tries and the drafts."""
    cdef list tries             # the rows' tries, a list of the call's own
    cdef list more              # speculate_tries: the other tries, a list of the call's own
    cdef row_t* rows
    cdef PyObject** uniq
    cdef int64_t* keys
    cdef int64_t* toks
    cdef int64_t* off
    cdef Py_ssize_t* slots
    cdef int64_t* need
    cdef int64_t* ks
    cdef trie_t** others
    cdef int64_t* drafts
    cdef int32_t* lengths

    def __cinit__(self, Py_ssize_t b, Py_ssize_t n_others, bint extend):
        cdef size_t m = <size_t>b + 1, mo = <size_t>n_others + 1
        self.rows = <row_t*>malloc(m * sizeof(row_t))
        self.uniq = <PyObject**>malloc((m + mo) * sizeof(PyObject*))
        self.keys = <int64_t*>malloc(m * sizeof(int64_t))
        if extend:
            self.off = <int64_t*>malloc(m * sizeof(int64_t))
            self.slots = <Py_ssize_t*>malloc(m * sizeof(Py_ssize_t))
            self.need = <int64_t*>calloc(m, sizeof(int64_t))
            ok = self.off != NULL and self.slots != NULL and self.need != NULL
        else:
            self.ks = <int64_t*>malloc(m * sizeof(int64_t))
            self.others = <trie_t**>malloc(mo * sizeof(trie_t*))
            self.drafts = <int64_t*>malloc(m * MAX_DEPTH * sizeof(int64_t))
            self.lengths = <int32_t*>malloc(m * sizeof(int32_t))
            ok = self.ks != NULL and self.others != NULL and self.drafts != NULL and self.lengths != NULL
        if not ok or self.rows == NULL or self.uniq == NULL or self.keys == NULL:
            raise MemoryError()

    cdef int64_t* tokens(self, Py_ssize_t n) except NULL:
        """Room for ``n`` tokens (``extend_tries``')."""
        free(self.toks)
        self.toks = <int64_t*>malloc((<size_t>n + 1) * sizeof(int64_t))
        if self.toks == NULL:
            raise MemoryError()
        return self.toks

    def __dealloc__(self):
        free(self.rows)
        free(self.uniq)
        free(self.keys)
        free(self.toks)
        free(self.off)
        free(self.slots)
        free(self.need)
        free(self.ks)
        free(self.others)
        free(self.drafts)
        free(self.lengths)


cdef int _copy_ids(const int64_t[::1] v, int64_t* dst) except -1:
    """An int64 array from the checks into the call's own memory."""
    if v.shape[0]:
        memcpy(dst, &v[0], v.shape[0] * sizeof(int64_t))
    return 0


cdef list _plain_tries(object x):
    """``x`` as a new list when it is a list or tuple of SuffixTries of exactly this
    class (what ``check_trie_list`` takes, and no Python code runs), else None (the
    checks decide)."""
    cdef list out
    if type(x) is list:
        out = list(<list>x)
    elif type(x) is tuple:
        out = list(<tuple>x)
    else:
        return None
    for o in out:
        if type(o) is not SuffixTrie:
            return None
    return out


cdef _Scratch _extend_args(object tries, object seqs, object tokens, object offsets):
    """``extend_tries``' arguments converted into a ``_Scratch``: read in C when they are
    the usual ones (exact SuffixTries; keys, tokens and offsets as lists or tuples of
    plain ints or native int32/int64 arrays, held to the contract), else through the
    checks, which raise the one message."""
    cdef list rl = _plain_tries(tries)
    cdef Py_ssize_t b, n
    cdef _Scratch sc
    if rl is not None:
        b = len(rl)
        n = fast_len(tokens)
        if fast_len(seqs) == b and n >= 0 and fast_len(offsets) == b + 1:
            sc = _Scratch(b, 0, True)       # (may run Python code: fast_read checks sizes again)
            if (fast_read(seqs, b, sc.keys) == 0 and fast_read(offsets, b + 1, sc.off) == 0
                    and fast_read(tokens, n, sc.tokens(n)) == 0 and longest_row(sc.off, b + 1, n, 0) >= 0):
                sc.tries = rl
                return sc
    rows, keys = check_trie_rows(tries, seqs, SuffixTrie)
    tk, off = ragged(tokens, offsets, len(rows))
    sc = _Scratch(len(rows), 0, True)
    sc.tries = rows
    _copy_ids(keys, sc.keys)
    _copy_ids(off, sc.off)
    _copy_ids(tk, sc.tokens(tk.shape[0]))
    return sc


cdef _Scratch _speculate_args(object tries, object seqs, object max_k, object others, object factor,
                              object min_prob, double* f, double* least):
    """``speculate_tries``' arguments converted into a ``_Scratch`` (the other tries in
    ``sc.more``, ``factor`` and ``min_prob`` into ``f`` and ``least``): read in C when
    they are the usual ones (exact SuffixTries; keys and per-row limits as lists or
    tuples of plain ints or native int32/int64 arrays; one plain int limit; plain ints
    and floats for the rest), else through the checks, which raise the one message."""
    cdef list rl = _plain_tries(tries), ml = _plain_tries(others)
    cdef Py_ssize_t b, i
    cdef int64_t k
    cdef int ovf = 0
    cdef _Scratch sc
    if rl is not None and ml is not None and fast_len(seqs) == len(rl) and _fast_draft(factor, min_prob, f, least):
        b = len(rl)
        sc = _Scratch(b, len(ml), False)    # (may run Python code: fast_read checks sizes again)
        ok = fast_read(seqs, b, sc.keys) == 0
        if ok and PyLong_CheckExact(max_k):
            k = PyLong_AsLongLongAndOverflow(max_k, &ovf)
            k = INT64_MAX if ovf > 0 else k      # (check_batch_limits' clip)
            ok = ovf >= 0 and k >= 0
            for i in range(b):
                sc.ks[i] = k
        elif ok:
            ok = fast_len(max_k) == b and fast_read(max_k, b, sc.ks) == 0
            for i in range(b if ok else 0):
                ok = ok and sc.ks[i] >= 0
        if ok:
            sc.tries, sc.more = rl, ml
            return sc
    rows, keys = check_trie_rows(tries, seqs, SuffixTrie)
    more = check_trie_list(others, SuffixTrie, "others")
    ks = check_batch_limits(max_k, len(rows), False)
    f[0], least[0] = check_trie_draft(factor, min_prob)
    sc = _Scratch(len(rows), len(more), False)
    sc.tries, sc.more = rows, more
    _copy_ids(keys, sc.keys)
    _copy_ids(ks, sc.ks)
    return sc


cdef int64_t _extend_rows(row_t* rows, Py_ssize_t b) noexcept nogil:
    """``_extend`` of each row in order: -1, or the row whose trie ran out of memory
    (the rows after it not run)."""
    cdef Py_ssize_t i
    for i in range(b):
        if _extend(rows[i].tr, rows[i].toks, rows[i].n, rows[i].buf + 1, rows[i].buf) < rows[i].n:
            return i
    return -1


def extend_tries(tries, seqs, tokens, offsets):
    # every argument converted into memory of the call's own (Python code may run) ...
    cdef _Scratch sc = _extend_args(tries, seqs, tokens, offsets)
    cdef list rl = sc.tries
    cdef Py_ssize_t b = len(rl), i, u, bad
    cdef int64_t work = 0
    cdef SuffixTrie t
    # ... then each trie's writer flag, once, all or nothing
    u = _take_guards(rl, b, True, sc.uniq, sc.slots)
    made = []
    try:
        for i in range(b):
            sc.need[sc.slots[i]] += sc.off[i + 1] - sc.off[i]
        for i in range(u):      # the room for all of a trie's tokens, before any change
            t = <SuffixTrie>sc.uniq[i]
            if sc.need[i]:
                check_trie_room(t._t.n, sc.need[i], t._t.depth)
        try:
            for i in range(b):  # each row's sequence storage (made for a new one)
                t = <SuffixTrie>rl[i]
                key = sc.keys[i]
                buf = t._open.get(key)
                if buf is None:
                    made.append((t, key))
                    buf = t._seq_buf(key)
                sc.rows[i].tr = &t._t
                sc.rows[i].toks = sc.toks + sc.off[i]
                sc.rows[i].n = sc.off[i + 1] - sc.off[i]
                sc.rows[i].buf = <int32_t*>PyByteArray_AS_STRING(buf)
                work += sc.rows[i].n * t._t.depth
        except BaseException:   # (out of memory) the sequences opened closed again
            for t, key in made:
                t._open.pop(key, None)
            raise
        if work >= NOGIL_WORK:
            with nogil:
                bad = _extend_rows(sc.rows, b)
        else:
            bad = _extend_rows(sc.rows, b)
        if bad >= 0:
            guard_break(&(<SuffixTrie>rl[bad])._g)
            raise MemoryError(f"extend_tries: tries[{bad}] could not grow its nodes: out of memory; that "
                              f"{NAME} is unusable now")
    finally:
        _give_back(sc.uniq, u, True)


cdef int32_t _tail(const trie_t* tr, int32_t nd, int64_t* ctx) noexcept nogil:
    """The tokens of node ``nd`` (0: none) into ``ctx``, first to last; their count."""
    cdef int64_t back[MAX_DEPTH]
    cdef int32_t L = 0, i
    while nd > 0:
        back[L] = tr.tok[nd]
        L += 1
        nd = tr.par[nd]
    for i in range(L):
        ctx[i] = back[L - 1 - i]
    return L


cdef void _speculate_rows(const row_t* rows, Py_ssize_t b, trie_t** others, Py_ssize_t n_others, double f,
                          double least, int64_t* drafts, int32_t* lengths) noexcept nogil:
    """Each row's draft (``speculate_tries``' rule) into ``drafts[i * MAX_DEPTH:]``, its
    length into ``lengths[i]``."""
    cdef int64_t ctx[MAX_DEPTH]
    cdef int64_t d[MAX_DEPTH]
    cdef Py_ssize_t i, j
    cdef int32_t L, Lo, n, nd
    cdef double score, s
    cdef const trie_t* o
    for i in range(b):
        lengths[i] = 0
        if rows[i].n == 0:
            continue
        L = _tail(rows[i].tr, rows[i].tail, ctx)
        _speculate(rows[i].tr, ctx, L, min(rows[i].n, <int64_t>rows[i].tr.depth), f, least,
                   drafts + i * MAX_DEPTH, &n, &score)
        for j in range(n_others):
            o = others[j]
            Lo = min(L, o.depth)
            _speculate(o, ctx + L - Lo, Lo, min(rows[i].n, <int64_t>o.depth), f, least, d, &nd, &s)
            if s > score:
                memcpy(drafts + i * MAX_DEPTH, d, nd * sizeof(int64_t))
                n = nd
                score = s
        lengths[i] = n


def speculate_tries(tries, seqs, max_k, others=(), factor=1.0, min_prob=0.1):
    # every argument converted into memory of the call's own (Python code may run) ...
    cdef double f, least
    cdef _Scratch sc = _speculate_args(tries, seqs, max_k, others, factor, min_prob, &f, &least)
    cdef list rl = sc.tries, ml = sc.more
    cdef Py_ssize_t b = len(rl), n_o = len(ml), i, j, u
    cdef SuffixTrie t
    cdef int32_t n_open
    # ... then each trie's reader count, once, all or nothing
    u = _take_guards(rl + ml, b + n_o, False, sc.uniq, NULL)
    try:
        for i in range(n_o):
            sc.others[i] = &(<SuffixTrie>ml[i])._t
        for i in range(b):      # each row's longest open suffix, read with the GIL
            t = <SuffixTrie>rl[i]
            sc.rows[i].tr = &t._t
            sc.rows[i].n = sc.ks[i]
            sc.rows[i].tail = 0
            buf = t._open.get(sc.keys[i]) if sc.ks[i] else None
            if buf is not None:
                memcpy(&n_open, PyByteArray_AS_STRING(buf), sizeof(int32_t))
                if n_open:
                    memcpy(&sc.rows[i].tail, PyByteArray_AS_STRING(buf) + 4 * n_open, sizeof(int32_t))
        if b * (1 + n_o) >= NOGIL_ROWS:
            with nogil:
                _speculate_rows(sc.rows, b, sc.others, n_o, f, least, sc.drafts, sc.lengths)
        else:
            _speculate_rows(sc.rows, b, sc.others, n_o, f, least, sc.drafts, sc.lengths)
    finally:
        _give_back(sc.uniq, u, False)
    return [[sc.drafts[i * MAX_DEPTH + j] for j in range(sc.lengths[i])] for i in range(b)]
