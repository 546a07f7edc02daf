"""B requests per serving step: the batched state machine and the fused step.

``BatchState(capacity, k_max=8, bonus=False)`` holds ``capacity`` request slots as
arrays (state code, last token, cache handle, draft, accepted count, budget). Its
transitions (``admit``, ``advance_prefill``, ``advance_decode``, ``enter_verify``,
``accept``, ``accept_rows``, ``resume``, ``rollback``, ``finish``, ``release``) take
``slots`` and one entry per slot (ragged tokens as a flat array plus offsets) and apply
``ServingState``'s transition to each slot; an illegal transition for any slot
refuses the whole call with ``IllegalTransition`` (``err.slots``, ``err.states``) and
changes nothing. Cache handles are int64 (a row index, a block-table id).

``pending()`` says what the target must evaluate for the next step and ``step(rows,
rule=..., probs=...)`` does the rest of a serving step in one call: acceptance (greedy
exact, ``MinRun``, ``SpeculativeSampling``, ``TypicalAcceptance`` or any rule with
``accepted_rows``), settle and the transitions, budgets and eos, the index update
(an ``NgramIndex`` or a ``SuffixIndex`` per slot, or none), the placement rows and the
next drafts; it returns a ``StepResult`` of arrays. A step is all or nothing: when it
refuses (rows that do not match, a rule that raises, an index listed twice or in use
elsewhere) neither the batch nor any index has changed, and the same step can be
retried.

Tree slots: ``enter_verify_tree(slots, tokens, parents, offsets)`` puts Decode
slots into a tree verify (ragged trees of at most ``k_max`` nodes, checked as
``specfsm.tree.check_tree`` checks them); ``pending()`` lays a tree out as N + 1 rows (root,
then the nodes), ``pending_trees()`` gives their parents for the target's mask, and
``step`` settles them greedily as ``VerifyTree.accept`` does (the bonus-row convention,
``drafted`` = N, ``rolled_back`` when the path stops before a leaf; a rule or probabilities
are refused while a tree is pending). ``state_of`` gives such a slot as a ``VerifyTree``.
See docs/batch.md.

Placement: ``StepResult.resume_rows[j]`` is the row, within slot ``slots[j]``'s own rows
of ``pending()``'s layout, whose cache that slot resumes from (a prefill's last prompt
row, a decode's row 0, a verify's settle row), in ``slots`` order; for
``specfsm.gpu.place_rows(src, index, dst)`` over per-slot states in capacity order pass
``index=result.resume_index(capacity)`` (-1, skipped, for the slots the step did not
evaluate). ``resume_rows`` itself is the right ``index`` only when every slot was
evaluated; otherwise ``place_rows`` refuses it for its length.

Safety: one guard (``_core/common/_guard.pxd`` and its twin) covers every call: a transition or
``step`` holds it as a writer for its whole duration, ``pending`` as a reader, so any
other call meanwhile (another thread, a rule callback, an ``__index__`` of an argument)
raises RuntimeError and changes nothing; a second ``__init__`` is refused and an
object whose ``__init__`` never completed refuses every call. The arrays the batch
exposes (``states``, ``tokens``, ``caches``, ``accepted``, ``draft_lens``,
``remaining``) are fresh copies (a few hundred bytes: well under a microsecond each). On the compiled core each index kind's serving-step policy (record
the verified draft's agreement, extend by what the slot emitted, propose the next draft)
runs through its index module's C entry on the step's own buffers (``ngram_serve``, one
pass without the GIL; ``suffix_serve``), as ``SuffixDrafter``'s and ``NgramDrafter``'s
sessions serve one request; the twin calls each module's ``serve_batch``.

The default verify has K rows for a K-token draft (``ServingState``'s convention: a fully
accepted draft emits its K tokens and resumes from the last). ``bonus=True`` verifies
with K + 1 rows, the last following the whole draft, so a fully accepted draft emits
K + 1 tokens, as vLLM and transformers do.

``StepResult.rolled_back[j]`` (bool, in ``slots`` order) says whether slot ``slots[j]``'s
verify settled through Rollback (the rule accepted fewer than its K draft tokens; with
``MinRun`` also a matching prefix shorter than the minimum): False for prefills, decodes
and fully accepted drafts (``bonus`` included), unchanged by a ``max_tokens`` or ``eos``
cut of the emission, and equal to ``accepted < drafted`` entry by entry (a verify settles
through Accept exactly when all K >= 1 draft tokens are accepted).

Every array of a ``StepResult`` is the caller's: fresh memory that step allocated
(or a shared read-only empty array), never a view of the batch's own buffers, so a
later step cannot overwrite an earlier result and the caller may keep or modify it.
(The compiled step computes on the batch's own scratch and allocates only these
arrays, ten small ones; reusing buffers for them too would save well under 1 µs, not
worth a result that silently changes under its holder.)

Runs on the compiled core (``specfsm._core.batch``: transitions and the step's settle
loop without the GIL) or on its pure-Python twin (``specfsm.machine._batch_py``). The kernels
give a slot's fields as codes and ints (``slot_fields``); this module's ``BatchState``,
a subclass of the active kernel class, builds the ``specfsm.machine.state`` value from them
(``state_of``), so nothing below the public layer knows the state classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _impl
from ._checks import ACCEPT, DECODE, DONE, FREE, PREFILL, ROLLBACK, STATE_NAMES, VERIFY
from .state import Accept, Decode, Done, Prefill, Rollback, ServingState, Verify, VerifyTree

if TYPE_CHECKING:  # type checkers read the twin
    from . import _batch_py as _active
else:
    _active = _impl.load("batch")

__all__ = [
    "BatchState",
    "StepResult",
    "FREE",
    "PREFILL",
    "DECODE",
    "VERIFY",
    "ACCEPT",
    "ROLLBACK",
    "DONE",
    "STATE_NAMES",
]

StepResult = _active.StepResult


def state_value(fields: tuple[int, int, int, list[int], int, int, list[int]] | None) -> ServingState[Any, Any] | None:
    """The ``specfsm.machine.state`` value of one slot from its ``slot_fields`` (None: FREE)."""
    if fields is None:
        return None
    code, token, cache, draft, snapshot, accepted, positions = fields
    if code == PREFILL:
        return Prefill(positions, cache)
    if code == DECODE:
        return Decode(token, cache)
    if code == VERIFY:
        return Verify(draft, snapshot, cache)
    if code == ACCEPT:
        return Accept(accepted, token, cache)
    if code == ROLLBACK:
        return Rollback(cache, token)
    return Done(cache)


class BatchState(_active.BatchState):
    __doc__ = _active.BatchState.__doc__   # the kernels' own text (help() shows it)
    __slots__ = ()

    def state_of(self, slot: int) -> ServingState[Any, Any] | None:
        """Slot ``slot`` as a ``specfsm.machine.state`` value (tokens and caches as ints), or None
        when it is FREE; a slot in a tree verify as a ``VerifyTree``."""
        fields = self.slot_fields(slot)
        if fields is not None and fields[0] == VERIFY:
            tree = self.slot_tree(slot)
            if tree is not None:
                return VerifyTree(tree[0], tree[1], fields[4], fields[2])
        return state_value(fields)
