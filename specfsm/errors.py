"""Errors raised by the serving state machine."""

from __future__ import annotations

__all__ = ["ServingFsmError", "IllegalTransition", "NegativeToken"]


class ServingFsmError(Exception):
    """Base class of every error the serving state machine raises."""


class IllegalTransition(ServingFsmError):
    """A transition was invoked on a state it does not apply to, or with rows it cannot settle.

    ``attempted`` names the transition (``"accept"``, ``"resume"``, ...) and ``reason``
    says why it was refused, or is None for the plain case of a call from the wrong state.
    ``str(e)`` is ``serving fsm: <attempted> is not legal from the current state`` for a
    wrong-state call (the original Rust design's message, kept word for word), and
    ``serving fsm: <attempted> is not legal: <reason>`` otherwise, e.g.
    ``serving fsm: accept is not legal: row_caches has 3 entries for a 4-token draft``.

    ``BatchState`` refuses a whole call at once and also sets ``slots`` (the slots it
    refused) and ``states`` (the state each was in); they are None on other refusals.
    """

    slots: list[int] | None = None
    states: list[str] | None = None

    def __init__(self, attempted: str, reason: str | None = None) -> None:
        if not isinstance(attempted, str):
            raise TypeError(f"attempted must be a transition name (str), got {attempted!r}")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a str or None, got {type(reason).__name__} {reason!r}")
        super().__init__(attempted)
        self.attempted = attempted
        self.reason = reason

    def __str__(self) -> str:
        if self.reason is None:
            return f"serving fsm: {self.attempted} is not legal from the current state"
        return f"serving fsm: {self.attempted} is not legal: {self.reason}"

    def __repr__(self) -> str:
        if self.reason is None:
            return f"{type(self).__name__}({self.attempted!r})"
        return f"{type(self).__name__}({self.attempted!r}, {self.reason!r})"

    def __reduce__(self) -> tuple[type, tuple[str, str | None]]:
        return (type(self), (self.attempted, self.reason))

    # Errors compare by kind and transition, as the original design's derived equality
    # does (the reason is an explanation, not part of the error's identity).
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IllegalTransition):
            return NotImplemented
        return type(self) is type(other) and self.attempted == other.attempted

    def __hash__(self) -> int:
        return hash((type(self), self.attempted))


class NegativeToken(ValueError):
    """``BatchState.step`` refused to emit a negative token id (``row`` is the flat row of
    ``row_tokens`` that holds it): a target answered a sentinel (-1, say) in a row whose
    token the step would emit."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return (type(self), (self.args[0], self.row))
