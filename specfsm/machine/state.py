"""The serving state machine: which evaluation shape is legal right now.

``ServingState`` is the base of six immutable variants (the design's), and of
``VerifyTree``, a tree verify beside the design's chain verify. Each transition is a method on
every state: it returns a new state, never changes the one it was called on, and raises
``IllegalTransition`` from a state it does not apply to. The semantics follow, one for one,
the Rust design specfsm was ported from (an enum ``ServingState<Entry, Cache>`` whose
transitions consume ``self``).

``ServingState[Entry, Cache]`` is generic, for type checkers only: ``Entry`` is the token
type (``positions`` and ``draft`` are sequences of it; ``last``, ``next`` and ``to`` are
one), ``Cache`` is the cache handle's type (a length, a block table, a tensor row...).
Nothing is checked at run time beyond what the docstrings say.

The kernels (``common_prefix``, ``settle``) are the active implementation's, bound at
import (``specfsm._impl``).

As in the design, ``start`` takes any positions, none included, and ``enter_verify`` any
draft, the empty one included; ``accept`` and ``accept_rows`` on a ``Verify`` with an empty
draft refuse with ``IllegalTransition`` and leave it intact (``finish`` still leaves it).
``BatchState`` refuses an empty prompt or draft as a batching rule, and the replay CLI
and the JSONL reader refuse an empty prompt as bad input.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from .. import _impl
from ..accept.rules import select_rows
from .._checks import check_count, entries, token_ids
from ._checks import settle_reason
from .tree_state import settle_tree, tree_fields, tree_path
from .._values import IMMUTABLE, Clone, default_clone, hash_key, seq_eq, value_eq
from ..errors import IllegalTransition

__all__ = ["ServingState", "Prefill", "Decode", "Verify", "VerifyTree", "Accept", "Rollback", "Done"]

Entry = TypeVar("Entry")
Cache = TypeVar("Cache")

_set = object.__setattr__
_common_prefix = _impl.load("prefix").common_prefix
_settle = _impl.load("settle").settle


def _length(x: object, name: str) -> int:
    try:
        return len(x)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be a sized sequence, got {type(x).__name__}") from None


class ServingState(Generic[Entry, Cache]):
    """Base of the six states; every transition is defined here and refused by default.

    Construct a machine with ``ServingState.start(positions, cache)``. Generic in the token
    type ``Entry`` and the cache handle type ``Cache`` (for type checkers; no run-time cost).
    """

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _seq_fields: ClassVar[frozenset[str]] = frozenset()

    # -- entry ---------------------------------------------------------------------
    @staticmethod
    def start(positions: Sequence[Entry], cache: Cache) -> Prefill[Entry, Cache]:
        """Enter the state machine at ``Prefill`` with an empty ``cache``.

        ``positions`` may be any token sequence, the empty one included (the design's
        ``start`` takes any ``Vec``: a caller whose first evaluation produces the first
        entry starts from none); anything that is not a sequence raises TypeError.
        """
        return Prefill(positions, cache)

    # -- transitions (refused unless a variant overrides them) -----------------------
    def advance_prefill(self, next_token: Entry, cache: Cache) -> ServingState[Entry, Cache]:
        """``Prefill -> Decode``: the one M-row prefill evaluation produced ``next_token``."""
        raise IllegalTransition("advance_prefill")

    def advance_decode(self, next_token: Entry, cache: Cache) -> ServingState[Entry, Cache]:
        """``Decode -> Decode``: one single-row evaluation."""
        raise IllegalTransition("advance_decode")

    def enter_verify(
        self, draft: Sequence[Entry], clone: Clone | bool | None = None
    ) -> ServingState[Entry, Cache]:
        """``Decode -> Verify``: the current cache becomes the snapshot."""
        raise IllegalTransition("enter_verify")

    def enter_verify_tree(
        self, tokens: Sequence[int], parents: Sequence[int], clone: Clone | bool | None = None
    ) -> ServingState[Entry, Cache]:
        """``Decode -> VerifyTree``: the current cache becomes the snapshot of a tree verify."""
        raise IllegalTransition("enter_verify_tree")

    def accept(
        self, row_tokens: Sequence[Entry], row_caches: Sequence[Cache]
    ) -> ServingState[Entry, Cache]:
        """``Verify | VerifyTree -> Accept | Rollback``: score the verify rows against the draft."""
        raise IllegalTransition("accept")

    def accept_rows(
        self, accepted: int, row_tokens: Sequence[Entry], row_caches: Sequence[Cache]
    ) -> ServingState[Entry, Cache]:
        """``Verify -> Accept | Rollback`` with the accepted count supplied by the caller."""
        raise IllegalTransition("accept_rows")

    def accept_with(
        self, rule: Any, choices: Any, row_caches: Sequence[Cache], *args: Any, **kwargs: Any
    ) -> ServingState[Entry, Cache]:
        """``Verify -> Accept | Rollback`` with the accepted count decided by an acceptance
        rule (see ``specfsm.accept.rules.accept_with`` for the arguments)."""
        raise IllegalTransition("accept_with")

    def resume(self) -> ServingState[Entry, Cache]:
        """``Accept -> Decode``: no evaluation, just the placement ``accept`` chose."""
        raise IllegalTransition("resume")

    def rollback(self) -> ServingState[Entry, Cache]:
        """``Rollback -> Decode``: placement copy only, no evaluation."""
        raise IllegalTransition("rollback")

    def finish(self) -> Done[Entry, Cache]:
        """Any state ``-> Done``: the caller stops requesting evaluations."""
        return _done(self.cache)  # type: ignore[attr-defined]

    # -- value semantics -----------------------------------------------------------
    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}: {type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}: {type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        seqs = self._seq_fields
        for f in self._fields:
            a, b = getattr(self, f), getattr(other, f)
            if not (seq_eq(a, b) if f in seqs else value_eq(a, b)):
                return False
        return True

    def __hash__(self) -> int:
        return hash((type(self).__name__, *(hash_key(getattr(self, f)) for f in self._fields)))

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (type(self), tuple(getattr(self, f) for f in self._fields))


class Prefill(ServingState[Entry, Cache]):
    """``positions``: the prompt token ids for one M-row evaluation (any number, none
    included); ``cache`` starts empty."""

    __slots__ = ("positions", "cache")
    __match_args__ = ("positions", "cache")
    _fields = __match_args__
    _seq_fields = frozenset({"positions"})
    positions: Sequence[Entry]
    cache: Cache

    def __init__(self, positions: Sequence[Entry], cache: Cache) -> None:
        _set(self, "positions", entries(positions, "positions"))
        _set(self, "cache", cache)

    def advance_prefill(self, next_token: Entry, cache: Cache) -> Decode[Entry, Cache]:
        return _decode(next_token, cache)


class Decode(ServingState[Entry, Cache]):
    """``last``: the most recently accepted token, the next single-row evaluation's input."""

    __slots__ = ("last", "cache")
    __match_args__ = ("last", "cache")
    _fields = __match_args__
    last: Entry
    cache: Cache

    def __init__(self, last: Entry, cache: Cache) -> None:
        _set(self, "last", last)
        _set(self, "cache", cache)

    def advance_decode(self, next_token: Entry, cache: Cache) -> Decode[Entry, Cache]:
        return _decode(next_token, cache)

    def enter_verify(
        self, draft: Sequence[Entry], clone: Clone | bool | None = None
    ) -> Verify[Entry, Cache]:
        """The current cache becomes ``snapshot``, restorable verbatim (see ``Verify``).

        ``draft`` may be any token sequence, the empty one included (the design's
        ``enter_verify`` takes any ``Vec``; ``accept`` then refuses it); a value that is
        not a sequence raises TypeError (ValueError for an array that is not 1-D).

        ``clone`` decides how the snapshot is taken. By default (``None`` or ``True``) a
        cache that can change in place is copied (numpy and CuPy arrays, torch tensors,
        lists, dicts and tuples rebuilt around copies of what they hold, any other object
        through its ``clone()`` or ``copy()`` method) and an immutable handle (int, str,
        bytes, a tuple of them, ``None``, any object without ``clone``/``copy``) is
        shared, so the handles a serving backend usually passes cost nothing. A callable
        ``clone`` makes the snapshot ``clone(cache)``. ``clone=False`` shares the cache
        itself at no cost: only for a caller that never restores the snapshot or never
        writes the cache in place, since a write through ``cache`` then changes
        ``snapshot`` too and a rollback to it restores the post-draft contents. Refuses
        any other ``clone`` (TypeError)."""
        cache = self.cache
        return _verify(entries(draft, "draft"), _snapshot(cache, clone), cache)

    def enter_verify_tree(
        self, tokens: Sequence[int], parents: Sequence[int], clone: Clone | bool | None = None
    ) -> VerifyTree[Entry, Cache]:
        """The current cache becomes ``snapshot`` of a tree verify (see ``VerifyTree``);
        ``clone`` as for ``enter_verify``. Refuses a tree ``specfsm.tree.check_tree``
        refuses (TypeError/ValueError naming what is wrong)."""
        t, p, tt, pt = tree_fields(tokens, parents)
        cache = self.cache
        return _verify_tree(tt, pt, t, p, _snapshot(cache, clone), cache)


