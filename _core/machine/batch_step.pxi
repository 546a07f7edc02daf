# The step's layout, drafts and result (included by batch.pyx after ``BatchState``):
# the rows ``pending`` and ``step`` lay out, the checks and copies of the drafts an index
# module's policy returns, the probability and callback rules' pass, the index-list
# helpers, ``StepResult`` and the array helpers.

cdef Py_ssize_t _layout(BatchState self, int64_t* act, int64_t* off, Py_ssize_t cap) noexcept nogil:
    """Active slots (ascending, at most ``cap``: ``act`` holds ``cap`` entries, ``off``
    ``cap + 1``) and their row offsets; returns their count."""
    cdef Py_ssize_t i, a = 0
    cdef int code
    cdef int64_t total = 0
    off[0] = 0
    for i in range(self._c):
        if a == cap:
            break
        code = self._st[i]
        if code == C_PREFILL:
            total += self._plen[i]
        elif code == C_DECODE:
            total += 1
        elif code == C_VERIFY:
            total += self._dlen[i] + (<int64_t>1 if self._tree[i] else <int64_t>self._bonus)
        else:
            continue
        act[a] = i
        a += 1
        off[a] = total
    return a


cdef Py_ssize_t _count_active(BatchState self) noexcept nogil:
    """How many slots are in Prefill, Decode or Verify."""
    cdef Py_ssize_t i, a = 0
    cdef int code
    for i in range(self._c):
        code = self._st[i]
        a += code == C_PREFILL or code == C_DECODE or code == C_VERIFY
    return a


cdef tuple _pending(BatchState self):
    # the layout straight into this call's arrays (readers may run side by side, so no
    # scratch of the batch): a count, then the layout
    cdef Py_ssize_t a, j, i, q, r0, m
    cdef bint big = self._c >= NOGIL_SLOTS
    if big:
        with nogil:
            a = _count_active(self)
    else:
        a = _count_active(self)
    act = _new(a)
    off = _new(a + 1)
    cdef int64_t* av = _ptr(act)
    cdef int64_t* ov = _ptr(off)
    if big:
        with nogil:
            _layout(self, av, ov, a)
    else:
        _layout(self, av, ov, a)
    inputs = _new(ov[a])
    cdef int64_t* inv = _ptr(inputs)
    cdef int64_t* pp
    for j in range(a):
        i = av[j]
        r0 = ov[j]
        if self._st[i] == C_PREFILL:
            pos = self._positions[i]      # an int64 array of plen[i] tokens the batch owns
            pp = _ptr(pos)
            for q in range(ov[j + 1] - r0):
                inv[r0 + q] = pp[q]
        else:
            inv[r0] = self._tok[i]
            if self._st[i] == C_VERIFY:
                m = ov[j + 1] - r0 - 1
                for q in range(m):
                    inv[r0 + 1 + q] = self._draft[i, q]
    return act, inputs, off


cdef int _check_drafts_out(BatchState self, Py_ssize_t count, const int64_t* lengths) except -1:
    """The draft lengths an index module's policy returned for ``count`` live slots (rows
    of ``k_max``), checked before anything is changed (``_apply_drafts`` then copies the
    drafts without checks)."""
    cdef Py_ssize_t q
    for q in range(count):
        if lengths[q] < 0 or lengths[q] > self._k_max:
            raise RuntimeError(
                f"the index module returned a draft of {lengths[q]} tokens for k_max={self._k_max}")
    return 0


cdef void _apply_drafts(BatchState self, const int64_t* av, const int64_t* pos_j, Py_ssize_t count,
                        const int64_t* square, const int64_t* lengths, int64_t* dov) noexcept nogil:
    """Enter Verify with the next drafts (rows of ``k_max`` in ``square``, checked by
    ``_check_drafts_out``) an index module's policy returned for the live slots at
    positions ``pos_j`` (their lengths into ``dov[j + 1]``)."""
    cdef int64_t m
    cdef Py_ssize_t q, jj, i, t
    for q in range(count):
        jj = pos_j[q]
        m = lengths[q]
        dov[jj + 1] = m
        if m:
            i = av[jj]
            for t in range(m):
                self._draft[i, t] = square[q * self._k_max + t]
            self._dlen[i] = m
            self._st[i] = C_VERIFY
            self._snap[i] = self._cache[i]


