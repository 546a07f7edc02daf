"""Errors raised by the serving state machine."""

from __future__ import annotations

__all__ = ["ServingFsmError", "IllegalTransition"]


class ServingFsmError(Exception):
    """Base class of every error the serving state machine raises."""


class IllegalTransition(ServingFsmError):
    """A transition was invoked on a state it does not apply to, or with rows it cannot settle.

    ``attempted`` names the transition (``"accept"``, ``"resume"``, ...). ``str(e)`` is
    ``serving fsm: <attempted> is not legal from the current state``, exactly as in the
    seed design; where the refusal has a more specific cause (a short ``row_tokens``, a
    ``row_caches`` of the wrong length) it is attached as a note and as ``reason``.
    """

    def __init__(self, attempted: str, reason: str | None = None) -> None:
        if not isinstance(attempted, str):
            raise TypeError(f"attempted must be a transition name (str), got {attempted!r}")
        super().__init__(attempted)
        self.attempted = attempted
        self.reason = reason
        if reason is not None and hasattr(self, "add_note"):
            self.add_note(f"reason: {reason}")

    def __str__(self) -> str:
        return f"serving fsm: {self.attempted} is not legal from the current state"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.attempted!r})"

    def __reduce__(self):
        return (type(self), (self.attempted, self.reason))

    # Errors compare like the seed's derived PartialEq: same kind, same transition.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IllegalTransition):
            return NotImplemented
        return type(self) is type(other) and self.attempted == other.attempted

    def __hash__(self) -> int:
        return hash((type(self), self.attempted))
