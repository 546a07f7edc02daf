"""B request slots as arrays: the batched serving state machine (pure-Python twin).

The compiled module ``specfsm._core.batch`` has the same names and behaviour; both take
their argument checks from ``specfsm._checks`` and the concept's check module, so both raise the same errors.

Each slot holds one request's state as ``specfsm.ServingState`` would, coded as a
small integer (``FREE`` for an unused slot, then ``PREFILL`` .. ``DONE``), with the
fields the variants carry in parallel arrays: ``token`` (``Decode.last``,
``Accept.next``, ``Rollback.to``), ``cache`` (the cache handle, an int64: a row index, a
block-table id; ``Rollback.snapshot`` lives here too), ``snapshot`` (``Verify.snapshot``:
the handle the draft was entered with), ``n`` (``Accept.n``) and the draft (at most
``k_max`` tokens per slot). Every transition takes ``slots`` (distinct slot numbers) and
applies ``ServingState``'s transition to each; if it is illegal for any of them the whole call
raises ``IllegalTransition`` naming those slots (``err.slots``) and the state each was
in (``err.states``), and the batch is left unchanged. The fused step and its
``StepResult`` are in ``specfsm.machine._batch_step_py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checks import INT64_MAX, check_count
from ._checks import (
    ACCEPT,
    DECODE,
    DONE,
    FREE,
    MAX_DRAFT,
    MAX_SLOTS,
    PREFILL,
    ROLLBACK,
    STATE_NAMES,
    VERIFY,
    check_capacity,
    check_index_owners,
    check_index_types,
    check_slots,
    illegal,
    per_slot,
    settle_reason,
    slot_indexes,
    slot_ragged,
)
from .. import _guard
from ._batch_step_py import TREE_SETTLE, StepResult, run_step
from ..drafting import _ngram_index_py as _ni
from ..drafting import _suffix_index_py as _si
from ..tree import _tree_py as _tr
from ..tree._checks import check_lengths, ids64

__all__ = [
    "BatchState",
    "StepResult",
]

# the state each transition applies to (finish: any state but FREE)
_FROM = {
    "admit": (FREE,),
    "advance_prefill": (PREFILL,),
    "advance_decode": (DECODE,),
    "enter_verify": (DECODE,),
    "enter_verify_tree": (DECODE,),
    "accept": (VERIFY,),
    "accept_rows": (VERIFY,),
    "resume": (ACCEPT,),
    "rollback": (ROLLBACK,),
    "finish": (PREFILL, DECODE, VERIFY, ACCEPT, ROLLBACK, DONE),
    "release": (DONE,),
}


def _check_from(attempted: str, state: np.ndarray, s: np.ndarray) -> None:
    codes = state[s]
    ok = np.isin(codes, _FROM[attempted])
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise illegal(attempted, s[bad].tolist(), codes[bad].tolist())


def _check_drafts(doff: np.ndarray, s: np.ndarray, k_max: int) -> None:
    lens = doff[1:] - doff[:-1]  # offsets already checked nondecreasing and bounded
    if lens.shape[0]:
        if (lens == 0).any():
            i = int(np.flatnonzero(lens == 0)[0])
            raise ValueError(f"the draft for slot {int(s[i])} is empty: a verify needs at least one row")
        if (lens > k_max).any():
            i = int(np.flatnonzero(lens > k_max)[0])
            raise ValueError(
                f"the draft for slot {int(s[i])} holds {int(lens[i])} tokens, more than k_max={k_max}"
            )


def _settle_one(k: int, n: int, n_rows: int, n_caches: int) -> tuple[int, str | None]:
    """``ServingState``'s settle for one slot: (placement row, None) or (-1, reason)."""
    reason = settle_reason(k, n, n_rows, n_caches)
    if reason is not None:
        return -1, reason
    return (n - 1 if n == k else n), None


# --------------------------------------------------------------------------------------
# the batch
# --------------------------------------------------------------------------------------
_NAME = "BatchState"