cdef object _rule_counts(BatchState self, int kind, rule, probs, draft_probs, act, off, rows,
                         Py_ssize_t total, acc):
    """Pass 1 of ``step`` for the rules that need Python: the probability rules' batch
    kernels (``kind`` R_SPEC, R_TYPICAL) and any other rule's ``accepted_rows``
    (R_OTHER) put each verifying slot's accepted count into ``acc``; returns the
    probability rules' replacement token per slot, else None. Changes nothing else."""
    cdef const int64_t* av = _ptr(act)
    cdef const int64_t* ov = _ptr(off)
    cdef int64_t* accv = _ptr(acc)
    cdef Py_ssize_t a = array_len(act), j, i
    cdef int64_t k
    repl = None
    if kind == R_SPEC or kind == R_TYPICAL:
        codes = self._state_a[act]
        vja = np.flatnonzero(codes == VERIFY)
        if vja.shape[0]:
            p = step_probs(probs, total)
            vsl = act[vja]
            ks = self._dlen_a[vsl].copy()
            doff = np.zeros(vja.shape[0] + 1, dtype=np.int64)
            np.cumsum(ks, out=doff[1:])
            dflat = np.concatenate([self._draft_a[x, :y] for x, y in zip(vsl.tolist(), ks.tolist())])
            ridx = np.concatenate([np.arange(x, x + y) for x, y in zip(off[vja].tolist(), ks.tolist())])
            # the draft rows are every row (all verifying, K rows each): no copy of them
            vrows = p if ridx.shape[0] == p.shape[0] else p[ridx]
            if kind == R_SPEC:
                out, an = rule.sample_batch(dflat, doff, vrows, draft_probs)
            else:
                out, an = rule.accept_batch(dflat, doff, vrows)
            an = np.asarray(an, dtype=np.int64)
            if an.shape[0] != ks.shape[0] or (an < 0).any() or (an > ks).any():
                raise RuntimeError("the acceptance kernel returned counts outside [0, K]")
            acc[vja] = an
            repl = np.zeros(a, dtype=np.int64)
            repl[vja] = np.asarray(out)[np.arange(vja.shape[0]), np.minimum(an, ks)]
    elif kind == R_OTHER:
        for j in range(a):
            i = av[j]
            if self._st[i] != C_VERIFY:
                continue
            k = self._dlen[i]
            d = self._draft_a[i, :k].tolist()
            r = rows[ov[j] : ov[j] + k].tolist()
            # compared as a Python int before it becomes a C integer: a rule's count past
            # int64 is refused as the twin refuses it (over the draft), not as an overflow
            got = check_count(rule.accepted_rows(d, r), "accepted")
            if got > k:
                raise illegal("accept_rows", [int(i)], [VERIFY], [settle_reason(k, got, k, k) or ""])
            accv[j] = got
    return repl


cdef int _check_distinct(list index_list) except -1:
    """ValueError when one index is listed for two live slots (the batch step's check,
    made before any index changes)."""
    cdef dict seen = {}
    cdef Py_ssize_t q
    for q in range(len(index_list)):
        if seen.setdefault(id(index_list[q]), q) != q:
            raise ValueError(
                f"indexes[{q}] appears twice in the batch; a batch call takes each index once"
            )
    return 0


cdef list _pick(list index, const int64_t* av, const int64_t* lvv, Py_ssize_t nlive):
    """``[index[av[lvv[q]]] for q in range(nlive)]`` without the per-item append."""
    cdef list out = PyList_New(nlive)
    cdef Py_ssize_t q
    cdef object ix
    for q in range(nlive):
        ix = index[av[lvv[q]]]
        Py_INCREF(ix)
        PyList_SET_ITEM(out, q, ix)
    return out


cdef void _gather(const int64_t* lvv, Py_ssize_t nlive, const int64_t* eov, const int64_t* emv,
                  int64_t* loff, int64_t* toks) noexcept:
    cdef Py_ssize_t q, jj, x, w = 0
    loff[0] = 0
    for q in range(nlive):
        jj = lvv[q]
        for x in range(eov[jj], eov[jj + 1]):
            toks[w] = emv[x]
            w += 1
        loff[q + 1] = w


