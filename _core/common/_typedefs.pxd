# Shared declarations for the compiled core.
from libc.stdint cimport int32_t, int64_t

# Token ids: every kernel is specialised for both widths.
ctypedef fused token_t:
    int32_t
    int64_t
