"""Longest-match n-gram drafting and an incremental n-gram index (pure-Python twin).

The compiled module ``specfsm._core.ngram_index`` has the same names and behaviour; it
also imports its argument checks from here, so both raise the same errors.

Semantics (both implementations). For a history ``h`` of length ``L``, n runs from
``max_n`` down to ``min_n``; the first n for which the last n tokens occur earlier (an
occurrence starting before ``L - n``) is chosen. Among that n's occurrences the most
recent one (``prefer="latest"``) or the first one (``prefer="earliest"``) is taken, and
the draft is up to ``max_k`` tokens that followed it. The draft is empty when nothing
matches or ``max_k`` is 0.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import numpy as np

from .._validate import INT64_MAX, INT64_MIN, as_token_array, check_count

__all__ = [
    "extend_batch",
    "longest_match",
    "longest_match_batch",
    "NgramIndex",
    "propose_batch",
    "record_batch",
]

_PREFER = ("latest", "earliest")
#: the index stores positions as 32-bit ints: at most this many tokens per index
MAX_INDEX_TOKENS = 2**31 - 2
#: an index keeps one hash table per n-gram length: at most this many lengths
MAX_LEVELS = 4096
#: adaptive draft length: added after a fully accepted draft, taken after a rejection
GROW_STEP = 2
SHRINK_STEP = 1


# --------------------------------------------------------------------------------------
# argument checks shared with the compiled module (same messages in both)
# --------------------------------------------------------------------------------------


def _check_ngram_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``(min_n, max_n)`` as ints; ``max_n=None`` means ``min_n``. Refuses ``min_n < 1``
    and ``min_n > max_n``."""
    lo = check_count(min_n, "min_n")
    if lo < 1:
        raise ValueError(f"min_n must be at least 1, got {lo}")
    if max_n is None:
        return lo, lo
    hi = check_count(max_n, "max_n")
    if hi < lo:
        raise ValueError(f"min_n must not exceed max_n, got min_n={lo} > max_n={hi}")
    return lo, hi


def _check_index_range(min_n: object, max_n: object) -> tuple[int, int]:
    """``_check_ngram_range`` for an index, which keeps one table per n: also refuses
    ``max_n`` beyond ``MAX_INDEX_TOKENS`` and more than ``MAX_LEVELS`` values of n."""
    lo, hi = _check_ngram_range(min_n, max_n)
    if hi > MAX_INDEX_TOKENS:
        raise ValueError(f"max_n must be at most {MAX_INDEX_TOKENS} for an NgramIndex, got {hi}")
    if hi - lo + 1 > MAX_LEVELS:
        raise ValueError(
            f"an NgramIndex keeps at most {MAX_LEVELS} n-gram lengths, got "
            f"min_n={lo}, max_n={hi}"
        )
    return lo, hi


def _check_prefer(prefer: object) -> int:
    """0 for ``"latest"``, 1 for ``"earliest"``; refuses anything else."""
    if type(prefer) is str:
        if prefer == "latest":
            return 0
        if prefer == "earliest":
            return 1
    raise ValueError(f"prefer must be 'latest' or 'earliest', got {prefer!r}")


def _overflow(name: str, value: object) -> OverflowError:
    return OverflowError(f"{name} holds ids beyond int64 (got {value!r})")


def _as_ids(tokens: object, name: str) -> np.ndarray:
    """Token ids as a 1-D C-contiguous int32 or int64 ndarray.

    Accepts a 1-D integer ndarray or a list/tuple (or other sequence) of Python or numpy
    integers. Refuses 2-D input, non-integer entries (floats, bools, strings) and ids
    beyond int64.
    """
    if isinstance(tokens, np.ndarray):
        return as_token_array(tokens, name)
    if isinstance(tokens, (str, bytes, bytearray)) or not isinstance(tokens, Sequence):
        raise TypeError(
            f"{name} must be a list, tuple or 1-D integer numpy array, "
            f"got {type(tokens).__name__}"
        )
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.asarray(tokens)
    except (ValueError, TypeError) as exc:  # ragged nesting and the like
        raise ValueError(f"{name} must be a flat sequence of integer ids ({exc})") from None
    if arr.dtype == object:
        for x in arr.reshape(-1).tolist():
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError(
                    f"{name} must hold integer ids, got {type(x).__name__} {x!r}"
                )
            if not INT64_MIN <= int(x) <= INT64_MAX:
                raise _overflow(name, int(x))
        raise TypeError(f"{name} must hold integer ids")  # pragma: no cover - unreachable
    if arr.dtype.kind == "b":
        raise TypeError(f"{name} must hold integer ids, got bools")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got a {arr.ndim}-D array of shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > INT64_MAX:
        raise _overflow(name, int(arr.max()))
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_offsets(offsets: object, n_tokens: int) -> np.ndarray:
    """Request boundaries as a fresh int64 array (owned by the call) of B + 1
    nondecreasing entries within ``[0, n_tokens]``."""
    off = _own_offsets(offsets)
    _validate_offsets(off, n_tokens)
    return off


