"""TRANSITIONAL: the old names of the argument checks, mapped to the concept modules.

This module exists for one round only, so the callers that still import it keep
working; ``/work/helpers/rewrite_checks.py`` rewrites their imports to the new modules
and names, after which this file is deleted. Every old name below is the new function
(or a one-line adapter with the old call signature); where the old function's rule was
looser, the strict one applies now. The checks themselves live in ``_checks``
(foundation: counts, token ids, (tokens, offsets), reals, missing arguments),
``_checks_machine``, ``_checks_accept``, ``_checks_drafting`` and ``_checks_place``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._checks import (  # noqa: F401  (re-exported under the old names)
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    REQUIRED,
    as_real,
    check_count,
    check_real,
    entries,
    int64_ids,
    nonnegative_real,
    token_ids,
)
from ._checks import missing as _missing  # noqa: F401
from ._checks import token_id as id_value  # noqa: F401
from ._checks_accept import (  # noqa: F401
    PROB_ATOL,
    PROB_BADSUM,
    PROB_NEGATIVE,
    PROB_NONFINITE,
    PROB_OK,
    R_EXACT,
    R_MINRUN,
    R_OTHER,
    R_SPEC,
    R_TYPICAL,
    as_prob_rows,
    as_uniforms,
    check_id_range,
    check_uniforms,
    draw_uniforms,
    prepare_exact,
    prepare_speculative,
    prepare_typical,
    prob_error,
)
from ._checks_accept import draft_offsets as check_offsets  # noqa: F401
from ._checks_accept import rule_kind as _rule_kind  # noqa: F401
from ._checks_accept import step_probs as _probs_rows  # noqa: F401
from ._checks_drafting import (  # noqa: F401
    GROW_STEP,
    MAX_INDEX_TOKENS,
    MAX_LEVELS,
    MAX_SUFFIX_TOKENS,
    SHRINK_STEP,
    UNBOUNDED,
    check_anchor,
    check_batch_counts,
    check_draft_limits,
    check_prefer,
    check_record,
)
from ._checks_drafting import batch_offsets as own_offsets  # noqa: F401
from ._checks_drafting import batch_tokens as own_batch_arrays  # noqa: F401
from ._checks_drafting import check_stats as _check_stats  # noqa: F401
from ._checks_drafting import check_stats as check_suffix_stats  # noqa: F401
from ._checks_drafting import check_total as _check_total  # noqa: F401
from ._checks_drafting import checked_offsets as _check_offsets  # noqa: F401
from ._checks_drafting import index_offsets as validate_offsets  # noqa: F401
from ._checks_drafting import index_range as _check_index_range  # noqa: F401
from ._checks_drafting import ngram_range as _check_ngram_range  # noqa: F401
from ._checks_drafting import suffix_range as check_suffix_range  # noqa: F401
from ._checks_machine import (  # noqa: F401
    ACCEPT,
    DECODE,
    DONE,
    FREE,
    MAX_DRAFT,
    MAX_SLOTS,
    PREFILL,
    ROLLBACK,
    STATE_NAMES,
    VERIFY,
    settle_reason,
)
from ._checks_machine import check_capacity as _capacity  # noqa: F401
from ._checks_machine import check_index_types as _check_index_types  # noqa: F401
from ._checks_machine import check_slots as _slots  # noqa: F401
from ._checks_machine import illegal as _illegal  # noqa: F401
from ._checks_machine import per_slot as _per_slot  # noqa: F401
from ._checks_machine import resume_index as _resume_index  # noqa: F401
from ._checks_machine import slot_indexes as _indexes  # noqa: F401
from ._checks_machine import slot_ragged as _ragged  # noqa: F401
from ._checks_place import (  # noqa: F401
    as_host_index,
    as_settle_arrays,
    byte_bounds,
    check_place_arrays,
    host_index_array,
    index_reason,
    overlap_message,
    ranges_overlap,
    settle_index_reason,
)
from ._checks_place import count_array as _as_count_array  # noqa: F401


def as_token_array(arr: np.ndarray, name: str) -> np.ndarray:
    """Old name of ``_checks.token_ids``."""
    return token_ids(arr, name)


def as_id_array(x: object, name: str, own: bool = False) -> np.ndarray:
    """Old name of ``_checks.token_ids`` (``own`` positional)."""
    return token_ids(x, name, own=own)


def as_ids(tokens: object, name: str) -> np.ndarray:
    """Old name of ``_checks.token_ids``."""
    return token_ids(tokens, name)


def _ids(x: object, name: str) -> np.ndarray:
    """Old name of ``_checks.int64_ids``."""
    return int64_ids(x, name)


def as_offsets(offsets: object, name: str = "offsets") -> np.ndarray:
    """Old name of ``_checks.int64_ids`` for offsets."""
    return int64_ids(offsets, name)


def as_entries(x: object, name: str) -> Any:
    """Old name of ``_checks.entries(x, name, listed=True)``."""
    return entries(x, name, listed=True)


def check_entries(tokens: Any, name: str) -> Any:
    """Old name of ``_checks.entries(tokens, name)``."""
    return entries(tokens, name)
