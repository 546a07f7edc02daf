# cython: language_level=3
"""B request slots as arrays: the batched serving state machine (compiled).

Same names and behaviour as the twin ``specfsm._py.batch``; both take their argument
checks from ``specfsm._validate`` (every argument is converted into a fresh array the call owns, then
validated). Transitions check every slot's state in one C loop, raise before changing
anything, then apply in a second loop. ``step`` runs the legality-free part of a serving
step (acceptance for the greedy rules, settle, the transitions, emission with budgets
and eos, the placement rows, entering Verify with the next drafts) without the GIL; an
object flag (``busy``) set before the GIL is released refuses any other call on the
batch meanwhile (RuntimeError).
"""

import numpy as np

from specfsm._validate import (
    ACCEPT,
    DECODE,
    DONE,
    FREE,
    PREFILL,
    R_EXACT,
    R_MINRUN,
    R_OTHER,
    R_SPEC,
    R_TYPICAL,
    ROLLBACK,
    STATE_NAMES,
    VERIFY,
    _capacity,
    _check_index_types,
    _ids,
    _illegal,
    _indexes,
    _per_slot,
    _probs_rows,
    _ragged,
    _rule_kind,
    _slots,
    INT64_MAX,
    check_count,
    settle_reason,
)
from specfsm._values import state_types as _state_types
# the index modules of the same implementation (a build without them has no compiled batch)
from specfsm._core import ngram_index as _ni
from specfsm._core import suffix_index as _si

cimport numpy as cnp
from libc.stdint cimport int8_t, int64_t
from libc.string cimport memset
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid

cdef const char* UPDATE_CAPSULE_NAME = b"specfsm._core.ngram_index._update_and_propose"
cdef const char* SUFFIX_CAPSULE_NAME = b"specfsm._core.suffix_index._update_and_propose"

from _arrays cimport plain_int_width, array_data, array_len

cnp.import_array()

# The compiled index module's C entry for the step's index update (extend and propose in
# one pass on the step's own buffers), or NULL where the index module is the twin.
ctypedef int (*update_fn)(list, Py_ssize_t, const int64_t*, const int64_t*, const int64_t*,
                          Py_ssize_t, int64_t*, int64_t*) except -1
cdef update_fn _UPDATE = NULL
_update_capsule = getattr(_ni, "_UPDATE_CAPSULE", None)
if _update_capsule is not None and PyCapsule_IsValid(_update_capsule, UPDATE_CAPSULE_NAME):
    _UPDATE = <update_fn>PyCapsule_GetPointer(_update_capsule, UPDATE_CAPSULE_NAME)
# The same for the SuffixIndex slots: extend, record each verified draft, propose (the
# suffix index module's C entry; NULL where that module is the twin).
ctypedef int (*suffix_update_fn)(list, Py_ssize_t, const int64_t*, const int64_t*,
                                 const int64_t*, const int64_t*, const int64_t*, Py_ssize_t,
                                 int64_t*, int64_t*) except -1
cdef suffix_update_fn _SUFFIX_UPDATE = NULL
_update_capsule = getattr(_si, "_UPDATE_CAPSULE", None)
if _update_capsule is not None and PyCapsule_IsValid(_update_capsule, SUFFIX_CAPSULE_NAME):
    _SUFFIX_UPDATE = <suffix_update_fn>PyCapsule_GetPointer(_update_capsule, SUFFIX_CAPSULE_NAME)
del _update_capsule
#: whether the step updates its SuffixIndex slots through the suffix module's C entry
_SUFFIX_IN_C = _SUFFIX_UPDATE != NULL

__all__ = [
    "BatchState",
    "FREE",
    "PREFILL",
    "DECODE",
    "VERIFY",
    "ACCEPT",
    "ROLLBACK",
    "DONE",
    "STATE_NAMES",
    "StepResult",
]

# bit masks of the states each transition applies to
cdef dict _FROM_MASK = {
    "admit": 1 << FREE,
    "advance_prefill": 1 << PREFILL,
    "advance_decode": 1 << DECODE,
    "enter_verify": 1 << DECODE,
    "accept": 1 << VERIFY,
    "accept_rows": 1 << VERIFY,
    "resume": 1 << ACCEPT,
    "rollback": 1 << ROLLBACK,
    "finish": (1 << PREFILL) | (1 << DECODE) | (1 << VERIFY) | (1 << ACCEPT) | (1 << ROLLBACK) | (1 << DONE),
    "release": 1 << DONE,
}

