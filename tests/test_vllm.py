"""specfsm.vllm: the proposers vLLM loads through ``method="custom_class"``.

vLLM itself is not needed: the tests call ``propose`` with the arguments vLLM's runner
passes (``sampled_token_ids``, ``num_tokens_no_spec``, ``token_ids_cpu``) and replay
vLLM's row movements with ``tests/vllm_batch_driver.py``. Every test that drafts runs on
the active implementation (``impl``: the proposers run on it, as every public class does;
the suite's ``SPECFSM_NO_EXTENSIONS=1`` run tests the twin's).
"""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specfsm import _impl
from specfsm import vllm as sv
from specfsm.vllm import proposers

from vllm_batch_driver import Engine


@pytest.fixture
def impl(impl):
    """conftest's ``impl`` where it is the active implementation, which the proposers run
    on as every public class does; skipped on the other one (the suite's
    ``SPECFSM_NO_EXTENSIONS=1`` run tests the twin's proposers)."""
    if any(impl.module(name) is not _impl.load(name) for name in ("ngram_index", "suffix_index", "rows")):
        pytest.skip(f"the proposers run on the active implementation, not the {impl.name} one")
    return impl


#: the suffix proposer's drafting policy off (no length cap, no cross-request cache, no
#: counted drafts): its drafts are then a fresh index's over the row's history, which the
#: row-tracking tests compare with (the policy has tests of its own)
PLAIN_SUFFIX = {"spec_factor": 0.0, "shared_tokens": 0, "prefer": "earliest", "REPEAT": False, "LONG": 0}
#: the same with the row's own counted drafts on (still nothing across requests): a
#: short match's draft is then a fresh trie's over the row's history
COUNTED_SUFFIX = {**PLAIN_SUFFIX, "LONG": sv.SpecfsmSuffixProposer.LONG, "trie_tokens": 0}


def on(impl, cls=sv.SpecfsmNgramProposer):
    """``cls`` for a test on ``impl`` (the active implementation: the ``impl`` fixture),
    as a subclass of the same name, so a test's changes to it stay its own (the suffix
    proposer's with its drafting policy off: ``PLAIN_SUFFIX``)."""
    return type(cls.__name__, (cls,), PLAIN_SUFFIX if issubclass(cls, sv.SpecfsmSuffixProposer) else {})


def test_the_public_proposers_draw_from_the_active_implementation():
    import specfsm

    tok = np.array([[5, 6, 5, 6], [1, 1, 7, 0]], np.int32)
    for cls, index_type in ((sv.SpecfsmNgramProposer, specfsm.NgramIndex), (sv.SpecfsmSuffixProposer, specfsm.SuffixIndex)):
        plain = type(cls.__name__, (cls,), PLAIN_SUFFIX) if cls is sv.SpecfsmSuffixProposer else cls
        p = plain(num_speculative_tokens=2, min_n=1, max_n=1)
        assert type(p._new_index()) is index_type
        assert p.propose([[5], [1]], np.array([3, 2]), tok) == [[6, 5], [1]]
        assert p.propose([[6], [7]], np.array([4, 3]), tok) == [[5, 6], []]


def make(impl, **kw):
    kw.setdefault("num_speculative_tokens", 2)
    return on(impl)(**kw)


def vllm_rule_draft(tokens, min_n, max_n, max_model_len, k):
    """vLLM's n-gram proposal rule as its numba kernel computes it (our own transcription):
    a KMP scan of the reversed history against its own first ``max_n`` tokens keeps the
    longest match and, among equally long ones, the one furthest back in the reversed
    order (the earliest in the history)."""
    tokens = list(tokens)
    total = len(tokens)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    rev = tokens[::-1]
    border = [0] * max_n
    m = best = at = 0
    i = 1
    while i < total:
        if rev[m] == rev[i]:
            m += 1
            if m >= best:
                best, at = m, i
            if i < max_n:
                border[i] = m
            if m == max_n:
                m = border[max_n - 1]
            i += 1
        elif m:
            m = border[m - 1]
        else:
            i += 1
    if best < min_n:
        return []
    start = total - 1 - at + best
    return tokens[start : start + min(k, total - start)]


def one_step(p, rows, sampled=None, width=None):
    """``propose`` on ``rows`` laid out as vLLM lays them out."""
    width = width or max([len(r) for r in rows] + [1]) + 4
    tok = np.full((len(rows), width), -1, dtype=np.int32)
    for i, r in enumerate(rows):
        tok[i, : len(r)] = r
    lens = np.array([len(r) for r in rows], dtype=np.int32)
    if sampled is None:
        sampled = [[0] for _ in rows]
    return p.propose(sampled, lens, tok)


# -- importing and configuring ---------------------------------------------------------
def test_import_does_not_import_vllm_or_torch():
    code = "import sys, specfsm.vllm; print('vllm' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_reads_k_max_model_len_and_range_from_the_vllm_config(impl):
    cfg = sv.ProposerConfig(num_speculative_tokens=3, max_model_len=100, prompt_lookup_min=2, prompt_lookup_max=4)
    p = on(impl)(cfg)
    assert (p.num_speculative_tokens, p.max_model_len, p.min_n, p.max_n, p.prefer) == (3, 100, 2, 4, "earliest")