def _own_offsets(offsets: object) -> np.ndarray:
    """``offsets`` converted and copied into a fresh int64 array, before any check: a
    caller's array changed later (another thread) cannot change what was validated."""
    off = np.array(_as_ids(offsets, "offsets"), dtype=np.int64, copy=True)
    if off.shape[0] < 1:
        raise ValueError("offsets must hold at least one entry (B + 1 boundaries for B requests)")
    return off


def _validate_offsets(off: np.ndarray, n_tokens: int) -> None:
    """Checks an owned offsets copy: first entry >= 0, last <= n_tokens, and each entry
    <= the next (compared, never subtracted: int64 differences wrap around)."""
    if off[0] < 0:
        raise ValueError(f"offsets must be non-negative, got offsets[0]={int(off[0])}")
    if off[-1] > n_tokens:
        raise ValueError(
            f"offsets[-1]={int(off[-1])} is beyond the {n_tokens} tokens given"
        )
    if off.shape[0] > 1:
        down = off[:-1] > off[1:]
        if down.any():
            i = int(np.flatnonzero(down)[0])
            raise ValueError(
                f"offsets must be nondecreasing, got offsets[{i}]={int(off[i])} > "
                f"offsets[{i + 1}]={int(off[i + 1])}"
            )


def _check_batch_k(max_k: object, n: int, defaults: list[int] | None, name: str = "max_k") -> np.ndarray:
    """Per-request draft limits as an int64 array of ``n`` entries.

    ``max_k`` is one count for every request, a sequence or array of ``n`` counts, or
    (batches of indexes only) None for each index's own ``draft_len``.
    """
    if max_k is None:
        if defaults is None:
            raise TypeError(f"{name} must be a non-negative integer or one count per request, got None")
        return np.asarray(defaults, dtype=np.int64).reshape(n)
    if isinstance(max_k, (np.ndarray, list, tuple)):
        # copied first, validated after: the copy is what the kernel reads
        ks = np.array(_as_ids(max_k, name), dtype=np.int64, copy=True)
        if ks.shape[0] != n:
            raise ValueError(f"{name} holds {ks.shape[0]} counts for {n} requests")
        if ks.shape[0] and ks.min() < 0:
            i = int(np.flatnonzero(ks < 0)[0])
            raise ValueError(f"{name} must be non-negative, got {name}[{i}]={int(ks[i])}")
        return ks
    k = check_count(max_k, name)
    return np.full(n, min(k, INT64_MAX), dtype=np.int64)


def _check_draft_limits(draft_len: object, min_draft: object, max_draft: object) -> tuple[int, int, int]:
    k = check_count(draft_len, "draft_len")
    lo = check_count(min_draft, "min_draft")
    hi = check_count(max_draft, "max_draft")
    if lo > hi:
        raise ValueError(f"min_draft must not exceed max_draft, got {lo} > {hi}")
    if not lo <= k <= hi:
        raise ValueError(f"draft_len must lie in [min_draft, max_draft] = [{lo}, {hi}], got {k}")
    return k, lo, hi


def _check_record(proposed: object, accepted: object) -> tuple[int, int]:
    p = check_count(proposed, "proposed")
    a = check_count(accepted, "accepted")
    if a > p:
        raise ValueError(f"accepted={a} is beyond the {p} drafted tokens")
    return p, a


def _check_total(drafted: int, proposed: int) -> None:
    """Refuses a record that would take the drafted-token count beyond int64."""
    if proposed > INT64_MAX - drafted:
        raise OverflowError(
            f"proposed={proposed} would take the drafted-token count beyond int64 "
            f"(already {drafted})"
        )


