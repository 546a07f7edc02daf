"""The public ``BatchState`` over one implementation's kernel class, for the tests that
compare the compiled core with its twin (``specfsm._impl.kernels(kind, "batch")``, the
one way to ask for an implementation): the kernel class with the public class's
``state_of``, cached per kernel class."""

from __future__ import annotations

from types import ModuleType

from specfsm.machine import batch

_OVER: dict[type, type] = {batch._active.BatchState: batch.BatchState}


def over(kernels: ModuleType) -> type[batch.BatchState]:
    """``specfsm.machine.batch.BatchState`` over ``kernels.BatchState``; the active
    implementation's is ``BatchState`` itself."""
    base = kernels.BatchState
    cls = _OVER.get(base)
    if cls is None:
        cls = _OVER[base] = type("BatchState", (base,), {
            "__slots__": (), "__module__": batch.__name__, "__doc__": batch.BatchState.__doc__,
            "state_of": batch.BatchState.state_of,
        })
    return cls
