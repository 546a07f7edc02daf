# cython: language_level=3
"""B request slots as arrays: the batched serving state machine (compiled).

Same names and behaviour as the twin ``specfsm.machine._batch_py``; both take their argument
checks from ``specfsm._checks`` and the concept's check module (every argument is converted into a fresh array the call owns, then
validated). Transitions check every slot's state in one C loop, raise before changing
anything, then apply in a second loop. ``step`` runs the legality-free part of a serving
step (acceptance for the greedy rules, settle, the transitions, emission with budgets
and eos, the placement rows, entering Verify with the next drafts) without the GIL. The
batch takes the one guard of ``_core/common/_guard.pxd``: a transition or ``step`` holds the
writer flag for its whole duration (set before the GIL is released or any Python code
runs), ``pending`` counts itself as a reader, and every other call checks it, so another
thread's call, or a callback's, meanwhile raises RuntimeError; a second ``__init__`` is
refused and an object whose ``__init__`` never completed refuses every call.

This file holds the batch class (its guard, views and public methods) and the step with
its index update; ``batch_transitions.pxi`` the transitions' bodies and
``batch_step.pxi`` the step's layout, draft checks and ``StepResult`` (both included
below, so one module).
"""

import numpy as np

from specfsm._checks import INT64_MAX, REQUIRED, check_count, int64_ids, missing
from specfsm.machine._checks import (
    ACCEPT,
    DECODE,
    DONE,
    FREE,
    PREFILL,
    ROLLBACK,
    STATE_NAMES,
    VERIFY,
    check_capacity,
    check_index_types,
    check_slots,
    illegal,
    per_slot,
    resume_index,
    settle_reason,
    slot_indexes,
    slot_ragged,
)
from specfsm.accept._checks import (
    R_EXACT,
    R_MINRUN,
    R_OTHER,
    R_SPEC,
    R_TYPICAL,
    rule_kind,
    step_probs,
)
# the index modules of the same implementation (a build without them has no compiled batch)
from specfsm._core import ngram_index as _ni
from specfsm._core import suffix_index as _si

cimport cython
cimport numpy as cnp
from libc.stdint cimport int8_t, int64_t
from libc.string cimport memset
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
# the index modules' serving-step policy (their .pxd declarations)
from specfsm._core.ngram_index cimport ngram_serve
from specfsm._core.suffix_index cimport suffix_serve

from _arrays cimport plain_int_width, array_data, array_len
from _guard cimport (guard_t, GUARD_READY, guard_begin_init, guard_end_init, guard_check,
                     guard_write, guard_done_write, guard_read, guard_done_read)

cnp.import_array()

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


cdef inline int64_t _prefix(const int64_t* d, const int64_t* r, int64_t m) noexcept nogil:
    cdef int64_t n = 0
    while n < m and d[n] == r[n]:
        n += 1
    return n


cdef str _NAME = "BatchState"


