"""Structural equality, hashing and snapshot copies for state fields.

Sequence fields (``positions``, ``draft``) compare by contents whether list, tuple or
numpy array; caches compare by contents when they are arrays (numpy, or anything else
that compares elementwise), recursing into lists, tuples and dicts of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["seq_eq", "value_eq", "hash_key", "default_clone", "IMMUTABLE"]


def seq_eq(a: object, b: object) -> bool:
    """Contents equality of two token sequences (list, tuple or 1-D array)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _array_eq(a, b)
    try:
        if len(a) != len(b):  # type: ignore[arg-type]
            return False
    except TypeError:
        return value_eq(a, b)
    return all(value_eq(x, y) for x, y in zip(a, b))  # type: ignore[call-overload]


def _array_eq(a: object, b: object) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except (TypeError, ValueError):
        return False


def value_eq(a: object, b: object) -> bool:
    """Equality of two field values, by contents for arrays and containers of arrays."""
    if a is b:
        return True
    ta, tb = type(a), type(b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _array_eq(a, b)
    if ta in (list, tuple) and tb in (list, tuple):
        return len(a) == len(b) and all(value_eq(x, y) for x, y in zip(a, b))  # type: ignore[arg-type,call-overload]
    if ta is dict and tb is dict:
        return a.keys() == b.keys() and all(value_eq(a[k], b[k]) for k in a)  # type: ignore[attr-defined,index]
    try:
        result = a == b
    except (TypeError, ValueError, RuntimeError):  # e.g. torch refusing unlike shapes
        return False
    if type(result) is bool:
        return result
    try:
        return bool(result)
    except (TypeError, ValueError, RuntimeError):
        # an elementwise result (CuPy, torch): equal when shapes and every element agree
        if getattr(a, "shape", None) != getattr(b, "shape", None):
            return False
        return bool(result.all())


def hash_key(v: object) -> object:
    """A hashable stand-in for ``v`` that is equal exactly when ``value_eq`` says so."""
    t = type(v)
    if t is list or t is tuple:
        return tuple(hash_key(x) for x in v)  # type: ignore[attr-defined]
    if isinstance(v, np.ndarray):
        return hash_key(v.tolist())
    if t is dict:
        return frozenset((k, hash_key(x)) for k, x in v.items())  # type: ignore[attr-defined]
    return v


# the types a snapshot shares (nothing can change them in place); state.py tests a cache
# against it before calling default_clone, so the usual int handle costs one set lookup
IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None), range, frozenset})


def default_clone(cache: object) -> object:
    """The snapshot ``enter_verify`` takes of a cache by default: the pre-draft contents.

    Arrays are copied (numpy on the host, CuPy on its device, torch tensors cloned);
    lists, dicts and tuples are rebuilt around copies of what they hold (a tuple of
    immutable values is kept as it is); sets and bytearrays are copied; any other object
    with a ``clone()`` or ``copy()`` method is copied through it; immutable values (int,
    str, bytes, None...) and objects without such a method are shared (pass a callable
    ``clone=`` to ``enter_verify`` for those).
    """
    t = type(cache)
    if t in IMMUTABLE:
        return cache
    if t is np.ndarray:
        return cache.copy()  # type: ignore[attr-defined]
    if t is list:
        return [default_clone(x) for x in cache]  # type: ignore[attr-defined]
    if t is dict:
        return {k: default_clone(x) for k, x in cache.items()}  # type: ignore[attr-defined]
    if isinstance(cache, tuple):
        items = [default_clone(x) for x in cache]
        if all(x is y for x, y in zip(items, cache)):
            return cache
        return t._make(items) if hasattr(t, "_make") else t(items)  # type: ignore[attr-defined,call-arg]
    if isinstance(cache, np.ndarray):
        return cache.copy()
    module = t.__module__.partition(".")[0]
    if module == "cupy":  # a device copy on the array's own device (no import of CuPy here)
        with cache.device:  # type: ignore[attr-defined]
            return cache.copy()  # type: ignore[attr-defined]
    if module == "torch" and hasattr(cache, "clone"):
        return cache.clone()  # type: ignore[attr-defined]
    if t in (set, bytearray):
        return t(cache)  # type: ignore[call-arg,call-overload]
    for name in ("clone", "copy"):  # any other object that can copy itself
        method = getattr(cache, name, None)
        if callable(method):
            return method()
    return cache


Clone = Callable[[object], object]