def _snapshot(cache: Any, clone: Any) -> Any:
    """The snapshot ``enter_verify`` and ``enter_verify_tree`` keep (see ``clone``)."""
    if clone is None or clone is True:
        return cache if type(cache) in IMMUTABLE else default_clone(cache)
    if clone is False:
        return cache
    if callable(clone):
        return clone(cache)
    raise TypeError(
        f"clone must be None, a bool or a callable, got {type(clone).__name__} {clone!r}"
    )


class Verify(ServingState[Entry, Cache]):
    """``draft``: the speculator's tokens, scored in one K-row evaluation (an empty draft
    is held, and refused by ``accept``/``accept_rows``); ``snapshot``: the pre-draft cache,
    restorable verbatim on rejection.

    ``enter_verify`` copies a cache that can change in place into ``snapshot`` (see its
    ``clone``), so a backend that writes its cache in place during the verify still has
    the pre-draft contents here; immutable handles are shared at no cost. specfsm itself
    never reads ``snapshot``: ``accept`` resumes from the verify's ``row_caches``.
    """

    __slots__ = ("draft", "snapshot", "cache")
    __match_args__ = ("draft", "snapshot", "cache")
    _fields = __match_args__
    _seq_fields = frozenset({"draft"})
    draft: Sequence[Entry]
    snapshot: Cache
    cache: Cache

    def __init__(self, draft: Sequence[Entry], snapshot: Cache, cache: Cache) -> None:
        _set(self, "draft", entries(draft, "draft"))
        _set(self, "snapshot", snapshot)
        _set(self, "cache", cache)

    def accept(
        self, row_tokens: Sequence[Entry], row_caches: Sequence[Cache]
    ) -> Accept[Entry, Cache] | Rollback[Entry, Cache]:
        """Score the verify rows' greedy choices against the draft.

        ``row_tokens[i]`` is the target's choice having consumed input row ``i`` (row 0
        follows ``last``, row ``i > 0`` follows ``draft[i - 1]``); ``row_caches[i]`` is the
        cache that evaluation produced at row ``i``, one per draft row. All rows accepted:
        ``Accept`` resuming from ``row_caches[-1]``; rejected at row ``n``: ``Rollback`` to
        ``row_tokens[n]`` from ``row_caches[n]``. Refuses (``IllegalTransition("accept")``
        with a reason, the state left intact) rows of the wrong length and an empty
        draft, which has no row to settle.

        ``Accept.next`` and ``Rollback.to`` are elements of ``draft`` and ``row_tokens``:
        a numpy integer (an element of an array, or inside a list) comes back as a Python
        int; any other token comes back as it is.
        """
        draft = self.draft
        return _settled(draft, _common_prefix(draft, row_tokens), row_tokens, row_caches, "accept")

    def accept_rows(
        self,
        accepted: int,
        row_tokens: Sequence[Entry],
        row_caches: Sequence[Cache],
    ) -> Accept[Entry, Cache] | Rollback[Entry, Cache]:
        """``accept`` with the accepted count supplied by the caller (an acceptance rule).

        ``row_tokens`` must reach row ``accepted`` unless every draft row was accepted;
        ``row_caches`` always holds one entry per draft row. Refuses ``accepted`` beyond
        the draft and an empty draft (``IllegalTransition("accept_rows")`` with a
        reason); a float, bool or negative
        ``accepted`` raises TypeError/ValueError. Tokens come back as for ``accept``.
        """
        return _settled(self.draft, accepted, row_tokens, row_caches, "accept_rows")

    def accept_with(
        self, rule: Any, choices: Any, row_caches: Sequence[Cache], *args: Any, **kwargs: Any
    ) -> Accept[Entry, Cache] | Rollback[Entry, Cache]:
        """``accept_rows`` with the accepted count (and the row tokens) decided by ``rule``
        (see ``specfsm.accept.rules.accept_with`` for the arguments)."""
        draft = self.draft
        if not len(draft):  # before the rule sees it: there is no row to settle
            raise IllegalTransition("accept_rows", settle_reason(0, 0, 0, 0))
        accepted, row_tokens = select_rows(rule, draft, choices, *args, **kwargs)
        return _settled(draft, accepted, row_tokens, row_caches, "accept_rows")