def test_custom_class_zeroed_range_falls_back_to_env_then_class_then_vllm_default(impl, monkeypatch):
    # vLLM sets prompt_lookup_min/max to 0 for method="custom_class"
    cfg = sv.ProposerConfig(num_speculative_tokens=4, max_model_len=64, prompt_lookup_min=0, prompt_lookup_max=0)
    for var in ("SPECFSM_VLLM_MIN_N", "SPECFSM_VLLM_MAX_N", "SPECFSM_VLLM_PREFER", "SPECFSM_VLLM_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    p = on(impl)(cfg)
    assert (p.min_n, p.max_n, p.prefer, p.verify) == (5, 5, "earliest", "sparse")

    class Mine(sv.SpecfsmNgramProposer):
        min_n, max_n, prefer = 1, 3, "latest"

    p = on(impl, Mine)(cfg)
    assert (p.min_n, p.max_n, p.prefer) == (1, 3, "latest")
    monkeypatch.setenv("SPECFSM_VLLM_MIN_N", "2")
    monkeypatch.setenv("SPECFSM_VLLM_PREFER", "latest")
    monkeypatch.setenv("SPECFSM_VLLM_VERIFY", "full")
    p = on(impl)(cfg)
    assert (p.min_n, p.max_n, p.prefer, p.verify) == (2, 2, "latest", "full")  # one end sets the other
    p = on(impl)(cfg, max_n=6, prefer="earliest", verify="sparse")
    assert (p.min_n, p.max_n, p.prefer, p.verify) == (6, 6, "earliest", "sparse")  # keywords win


def test_additional_config_sets_the_range_in_every_worker(impl, monkeypatch):
    """vLLM keeps ``additional_config`` unchanged and hands it to every worker: a range set
    there is used (after keywords, before the environment), and the log names where the
    range came from, once per process."""
    for var in ("SPECFSM_VLLM_MIN_N", "SPECFSM_VLLM_MAX_N", "SPECFSM_VLLM_PREFER", "SPECFSM_VLLM_VERIFY"):
        monkeypatch.delenv(var, raising=False)
    cfg = sv.ProposerConfig(num_speculative_tokens=4, max_model_len=64, prompt_lookup_min=0, prompt_lookup_max=0)
    cfg.additional_config = {"specfsm": {"min_n": 2, "max_n": 3, "prefer": "latest", "verify": "full"}}
    monkeypatch.setenv("SPECFSM_VLLM_MIN_N", "4")
    p = on(impl)(cfg)
    assert (p.min_n, p.max_n, p.prefer, p.verify, p.range_source) == (2, 3, "latest", "full", "additional_config")
    s = on(impl, sv.SpecfsmSuffixProposer)(cfg)
    assert (s.min_n, s.max_n, s.prefer) == (2, 3, "latest")
    assert p.settings()["range_from"] == "additional_config"
    cfg.additional_config = {"specfsm": {"min": 2}}
    with pytest.raises(ValueError, match="unknown settings"):
        sv.SpecfsmNgramProposer(cfg)
    cfg.additional_config = {"specfsm": 3}
    with pytest.raises(TypeError, match="additional_config"):
        sv.SpecfsmNgramProposer(cfg)


def test_settings_are_logged_once_per_process(impl, caplog, monkeypatch):
    monkeypatch.setattr(sv.settings, "_logged", set())
    cfg = sv.ProposerConfig(num_speculative_tokens=3, max_model_len=64)
    with caplog.at_level("INFO"):
        on(impl)(cfg)
        on(impl)(cfg)
    lines = [r for r in caplog.records if "specfsm proposer settings" in r.getMessage()]
    assert len(lines) == 1 and lines[0].name == "specfsm.vllm" and lines[0].levelname == "INFO"
    assert "min_n=5" in lines[0].getMessage() and "range_from=\"vLLM's ngram default\"" in lines[0].getMessage()


def test_inside_vllm_an_unhandled_settings_log_goes_through_vllms_logger(impl, monkeypatch):
    """vLLM configures only its ``vllm`` logger: with nothing handling ``specfsm.vllm``,
    the line goes to ``vllm.specfsm``, which vLLM's handlers print."""
    import logging
    import types

    monkeypatch.setattr(sv.settings, "_logged", set())
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setattr(logging.getLogger("specfsm.vllm"), "hasHandlers", lambda: False)
    got = []
    handler = logging.Handler(logging.INFO)
    handler.emit = got.append
    log = logging.getLogger("vllm.specfsm")
    log.addHandler(handler)
    monkeypatch.setattr(log, "level", logging.INFO)
    try:
        on(impl)(sv.ProposerConfig(num_speculative_tokens=3, max_model_len=64))
    finally:
        log.removeHandler(handler)
    assert [r.name for r in got] == ["vllm.specfsm"] and "specfsm proposer settings" in got[0].getMessage()


def test_follows_a_max_model_len_vllm_refits(impl):
    """vLLM's auto-fit writes the fitted max_model_len into the worker's model_config after
    the proposer is built (-1 before): the cap follows it; a keyword cap does not."""
    cfg = sv.ProposerConfig(num_speculative_tokens=4, max_model_len=-1)
    p = on(impl)(cfg, min_n=1, max_n=1)
    assert p.max_model_len is None
    tok = np.zeros((1, 64), dtype=np.int32)
    tok[0, :6] = [1, 2, 3, 4, 5, 1]
    assert p.propose([[1]], np.array([6]), tok) == [[2, 3, 4, 5]]
    cfg.model_config.max_model_len = 9  # the re-fit
    tok[0, 6] = 2
    assert p.propose([[2]], np.array([7]), tok) == [[3, 4]]  # capped at 9 - 7
    assert p.max_model_len == 9
    fixed = on(impl)(cfg, min_n=1, max_n=1, max_model_len=50)
    cfg.model_config.max_model_len = 8
    assert fixed.propose([[2]], np.array([7]), tok) == [[3, 4, 5, 1]] and fixed.max_model_len == 50


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        ({"min_n": 0}, ValueError, "min_n"),
        ({"min_n": 4, "max_n": 2}, ValueError, "max_n"),
        ({"prefer": "first"}, ValueError, "prefer"),
        ({"verify": "some"}, ValueError, "verify"),
        ({"num_speculative_tokens": -1}, ValueError, "num_speculative_tokens"),
        ({"num_speculative_tokens": 2.5}, TypeError, "num_speculative_tokens"),
        ({"max_model_len": "long"}, TypeError, "max_model_len"),
    ],
)
def test_refuses_bad_settings(impl, kw, exc, words):
    with pytest.raises(exc, match=words):
        make(impl, **kw)


def test_refuses_a_config_without_k(impl):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        on(impl)(None)


def test_bad_environment_is_named(impl, monkeypatch):
    monkeypatch.setenv("SPECFSM_VLLM_MIN_N", "two")
    with pytest.raises(ValueError, match="SPECFSM_VLLM_MIN_N"):
        on(impl)(sv.ProposerConfig())


