# cython: language_level=3
"""B request slots as arrays: the batched serving state machine (compiled).

Same names and behaviour as the twin ``specfsm.machine._batch_py``; both take their argument
checks from ``specfsm._checks`` and the concept's check module (every argument is converted
into memory the call owns, then validated: a fresh array, or for ``enter_verify``'s usual
call, plain int64/int32 arrays or lists of ints, the batch's scratch, checked in C and
declining to the general path, which raises the one message, on anything else).
Transitions check every slot's state in one C loop, raise before changing anything, then
apply in a second loop. ``step`` runs the legality-free part of a serving step (acceptance
for the greedy rules, settle, the transitions, emission with budgets and eos, the
placement rows, entering Verify with the next drafts) on the batch's scratch, allocating
only its result's arrays, and without the GIL from ``NOGIL_SLOTS`` slots on. The batch
takes the one guard of ``_core/common/_guard.pxd``: a transition or ``step`` holds the
writer flag for its whole duration (set before the GIL is released or any Python code
runs), ``pending`` counts itself as a reader, and every other call checks it, so another
thread's call, or a callback's, meanwhile raises RuntimeError; a second ``__init__`` is
refused and an object whose ``__init__`` never completed refuses every call.

This file holds the batch class (its guard, views and public methods);
``batch_transitions.pxi`` the transitions' bodies, ``batch_step.pxi`` the step's layout,
draft checks and ``StepResult``, ``batch_run.pxi`` the step's body with its index update,
``batch_fast.pxi`` the transitions' fast path (all included below, so one module).
"""

import numpy as np

from specfsm._checks import INT64_MAX, REQUIRED, check_count, host_array, int64_ids, missing
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
    check_index_owners,
    check_index_types,
    check_slots,
    illegal,
    negative_row,
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
from specfsm.tree import _checks as _tc
from specfsm.tree._checks import check_lengths, ids64, tree_error
# the index modules of the same implementation (a build without them has no compiled batch)
from specfsm._core import ngram_index as _ni
from specfsm._core import suffix_index as _si

cimport cython
cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t, int64_t
from libc.string cimport memcpy, memset
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
# the index modules' serving-step policy (their .pxd declarations)
from specfsm._core.ngram_index cimport ngram_serve
from specfsm._core.suffix_index cimport suffix_serve

from _arrays cimport plain_int_width, array_data, array_len, fast_len, fast_read
from _offsets cimport longest_row
from _guard cimport (guard_t, GUARD_READY, guard_begin_init, guard_end_init, guard_check,
                     guard_write, guard_done_write, guard_hold, guard_read, guard_done_read)

cnp.import_array()

