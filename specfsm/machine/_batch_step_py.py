"""The twin batch's fused serving step (``BatchState.step``) and its ``StepResult``.

One step for every slot in Prefill, Decode or Verify: the accepted counts by the rule
(greedy exact, ``MinRun``, the probability rules' batch kernels, any rule's
``accepted_rows``), emission with budgets and eos, the index policy per index kind
(``serve_batch`` of the slots' index module: record the verified draft, extend by what
the slot emitted, propose the next draft), then the commit. Everything that can refuse
runs before the batch changes (all or nothing); see ``specfsm._core.batch`` for the
compiled step with the same behaviour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._checks import check_count, int64_ids
from ._checks import (
    DECODE,
    DONE,
    PREFILL,
    VERIFY,
    illegal,
    negative_row,
    resume_index as chk_resume_index,
    settle_reason,
)
from ..accept._checks import R_MINRUN, R_OTHER, R_SPEC, R_TYPICAL, rule_kind, step_probs
from ..drafting import _ngram_index_py as _ni
from ..drafting import _suffix_index_py as _si

if TYPE_CHECKING:
    from ._batch_py import BatchState

__all__ = ["StepResult", "run_step", "TREE_SETTLE", "tree_rule_refusal"]

#: why ``accept``/``accept_rows`` refuse a slot in a tree verify (``step`` settles it)
TREE_SETTLE = "the slot is in a tree verify, which step settles (greedy)"


def tree_rule_refusal(slot: int) -> ValueError:
    """``step`` given a rule or probabilities while slot ``slot`` (the first) is in a tree
    verify: trees settle greedily only."""
    return ValueError(
        f"slot {slot} is in a tree verify, which settles greedily only: step takes no rule, "
        "probs or draft_probs while a tree verify is pending"
    )


def _tree_walk(t: list[int], p: list[int], rows: list[int]) -> tuple[list[int], bool]:
    """The accepted path of a tree (``t``, ``p``: its N nodes) for its N + 1 rows, and
    whether its last node (the root when the path is empty) has children. Children come
    after their parent, so one pass in index order visits every child of the current
    node after it: the one whose token is the target's choice there is the next node."""
    path: list[int] = []
    cur, want, more = -1, rows[0], False
    for c in range(len(t)):
        if p[c] == cur:
            if t[c] == want:
                path.append(c)
                cur, want, more = c, rows[c + 1], False
            else:
                more = True
    return path, more


class StepResult:
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

    __slots__ = ("slots", "emitted", "emitted_offsets", "accepted", "drafted", "resume_rows",
                 "finished", "drafts", "draft_offsets", "rolled_back")
    slots: np.ndarray
    emitted: np.ndarray
    emitted_offsets: np.ndarray
    accepted: np.ndarray
    drafted: np.ndarray
    resume_rows: np.ndarray
    finished: np.ndarray
    drafts: np.ndarray
    draft_offsets: np.ndarray
    rolled_back: np.ndarray

    def __init__(self, slots: np.ndarray, emitted: np.ndarray, emitted_offsets: np.ndarray,
                 accepted: np.ndarray, drafted: np.ndarray, resume_rows: np.ndarray,
                 finished: np.ndarray, drafts: np.ndarray, draft_offsets: np.ndarray,
                 rolled_back: np.ndarray) -> None:
        for name, value in zip(self.__slots__, (slots, emitted, emitted_offsets, accepted, drafted,
                                                resume_rows, finished, drafts, draft_offsets,
                                                rolled_back)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"StepResult is read-only: cannot set {name!r}")

    def emitted_by_slot(self) -> dict[int, list[int]]:
        """``{slot: the tokens it emitted}`` for every slot of the step (no parameters)."""
        _result_self(self)
        e, o = self.emitted.tolist(), self.emitted_offsets.tolist()
        return {int(s): e[o[j] : o[j + 1]] for j, s in enumerate(self.slots.tolist())}

    def resume_index(self, capacity: int) -> np.ndarray:
        """``resume_rows`` scattered into capacity order: entry ``s`` is slot ``s``'s
        resume row, -1 for a slot this step did not evaluate (``capacity`` entries, a
        fresh int64 array). It is the ``index`` for ``specfsm.gpu.place_rows`` over
        per-row states ordered ``[capacity, R, ...]`` (``place_rows`` skips the -1
        slots). Refuses (ValueError) a ``capacity`` that does not cover the step's slots."""
        _result_self(self)
        return chk_resume_index(self.slots, self.resume_rows, capacity)

    def __repr__(self) -> str:
        return (f"StepResult(slots={len(self.slots)}, emitted={len(self.emitted)}, "
                f"finished={len(self.finished)}, drafts={len(self.drafts)})")



