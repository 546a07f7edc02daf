"""The one guard of every object with buffers that calls read or write (pure-Python twin of
``_core/common/_guard.pxd``: the same phases, the same refusals, the same messages).

An object made with ``__new__`` and never initialised has no ``_guard`` attribute and is
refused like an UNINIT one (``guard_of``). ``__init__`` calls ``begin_init`` first (a
second ``__init__`` is refused) and ``end_init`` last; readers count themselves
(``read``/``done_read``), a writer holds the flag (``write``/``done_write``), a failure
that leaves the buffers inconsistent breaks the object for good (``broken``).
"""

from __future__ import annotations

import threading

__all__ = ["Guard", "guard_of", "begin_init", "UNINIT", "INITIALISING", "READY", "BROKEN"]

UNINIT, INITIALISING, READY, BROKEN = 0, 1, 2, 3


class Guard:
    """Phase, writer flag and reader count of one object (see the module docstring)."""

    __slots__ = ("phase", "writing", "readers", "name", "_lock")

    def __init__(self, name: str) -> None:
        self.phase = UNINIT
        self.writing = False
        self.readers = 0
        self.name = name
        # check-and-set is atomic across threads; re-entrant, because the garbage
        # collector may run a finaliser that calls this object inside a held section
        self._lock = threading.RLock()

    def begin_init(self) -> None:
        with self._lock:
            if self.phase != UNINIT:
                raise RuntimeError(f"{self.name}.__init__ may be called only once")
            self.phase = INITIALISING

    def end_init(self) -> None:
        self.phase = READY

    def _check(self) -> None:
        if self.phase != READY:
            if self.phase == BROKEN:
                raise RuntimeError(
                    f"{self.name} ran out of memory part way through a change and is unusable"
                )
            raise RuntimeError(f"{self.name} was not initialised (its __init__ never completed)")
        if self.writing:
            raise RuntimeError(
                f"{self.name} is being changed (by another thread, or by a callback inside a call on it)"
            )

    def check(self) -> None:
        """Refuse unless ready and no writer holds the buffers."""
        with self._lock:
            self._check()

    def write(self) -> None:
        with self._lock:
            self._check()
            if self.readers:
                raise RuntimeError(f"{self.name} is being read by another thread")
            self.writing = True

    def done_write(self) -> None:
        self.writing = False

    def read(self) -> None:
        with self._lock:
            self._check()
            self.readers += 1

    def done_read(self) -> None:
        with self._lock:
            self.readers -= 1

    def hold(self, on: object) -> None:
        """The ``_hold_guard(on)`` test hook: take the writer flag as a writer would
        (refusing like one), or, with ``on`` false, release it (``guard_hold``)."""
        if on:
            self.write()
        else:
            self.done_write()

    def broken(self) -> None:
        self.phase = BROKEN


def guard_of(obj: object, name: str) -> Guard:
    """``obj``'s guard; a refusing UNINIT one for an object whose ``__init__`` never ran."""
    try:
        return obj._guard  # type: ignore[attr-defined,no-any-return]
    except AttributeError:
        return Guard(name)


_create_lock = threading.RLock()  # re-entrant: a collection inside may create a guard too


def begin_init(obj: object, name: str) -> Guard:
    """The first statement of ``__init__``: ``obj``'s guard (created on first use), moved
    to INITIALISING; a second ``__init__`` (any thread) raises RuntimeError and changes
    nothing. Call ``end_init`` on it as ``__init__``'s last statement."""
    with _create_lock:
        try:
            g = obj._guard  # type: ignore[attr-defined]
        except AttributeError:
            g = Guard(name)
            object.__setattr__(obj, "_guard", g)
    g.begin_init()
    return g  # type: ignore[no-any-return]
