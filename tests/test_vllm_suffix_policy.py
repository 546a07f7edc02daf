"""The suffix proposer's drafting policy: each draft cut to what its match supports
(``spec_factor`` times the match length), drafts from the histories of the requests
that left the batch before (the worker's ``SharedSuffixCache``), and, where the match is
shorter than ``LONG``, the counted drafts (the request's own ``SuffixTrie`` and the
worker's tries of outputs), on both implementations."""

from __future__ import annotations

import numpy as np
import pytest

import specfsm.vllm as sv
from specfsm.drafting import suffix_index


def make(impl, long=None, **kw):
    """A suffix proposer (K = 4 unless given); ``long``: its ``LONG`` (0: every draft
    from the index or the cache, none counted)."""
    kw.setdefault("num_speculative_tokens", 4)
    attrs = {} if long is None else {"LONG": long}
    return type("SpecfsmSuffixProposer", (sv.SpecfsmSuffixProposer,), attrs)(**kw)


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
    p = make(impl, 0, shared_tokens=0)
    assert step(p, [[3, 4, 5, 6, 7, 8, 3]]) == [[4]]
    p = make(impl, 0, shared_tokens=0)
    assert step(p, [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]) == [[4, 5, 6]]
    p = make(impl, 0, shared_tokens=0, spec_factor=2.0)
    assert step(p, [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]) == [[4, 5, 6, 7]]
    p = make(impl, 0, shared_tokens=0, spec_factor=0.5)
    assert step(p, [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]]) == [[4]]
    # 0: no cap but K
    p = make(impl, 0, shared_tokens=0, spec_factor=0)
    assert step(p, [[3, 4, 5, 6, 7, 8, 3]]) == [[4, 5, 6, 7]]
    # the cap is the policy's, so a fresh rescan gives the same
    p = make(impl, 0, shared_tokens=0)
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
    p = make(impl, 0, shared_tokens=0, spec_factor=0)
    assert step(p, [[5, 6, 5, 6, 5]]) == [[6, 5, 6, 5]]
    p = make(impl, 0, shared_tokens=0)  # (capped at the match length, 3)
    assert step(p, [[5, 6, 5, 6, 5]]) == [[6, 5, 6]]
    plain = type("P", (sv.SpecfsmSuffixProposer,), {"REPEAT": False, "LONG": 0})(num_speculative_tokens=4, shared_tokens=0,
                                                                      spec_factor=0)
    assert step(plain, [[5, 6, 5, 6, 5]]) == [[6, 5]]


def test_the_latest_occurrence_is_the_default(impl):
    # [7] occurs twice before: followed by 1 first, by 2 last
    assert step(make(impl, 0, shared_tokens=0), [[7, 1, 8, 7, 2, 9, 7]]) == [[2]]
    assert step(make(impl, 0, shared_tokens=0, prefer="earliest"), [[7, 1, 8, 7, 2, 9, 7]]) == [[1]]


# -- the counted drafts ------------------------------------------------------------------
def test_a_short_match_drafts_its_most_frequent_continuation(impl):
    # [5] was followed by 1, 1 and 2: the index copies the latest (2), the counts take 1
    # (p = 2/4: [5] ended 4 positions, the last with nothing after it yet)
    hist = [5, 1, 5, 1, 5, 2, 9, 5]
    assert step(make(impl, 0, shared_tokens=0), [hist]) == [[2]]
    assert step(make(impl, shared_tokens=0), [hist]) == [[1]]
    # a continuation below min_prob is not drafted: [5]'s best, 1 of 4, is p = 0.25
    hist = [5, 1, 5, 2, 5, 3, 5, 4, 8, 5]
    assert step(make(impl, shared_tokens=0, min_prob=0.3), [hist]) == [[]]
    assert step(make(impl, shared_tokens=0, min_prob=0.2), [hist]) == [[1]]


def test_a_long_match_copies_from_the_index(impl):
    # a 25-token suffix occurred before: at least LONG (24), so the index's draft stands
    body = list(range(100, 125))
    hist = [1] + body + [7, 8, 9, 10, 2] + body
    p = make(impl, shared_tokens=0)
    assert p.LONG == 24
    assert step(p, [hist]) == [[7, 8, 9, 10]]


