"""Turning token arguments into something both twins can scan."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._validate import as_token_array


def as_entries(x: object, name: str) -> Sequence:
    """A list/tuple as it is, an integer ndarray as a list of Python ints.

    Refuses other objects, 2-D arrays and unsupported dtypes.
    """
    if type(x) is list or type(x) is tuple:
        return x  # type: ignore[return-value]
    if isinstance(x, np.ndarray):
        return as_token_array(x, name).tolist()
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes, bytearray)):
        return list(x)
    raise TypeError(
        f"{name} must be a list, tuple or 1-D integer numpy array, got {type(x).__name__}"
    )