def _result_self(obj: Any) -> None:
    """A method's ``self``, refused (TypeError) unless it is a ``StepResult`` (a method
    called unbound), as the compiled class's is."""
    if not isinstance(obj, StepResult):
        raise TypeError(f"a method of StepResult needs a StepResult, got {type(obj).__module__}.{type(obj).__name__}")


def run_step(b: BatchState, row_tokens: Any, probs: Any, rule: Any, draft_probs: Any) -> StepResult:
    """``b.step(row_tokens, probs=..., rule=..., draft_probs=...)`` with ``b``'s writer
    guard held by the caller: the accepted counts, then each slot's emission and next
    state, then the indexes' update and next drafts, all computed aside; the batch is
    changed only once nothing can refuse any more."""
    kind, m = rule_kind(rule)
    act, off = b._layout()
    trees = b._tree[act] & (b._state[act] == VERIFY)
    if trees.any() and (rule is not None or probs is not None or draft_probs is not None):
        raise tree_rule_refusal(int(act[int(np.flatnonzero(trees)[0])]))
    rows = int64_ids(row_tokens, "row_tokens")
    total = int(off[-1])
    if rows.shape[0] != total:
        raise ValueError(f"row_tokens holds {rows.shape[0]} rows; this step evaluates {total}")
    codes = b._state[act].copy()
    vj = np.flatnonzero(codes == VERIFY)
    if kind in (R_SPEC, R_TYPICAL) and vj.shape[0]:
        acc, repl = _sampled_counts(b, act, off, vj, kind, rule, step_probs(probs, total), draft_probs)
    else:
        acc, repl = _matched_counts(b, act, off, vj, trees, rows, kind, m, rule), None
    e = _emit(b, act, off, codes, trees, rows, acc, repl)
    by_j = _next_drafts(b, act, trees, e)
    return _commit(b, act, codes, acc, e, by_j)


def _sampled_counts(b: BatchState, act: np.ndarray, off: np.ndarray, vj: np.ndarray, kind: int, rule: Any,
                    p: np.ndarray, draft_probs: Any) -> tuple[np.ndarray, np.ndarray]:
    """A sampling rule's accepted count and replacement token for every verifying slot
    (positions ``vj`` of the step's slots), from its batched kernel."""
    a = act.shape[0]
    ks = b._dlen[act[vj]]
    doff = np.zeros(vj.shape[0] + 1, dtype=np.int64)
    np.cumsum(ks, out=doff[1:])
    dflat = np.concatenate([b._draft[int(act[j]), : int(k)] for j, k in zip(vj, ks)])
    ridx = np.concatenate([np.arange(int(off[j]), int(off[j]) + int(k)) for j, k in zip(vj, ks)])
    # the draft rows are every row (all verifying, K rows each): no copy of them
    vrows = p if ridx.shape[0] == p.shape[0] else p[ridx]
    if kind == R_SPEC:
        out, an = rule.sample_batch(dflat, doff, vrows, draft_probs)
    else:
        out, an = rule.accept_batch(dflat, doff, vrows)
    an = np.asarray(an, dtype=np.int64)
    if an.shape != ks.shape or (an < 0).any() or (an > ks).any():
        raise RuntimeError("the acceptance kernel returned counts outside [0, K]")
    acc = np.zeros(a, dtype=np.int64)
    acc[vj] = an
    repl = np.full(a, 0, dtype=np.int64)
    repl[vj] = np.asarray(out)[np.arange(vj.shape[0]), np.minimum(an, ks)]
    return acc, repl


def _matched_counts(b: BatchState, act: np.ndarray, off: np.ndarray, vj: np.ndarray, trees: np.ndarray,
                    rows: np.ndarray, kind: int, m: int, rule: Any) -> np.ndarray:
    """Every chain verify's accepted count by a rule that compares tokens (greedy exact,
    ``MinRun``, a caller's ``accepted_rows``); a tree verify is settled by ``_emit``."""
    acc = np.zeros(act.shape[0], dtype=np.int64)
    for j in vj.tolist():
        if trees[j]:
            continue
        i = int(act[j])
        k = int(b._dlen[i])
        d = b._draft[i, :k]
        r = rows[int(off[j]) : int(off[j]) + k]
        if kind == R_OTHER:
            n = check_count(rule.accepted_rows(d.tolist(), r.tolist()), "accepted")
            if n > k:
                raise illegal("accept_rows", [i], [VERIFY], [settle_reason(k, n, k, k) or ""])
        else:
            neq = np.flatnonzero(d != r)
            n = int(neq[0]) if neq.shape[0] else k
            if kind == R_MINRUN and n < m:
                n = 0
        acc[j] = n
    return acc


