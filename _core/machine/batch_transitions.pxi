# The batch's transitions (included by batch.pyx after ``BatchState``): each public
# method holds the writer guard and calls one of these, which converts and checks every
# argument, checks every slot's state in one C loop (raising before anything changes),
# then applies; and the real signatures of the public methods.

# bit masks of the states each transition applies to
cdef dict _FROM_MASK = {
    "admit": 1 << FREE,
    "advance_prefill": 1 << PREFILL,
    "advance_decode": 1 << DECODE,
    "enter_verify": 1 << DECODE,
    "enter_verify_tree": 1 << DECODE,
    "accept": 1 << VERIFY,
    "accept_rows": 1 << VERIFY,
    "resume": 1 << ACCEPT,
    "rollback": 1 << ROLLBACK,
    "finish": (1 << PREFILL) | (1 << DECODE) | (1 << VERIFY) | (1 << ACCEPT) | (1 << ROLLBACK) | (1 << DONE),
    "release": 1 << DONE,
}


cdef Py_ssize_t _first_illegal(const int8_t* st, const int64_t* s, Py_ssize_t b, int mask) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(b):
        if not (mask & (1 << st[s[j]])):
            return j
    return -1


cdef int _check_from(BatchState self, str attempted, s) except -1:
    cdef int64_t[::1] sv = s
    cdef Py_ssize_t b = sv.shape[0]
    cdef int mask = _FROM_MASK[attempted]
    cdef Py_ssize_t j
    if b == 0 or _first_illegal(&self._st[0], &sv[0], b, mask) < 0:
        return 0
    bad, codes = [], []
    for j in range(b):
        if not (mask & (1 << self._st[sv[j]])):
            bad.append(int(sv[j]))
            codes.append(int(self._st[sv[j]]))
    raise illegal(attempted, bad, codes)


cdef _admit(BatchState self, slots, positions, offsets, caches, max_tokens, eos, indexes):
    s = check_slots(slots, self._c)
    b = s.shape[0]
    pos, off = slot_ragged(positions, offsets, b, "positions")
    cc = per_slot(caches, b, "caches")
    budget = np.full(b, INT64_MAX, dtype=np.int64) if max_tokens is None else per_slot(max_tokens, b, "max_tokens")
    if b and budget.min() < 1:
        j = int(np.argmin(budget))
        raise ValueError(f"max_tokens must be at least 1, got {int(budget[j])} for slot {int(s[j])}")
    eos_ids = np.zeros(b, dtype=np.int64) if eos is None else per_slot(eos, b, "eos")
    index_list = slot_indexes(indexes, b)
    check_index_types(index_list, (_ni.NgramIndex, _si.SuffixIndex))
    cdef Py_ssize_t i0
    cdef dict held
    if any(ix is not None for ix in index_list):
        held = {}
        for i0 in range(self._c):
            if self._has_ix[i0] != IX_NONE and (self._st[i0] == C_PREFILL or self._st[i0] == C_DECODE
                                                or self._st[i0] == C_VERIFY):
                held[id(self._index[i0])] = i0
        check_index_owners(index_list, held)
    if b and (np.diff(off) == 0).any():
        j = int(np.flatnonzero(np.diff(off) == 0)[0])
        raise ValueError(f"the prompt for slot {int(s[j])} is empty: prefill needs at least one row")
    _check_from(self, "admit", s)
    cdef int64_t[::1] sv = s
    cdef int64_t[::1] ov = off
    cdef int64_t[::1] cv = cc
    cdef int64_t[::1] bv = budget
    cdef int64_t[::1] ev = eos_ids
    cdef int8_t he = eos is not None
    cdef Py_ssize_t j2, i
    for j2 in range(b):
        i = sv[j2]
        self._positions[i] = pos[ov[j2] : ov[j2 + 1]].copy()
        self._index[i] = index_list[j2]
        self._has_ix[i] = (IX_NONE if index_list[j2] is None else
                           IX_NGRAM if isinstance(index_list[j2], _ni.NgramIndex) else IX_SUFFIX)
        self._plen[i] = ov[j2 + 1] - ov[j2]
        self._budget[i] = bv[j2]
        self._eos[i] = ev[j2]
        self._has_eos[i] = he
        self._tree[i] = 0
        self._st[i] = C_PREFILL
        self._cache[i] = cv[j2]
        self._tok[i] = 0
        self._snap[i] = 0
        self._n[i] = 0
        self._dlen[i] = 0


