"""specfsm.vllm's row rule by request id: a new request that takes a finished request's
row and looks, in every array vLLM's call passes, like that request grown by one token
gets its own index, because the proposer reads each row's request id from the vLLM
runner that built it (or from the caller's ``req_ids``).

``FakeRunner`` holds the parts of vLLM's ``GPUModelRunner`` the proposers touch: it
builds its drafter in its ``__init__`` from its ``vllm_config`` (as vLLM's
``create_custom_proposer(self.vllm_config)`` does) and hands ``propose`` its input
batch's own ``token_ids_cpu``. Every test runs on the active implementation (``impl``,
``test_vllm``'s: the suite's ``SPECFSM_NO_EXTENSIONS=1`` run tests the twin's).
"""

from __future__ import annotations

import gc
import random
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfsm import vllm as sv

from test_vllm import _engine, _suffix_engine, impl, on  # noqa: F401 (impl: the fixture)


class FakeRunner:
    """vLLM's model runner, as far as the proposers see it."""

    def __init__(self, cls, vllm_config, token_ids):
        self.vllm_config = vllm_config
        self.drafter = cls(vllm_config)  # (vLLM: create_custom_proposer(self.vllm_config))
        self.input_batch = types.SimpleNamespace(token_ids_cpu=token_ids, req_ids=[])

    def propose_draft_token_ids(self, sampled, lengths):
        return self.drafter.propose(sampled, lengths, self.input_batch.token_ids_cpu, slot_mappings=None)


def _proposer_class(impl, proposer):
    """The proposer over ``impl``'s indexes, range 1..4 (n-gram) or 1.. (suffix)."""
    if proposer == "ngram":
        return type("Ngram14", (on(impl),), {"min_n": 1, "max_n": 4})
    return on(impl, sv.SpecfsmSuffixProposer)


def _look_alike_requests():
    """Two requests one after the other in row 0. A: a 300-token system prompt, a
    question, the template's tail, its first sampled token. B: A's whole history with 6
    question tokens rewritten (A's last two tokens, B's first sampled token 950, then
    701 702 703), so B enters the row exactly one token longer than A, with A's last 8
    tokens at A's length and A's system prompt: vLLM's arrays show A grown by the token
    950. B's own draft comes from its question (701 702); A's index has no 950 to match."""
    rng = np.random.default_rng(5)
    system = rng.integers(0, 900, size=300).tolist()
    question = rng.integers(0, 900, size=12).tolist()
    hist_a = system + question + [991, 992, 993, 994, 995] + [990]
    prompt_b = list(hist_a)
    prompt_b[302:308] = hist_a[-2:] + [950, 701, 702, 703]
    return hist_a, prompt_b + [950]


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_a_new_request_that_looks_like_the_old_one_grown_by_a_token_drafts_its_own_history(impl, proposer):
    hist_a, hist_b = _look_alike_requests()
    tok = np.zeros((4, 4096), dtype=np.int32)
    runner = FakeRunner(_proposer_class(impl, proposer), sv.ProposerConfig(num_speculative_tokens=2,
                                                                           max_model_len=4096), tok)
    p = runner.drafter
    tok[0, : len(hist_a)] = hist_a
    runner.input_batch.req_ids = ["A"]
    runner.propose_draft_token_ids([[990]], np.array([len(hist_a)], dtype=np.int32))
    # A finishes; vLLM's add_request writes B's prompt into row 0; B's prefill samples 950
    tok[0, : len(hist_b)] = hist_b
    runner.input_batch.req_ids = ["B"]
    out = runner.propose_draft_token_ids([[950]], np.array([len(hist_b)], dtype=np.int32))
    assert out == [p.rescan(np.asarray(hist_b), 2)] == [[701, 702]]
    assert p.stats["with_ids"] == 2 and p.stats["rebuilt"] == 2
    assert p.settings()["request_ids"] == "vLLM's input batch"


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_the_same_two_requests_with_the_callers_req_ids(impl, proposer):
    hist_a, hist_b = _look_alike_requests()
    p = _proposer_class(impl, proposer)(num_speculative_tokens=2, max_model_len=4096)
    assert p.settings()["request_ids"] == "req_ids= or none"
    tok = np.zeros((4, 4096), dtype=np.int32)
    tok[0, : len(hist_a)] = hist_a
    p.propose([[990]], np.array([len(hist_a)]), tok, req_ids=["A"])
    tok[0, : len(hist_b)] = hist_b
    assert p.propose([[950]], np.array([len(hist_b)]), tok, req_ids=["B"]) == [[701, 702]]