class _Emission(NamedTuple):
    """What the step's slots emit and become, computed before anything changes."""

    emitted: np.ndarray       # every slot's emitted tokens, back to back
    offsets: np.ndarray       # slot j's are emitted[offsets[j]:offsets[j + 1]]
    drafted: np.ndarray
    resume: np.ndarray
    rolled: np.ndarray
    state: np.ndarray         # the next state of each slot (DECODE or DONE)
    token: np.ndarray         # the token a live slot resumes from
    budget: np.ndarray        # what each slot may still emit
    finished: list[int]


def _emit(b: BatchState, act: np.ndarray, off: np.ndarray, codes: np.ndarray, trees: np.ndarray,
          rows: np.ndarray, acc: np.ndarray, repl: np.ndarray | None) -> _Emission:
    """Each slot's emission (cut at its budget and after its eos), resume row, rollback
    and next state; a tree verify settles here (its path's length into ``acc``)."""
    a = act.shape[0]
    bonus = 1 if b._bonus else 0
    emitted: list[int] = []
    e = _Emission(np.empty(0, dtype=np.int64), np.zeros(a + 1, dtype=np.int64), np.zeros(a, dtype=np.int64),
                  np.zeros(a, dtype=np.int64), np.zeros(a, dtype=np.bool_), np.zeros(a, dtype=np.int8),
                  np.zeros(a, dtype=np.int64), np.zeros(a, dtype=np.int64), [])
    for j in range(a):
        i = int(act[j])
        code = int(codes[j])
        r0, r1 = int(off[j]), int(off[j + 1])
        if code == VERIFY and trees[j]:
            k = int(b._dlen[i])
            tl = b._draft[i, :k].tolist()
            path, more = _tree_walk(tl, b._par[i, :k].tolist(), rows[r0:r1].tolist())
            row = path[-1] + 1 if path else 0
            out = [tl[c] for c in path] + [int(rows[r0 + row])]
            rowof = [-1] * len(path) + [row]     # the path's tokens are the tree's
            acc[j] = len(path)
            e.resume[j] = row
            e.rolled[j] = more              # the path stopped short of a leaf
            e.drafted[j] = k
        elif code == VERIFY:
            k = int(b._dlen[i])
            n = int(acc[j])
            d = b._draft[i, :k].tolist()
            if n == k:
                out = d + [int(rows[r0 + k])] if bonus else d
                e.resume[j] = k - 1 + bonus
            else:
                t = int(repl[j]) if repl is not None else int(rows[r0 + n])
                out = d[:n] + [t]
                e.resume[j] = n
                e.rolled[j] = True          # settled through Rollback
            # the accepted tokens are the draft's; a target row gives the replaced or bonus one
            rowof = [-1] * n + ([] if repl is not None and n < k else [n])
            e.drafted[j] = k
        else:
            out = [int(rows[r1 - 1])]
            rowof = [r1 - 1 - r0]
            e.resume[j] = r1 - 1 - r0      # a prefill's last prompt row, a decode's row 0
        out, stop = _cut(b, i, out)
        bad = [rowof[q] for q in range(len(out)) if q < len(rowof) and rowof[q] >= 0 and out[q] < 0]
        if bad:
            raise negative_row(rows, r0 + bad[0], act, off)   # a negative token it would emit
        e.budget[j] = int(b._budget[i]) - len(out)
        # a live slot resumes from its last emitted token (a cut emission stops it)
        e.token[j] = 0 if stop else out[-1]
        e.state[j] = DONE if stop else DECODE
        if stop:
            e.finished.append(i)
        emitted += out
        e.offsets[j + 1] = len(emitted)
    return e._replace(emitted=np.asarray(emitted, dtype=np.int64))


def _cut(b: BatchState, i: int, out: list[int]) -> tuple[list[int], bool]:
    """Slot ``i``'s emission cut at its budget and after its end token, and whether
    that ends the slot."""
    room = int(b._budget[i])
    stop = len(out) >= room
    out = out[:room]
    if b._has_eos[i]:
        e = int(b._eos[i])
        if e in out:
            out = out[: out.index(e) + 1]
            stop = True
    return out, stop


