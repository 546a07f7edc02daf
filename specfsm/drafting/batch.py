"""The batch calls for either index kind: ``specfsm.extend_batch``, ``propose_batch``,
``record_batch``, ``serve_batch`` and ``serve_batch_lists`` take B indexes that are all
``NgramIndex`` or all ``SuffixIndex`` and run that kind's batch kernel (the same call as
``specfsm.drafting.ngram_index.extend_batch`` or ``specfsm.drafting.suffix_index.
extend_batch``, with its rules, results and refusals). ``indexes`` is read once; a batch
that mixes the kinds is refused (TypeError naming the first index of the other kind),
and so is an entry that is neither (TypeError naming it). An empty batch answers as
either kind does (nothing to do)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _impl

if TYPE_CHECKING:  # type checkers read the twins
    from . import _ngram_index_py as _ni
    from . import _suffix_index_py as _si
else:
    _ni = _impl.load("ngram_index")
    _si = _impl.load("suffix_index")

__all__ = ["extend_batch", "propose_batch", "record_batch", "serve_batch", "serve_batch_lists"]


def _kind(indexes: Any) -> tuple[Any, list[Any]]:
    """The kernel module of the indexes' kind and the indexes as a list (read once)."""
    try:
        ixs = list(indexes)
    except TypeError:
        raise TypeError(f"indexes must be a sequence of NgramIndex or SuffixIndex, got {type(indexes).__name__}") from None
    mod = _si if ixs and isinstance(ixs[0], _si.SuffixIndex) else _ni
    cls = mod.SuffixIndex if mod is _si else mod.NgramIndex
    for j, ix in enumerate(ixs):
        if not isinstance(ix, cls):
            want = "an NgramIndex or a SuffixIndex" if j == 0 else f"a {cls.__name__} like indexes[0]"
            raise TypeError(f"indexes[{j}] must be {want} (one kind per batch call), got {type(ix).__name__}")
    return mod, ixs


def extend_batch(indexes: Any, tokens: Any, offsets: Any) -> None:
    """``extend`` for B indexes of one kind: ``indexes[i]`` gets
    ``tokens[offsets[i]:offsets[i + 1]]``. All or nothing, as the kind's own call."""
    mod, ixs = _kind(indexes)
    mod.extend_batch(ixs, tokens, offsets)


def propose_batch(indexes: Any, max_k: Any = None) -> Any:
    """``propose`` for B indexes of one kind: ``(drafts, offsets, lengths)``."""
    mod, ixs = _kind(indexes)
    return mod.propose_batch(ixs, max_k)


def record_batch(indexes: Any, proposed: Any, accepted: Any) -> Any:
    """``record`` for B indexes of one kind: each index's next ``draft_len``."""
    mod, ixs = _kind(indexes)
    return mod.record_batch(ixs, proposed, accepted)


def serve_batch(indexes: Any, tokens: Any, offsets: Any, drafted: Any, accepted: Any, max_k: Any = None) -> Any:
    """``serve`` for B distinct indexes of one kind: ``propose_batch``'s result."""
    mod, ixs = _kind(indexes)
    return mod.serve_batch(ixs, tokens, offsets, drafted, accepted, max_k)


def serve_batch_lists(indexes: Any, tokens: Any, offsets: Any, drafted: Any, accepted: Any,
                      max_k: Any = None) -> Any:
    """``serve_batch`` with each index's draft as a list of ints."""
    mod, ixs = _kind(indexes)
    return mod.serve_batch_lists(ixs, tokens, offsets, drafted, accepted, max_k)