def _settled(
    draft: Any,
    accepted: Any,
    row_tokens: Any,
    row_caches: Any,
    attempted: str,
) -> Accept[Any, Any] | Rollback[Any, Any]:
    k = len(draft)
    if type(row_tokens) is not list and isinstance(row_tokens, np.ndarray):
        token_ids(row_tokens, "row_tokens")  # refuses 2-D arrays and non-integer dtypes
    idx = _settle(
        k, accepted, _length(row_tokens, "row_tokens"), _length(row_caches, "row_caches"), attempted
    )
    cache = row_caches[idx]
    if idx + 1 == k and idx != accepted:  # every draft row accepted
        token = draft[idx]
        if type(token) is not int and isinstance(token, np.integer):
            token = int(token)  # a numpy scalar as a Python int (see Verify.accept)
        return _accept(k, token, cache)
    token = row_tokens[idx]
    if type(token) is not int and isinstance(token, np.integer):
        token = int(token)
    return _rollback(cache, token)


class VerifyTree(ServingState[Entry, Cache]):
    """A tree of drafts scored in one (N + 1)-row evaluation: ``tokens[i]`` node i's token,
    ``parents[i]`` its parent (in ``[-1, i)``, -1 the root: ``Decode.last``), both tuples of
    ints; ``snapshot`` the pre-verify cache, as for ``Verify``. Row 0 of the evaluation
    is the root's, row i + 1 node i's (each node attending to the context and its
    ancestors). The tree follows ``specfsm.tree.check_tree``'s rules.
    """

    __slots__ = ("tokens", "parents", "snapshot", "cache", "_t", "_p")
    __match_args__ = ("tokens", "parents", "snapshot", "cache")
    _fields = __match_args__
    _seq_fields = frozenset({"tokens", "parents"})
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    snapshot: Cache
    cache: Cache
    _t: np.ndarray  # the checked tree as int64 arrays, private: the kernels read these
    _p: np.ndarray

    def __init__(self, tokens: Sequence[int], parents: Sequence[int], snapshot: Cache, cache: Cache) -> None:
        t, p, tt, pt = tree_fields(tokens, parents)
        for name, value in (("tokens", tt), ("parents", pt), ("snapshot", snapshot),
                            ("cache", cache), ("_t", t), ("_p", p)):
            _set(self, name, value)

    def path(self, row_tokens: Sequence[int]) -> list[int]:
        """The node indices of the path the target confirmed (greedy: from the root, the
        child whose token is the target's choice at the current node's row), without a
        transition. Refuses (ValueError) ``row_tokens`` that are not N + 1 integer ids."""
        return tree_path(self._t, self._p, row_tokens)

    def accept(
        self, row_tokens: Sequence[Entry], row_caches: Sequence[Cache]
    ) -> Accept[Entry, Cache] | Rollback[Entry, Cache]:
        """Follow the target through the tree: ``row_tokens[r]`` is its greedy choice after
        row ``r`` and ``row_caches[r]`` that row's cache (N + 1 of each). With ``m`` nodes
        accepted, the last at row ``r`` (r = 0 when none): a path that reached a leaf gives
        ``Accept(n=m, next=row_tokens[r], cache=row_caches[r])``; otherwise
        ``Rollback(snapshot=row_caches[r], to=row_tokens[r])``, as ``Verify.accept`` rolls
        back to the rejected row. A chain (``parents`` -1, 0, 1, ...) settles as a bonus-row
        verify (``BatchState(bonus=True)``). Refuses (the state left intact) rows of the
        wrong length (``IllegalTransition("accept")`` with a reason) and row tokens that
        are not integer ids (TypeError/ValueError). Tokens come back as Python ints."""
        leaf, m, token, cache = settle_tree(self._t, self._p, row_tokens, row_caches, "accept")
        if leaf:
            return _accept(m, token, cache)
        return _rollback(cache, token)


