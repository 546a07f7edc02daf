# The acceptance statistics and adaptive draft length both index kinds keep (the n-gram
# index, specfsm._core.ngram_index, and the suffix index, specfsm._core.suffix_index),
# as one C struct and its C operations, cimported by both (``from _index_stats cimport
# ...``). The Python faces built on it (``stats``, ``record``, pickling) are in
# _index_common.pxi. The policy, the twin's too (specfsm._py): ``record(p, a)`` counts a
# step, ``p`` drafted and ``a`` accepted tokens (a full accept when a == p > 0); an
# adaptive index lengthens its draft by ``grow`` after a full accept and shortens it by
# ``shrink`` after a rejection, within [min_draft, max_draft].
from libc.stdint cimport int64_t, INT64_MAX

ctypedef struct index_stats_t:
    int64_t steps         # record calls
    int64_t drafted       # tokens drafted (at most int64's maximum: see stats_fits)
    int64_t accepted      # tokens accepted of them
    int64_t full          # drafts accepted whole
    int64_t draft_len     # the draft length propose() uses when max_k is None
    int64_t min_draft, max_draft
    int64_t pending       # record_batch: drafted tokens this call adds (an index listed twice)
    int64_t pending_steps # ... and steps
    bint adaptive


cdef inline void stats_init(index_stats_t* s, bint adaptive, int64_t draft_len,
                            int64_t min_draft, int64_t max_draft) noexcept nogil:
    s.steps = s.drafted = s.accepted = s.full = s.pending = s.pending_steps = 0
    s.adaptive = adaptive
    s.draft_len = draft_len
    s.min_draft = min_draft
    s.max_draft = max_draft


cdef inline bint stats_fits(const index_stats_t* s, int64_t proposed, int64_t more,
                            int64_t steps) noexcept nogil:
    """Whether ``proposed`` more drafted tokens (after ``more`` already pending) and
    ``steps`` more steps keep the drafted-token and step counts within int64 (compared,
    never added past the maximum; ``s.drafted + more`` and ``steps`` are known to be
    within int64 and non-negative)."""
    return proposed <= INT64_MAX - s.drafted - more and steps <= INT64_MAX - s.steps


cdef inline void stats_record(index_stats_t* s, int64_t p, int64_t a, int64_t grow,
                              int64_t shrink) noexcept nogil:
    """``record(p, a)`` on checked counts (0 <= a <= p, and ``stats_fits`` with a step)."""
    s.steps += 1
    s.drafted += p
    s.accepted += a
    if p > 0 and a == p:
        s.full += 1
    if s.adaptive and p > 0:
        if a == p:
            s.draft_len = s.draft_len + grow if s.draft_len + grow < s.max_draft else s.max_draft
        else:
            s.draft_len = s.draft_len - shrink if s.draft_len - shrink > s.min_draft else s.min_draft


cdef inline int64_t stats_limit(const index_stats_t* s, int64_t k) noexcept nogil:
    """A draft limit ``k`` bounded by the draft length when the index is adaptive."""
    if s.adaptive and s.draft_len < k:
        return s.draft_len
    return k