cdef enum:             # what drafts for a slot (_has_ix)
    IX_NONE = 0
    IX_NGRAM = 1
    IX_SUFFIX = 2

cdef enum:
    C_FREE = 0
    C_PREFILL = 1
    C_DECODE = 2
    C_VERIFY = 3
    C_ACCEPT = 4
    C_ROLLBACK = 5
    C_DONE = 6


cdef Py_ssize_t _first_illegal(const int8_t* st, const int64_t* s, Py_ssize_t b, int mask) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(b):
        if not (mask & (1 << st[s[j]])):
            return j
    return -1


cdef inline int64_t _prefix(const int64_t* d, const int64_t* r, int64_t m) noexcept nogil:
    cdef int64_t n = 0
    while n < m and d[n] == r[n]:
        n += 1
    return n


cdef class BatchState:
    """``capacity`` request slots, each at most ``k_max`` draft tokens, all starting FREE.

    See ``specfsm._py.batch.BatchState`` (the twin) for the transitions; the compiled
    class has the same methods and behaviour.
    """

    cdef Py_ssize_t _c, _k_max
    cdef bint _bonus, _busy
    cdef object _state_a, _token_a, _cache_a, _snap_a, _n_a, _dlen_a, _draft_a
    cdef object _budget_a, _eos_a, _has_eos_a, _plen_a, _has_ix_a
    cdef int8_t[::1] _st
    cdef int64_t[::1] _tok, _cache, _snap, _n, _dlen, _budget, _eos, _plen
    cdef int64_t[:, ::1] _draft
    cdef int8_t[::1] _has_eos, _has_ix
    cdef list _positions, _index
    cdef object _scratch_a
    cdef int64_t[::1] _scratch

    def __init__(self, capacity, k_max=8, *, bonus=False):
        c, k = _capacity(capacity, k_max)
        self._c = c
        self._k_max = k
        self._bonus = bool(bonus)
        self._busy = False
        self._state_a = np.zeros(c, dtype=np.int8)
        self._token_a = np.zeros(c, dtype=np.int64)
        self._cache_a = np.zeros(c, dtype=np.int64)
        self._snap_a = np.zeros(c, dtype=np.int64)
        self._n_a = np.zeros(c, dtype=np.int64)
        self._dlen_a = np.zeros(c, dtype=np.int64)
        self._draft_a = np.zeros((c, k), dtype=np.int64)
        self._budget_a = np.zeros(c, dtype=np.int64)
        self._eos_a = np.zeros(c, dtype=np.int64)
        self._has_eos_a = np.zeros(c, dtype=np.int8)
        self._plen_a = np.zeros(c, dtype=np.int64)
        self._has_ix_a = np.zeros(c, dtype=np.int8)
        self._st = self._state_a
        self._tok = self._token_a
        self._cache = self._cache_a
        self._snap = self._snap_a
        self._n = self._n_a
        self._dlen = self._dlen_a
        self._draft = self._draft_a
        self._budget = self._budget_a
        self._eos = self._eos_a
        self._has_eos = self._has_eos_a
        self._plen = self._plen_a
        self._has_ix = self._has_ix_a
        self._positions = [None] * c
        self._index = [None] * c
        self._scratch_a = np.empty(2 * c + 1, dtype=np.int64)
        self._scratch = self._scratch_a

    cdef int _enter(self) except -1:
        if self._busy:
            raise RuntimeError("this BatchState is in use by another thread (a step is running)")
        return 0

    # -- views -----------------------------------------------------------------------
    @property
    def capacity(self):
        return self._c

    @property
    def k_max(self):
        return self._k_max

    @property
    def bonus(self):
        """Whether ``step`` verifies a K-token draft with K + 1 rows (see ``step``)."""
        return self._bonus

    @property
    def busy(self):
        return self._busy

    cdef object _ro(self, a):
        v = a.view()
        v.flags.writeable = False
        return v

    @property
    def states(self):
        return self._ro(self._state_a)

    @property
    def tokens(self):
        return self._ro(self._token_a)

    @property
    def caches(self):
        return self._ro(self._cache_a)

    @property
    def accepted(self):
        return self._ro(self._n_a)

    @property
    def draft_lens(self):
        return self._ro(self._dlen_a)

    @property
    def remaining(self):
        return self._ro(self._budget_a)

    def slots_in(self, state):
        """The slots (ascending, int64) whose state code is ``state``."""
        code = check_count(state, "state")
        if code > DONE:
            raise ValueError(f"state must be a state code 0..{DONE}, got {code}")
        return np.flatnonzero(self._state_a == code).astype(np.int64)

    cdef Py_ssize_t _one(self, slot) except -1:
        i = check_count(slot, "slot")
        if i >= self._c:
            raise IndexError(f"slot {i} is outside the batch's {self._c} slots")
        return i

    def draft(self, slot):
        """The draft of a slot in Verify (empty elsewhere)."""
        cdef Py_ssize_t i = self._one(slot)
        return self._draft_a[i, : self._dlen[i]].tolist()

    def state_of(self, slot):
        """Slot ``slot`` as a ``specfsm.state`` value (tokens and caches as ints), or None
        when it is FREE."""
        st = _state_types()

        cdef Py_ssize_t i = self._one(slot)
        cdef int code = self._st[i]
        tok, cache = int(self._tok[i]), int(self._cache[i])
        if code == C_FREE:
            return None
        if code == C_PREFILL:
            return st["Prefill"](list(self._positions[i]), cache)
        if code == C_DECODE:
            return st["Decode"](tok, cache)
        if code == C_VERIFY:
            return st["Verify"](self.draft(i), int(self._snap[i]), cache)
        if code == C_ACCEPT:
            return st["Accept"](int(self._n[i]), tok, cache)
        if code == C_ROLLBACK:
            return st["Rollback"](cache, tok)
        return st["Done"](cache)

    def __len__(self):
        return self._c

    def __repr__(self):
        counts = np.bincount(self._state_a, minlength=7)
        shown = ", ".join(f"{n}={int(c)}" for n, c in zip(STATE_NAMES, counts) if c)
        return f"BatchState(capacity={self._c}, k_max={self._k_max}, {shown})"

    # -- transitions -------------------------------------------------------------------
    cdef int _check_from(self, str attempted, s) except -1:
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
        raise _illegal(attempted, bad, codes)

    def admit(self, slots, positions, offsets, caches, *, max_tokens=None, eos=None, indexes=None):
        """FREE -> Prefill (``ServingState.start``); see the twin for the arguments."""
        self._enter()
        s = _slots(slots, self._c)
        b = s.shape[0]
        pos, off = _ragged(positions, offsets, b, "positions")
        cc = _per_slot(caches, b, "caches")
        budget = np.full(b, INT64_MAX, dtype=np.int64) if max_tokens is None else _per_slot(max_tokens, b, "max_tokens")
        if b and budget.min() < 1:
            j = int(np.argmin(budget))
            raise ValueError(f"max_tokens must be at least 1, got {int(budget[j])} for slot {int(s[j])}")
        eos_ids = np.zeros(b, dtype=np.int64) if eos is None else _per_slot(eos, b, "eos")
        index_list = _indexes(indexes, b)
        _check_index_types(index_list, (_ni.NgramIndex, _si.SuffixIndex))
        if b and (np.diff(off) == 0).any():
            j = int(np.flatnonzero(np.diff(off) == 0)[0])
            raise ValueError(f"the prompt for slot {int(s[j])} is empty: prefill needs at least one row")
        self._check_from("admit", s)
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
            self._st[i] = C_PREFILL
            self._cache[i] = cv[j2]
            self._tok[i] = 0
            self._snap[i] = 0
            self._n[i] = 0
            self._dlen[i] = 0

    cdef _advance(self, str attempted, slots, next_tokens, caches):
        self._enter()
        s = _slots(slots, self._c)
        t = _per_slot(next_tokens, s.shape[0], "next_tokens")
        cc = _per_slot(caches, s.shape[0], "caches")
        self._check_from(attempted, s)
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

    def advance_prefill(self, slots, next_tokens, caches):
        """Prefill -> Decode: the prompt's evaluation chose ``next_tokens[j]``."""
        self._advance("advance_prefill", slots, next_tokens, caches)

    def advance_decode(self, slots, next_tokens, caches):
        """Decode -> Decode: one single-row evaluation per slot."""
        self._advance("advance_decode", slots, next_tokens, caches)

    def enter_verify(self, slots, tokens, offsets):
        """Decode -> Verify with ragged drafts; the cache handle becomes the snapshot.
        Refuses (ValueError) an empty draft and one longer than ``k_max``."""
        self._enter()
        s = _slots(slots, self._c)
        t, off = _ragged(tokens, offsets, s.shape[0], "tokens")
        self._check_from("enter_verify", s)
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

    def accept(self, slots, row_tokens, row_offsets, row_caches, cache_offsets):
        """Verify -> Accept | Rollback as ``Verify.accept`` per slot."""
        self._settle("accept", slots, None, row_tokens, row_offsets, row_caches, cache_offsets)

    def accept_rows(self, slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets):
        """``accept`` with the accepted count per slot supplied (``Verify.accept_rows``)."""
        self._settle("accept_rows", slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets)

    cdef _settle(self, str attempted, slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets):
        self._enter()
        s = _slots(slots, self._c)
        b = s.shape[0]
        acc = None if accepted is None else _per_slot(accepted, b, "accepted")
        rt, roff = _ragged(row_tokens, row_offsets, b, "row_tokens")
        rc, coff = _ragged(row_caches, cache_offsets, b, "row_caches")
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
            if self._st[i] != C_VERIFY:
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
                    if self._st[i] == C_VERIFY:
                        reasons.append(settle_reason(
                            int(self._dlen[i]), int(nv[j2]), int(rov[j2 + 1] - rov[j2]),
                            int(cov[j2 + 1] - cov[j2])) or "")
                    else:
                        reasons.append("")
            raise _illegal(attempted, bad, codes, reasons)
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

    def resume(self, slots):
        """Accept -> Decode."""
        self._enter()
        s = _slots(slots, self._c)
        self._check_from("resume", s)
        cdef int64_t[::1] sv = s
        cdef Py_ssize_t j
        for j in range(sv.shape[0]):
            self._st[sv[j]] = C_DECODE
            self._n[sv[j]] = 0

    def rollback(self, slots):
        """Rollback -> Decode."""
        self._enter()
        s = _slots(slots, self._c)
        self._check_from("rollback", s)
        cdef int64_t[::1] sv = s
        cdef Py_ssize_t j
        for j in range(sv.shape[0]):
            self._st[sv[j]] = C_DECODE

    def finish(self, slots):
        """Any state but FREE -> Done (Rollback keeps its snapshot as the cache)."""
        self._enter()
        s = _slots(slots, self._c)
        self._check_from("finish", s)
        cdef int64_t[::1] sv = s
        cdef Py_ssize_t j, i
        for j in range(sv.shape[0]):
            i = sv[j]
            self._positions[i] = None
            self._st[i] = C_DONE
            self._tok[i] = 0
            self._snap[i] = 0
            self._n[i] = 0
            self._dlen[i] = 0

    def release(self, slots):
        """Done -> FREE: the slot can be admitted again."""
        self._enter()
        s = _slots(slots, self._c)
        self._check_from("release", s)
        cdef int64_t[::1] sv = s
        cdef Py_ssize_t j, i
        for j in range(sv.shape[0]):
            i = sv[j]
            self._index[i] = None
            self._has_ix[i] = 0
            self._st[i] = C_FREE
            self._cache[i] = 0
            self._budget[i] = 0

    # -- the fused step ------------------------------------------------------------------
    cdef Py_ssize_t _layout(self, int64_t* act, int64_t* off) noexcept nogil:
        """Active slots (ascending) and their row offsets; returns their count."""
        cdef Py_ssize_t i, a = 0
        cdef int code
        cdef int64_t total = 0
        off[0] = 0
        for i in range(self._c):
            code = self._st[i]
            if code == C_PREFILL:
                total += self._plen[i]
            elif code == C_DECODE:
                total += 1
            elif code == C_VERIFY:
                total += self._dlen[i] + self._bonus
            else:
                continue
            act[a] = i
            a += 1
            off[a] = total
        return a

    cdef tuple _layout_arrays(self):
        act = np.empty(self._c, dtype=np.int64)
        off = np.empty(self._c + 1, dtype=np.int64)
        cdef int64_t[::1] av = act
        cdef int64_t[::1] ov = off
        cdef Py_ssize_t a
        with nogil:
            a = self._layout(&av[0], &ov[0])
        return act[:a], off[: a + 1]

    def pending(self):
        """``(slots, inputs, offsets)``: the evaluation ``step`` expects rows for (see the
        twin)."""
        self._enter()
        cdef Py_ssize_t a, j, i, q, r0, m
        cdef int64_t* sc = &self._scratch[0]
        with nogil:
            a = self._layout(sc, sc + self._c)
        act = _new(a)
        off = _new(a + 1)
        cdef int64_t* av = _ptr(act)
        cdef int64_t* ov = _ptr(off)
        for j in range(a):
            av[j] = sc[j]
            ov[j] = sc[self._c + j]
        ov[a] = sc[self._c + a]
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

    cdef int _apply_drafts(self, const int64_t* av, const int64_t* pos_j, Py_ssize_t count,
                           object flat, object offsets, object lengths, int64_t* dov) except -1:
        """Enter Verify with the next drafts an index module returned for the live slots
        at positions ``pos_j`` (their lengths into ``dov[j + 1]``), each checked before
        use."""
        cdef const int64_t* dfv = _ptr(flat)
        cdef const int64_t* dlv = _ptr(lengths)
        cdef const int64_t* pov = _ptr(offsets)
        cdef int64_t n = array_len(flat), m
        cdef Py_ssize_t q, jj, i, t
        if array_len(lengths) != count or array_len(offsets) < count:
            raise RuntimeError(f"the index module returned {array_len(lengths)} drafts for {count} slots")
        for q in range(count):   # drafts from the index module, checked before use
            if dlv[q] < 0 or dlv[q] > self._k_max or pov[q] < 0 or pov[q] > n - dlv[q]:
                raise RuntimeError(
                    f"the index module returned a draft of {dlv[q]} tokens at {pov[q]} "
                    f"for k_max={self._k_max} and {n} draft tokens")
        with nogil:
            for q in range(count):
                jj = pos_j[q]
                m = dlv[q]
                dov[jj + 1] = m
                if m:
                    i = av[jj]
                    for t in range(m):
                        self._draft[i, t] = dfv[pov[q] + t]
                    self._dlen[i] = m
                    self._st[i] = C_VERIFY
                    self._snap[i] = self._cache[i]
        return 0

    cdef tuple _update_indexes(self, const int64_t* av, const int64_t* lvv, Py_ssize_t nlive,
                               object emitted, object eoff, Py_ssize_t w, Py_ssize_t a):
        """Extend the live slots' indexes with what they emitted and propose their next
        drafts through the index module's C entry; returns ``(drafts, offsets,
        lengths)`` as ``propose_batch`` does. Every buffer is fresh memory of this call."""
        cdef list index_list = _pick(self._index, av, lvv, nlive)
        cdef const int64_t* emv = _ptr(emitted)
        cdef const int64_t* eov = _ptr(eoff)
        cdef int64_t* srcv
        cdef int64_t* offv
        cdef Py_ssize_t q, t, kmax = self._k_max
        cdef int64_t lim
        if nlive == a:
            src, off = emitted, eoff
        else:
            off = _new(nlive + 1)
            src = _new(w)
            _gather(lvv, nlive, eov, emv, _ptr(off), _ptr(src))
        limits = _new(nlive)
        cdef int64_t* limv = _ptr(limits)
        for q in range(nlive):
            lim = self._budget[av[lvv[q]]]
            limv[q] = lim if lim < kmax else kmax
        square = _new(nlive * kmax if kmax else 1)
        lengths = _new(nlive)
        cdef int64_t* sqv = _ptr(square)
        cdef int64_t* lnv = _ptr(lengths)
        _UPDATE(index_list, nlive, _ptr(src), _ptr(off), limv, kmax, sqv, lnv)
        doffs = _new(nlive + 1)
        cdef int64_t* dov = _ptr(doffs)
        dov[0] = 0
        for q in range(nlive):
            dov[q + 1] = dov[q] + lnv[q]
        flat = _new(dov[nlive])
        cdef int64_t* fv = _ptr(flat)
        for q in range(nlive):
            for t in range(lnv[q]):
                fv[dov[q] + t] = sqv[q * kmax + t]
        return flat, doffs, lengths

    def step(self, row_tokens, *, probs=None, rule=None, draft_probs=None):
        """One serving step for every slot in Prefill, Decode or Verify (see the twin's
        docstring: same arguments, same result). The batch is marked busy for the whole
        call: another thread's call on it meanwhile raises RuntimeError."""
        self._enter()
        self._busy = True
        try:
            return self._step(row_tokens, probs, rule, draft_probs)
        finally:
            self._busy = False

    cdef object _step(self, row_tokens, probs, rule, draft_probs):
        cdef int kind = R_EXACT
        cdef int64_t m = 0
        if rule is not None:
            kind, m = _rule_kind(rule)
        cdef Py_ssize_t a
        cdef int64_t* sc = &self._scratch[0]
        with nogil:
            a = self._layout(sc, sc + self._c)
        act = _new(a)
        off = _new(a + 1)
        cdef int64_t* av = _ptr(act)
        cdef int64_t* ov = _ptr(off)
        cdef Py_ssize_t j, i, q, nv_
        for j in range(a):
            av[j] = sc[j]
            ov[j] = sc[self._c + j]
        ov[a] = sc[self._c + a]
        cdef int64_t total = ov[a]
        if plain_int_width(row_tokens) == 8:
            rows = row_tokens          # read in place: every index is checked below
        else:
            rows = _ids(row_tokens, "row_tokens")
        if array_len(rows) != total:
            raise ValueError(f"row_tokens holds {array_len(rows)} rows; this step evaluates {total}")
        cdef const int64_t* rp = <const int64_t*>array_data(rows)
        acc = _new(a)
        cdef int64_t* accv = _ptr(acc)
        memset(accv, 0, a * sizeof(int64_t))
        cdef int64_t k, n
        repl = None
        cdef int64_t* replv = NULL
        cdef bint sampled = False
        # pass 1 for the rules that need Python (probability kernels, other rules)
        if kind == R_SPEC or kind == R_TYPICAL:
            codes = self._state_a[act]
            vja = np.flatnonzero(codes == VERIFY)
            if vja.shape[0]:
                p = _probs_rows(probs, total)
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
                replv = _ptr(repl)
                sampled = True
        elif kind == R_OTHER:
            for j in range(a):
                i = av[j]
                if self._st[i] != C_VERIFY:
                    continue
                k = self._dlen[i]
                d = self._draft_a[i, :k].tolist()
                r = rows[ov[j] : ov[j] + k].tolist()
                n = check_count(rule.accepted_rows(d, r), "accepted")
                if n > k:
                    raise _illegal("accept_rows", [int(i)], [VERIFY], [settle_reason(k, n, k, k) or ""])
                accv[j] = n
        cdef bint computed = kind == R_EXACT or kind == R_MINRUN
        cdef bint minrun = kind == R_MINRUN
        # outputs
        emitted = _new(total + a)
        eoff = _new(a + 1)
        drafted = _new(a)
        resume = _new(a)
        fin = _new(a)
        cdef int64_t* emv = _ptr(emitted)
        cdef int64_t* eov = _ptr(eoff)
        cdef int64_t* drv = _ptr(drafted)
        cdef int64_t* rsv = _ptr(resume)
        cdef int64_t* finv = _ptr(fin)
        eov[0] = 0
        memset(drv, 0, a * sizeof(int64_t))
        cdef int64_t* lvv = sc    # positions j of live slots with an index (scratch)
        cdef int64_t* svv = sc + self._c   # positions j of live SuffixIndex slots (scratch)
        cdef Py_ssize_t nsuf = 0
        cdef Py_ssize_t nfin = 0, nlive = 0, w = 0, cnt, room, e0, npre = 0
        cdef int code
        cdef int64_t r0, r1, t, bonus = self._bonus
        cdef bint stop
        if True:
            with nogil:
                for j in range(a):
                    i = av[j]
                    code = self._st[i]
                    r0 = ov[j]
                    r1 = ov[j + 1]
                    e0 = w
                    npre += code == C_PREFILL
                    rsv[j] = -1
                    if code == C_VERIFY:
                        k = self._dlen[i]
                        if computed:
                            n = _prefix(&self._draft[i, 0], rp + r0, k)
                            if minrun and n < m:
                                n = 0
                            accv[j] = n
                        else:
                            n = accv[j]
                        for q in range(n):
                            emv[w] = self._draft[i, q]
                            w += 1
                        if n == k:
                            if bonus:
                                emv[w] = rp[r0 + k]
                                w += 1
                            rsv[j] = k - 1 + bonus
                        else:
                            emv[w] = replv[j] if sampled else rp[r0 + n]
                            w += 1
                            rsv[j] = n
                        drv[j] = k
                        self._dlen[i] = 0
                        self._snap[i] = 0
                    else:
                        emv[w] = rp[r1 - 1]
                        w += 1
                    cnt = w - e0
                    room = self._budget[i]
                    stop = cnt >= room
                    if stop:
                        cnt = room
                    if self._has_eos[i]:
                        for q in range(cnt):
                            if emv[e0 + q] == self._eos[i]:
                                cnt = q + 1
                                stop = True
                                break
                    w = e0 + cnt
                    eov[j + 1] = w
                    self._budget[i] = room - cnt
                    if stop:
                        self._st[i] = C_DONE
                        self._tok[i] = 0
                        finv[nfin] = i
                        nfin += 1
                    else:
                        self._st[i] = C_DECODE
                        self._tok[i] = emv[w - 1]
                        if self._has_ix[i] == IX_NGRAM:
                            lvv[nlive] = j
                            nlive += 1
                        elif self._has_ix[i] == IX_SUFFIX:
                            svv[nsuf] = j
                            nsuf += 1
        if npre:     # the prompts of the slots that left Prefill are dropped
            for j in range(a):
                if self._positions[av[j]] is not None:
                    self._positions[av[j]] = None
        # index update and next drafts (each batched call releases the GIL for its loop)
        dr_off = _new(a + 1)
        drafts = _EMPTY
        cdef int64_t* dov = _ptr(dr_off)
        memset(dov, 0, (a + 1) * sizeof(int64_t))
        cdef int64_t* dfv
        cdef int64_t* dlv
        cdef int64_t* pov
        cdef Py_ssize_t jj, lo, hi
        cdef int64_t lim
        cdef list index_list, pieces
        if nlive and _UPDATE != NULL:
            # the compiled index module's C entry: extend and propose in one pass without
            # the GIL, on this step's own buffers (no argument conversion)
            dflat, doff2, dlens = self._update_indexes(av, lvv, nlive, emitted, eoff, w, a)
        elif nlive:
            index_list = _pick(self._index, av, lvv, nlive)
            if nlive == a:
                _ni.extend_batch(index_list, emitted[:w], eoff)
            else:
                loff = _new(nlive + 1)
                toks = _new(w)
                _gather(lvv, nlive, eov, emv, _ptr(loff), _ptr(toks))
                _ni.extend_batch(index_list, toks[: _ptr(loff)[nlive]], loff)
            # one count when every slot may draft k_max tokens (the usual case: no array
            # for propose_batch to copy and check), else one count per slot
            for q in range(nlive):
                if self._budget[av[lvv[q]]] < self._k_max:
                    break
            else:
                q = nlive
            if q == nlive:
                limits = self._k_max
            else:
                limits = _new(nlive)
                for q in range(nlive):
                    lim = self._budget[av[lvv[q]]]
                    _ptr(limits)[q] = lim if lim < self._k_max else self._k_max
            dflat, doff2, dlens = _ni.propose_batch(index_list, limits)
            dflat = np.ascontiguousarray(dflat, dtype=np.int64)
            doff2 = np.ascontiguousarray(doff2, dtype=np.int64)
            dlens = np.ascontiguousarray(dlens, dtype=np.int64)
        if nsuf:
            # SuffixIndex slots: their module's batch calls, with the GIL (see _suffix_update)
            index_list = _pick(self._index, av, svv, nsuf)
            soff = _new(nsuf + 1)
            stoks = _new(w)
            _gather(svv, nsuf, eov, emv, _ptr(soff), _ptr(stoks))
            slim = _new(nsuf)
            sdr = _new(nsuf)
            sacc = _new(nsuf)
            for q in range(nsuf):
                jj = svv[q]
                lim = self._budget[av[jj]]
                _ptr(slim)[q] = lim if lim < self._k_max else self._k_max
                _ptr(sdr)[q] = drv[jj]
                # what the drafter session records: the draft's agreement with what the
                # slot emitted (the accepted count, and the replacement when it agrees)
                m = drv[jj]
                if m > eov[jj + 1] - eov[jj]:
                    m = eov[jj + 1] - eov[jj]
                _ptr(sacc)[q] = _prefix(&self._draft[av[jj], 0], emv + eov[jj], m) if m > 0 else 0
            if _SUFFIX_UPDATE != NULL:
                # one call on this step's own buffers: drafts into nsuf rows of k_max
                sflat = _new(nsuf * self._k_max if self._k_max else 1)
                sdlens = _new(nsuf)
                _SUFFIX_UPDATE(index_list, nsuf, _ptr(stoks), _ptr(soff), _ptr(sdr),
                               _ptr(sacc), _ptr(slim), self._k_max, _ptr(sflat), _ptr(sdlens))
                sdoff = _new(nsuf + 1)
                for q in range(nsuf + 1):
                    _ptr(sdoff)[q] = q * self._k_max
                self._apply_drafts(av, svv, nsuf, sflat, sdoff, sdlens, dov)
            else:
                sflat, sdoff, sdlens = _suffix_update(index_list, stoks[: _ptr(soff)[nsuf]], soff,
                                                      sdr, sacc, slim)
                self._apply_drafts(av, svv, nsuf, np.ascontiguousarray(sflat, dtype=np.int64),
                                   np.ascontiguousarray(sdoff, dtype=np.int64),
                                   np.ascontiguousarray(sdlens, dtype=np.int64), dov)
        if nlive:
            self._apply_drafts(av, lvv, nlive, dflat, doff2, dlens, dov)
        if nlive or nsuf:
            for j in range(a):
                dov[j + 1] += dov[j]
            if nsuf == 0:
                drafts = dflat          # the n-gram drafts, already in slot order
            else:                       # both kinds: gathered from the slots' drafts
                drafts = _new(dov[a])
                dfv = _ptr(drafts)
                for j in range(a):
                    i = av[j]
                    for t in range(dov[j + 1] - dov[j]):
                        dfv[dov[j] + t] = self._draft[i, t]
        return StepResult(act, emitted[:w], eoff, acc, drafted, resume, fin[:nfin], drafts, dr_off)



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