def test_constructs_from_a_real_vllm_config(impl):
    vllm = pytest.importorskip("vllm")  # not installable on the CPU-only development machine
    from vllm.config import ModelConfig, SpeculativeConfig, VllmConfig

    try:  # vLLM reads the model's config from the Hub
        cfg = VllmConfig(
            model_config=ModelConfig(model="facebook/opt-125m", max_model_len=512),
            speculative_config=SpeculativeConfig(method="custom_class", model="specfsm.vllm.SpecfsmNgramProposer",
                                                 num_speculative_tokens=3),
        )
    except Exception as exc:  # no network, no model files
        pytest.skip(f"vLLM {vllm.__version__} could not build a VllmConfig here: {exc}")
    p = on(impl)(cfg)
    assert (p.num_speculative_tokens, p.max_model_len) == (3, 512), vllm.__version__


# -- vLLM's own test vectors (tests/v1/spec_decode/test_ngram.py), through propose -----------
VLLM_VECTORS = [
    # (history, min_n, max_n, k, expected draft)
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 2, [4, 1]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 2, [4, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the first match
    ([1, 2, 3, 4, 5], 2, 2, 2, []),  # no match
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),  # no 4-gram
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),  # a 3-gram
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram, not [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),  # the 3-gram, not [5, 2]
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),  # always the first
    ([], 2, 2, 2, []),  # empty history
]


@pytest.mark.parametrize("history, lo, hi, k, want", VLLM_VECTORS)
def test_vllm_test_vectors(impl, history, lo, hi, k, want):
    p = make(impl, min_n=lo, max_n=hi, num_speculative_tokens=k, max_model_len=1024)
    assert one_step(p, [history]) == [want]
    assert vllm_rule_draft(history, lo, hi, 1024, k) == want


def test_vllm_multibatch_vectors(impl):
    p = make(impl, min_n=2, max_n=2, num_speculative_tokens=2, max_model_len=1024)
    tok = np.array([[1, 2, 3, 1, 2], [4, 5, 6, -1, -1]], dtype=np.int32)
    assert p.propose([[0], [1]], np.array([5, 3]), tok) == [[3, 1], []]
    # rows 0 and 2 propose, row 1 is in prefill (no sampled tokens): vLLM gives it []
    p = make(impl, min_n=2, max_n=2, num_speculative_tokens=2, max_model_len=20)
    tok = np.zeros((3, 20), dtype=np.int32)
    tok[0, :5] = [1, 2, 3, 1, 2]
    tok[1, :3] = [4, 5, 6]
    tok[2, :5] = [7, 8, 9, 7, 8]
    assert p.propose([[2], [], [8]], np.array([5, 3, 5], dtype=np.int32), tok) == [[3, 1], [], [9, 7]]