class Accept(ServingState[Entry, Cache]):
    """``n`` draft tokens accepted (all of them); decoding resumes from ``next``.

    From ``Verify.accept``/``accept_rows``, ``next`` is the draft's last token, a Python
    int when the draft held numpy integers (an array or a list of them)."""

    __slots__ = ("n", "next", "cache")
    __match_args__ = ("n", "next", "cache")
    _fields = __match_args__
    n: int
    next: Entry
    cache: Cache

    # ``next`` shadows the builtin: it is the original design's field name
    def __init__(self, n: int, next: Entry, cache: Cache) -> None:  # noqa: A002
        if type(n) is not int or n < 0:
            n = check_count(n, "n")
        _set(self, "n", n)
        _set(self, "next", next)
        _set(self, "cache", cache)

    def resume(self) -> Decode[Entry, Cache]:
        return _decode(self.next, self.cache)


class Rollback(ServingState[Entry, Cache]):
    """Resume from ``to`` after ``snapshot`` replaces a rejected draft's advanced cache.

    From ``Verify.accept``/``accept_rows``, ``to`` is the target's token at the rejected
    row, a Python int when ``row_tokens`` held numpy integers."""

    __slots__ = ("snapshot", "to")
    __match_args__ = ("snapshot", "to")
    _fields = __match_args__
    snapshot: Cache
    to: Entry

    def __init__(self, snapshot: Cache, to: Entry) -> None:
        _set(self, "snapshot", snapshot)
        _set(self, "to", to)

    def rollback(self) -> Decode[Entry, Cache]:
        return _decode(self.to, self.snapshot)

    def finish(self) -> Done[Entry, Cache]:
        """``Rollback -> Done`` keeps ``snapshot`` as the cache."""
        return _done(self.snapshot)