def _suffix_update(index_list, tokens, offsets, drafted, accepted, limits):
    """The step's update of ``SuffixIndex`` slots, as ``specfsm.suffix_index``'s drafter
    session does it per request: each index that verified a draft records it
    (``drafted``, ``accepted``: 0 drafted for a decode), takes its emitted tokens, and
    proposes at most ``limits[q]`` tokens (and at most its ``draft_len`` when it is
    ``adaptive``). Returns ``propose_batch``'s ``(drafts, offsets, lengths)``."""
    _si.extend_batch(index_list, tokens, offsets)     # all or nothing, before any record
    verified = [q for q in range(len(index_list)) if drafted[q] > 0]
    if verified:
        _si.record_batch([index_list[q] for q in verified], drafted[verified], accepted[verified])
    limits = np.array(limits, dtype=np.int64, copy=True)
    for q in range(len(index_list)):
        ix = index_list[q]
        if ix.adaptive and ix.draft_len < limits[q]:
            limits[q] = ix.draft_len
    return _si.propose_batch(index_list, limits)




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
    """What ``BatchState.step`` did, as arrays aligned with ``slots`` (see the twin's
    ``StepResult``: same attributes and methods). Every array is fresh memory of that
    step (or a shared read-only empty array): a later step never writes into it."""

    cdef readonly object slots, emitted, emitted_offsets, accepted, drafted, resume_rows
    cdef readonly object finished, drafts, draft_offsets

    def __init__(self, slots, emitted, emitted_offsets, accepted, drafted, resume_rows,
                 finished, drafts, draft_offsets):
        self.slots = slots
        self.emitted = emitted
        self.emitted_offsets = emitted_offsets
        self.accepted = accepted
        self.drafted = drafted
        self.resume_rows = resume_rows
        self.finished = finished
        self.drafts = drafts
        self.draft_offsets = draft_offsets

    def emitted_by_slot(self):
        e, o = self.emitted.tolist(), self.emitted_offsets.tolist()
        return {int(s): e[o[j] : o[j + 1]] for j, s in enumerate(self.slots.tolist())}

    def __repr__(self):
        return (f"StepResult(slots={len(self.slots)}, emitted={len(self.emitted)}, "
                f"finished={len(self.finished)}, drafts={len(self.drafts)})")


cdef inline object _new(Py_ssize_t n):
    """A fresh 1-D int64 array of n entries (numpy C API: no Python-level call)."""
    cdef cnp.npy_intp dims = n
    return cnp.PyArray_EMPTY(1, &dims, cnp.NPY_INT64, 0)


cdef inline int64_t* _ptr(object a) noexcept:
    return <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>a)


_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False
