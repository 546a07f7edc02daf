"""The seed's action-speculation fixture, driven through the real state machine.

An environment of integer values under keys 0, 1, 2 with a version counter; an agent
chooses ``key = version % 3`` and ``delta = min(v + 1, 10 - v)`` until every value is 10
(then it chooses nothing: ``None``). Entries are actions, the cache is the environment.

Speculation: the drafter proposes a macro of ``K`` actions that repeats the delta the
agent would choose now across the next keys and versions. Verifying a draft row ``i``
means the agent's own choice in the environment reached by the first ``i`` drafted
actions (row 0: the current environment); ``row_caches[i]`` is that environment after
the agent's own choice at row ``i``, so resuming from it after a rejection at row ``i``
(or after accepting every row) is exactly where the sequential run would be.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specfsm import Accept, Decode, Rollback, ServingState

TARGET = 10
K = 4


@dataclass(frozen=True)
class Action:
    key: int
    delta: int
    version: int


@dataclass(frozen=True)
class Environment:
    values: tuple[int, int, int] = (0, 0, 0)
    version: int = 0

    def apply(self, action: Action | None) -> "Environment":
        if action is None:
            return self
        values = list(self.values)
        values[action.key] += action.delta
        return Environment(tuple(values), self.version + 1)  # type: ignore[arg-type]

    @property
    def finished(self) -> bool:
        return all(v == TARGET for v in self.values)


def agent(env: Environment) -> Action | None:
    """The sequential policy; ``None`` once every value has reached the target."""
    if env.finished:
        return None
    key = env.version % 3
    v = env.values[key]
    return Action(key, min(v + 1, TARGET - v), env.version)


def draft_macro(env: Environment, k: int = K) -> list[Action]:
    """Repeat the delta the agent would choose now across the next ``k`` keys."""
    first = agent(env)
    if first is None:
        return []
    return [Action((env.version + i) % 3, first.delta, env.version + i) for i in range(k)]


@dataclass
class Trace:
    history: list[Action] = field(default_factory=list)
    environment: Environment = field(default_factory=Environment)
    rounds: int = 0
    rejected_rounds: int = 0
    accepted_rows: int = 0


def run_sequential() -> Trace:
    trace = Trace()
    env = Environment()
    while (action := agent(env)) is not None:
        trace.history.append(action)
        env = env.apply(action)
    trace.environment = env
    return trace


def run_speculative(policy) -> Trace:
    """Drive the agent through Prefill -> Decode -> Verify -> Accept|Rollback -> ... -> Done,
    with ``policy(draft, choices) -> accepted`` deciding each verify round via ``accept_rows``."""
    trace = Trace()
    env = Environment()
    first = agent(env)
    assert first is not None
    env = env.apply(first)
    trace.history.append(first)
    state: ServingState = ServingState.start([], Environment()).advance_prefill(first, env)
    while not state.cache.finished:
        assert isinstance(state, Decode)
        draft = draft_macro(state.cache)
        state = state.enter_verify(draft)
        choices, row_caches = [], []
        env = state.cache
        for drafted in draft:
            chosen = agent(env)
            choices.append(chosen)
            row_caches.append(env.apply(chosen))
            env = env.apply(drafted)
        accepted = policy(draft, choices)
        trace.rounds += 1
        trace.accepted_rows += accepted
        state = state.accept_rows(accepted, choices, row_caches)
        if isinstance(state, Accept):
            trace.history.extend(draft)
            state = state.resume()
        else:
            assert isinstance(state, Rollback)
            trace.rejected_rounds += 1
            trace.history.extend(draft[:accepted])
            if state.to is not None:
                trace.history.append(state.to)
            state = state.rollback()
    done = state.finish()
    trace.environment = done.cache
    return trace