def test_vllm_long_history_vector(impl):
    # vLLM's multithreading case: 8192 distinct tokens, then the pair from the middle
    t = 8192
    row = list(range(t)) + [t // 2, t // 2 + 1]
    p = make(impl, min_n=2, max_n=2, num_speculative_tokens=2, max_model_len=2 * t)
    assert one_step(p, [row, [4, 5, 6]])[0] == [t // 2 + 2, t // 2 + 3]


@pytest.mark.parametrize("cap, want", [(100, [3, 4, 5]), (8, [3, 4]), (7, [3]), (6, [])])
def test_max_model_len_caps_the_draft(impl, cap, want):
    history = [2, 3, 4, 5, 1, 2]  # the 1-gram [2] first occurs at 0: [3, 4, 5, 1, 2] follow
    p = make(impl, min_n=1, max_n=1, num_speculative_tokens=3, max_model_len=cap)
    assert one_step(p, [history], width=cap) == [want]
    assert vllm_rule_draft(history, 1, 1, cap, 3) == want


def test_rows_beyond_the_batch_are_ignored(impl):
    # token_ids_cpu and num_tokens_no_spec are max_num_reqs long; only len(sampled) rows count
    p = make(impl, min_n=1, max_n=1)
    tok = np.zeros((4, 10), dtype=np.int32)
    tok[0, :3] = [5, 6, 5]
    lens = np.array([3, 99, -5, 1000], dtype=np.int32)  # junk beyond row 0
    assert p.propose([[5]], lens, tok) == [[6, 5]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    history=st.lists(st.integers(0, 3), max_size=40),
    lo=st.integers(1, 4),
    extra=st.integers(0, 3),
    k=st.integers(1, 6),
    slack=st.integers(0, 10),
)
def test_same_drafts_as_vllm_rule(impl, history, lo, extra, k, slack):
    """Any history, range, K and cap: the adapter equals the transcription of vLLM's kernel."""
    hi = lo + extra
    cap = len(history) + slack
    p = make(impl, min_n=lo, max_n=hi, num_speculative_tokens=k, max_model_len=max(cap, 1))
    got = one_step(p, [history], width=max(cap, len(history), 1))
    assert got == [vllm_rule_draft(history, lo, hi, max(cap, 1), k)]


# -- state that survives vLLM's row movements ---------------------------------------------
def _engine(impl, seed, *, vocab, rows, cap, k, lo, hi, prefer="earliest", verify="sparse", long=False, calm=0.0,
            narrow=False, templated=0.0, **more):
    kern = impl.module("ngram_index")
    p = make(impl, min_n=lo, max_n=hi, prefer=prefer, num_speculative_tokens=k, max_model_len=cap, verify=verify)

    def rescan(history, kk):
        return kern.longest_match(history.astype(np.int64), lo, hi, kk, prefer).tolist()

    return Engine(p, random.Random(seed), max_num_reqs=rows, max_model_len=cap, vocab=vocab, k=k,
                  long_prompts=long, expected=rescan, calm=calm, narrow=narrow, templated=templated, **more), p


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(seed=2**32 - 1, vocab=2, rows=3, cap=112, k=2, lo=1, extra=0, prefer="earliest", verify="sparse")
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.sampled_from([2, 3, 5, 50]),
    rows=st.integers(1, 6),
    cap=st.integers(8, 120),
    k=st.integers(1, 5),
    lo=st.integers(1, 3),
    extra=st.integers(0, 2),
    prefer=st.sampled_from(["earliest", "latest"]),
    verify=st.sampled_from(["sparse", "full"]),
)
def test_proposals_equal_a_fresh_rescan_after_any_row_movements(impl, seed, vocab, rows, cap, k, lo, extra, prefer, verify):
    eng, _ = _engine(impl, seed, vocab=vocab, rows=rows, cap=cap, k=k, lo=lo, hi=lo + extra, prefer=prefer, verify=verify)
    for _ in range(30):
        eng.step()


@pytest.mark.parametrize("seed", range(3))
def test_long_histories_with_shared_prompts(impl, seed):
    """Histories past ``SHORT`` (the sparse fingerprint path), requests sharing prompts."""
    eng, p = _engine(impl, seed, vocab=32_000, rows=8, cap=1500, k=4, lo=2, hi=4, long=True)
    for _ in range(40):
        eng.step()
    assert eng.checked_rows > 100
    for what in ("swap_states", "preempt (row freed, state kept)", "resume after preemption", "finish (row freed)",
                 "condense (row moved into a hole)"):
        assert eng.moves.get(what, 0) > 0, eng.moves
    assert p.stats["adopted"] > 0  # moved indexes were followed, not rebuilt


def _chat_rows(rng, system, template, first, quote_tail):
    """A chat turn: the shared system prompt, a 12-token question quoting the template's
    tail, the answer's first token and ``quote_tail`` and ending in three shared tokens,
    then the template's tail."""
    q = rng.integers(0, 900, size=12).tolist()
    q[3:9] = template[-3:] + [first] + quote_tail
    q[9:] = [980, 981, 982]  # the question's last words, shared ("...please?")
    return system + q + template


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_a_reused_row_never_keeps_the_previous_requests_index(impl, proposer):
    """Two chat requests, one after the other in row 0 (vLLM reuses a finished request's
    row): the same system prompt, the same template tail, the same length, the same first
    answer token, so at the old request's length the new row holds the same last tokens.
    The old index would draft the old question's continuation; the row must draft from
    its own history (the sparse length-and-tail check kept the old index)."""
    rng = np.random.default_rng(3)
    system = rng.integers(0, 900, size=300).tolist()
    template, first = [991, 992, 993, 994, 995], 990
    p = (make if proposer == "ngram" else make_suffix)(impl, min_n=2, max_n=4, num_speculative_tokens=2,
                                                       max_model_len=4096)
    tok = np.zeros((4, 4096), dtype=np.int32)
    for i, quote in enumerate(([501, 502], [601, 602], [701, 702])):
        prompt = _chat_rows(rng, system, template, first, quote)
        hist = prompt + [first]  # prefill, then the first sampled token
        tok[0, : len(hist)] = hist
        out = p.propose([[first]], np.array([len(hist)], dtype=np.int32), tok)
        assert out == [p.rescan(np.asarray(hist), 2)], f"request {i} drafted {out}"
        assert out == [quote]  # its own question's continuation
        # (the request finishes; the next one takes row 0)


def _chat_pair(impl, proposer, seed):
    """A proposer without request ids and two chat requests (``_chat_rows``) as long as
    each other, each one token past the template: A quoting [501, 502], B [601, 602]."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 900, size=200).tolist()
    template, first = [991, 992, 993, 994, 995], 990
    p = (make if proposer == "ngram" else make_suffix)(impl, min_n=2, max_n=4, num_speculative_tokens=2,
                                                       max_model_len=4096)
    a = _chat_rows(rng, system, template, first, [501, 502]) + [first]
    b = _chat_rows(rng, system, template, first, [601, 602]) + [first]
    return p, a, b


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
@pytest.mark.parametrize("cut", [False, True])
def test_a_request_moving_into_a_row_of_its_index_length_is_compared(impl, proposer, cut):
    """Without request ids, two chat requests as long as each other and ending alike:
    B drafts in row 1 while A, in row 0, either re-prefills (resumed: nothing sampled, so
    no index and no tail read) or (``cut``) drafts one token longer. Next call they swap
    rows and each samples one token, A cut back by one first when ``cut``: row 1 now
    holds A at B's indexed length plus its sampled token, with B's tail there, so only
    comparing every token tells that B's index is not A's. A row holding no index as long
    as an index, or an index not confirmed this call (A's), calls for that comparison."""
    p, a, b = _chat_pair(impl, proposer, 5)
    if cut:
        a = a + [7]
    tok = np.zeros((2, 4096), dtype=np.int32)
    tok[0, : len(a)], tok[1, : len(b)] = a, b
    out = p.propose([[7] if cut else [], [b[-1]]], np.array([len(a), len(b)], dtype=np.int32), tok)
    assert out == [p.rescan(np.asarray(a), 2) if cut else [], p.rescan(np.asarray(b), 2)]
    a, b = (a[:-1] if cut else a) + [501], b + [601]  # swapped, one token each
    tok[0, : len(b)], tok[1, : len(a)] = b, a
    out = p.propose([[601], [501]], np.array([len(b), len(a)], dtype=np.int32), tok)
    assert out == [p.rescan(np.asarray(b), 2), p.rescan(np.asarray(a), 2)]
    assert out == [[602, 980], [502, 980]]  # each its own question's continuation


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 4),
    cap=st.sampled_from([400, 700]),
    k=st.integers(1, 4),
    lo=st.integers(1, 3),
    calm=st.sampled_from([0.0, 0.5]),
)
@pytest.mark.parametrize("proposer", ["ngram", "suffix", "counted"])
def test_shared_prompts_templates_and_equal_lengths_under_row_reuse(impl, proposer, seed, rows, cap, k, lo, calm):
    """Chat turns with one system prompt, one template, equally long questions and one
    first answer token, in few rows (so rows are reused at once): every draft equals a
    fresh rescan of the row (``counted``: the suffix proposer with its own counted drafts,
    each row's trie following its request)."""
    if proposer == "ngram":
        eng, _ = _engine(impl, seed, vocab=1000, rows=rows, cap=cap, k=k, lo=lo, hi=lo + 2, calm=calm, templated=0.9)
    else:
        eng, _ = _suffix_engine(impl, seed, vocab=1000, rows=rows, cap=cap, k=k, lo=lo, hi=None, prefer="earliest",
                                calm=calm, templated=0.9, counted=proposer == "counted")
    for _ in range(40):
        eng.step()


