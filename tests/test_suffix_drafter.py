"""The suffix drafter in the serving loop and the shared cross-request cache:
``SuffixDrafter`` sessions, ``SharedSuffixCache`` (bounded generations, one lock, outputs
handed over by dropped sessions without waiting for it) and the optional Arctic
comparison drafter, on the active implementation (the drafters' indexes are its).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest


# ---------------------------------------------------------------------------------------
# the drafter in the serving loop
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("adaptive", [False, True])
def test_drafter_in_loop_matches_greedy(adaptive):
    from specfsm.serving.loop import Request, SpeculativeLoop, TeacherForcedTarget
    from specfsm.drafting.suffix_index import SuffixDrafter

    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 30, size=300).tolist()
    out = prompt[40:200] + [99] + prompt[201:260] + rng.integers(0, 30, size=40).tolist()
    reqs = [Request(prompt, len(out), target=TeacherForcedTarget(prompt, out))]
    d = SuffixDrafter(adaptive=adaptive)
    res = SpeculativeLoop(None, d, 8).run_batch(reqs, check=True)
    assert res[0].output == out
    s = res[0].stats
    assert s.output_tokens / s.evaluations > 3  # the copied spans are drafted
    assert "SuffixDrafter(min_n=1" in repr(d)
    sess = d.session(prompt)
    first = sess.propose(4)
    sess.extend(first[:2] + [12345])
    assert sess.index.stats["steps"] == 1 and sess.index.stats["accepted"] == 2


def test_drafter_refuses_bad_settings():
    from specfsm.drafting.suffix_index import SuffixDrafter

    with pytest.raises(ValueError, match="min_n"):
        SuffixDrafter(0)
    with pytest.raises(ValueError, match="prefer"):
        SuffixDrafter(prefer="x")


# ---------------------------------------------------------------------------------------
# lookup and the shared cross-request cache
# ---------------------------------------------------------------------------------------


def test_shared_cache():
    from specfsm.drafting.suffix_index import SharedSuffixCache

    cache = SharedSuffixCache(max_tokens=40, generations=2, min_n=2)
    cache.add([1, 2, 3, 4, 5])
    cache.add([7, 8, 9])
    assert cache.lookup([0, 2, 3], 4) == (2, [4, 5])   # stops at the output's end
    assert cache.lookup([3, 4, 5], 4) == (3, [])
    assert cache.lookup([5, 7], 4) == (0, [])          # no match spans two outputs
    assert len(cache) == 10 and cache.nbytes > 0
    # filling past max_tokens drops the least recently used generation
    cache.add(list(range(100, 115)))                   # a second generation
    assert cache.lookup([1, 2], 2) == (2, [3, 4])      # touches the first
    cache.add(list(range(200, 215)))                   # a third: the second goes
    assert cache.lookup([100, 101], 2) == (0, [])
    assert cache.lookup([1, 2], 2) == (2, [3, 4])
    assert cache.lookup([200, 201], 2) == (2, [202, 203])
    with pytest.raises(TypeError, match="tokens"):
        cache.add([[1, 2]])
    with pytest.raises(ValueError, match="generations"):
        SharedSuffixCache(10, 0)


def test_shared_cache_from_threads():
    from specfsm.drafting.suffix_index import SharedSuffixCache

    cache = SharedSuffixCache(max_tokens=20_000, generations=4)
    rng = np.random.default_rng(4)
    outputs = [rng.integers(0, 40, size=300).tolist() for _ in range(40)]
    errors = []

    def work(i):
        try:
            for j in range(i, len(outputs), 4):
                cache.add(outputs[j])
                n, d = cache.lookup(outputs[j][:50], 8)
                assert n >= 1 and len(d) <= 8
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(cache) <= 20_000


def test_drafter_with_shared_cache_drafts_across_requests():
    from specfsm.serving.loop import Request, SpeculativeLoop, TeacherForcedTarget
    from specfsm.drafting.suffix_index import SharedSuffixCache, SuffixDrafter

    rng = np.random.default_rng(8)
    template = rng.integers(0, 1000, size=200).tolist()
    shared = SharedSuffixCache()
    d = SuffixDrafter(shared=shared)
    plain = SuffixDrafter()

    def run(drafter, prompt):
        req = Request(prompt, len(template), target=TeacherForcedTarget(prompt, template))
        sess_loop = SpeculativeLoop(None, drafter, 8)
        return sess_loop.run(req, check=True).stats

    run(d, [5000, 5001])                       # the first request fills the cache
    s_shared = run(d, [6000, 6001])
    s_plain = run(plain, [6000, 6001])
    assert s_shared.evaluations < s_plain.evaluations / 3
    sess = d.session([1, 2])
    sess.extend([3])
    sess.close()
    sess.close()                               # once only
    with pytest.raises(TypeError, match="shared"):
        SuffixDrafter(shared=object())


def test_arctic_drafter_in_loop():
    """The comparison drafter (optional package) drafts only verified-equal output."""
    pytest.importorskip("arctic_inference.suffix_decoding", reason="arctic-inference is not installed")
    from specfsm.serving.loop import Request, SpeculativeLoop, TeacherForcedTarget
    from specfsm.drafting.suffix_index import ArcticDrafter, arctic_available

    assert arctic_available()
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 30, size=200).tolist()
    out = prompt[20:150] + rng.integers(0, 30, size=30).tolist()
    req = Request(prompt, len(out), target=TeacherForcedTarget(prompt, out))
    res = SpeculativeLoop(None, ArcticDrafter(), 8).run(req, check=True)
    assert res.output == out and res.stats.evaluations < len(out)
    assert "ArcticDrafter(max_tree_depth=24)" == repr(ArcticDrafter())


def _session_with_output(cache):
    from specfsm.drafting.suffix_index import SuffixDrafter

    d = SuffixDrafter(shared=cache)
    sess = d.session([1, 2, 3])
    sess.extend([4, 5, 6, 7])
    return sess


def test_dropped_session_never_waits_for_the_cache_lock():
    """The garbage collector may finalise a drafter session inside a cache call that
    holds the cache's lock, in the same thread: the finaliser queues the output instead
    of waiting (today's code deadlocked), and the next call indexes it."""
    from specfsm.drafting.suffix_index import SharedSuffixCache

    cache = SharedSuffixCache()
    sess = _session_with_output(cache)
    done = threading.Event()

    def body():
        with cache._lock:               # as inside add/lookup, when a collection runs
            sess.__del__()
        done.set()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "the finaliser waited for the lock its own thread holds"
    assert len(cache) == 5                      # 4 tokens and a separator, indexed now
    assert cache.lookup([9, 4, 5], 2) == (2, [6, 7])
    sess.__del__()                              # once only
    assert len(cache) == 5


def test_dropped_session_by_the_collector_inside_a_cache_call():
    """The same through the garbage collector: a collection that starts while lookup
    holds the lock drops the last reference to a session (its callback clears the
    list holding it), so the finaliser runs there, in the lookup's thread."""
    import gc

    from specfsm.drafting.suffix_index import SharedSuffixCache

    cache = SharedSuffixCache()
    cache.add([1, 2, 3])
    holder = [_session_with_output(cache)]
    fired = []
    done = threading.Event()

    def cb(phase, info):
        if phase == "start" and holder and cache._lock.locked():
            fired.append(True)
            holder.clear()              # the session's finaliser runs here

    def body():
        old = gc.get_threshold()
        gc.callbacks.append(cb)
        gc.set_threshold(1)
        try:
            for _ in range(50):
                cache.lookup([1, 2], 2)
                if fired:
                    break
        finally:
            gc.set_threshold(*old)
            gc.callbacks.remove(cb)
        done.set()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(20)
    assert done.is_set(), "deadlocked: the finaliser waited for the lock lookup holds"
    assert fired, "no collection ran while the lock was held"
    assert cache.lookup([9, 4, 5], 2) == (2, [6, 7])


def test_shared_cache_callbacks_and_ids_beyond_int64():
    """Arguments are converted before the lock is taken (a context whose conversion
    calls the cache back cannot deadlock it); ids beyond int64 are refused as
    SuffixIndex.extend refuses them (today they were stored wrapped into the
    separators' range), and ids in that range are refused too."""
    from collections.abc import Sequence

    from specfsm.drafting.suffix_index import SharedSuffixCache

    cache = SharedSuffixCache()
    with pytest.raises(OverflowError, match="tokens"):
        cache.add(np.array([2**63 + 5, 1], dtype=np.uint64))
    with pytest.raises(OverflowError, match="tokens"):
        cache.add([2**64 - 1])
    with pytest.raises(ValueError, match="separators"):
        cache.add([-(2**63) + 7])
    assert len(cache) == 0
    cache.add(np.array([2**63 - 1, 3, 4], dtype=np.uint64))
    assert cache.lookup([2**63 - 1], 2) == (1, [3, 4])

    class Calling(Sequence):
        def __len__(self):
            cache.add([8, 9])
            return 2

        def __getitem__(self, i):
            if i >= 2:
                raise IndexError(i)
            return [3, 4][i]

    done = threading.Event()
    out = []

    def body():
        out.append(cache.lookup(Calling(), 1))
        done.set()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "lookup deadlocked on a context that calls the cache"
    assert out[0][0] >= 0
