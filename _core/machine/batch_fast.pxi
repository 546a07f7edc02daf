# The transitions' fast path for their usual calls (included by batch.pyx): arguments that
# are 1-D C-contiguous native int32/int64 arrays, or lists or tuples of plain ints, are
# copied into the batch's scratch (the writer guard makes the call its only user) by
# ``fast_len``/``fast_read`` (``_core/common/_arrays.pxd``) and checked there in C.
# Whatever a reader does not take, or any value a check would refuse, makes it decline
# with nothing changed; the call then takes the general path (specfsm._checks and
# specfsm.machine._checks), which raises the one message. So the fast path changes which
# code runs, never a result or an error.


cdef bint _fast_slots(BatchState self, const int64_t* s, Py_ssize_t b, int mask) noexcept:
    """Slots distinct, within the batch, each in a state of ``mask`` (the marks, all 0
    between calls, set and cleared here)."""
    cdef Py_ssize_t j, q
    cdef int64_t v
    cdef bint ok = True
    for j in range(b):
        v = s[j]
        if v < 0 or v >= self._c or self._mark[v] or not (mask & (1 << self._st[v])):
            ok = False
            break
        self._mark[v] = 1
    for q in range(j if not ok else b):
        self._mark[s[q]] = 0
    return ok


cdef int _fast_enter_verify(BatchState self, slots, tokens, offsets) except -1:
    """``enter_verify``'s usual call applied (1), or declined with nothing changed (0)."""
    cdef Py_ssize_t b = fast_len(slots), nt = fast_len(tokens), no = fast_len(offsets)
    if b <= 0 or b > self._c or nt < 0 or no != b + 1:
        return 0
    cdef int64_t* s = _grow(self, b + nt + no, 0)
    cdef int64_t* tk = s + b
    cdef int64_t* o = tk + nt
    if fast_read(slots, b, s) or fast_read(tokens, nt, tk) or fast_read(offsets, no, o):
        return 0
    # the offsets contract with a non-empty draft of at most k_max per slot
    cdef int64_t m = longest_row(o, no, nt, 1)
    if m < 0 or m > self._k_max:
        return 0
    cdef Py_ssize_t j, q, i
    if not _fast_slots(self, s, b, 1 << DECODE):
        return 0
    for j in range(b):
        i = s[j]
        m = o[j + 1] - o[j]
        for q in range(m):
            self._draft[i, q] = tk[o[j] + q]
        self._dlen[i] = m
        self._st[i] = C_VERIFY
        self._snap[i] = self._cache[i]
    return 1
