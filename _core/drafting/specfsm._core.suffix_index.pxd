# The cross-module face of specfsm._core.suffix_index: the serving-step policy, cimported
# by the batch step (specfsm._core.batch) as ``from specfsm._core.suffix_index cimport
# suffix_serve``.
from libc.stdint cimport int64_t

cdef int suffix_serve(list indexes, Py_ssize_t b, const int64_t* tokens,
                      const int64_t* offsets, const int64_t* drafted, const int64_t* accepted,
                      const int64_t* limits, Py_ssize_t k_cap, int64_t* out_tokens,
                      int64_t* out_lens) except -1