def test_a_swap_moves_the_indexes_instead_of_rebuilding(impl):
    p = make(impl, min_n=2, max_n=3, num_speculative_tokens=3, max_model_len=4000)
    rng = np.random.default_rng(0)
    tok = np.zeros((2, 4000), dtype=np.int32)
    tok[:, :1000] = rng.integers(0, 30_000, size=(2, 1000))
    lens = np.array([1000, 1000], dtype=np.int32)
    p.propose([[1], [1]], lens, tok)
    assert p.stats["rebuilt"] == 2
    tok[[0, 1]] = tok[[1, 0]]  # swap_states
    tok[:, 1000] = [7, 8]
    lens += 1
    out = p.propose([[7], [8]], lens, tok)
    assert p.stats["rebuilt"] == 2 and p.stats["adopted"] == 2
    for i in range(2):
        want = impl.module("ngram_index").longest_match(tok[i, :1001].astype(np.int64), 2, 3, 3, "earliest")
        assert out[i] == want.tolist()


def test_full_verify_catches_a_difference_the_sparse_fingerprint_does_not_look_at(impl):
    """Two long requests equal everywhere but one early position (not a fingerprint
    position): only ``verify="full"`` tells them apart; it then rescans the row."""
    n = 2000
    rng = np.random.default_rng(1)
    a = rng.integers(0, 30_000, size=n).astype(np.int32)
    a[-3:] = a[10:13]  # a match at 10..12: draft a[13:]
    b = a.copy()
    b[14] = 31_999  # inside the draft of a, not a sampled position
    kern = impl.module("ngram_index")
    p = make(impl, min_n=3, max_n=3, num_speculative_tokens=4, max_model_len=n + 10, verify="full")
    tok = np.zeros((1, n + 10), dtype=np.int32)
    tok[0, : n - 1] = a[: n - 1]
    p.propose([[1]], np.array([n - 1]), tok)
    tok[0, :n] = b  # another request takes the row, one token longer
    out = p.propose([[int(b[-1])]], np.array([n]), tok)
    assert out == [kern.longest_match(b.astype(np.int64), 3, 3, 4, "earliest").tolist()]
    assert out[0][1] == 31_999


# -- arguments -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, exc, words",
    [
        (("x", np.array([1]), np.zeros((1, 4), np.int32)), TypeError, "sampled_token_ids"),
        (([1], np.array([1]), np.zeros((1, 4), np.int32)), TypeError, r"sampled_token_ids\[0\]"),
        (([[1]], np.array([1]), np.zeros(4, np.int32)), ValueError, "token_ids_cpu"),
        (([[1]], np.array([1]), np.zeros((1, 4), np.float32)), TypeError, "token_ids_cpu"),
        (([[1], [1]], np.array([1, 1]), np.zeros((1, 4), np.int32)), ValueError, "token_ids_cpu has 1 rows"),
        (([[1], [1]], np.array([1]), np.zeros((2, 4), np.int32)), ValueError, "num_tokens_no_spec has 1"),
        (([[1]], np.array([5]), np.zeros((1, 4), np.int32)), ValueError, r"num_tokens_no_spec\[0\]=5"),
        (([[1]], np.array([-1]), np.zeros((1, 4), np.int32)), ValueError, r"num_tokens_no_spec\[0\]=-1"),
        (([[1]], np.array([1.0]), np.zeros((1, 4), np.int32)), TypeError, "num_tokens_no_spec"),
    ],
)
def test_refuses_arguments_that_do_not_fit(impl, args, exc, words):
    p = make(impl, min_n=1, max_n=1)
    with pytest.raises(exc, match=words):
        p.propose(*args)
    # the failed call left no state behind: the next call drafts right
    assert p.propose([[5]], np.array([3]), np.array([[5, 6, 5, 0]], np.int32)) == [[6, 5]]


# -- every shape vLLM can hand over ---------------------------------------------
def _both(impl, **kw):
    return [make(impl, **kw), make_suffix(impl, **kw)]


@pytest.mark.parametrize("verify", ["sparse", "full"])
@pytest.mark.parametrize("n", [5, 40, 300])
def test_a_narrower_token_ids_cpu_after_a_cut_back_drafts_from_the_row(impl, verify, n):
    """A row cut back below what its index holds, handed over in a ``token_ids_cpu``
    narrower than that index: the drafts are a fresh rescan's (it raised IndexError)."""
    rng = np.random.default_rng(n)
    for p in _both(impl, min_n=1, max_n=3, num_speculative_tokens=3, verify=verify):
        rows = [rng.integers(0, 4, n + 3).tolist(), rng.integers(0, 4, n).tolist()]
        tok = np.zeros((2, n + 10), np.int32)
        for i, r in enumerate(rows):
            tok[i, : len(r)] = r
        lens = np.array([len(r) for r in rows], np.int32)
        for _ in range(2):
            p.propose([[0], [0]], lens, tok)
        for width, cut in ((n - 2, n - 3), (4, 3), (1, 1), (n - 1, n - 1)):
            t2 = tok[:, :width]
            for arr in (t2, np.ascontiguousarray(t2), t2.astype(np.int64)):
                l2 = np.array([cut, min(width, n)], np.int32)
                out = p.propose([[0], [0]], l2, arr)
                assert out == [p.rescan(arr[i, : l2[i]], 3) for i in range(2)], (type(p).__name__, width, cut)


@pytest.mark.parametrize("seed", range(6))
def test_narrower_and_reshaped_token_ids_cpu_under_row_movements(impl, seed):
    """vLLM's row movements, with ``token_ids_cpu`` handed over cut to as few columns
    (and rows) as still hold every history, strided, copied or int64."""
    eng, _ = _engine(impl, seed, vocab=3, rows=5, cap=60, k=3, lo=1, hi=3, verify=("sparse", "full")[seed % 2], narrow=True)
    seng, _ = _suffix_engine(impl, seed, vocab=3, rows=5, cap=60, k=3, lo=1, hi=None, prefer="latest", narrow=True)
    for _ in range(60):
        eng.step()
        seng.step()
    assert eng.moves["narrower token_ids_cpu"] > 10 and eng.moves["output cut back in place"] > 0