def _copy_of(field: str, doc: str) -> Any:
    """A property that reads the per-slot array ``field`` as a fresh copy, under the
    guard's check (``_checker``)."""

    def read(self: Any) -> np.ndarray:
        _checker(self)
        return getattr(self, field).copy()

    return property(read, doc=doc)

class BatchState:
    """``capacity`` request slots, each at most ``k_max`` draft tokens, all starting FREE;
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

    def __init__(self, capacity: int, k_max: int = 8, bonus: bool = False) -> None:
        g = _guard.begin_init(self, _NAME)
        c, k = check_capacity(capacity, k_max)
        bonus = bool(bonus)
        self._c = c
        self._k_max = k
        self._state = np.zeros(c, dtype=np.int8)
        self._token = np.zeros(c, dtype=np.int64)
        self._cache = np.zeros(c, dtype=np.int64)
        self._snap = np.zeros(c, dtype=np.int64)
        self._n = np.zeros(c, dtype=np.int64)
        self._dlen = np.zeros(c, dtype=np.int64)
        self._draft = np.zeros((c, k), dtype=np.int64)
        self._par = np.zeros((c, k), dtype=np.int64)   # a tree slot's parents (its tokens: _draft)
        self._tree = np.zeros(c, dtype=np.bool_)       # the slot's verify is a tree
        self._positions: list[Any] = [None] * c
        self._bonus = bonus
        self._budget = np.zeros(c, dtype=np.int64)
        self._eos = np.zeros(c, dtype=np.int64)
        self._has_eos = np.zeros(c, dtype=np.bool_)
        self._index: list[Any] = [None] * c
        g.end_init()

    # -- the guard ---------------------------------------------------------------------
    def _hold_guard(self, on: bool) -> None:
        """Tests only: ``on=True`` takes the writer flag as a transition would (refusing
        like one), ``on=False`` releases it."""
        _guard.guard_of(_own(self), _NAME).hold(on)

    @property
    def busy(self) -> bool:
        """True while a transition or ``step`` runs (any other call on the batch then
        raises RuntimeError); refuses only a batch whose ``__init__`` never completed."""
        g = _guard.guard_of(self, _NAME)
        if g.phase != _guard.READY:
            g.check()
        return bool(g.writing)

    # -- views -----------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """The number of slots."""
        _checker(self)
        return self._c

    @property
    def k_max(self) -> int:
        """The longest draft a slot may hold."""
        _checker(self)
        return self._k_max

    @property
    def bonus(self) -> bool:
        """Whether ``step`` verifies a K-token draft with K + 1 rows (see ``step``)."""
        _checker(self)
        return self._bonus

    # per-slot arrays, each read as a fresh copy
    remaining = _copy_of("_budget", "Tokens each slot may still emit in ``step`` (int64, a fresh copy).")

    states = _copy_of("_state", "State code per slot (int8, a fresh copy): FREE, PREFILL .. DONE.")

    tokens = _copy_of("_token", "``last`` / ``next`` / ``to`` per slot (int64, a fresh copy).")

    caches = _copy_of("_cache", "Cache handle per slot (int64, a fresh copy; Rollback: its snapshot).")

    accepted = _copy_of("_n", "``Accept.n`` per slot (int64, a fresh copy; 0 elsewhere).")

    draft_lens = _copy_of("_dlen", "Draft length per slot in Verify (int64, a fresh copy; 0 elsewhere).")

    def slots_in(self, state: int) -> np.ndarray:
        """The slots (ascending, int64) whose state code is ``state`` (0..6)."""
        code = check_count(state, "state")
        if code > DONE:
            raise ValueError(f"state must be a state code 0..{DONE}, got {code}")
        _checker(self)
        return np.flatnonzero(self._state == code).astype(np.int64)

    def draft(self, slot: int) -> list[int]:
        """The draft of slot ``slot`` when it is in Verify (empty elsewhere)."""
        i = _own(self)._one(slot)
        g = _reader(self)
        try:
            return self._draft[i, : self._dlen[i]].tolist()
        finally:
            g.done_read()

    def _one(self, slot: object) -> int:
        i = check_count(slot, "slot")
        _checker(self)
        if i >= self._c:
            raise IndexError(f"slot {i} is outside the batch's {self._c} slots")
        return i

    def slot_fields(self, slot: int) -> tuple[int, int, int, list[int], int, int, list[int]] | None:
        """Slot ``slot``'s fields, or None when it is FREE: ``(code, token, cache, draft,
        snapshot, accepted, positions)`` (the state code, ints, and the draft and prompt
        as lists of ints, empty where the state has none). ``specfsm.machine.batch.BatchState``
        builds its ``state_of`` value from them."""
        i = _own(self)._one(slot)
        # several fields read in turn: a reader's section, so no transition (another
        # thread) can change them between two reads
        g = _reader(self)
        try:
            code = int(self._state[i])
            if code == FREE:
                return None
            return (code, int(self._token[i]), int(self._cache[i]),
                    self._draft[i, : self._dlen[i]].tolist(), int(self._snap[i]), int(self._n[i]),
                    self._positions[i].tolist() if code == PREFILL else [])
        finally:
            g.done_read()

    def slot_tree(self, slot: int) -> tuple[list[int], list[int]] | None:
        """``(tokens, parents)`` (lists of ints) of slot ``slot``'s tree when it is in a tree
        verify (``enter_verify_tree``), else None. ``slot_fields`` reports such a slot as
        VERIFY with the tree's tokens as its draft; ``specfsm.machine.batch.BatchState``'s
        ``state_of`` gives it as a ``VerifyTree``."""
        i = _own(self)._one(slot)
        g = _reader(self)
        try:
            if not self._tree[i]:
                return None
            n = int(self._dlen[i])
            return self._draft[i, :n].tolist(), self._par[i, :n].tolist()
        finally:
            g.done_read()

    def __len__(self) -> int:
        _checker(self)
        return self._c

    def __repr__(self) -> str:
        g = _guard.guard_of(_own(self), _NAME)
        if g.phase != _guard.READY:
            return "BatchState(<not initialised>)"
        counts = np.bincount(self._state, minlength=7)
        shown = ", ".join(f"{n}={int(c)}" for n, c in zip(STATE_NAMES, counts) if c)
        return f"BatchState(capacity={self._c}, k_max={self._k_max}, {shown})"

    # -- transitions -------------------------------------------------------------------
    def admit(
        self, slots: Any, positions: Any, offsets: Any, caches: Any, *,
        max_tokens: Any = None, eos: Any = None, indexes: Any = None,
    ) -> None:
        """FREE -> Prefill (``ServingState.start``): slot ``slots[j]`` gets the prompt
        ``positions[offsets[j]:offsets[j + 1]]`` and cache handle ``caches[j]``. The
        batch refuses an empty prompt as a batching rule (ValueError; ``ServingState``
        accepts one: the design's semantics).

        For ``step``: ``max_tokens`` (one count or one per slot, at least 1; default
        unlimited) caps the tokens a slot emits, ``eos`` (None, one id or one per slot)
        stops it after that token, and ``indexes`` (one ``NgramIndex`` or ``SuffixIndex``
        of this implementation, or None, per slot; already extended with the prompt)
        drafts for it. One index drafts for one slot: an index listed twice, or held by
        a slot in Prefill, Decode or Verify, is refused (ValueError, nothing changed). A
        ``SuffixIndex`` slot is served as ``SuffixDrafter``'s session serves one request:
        it records each verified draft (``record``) and drafts at most its
        ``draft_len`` when it is ``adaptive``."""
        g = _writer(self)
        try:
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
            if any(ix is not None for ix in index_list):
                live = np.flatnonzero((self._state == PREFILL) | (self._state == DECODE) | (self._state == VERIFY))
                check_index_owners(index_list, {id(self._index[i]): i for i in live.tolist()
                                                if self._index[i] is not None})
            if b and (off[1:] == off[:-1]).any():
                j = int(np.flatnonzero(off[1:] == off[:-1])[0])
                raise ValueError(f"the prompt for slot {int(s[j])} is empty: prefill needs at least one row")
            _check_from("admit", self._state, s)
            for j, i in enumerate(s.tolist()):
                self._positions[i] = pos[off[j] : off[j + 1]].copy()
                self._index[i] = index_list[j]
            self._budget[s] = budget
            self._eos[s] = eos_ids
            self._has_eos[s] = eos is not None
            self._cache[s] = cc
            self._enter(s, PREFILL)
        finally:
            g.done_write()

    def _enter(self, s: np.ndarray, state: int) -> None:
        """Slots ``s`` into ``state`` with no token, snapshot, accepted count or draft."""
        self._state[s] = state
        self._tree[s] = False
        self._token[s] = 0
        self._snap[s] = 0
        self._n[s] = 0
        self._dlen[s] = 0

    def _advance(self, attempted: str, slots: Any, next_tokens: Any, caches: Any) -> None:
        g = _writer(self)
        try:
            s = check_slots(slots, self._c)
            t = per_slot(next_tokens, s.shape[0], "next_tokens")
            cc = per_slot(caches, s.shape[0], "caches")
            _check_from(attempted, self._state, s)
            for i in s.tolist():
                self._positions[i] = None
            self._state[s] = DECODE
            self._token[s] = t
            self._cache[s] = cc
        finally:
            g.done_write()

    def advance_prefill(self, slots: Any, next_tokens: Any, caches: Any) -> None:
        """Prefill -> Decode: slot ``slots[j]``'s prompt evaluation chose
        ``next_tokens[j]`` and left cache handle ``caches[j]``."""
        self._advance("advance_prefill", slots, next_tokens, caches)

    def advance_decode(self, slots: Any, next_tokens: Any, caches: Any) -> None:
        """Decode -> Decode: slot ``slots[j]``'s single-row evaluation chose
        ``next_tokens[j]`` and left cache handle ``caches[j]``."""
        self._advance("advance_decode", slots, next_tokens, caches)

    def enter_verify(self, slots: Any, tokens: Any, offsets: Any) -> None:
        """Decode -> Verify: slot ``slots[j]`` drafts ``tokens[offsets[j]:offsets[j + 1]]``;
        its cache handle becomes the snapshot (no copy). Refuses (ValueError) a draft
        longer than ``k_max``, and an empty draft as a batching rule (``ServingState``
        accepts one: the design's semantics)."""
        g = _writer(self)
        try:
            s = check_slots(slots, self._c)
            t, off = slot_ragged(tokens, offsets, s.shape[0], "tokens")
            _check_from("enter_verify", self._state, s)
            _check_drafts(off, s, self._k_max)
            for j, i in enumerate(s.tolist()):
                m = int(off[j + 1] - off[j])
                self._draft[i, :m] = t[off[j] : off[j + 1]]
                self._dlen[i] = m
            self._state[s] = VERIFY
            self._snap[s] = self._cache[s]
        finally:
            g.done_write()

    def enter_verify_tree(self, slots: Any, tokens: Any, parents: Any, offsets: Any) -> None:
        """Decode -> a tree verify: slot ``slots[j]`` drafts the tree of nodes
        ``offsets[j]:offsets[j + 1]`` of ``tokens`` and ``parents`` (parents local to the
        tree: -1 the root, the slot's last token, else an earlier node of the same tree;
        sibling tokens distinct); its cache handle becomes the snapshot (no copy). A tree
        holds at most ``k_max`` nodes (the batch's draft buffer holds its tokens). All or
        nothing: refuses ``IllegalTransition`` for a slot not in Decode, and ValueError
        for ``parents`` not as long as ``tokens``, an empty tree, one over ``k_max`` and
        any tree ``specfsm.tree.check_tree`` refuses (its message, after ``slot s: ``).
        ``step`` settles tree slots greedily (see ``step``)."""
        g = _writer(self)
        try:
            s = check_slots(slots, self._c)
            t, off = slot_ragged(tokens, offsets, s.shape[0], "tokens")
            p = ids64(parents, "parents")
            check_lengths(t.shape[0], p.shape[0], batch=True)
            _check_from("enter_verify_tree", self._state, s)
            for j, i in enumerate(s.tolist()):
                n = int(off[j + 1] - off[j])
                if n == 0:
                    raise ValueError(f"the tree for slot {i} is empty: a tree verify needs at least one node")
                if n > self._k_max:
                    raise ValueError(f"the tree for slot {i} holds {n} nodes, more than k_max={self._k_max}")
                try:
                    _tr.check_tree(t[off[j] : off[j + 1]], p[off[j] : off[j + 1]])
                except ValueError as e:
                    raise ValueError(f"slot {i}: {e}") from None
            for j, i in enumerate(s.tolist()):
                n = int(off[j + 1] - off[j])
                self._draft[i, :n] = t[off[j] : off[j + 1]]
                self._par[i, :n] = p[off[j] : off[j + 1]]
                self._dlen[i] = n
            self._tree[s] = True
            self._state[s] = VERIFY
            self._snap[s] = self._cache[s]
        finally:
            g.done_write()

    def accept(self, slots: Any, row_tokens: Any, row_offsets: Any, row_caches: Any, cache_offsets: Any) -> None:
        """Verify -> Accept | Rollback, as ``Verify.accept`` per slot: the accepted count is
        the common prefix of slot ``slots[j]``'s draft and its row tokens
        ``row_tokens[row_offsets[j]:row_offsets[j + 1]]``; ``row_caches[cache_offsets[j]:
        cache_offsets[j + 1]]`` holds one cache handle per draft row."""
        self._settle("accept", slots, None, row_tokens, row_offsets, row_caches, cache_offsets)

    def accept_rows(
        self, slots: Any, accepted: Any, row_tokens: Any, row_offsets: Any, row_caches: Any, cache_offsets: Any
    ) -> None:
        """``accept`` with slot ``slots[j]``'s accepted count ``accepted[j]`` supplied
        (``Verify.accept_rows``); ``row_tokens``/``row_offsets`` and
        ``row_caches``/``cache_offsets`` as in ``accept``."""
        self._settle("accept_rows", slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets)

    def _settle(self, attempted: str, slots: Any, accepted: Any, row_tokens: Any, row_offsets: Any,
                row_caches: Any, cache_offsets: Any) -> None:
        g = _writer(self)
        try:
            self._settle_held(attempted, slots, accepted, row_tokens, row_offsets, row_caches, cache_offsets)
        finally:
            g.done_write()

    def _settle_held(self, attempted: str, slots: Any, accepted: Any, row_tokens: Any, row_offsets: Any,
                     row_caches: Any, cache_offsets: Any) -> None:
        s = check_slots(slots, self._c)
        b = s.shape[0]
        acc = None if accepted is None else per_slot(accepted, b, "accepted")
        rt, roff = slot_ragged(row_tokens, row_offsets, b, "row_tokens")
        rc, coff = slot_ragged(row_caches, cache_offsets, b, "row_caches")
        if acc is not None and b and acc.min() < 0:
            j = int(np.flatnonzero(acc < 0)[0])
            raise ValueError(f"accepted must be non-negative, got {int(acc[j])} for slot {int(s[j])}")
        bad: list[int] = []
        bad_states: list[int] = []
        reasons: list[str] = []
        plan: list[tuple[int, int, int, int, int]] = []
        for j, i in enumerate(s.tolist()):
            code = int(self._state[i])
            if code != VERIFY:
                bad.append(i)
                bad_states.append(code)
                reasons.append("")
                continue
            if self._tree[i]:
                bad.append(i)
                bad_states.append(code)
                reasons.append(TREE_SETTLE)
                continue
            k = int(self._dlen[i])
            rows = rt[roff[j] : roff[j + 1]]
            if acc is None:
                d = self._draft[i, :k]
                m = min(k, rows.shape[0])
                neq = np.flatnonzero(d[:m] != rows[:m])
                n = int(neq[0]) if neq.shape[0] else m
            else:
                n = int(acc[j])
            idx, why = _settle_one(k, n, rows.shape[0], int(coff[j + 1] - coff[j]))
            if why is not None:
                bad.append(i)
                bad_states.append(code)
                reasons.append(why)
                continue
            plan.append((j, i, k, n, idx))
        if bad:
            raise illegal(attempted, bad, bad_states, reasons)
        for j, i, k, n, idx in plan:
            cache = int(rc[coff[j] + idx])
            if n == k:
                self._state[i] = ACCEPT
                self._n[i] = n
                self._token[i] = self._draft[i, k - 1]
            else:
                self._state[i] = ROLLBACK
                self._n[i] = 0
                self._token[i] = rt[roff[j] + n]
            self._cache[i] = cache
            self._dlen[i] = 0
            self._snap[i] = 0

    def resume(self, slots: Any) -> None:
        """Accept -> Decode for every slot in ``slots``: decoding resumes from ``next``
        with the placed cache."""
        g = _writer(self)
        try:
            s = check_slots(slots, self._c)
            _check_from("resume", self._state, s)
            self._state[s] = DECODE
            self._n[s] = 0
        finally:
            g.done_write()

    def rollback(self, slots: Any) -> None:
        """Rollback -> Decode for every slot in ``slots``: decoding resumes from ``to``
        with the snapshot."""
        g = _writer(self)
        try:
            s = check_slots(slots, self._c)
            _check_from("rollback", self._state, s)
            self._state[s] = DECODE
        finally:
            g.done_write()

    def finish(self, slots: Any) -> None:
        """Any state but FREE -> Done for every slot in ``slots`` (Rollback keeps its
        snapshot as the cache)."""
        g = _writer(self)
        try:
            s = check_slots(slots, self._c)
            _check_from("finish", self._state, s)
            for i in s.tolist():
                self._positions[i] = None
            self._enter(s, DONE)
        finally:
            g.done_write()

    def release(self, slots: Any) -> None:
        """Done -> FREE for every slot in ``slots``: the slot can be admitted again."""
        g = _writer(self)
        try:
            s = check_slots(slots, self._c)
            _check_from("release", self._state, s)
            for i in s.tolist():
                self._index[i] = None
            self._state[s] = FREE
            self._cache[s] = 0
            self._budget[s] = 0
        finally:
            g.done_write()

    # -- the fused step ------------------------------------------------------------------
    def _layout(self) -> tuple[np.ndarray, np.ndarray]:
        st = self._state
        act = np.flatnonzero((st == PREFILL) | (st == DECODE) | (st == VERIFY)).astype(np.int64)
        lens = np.ones(act.shape[0], dtype=np.int64)
        codes = st[act]
        v = codes == VERIFY
        lens[v] = self._dlen[act[v]] + (1 if self._bonus else 0)
        lens[v & self._tree[act]] = self._dlen[act[v & self._tree[act]]] + 1   # a tree: root + N
        for j in np.flatnonzero(codes == PREFILL).tolist():
            lens[j] = self._positions[int(act[j])].shape[0]
        off = np.zeros(act.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        return act, off

    def pending(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slots, inputs, offsets)``: the evaluation ``step`` expects rows for (no
        parameters; fresh arrays). Slot ``slots[j]`` (every slot in Prefill, Decode or
        Verify, ascending) evaluates ``inputs[offsets[j]:offsets[j + 1]]``: its prompt,
        ``[last]``, or for a K-token draft ``[last, draft[0], ..., draft[K - 2]]`` (with
        ``bonus``: ``..., draft[K - 1]``). A reader: refused while a transition or
        ``step`` runs, and it holds them off while it runs.
        """
        g = _guard.guard_of(_own(self), _NAME)
        g.read()
        try:
            act, off = self._layout()
            inputs = np.empty(int(off[-1]), dtype=np.int64)
            for j, i in enumerate(act.tolist()):
                a, code = int(off[j]), int(self._state[i])
                if code == PREFILL:
                    inputs[a : int(off[j + 1])] = self._positions[i]
                else:
                    inputs[a] = self._token[i]
                    if code == VERIFY:
                        m = int(off[j + 1]) - a - 1
                        inputs[a + 1 : a + 1 + m] = self._draft[i, :m]
            return act, inputs, off
        finally:
            g.done_read()

    def pending_trees(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slots, parents, offsets)`` of the slots in a tree verify (ascending; fresh
        int64 arrays): slot ``slots[j]``'s parents are ``parents[offsets[j]:offsets[j +
        1]]``, node i's parent (-1 the root) for its N rows after the root in
        ``pending()``'s layout (row 0 the root's, row i + 1 node i's), so a target can
        build its attention mask (each node attending to the context and its ancestors)
        and its position ids (the node's depth). A reader, as ``pending``."""
        g = _guard.guard_of(_own(self), _NAME)
        g.read()
        try:
            st = self._state
            ts = np.flatnonzero((st == VERIFY) & self._tree).astype(np.int64)
            lens = self._dlen[ts]
            off = np.zeros(ts.shape[0] + 1, dtype=np.int64)
            np.cumsum(lens, out=off[1:])
            par = np.empty(int(off[-1]), dtype=np.int64)
            for j, i in enumerate(ts.tolist()):
                par[int(off[j]) : int(off[j + 1])] = self._par[i, : int(lens[j])]
            return ts, par, off
        finally:
            g.done_read()

    def step(self, row_tokens: Any, *, probs: Any = None, rule: Any = None, draft_probs: Any = None) -> StepResult:
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
        rows that do not match the layout, a negative token in a row whose token it
        would emit (the target's token at a rejected draft token or the bonus row, a
        tree's settle row, a prefill's last row, a decode's row: ValueError naming the
        row; other rows, and those a budget or eos cuts, may hold filler such as -1),
        probabilities the rule refuses, a rule that
        raises or puts a count outside ``[0, K]`` (``IllegalTransition("accept_rows")``)
        and an index in use by another call (RuntimeError); the same step can then be
        retried. (Left open: another
        thread taking an index between the step's updates of its n-gram and its suffix
        indexes, or, on the pure-Python twin, between an index's extend and its propose;
        the step then refuses with the batch unchanged but the indexes already updated
        keep the step's tokens.) A rule callback that calls back into the batch is refused
        (RuntimeError) like any call during the step.

        A slot in a tree verify (``enter_verify_tree``) settles greedily, as
        ``VerifyTree.accept`` then ``resume``/``rollback``: it emits the accepted path's
        tokens and the target's token at the settle row (the last accepted node's, row 0
        when none), resumes from that row, reports ``accepted`` = the path's length,
        ``drafted`` = its N nodes and ``rolled_back`` when the path stopped before a leaf;
        its index is extended as a decode's, and it drafts a chain next. While a tree
        slot is pending, ``rule``, ``probs`` and ``draft_probs`` are refused (ValueError,
        nothing changed).
        """
        g = _writer(self)
        try:
            return run_step(self, row_tokens, probs, rule, draft_probs)
        finally:
            g.done_write()


def _own(obj: Any) -> BatchState:
    """A method's ``self``, refused (TypeError) unless it is a ``BatchState``: a method
    called unbound (``BatchState.step(obj, ...)``) gets any object, as the compiled
    class's does."""
    if not isinstance(obj, BatchState):
        raise TypeError(f"a method of BatchState needs a BatchState, got {type(obj).__module__}.{type(obj).__name__}")
    return obj


def _checker(b: Any) -> None:
    _guard.guard_of(_own(b), _NAME).check()


def _reader(b: Any) -> _guard.Guard:
    g = _guard.guard_of(_own(b), _NAME)
    g.read()
    return g


def _writer(b: Any) -> _guard.Guard:
    g = _guard.guard_of(_own(b), _NAME)
    g.write()
    return g