__all__ = [
    "BatchState",
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


cdef enum:             # a tree check's refusal codes (specfsm.tree._checks's, checked at import)
    _TREE_NEGATIVE_TOKEN = 1
    _TREE_PARENT_BELOW_ROOT = 2
    _TREE_PARENT_NOT_BEFORE = 3
    _TREE_DUPLICATE_SIBLING = 4

if (_TREE_NEGATIVE_TOKEN, _TREE_PARENT_BELOW_ROOT, _TREE_PARENT_NOT_BEFORE, _TREE_DUPLICATE_SIBLING) != (
        _tc.NEGATIVE_TOKEN, _tc.PARENT_BELOW_ROOT, _tc.PARENT_NOT_BEFORE, _tc.DUPLICATE_SIBLING):
    raise ImportError("specfsm._core.batch: its tree refusal codes differ from specfsm.tree._checks")


cdef inline int64_t _prefix(const int64_t* d, const int64_t* r, int64_t m) noexcept nogil:
    cdef int64_t n = 0
    while n < m and d[n] == r[n]:
        n += 1
    return n


cdef str _NAME = "BatchState"


@cython.auto_pickle(False)      # a batch holds live requests: it does not pickle
@cython.embedsignature(False)   # the constructor's signature heads the docstring, in the
cdef class BatchState:          # form CPython reads as __text_signature__ (help, inspect)
    """BatchState(capacity, k_max=8, bonus=False)
--

    ``capacity`` request slots, each at most ``k_max`` draft tokens, all starting FREE;
    ``bonus`` (default False): ``step`` verifies a K-token draft with K + 1 rows.

    Transitions (each takes ``slots``, distinct slot numbers, and arrays with one entry
    per slot in the same order): ``admit`` (FREE -> Prefill: ``ServingState.start``),
    ``advance_prefill``, ``advance_decode``, ``enter_verify`` (ragged drafts: flat tokens
    and ``offsets``; an empty draft or one over ``k_max`` is refused with ValueError),
    ``enter_verify_tree`` (ragged trees of at most ``k_max`` nodes, settled by ``step``),
    ``accept``, ``accept_rows``, ``resume``, ``rollback``, ``finish``, ``release``
    (Done -> FREE). Caches are int64 handles. ``enter_verify`` keeps the handle as the
    snapshot. ``slot_fields(slot)`` gives a slot's fields (None when FREE).

    One guard protects the slots: a second ``__init__`` is refused, an object whose
    ``__init__`` never completed refuses every call, and while a transition or ``step``
    runs (another thread, or a callback inside it) every other call on the batch raises
    RuntimeError, changing nothing. The arrays it exposes
    (``states``, ``tokens``, ...) are fresh copies: writing to them changes nothing.
    """

    cdef guard_t _g
    cdef Py_ssize_t _c, _k_max
    cdef bint _bonus
    cdef object _state_a, _token_a, _cache_a, _snap_a, _n_a, _dlen_a, _draft_a
    cdef object _budget_a, _eos_a, _has_eos_a, _plen_a, _has_ix_a
    cdef int8_t[::1] _st
    cdef int64_t[::1] _tok, _cache, _snap, _n, _dlen, _budget, _eos, _plen
    cdef int64_t[:, ::1] _draft, _par     # _par: a tree slot's parents (its tokens: _draft)
    cdef object _par_a, _tree_a
    cdef int8_t[::1] _tree                # the slot's verify is a tree (batch_tree.pxi)
    cdef int8_t[::1] _has_eos, _has_ix
    cdef list _positions, _index
    cdef object _scratch_a, _work_a, _mark_a
    cdef int64_t[::1] _scratch
    cdef int64_t* _work        # the writers' growable scratch (_work_n entries, _grow)
    cdef Py_ssize_t _work_n
    cdef int8_t* _mark         # c flags, all 0 between calls (the fast slot check)

    def __cinit__(self):
        # the guard is zeroed (UNINIT) by the allocation; nothing else is usable until
        # __init__ completes, and every call checks the guard first
        self._c = 0
        self._k_max = 0
        self._work = NULL
        self._work_n = 0
        self._mark = NULL

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
        self._par_a = np.zeros((c, k), dtype=np.int64)
        self._tree_a = np.zeros(c, dtype=np.int8)
        self._budget_a = np.zeros(c, dtype=np.int64)
        self._eos_a = np.zeros(c, dtype=np.int64)
        self._has_eos_a = np.zeros(c, dtype=np.int8)
        self._plen_a = np.zeros(c, dtype=np.int64)
        self._has_ix_a = np.zeros(c, dtype=np.int8)
        self._scratch_a = np.empty(7 * c + 1, dtype=np.int64)
        self._mark_a = np.zeros(c, dtype=np.int8)
        self._mark = <int8_t*>cnp.PyArray_DATA(<cnp.ndarray>self._mark_a)
        self._work_a = np.empty(64, dtype=np.int64)     # grown on demand (_grow)
        self._work = <int64_t*>cnp.PyArray_DATA(<cnp.ndarray>self._work_a)
        self._work_n = 64
        self._st = self._state_a
        self._tok = self._token_a
        self._cache = self._cache_a
        self._snap = self._snap_a
        self._n = self._n_a
        self._dlen = self._dlen_a
        self._draft = self._draft_a
        self._par = self._par_a
        self._tree = self._tree_a
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
        _batch_self(self)
        guard_hold(&self._g, _NAME, on)

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
        _batch_self(self)
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
        _batch_self(self)
        cdef Py_ssize_t i = self._one(slot)
        guard_read(&self._g, _NAME)
        try:
            return self._draft_a[i, : self._dlen[i]].tolist()
        finally:
            guard_done_read(&self._g)

    def slot_fields(self, slot):
        _batch_self(self)
        cdef Py_ssize_t i = self._one(slot)
        cdef int code
        # the fields are read in turn and each read makes Python objects (a collector's
        # finaliser may run between two): a reader's section holds transitions off
        guard_read(&self._g, _NAME)
        try:
            code = self._st[i]
            if code == C_FREE:
                return None
            return (code, int(self._tok[i]), int(self._cache[i]),
                    self._draft_a[i, : self._dlen[i]].tolist(), int(self._snap[i]), int(self._n[i]),
                    self._positions[i].tolist() if code == C_PREFILL else [])
        finally:
            guard_done_read(&self._g)

    def slot_tree(self, slot):
        _batch_self(self)
        cdef Py_ssize_t i = self._one(slot)
        guard_read(&self._g, _NAME)
        try:
            if not self._tree[i]:
                return None
            return self._draft_a[i, : self._dlen[i]].tolist(), self._par_a[i, : self._dlen[i]].tolist()
        finally:
            guard_done_read(&self._g)

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
        _batch_self(self)
        if slots is REQUIRED or positions is REQUIRED or offsets is REQUIRED or caches is REQUIRED:
            missing("admit", ("slots", "positions", "offsets", "caches"), (slots, positions, offsets, caches))
        guard_write(&self._g, _NAME)
        try:
            _admit(self, slots, positions, offsets, caches, max_tokens, eos, indexes)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def advance_prefill(self, slots=REQUIRED, next_tokens=REQUIRED, caches=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED or next_tokens is REQUIRED or caches is REQUIRED:
            missing("advance_prefill", ("slots", "next_tokens", "caches"), (slots, next_tokens, caches))
        guard_write(&self._g, _NAME)
        try:
            _advance(self, "advance_prefill", slots, next_tokens, caches)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def advance_decode(self, slots=REQUIRED, next_tokens=REQUIRED, caches=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED or next_tokens is REQUIRED or caches is REQUIRED:
            missing("advance_decode", ("slots", "next_tokens", "caches"), (slots, next_tokens, caches))
        guard_write(&self._g, _NAME)
        try:
            _advance(self, "advance_decode", slots, next_tokens, caches)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def enter_verify(self, slots=REQUIRED, tokens=REQUIRED, offsets=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED or tokens is REQUIRED or offsets is REQUIRED:
            missing("enter_verify", ("slots", "tokens", "offsets"), (slots, tokens, offsets))
        guard_write(&self._g, _NAME)
        try:
            _enter_verify(self, slots, tokens, offsets)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def enter_verify_tree(self, slots=REQUIRED, tokens=REQUIRED, parents=REQUIRED, offsets=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED or tokens is REQUIRED or parents is REQUIRED or offsets is REQUIRED:
            missing("enter_verify_tree", ("slots", "tokens", "parents", "offsets"), (slots, tokens, parents, offsets))
        guard_write(&self._g, _NAME)
        try:
            _enter_verify_tree(self, slots, tokens, parents, offsets)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def accept(self, slots=REQUIRED, row_tokens=REQUIRED, row_offsets=REQUIRED, row_caches=REQUIRED, cache_offsets=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED or row_tokens is REQUIRED or row_offsets is REQUIRED or row_caches is REQUIRED or cache_offsets is REQUIRED:
            missing("accept", ("slots", "row_tokens", "row_offsets", "row_caches", "cache_offsets"), (slots, row_tokens, row_offsets, row_caches, cache_offsets))
        guard_write(&self._g, _NAME)
        try:
            _settle(self, "accept", slots, None, row_tokens, row_offsets, row_caches, cache_offsets)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def accept_rows(self, slots=REQUIRED, accepted=REQUIRED, row_tokens=REQUIRED, row_offsets=REQUIRED, row_caches=REQUIRED, cache_offsets=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED or accepted is REQUIRED or row_tokens is REQUIRED or row_offsets is REQUIRED or row_caches is REQUIRED or cache_offsets is REQUIRED:
            missing("accept_rows", ("slots", "accepted", "row_tokens", "row_offsets", "row_caches", "cache_offsets"), (slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets))
        guard_write(&self._g, _NAME)
        try:
            _settle(self, "accept_rows", slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def resume(self, slots=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED:
            missing("resume", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _resume(self, slots)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def rollback(self, slots=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED:
            missing("rollback", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _rollback(self, slots)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def finish(self, slots=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED:
            missing("finish", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _finish(self, slots)
        finally:
            guard_done_write(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def release(self, slots=REQUIRED):
        _batch_self(self)
        if slots is REQUIRED:
            missing("release", ("slots",), (slots,))
        guard_write(&self._g, _NAME)
        try:
            _release(self, slots)
        finally:
            guard_done_write(&self._g)

    # -- the fused step ------------------------------------------------------------------
    def pending(self):
        _batch_self(self)
        guard_read(&self._g, _NAME)
        try:
            return _pending(self)
        finally:
            guard_done_read(&self._g)

    def pending_trees(self):
        _batch_self(self)
        guard_read(&self._g, _NAME)
        try:
            return _pending_trees(self)
        finally:
            guard_done_read(&self._g)

    @cython.embedsignature(False)   # the real signature: __signature__ below
    def step(self, row_tokens=REQUIRED, *, probs=None, rule=None, draft_probs=None):
        _batch_self(self)
        if row_tokens is REQUIRED:
            missing("step", ("row_tokens",), (row_tokens,))
        guard_write(&self._g, _NAME)
        try:
            return _run_step(self, row_tokens, probs, rule, draft_probs)
        finally:
            guard_done_write(&self._g)


include "batch_transitions.pxi"
include "batch_step.pxi"
include "batch_run.pxi"
include "batch_fast.pxi"
include "batch_tree.pxi"


# A method called unbound (``BatchState.step(obj, ...)``) gets any object as ``self``,
# which Cython does not check, and every method reads its fields as the class's: each
# plain method of the two classes checks ``self`` first (properties and special methods
# are checked by their descriptors).
cdef inline int _batch_self(object o) except -1:
    if not isinstance(o, BatchState):
        raise TypeError(f"a method of BatchState needs a BatchState, got {type(o).__module__}.{type(o).__name__}")
    return 0


cdef inline int _result_self(object o) except -1:
    if not isinstance(o, StepResult):
        raise TypeError(f"a method of StepResult needs a StepResult, got {type(o).__module__}.{type(o).__name__}")
    return 0