@pytest.mark.parametrize("seed", range(2))
def test_narrower_token_ids_cpu_on_the_steady_path(impl, seed):
    eng, p = _engine(impl, seed, vocab=50, rows=12, cap=700, k=3, lo=1, hi=3, long=True, calm=0.7, narrow=True)
    for _ in range(40):
        eng.step()
    assert p.stats["steady"] > 0 and eng.moves["narrower token_ids_cpu"] > 10


def test_a_token_ids_cpu_with_huge_row_count_costs_nothing(impl):
    """Per-row state is sized by the batch, not by ``token_ids_cpu``'s row count (a
    zero-width array of 10**12 rows is free to make; sizing by it raised MemoryError)."""
    for p in _both(impl, min_n=1, max_n=1):
        assert p.propose([[5]], np.array([0]), np.zeros((10**12, 0), np.int32)) == [[]]
        assert p.propose([[5]], np.array([3]), np.array([[5, 6, 5, 0]], np.int32)) == [[6, 5]]
        assert p._len.shape[0] < 10


def test_a_history_longer_than_its_row_names_the_row(impl):
    for p in _both(impl, min_n=1, max_n=1):
        with pytest.raises(ValueError, match=r"num_tokens_no_spec\[1\]=9 .*row 1 of token_ids_cpu"):
            p.propose([[1], [1]], np.array([2, 9]), np.zeros((2, 4), np.int32))
        with pytest.raises(ValueError, match=r"num_tokens_no_spec\[0\]=18446744073709551615 "):
            p.propose([[1]], np.array([2**64 - 1], np.uint64), np.zeros((1, 4), np.int32))
        assert p.propose([[5]], np.array([3]), np.array([[5, 6, 5, 0]], np.int32)) == [[6, 5]]


def test_the_base_class_refuses_construction():
    """vLLM loads a class path and constructs it: the base class (or a subclass without
    the hooks) is refused there, not at the first ``propose`` (NotImplementedError)."""
    cfg = sv.ProposerConfig(num_speculative_tokens=3, max_model_len=64)
    with pytest.raises(TypeError, match="RowTrackingProposer is a base class to subclass"):
        sv.RowTrackingProposer(cfg)

    class Half(sv.RowTrackingProposer):
        def _new_index(self):
            return LastTokenIndex()

    with pytest.raises(TypeError, match="Half is a base class to subclass"):
        Half(cfg)
    assert LastTokenProposer(cfg).num_speculative_tokens == 3  # both hooks: a proposer


def test_accepts_cpu_tensors_through_their_numpy_view(impl):
    class Tensor:  # what vLLM's token_ids_cpu_tensor offers
        def __init__(self, a):
            self._a = a

        def numpy(self):
            return self._a

    p = make(impl, min_n=1, max_n=1)
    assert p.propose([[5]], Tensor(np.array([3], np.int32)), Tensor(np.array([[5, 6, 5, 0]], np.int32))) == [[6, 5]]
    # long histories: the steady step takes tensors too
    kern = impl.module("ngram_index")
    for rows in (2, 20):
        p = make(impl, min_n=1, max_n=2, max_model_len=1000)
        tok = np.random.default_rng(rows).integers(0, 30, size=(rows, 1000)).astype(np.int32)
        lens = np.full(rows, 300, dtype=np.int32)
        for _ in range(4):
            out = p.propose([[1]] * rows, Tensor(lens), Tensor(tok))
            for r in range(rows):
                assert out[r] == kern.longest_match(tok[r, :300 + _].astype(np.int64), 1, 2, 2, "earliest").tolist()
            lens += 1
        assert p.stats["steady"] == 3


def test_concurrent_calls_are_refused(impl):
    p = make(impl, min_n=1, max_n=1)
    p._guard.acquire()
    try:
        with pytest.raises(RuntimeError, match="another propose"):
            p.propose([[5]], np.array([3]), np.array([[5, 6, 5, 0]], np.int32))
    finally:
        p._guard.release()


def test_k_zero_and_empty_batches(impl):
    p = make(impl, min_n=1, max_n=1, num_speculative_tokens=0)
    assert p.propose([[5]], np.array([3]), np.array([[5, 6, 5, 0]], np.int32)) == [[]]
    p = make(impl, min_n=1, max_n=1)
    assert p.propose([], np.zeros(4, np.int32), np.zeros((4, 8), np.int32)) == []
    p.load_model()  # vLLM calls it; nothing to load
    p.reset()
    assert p.propose([[5]], np.array([3]), np.array([[5, 6, 5, 0]], np.int32)) == [[6, 5]]


def test_a_step_goes_through_the_index_kinds_serve_batch(impl, monkeypatch):
    """The general step updates and proposes through the index module's one serving-step
    policy, ``serve_batch`` (its lists form), with nothing recorded (vLLM does not say
    what it accepted)."""
    kern = impl.module("ngram_index")
    calls = []

    class Counting:
        NgramIndex = kern.NgramIndex

        @staticmethod
        def serve_batch_lists(indexes, tokens, offsets, drafted, accepted, max_k=None):
            calls.append((len(indexes), np.asarray(tokens).tolist(), list(drafted), list(accepted)))
            return kern.serve_batch_lists(indexes, tokens, offsets, drafted, accepted, max_k)

    tok = np.array([[5, 6, 5, 6], [1, 1, 7, 0]], np.int32)
    monkeypatch.setattr(proposers, "ngram_index", Counting)  # the module the proposer's calls go through
    p = on(impl)(num_speculative_tokens=2, min_n=1, max_n=1)
    assert p.propose([[5], [1]], np.array([3, 2]), tok) == [[6, 5], [1]]
    assert p.propose([[6], [7]], np.array([4, 3]), tok) == [[5, 6], []]  # one token per row
    assert calls == [(2, [5, 6, 5, 1, 1], [0, 0], [0, 0]), (2, [6, 7], [0, 0], [0, 0])]


