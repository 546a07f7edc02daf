"""The suffix proposer's drafting policy: each draft cut to what its match supports
(``spec_factor`` times the match length), and drafts from the histories of the requests
that left the batch before (the worker's ``SharedSuffixCache``), on both implementations."""

from __future__ import annotations

import numpy as np
import pytest

import specfsm.vllm as sv
from specfsm.drafting import suffix_index


def make(impl, **kw):
    kw.setdefault("num_speculative_tokens", 4)
    return type("SpecfsmSuffixProposer", (sv.SpecfsmSuffixProposer,), {})(**kw)


def step(p, rows, ids=None, sampled=None):
    """One ``propose`` call over ``rows`` (token lists), each row having sampled one token
    (or ``sampled[i]``)."""
    width = max(len(r) for r in rows) + 8
    tok = np.zeros((len(rows) + 1, width), np.int32)
    for i, r in enumerate(rows):
        tok[i, : len(r)] = r
    s = sampled if sampled is not None else [[r[-1]] for r in rows]
    return p.propose(s, np.array([len(r) for r in rows]), tok, req_ids=ids)


def test_a_draft_is_no_longer_than_its_match_supports(impl):
    # the longest earlier occurrence of the suffix: [3] alone (one token), then [1, 2, 3]
    p = make(impl, shared_tokens=0)
    assert step(p, [[3, 4, 5, 6, 7, 8, 3]]) == [[4]]
    p = make(impl, shared_tokens=0)
    assert step(p, [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]) == [[4, 5, 6]]
    p = make(impl, shared_tokens=0, spec_factor=2.0)
    assert step(p, [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]) == [[4, 5, 6, 7]]
    p = make(impl, shared_tokens=0, spec_factor=0.5)
    assert step(p, [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]) == [[4]]
    # 0: no cap but K
    p = make(impl, shared_tokens=0, spec_factor=0)
    assert step(p, [[3, 4, 5, 6, 7, 8, 3]]) == [[4, 5, 6, 7]]
    # the cap is the policy's, so a fresh rescan gives the same
    p = make(impl, shared_tokens=0)
    assert p.rescan([1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], 4) == [4, 5, 6]


def _history(seed, n):
    return np.random.default_rng(seed).integers(100, 100_000, n).tolist()


def test_a_request_drafts_from_an_earlier_requests_history(impl):
    p = make(impl)
    prompt = _history(1, 200)
    answer = _history(2, 40)
    # request a: its prompt, then its answer, in row 0
    step(p, [prompt], ids=["a"])
    hist = prompt[:]
    for t in answer:
        hist.append(t)
        step(p, [hist], ids=["a"])
    assert len(p._shared) == 0  # a is still in the batch
    # a leaves; b arrives with a's prompt: its first draft is a's answer
    assert step(p, [prompt], ids=["b"]) == [answer[:4]]
    assert len(p._shared) == len(hist) + 1  # (a's history and its separator)
    hb = prompt + answer[:5]
    assert step(p, [hb], ids=["b"], sampled=[answer[:5]]) == [answer[5:9]]
    # an unrelated request drafts nothing from it (no match of SHARED_MIN tokens)
    assert step(p, [hb, _history(3, 50)], ids=["b", "c"]) == [answer[5:9], []]


def test_requests_that_move_between_rows_are_not_retired(impl):
    p = make(impl)
    x, y = _history(4, 150), _history(5, 150)
    step(p, [x, y], ids=["x", "y"])
    step(p, [y + [7], x + [7]], ids=["y", "x"])  # swapped rows
    step(p, [x + [7, 8]], ids=["x"], sampled=[[8]])  # y left (condensed into row 0: x)
    assert len(p._shared) == len(y) + 1 + 1  # y's history only, once


def test_without_request_ids_nothing_is_retired(impl):
    p = make(impl)
    x = _history(6, 150)
    step(p, [x])
    step(p, [_history(7, 160)])
    assert len(p._shared) == 0
    assert p.settings()["shared_tokens"] == 1 << 20


