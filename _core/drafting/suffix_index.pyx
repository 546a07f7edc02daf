# cython: language_level=3
"""Unbounded longest-match drafting over a suffix automaton (compiled).

Same names and behaviour as the twin ``specfsm._py.suffix_index``; both take their
argument checks from ``specfsm._checks`` and the concept's check module, so both raise the same errors.

Layout (about 30 bytes per token on source code: the history, 4 bytes per position,
and what repeats add). A suffix automaton built online creates one state per position,
plus "clones" where a repeat splits a state. The state created for position ``i`` gets
the id ``i + 1`` (id 0 is the root, the empty prefix): its length is its id, its first
end position is ``id - 1``, and its transition on the next token, ``tok[id]``, goes to
state ``id + 1`` and is never redirected, so only its suffix link is stored (4 bytes).
Clones (ids from ``CLONE`` on) are 16-byte records: length, suffix link, first end
position and the target of their transition on ``tok[first + 1]`` (every state has
that one: the token after its first occurrence). All other transitions (those of
clones with two or more, and the rare extra ones of position states, the root's
first) are 12-byte edges (target, next edge of the same source, the token's low 32
bits) found through one open-addressing table of 8-byte slots (source, edge) at a load
of at most 3/4; a table keyed by state holds the first edge of each state that has
any (a bit per position and a bit in the clone's length say which do). The history is
kept as int32 while every token fits, as int64 from the first one that does not (the
edge's 32 bits then only pick candidates: the whole token is read from the history).
``prefer="latest"`` adds a 4-byte last end position per state.

Thread safety: the shared guard protocol (``_core/common/_guard.pxd``). ``extend``,
``append``, ``extend_batch`` (and the serving-step policy, ``suffix_serve``)
hold the writer flag from before they convert their arguments (that conversion, numpy
copies and the nogil indexing may let other threads run) until they are done; while it
is held every other call on the index, properties included, raises RuntimeError.
Readers that may let other threads run (``tokens``, ``last_tokens``, pickling,
``propose_batch``) count themselves and writers refuse to start while one is counted;
the other reads never release the GIL after their check and only check. An index made
with ``__new__``, or whose ``__init__`` failed, refuses every call; so does one that ran
out of memory part way through an extend.

This file holds the module's declarations and the SuffixIndex class; the rest of the
module is included from files of one concern each: _suffix_automaton.pxi (the automaton
and its online construction), _suffix_tree.pxi (tree drafts, ``propose_tree`` and
``propose_tree_batch``), _suffix_batch.pxi (the batch API, the serving-step policy
and the extend_batch pipeline), and, shared with ngram_index.pyx, _index_common.pxi
(statistics, record, the batch calls' guards) and _serve.pxi (``serve``/``serve_batch``);
the statistics' C struct is in _index_stats.pxd.
"""

import numpy as np

from specfsm._checks import check_count, token_ids
from specfsm.drafting._checks import (
    GROW_STEP,
    MAX_SUFFIX_TOKENS,
    SHRINK_STEP,
    UNBOUNDED,
    batch_tokens,
    check_anchor,
    check_batch_counts,
    check_batch_limits,
    check_draft_limits,
    check_prefer,
    check_record,
    check_stats as _check_index_stats,
    check_total,
    index_offsets,
    suffix_range,
)
from specfsm.drafting._tree_checks import check_tree_args

cimport cython
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset

cimport numpy as cnp
from _arrays cimport plain_int_width, array_data, array_len
from _offsets cimport longest_row
from _seq cimport Py_SIZE
from _guard cimport (
    GUARD_READY,
    guard_begin_init,
    guard_break,
    guard_check,
    guard_done_read,
    guard_done_write,
    guard_end_init,
    guard_hold,
    guard_read,
    guard_t,
    guard_write,
)
from _index_stats cimport index_stats_t, stats_fits, stats_init, stats_limit, stats_record

cnp.import_array()  # propose_tree builds its result arrays with the C API

__all__ = ["SuffixIndex", "extend_batch", "propose_batch", "propose_tree_batch", "record_batch", "serve_batch", "serve_batch_lists"]

NAME = "SuffixIndex"           # the guard's refusals name the class
WHAT = "a SuffixIndex"         # ... and messages name an instance

cdef extern from "prefetch.h" nogil:
    void SFX_PREFETCH "NGI_PREFETCH" (const void* p)
    void SFX_PREFETCH_KEEP "NGI_PREFETCH_KEEP" (const void* p)