cdef class StepResult:
    """What ``BatchState.step`` did, as arrays aligned with ``slots`` (the slots the step
    evaluated: every slot that was in Prefill, Decode or Verify, ascending).

    ``emitted[emitted_offsets[j]:emitted_offsets[j + 1]]`` are the tokens slot
    ``slots[j]`` emitted; ``accepted`` and ``drafted`` its verify counts (0 for a prefill
    or a decode); ``resume_rows[j]`` the row of this step's evaluation, counted within
    that slot's own rows of ``pending()``'s layout, whose cache the slot resumes from (a
    prefill: its last prompt row, ``len(prompt) - 1``; a decode: 0; a verify: the settle
    row, ``K - 1 + bonus`` when all K draft tokens were accepted, else the accepted
    count), so ``offsets[j] + resume_rows[j]`` (``offsets`` from ``pending()``) is the
    flat row; a slot that finished carries its row too, though it does not resume.
    ``resume_rows`` is in ``slots`` order: for ``specfsm.gpu.place_rows`` over per-slot
    states in capacity order, use ``resume_index(capacity)``. ``drafts`` (with
    ``draft_offsets``) holds each slot's next draft (empty: it decodes next step);
    ``finished`` the slots that reached Done. Every array is fresh memory of that step
    (or a shared read-only empty array): a later step never writes into it.

    ``rolled_back`` (bool, in ``slots`` order) is True where that slot's verify settled
    through Rollback: the rule accepted fewer than its K draft tokens (with ``MinRun``
    also a matching prefix shorter than the minimum, which the rule rejects whole), so
    it emitted the target's (or the rule's sampled) token at row ``accepted[j]`` and
    resumes from that row. False for a prefill, a decode and a fully accepted draft
    (with ``bonus`` too, where it emits K + 1 tokens). A ``max_tokens`` or ``eos`` cut
    changes what the slot emits, not how it settled: a rolled-back slot keeps True when
    the cut dropped the target's token or finished it. A verify settles through Accept
    exactly when all its K >= 1 draft tokens are accepted, so ``rolled_back`` equals
    ``accepted < drafted`` entry by entry for chain slots. A tree slot
    (``enter_verify_tree``) reports ``accepted`` = its accepted path's length, ``drafted``
    = its N nodes, its settle row (the last accepted node's, 0 when none) in
    ``resume_rows`` and ``rolled_back`` True when the path stopped before a leaf.
    """

    cdef readonly object slots, emitted, emitted_offsets, accepted, drafted, resume_rows
    cdef readonly object finished, drafts, draft_offsets, rolled_back

    def __init__(self, slots, emitted, emitted_offsets, accepted, drafted, resume_rows,
                 finished, drafts, draft_offsets, rolled_back):
        self.slots = slots
        self.emitted = emitted
        self.emitted_offsets = emitted_offsets
        self.accepted = accepted
        self.drafted = drafted
        self.resume_rows = resume_rows
        self.finished = finished
        self.drafts = drafts
        self.draft_offsets = draft_offsets
        self.rolled_back = rolled_back

    def emitted_by_slot(self):
        _result_self(self)
        e, o = self.emitted.tolist(), self.emitted_offsets.tolist()
        return {int(s): e[o[j] : o[j + 1]] for j, s in enumerate(self.slots.tolist())}

    def resume_index(self, capacity):
        _result_self(self)
        return resume_index(self.slots, self.resume_rows, capacity)

    def __repr__(self):
        return (f"StepResult(slots={len(self.slots)}, emitted={len(self.emitted)}, "
                f"finished={len(self.finished)}, drafts={len(self.drafts)})")


cdef inline object _new(Py_ssize_t n):
    """A fresh 1-D int64 array of n entries (numpy C API: no Python-level call)."""
    cdef cnp.npy_intp dims = n
    return cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)


cdef inline object _copy(object a):
    """A fresh copy of one of the batch's 1-D arrays (what its views return)."""
    return cnp.PyArray_NewCopy(<cnp.ndarray>a, cnp.NPY_CORDER)


cdef inline int64_t* _ptr(object a) noexcept:
    return <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>a)


_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False