def test_sparse_check_notices_a_history_that_only_shares_the_tail_within_deep_steps(impl):
    """A row whose recent tokens match (same length, same last TAIL tokens) but whose
    earlier history is another request's is caught by the spread check within DEEP
    steps, and then drafts from its own history."""
    n = 3000
    rng = np.random.default_rng(2)
    a = rng.integers(0, 30_000, size=n + 64).astype(np.int32)
    b = rng.integers(0, 30_000, size=n + 64).astype(np.int32)
    b[n - 40 : n + 64] = a[n - 40 : n + 64]  # the same recent and future tokens
    kern = impl.module("ngram_index")
    p = make(impl, min_n=3, max_n=3, num_speculative_tokens=4, max_model_len=n + 64)
    tok = np.zeros((1, n + 64), dtype=np.int32)
    tok[0] = a
    p.propose([[1]], np.array([n - 1]), tok)
    assert p.stats["rebuilt"] == 1
    tok[0] = b  # another request takes the row
    caught_at = None
    for step in range(p.DEEP + 1):
        L = n + step
        b[100:103] = tok[0, L - 3 : L]  # only B's own history holds its last 3-gram
        tok[0, 100:103] = b[100:103]
        out = p.propose([[int(tok[0, L - 1])]], np.array([L]), tok)
        want = kern.longest_match(tok[0, :L].astype(np.int64), 3, 3, 4, "earliest").tolist()
        assert want, "the test needs a draft only B's history gives"
        if p.stats["rebuilt"] == 2:
            caught_at = step
            assert out == [want]
            break
    assert caught_at is not None and caught_at < p.DEEP


class LastTokenIndex:
    """A toy index type: drafts what followed the latest earlier occurrence of the last
    token (``longest_match(h, 1, 1, k, "latest")``)."""

    def __init__(self):
        self.toks: list[int] = []
        self.prev: dict[int, int] = {}
        self.end = -1

    def extend(self, tokens):
        for t in np.asarray(tokens).tolist():
            self.end = self.prev.get(t, -1)
            self.toks.append(t)
            self.prev[t] = len(self.toks)

    @property
    def tokens(self):
        return np.asarray(self.toks, dtype=np.int64)


class LastTokenProposer(sv.RowTrackingProposer):
    """A second proposer over another index type: two short hooks."""

    def _new_index(self):
        return LastTokenIndex()

    def _serve_indexes(self, indexes, tokens, offsets, ks):
        for i, ix in enumerate(indexes):
            ix.extend(tokens[offsets[i] : offsets[i + 1]])
        ks = np.broadcast_to(np.asarray(ks, dtype=np.int64), (len(indexes),))
        pieces = [ix.toks[ix.end : ix.end + int(k)] if ix.end >= 0 else [] for ix, k in zip(indexes, ks)]
        return [[int(t) for t in p] for p in pieces]


@pytest.mark.parametrize("seed", range(4))
def test_the_base_class_serves_another_index_type(impl, seed):
    kern = impl.module("ngram_index")
    p = LastTokenProposer(sv.ProposerConfig(num_speculative_tokens=3, max_model_len=300))

    def rescan(history, k):
        return kern.longest_match(history.astype(np.int64), 1, 1, k, "latest").tolist()

    eng = Engine(p, random.Random(seed), max_num_reqs=5, max_model_len=300, vocab=40, k=3, expected=rescan)
    for _ in range(40):
        eng.step()
    assert eng.checked_rows > 50


def test_indexes_of_requests_that_left_are_bounded(impl):
    eng, p = _engine(impl, 7, vocab=32_000, rows=8, cap=600, k=3, lo=2, hi=3, long=True)
    for _ in range(120):
        eng.step()
    assert len(p._pool) <= p.POOL
    assert p._pool_tokens == sum(key[0] for key in p._pool) <= p.POOL_TOKENS
    held = sum(ix is not None for ix in p._ix)
    assert held <= eng.batch.num_reqs  # rows past the batch hold nothing
    # a batch that shrinks to one row releases the others' indexes
    tok = np.zeros((8, 600), dtype=np.int32)
    tok[0, :5] = [1, 2, 3, 1, 2]
    p.propose([[2]], np.array([5]), tok)
    assert sum(ix is not None for ix in p._ix) == 1


@pytest.mark.parametrize("budget", [0, 500, 2000])
def test_kept_indexes_are_bounded_in_tokens(impl, budget):
    """The pool keeps at most ``POOL_TOKENS`` tokens of indexes (the least recently left
    go first), and the rows still draft what a fresh rescan gives."""
    eng, p = _engine(impl, 3, vocab=32_000, rows=8, cap=600, k=3, lo=2, hi=3, long=True)
    p.POOL_TOKENS = budget
    most = 0
    for _ in range(120):
        eng.step()
        assert p._pool_tokens == sum(key[0] for key in p._pool) <= budget
        most = max(most, len(p._pool))
    assert eng.moves["resume after preemption"] > 0
    assert (most > 0) == (budget > 0)


# -- the steady-state step (same rows, every row sampled, histories past SHORT) --------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.sampled_from([1, 3, 5, 20]),
    cap=st.integers(300, 700),
    k=st.integers(1, 5),
    prefer=st.sampled_from(["earliest", "latest"]),
)
def test_steady_steps_equal_a_fresh_rescan(impl, seed, rows, cap, k, prefer):
    """Long histories, so steps take the steady path (few rows and many rows) between
    vLLM's row movements; every proposal still equals a fresh rescan."""
    eng, p = _engine(impl, seed, vocab=50, rows=rows, cap=cap, k=k, lo=1, hi=3, prefer=prefer, long=True, calm=0.8)
    for _ in range(25):
        eng.step()


@pytest.mark.parametrize("rows", [2, 20])
def test_steady_path_is_taken_and_agrees(impl, rows):
    eng, p = _engine(impl, 11, vocab=50, rows=rows, cap=900, k=3, lo=1, hi=3, long=True, calm=0.8)
    for _ in range(60):
        eng.step()
    assert p.stats["steady"] > 0 and p.stats["steady"] < p.stats["steps"]