@pytest.mark.parametrize("verify, want", [("sparse", "A's index"), ("full", [[701, 702]])])
def test_without_ids_only_the_full_check_tells_the_two_apart(impl, verify, want):
    """The documented limit of the rows-only rule: without request ids these two calls
    are what A grown by one token would be (same length growth, tail, spread), so the
    sparse rule keeps A's index; ``verify="full"`` compares every token."""
    hist_a, hist_b = _look_alike_requests()
    p = _proposer_class(impl, "ngram")(num_speculative_tokens=2, max_model_len=4096, verify=verify)
    tok = np.zeros((4, 4096), dtype=np.int32)
    tok[0, : len(hist_a)] = hist_a
    p.propose([[990]], np.array([len(hist_a)]), tok)
    tok[0, : len(hist_b)] = hist_b
    out = p.propose([[950]], np.array([len(hist_b)]), tok)
    if want == "A's index":
        assert out == [p.rescan(np.asarray(hist_a + [950]), 2)] != [[701, 702]]
    else:
        assert out == want


def test_a_runner_is_found_only_by_its_own_config_and_its_own_token_array(impl):
    cls = _proposer_class(impl, "ngram")
    cfg = sv.ProposerConfig(num_speculative_tokens=2, max_model_len=64)

    class OtherConfig(FakeRunner):  # a runner whose config is another object
        def __init__(self):
            self.vllm_config = sv.ProposerConfig(num_speculative_tokens=2, max_model_len=64)
            self.drafter = cls(cfg)

    assert OtherConfig().drafter.settings()["request_ids"] == "req_ids= or none"
    tok = np.zeros((2, 64), dtype=np.int32)
    runner = FakeRunner(cls, cfg, tok)
    runner.input_batch.req_ids = ["A", "B"]
    tok[:, :4] = [1, 2, 1, 2]
    other = tok.copy()  # not the input batch's array: its ids would not describe these rows
    runner.drafter.propose([[2], [2]], np.array([4, 4]), other)
    assert runner.drafter.stats["with_ids"] == 0
    runner.propose_draft_token_ids([[5], [5]], np.array([5, 5]))
    assert runner.drafter.stats["with_ids"] == 1
    runner.input_batch.req_ids = ["A", None]  # (vLLM has none mid-update only): no ids this call
    runner.propose_draft_token_ids([[6], [6]], np.array([6, 6]))
    assert runner.drafter.stats["with_ids"] == 1 and runner.drafter._rid[:2] == [None, None]
    runner.input_batch.req_ids = ["A", "B"]  # (and the next call with ids checks the rows again)
    runner.propose_draft_token_ids([[7], [7]], np.array([7, 7]))
    assert runner.drafter.stats["with_ids"] == 2 and runner.drafter._rid[:2] == ["A", "B"]
    drafter = runner.drafter
    del runner
    gc.collect()  # (the proposer holds its runner weakly)
    out = drafter.propose([[8], [8]], np.array([8, 8]), tok)
    assert out == [drafter.rescan(tok[r, :8], 2) for r in range(2)] and drafter.stats["with_ids"] == 2