def test_requests_draft_from_the_outputs_of_requests_still_running(impl):
    p = make(impl)
    pa, pb = _history(20, 60), _history(21, 60)
    out = _history(22, 12)
    # a writes `out` while b is running beside it; neither prompt holds it
    ha, hb = pa + out[:1], pb + [3]
    step(p, [ha, hb], ids=["a", "b"], sampled=[out[:1], [3]])
    for t in out[1:]:
        ha = ha + [t]
        hb = hb + [4]
        step(p, [ha, hb], ids=["a", "b"], sampled=[[t], [4]])
    assert len(p._shared) == 0  # nobody left: the cache of finished requests is empty
    # b now writes out's first three tokens: its draft is what followed them in a's output
    hb = hb + out[:3]
    assert step(p, [ha, hb], ids=["a", "b"], sampled=[[out[-1]], out[:3]])[1] == out[3:6]
    # the worker's tries hold outputs, not prompts: a's prompt is never drafted from
    hc = _history(23, 40) + pa[10:14]
    assert step(p, [ha, hb + [9], hc], ids=["a", "b", "c"], sampled=[[out[-1]], [9], pa[10:14]])[2] == []


def test_the_worker_tries_roll_over_and_stay_bounded(impl):
    p = make(impl, trie_tokens=400)
    for i in range(30):
        h = _history(100 + i, 20)
        for j in range(5):
            h = h + _history(200 + 10 * i + j, 5)
            step(p, [h], ids=[f"r{i}"], sampled=[h[-5:]])
    assert 1 < len(p._gens) <= 5
    assert sum(map(len, p._gens)) <= 400 + 400 // p.GENERATIONS + 30
    assert p._gen_base > 0  # the oldest were dropped
    assert len(p._tries) <= 2  # the requests that left took their own tries with them


def test_the_counted_settings(impl, monkeypatch):
    p = make(impl)
    assert (p.trie_depth, p.trie_tokens, p.min_prob) == (8, 1 << 18, 0.16)
    assert {"trie_depth": 8, "trie_tokens": 1 << 18, "trie_window": 2048, "min_prob": 0.16}.items() <= p.settings().items()
    cfg = sv.ProposerConfig(4, 4096)
    cfg.additional_config = {"specfsm": {"trie_depth": 12, "trie_tokens": 1000, "min_prob": 0.3}}
    p = type("S", (sv.SpecfsmSuffixProposer,), {})(cfg)
    assert (p.trie_depth, p.trie_tokens, p.min_prob) == (12, 1000, 0.3)
    monkeypatch.setenv("SPECFSM_VLLM_MIN_PROB", "0.05")
    assert make(impl).min_prob == 0.05
    for error, bad in ((ValueError, {"trie_depth": 1}), (ValueError, {"trie_depth": 65}),
                       (TypeError, {"trie_depth": 2.5}), (ValueError, {"trie_tokens": -1}),
                       (ValueError, {"min_prob": 1.5}), (TypeError, {"min_prob": "x"}),
                       (ValueError, {"min_prob": float("nan")})):
        with pytest.raises(error, match=next(iter(bad))):
            make(impl, **bad)


def test_a_rows_trie_keeps_to_its_window(impl):
    # a long history: the row's trie is rebuilt from its last trie_window tokens whenever
    # it holds twice that, so it never holds more than twice the window
    p = make(impl, shared_tokens=0, trie_window=32)
    h = _history(30, 50)
    for i in range(40):
        h = h + [7, 8, 9, 100 + i]
        step(p, [h], ids=["a"], sampled=[h[-4:]])
        (own,) = [e[1] for e in p._tries.values()]
        assert len(own) <= 64
    # what it holds is the history's latest tokens: [7, 8, 9] is always followed by a
    # new token, so the draft after 7, 8 is 9 (p = 1)
    assert step(p, [h + [7, 8]], ids=["a"], sampled=[[7, 8]]) == [[9]]
    assert make(impl, trie_window=0).trie_window == 0  # 0: never rebuilt
    with pytest.raises(ValueError, match="trie_window"):
        make(impl, trie_window=-1)


def test_trie_depth_0_turns_the_counted_drafts_off(impl):
    # no tries: a short match drafts the index's latest occurrence, as with LONG = 0
    hist = [5, 1, 5, 1, 5, 2, 9, 5]
    p = make(impl, shared_tokens=0, trie_depth=0)
    assert step(p, [hist]) == [[2]]
    assert p._tries == {} and p._gens == []
    with pytest.raises(ValueError, match="trie_depth"):
        make(impl, trie_depth=1)