_STAT_NAMES = ("steps", "drafted", "accepted", "full_accepts")


def _check_stats(stats: object) -> tuple[int, int, int, int]:
    """Unpickled statistics ``(steps, drafted, accepted, full_accepts)``, refused unless
    they are counts that ``record`` could have produced."""
    if not isinstance(stats, tuple):
        raise TypeError(f"stats must be a tuple of 4 counts, got {type(stats).__name__}")
    if len(stats) != 4:
        raise ValueError(f"stats must hold 4 counts {_STAT_NAMES}, got {len(stats)}")
    vals = []
    for name, v in zip(_STAT_NAMES, stats):
        c = check_count(v, f"stats {name}")
        if c > INT64_MAX:
            raise OverflowError(f"stats {name}={c} is beyond int64")
        vals.append(c)
    steps, drafted, accepted, full = vals
    if accepted > drafted:
        raise ValueError(f"stats accepted={accepted} is beyond drafted={drafted}")
    if full > steps or full > accepted:
        raise ValueError(
            f"stats full_accepts={full} is beyond steps={steps} or accepted={accepted}"
        )
    if steps == 0 and drafted:
        raise ValueError(f"stats drafted={drafted} with no recorded step")
    return steps, drafted, accepted, full


#: what a call meeting an index in use by another call says (both implementations)
BUSY_WRITING = "NgramIndex is being extended (by another thread, or by a callback inside extend)"
BUSY_READING = "NgramIndex is being read by a batch proposal in another thread"


def _index_list(indexes: object, cls: type) -> list:
    """The batch's indexes as a list, each an instance of this implementation's class."""
    if isinstance(indexes, cls):
        raise TypeError("indexes must be a sequence of NgramIndex, got a single NgramIndex")
    try:
        out = list(indexes)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"indexes must be a sequence of NgramIndex, got {type(indexes).__name__}"
        ) from None
    for i, ix in enumerate(out):
        if not isinstance(ix, cls):
            raise TypeError(
                f"indexes[{i}] must be an NgramIndex of the same implementation, "
                f"got {type(ix).__module__}.{type(ix).__name__}"
            )
    return out


# --------------------------------------------------------------------------------------
# stateless longest match
# --------------------------------------------------------------------------------------


def _match_end(h: list, lo: int, hi: int, earliest: bool) -> int:
    """End (exclusive) of the chosen earlier occurrence, or -1 (plain twin scan)."""
    L = len(h)
    for n in range(min(hi, L - 1), lo - 1, -1):
        needle = h[L - n :]
        starts = range(0, L - n) if earliest else range(L - n - 1, -1, -1)
        for s in starts:
            if h[s : s + n] == needle:
                return s + n
    return -1


def longest_match(history: object, min_n: object, max_n: object, max_k: object, prefer: object = "latest"):
    """Draft up to ``max_k`` tokens that followed the longest (``max_n`` down to
    ``min_n``) earlier occurrence of ``history``'s last tokens.

    ``prefer`` picks that n's most recent occurrence (``"latest"``; with
    ``min_n == max_n`` this is ``prompt_lookup``) or its first (``"earliest"``). A numpy
    ``history`` gives a numpy draft of the same dtype, a list or tuple gives a list.
    """
    lo, hi = _check_ngram_range(min_n, max_n)
    k = check_count(max_k, "max_k")
    earliest = _check_prefer(prefer) == 1
    arr = _as_ids(history, "history")
    h = arr.tolist()
    end = -1 if k == 0 else _match_end(h, lo, hi, earliest)
    if isinstance(history, np.ndarray):
        if end < 0:
            return history[:0].copy()
        return history[end : end + k].copy()
    return [] if end < 0 else h[end : end + k]