class Done(ServingState[Entry, Cache]):
    """Terminal: no further evaluation is legal."""

    __slots__ = ("cache",)
    __match_args__ = ("cache",)
    _fields = __match_args__
    cache: Cache

    def __init__(self, cache: Cache) -> None:
        _set(self, "cache", cache)


# -- internal constructors --------------------------------------------------------------
# Transitions build their results through the slot descriptors directly: the fields were
# already validated (or need no validation), and skipping __init__ and
# object.__setattr__ takes about a third off each transition's cost.
_new = object.__new__
_decode_last, _decode_cache = Decode.__dict__["last"].__set__, Decode.__dict__["cache"].__set__
_verify_draft, _verify_snapshot, _verify_cache = (
    Verify.__dict__["draft"].__set__,
    Verify.__dict__["snapshot"].__set__,
    Verify.__dict__["cache"].__set__,
)
_accept_n, _accept_next, _accept_cache = (
    Accept.__dict__["n"].__set__,
    Accept.__dict__["next"].__set__,
    Accept.__dict__["cache"].__set__,
)
_rollback_snapshot, _rollback_to = Rollback.__dict__["snapshot"].__set__, Rollback.__dict__["to"].__set__
_done_cache = Done.__dict__["cache"].__set__


def _decode(last: Any, cache: Any) -> Decode:
    state = _new(Decode)
    _decode_last(state, last)
    _decode_cache(state, cache)
    return state


def _verify(draft: Any, snapshot: Any, cache: Any) -> Verify:
    state = _new(Verify)
    _verify_draft(state, draft)
    _verify_snapshot(state, snapshot)
    _verify_cache(state, cache)
    return state


def _verify_tree(tokens: Any, parents: Any, t: Any, p: Any, snapshot: Any, cache: Any) -> VerifyTree:
    state = _new(VerifyTree)
    for name, value in (("tokens", tokens), ("parents", parents), ("snapshot", snapshot),
                        ("cache", cache), ("_t", t), ("_p", p)):
        _set(state, name, value)
    return state


def _accept(n: int, next_token: Any, cache: Any) -> Accept:
    state = _new(Accept)
    _accept_n(state, n)
    _accept_next(state, next_token)
    _accept_cache(state, cache)
    return state


def _rollback(snapshot: Any, to: Any) -> Rollback:
    state = _new(Rollback)
    _rollback_snapshot(state, snapshot)
    _rollback_to(state, to)
    return state


def _done(cache: Any) -> Done:
    state = _new(Done)
    _done_cache(state, cache)
    return state

