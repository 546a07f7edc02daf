# The (tokens, offsets) contract in C, written once for every compiled entry that reads
# ragged rows; its Python side is specfsm._checks.check_offsets, which a failing call
# goes through for the message (so both implementations refuse alike).
from libc.stdint cimport int64_t


cdef inline int64_t longest_row(const int64_t* o, Py_ssize_t m, int64_t total,
                                int64_t shortest) noexcept nogil:
    """The longest row of the ``m`` offsets ``o`` into ``total`` entries, or -1 where
    they break the contract: at least one entry, ``o[0] == 0``, ``o[m - 1] == total``,
    and every row at least ``shortest`` long (0: never decreasing; 1: no empty row).
    Neighbours are compared before they are subtracted: once in order both lie in
    [0, total], so the difference cannot wrap."""
    cdef Py_ssize_t k
    cdef int64_t longest = 0, step
    if m == 0 or o[0] != 0 or o[m - 1] != total:
        return -1
    for k in range(m - 1):
        if o[k] > o[k + 1]:
            return -1
        step = o[k + 1] - o[k]
        if step < shortest:
            return -1
        if step > longest:
            longest = step
    return longest