def longest_match_batch(tokens: object, offsets: object, min_n: object, max_n: object, max_k: object, prefer: object = "latest"):
    """``longest_match`` for B histories stored back to back in one flat array.

    History ``i`` is ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets`` holds B + 1
    nondecreasing boundaries); ``max_k`` is one count or one per request. Returns
    ``(drafts, draft_offsets, lengths)``: draft ``i`` is
    ``drafts[draft_offsets[i]:draft_offsets[i + 1]]`` and has ``lengths[i]`` tokens;
    ``drafts`` has the dtype of ``tokens`` (int32 or int64).
    """
    lo, hi = _check_ngram_range(min_n, max_n)
    earliest = _check_prefer(prefer) == 1
    arr = _as_ids(tokens, "tokens")
    off = _check_offsets(offsets, arr.shape[0])
    b = off.shape[0] - 1
    ks = _check_batch_k(max_k, b, None)
    flat = arr.tolist()
    pieces: list[int] = []
    lengths = np.zeros(b, dtype=np.int64)
    for i in range(b):
        h = flat[off[i] : off[i + 1]]
        end = -1 if ks[i] == 0 else _match_end(h, lo, hi, earliest)
        piece = [] if end < 0 else h[end : end + int(ks[i])]
        pieces.extend(piece)
        lengths[i] = len(piece)
    out_off = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_off[1:])
    return np.asarray(pieces, dtype=arr.dtype), out_off, lengths


# --------------------------------------------------------------------------------------
# the incremental index
# --------------------------------------------------------------------------------------