cdef _advance(BatchState self, str attempted, slots, next_tokens, caches):
    s = check_slots(slots, self._c)
    t = per_slot(next_tokens, s.shape[0], "next_tokens")
    cc = per_slot(caches, s.shape[0], "caches")
    _check_from(self, attempted, s)
    cdef int64_t[::1] sv = s
    cdef int64_t[::1] tv = t
    cdef int64_t[::1] cv = cc
    cdef Py_ssize_t j, i
    for j in range(sv.shape[0]):
        i = sv[j]
        self._positions[i] = None
        self._st[i] = C_DECODE
        self._tok[i] = tv[j]
        self._cache[i] = cv[j]


cdef _enter_verify(BatchState self, slots, tokens, offsets):
    if _fast_enter_verify(self, slots, tokens, offsets):
        return
    s = check_slots(slots, self._c)
    t, off = slot_ragged(tokens, offsets, s.shape[0], "tokens")
    _check_from(self, "enter_verify", s)
    cdef int64_t[::1] sv = s
    cdef int64_t[::1] tv = t
    cdef int64_t[::1] ov = off
    cdef Py_ssize_t j, i, q, m
    for j in range(sv.shape[0]):
        m = ov[j + 1] - ov[j]
        if m == 0:
            raise ValueError(f"the draft for slot {sv[j]} is empty: a verify needs at least one row")
        if m > self._k_max:
            raise ValueError(
                f"the draft for slot {sv[j]} holds {m} tokens, more than k_max={self._k_max}")
    for j in range(sv.shape[0]):
        i = sv[j]
        m = ov[j + 1] - ov[j]
        for q in range(m):
            self._draft[i, q] = tv[ov[j] + q]
        self._dlen[i] = m
        self._st[i] = C_VERIFY
        self._snap[i] = self._cache[i]


cdef _settle(BatchState self, str attempted, slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets):
    s = check_slots(slots, self._c)
    b = s.shape[0]
    acc = None if accepted is None else per_slot(accepted, b, "accepted")
    rt, roff = slot_ragged(row_tokens, row_offsets, b, "row_tokens")
    rc, coff = slot_ragged(row_caches, cache_offsets, b, "row_caches")
    if acc is not None and b and acc.min() < 0:
        j = int(np.flatnonzero(acc < 0)[0])
        raise ValueError(f"accepted must be non-negative, got {int(acc[j])} for slot {int(s[j])}")
    nn = np.zeros(b, dtype=np.int64) if acc is None else acc
    idx = np.empty(b, dtype=np.int64)
    cdef int64_t[::1] sv = s
    cdef int64_t[::1] rtv = rt
    cdef int64_t[::1] rov = roff
    cdef int64_t[::1] rcv = rc
    cdef int64_t[::1] cov = coff
    cdef int64_t[::1] nv = nn
    cdef int64_t[::1] iv = idx
    cdef Py_ssize_t j2, i, nbad = 0
    cdef int64_t k, n, nrows, ncaches, m
    cdef bint compute = acc is None
    # pass 1: legality and settle per slot (nothing changed yet)
    for j2 in range(b):
        i = sv[j2]
        iv[j2] = -1
        if self._st[i] != C_VERIFY or self._tree[i]:
            nbad += 1
            continue
        k = self._dlen[i]
        nrows = rov[j2 + 1] - rov[j2]
        ncaches = cov[j2 + 1] - cov[j2]
        if compute:
            m = k if k < nrows else nrows
            n = _prefix(&self._draft[i, 0], &rtv[rov[j2]] if nrows else &self._draft[i, 0], m)
            nv[j2] = n
        else:
            n = nv[j2]
        if k == 0 or n > k or ncaches != k or (n < k and nrows <= n):
            nbad += 1
            continue
        iv[j2] = n - 1 if n == k else n
    if nbad:
        bad, codes, reasons = [], [], []
        for j2 in range(b):
            if iv[j2] < 0:
                i = sv[j2]
                bad.append(int(i))
                codes.append(int(self._st[i]))
                if self._st[i] == C_VERIFY and self._tree[i]:
                    reasons.append(_TREE_SETTLE)
                elif self._st[i] == C_VERIFY:
                    reasons.append(settle_reason(
                        int(self._dlen[i]), int(nv[j2]), int(rov[j2 + 1] - rov[j2]),
                        int(cov[j2 + 1] - cov[j2])) or "")
                else:
                    reasons.append("")
        raise illegal(attempted, bad, codes, reasons)
    # pass 2: apply
    for j2 in range(b):
        i = sv[j2]
        k = self._dlen[i]
        n = nv[j2]
        self._cache[i] = rcv[cov[j2] + iv[j2]]
        if n == k:
            self._st[i] = C_ACCEPT
            self._n[i] = n
            self._tok[i] = self._draft[i, k - 1]
        else:
            self._st[i] = C_ROLLBACK
            self._n[i] = 0
            self._tok[i] = rtv[rov[j2] + n]
        self._dlen[i] = 0
        self._snap[i] = 0


