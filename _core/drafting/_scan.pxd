# The vectorised token search of scan.h, wrapped once for both token widths: the
# stateless longest-match scans of ngram.pyx (prompt_lookup) and ngram_index.pyx
# (longest_match) cimport these, and the suffix index's tree scan (_suffix_tree.pxi).
from libc.stdint cimport int32_t, int64_t

from _typedefs cimport token_t

cdef extern from "scan.h" nogil:
    Py_ssize_t specfsm_find_last_i32(const int32_t* p, Py_ssize_t lo, Py_ssize_t hi, int32_t v)
    Py_ssize_t specfsm_find_last_i64(const int64_t* p, Py_ssize_t lo, Py_ssize_t hi, int64_t v)
    Py_ssize_t specfsm_find_first_i32(const int32_t* p, Py_ssize_t lo, Py_ssize_t hi, int32_t v)
    Py_ssize_t specfsm_find_first_i64(const int64_t* p, Py_ssize_t lo, Py_ssize_t hi, int64_t v)
    Py_ssize_t specfsm_find_last_pair_i32(const int32_t* p, Py_ssize_t lo, Py_ssize_t hi, int32_t u, int32_t v)
    Py_ssize_t specfsm_find_last_pair_i64(const int64_t* p, Py_ssize_t lo, Py_ssize_t hi, int64_t u, int64_t v)


cdef inline Py_ssize_t find_last(const token_t* p, Py_ssize_t lo, Py_ssize_t hi,
                                 token_t v) noexcept nogil:
    """The largest e in [lo, hi] with p[e] == v, or -1."""
    if token_t is int32_t:
        return specfsm_find_last_i32(p, lo, hi, v)
    else:
        return specfsm_find_last_i64(p, lo, hi, v)


cdef inline Py_ssize_t find_first(const token_t* p, Py_ssize_t lo, Py_ssize_t hi,
                                  token_t v) noexcept nogil:
    """The smallest e in [lo, hi] with p[e] == v, or -1."""
    if token_t is int32_t:
        return specfsm_find_first_i32(p, lo, hi, v)
    else:
        return specfsm_find_first_i64(p, lo, hi, v)


cdef inline Py_ssize_t find_last_pair(const token_t* p, Py_ssize_t lo, Py_ssize_t hi, token_t u,
                                      token_t v) noexcept nogil:
    """The largest e in [lo, hi] (lo >= 1) with p[e - 1] == u and p[e] == v, or -1."""
    if token_t is int32_t:
        return specfsm_find_last_pair_i32(p, lo, hi, u, v)
    else:
        return specfsm_find_last_pair_i64(p, lo, hi, u, v)