@pytest.mark.parametrize(
    "req_ids, exc, words",
    [
        ("AB", TypeError, "req_ids must be a list"),
        (5, TypeError, "req_ids must be a list"),
        (["A"], ValueError, "req_ids has 1 entries for 2 batch rows"),
        (["A", None], ValueError, r"req_ids\[1\] is None"),
    ],
)
def test_bad_req_ids_are_refused_and_change_nothing(impl, req_ids, exc, words):
    p = _proposer_class(impl, "ngram")(num_speculative_tokens=2, max_model_len=64)
    tok = np.zeros((2, 64), dtype=np.int32)
    tok[:, :6] = [[1, 2, 3, 1, 2, 3], [4, 5, 4, 5, 4, 5]]
    p.propose([[3], [5]], np.array([6, 6]), tok, req_ids=["A", "B"])
    before = dict(p.stats)
    tok[:, 6] = [1, 4]
    with pytest.raises(exc, match=words):
        p.propose([[1], [4]], np.array([7, 7]), tok, req_ids=req_ids)
    assert p.stats == before
    assert p.propose([[1], [4]], np.array([7, 7]), tok, req_ids=["A", "B"]) == [[2, 3], [5, 4]]
    assert p.stats["adopted"] == p.stats["rebuilt"] - 2 == 0  # the rows kept their indexes


def test_the_steady_path_is_taken_with_ids(impl):
    eng, p = _engine(impl, 11, vocab=50, rows=20, cap=900, k=3, lo=1, hi=3, long=True, calm=0.8, ids=True)
    for _ in range(60):
        eng.step()
    assert 0 < p.stats["steady"] < p.stats["steps"] and p.stats["with_ids"] == eng.calls


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 4),
    cap=st.sampled_from([400, 700]),
    k=st.integers(1, 4),
    lo=st.integers(1, 3),
    calm=st.sampled_from([0.0, 0.5]),
)
@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_look_alike_requests_shared_prompts_and_equal_lengths_under_row_reuse(impl, proposer, seed, rows, cap, k,
                                                                               lo, calm):
    """Chat turns (one system prompt, one template, equal lengths, one first answer
    token) and new requests that enter a row as long as its previous request plus one
    token, ending in its last tokens, in few rows, with request ids: every draft equals
    a fresh rescan of the row (without ids the second kind is indistinguishable)."""
    kw = dict(vocab=1000, rows=rows, cap=cap, k=k, lo=lo, calm=calm, templated=0.7, mimic=0.5, ids=True)
    if proposer == "ngram":
        eng, p = _engine(impl, seed, hi=lo + 2, **kw)
    else:
        eng, p = _suffix_engine(impl, seed, hi=None, prefer="earliest", **kw)
    for _ in range(40):
        eng.step()
    assert p.stats["with_ids"] == eng.calls


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.sampled_from([2, 3, 5, 50]),
    rows=st.integers(1, 6),
    cap=st.integers(30, 300),
    k=st.integers(1, 5),
    lo=st.integers(1, 3),
    verify=st.sampled_from(["sparse", "full"]),
    long=st.booleans(),
)
def test_any_row_movements_with_ids(impl, seed, vocab, rows, cap, k, lo, verify, long):
    """Every movement the driver replays (finish, preempt, resume, condense, swap, cut
    back, streaming re-add, skipped drafter calls, narrower arrays) plus look-alike new
    requests, with request ids: every draft equals a fresh rescan."""
    eng, _ = _engine(impl, seed, vocab=vocab, rows=rows, cap=cap, k=k, lo=lo, hi=lo + 1, verify=verify, long=long,
                     narrow=random.Random(seed).random() < 0.3, mimic=0.4, ids=True)
    for _ in range(30):
        eng.step()


def test_the_driver_makes_look_alike_requests(impl):
    """(The generator above makes what it says: look-alike requests that enter their row
    and are drafted for; the rows-only rule gets some of them wrong.)"""
    bad = 0
    made = 0
    for seed in range(20):
        eng, _ = _engine(impl, seed, vocab=1000, rows=3, cap=700, k=3, lo=1, hi=3, calm=0.3, templated=0.9,
                         mimic=0.7)
        try:
            for _ in range(40):
                eng.step()
        except AssertionError:
            bad += 1
        made += eng.moves.get("new request as long as its row's last one, with its last tokens", 0)
    assert made > 50 and bad > 0