cdef enum:
    PREFETCH_AHEAD = 8    # _grow_slots: slots between the prefetch stages
    PIPE_AHEAD = 2        # extend_batch: indexes between the prefetch stages
    PIPE_STAGES = 5       # ... its stages: 4 of prefetches, then the appends
    NOGIL_MIN = 512       # extends shorter than this keep the GIL
    SMALL_LIST = 64       # extend() converts lists up to this long without numpy
    MIN_SLOTS = 16
    CLONE = 1 << 30       # state ids from here on are clones; below it, positions + 1
    REF_SOLID = -2        # _find: a position state's transition on the next token
    REF_FIRST = -3        # _find: a clone's transition on the token after its first end
    LEN_MASK = (1 << 30) - 1
    HAS_EDGES = 1 << 30   # in clone_t.len: the clone has table edges

cdef int64_t INT32_LO = -2147483648
cdef int64_t INT32_HI = 2147483647
cdef int64_t MAX_TOKENS_C = MAX_SUFFIX_TOKENS

include "_index_common.pxi"
include "_serve.pxi"

include "_suffix_automaton.pxi"
include "_suffix_tree.pxi"


# ------------------------------------------------------------------------------------
# the index
# ------------------------------------------------------------------------------------

@cython.embedsignature(False)   # the signature heads the docstring (__text_signature__)
cdef class SuffixIndex:
    """SuffixIndex(min_n=1, max_n=None, prefer="earliest", *, draft_len=8, adaptive=False, min_draft=1, max_draft=32, anchor_n=0, anchor_span=64, anchor_misses=4)
--

    An incremental longest-match index over one request's verified tokens.

    ``extend`` appends tokens (amortised O(1) per token); ``propose(max_k)`` returns, as
    a list, the tokens that followed the chosen (``prefer``: ``"earliest"`` or
    ``"latest"``) earlier occurrence of the longest matching suffix of at least
    ``min_n`` tokens, in O(max_k). ``max_n=None`` puts no cap on the match length. The
    draft length is ``max_k`` or, when that is None, ``draft_len``; with
    ``adaptive=True``, ``record(proposed, accepted)`` lengthens it by 2 after a fully
    accepted draft and shortens it by 1 after a rejection, within
    ``[min_draft, max_draft]``. ``serve`` is one serving step (record, extend, propose).
    A call that meets another changing the index (another thread, a callback) raises
    RuntimeError; an instance made with ``__new__`` (or whose ``__init__`` failed)
    refuses every call, and a second ``__init__`` is refused.

    The anchor (``anchor_n > 0``; off by default): a match of at least ``anchor_n``
    tokens sets the anchor to its continuation; while later matches are shorter, the
    anchor moves one position per appended token, as if the tokens that broke the match
    replaced as many earlier ones (an edit that renames or substitutes), and for up to
    ``anchor_span`` tokens, unless more than ``anchor_misses`` of them differed from the
    anchored text, the draft is taken from the anchor instead of from the short match.
    """

    cdef sam_t m
    cdef object _buf                 # int32 (or, once wide, int64) ndarray of the tokens
    cdef int64_t _len, _cap          # tokens held, room in _buf and the position arrays
    cdef guard_t _g                  # the shared guard protocol (_core/common/_guard.pxd)
    cdef int64_t _wstamp             # the extend_batch call holding the writer flag (duplicates)
    cdef index_stats_t _st           # acceptance statistics, the adaptive draft length

    def __cinit__(self):
        memset(&self.m, 0, sizeof(sam_t))   # the guard is zeroed too: UNINIT

    def __init__(self, min_n=1, max_n=None, prefer="earliest", *, draft_len=8, adaptive=False,
                 min_draft=1, max_draft=32, anchor_n=0, anchor_span=64, anchor_misses=4):
        guard_begin_init(&self._g, NAME)    # a second __init__ is refused, changing nothing
        lo, hi = suffix_range(min_n, max_n)
        an, aspan, amiss = check_anchor(anchor_n, anchor_span, anchor_misses)
        earliest = check_prefer(prefer)
        k, kmin, kmax = check_draft_limits(draft_len, min_draft, max_draft, MAX_TOKENS_C)
        stats_init(&self._st, bool(adaptive), k, kmin, kmax)
        self._len = 0
        self._cap = 0
        self._buf = np.zeros(0, dtype=np.int32)
        self.m.min_n = lo
        self.m.max_n = hi
        self.m.earliest = earliest
        self.m.unbounded = hi >= UNBOUNDED
        self.m.anchor_n = an
        self.m.anchor_span = aspan
        self.m.anchor_misses = amiss
        self.m.misses = 0
        self.m.anchor = -1
        self.m.carry = 0
        self.m.cap_sl = MIN_SLOTS
        self.m.cap_hd = 8
        self.m.sl = <slot_t*>malloc(self.m.cap_sl * sizeof(slot_t))
        self.m.hd = <head_t*>malloc(self.m.cap_hd * sizeof(head_t))
        if self.m.sl == NULL or self.m.hd == NULL:
            raise MemoryError()
        memset(self.m.sl, 0xFF, self.m.cap_sl * sizeof(slot_t))
        memset(self.m.hd, 0xFF, self.m.cap_hd * sizeof(head_t))
        self._grow_buffer(56)        # also makes the root's position entries
        self.m.plink[0] = -1
        if not earliest:
            self.m.plast[0] = -1
        self.m.npos = 0
        self.m.tail = 0
        self.m.cursor = 0
        self.m.match_len = 0
        self.m.match_end = -1
        guard_end_init(&self._g)

    def __dealloc__(self):
        free(self.m.plink)
        free(self.m.plast)
        free(self.m.pbits)
        free(self.m.cl)
        free(self.m.clast)
        free(self.m.ed)
        free(self.m.sl)
        free(self.m.hd)

    def _hold_guard(self, on):
        """Tests only: take the writer flag as a writer would (refusing like one), or,
        with ``on`` false, release it."""
        _check_self(self)
        guard_hold(&self._g, NAME, on)

    # -- configuration ------------------------------------------------------------
    @property
    def min_n(self):
        guard_check(&self._g, NAME)
        return self.m.min_n

    @property
    def max_n(self):
        guard_check(&self._g, NAME)
        return None if self.m.max_n >= UNBOUNDED else self.m.max_n

    @property
    def prefer(self):
        guard_check(&self._g, NAME)
        return "earliest" if self.m.earliest else "latest"

    @property
    def adaptive(self):
        guard_check(&self._g, NAME)
        return bool(self._st.adaptive)

    @property
    def draft_len(self):
        """The draft length ``propose()`` uses when ``max_k`` is None."""
        guard_check(&self._g, NAME)
        return self._st.draft_len

    # -- contents -------------------------------------------------------------------
    def __len__(self):
        guard_check(&self._g, NAME)
        return self._len

    @property
    def tokens(self):
        """The indexed tokens as a read-only int64 array (a view of the index's buffer
        once it holds int64, through a read-only memoryview so that its WRITEABLE flag
        cannot be set back; else a copy)."""
        guard_read(&self._g, NAME)   # the copy may let other threads run
        try:
            if self.m.wide:
                v = np.asarray(memoryview(self._buf[: self._len]).toreadonly())
            else:
                v = self._buf[: self._len].astype(np.int64)
        finally:
            guard_done_read(&self._g)
        v.flags.writeable = False
        return v

    def last_tokens(self, count):
        _check_self(self)
        k = check_count(count, "count")
        guard_read(&self._g, NAME)
        try:
            start = self._len - k if k < self._len else 0
            return self._buf[start : self._len].astype(np.int64)
        finally:
            guard_done_read(&self._g)

    @property
    def n_edges(self):
        """Transitions of the automaton."""
        guard_check(&self._g, NAME)  # the count below runs no Python code
        cdef int64_t i, total = self.m.npos + self.m.n_ed
        for i in range(self.m.n_cl):
            if self.m.cl[i].dst >= 0:
                total += 1
        return total

    @property
    def n_states(self):
        """States of the automaton, the root included."""
        guard_check(&self._g, NAME)
        return self.m.npos + 1 + self.m.n_cl

    @property
    def nbytes(self):
        """Bytes this index holds: the tokens, the position and clone records, the edges
        and both tables."""
        guard_check(&self._g, NAME)
        cdef int64_t per_pos = 4 + (4 if not self.m.earliest else 0)
        cdef int64_t per_clone = sizeof(clone_t) + (4 if not self.m.earliest else 0)
        return (self._buf.nbytes + (self._cap + 1) * per_pos + ((self._cap + 8) >> 3)
                + self.m.cap_cl * per_clone + self.m.cap_ed * sizeof(edge_t)
                + self.m.cap_sl * sizeof(slot_t) + self.m.cap_hd * sizeof(head_t))

    @property
    def bytes_per_token(self):
        """``nbytes`` per indexed token (0.0 while empty)."""
        guard_check(&self._g, NAME)
        return self.nbytes / (<double>self._len) if self._len else 0.0

    cdef int _set_buffer(self, object buf) except -1:
        """Make ``buf`` (int32 or int64, already holding the tokens) the token buffer."""
        cdef int32_t[::1] v32
        cdef int64_t[::1] v64
        self._buf = buf              # views handed out keep the old buffer alive
        if buf.dtype == np.int64:
            v64 = buf
            self.m.t64 = &v64[0]
            self.m.t32 = NULL
            self.m.wide = True
        else:
            v32 = buf
            self.m.t32 = &v32[0]
            self.m.t64 = NULL
            self.m.wide = False
        return 0

    cdef int _grow_buffer(self, int64_t need) except -1:
        """Room for ``need`` tokens: the token buffer and the position arrays (one entry
        more: state i + 1 belongs to position i)."""
        cdef int64_t cap = self._cap + (self._cap >> 1) + 16
        cdef int32_t* nl
        cdef uint8_t* nb
        if cap < need:
            cap = need
        if cap > MAX_TOKENS_C:
            cap = MAX_TOKENS_C
        if cap <= self._cap:
            return 0
        new = np.empty(cap, dtype=np.int64 if self.m.wide else np.int32)
        new[: self._len] = self._buf[: self._len]
        nl = <int32_t*>realloc(self.m.plink, (cap + 1) * sizeof(int32_t))
        if nl == NULL:
            raise MemoryError()
        self.m.plink = nl
        if not self.m.earliest:
            nl = <int32_t*>realloc(self.m.plast, (cap + 1) * sizeof(int32_t))
            if nl == NULL:
                raise MemoryError()
            self.m.plast = nl
        nb = <uint8_t*>realloc(self.m.pbits, (cap + 8) >> 3)
        if nb == NULL:
            raise MemoryError()
        memset(nb + ((self._cap + 8) >> 3), 0, ((cap + 8) >> 3) - ((self._cap + 8) >> 3))
        if self._cap == 0:
            nb[0] = 0
        self.m.pbits = nb
        self._set_buffer(new)
        self._cap = cap
        return 0

    cdef int _widen(self) except -1:
        """Hold the tokens as int64 from now on (a token beyond int32 is coming)."""
        if not self.m.wide:
            self._set_buffer(self._buf.astype(np.int64))
        return 0

    cdef int _store(self, object arr, int64_t at) except -1:
        """Write the converted tokens ``arr`` (int32 or int64 from ``as_ids``, possibly
        the caller's array) at positions at.. of the buffer, widening it when a token
        does not fit int32. The buffer has room."""
        cdef int64_t m = arr.shape[0]
        if not self.m.wide and arr.dtype != np.int32:
            arr = np.array(arr, dtype=np.int64, copy=True)   # ours: checked is what is stored
            if m and (arr.min() < INT32_LO or arr.max() > INT32_HI):
                self._widen()
        self._buf[at : at + m] = arr
        return 0

    def extend(self, tokens):
        cdef int64_t m, i, v
        cdef Py_ssize_t n
        _check_self(self)
        # take the guard first: nothing below may run while another call holds it
        guard_write(&self._g, NAME)
        try:
            if type(tokens) is list and Py_SIZE(tokens) <= SMALL_LIST:
                # a few exact ints, read in C. Growing the buffer may run Python code or
                # let other threads run (numpy), so the list's size is read again after
                # it; the loop itself runs none (a token that needs the int64 buffer, or
                # anything but an exact int, leaves for the general path, which converts
                # the list into memory of its own before reading it)
                n = Py_SIZE(tokens)
                if self._len + n > self._cap and self._len + n <= MAX_TOKENS_C:
                    self._grow_buffer(self._len + n)
                if self._len + n <= self._cap and n == Py_SIZE(tokens):
                    for i in range(n):
                        t = (<list>tokens)[i]
                        if type(t) is not int:
                            break
                        try:
                            v = t
                        except OverflowError:
                            break
                        if self.m.wide:
                            self.m.t64[self._len + i] = v
                        elif INT32_LO <= v <= INT32_HI:
                            self.m.t32[self._len + i] = <int32_t>v
                        else:
                            break
                    else:
                        self._ingest(n)
                        return
            arr = token_ids(tokens, "tokens")
            m = arr.shape[0]
            if m == 0:
                return
            if m > MAX_TOKENS_C - self._len:
                raise OverflowError(
                    f"a SuffixIndex holds at most {MAX_TOKENS_C} tokens; "
                    f"{self._len} + {m} is too many"
                )
            if self._len + m > self._cap:
                self._grow_buffer(self._len + m)
            self._store(arr, self._len)
            self._ingest(m)
        finally:
            guard_done_write(&self._g)

    def append(self, token):
        cdef int64_t v
        _check_self(self)
        if (type(token) is int and self._len < self._cap and self._g.phase == GUARD_READY
                and not self._g.writing and not self._g.readers):
            try:
                v = token
            except OverflowError:
                pass
            else:
                if self.m.wide or INT32_LO <= v <= INT32_HI:
                    self._g.writing = 1
                    try:
                        if self.m.wide:
                            self.m.t64[self._len] = v
                        else:
                            self.m.t32[self._len] = <int32_t>v
                        self._ingest(1)
                    finally:
                        guard_done_write(&self._g)
                    return
        self.extend([token])

    cdef int _ingest(self, int64_t m) except -1:
        """Index the m tokens already written at positions _len.._len + m - 1 (the
        caller holds the writer flag)."""
        cdef int64_t start = self._len, total = self._len + m, done
        if m == 0:
            return 0
        if m >= NOGIL_MIN:
            with nogil:
                done = _add_range(&self.m, start, total)
        else:
            done = _add_range(&self.m, start, total)
        self._settle(done, total)
        return 0

    cdef int _settle(self, int64_t done, int64_t total) except -1:
        """After indexing up to ``total``: ``done`` positions were indexed."""
        self._len = done
        if done < total:
            guard_break(&self._g)
            raise MemoryError(
                f"SuffixIndex could not grow its tables (after {done} tokens): out of memory "
                "or past 2**30 - 1 states or 2**31 - 1 edges; the index is unusable now"
            )
        return 0

    def propose(self, max_k=None):
        cdef int64_t k, end, i, stop
        _check_self(self)
        k = _propose_limit(&self._st, max_k, &self._len)   # may run Python code: before the check
        # checked after the conversion; the copy below lets no other thread run (it
        # allocates no object the garbage collector tracks but the list itself, first)
        if self._g.phase != GUARD_READY or self._g.writing:
            guard_check(&self._g, NAME)
        end = _start(&self.m)
        if end < 0 or k <= 0:
            return []
        stop = end + k if end + k < self._len else self._len
        if self.m.wide:
            return [self.m.t64[i] for i in range(end, stop)]
        return [self.m.t32[i] for i in range(end, stop)]

    def propose_tree(self, budget, max_depth=None, max_width=None):
        cdef int64_t b, d, w
        _check_self(self)
        if (type(budget) is int and 1 <= budget <= TREE_NODES
                and (max_depth is None or (type(max_depth) is int and 1 <= max_depth <= TREE_NODES))
                and (max_width is None or (type(max_width) is int and 1 <= max_width <= TREE_NODES))):
            b = budget      # the common call: plain ints in range or None, no Python code runs
            d = b if max_depth is None else max_depth
            w = TREE_WIDTH if max_width is None else max_width
        else:
            b, d, w = check_tree_args(budget, max_depth, max_width)   # may run Python code
        guard_check(&self._g, NAME)   # then nothing runs Python code until the tree is built
        return _tree_arrays(&self.m, self._len, b, d, w)

    def lookup(self, context, max_k=None):
        cdef int64_t k, n = 0, i, e, stop, c
        cdef int32_t s = 0, d, ref
        _check_self(self)
        guard_check(&self._g, NAME)
        if max_k is None:
            k = self._st.draft_len
        else:
            k = min(check_count(max_k, "max_k"), MAX_TOKENS_C)
        arr = np.array(token_ids(context, "context"), dtype=np.int64, copy=True)
        cdef const int64_t[::1] cv = arr
        # converting may have let another thread in: check again, then keep the GIL
        guard_check(&self._g, NAME)
        cdef sam_t* m = &self.m
        for i in range(cv.shape[0]):
            c = cv[i]
            while s != 0 and _find(m, s, c, &ref) < 0:
                s = _link(m, s)
                n = _len(m, s)
            d = _find(m, s, c, &ref)
            if d < 0:
                s = 0
                n = 0
            else:
                s = d
                n += 1
        if n > m.max_n:
            n = m.max_n
            while _len(m, _link(m, s)) >= n:
                s = _link(m, s)
        if n < m.min_n or n == 0:
            return 0, []
        e = _first(m, s) + 1
        stop = e + k if e + k < self._len else self._len
        return n, [_tk(m, i) for i in range(e, stop)]

    def serve(self, tokens, drafted=0, accepted=0, max_k=None):
        _check_self(self)
        src, d, a, k = _serve_args(tokens, drafted, accepted, max_k, MAX_TOKENS_C)
        return _serve_one(suffix_serve, self, src, d, a, k, MAX_TOKENS_C)

    def match_length(self):
        _check_self(self)
        guard_check(&self._g, NAME)
        return self.m.match_len if self.m.match_end >= 0 else 0

    def match_end(self):
        _check_self(self)
        guard_check(&self._g, NAME)
        return _start(&self.m)

    @property
    def anchor_n(self):
        """Matches at least this long set the anchor (0: no anchor)."""
        guard_check(&self._g, NAME)
        return self.m.anchor_n

    @property
    def anchor_span(self):
        """How many tokens past the last long match the anchor keeps drafting."""
        guard_check(&self._g, NAME)
        return self.m.anchor_span

    @property
    def anchor_misses(self):
        """How many appended tokens may differ from the anchored text before the anchor
        is dropped."""
        guard_check(&self._g, NAME)
        return self.m.anchor_misses

    # -- acceptance statistics and the adaptive draft length ---------------------
    def record(self, proposed, accepted):
        _check_self(self)
        return _record_one(&self._g, &self._st, proposed, accepted)

    @property
    def stats(self):
        """Acceptance statistics: steps recorded, tokens drafted and accepted, fully
        accepted drafts, the acceptance rate and the current draft length."""
        return _stats_dict(&self._g, &self._st)

    def __repr__(self):
        if self._g.phase != GUARD_READY:
            return "SuffixIndex(<not initialised or unusable>)"
        hi = None if self.m.max_n >= UNBOUNDED else self.m.max_n
        prefer = "earliest" if self.m.earliest else "latest"
        return f"SuffixIndex(min_n={self.m.min_n}, max_n={hi}, prefer={prefer!r}, len={self._len})"

    def __reduce__(self):
        # pickled (and copied) as its settings, tokens and statistics; re-indexed on load
        _check_self(self)
        guard_read(&self._g, NAME)   # the token copy may let other threads run
        try:
            return (
                _rebuild,
                (type(self), self.m.min_n, None if self.m.max_n >= UNBOUNDED else self.m.max_n,
                 "earliest" if self.m.earliest else "latest", self._st.draft_len,
                 bool(self._st.adaptive), self._st.min_draft, self._st.max_draft,
                 np.array(self.tokens), _stats_tuple(&self._st), self.m.anchor_n,
                 self.m.anchor_span, self.m.anchor_misses),
            )
        finally:
            guard_done_read(&self._g)

    def _restore_stats(self, stats):
        _check_self(self)
        _stats_restore(&self._g, &self._st, stats)


def _rebuild(cls, lo, hi, prefer, k, adaptive, kmin, kmax, tokens, stats, an=0, aspan=64, amiss=4):
    if not (isinstance(cls, type) and issubclass(cls, SuffixIndex)):
        raise TypeError(f"cannot rebuild a SuffixIndex as {cls!r}")
    ix = cls(lo, hi, prefer, draft_len=k, adaptive=bool(adaptive), min_draft=kmin,
             max_draft=kmax, anchor_n=an, anchor_span=aspan, anchor_misses=amiss)
    ix.extend(tokens)
    ix._restore_stats(stats)
    return ix


# what _index_common.pxi and _serve.pxi ask of this module's index class
cdef inline bint _is_index(object o):
    return type(o) is SuffixIndex or isinstance(o, SuffixIndex)


cdef inline guard_t* _guard_of(object o) noexcept:
    return &(<SuffixIndex>o)._g


cdef inline index_stats_t* _stats_of(object o) noexcept:
    return &(<SuffixIndex>o)._st


cdef inline int64_t _len_of(object o) noexcept:
    return (<SuffixIndex>o)._len


include "_suffix_batch.pxi"