cdef class BatchState:
    """``capacity`` request slots, each at most ``k_max`` draft tokens, all starting FREE;
    ``bonus`` (default False): ``step`` verifies a K-token draft with K + 1 rows.

    Transitions (each takes ``slots``, distinct slot numbers, and arrays with one entry
    per slot in the same order): ``admit`` (FREE -> Prefill: ``ServingState.start``),
    ``advance_prefill``, ``advance_decode``, ``enter_verify`` (ragged drafts: flat tokens
    and ``offsets``; an empty draft or one over ``k_max`` is refused with ValueError),
    ``accept``, ``accept_rows``, ``resume``, ``rollback``, ``finish``, ``release``
    (Done -> FREE). Caches are int64 handles. ``enter_verify`` keeps the handle as the
    snapshot. ``slot_fields(slot)`` gives a slot's fields (None when FREE).

    One guard (``_core/common/_guard.pxd``, its twin ``specfsm._guard``) protects
    the slots: a second ``__init__`` is refused, an object whose ``__init__`` never
    completed refuses every call, and while a transition or ``step`` runs (another thread, or a callback inside it) every other
    call on the batch raises RuntimeError, changing nothing. The arrays it exposes
    (``states``, ``tokens``, ...) are fresh copies: writing to them changes nothing.
    """

    cdef guard_t _g
    cdef Py_ssize_t _c, _k_max
    cdef bint _bonus
    cdef object _state_a, _token_a, _cache_a, _snap_a, _n_a, _dlen_a, _draft_a
    cdef object _budget_a, _eos_a, _has_eos_a, _plen_a, _has_ix_a
    cdef int8_t[::1] _st
    cdef int64_t[::1] _tok, _cache, _snap, _n, _dlen, _budget, _eos, _plen
    cdef int64_t[:, ::1] _draft
    cdef int8_t[::1] _has_eos, _has_ix
    cdef list _positions, _index
    cdef object _scratch_a
    cdef int64_t[::1] _scratch

    def __cinit__(self):
        # the guard is zeroed (UNINIT) by the allocation; nothing else is usable until
        # __init__ completes, and every call checks the guard first
        self._c = 0
        self._k_max = 0

    def __init__(self, capacity, k_max=8, bonus=False):
        guard_begin_init(&self._g, _NAME)
        c, k = check_capacity(capacity, k_max)
        cdef bint bn = bool(bonus)
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
        self._scratch_a = np.empty(5 * c + 1, dtype=np.int64)
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
        self._scratch = self._scratch_a
        self._positions = [None] * c
        self._index = [None] * c
        self._c = c
        self._k_max = k
        self._bonus = bn
        guard_end_init(&self._g)

    # -- the guard ---------------------------------------------------------------------
    def _hold_guard(self, on):
        """Tests only: ``on=True`` takes the writer flag as a transition would (refusing
        like one), ``on=False`` releases it."""
        if on:
            guard_write(&self._g, _NAME)
        else:
            guard_done_write(&self._g)

    @property
    def busy(self):
        """True while a transition or ``step`` runs (any other call on the batch then
        raises RuntimeError); refuses only a batch whose ``__init__`` never completed."""
        if self._g.phase != GUARD_READY:
            guard_check(&self._g, _NAME)
        return bool(self._g.writing)

    # -- views -----------------------------------------------------------------------
    @property
    def capacity(self):
        """The number of slots."""
        guard_check(&self._g, _NAME)
        return self._c

    @property
    def k_max(self):
        """The longest draft a slot may hold."""
        guard_check(&self._g, _NAME)
        return self._k_max

    @property
    def bonus(self):
        """Whether ``step`` verifies a K-token draft with K + 1 rows (see ``step``)."""
        guard_check(&self._g, _NAME)
        return self._bonus

    @property
    def remaining(self):
        """Tokens each slot may still emit in ``step`` (int64, a fresh copy)."""
        guard_check(&self._g, _NAME)
        return _copy(self._budget_a)

    @property
    def states(self):
        """State code per slot (int8, a fresh copy): FREE, PREFILL .. DONE."""
        guard_check(&self._g, _NAME)
        return _copy(self._state_a)

    @property
    def tokens(self):
        """``last`` / ``next`` / ``to`` per slot (int64, a fresh copy)."""
        guard_check(&self._g, _NAME)
        return _copy(self._token_a)

    @property
    def caches(self):
        """Cache handle per slot (int64, a fresh copy; Rollback: its snapshot)."""
        guard_check(&self._g, _NAME)
        return _copy(self._cache_a)

    @property
    def accepted(self):
        """``Accept.n`` per slot (int64, a fresh copy; 0 elsewhere)."""
        guard_check(&self._g, _NAME)
        return _copy(self._n_a)

    @property
    def draft_lens(self):
        """Draft length per slot in Verify (int64, a fresh copy; 0 elsewhere)."""
        guard_check(&self._g, _NAME)
        return _copy(self._dlen_a)

    def slots_in(self, state):
        """The slots (ascending, int64) whose state code is ``state`` (0..6)."""
        code = check_count(state, "state")
        if code > DONE:
            raise ValueError(f"state must be a state code 0..{DONE}, got {code}")
        guard_check(&self._g, _NAME)
        return np.flatnonzero(self._state_a == code).astype(np.int64)

    cdef Py_ssize_t _one(self, slot) except -1:
        i = check_count(slot, "slot")
        guard_check(&self._g, _NAME)
        if i >= self._c:
            raise IndexError(f"slot {i} is outside the batch's {self._c} slots")
        return i

    def draft(self, slot):
        """The draft of slot ``slot`` when it is in Verify (empty elsewhere)."""
        cdef Py_ssize_t i = self._one(slot)
        return self._draft_a[i, : self._dlen[i]].tolist()

    def slot_fields(self, slot):
        """Slot ``slot``'s fields, or None when it is FREE: ``(code, token, cache, draft,
        snapshot, accepted, positions)`` (the state code, ints, and the draft and prompt
        as lists of ints, empty where the state has none). ``specfsm.machine.batch.BatchState``
        builds its ``state_of`` value from them."""
        cdef Py_ssize_t i = self._one(slot)
        cdef int code = self._st[i]
        if code == C_FREE:
            return None
        return (code, int(self._tok[i]), int(self._cache[i]),
                self._draft_a[i, : self._dlen[i]].tolist(), int(self._snap[i]), int(self._n[i]),
                self._positions[i].tolist() if code == C_PREFILL else [])

    def __len__(self):
        guard_check(&self._g, _NAME)
        return self._c

    def __repr__(self):
        if self._g.phase != GUARD_READY:
            return "BatchState(<not initialised>)"
        counts = np.bincount(self._state_a, minlength=7)
        shown = ", ".join(f"{n}={int(c)}" for n, c in zip(STATE_NAMES, counts) if c)
        return f"BatchState(capacity={self._c}, k_max={self._k_max}, {shown})"

    # -- transitions -------------------------------------------------------------------
    @cython.embedsignature(False)   # the real signature: __signature__ below
    def admit(self, slots=REQUIRED, positions=REQUIRED, offsets=REQUIRED, caches=REQUIRED, *,
              max_tokens=None, eos=None, indexes=None):
        """FREE -> Prefill (``ServingState.start``): slot ``slots[j]`` gets the prompt
        ``positions[offsets[j]:offsets[j + 1]]`` and cache handle ``caches[j]``. The
        batch refuses an empty prompt as a batching rule (ValueError; ``ServingState``
        accepts one, as the original design does).

        For ``step``: ``max_tokens`` (one count or one per slot, at least 1; default
        unlimited) caps the tokens a slot emits, ``eos`` (None, one id or one per slot)
        stops it after that token, and ``indexes`` (one ``NgramIndex`` or ``SuffixIndex``
        of this implementation, or None, per slot; already extended with the prompt)
        drafts for it. A ``SuffixIndex`` slot is served as ``SuffixDrafter``'s session
        serves one request: it records each verified draft (``record``) and drafts at
        most its ``draft_len`` when it is ``adaptive``."""
        if slots is REQUIRED or positions is REQUIRED or offsets is REQUIRED or caches is REQUIRED:
            missing("admit", ("slots", "positions", "offsets", "caches"), (slots, positions, offsets, caches))
        guard_write(&self._g, _NAME)
        try:
            _admit(self, slots, positions, offsets, caches, max_tokens, eos, indexes)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def advance_prefill(self, slots=REQUIRED, next_tokens=REQUIRED, caches=REQUIRED):
        """Prefill -> Decode: slot ``slots[j]``'s prompt evaluation chose
        ``next_tokens[j]`` and left cache handle ``caches[j]``."""
        if slots is REQUIRED or next_tokens is REQUIRED or caches is REQUIRED:
            missing("advance_prefill", ("slots", "next_tokens", "caches"), (slots, next_tokens, caches))
        guard_write(&self._g, _NAME)
        try:
            _advance(self, "advance_prefill", slots, next_tokens, caches)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def advance_decode(self, slots=REQUIRED, next_tokens=REQUIRED, caches=REQUIRED):
        """Decode -> Decode: slot ``slots[j]``'s single-row evaluation chose
        ``next_tokens[j]`` and left cache handle ``caches[j]``."""
        if slots is REQUIRED or next_tokens is REQUIRED or caches is REQUIRED:
            missing("advance_decode", ("slots", "next_tokens", "caches"), (slots, next_tokens, caches))
        guard_write(&self._g, _NAME)
        try:
            _advance(self, "advance_decode", slots, next_tokens, caches)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def enter_verify(self, slots=REQUIRED, tokens=REQUIRED, offsets=REQUIRED):
        """Decode -> Verify: slot ``slots[j]`` drafts ``tokens[offsets[j]:offsets[j + 1]]``;
        its cache handle becomes the snapshot (no copy). Refuses (ValueError) a draft
        longer than ``k_max``, and an empty draft as a batching rule (``ServingState``
        accepts one, as the original design does)."""
        if slots is REQUIRED or tokens is REQUIRED or offsets is REQUIRED:
            missing("enter_verify", ("slots", "tokens", "offsets"), (slots, tokens, offsets))
        guard_write(&self._g, _NAME)
        try:
            _enter_verify(self, slots, tokens, offsets)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def accept(self, slots=REQUIRED, row_tokens=REQUIRED, row_offsets=REQUIRED, row_caches=REQUIRED, cache_offsets=REQUIRED):
        """Verify -> Accept | Rollback, as ``Verify.accept`` per slot: the accepted count is
        the common prefix of slot ``slots[j]``'s draft and its row tokens
        ``row_tokens[row_offsets[j]:row_offsets[j + 1]]``; ``row_caches[cache_offsets[j]:
        cache_offsets[j + 1]]`` holds one cache handle per draft row."""
        if slots is REQUIRED or row_tokens is REQUIRED or row_offsets is REQUIRED or row_caches is REQUIRED or cache_offsets is REQUIRED:
            missing("accept", ("slots", "row_tokens", "row_offsets", "row_caches", "cache_offsets"), (slots, row_tokens, row_offsets, row_caches, cache_offsets))
        guard_write(&self._g, _NAME)
        try:
            _settle(self, "accept", slots, None, row_tokens, row_offsets, row_caches, cache_offsets)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def accept_rows(self, slots=REQUIRED, accepted=REQUIRED, row_tokens=REQUIRED, row_offsets=REQUIRED, row_caches=REQUIRED, cache_offsets=REQUIRED):
        """``accept`` with slot ``slots[j]``'s accepted count ``accepted[j]`` supplied
        (``Verify.accept_rows``); ``row_tokens``/``row_offsets`` and
        ``row_caches``/``cache_offsets`` as in ``accept``."""
        if slots is REQUIRED or accepted is REQUIRED or row_tokens is REQUIRED or row_offsets is REQUIRED or row_caches is REQUIRED or cache_offsets is REQUIRED:
            missing("accept_rows", ("slots", "accepted", "row_tokens", "row_offsets", "row_caches", "cache_offsets"), (slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets))
        guard_write(&self._g, _NAME)
        try:
            _settle(self, "accept_rows", slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def resume(self, slots=REQUIRED):
        """Accept -> Decode for every slot in ``slots``: decoding resumes from ``next``
        with the placed cache."""
        if slots is REQUIRED:
            missing("resume", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _resume(self, slots)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def rollback(self, slots=REQUIRED):
        """Rollback -> Decode for every slot in ``slots``: decoding resumes from ``to``
        with the snapshot."""
        if slots is REQUIRED:
            missing("rollback", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _rollback(self, slots)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def finish(self, slots=REQUIRED):
        """Any state but FREE -> Done for every slot in ``slots`` (Rollback keeps its
        snapshot as the cache)."""
        if slots is REQUIRED:
            missing("finish", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _finish(self, slots)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def release(self, slots=REQUIRED):
        """Done -> FREE for every slot in ``slots``: the slot can be admitted again."""
        if slots is REQUIRED:
            missing("release", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _release(self, slots)
        finally:
            guard_done_write(&self._g)

    # -- the fused step ------------------------------------------------------------------
    def pending(self):
        """``(slots, inputs, offsets)``: the evaluation ``step`` expects rows for (no
        parameters; fresh arrays). Slot ``slots[j]`` (every slot in Prefill, Decode or
        Verify, ascending) evaluates ``inputs[offsets[j]:offsets[j + 1]]``: its prompt,
        ``[last]``, or for a K-token draft ``[last, draft[0], ..., draft[K - 2]]`` (with
        ``bonus``: ``..., draft[K - 1]``). A reader: refused while a transition or
        ``step`` runs, and it holds them off while it runs.
        """
        guard_read(&self._g, _NAME)
        try:
            return _pending(self)
        finally:
            guard_done_read(&self._g)

    cdef tuple _update_indexes(self, const int64_t* av, const int64_t* lvv, Py_ssize_t nlive,
                               object emitted, object eoff, Py_ssize_t w, Py_ssize_t a,
                               const int64_t* nbv, const int64_t* drv):
        """Extend the live slots' indexes with what they emitted and propose their next
        drafts (at most ``min(k_max, nbv[j])`` tokens, ``nbv`` the step's new budgets)
        through the n-gram module's serving-step policy (``ngram_serve``: each verified
        draft recorded with its agreement with what the slot emitted, as the drafter
        session records it); returns ``(drafts, offsets, lengths)`` as ``propose_batch``
        does. Every buffer is fresh memory of this call."""
        cdef list index_list = _pick(self._index, av, lvv, nlive)
        cdef const int64_t* emv = _ptr(emitted)
        cdef const int64_t* eov = _ptr(eoff)
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
        ndr = _new(nlive)
        nag = _new(nlive)
        cdef int64_t* ndv = _ptr(ndr)
        cdef int64_t* nav = _ptr(nag)
        cdef Py_ssize_t jj
        cdef int64_t m
        for q in range(nlive):
            jj = lvv[q]
            lim = nbv[jj]
            limv[q] = lim if lim < kmax else kmax
            m = drv[jj]
            ndv[q] = m
            if m > eov[jj + 1] - eov[jj]:
                m = eov[jj + 1] - eov[jj]
            nav[q] = _prefix(&self._draft[av[jj], 0], emv + eov[jj], m) if m > 0 else 0
        square = _new(nlive * kmax if kmax else 1)
        lengths = _new(nlive)
        cdef int64_t* sqv = _ptr(square)
        cdef int64_t* lnv = _ptr(lengths)
        ngram_serve(index_list, nlive, _ptr(src), _ptr(off), ndv, nav, limv, kmax, sqv, lnv)
        doffs = _new(nlive + 1)
        cdef int64_t* dov = _ptr(doffs)
        dov[0] = 0
        for q in range(nlive):
            if lnv[q] < 0 or lnv[q] > kmax:
                raise RuntimeError(f"the index module returned a draft of {lnv[q]} tokens for k_max={kmax}")
            dov[q + 1] = dov[q] + lnv[q]
        flat = _new(dov[nlive])
        cdef int64_t* fv = _ptr(flat)
        for q in range(nlive):
            for t in range(lnv[q]):
                fv[dov[q] + t] = sqv[q * kmax + t]
        return flat, doffs, lengths

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def step(self, row_tokens=REQUIRED, *, probs=None, rule=None, draft_probs=None):
        """One serving step for every slot in Prefill, Decode or Verify.

        ``row_tokens`` holds the target's chosen token for every row of ``pending()``'s
        layout (a prefill reads its last row, a decode its one row). A verify settles by
        ``rule`` (None: greedy exact; ``MinRun``; ``SpeculativeSampling`` and
        ``TypicalAcceptance`` read ``probs``, one probability row per evaluated row,
        and ``draft_probs`` for the draft rows; any other rule's ``accepted_rows``),
        exactly as ``Verify.accept_rows`` then ``resume``/``rollback``, and emits the
        accepted draft tokens and the target's token at the first rejected row. With
        ``bonus`` a fully accepted K-token draft also emits row K's token (K + 1
        tokens), and resumes from it. Emitted tokens are cut at ``max_tokens`` and after
        ``eos`` (the slot then goes to Done); the others extend their index and draft up
        to ``min(k_max, remaining)`` tokens, entering Verify when the draft is
        non-empty. Cache handles are kept: ``resume_rows`` says which row of its own
        evaluation each slot's cache resumes from (see ``StepResult``).

        All or nothing: the step refuses, changing neither the batch nor any index,
        rows that do not match the layout, probabilities the rule refuses, a rule that
        raises or puts a count outside ``[0, K]`` (``IllegalTransition("accept_rows")``),
        an index listed for two live slots (ValueError) and an index in use by another
        call (RuntimeError); the same step can then be retried. (Left open: another
        thread taking an index between the step's updates of its n-gram and its suffix
        indexes, or, on the pure-Python twin, between an index's extend and its propose;
        the step then refuses with the batch unchanged but the indexes already updated
        keep the step's tokens.) A rule callback that calls back into the batch is refused
        (RuntimeError) like any call during the step.
        """
        if row_tokens is REQUIRED:
            missing("step", ("row_tokens",), (row_tokens,))
        guard_write(&self._g, _NAME)
        try:
            return self._step(row_tokens, probs, rule, draft_probs)
        finally:
            guard_done_write(&self._g)

    cdef object _step(self, row_tokens, probs, rule, draft_probs):
        cdef int kind = R_EXACT
        cdef int64_t m = 0
        if rule is not None:
            kind, m = rule_kind(rule)
        cdef Py_ssize_t a
        cdef int64_t* sc = &self._scratch[0]
        with nogil:
            a = _layout(self, sc, sc + self._c)
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
            rows = int64_ids(row_tokens, "row_tokens")
        if array_len(rows) != total:
            raise ValueError(f"row_tokens holds {array_len(rows)} rows; this step evaluates {total}")
        cdef const int64_t* rp = <const int64_t*>array_data(rows)
        acc = _new(a)
        cdef int64_t* accv = _ptr(acc)
        memset(accv, 0, a * sizeof(int64_t))
        cdef int64_t k, n
        # pass 1 for the rules that need Python (probability kernels, other rules)
        repl = None
        if kind == R_SPEC or kind == R_TYPICAL or kind == R_OTHER:
            repl = _rule_counts(self, kind, rule, probs, draft_probs, act, off, rows, total, acc)
        cdef bint sampled = repl is not None
        cdef int64_t* replv = _ptr(repl) if sampled else NULL
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
        # each slot's budget, token and state after the step, computed aside: the batch
        # is changed only once everything that can refuse has run (all or nothing)
        cdef int64_t* nbv = sc + 2 * self._c + 1
        cdef int64_t* ntv = sc + 3 * self._c + 1
        cdef int64_t* nsv = sc + 4 * self._c + 1
        cdef Py_ssize_t nsuf = 0
        cdef Py_ssize_t nfin = 0, nlive = 0, w = 0, cnt, room, e0
        cdef int code
        cdef int64_t r0, r1, t, bonus = self._bonus
        cdef bint stop
        with nogil:
            for j in range(a):
                i = av[j]
                code = self._st[i]
                r0 = ov[j]
                r1 = ov[j + 1]
                e0 = w
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
                else:
                    emv[w] = rp[r1 - 1]
                    w += 1
                    rsv[j] = r1 - 1 - r0    # a prefill's last prompt row, a decode's row 0
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
                nbv[j] = room - cnt
                if stop:
                    nsv[j] = C_DONE
                    ntv[j] = 0
                    finv[nfin] = i
                    nfin += 1
                else:
                    nsv[j] = C_DECODE
                    ntv[j] = emv[w - 1]
                    if self._has_ix[i] == IX_NGRAM:
                        lvv[nlive] = j
                        nlive += 1
                    elif self._has_ix[i] == IX_SUFFIX:
                        svv[nsuf] = j
                        nsuf += 1
        # index update and next drafts (each batched call releases the GIL for its loop;
        # each refuses before it changes any index)
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
        if nlive and nsuf:
            # two module calls: what would refuse the second is checked before the first
            index_list = _pick(self._index, av, svv, nsuf)
            _check_distinct(index_list)
            _si.propose_batch(index_list, 0)       # refuses an index in use, changes nothing
        if nlive:
            # the n-gram module's policy: extend and propose in one pass without the GIL,
            # on this step's own buffers (no argument conversion)
            dflat, doff2, dlens = self._update_indexes(av, lvv, nlive, emitted, eoff, w, a, nbv, drv)
        if nlive:
            _check_drafts_out(self, nlive, dflat, doff2, dlens)
        if nsuf:
            # SuffixIndex slots: the suffix module's policy, as the drafter session serves
            # one request: each verified draft recorded, the emitted tokens extended, the
            # next draft proposed
            index_list = _pick(self._index, av, svv, nsuf)
            soff = _new(nsuf + 1)
            stoks = _new(w)
            _gather(svv, nsuf, eov, emv, _ptr(soff), _ptr(stoks))
            slim = _new(nsuf)
            sdr = _new(nsuf)
            sacc = _new(nsuf)
            for q in range(nsuf):
                jj = svv[q]
                lim = nbv[jj]
                _ptr(slim)[q] = lim if lim < self._k_max else self._k_max
                _ptr(sdr)[q] = drv[jj]
                # what the drafter session records: the draft's agreement with what the
                # slot emitted (the one policy's input on every path). It equals this
                # step's accepted count except where a rule rejects a matching prefix
                # (MinRun) or a budget or eos cut the emission
                m = drv[jj]
                if m > eov[jj + 1] - eov[jj]:
                    m = eov[jj + 1] - eov[jj]
                _ptr(sacc)[q] = _prefix(&self._draft[av[jj], 0], emv + eov[jj], m) if m > 0 else 0
            # drafts into nsuf rows of k_max
            sflat = _new(nsuf * self._k_max if self._k_max else 1)
            sdlens = _new(nsuf)
            suffix_serve(index_list, nsuf, _ptr(stoks), _ptr(soff), _ptr(sdr), _ptr(sacc),
                         _ptr(slim), self._k_max, _ptr(sflat), _ptr(sdlens))
            sdoff = _new(nsuf + 1)
            for q in range(nsuf + 1):
                _ptr(sdoff)[q] = q * self._k_max
            _check_drafts_out(self, nsuf, sflat, sdoff, sdlens)
        # commit: nothing below can refuse or run Python code
        for j in range(a):
            i = av[j]
            if self._st[i] == C_VERIFY:
                self._dlen[i] = 0
                self._snap[i] = 0
            elif self._st[i] == C_PREFILL:
                self._positions[i] = None    # the prompt of a slot that left Prefill
            self._budget[i] = nbv[j]
            self._tok[i] = ntv[j]
            self._st[i] = <int8_t>nsv[j]
        if nsuf:
            _apply_drafts(self, av, svv, nsuf, sflat, sdoff, sdlens, dov)
        if nlive:
            _apply_drafts(self, av, lvv, nlive, dflat, doff2, dlens, dov)
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



include "batch_transitions.pxi"
include "batch_step.pxi"
