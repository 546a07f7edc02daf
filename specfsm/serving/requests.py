"""One request of the serving loop, what it cost and saved, and how its output compares
with plain greedy decoding: ``Request``, ``RequestStats``, ``RequestResult``,
``compare_outputs`` and ``SpeculationMismatch`` (``specfsm.serving.loop`` re-exports them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._checks import check_count
from ..machine.state import ServingState

__all__ = [
    "Request",
    "RequestStats",
    "RequestResult",
    "SpeculationMismatch",
    "compare_outputs",
    "at_least",
]


class SpeculationMismatch(RuntimeError):
    """A speculative output differs from the plain greedy output of the same request."""

    def __init__(self, mismatches: list[tuple[int, int]]) -> None:
        self.mismatches = mismatches  # (request index, first differing position)
        shown = ", ".join(f"request {i} at token {p}" for i, p in mismatches[:5])
        more = f" and {len(mismatches) - 5} more" if len(mismatches) > 5 else ""
        super().__init__(f"speculative output differs from plain greedy: {shown}{more}")


@dataclass
class Request:
    """One generation request: ``prompt`` (non-empty), at most ``max_tokens`` generated
    tokens (the prefill's token included), stopping after ``eos`` when given. ``target``
    overrides the loop's target for this request (a teacher-forced recording is one
    target per request); ``cache`` is the cache prefill starts from."""

    prompt: Sequence[Any]
    max_tokens: int
    eos: Any = None
    target: Any = None
    cache: Any = None
    name: str = ""

    def __post_init__(self) -> None:
        self.max_tokens = check_count(self.max_tokens, "max_tokens")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        try:
            n = len(self.prompt)
        except TypeError:
            raise TypeError(
                f"prompt must be a sequence of tokens, got {type(self.prompt).__name__}"
            ) from None
        if n == 0:
            raise ValueError("prompt must hold at least one token (prefill needs a row)")


@dataclass
class RequestStats:
    """What one request cost and what speculation saved.

    ``drafted_by_position[i]`` counts verify rounds whose draft reached position ``i``,
    ``accepted_by_position[i]`` those where position ``i`` was accepted. ``control_ns``
    is the wall time spent outside the target (drafting, state transitions, bookkeeping);
    ``target_ns`` the time inside it."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    prefills: int = 0
    decodes: int = 0
    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    rollbacks: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    control_ns: int = 0
    target_ns: int = 0

    @property
    def evaluations(self) -> int:
        """Target evaluations: one per prefill, decode and verify."""
        return self.prefills + self.decodes + self.verifies

    @property
    def tokens_per_evaluation(self) -> float:
        return self.output_tokens / self.evaluations if self.evaluations else 0.0

    @property
    def mean_accepted(self) -> float:
        """Draft tokens accepted per verify round."""
        return self.accepted / self.verifies if self.verifies else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def control_us_per_token(self) -> float:
        return self.control_ns / 1e3 / self.output_tokens if self.output_tokens else 0.0

    def counts(self) -> dict[str, Any]:
        """Every count (no timings): equal for runs that took the same decisions."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "prefills": self.prefills,
            "decodes": self.decodes,
            "verifies": self.verifies,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rollbacks": self.rollbacks,
            "drafted_by_position": list(self.drafted_by_position),
            "accepted_by_position": list(self.accepted_by_position),
        }

    def as_dict(self) -> dict[str, Any]:
        d = self.counts()
        d.update(
            evaluations=self.evaluations,
            tokens_per_evaluation=self.tokens_per_evaluation,
            mean_accepted=self.mean_accepted,
            acceptance_by_position=self.acceptance_by_position,
            control_ns=self.control_ns,
            target_ns=self.target_ns,
            control_us_per_token=self.control_us_per_token,
        )
        return d


@dataclass
class RequestResult:
    """The generated tokens, the stats, and the terminal ``Done`` state."""

    output: list[Any]
    stats: RequestStats
    state: ServingState


def at_least(hist: list[int]) -> list[int]:
    """From ``hist[j]`` = rounds with exactly ``j + 1`` (drafted or accepted) tokens, the
    rounds with at least ``i + 1``: the count at each draft position."""
    out = hist[:]
    for i in range(len(out) - 2, -1, -1):
        out[i] += out[i + 1]
    return out



def compare_outputs(
    speculative: Sequence[RequestResult | Sequence[Any]], greedy: Sequence[RequestResult | Sequence[Any]]
) -> list[tuple[int, int]]:
    """``(request index, first differing token position)`` for every request whose
    speculative output differs from its plain greedy output (empty: all identical)."""
    if len(speculative) != len(greedy):
        raise ValueError(
            f"speculative has {len(speculative)} results and greedy {len(greedy)}; they must pair up"
        )
    bad = []
    for i, (s, g) in enumerate(zip(speculative, greedy)):
        a = s.output if isinstance(s, RequestResult) else list(s)
        b = g.output if isinstance(g, RequestResult) else list(g)
        if a != b:
            p = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            bad.append((i, p))
    return bad


def raise_on_mismatch(spec: Sequence[RequestResult], greedy: Sequence[RequestResult]) -> None:
    bad = compare_outputs(spec, greedy)
    if bad:
        raise SpeculationMismatch(bad)