cdef _resume(BatchState self, slots):
    s = check_slots(slots, self._c)
    _check_from(self, "resume", s)
    cdef int64_t[::1] sv = s
    cdef Py_ssize_t j
    for j in range(sv.shape[0]):
        self._st[sv[j]] = C_DECODE
        self._n[sv[j]] = 0


cdef _rollback(BatchState self, slots):
    s = check_slots(slots, self._c)
    _check_from(self, "rollback", s)
    cdef int64_t[::1] sv = s
    cdef Py_ssize_t j
    for j in range(sv.shape[0]):
        self._st[sv[j]] = C_DECODE


cdef _finish(BatchState self, slots):
    s = check_slots(slots, self._c)
    _check_from(self, "finish", s)
    cdef int64_t[::1] sv = s
    cdef Py_ssize_t j, i
    for j in range(sv.shape[0]):
        i = sv[j]
        self._positions[i] = None
        self._st[i] = C_DONE
        self._tree[i] = 0
        self._tok[i] = 0
        self._snap[i] = 0
        self._n[i] = 0
        self._dlen[i] = 0


cdef _release(BatchState self, slots):
    s = check_slots(slots, self._c)
    _check_from(self, "release", s)
    cdef int64_t[::1] sv = s
    cdef Py_ssize_t j, i
    for j in range(sv.shape[0]):
        i = sv[j]
        self._index[i] = None
        self._has_ix[i] = 0
        self._st[i] = C_FREE
        self._cache[i] = 0
        self._budget[i] = 0


def _signature(text):
    """An ``inspect.Signature`` from a parameter list (the compiled methods whose
    required parameters default to ``REQUIRED`` show their real signature)."""
    import inspect
    ns = {}
    exec(f"def f({text}): pass", ns)
    return inspect.signature(ns["f"])


# the real signatures of the methods whose required parameters default to REQUIRED (so
# that a missing one is named in the TypeError): help() and inspect show these
_TRANSITION = "self, slots"
for _name, _text in (
    ("admit", "self, slots, positions, offsets, caches, *, max_tokens=None, eos=None, indexes=None"),
    ("advance_prefill", "self, slots, next_tokens, caches"),
    ("advance_decode", "self, slots, next_tokens, caches"),
    ("enter_verify", "self, slots, tokens, offsets"),
    ("enter_verify_tree", "self, slots, tokens, parents, offsets"),
    ("accept", "self, slots, row_tokens, row_offsets, row_caches, cache_offsets"),
    ("accept_rows", "self, slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets"),
    ("resume", _TRANSITION),
    ("rollback", _TRANSITION),
    ("finish", _TRANSITION),
    ("release", _TRANSITION),
    ("step", "self, row_tokens, *, probs=None, rule=None, draft_probs=None"),
):
    BatchState.__dict__[_name].__signature__ = _signature(_text)
del _name, _text, _TRANSITION