def test_the_settings_and_their_sources(impl, monkeypatch):
    p = make(impl)
    assert (p.spec_factor, p.shared_tokens, p.shared_requests) == (1.0, 1 << 20, 10000)
    cfg = sv.ProposerConfig(4, 4096)
    cfg.additional_config = {"specfsm": {"spec_factor": 2, "shared_tokens": 4096, "shared_requests": 3}}
    p = type("S", (sv.SpecfsmSuffixProposer,), {})(cfg)
    assert (p.spec_factor, p.shared_tokens, p.shared_requests) == (2.0, 4096, 3)
    assert p._shared.max_requests == 3
    monkeypatch.setenv("SPECFSM_VLLM_SPEC_FACTOR", "1.5")
    monkeypatch.setenv("SPECFSM_VLLM_SHARED_TOKENS", "0")
    p = make(impl)
    assert (p.spec_factor, p.shared_tokens, p._shared) == (1.5, 0, None)
    assert make(impl, spec_factor=3).spec_factor == 3.0  # the keyword first
    # (the project's checkers: a bad value is a ValueError, a wrong type a TypeError)
    for error, bad in ((ValueError, {"spec_factor": -1}), (TypeError, {"spec_factor": "x"}),
                       (ValueError, {"spec_factor": float("nan")}), (ValueError, {"shared_tokens": -5}),
                       (TypeError, {"shared_tokens": 2.5}), (ValueError, {"shared_requests": 0}),
                       (TypeError, {"shared_tokens": True})):
        with pytest.raises(error, match=next(iter(bad))):
            make(impl, **bad)
    monkeypatch.setenv("SPECFSM_VLLM_SHARED_TOKENS", "many")
    with pytest.raises(ValueError, match="shared_tokens"):
        make(impl)
    # the n-gram proposer refuses the suffix proposer's settings
    cfg.additional_config = {"specfsm": {"spec_factor": 2}}
    with pytest.raises(ValueError, match="SpecfsmNgramProposer does not take"):
        sv.SpecfsmNgramProposer(cfg)
    cfg.additional_config = {"specfsm": {"spec_factr": 2}}
    with pytest.raises(ValueError, match="unknown settings"):
        type("S", (sv.SpecfsmSuffixProposer,), {})(cfg)


def test_the_shared_cache_keeps_at_most_max_requests_outputs():
    cache = suffix_index.SharedSuffixCache(max_tokens=10_000, generations=4, max_requests=8)
    outputs = [_history(10 + i, 30) for i in range(40)]
    for out in outputs:
        cache.add(out)
        assert cache._outputs <= 8
    assert cache._outputs == sum(g[2] for g in cache._gens)
    # the newest outputs are kept, the oldest dropped
    assert cache.lookup(outputs[-1][:20], 4) == (20, outputs[-1][20:24])
    assert cache.lookup(outputs[0][:20], 4)[0] < 20
    with pytest.raises(ValueError, match="max_requests"):
        suffix_index.SharedSuffixCache(max_requests=0)
    assert "max_requests=8" in repr(cache)


def test_a_repeating_suffix_goes_on_repeating(impl):
    # [5, 6, 5] last occurred ending at 3, followed by what the history still holds: 6, 5
    p = make(impl, shared_tokens=0, spec_factor=0)
    assert step(p, [[5, 6, 5, 6, 5]]) == [[6, 5, 6, 5]]
    p = make(impl, shared_tokens=0)  # (capped at the match length, 3)
    assert step(p, [[5, 6, 5, 6, 5]]) == [[6, 5, 6]]
    plain = type("P", (sv.SpecfsmSuffixProposer,), {"REPEAT": False})(num_speculative_tokens=4, shared_tokens=0,
                                                                      spec_factor=0)
    assert step(plain, [[5, 6, 5, 6, 5]]) == [[6, 5]]


def test_the_latest_occurrence_is_the_default(impl):
    # [7] occurs twice before: followed by 1 first, by 2 last
    assert step(make(impl, shared_tokens=0), [[7, 1, 8, 7, 2, 9, 7]]) == [[2]]
    assert step(make(impl, shared_tokens=0, prefer="earliest"), [[7, 1, 8, 7, 2, 9, 7]]) == [[1]]