class NgramIndex:
    """An incremental n-gram index over one request's verified tokens.

    ``extend`` appends tokens (amortised O(max_n - min_n + 1) table updates per token);
    ``propose(max_k)`` returns, as a list, exactly what ``longest_match`` returns on
    everything extended so far, in O(max_n - min_n + max_k) whatever the length.
    Drafts are never extended into the index, so a rejected draft needs no undo.

    The draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. Acceptance statistics are kept either way.
    """

    def __init__(
        self,
        min_n: object,
        max_n: object = None,
        prefer: object = "latest",
        *,
        draft_len: object = 4,
        adaptive: object = False,
        min_draft: object = 1,
        max_draft: object = 16,
    ) -> None:
        self._lo, self._hi = _check_index_range(min_n, max_n)
        self._earliest = _check_prefer(prefer) == 1
        self._k, self._kmin, self._kmax = _check_draft_limits(draft_len, min_draft, max_draft)
        self._adaptive = bool(adaptive)
        self._toks: list[int] = []
        # level j holds (min_n + j)-grams: tuple of tokens -> end of the latest/first one
        self._tables: list[dict[tuple, int]] = [{} for _ in range(self._hi - self._lo + 1)]
        # for the current suffix: per level, end of the chosen earlier occurrence or -1
        self._ans: list[int] = [-1] * (self._hi - self._lo + 1)
        self._steps = 0
        self._drafted = 0
        self._accepted = 0
        self._full = 0
        # the guard: _writing and _readers are changed only under _lock (held briefly);
        # an extend refuses to start while readers or another extend are in, and a
        # reader refuses to start during an extend (as the compiled index does)
        self._lock = threading.Lock()
        self._writing = False
        self._readers = 0

    def _begin_write(self) -> None:
        with self._lock:
            if self._writing:
                raise RuntimeError(BUSY_WRITING)
            if self._readers:
                raise RuntimeError(BUSY_READING)
            self._writing = True

    def _end_write(self) -> None:
        with self._lock:
            self._writing = False

    def _begin_read(self) -> None:
        with self._lock:
            if self._writing:
                raise RuntimeError(BUSY_WRITING)
            self._readers += 1

    def _end_read(self) -> None:
        with self._lock:
            self._readers -= 1

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self) -> int:
        return self._lo

    @property
    def max_n(self) -> int:
        return self._hi

    @property
    def prefer(self) -> str:
        return "earliest" if self._earliest else "latest"

    @property
    def adaptive(self) -> bool:
        return self._adaptive

    @property
    def draft_len(self) -> int:
        """The draft length ``propose()`` uses when ``max_k`` is None."""
        return self._k

    # -- contents -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._toks)

    @property
    def tokens(self) -> np.ndarray:
        """The indexed tokens, as a read-only int64 array."""
        self._begin_read()
        try:
            arr = np.asarray(self._toks, dtype=np.int64)
        finally:
            self._end_read()
        arr.flags.writeable = False
        return arr

    @property
    def nbytes(self) -> int:
        """Bytes this index holds (Python objects, estimated with ``sys.getsizeof``)."""
        self._begin_read()
        try:
            total = sys.getsizeof(self._toks) + sys.getsizeof(self._ans)
            for t in self._tables:
                total += sys.getsizeof(t)
                for key in t:
                    total += sys.getsizeof(key)
        finally:
            self._end_read()
        return total

    @property
    def bytes_per_token(self) -> float:
        """``nbytes`` per indexed token (0.0 while empty)."""
        n = len(self._toks)
        return self.nbytes / n if n else 0.0

    def extend(self, tokens: object) -> None:
        """Append verified tokens (a list, tuple or 1-D integer array) to the index.

        Refuses (RuntimeError) while another extend or a batch proposal uses the index."""
        self._begin_write()
        try:
            self._extend(_as_ids(tokens, "tokens").tolist())
        finally:
            self._end_write()

    def _extend(self, new: list) -> None:
        if len(self._toks) + len(new) > MAX_INDEX_TOKENS:
            raise OverflowError(
                f"an NgramIndex holds at most {MAX_INDEX_TOKENS} tokens; "
                f"{len(self._toks)} + {len(new)} is too many"
            )
        toks = self._toks
        lo, hi, earliest = self._lo, self._hi, self._earliest
        ans, tables = self._ans, self._tables
        for t in new:
            toks.append(t)
            L = len(toks)
            for n in range(lo, hi + 1):
                j = n - lo
                if n > L:
                    ans[j] = -1
                    continue
                key = tuple(toks[L - n :])
                table = tables[j]
                prev = table.get(key, -1)
                ans[j] = prev
                if prev < 0 or not earliest:
                    table[key] = L

    def append(self, token: object) -> None:
        """Append one verified token."""
        self.extend([token])

    def propose(self, max_k: object = None) -> list:
        """The draft ``longest_match(tokens, min_n, max_n, max_k, prefer)`` gives, as a
        list; ``max_k=None`` uses ``draft_len``."""
        k = self._k if max_k is None else check_count(max_k, "max_k")
        self._begin_read()
        try:
            end = self._end()
            if end < 0 or k == 0:
                return []
            return self._toks[end : end + k]
        finally:
            self._end_read()

    def _end(self) -> int:
        for j in range(self._hi - self._lo, -1, -1):
            if self._ans[j] >= 0:
                return self._ans[j]
        return -1

    def match_length(self) -> int:
        """The n of the current match (0 when nothing matches)."""
        self._begin_read()
        try:
            for j in range(self._hi - self._lo, -1, -1):
                if self._ans[j] >= 0:
                    return self._lo + j
            return 0
        finally:
            self._end_read()

    # -- acceptance statistics and the adaptive draft length ---------------------
    def record(self, proposed: object, accepted: object) -> int:
        """Record that ``accepted`` of ``proposed`` drafted tokens were accepted; returns
        the draft length to use next (changed only when ``adaptive``)."""
        p, a = _check_record(proposed, accepted)
        with self._lock:  # records from several threads are serialised, never refused
            _check_total(self._drafted, p)
            self._steps += 1
            self._drafted += p
            self._accepted += a
            if p > 0 and a == p:
                self._full += 1
            if self._adaptive and p > 0:
                if a == p:
                    self._k = min(self._k + GROW_STEP, self._kmax)
                else:
                    self._k = max(self._k - SHRINK_STEP, self._kmin)
            return self._k

    @property
    def stats(self) -> dict:
        """Acceptance statistics: steps recorded, tokens drafted and accepted, fully
        accepted drafts, the acceptance rate and the current draft length."""
        return {
            "steps": self._steps,
            "drafted": self._drafted,
            "accepted": self._accepted,
            "full_accepts": self._full,
            "acceptance_rate": self._accepted / self._drafted if self._drafted else 0.0,
            "draft_len": self._k,
        }

    def __repr__(self) -> str:
        return (
            f"NgramIndex(min_n={self._lo}, max_n={self._hi}, prefer={self.prefer!r}, "
            f"len={len(self._toks)})"
        )

    def __reduce__(self):
        # pickled (and copied by copy.copy / copy.deepcopy) as its settings, tokens and
        # statistics; unpickling re-indexes the tokens into a new, independent index
        self._begin_read()
        try:
            toks = np.asarray(self._toks, dtype=np.int64)
        finally:
            self._end_read()
        return (
            _rebuild,
            (type(self), self._lo, self._hi, self.prefer, self._k, self._adaptive,
             self._kmin, self._kmax, toks,
             (self._steps, self._drafted, self._accepted, self._full)),
        )

    def _restore_stats(self, stats: object) -> None:
        self._steps, self._drafted, self._accepted, self._full = _check_stats(stats)


