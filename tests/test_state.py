"""The seed's tests, ported one for one (names kept), run against both implementations
through the ``fsm`` fixture, plus the Python API's contract."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import specfsm
from specfsm import (
    Accept,
    Decode,
    Done,
    IllegalTransition,
    Prefill,
    Rollback,
    ServingFsmError,
    ServingState,
    Verify,
)

from action_fixture import Action, Environment, run_sequential, run_speculative
from reference import leading_equal

pytestmark = pytest.mark.usefixtures("fsm")


@dataclass(frozen=True)
class FakeCache:
    """Stand-in for a layer cache: proves the FSM threads state through transitions."""

    conv_history_len: int = 0
    kv_len: int = 0

    def advanced_by(self, rows: int) -> "FakeCache":
        return FakeCache(self.conv_history_len + rows, self.kv_len + rows)


def empty() -> FakeCache:
    return FakeCache()


def test_serving_fsm_error_names_the_attempted_transition():
    accept = IllegalTransition("accept")
    resume = IllegalTransition("resume")
    assert str(accept) == "serving fsm: accept is not legal from the current state"
    assert str(resume) == "serving fsm: resume is not legal from the current state"
    assert accept.attempted == "accept"
    assert accept != resume
    assert accept == IllegalTransition("accept")
    assert isinstance(accept, ServingFsmError) and isinstance(accept, Exception)


def test_walk_prefill_decode_verify_finish():
    prefilled = ServingState.start([1, 2], 0)
    decoding = prefilled.advance_prefill(3, 1)
    decoding = decoding.advance_decode(4, 2)
    verifying = decoding.enter_verify([5])
    assert verifying == Verify(draft=[5], snapshot=2, cache=2)
    done = verifying.finish()
    assert done == Done(cache=2)
    with pytest.raises(IllegalTransition) as err:
        done.advance_decode(6, 3)
    assert err.value == IllegalTransition("advance_decode")


def test_serving_state_walkthrough_drives_every_legal_transition():
    prompt = [1, 2, 3]
    state = ServingState.start(prompt, empty())
    assert state == Prefill(positions=[1, 2, 3], cache=empty())

    after_prefill = empty().advanced_by(len(prompt))
    state = state.advance_prefill(4, after_prefill)
    assert state == Decode(last=4, cache=after_prefill)

    after_first_decode = after_prefill.advanced_by(1)
    state = state.advance_decode(5, after_first_decode)
    assert state == Decode(last=5, cache=after_first_decode)

    with pytest.raises(IllegalTransition) as err:
        state.advance_prefill(6, after_first_decode)
    assert err.value.attempted == "advance_prefill"
    assert state == Decode(last=5, cache=after_first_decode)  # the original stays valid

    draft = [6, 7]
    state = state.enter_verify(draft)
    assert state == Verify(draft=draft, snapshot=after_first_decode, cache=after_first_decode)

    # full acceptance: both draft tokens match, resume from the last row's cache
    row_one = after_first_decode.advanced_by(1)
    row_two = after_first_decode.advanced_by(2)
    state = state.accept([6, 7], [row_one, row_two])
    assert state == Accept(n=2, next=7, cache=row_two)
    state = state.resume()
    assert state == Decode(last=7, cache=row_two)

    with pytest.raises(IllegalTransition) as err:
        state.resume()
    assert err.value.attempted == "resume"

    # partial acceptance: rejection at row 1 resumes from row_caches[1] with the target's token
    state = state.enter_verify([100, 101])
    cache_after_last = row_two.advanced_by(1)
    cache_after_draft_zero = row_two.advanced_by(2)
    state = state.accept([100, 55], [cache_after_last, cache_after_draft_zero])
    assert state == Rollback(snapshot=cache_after_draft_zero, to=55)
    state = state.rollback()
    assert state == Decode(last=55, cache=cache_after_draft_zero)

    done = state.finish()
    assert isinstance(done, Done)
    with pytest.raises(IllegalTransition) as err:
        done.advance_decode(8, empty())
    assert err.value.attempted == "advance_decode"


def test_serving_state_accept_rejects_mismatched_or_empty_draft():
    cache = empty()
    state = ServingState.start([1], cache).advance_prefill(2, cache).enter_verify([3, 4])
    with pytest.raises(IllegalTransition) as err:
        state.accept([3], [cache])
    assert err.value == IllegalTransition("accept")
    assert state == Verify([3, 4], cache, cache)

    assert str(err.value) == (
        "serving fsm: accept is not legal: row_caches holds 1 entry for a 2-token draft; "
        "it needs one per draft row"
    )

    # ``enter_verify`` accepts any draft, the empty one included; ``accept`` must refuse
    # it (the design: "accept must not panic on it") and leave the Verify intact.
    empty_draft = ServingState.start([1], cache).advance_prefill(2, cache).enter_verify([])
    with pytest.raises(IllegalTransition) as err:
        empty_draft.accept([], [])
    assert err.value == IllegalTransition("accept")
    assert empty_draft == Verify([], cache, cache)


def test_serving_state_draft_prompt_lookup_finds_the_earlier_occurrence():
    history = [5, 1, 2, 3, 9, 1, 2, 3]
    assert specfsm.prompt_lookup(history, 2, 5) == [9, 1, 2, 3]
    assert specfsm.prompt_lookup(history, 2, 2) == [9, 1]
    assert specfsm.prompt_lookup(history, 2, 0) == []
    assert specfsm.prompt_lookup([1, 2], 2, 5) == []
    assert specfsm.prompt_lookup([9, 9, 9], 1, 1) == [9]


def fake_greedy_next(token: int, vocab: int) -> int:
    return (token + 1) % vocab


def test_serving_state_speculation_matches_plain_greedy_for_thirty_two_tokens():
    vocab, tokens, k, ngram = 11, 32, 5, 2
    seed_prompt = [3, 5]

    plain_history = list(seed_prompt)
    plain = ServingState.start(list(seed_prompt), empty())
    last = plain_history[-1]
    plain = plain.advance_prefill(last, empty())
    for _ in range(tokens):
        nxt = fake_greedy_next(last, vocab)
        plain = plain.advance_decode(nxt, empty())
        plain_history.append(nxt)
        last = nxt

    spec_history = list(seed_prompt)
    spec = ServingState.start(list(seed_prompt), empty())
    last = spec_history[-1]
    spec = spec.advance_prefill(last, empty())
    verify_rounds = accepted_total = 0
    while len(spec_history) - len(seed_prompt) < tokens:
        draft = specfsm.prompt_lookup(spec_history, ngram, k)
        if not draft:
            nxt = fake_greedy_next(last, vocab)
            spec = spec.advance_decode(nxt, empty())
            spec_history.append(nxt)
            last = nxt
            continue
        row_tokens, feed = [], last
        for drafted in draft:
            row_tokens.append(fake_greedy_next(feed, vocab))
            feed = drafted
        verify_rounds += 1
        outcome = spec.enter_verify(draft).accept(row_tokens, [empty()] * len(draft))
        match outcome:
            case Accept(n, nxt, _):
                accepted_total += n
                spec_history.extend(draft)
                last = nxt
                spec = outcome.resume()
            case Rollback(_, to):
                accepted = specfsm.common_prefix(draft, row_tokens)
                spec_history.extend(draft[:accepted])
                spec_history.append(to)
                last = to
                spec = outcome.rollback()
            case _:
                pytest.fail(f"accept returned {outcome!r}")
        del spec_history[len(seed_prompt) + tokens :]

    assert verify_rounds > 0 and accepted_total > 0, "the run never exercised accept/resume"
    assert spec_history == plain_history
    assert isinstance(plain.finish(), Done)
    assert isinstance(spec.finish(), Done)


def test_accept_rows_takes_declared_count_not_prefix():
    state = (
        ServingState.start([1], empty()).advance_prefill(2, empty().advanced_by(2)).enter_verify([3, 4])
    )
    one, two = empty().advanced_by(1), empty().advanced_by(2)
    caches = [one, two]
    assert state.accept_rows(0, [3, 4], caches) == Rollback(snapshot=one, to=3)
    assert state.accept_rows(2, [3, 4], caches) == Accept(n=2, next=4, cache=two)
    with pytest.raises(IllegalTransition) as err:
        state.accept_rows(3, [3, 4], caches)
    assert err.value == IllegalTransition("accept_rows")
    with pytest.raises(IllegalTransition) as err:
        ServingState.start([1], empty()).accept_rows(0, [3, 4], caches)
    assert err.value == IllegalTransition("accept_rows")


def test_accept_rows_needs_tokens_only_up_to_the_first_differing_row():
    state = (
        ServingState.start([1], empty()).advance_prefill(2, empty().advanced_by(2)).enter_verify([3, 4, 5])
    )
    caches = [empty().advanced_by(1), empty().advanced_by(2), empty().advanced_by(3)]
    assert state.accept_rows(1, [3, 9], caches) == Rollback(snapshot=empty().advanced_by(2), to=9)
    assert state.accept_rows(3, [], caches) == Accept(n=3, next=5, cache=empty().advanced_by(3))
    with pytest.raises(IllegalTransition) as err:
        state.accept_rows(1, [3], caches)
    assert err.value == IllegalTransition("accept_rows")


def test_action_fixture_sequential_matches_hand_derivation():
    expected = [
        (0, 1, 0), (1, 1, 1), (2, 1, 2),
        (0, 2, 3), (1, 2, 4), (2, 2, 5),
        (0, 4, 6), (1, 4, 7), (2, 4, 8),
        (0, 3, 9), (1, 3, 10), (2, 3, 11),
    ]  # fmt: skip
    trace = run_sequential()
    assert trace.history == [Action(*t) for t in expected]
    assert trace.environment == Environment((10, 10, 10), 12)


def equality_policy(draft, choices) -> int:
    return leading_equal(draft, choices)


def verifier_exact_policy(draft, choices) -> int:
    return specfsm.common_prefix(draft, choices)


def anchor_macro_policy(draft, choices) -> int:
    aligned = leading_equal(draft, choices)
    return aligned if aligned >= 3 else 0


def assert_speculation_matches_sequential(policy, counts):
    sequential = run_sequential()
    speculative = run_speculative(policy)
    assert speculative.history == sequential.history
    assert speculative.environment == sequential.environment
    assert (speculative.rounds, speculative.rejected_rounds, speculative.accepted_rows) == counts


def test_action_speculation_equality_matches_sequential():
    assert_speculation_matches_sequential(equality_policy, (4, 4, 8))


def test_action_speculation_verifier_exact_matches_sequential():
    assert_speculation_matches_sequential(verifier_exact_policy, (4, 4, 8))


def test_action_speculation_anchor_macro_matches_sequential():
    assert_speculation_matches_sequential(anchor_macro_policy, (6, 6, 6))