def _next_drafts(b: BatchState, act: np.ndarray, trees: np.ndarray, e: _Emission) -> dict[int, np.ndarray]:
    """The indexes of the slots that stay live, extended by what they emitted, and their
    next drafts (by position in the step); every refusal comes before any index
    changes (each module's batch calls are all or nothing)."""
    live = [j for j in range(act.shape[0]) if e.state[j] == DECODE]
    with_ix = [j for j in live if b._index[int(act[j])] is not None]
    groups = [g for g in ([j for j in with_ix if isinstance(b._index[int(act[j])], _ni.NgramIndex)],
                          [j for j in with_ix if not isinstance(b._index[int(act[j])], _ni.NgramIndex)])
              if g]
    if len(groups) == 2:
        # two module calls: what would refuse the second is checked before the first
        later = [b._index[int(act[j])] for j in groups[1]]
        _check_distinct(later)
        _si.propose_batch(later, 0)       # refuses an index in use, changes nothing
    em, eoff = e.emitted, e.offsets
    by_j: dict[int, np.ndarray] = {}
    for group in groups:
        index_list = [b._index[int(act[j])] for j in group]
        toks = np.concatenate([em[int(eoff[j]) : int(eoff[j + 1])] for j in group])
        loff = np.zeros(len(group) + 1, dtype=np.int64)
        np.cumsum([int(eoff[j + 1] - eoff[j]) for j in group], out=loff[1:])
        limits = np.minimum(e.budget[group], b._k_max)
        # a tree slot verified no chain: its index records nothing for it (drafted 0)
        verified = np.where(trees[group], 0, e.drafted[group])
        dflat, doff, dlens = _serve(index_list, toks, loff, verified, limits,
                                    b._draft[act[group]], em, eoff[group], eoff[[j + 1 for j in group]])
        dflat = np.asarray(dflat, dtype=np.int64)
        for q, j in enumerate(group):
            d = dflat[int(doff[q]) : int(doff[q]) + int(dlens[q])]
            if d.shape[0] > min(b._k_max, int(e.budget[j])):
                raise RuntimeError(
                    f"the index module returned a draft of {d.shape[0]} tokens for "
                    f"k_max={b._k_max}")
            by_j[j] = d
    return by_j


def _commit(b: BatchState, act: np.ndarray, codes: np.ndarray, acc: np.ndarray, e: _Emission,
            by_j: dict[int, np.ndarray]) -> StepResult:
    """The step written into the batch (nothing here can refuse) and its result."""
    a = act.shape[0]
    dr_off = np.zeros(a + 1, dtype=np.int64)
    lens = np.zeros(a, dtype=np.int64)
    for j, d in by_j.items():
        lens[j] = d.shape[0]
    np.cumsum(lens, out=dr_off[1:])
    drafts = np.zeros(int(dr_off[a]), dtype=np.int64)
    for j in range(a):
        i = int(act[j])
        if codes[j] == VERIFY:
            b._dlen[i] = 0
            b._snap[i] = 0
            b._tree[i] = False
        elif codes[j] == PREFILL:
            b._positions[i] = None
    b._budget[act] = e.budget
    b._token[act] = e.token
    b._state[act] = e.state
    for j, d in by_j.items():
        ln = d.shape[0]
        if ln:
            i = int(act[j])
            drafts[int(dr_off[j]) : int(dr_off[j]) + ln] = d
            b._draft[i, :ln] = d
            b._dlen[i] = ln
            b._state[i] = VERIFY
            b._snap[i] = b._cache[i]
    return StepResult(act, e.emitted, e.offsets, acc, e.drafted, e.resume,
                      np.asarray(e.finished, dtype=np.int64), drafts, dr_off, e.rolled)


def _check_distinct(index_list: list[Any]) -> None:
    """ValueError when one index is listed for two live slots (the batch step's check,
    made before any index changes)."""
    seen: dict[int, int] = {}
    for q, ix in enumerate(index_list):
        if seen.setdefault(id(ix), q) != q:
            raise ValueError(
                f"indexes[{q}] appears twice in the batch; a batch call takes each index once"
            )


def _serve(index_list: list[Any], tokens: np.ndarray, offsets: np.ndarray, drafted: np.ndarray,
           limits: np.ndarray, drafts: np.ndarray, emitted: np.ndarray,
           starts: np.ndarray, ends: np.ndarray) -> tuple[Any, Any, Any]:
    """One index kind's serving-step policy (the index module's ``serve_batch``) for the
    live slots of one step. What it records for a verified draft is what the drafter
    session records: the draft's agreement (``drafts[q]``, the slot's rows of the batch's
    draft buffer) with what the slot emitted (``emitted[starts[q]:ends[q]]``), as the
    compiled step does; the rule's accepted count differs from it only where a rule
    rejects a matching prefix (MinRun) or a budget or eos cut the emission. Returns
    ``propose_batch``'s ``(drafts, offsets, lengths)``."""
    mod = _ni if isinstance(index_list[0], _ni.NgramIndex) else _si
    agree = np.zeros(len(index_list), dtype=np.int64)
    for q in range(len(index_list)):
        d = drafts[q, : int(drafted[q])]
        e = emitted[int(starts[q]) : int(ends[q])][: d.shape[0]]
        neq = np.flatnonzero(d[: e.shape[0]] != e)
        agree[q] = int(neq[0]) if neq.shape[0] else e.shape[0]
    return mod.serve_batch(index_list, tokens, offsets, drafted, agree, limits)