def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats):
    """The unpickler: a new index of class ``cls`` built from checked settings, tokens
    and statistics (made-up statistics are refused)."""
    if not (isinstance(cls, type) and issubclass(cls, NgramIndex)):
        raise TypeError(f"cannot rebuild an NgramIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=adaptive, min_draft=kmin, max_draft=kmax)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix


def propose_batch(indexes: object, max_k: object = None):
    """``propose`` for B indexes in one call.

    ``max_k`` is one count, one count per index, or None for each index's
    ``draft_len``. Returns ``(drafts, offsets, lengths)`` as ``longest_match_batch``
    does, ``drafts`` being int64.
    """
    ixs = _index_list(indexes, NgramIndex)
    b = len(ixs)
    ks = _check_batch_k(max_k, b, [ix._k for ix in ixs])
    pieces: list[int] = []
    lengths = np.zeros(b, dtype=np.int64)
    marked = 0
    try:
        for ix in ixs:  # every index marked as read before any is read
            ix._begin_read()
            marked += 1
        for i, ix in enumerate(ixs):
            end = ix._end()
            if end >= 0 and ks[i] > 0:
                piece = ix._toks[end : end + int(ks[i])]
                pieces.extend(piece)
                lengths[i] = len(piece)
    finally:
        for ix in ixs[:marked]:
            ix._end_read()
    off = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return np.asarray(pieces, dtype=np.int64), off, lengths


def record_batch(indexes: object, proposed: object, accepted: object) -> np.ndarray:
    """``record`` for B indexes: ``proposed`` and ``accepted`` hold one count per index.
    Returns the next draft lengths (int64)."""
    ixs = _index_list(indexes, NgramIndex)
    b = len(ixs)
    p = _check_batch_k(proposed, b, None, "proposed")
    a = _check_batch_k(accepted, b, None, "accepted")
    for i in range(b):
        if a[i] > p[i]:
            raise ValueError(f"accepted[{i}]={int(a[i])} is beyond the {int(p[i])} drafted tokens")
    out = np.empty(b, dtype=np.int64)
    for i, ix in enumerate(ixs):
        out[i] = ix.record(int(p[i]), int(a[i]))
    return out


def extend_batch(indexes: object, tokens: object, offsets: object) -> None:
    """``extend`` for B indexes in one call: index ``i`` gets
    ``tokens[offsets[i]:offsets[i + 1]]`` (``offsets``: B + 1 nondecreasing
    boundaries). All or nothing: refuses the whole batch, changing no index, when an
    index appears twice (ValueError) or is in use by another call (RuntimeError), or
    when one would exceed its capacity.
    """
    ixs = _index_list(indexes, NgramIndex)
    b = len(ixs)
    src = np.array(_as_ids(tokens, "tokens"), dtype=np.int64, copy=True)
    off = _own_offsets(offsets)
    if off.shape[0] != b + 1:
        raise ValueError(
            f"offsets holds {off.shape[0]} entries for {b} indexes; it needs B + 1 = {b + 1}"
        )
    _validate_offsets(off, src.shape[0])
    marked: list = []
    seen: set = set()
    try:
        for i, ix in enumerate(ixs):
            if id(ix) in seen:
                raise ValueError(
                    f"indexes[{i}] appears twice in the batch; extend_batch takes each "
                    "index once"
                )
            try:
                ix._begin_write()
            except RuntimeError as exc:
                raise RuntimeError(f"indexes[{i}]: {exc}") from None
            marked.append(ix)
            seen.add(id(ix))
        for i, ix in enumerate(ixs):
            m = int(off[i + 1] - off[i])
            if len(ix._toks) + m > MAX_INDEX_TOKENS:
                raise OverflowError(
                    f"an NgramIndex holds at most {MAX_INDEX_TOKENS} tokens; "
                    f"indexes[{i}] has {len(ix._toks)} + {m}, too many"
                )
        for i, ix in enumerate(ixs):
            ix._extend(src[off[i] : off[i + 1]].tolist())
    finally:
        for ix in marked:
            ix._end_write()