@pytest.mark.parametrize("rows", [2, 20])
def test_steady_path_leaves_a_changed_row_to_the_general_step(impl, rows):
    """A row whose tail (or, on its DEEP turn, a spread position) changed under the index
    is not extended by the steady path: the general step rebuilds it."""
    p = make(impl, min_n=1, max_n=2, num_speculative_tokens=2, max_model_len=2000)
    rng = np.random.default_rng(rows)
    tok = rng.integers(0, 40, size=(rows, 2000)).astype(np.int32)
    lens = np.full(rows, 500, dtype=np.int32)
    kern = impl.module("ngram_index")
    p.propose([[1]] * rows, lens, tok)
    for step in range(3 * p.DEEP):
        lens += 1 + step % 2
        if step == 3:
            tok[rows - 1, int(lens[-1]) - 4] += 1  # inside the indexed tail (TAIL tokens before the old length)
            rebuilt = p.stats["rebuilt"]
        if step == 9:
            tok[0, : int(lens[0]) - 30] += 1  # everything but the tail: found on row 0's DEEP turn
            rebuilt = p.stats["rebuilt"]
        out = p.propose([[1] * (1 + step % 2)] * rows, lens, tok)  # grown by the sampled tokens
        if step == 3:
            assert p.stats["rebuilt"] == rebuilt + 1  # at once
        for r in range(rows):
            if r == 0 and 9 <= step < 9 + p.DEEP and p.stats["rebuilt"] == rebuilt:
                continue  # the sparse check has not reached row 0 yet
            assert out[r] == kern.longest_match(tok[r, : lens[r]].astype(np.int64), 1, 2, 2, "earliest").tolist()
    assert p.stats["steady"] > 2 * p.DEEP
    assert p.stats["rebuilt"] == rows + 2


# -- the suffix-index proposer --------------------------------------------------------------
def make_suffix(impl, **kw):
    kw.setdefault("num_speculative_tokens", 2)
    return on(impl, sv.SpecfsmSuffixProposer)(**kw)


def test_suffix_proposer_settings(impl, monkeypatch):
    p = make_suffix(impl)
    assert (p.min_n, p.max_n, p.prefer) == (1, None, "earliest")
    cfg = sv.ProposerConfig(num_speculative_tokens=3, max_model_len=64, prompt_lookup_min=2, prompt_lookup_max=0)
    p = on(impl, sv.SpecfsmSuffixProposer)(cfg)
    assert (p.min_n, p.max_n, p.num_speculative_tokens, p.max_model_len) == (2, None, 3, 64)
    monkeypatch.setenv("SPECFSM_VLLM_MAX_N", "6")
    monkeypatch.setenv("SPECFSM_VLLM_PREFER", "latest")
    p = make_suffix(impl)
    assert (p.min_n, p.max_n, p.prefer) == (1, 6, "latest")
    with pytest.raises(ValueError, match="prefer"):
        make_suffix(impl, prefer="middle")
    assert "SpecfsmSuffixProposer" in repr(p)


def test_suffix_proposer_drafts_the_longest_match(impl):
    p = make_suffix(impl, num_speculative_tokens=3)
    # the suffix [1, 2, 3] occurs earlier once (followed by 9, 9); [3] alone would pick 4
    hist = [3, 4, 1, 2, 3, 9, 9, 5, 1, 2, 3]
    assert one_step(p, [hist]) == [[9, 9, 5]]
    nl = impl.module("ngram_index")
    want = nl.longest_match(np.asarray(hist, dtype=np.int64), 1, len(hist), 3, "earliest").tolist()
    assert want == [9, 9, 5]


def _suffix_engine(impl, seed, *, vocab, rows, cap, k, lo, hi, prefer, verify="sparse", long=False, calm=0.0,
                   narrow=False, templated=0.0, counted=False, **more):
    sk = impl.module("suffix_index")
    nk = impl.module("ngram_index")
    cls = type("SpecfsmSuffixProposer", (sv.SpecfsmSuffixProposer,), COUNTED_SUFFIX) if counted else \
        on(impl, sv.SpecfsmSuffixProposer)
    p = cls(min_n=lo, max_n=hi, prefer=prefer, num_speculative_tokens=k, max_model_len=cap, verify=verify)

    def rescan(history, kk):
        fresh = sk.SuffixIndex(lo, hi, prefer)
        fresh.extend(history.astype(np.int64))
        got = fresh.propose(kk)
        if len(history) <= 200:  # and a brute-force scan agrees
            assert got == nk.longest_match(history.astype(np.int64), lo, hi or max(len(history), lo), kk, prefer).tolist()
        if counted and fresh.match_length() < p.LONG:  # a fresh trie over the history
            trie = impl.module("suffix_trie").SuffixTrie(p.trie_depth)
            trie.extend(0, history)
            got = trie.speculate(history[-p.trie_depth:], kk, 0.0, p.min_prob)[0] if kk else []
        return got

    return Engine(p, random.Random(seed), max_num_reqs=rows, max_model_len=cap, vocab=vocab, k=k,
                  long_prompts=long, expected=rescan, calm=calm, narrow=narrow, templated=templated, **more), p


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.sampled_from([2, 3, 5, 50]),
    rows=st.integers(1, 6),
    cap=st.integers(8, 120),
    k=st.integers(1, 5),
    lo=st.integers(1, 3),
    hi=st.sampled_from([None, 4]),
    prefer=st.sampled_from(["earliest", "latest"]),
    verify=st.sampled_from(["sparse", "full"]),
    counted=st.booleans(),
)
def test_suffix_proposals_equal_a_fresh_index_after_any_row_movements(impl, seed, vocab, rows, cap, k, lo, hi, prefer, verify,
                                                                     counted):
    """Every draft equals a fresh index's (``counted``: a fresh trie's where the match is
    short) over the row's history, whatever vLLM did to the rows."""
    eng, _ = _suffix_engine(impl, seed, vocab=vocab, rows=rows, cap=cap, k=k, lo=lo, hi=hi, prefer=prefer, verify=verify,
                            counted=counted)
    for _ in range(30):
        eng.step()


@pytest.mark.parametrize("rows, seed", [(3, 0), (20, 1), (20, 2)])
@pytest.mark.parametrize("counted", [False, True])
def test_suffix_long_histories_and_steady_steps(impl, rows, seed, counted):
    eng, p = _suffix_engine(impl, seed, vocab=50, rows=rows, cap=900, k=4, lo=1, hi=None, prefer="earliest", long=True, calm=0.8,
                            counted=counted)
    for _ in range(60):
        eng.step()
    assert eng.checked_rows > 60
    assert p.stats["steady"] > 0 and p.stats["adopted"] > 0
