"""Hostile scenarios for ``BatchState`` and ``StepResult`` (registered in ``runner.py``).

Every public method of both classes is called with generated arguments, some of them
hostile: conversion callbacks (``__index__``, ``__bool__``, ``__array__``) and rule
callbacks that call back into the batch (transitions, ``pending``, ``step``, a second
``__init__``), lists mutated while they are converted, views made writeable and written
back, instances made with ``__new__``, and other threads calling every method while a
step runs (or re-initialising the batch from a thread). Every call must return or raise
one of ``ALLOWED``; a refused ``step`` or transition must leave the batch exactly as it
was (checked when no other thread runs), and the batch's ``pending()`` layout must stay
consistent after every call. Self-contained (no import of ``runner``: it imports this).
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np

from specfsm.errors import IllegalTransition

ALLOWED = (TypeError, ValueError, IndexError, OverflowError, RuntimeError, IllegalTransition)


class Broken(AssertionError):
    """The batch broke a rule (reported by the runner with its seed)."""


def attempt(fn, *args, **kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except ALLOWED as exc:
        return "err", exc


def snapshot(b):
    c = b.capacity
    return (b.states.tolist(), b.tokens.tolist(), b.caches.tolist(), b.accepted.tolist(),
            b.draft_lens.tolist(), b.remaining.tolist(), [repr(b.slot_fields(i)) for i in range(c)],
            [a.tolist() for a in b.pending()])


def check_layout(b):
    """``pending()`` of a batch nobody else is using must be self-consistent."""
    slots, inputs, off = b.pending()
    st = b.states
    if off.shape[0] != slots.shape[0] + 1 or off[0] != 0 or int(off[-1]) != inputs.shape[0]:
        raise Broken(f"inconsistent layout: slots {slots}, offsets {off}, {inputs.shape[0]} inputs")
    if (np.diff(off) < 1).any() or not np.isin(st[slots], (1, 2, 3)).all():
        raise Broken(f"layout rows or states wrong: offsets {off}, states {st[slots]}")
    if st.min() < 0 or st.max() > 6:
        raise Broken(f"state codes outside 0..6: {st}")


# --------------------------------------------------------------------------------------
# hostile arguments
# --------------------------------------------------------------------------------------
class Hook:
    """Calls ``act()`` (a call back into the batch) when converted, then acts as ``value``."""

    def __init__(self, value, act):
        self.value, self.act = value, act

    def _run(self):
        try:
            self.act()
        except ALLOWED:
            pass

    def __index__(self):
        self._run()
        return self.value

    def __bool__(self):
        self._run()
        return bool(self.value)

    def __array__(self, dtype=None, copy=None):
        self._run()
        return np.asarray(self.value, dtype=dtype)


class BadBool:
    def __bool__(self):
        raise ValueError("a bonus whose truth value raises")


class MutatingList(list):
    """A list that clears ``other`` (another argument) when it is iterated or measured."""

    def __init__(self, items, other):
        super().__init__(items)
        self.other = other

    def __len__(self):
        if self.other:
            self.other.clear()
        return super().__len__()

    def __iter__(self):
        if self.other:
            self.other.clear()
        return super().__iter__()


def reentry(rng, b, mods):
    """A call back into the batch, drawn at random (every public method, __init__ too)."""
    c = max(1, _cap(b))
    s = rng.randrange(c)
    return rng.choice([
        lambda: b.__init__(rng.randrange(1, 9), rng.randrange(1, 5)),
        lambda: b.pending(),
        lambda: b.step(np.zeros(rng.randrange(0, 6), dtype=np.int64)),
        lambda: b.admit([s], [1, 2], [0, 2], [s]),
        lambda: b.advance_prefill([s], [1], [s]),
        lambda: b.advance_decode([s], [1], [s]),
        lambda: b.enter_verify([s], [1], [0, 1]),
        lambda: b.accept([s], [1], [0, 1], [0], [0, 1]),
        lambda: b.accept_rows([s], [1], [1], [0, 1], [0], [0, 1]),
        lambda: b.resume([s]),
        lambda: b.rollback([s]),
        lambda: b.finish([s]),
        lambda: b.release([s]),
        lambda: b.states,
        lambda: b.draft(s),
        lambda: b.slot_fields(s),
        lambda: b.slots_in(2),
        lambda: len(b),
        lambda: write_back(b, rng),
    ])


def _cap(b):
    try:
        return b.capacity
    except RuntimeError:
        return 0


def write_back(b, rng):
    """A view made writeable and written: it must be a copy (the batch unchanged)."""
    name = rng.choice(["states", "tokens", "caches", "accepted", "draft_lens", "remaining"])
    v = getattr(b, name)
    v.flags.writeable = True
    v[:] = rng.choice([127, -1, 2**40, 0]) if v.dtype != np.int8 else rng.choice([127, -1, 3])


class HostileRule:
    """``accepted_rows`` that calls back into the batch and returns something odd."""

    def __init__(self, rng, b, mods):
        self.rng, self.b, self.mods = rng, b, mods

    def accepted_rows(self, draft, rows):
        for _ in range(self.rng.randrange(3)):
            try:
                reentry(self.rng, self.b, self.mods)()
            except ALLOWED:
                pass
        return self.rng.choice([0, len(draft), len(draft) + 1, -1, 1, 10**30, 1.5, Hook(1, lambda: None)])


# --------------------------------------------------------------------------------------
# one random call
# --------------------------------------------------------------------------------------
def new_batch(bm, rng):
    return bm.BatchState(rng.randrange(1, 7), rng.randrange(1, 5), rng.random() < 0.5)


def new_index(mods, rng):
    kind = rng.randrange(3)
    if kind == 0:
        return None
    ix = mods["ngram_index"].NgramIndex(1, 3) if kind == 1 else mods["suffix_index"].SuffixIndex(1)
    ix.extend([rng.randrange(4) for _ in range(rng.randrange(0, 8))])
    return ix


def drive(rng, b, mods, hostile, publish=None):
    """One call on ``b``: a plausible transition or step, or (``hostile``) one with
    hostile arguments. Returns ``(name, outcome)``."""
    bm = mods["batch"]
    c = b.capacity
    st = b.states
    free = np.flatnonzero(st == bm.FREE).tolist()
    pre = np.flatnonzero(st == bm.PREFILL).tolist()
    dec = np.flatnonzero(st == bm.DECODE).tolist()
    ver = np.flatnonzero(st == bm.VERIFY).tolist()
    done = np.flatnonzero(st == bm.DONE).tolist()
    re = (lambda v: Hook(v, reentry(rng, b, mods))) if hostile else (lambda v: v)
    op = rng.randrange(9)
    if op == 0 and free:
        s = rng.sample(free, rng.randrange(1, len(free) + 1))
        lens = [rng.randrange(0 if hostile else 1, 5) for _ in s]
        pos = [rng.randrange(4) for _ in range(sum(lens))]
        off = np.cumsum([0] + lens).tolist()
        ixs = [new_index(mods, rng) for _ in s]
        if hostile and len(s) > 1 and rng.random() < 0.3:
            ixs[1] = ixs[0]
        slots = [re(x) for x in s] if rng.random() < 0.5 else s
        if hostile and rng.random() < 0.3:
            slots = Hook(np.array(s), reentry(rng, b, mods))
        if hostile and rng.random() < 0.3:
            pos = MutatingList(pos, off)
        return "admit", attempt(b.admit, slots, pos, off, [re(x) for x in s],
                                max_tokens=rng.choice([None, rng.randrange(1, 6)]),
                                eos=rng.choice([None, rng.randrange(4)]), indexes=ixs)
    if op == 1 and pre:
        s = rng.sample(pre, rng.randrange(1, len(pre) + 1))
        return "advance_prefill", attempt(b.advance_prefill, s, [re(rng.randrange(4)) for _ in s], s)
    if op == 2 and dec:
        s = rng.sample(dec, rng.randrange(1, len(dec) + 1))
        lens = [rng.randrange(0 if hostile else 1, b.k_max + (2 if hostile else 1)) for _ in s]
        off = np.cumsum([0] + lens)
        return "enter_verify", attempt(b.enter_verify, s, [rng.randrange(4) for _ in range(int(off[-1]))],
                                       re(off) if hostile else off)
    if op == 3 and ver:
        s = rng.sample(ver, rng.randrange(1, len(ver) + 1))
        ks = [int(b.draft_lens[i]) for i in s]
        rt = [rng.randrange(4) for _ in range(sum(ks))]
        off = np.cumsum([0] + ks).tolist()
        if rng.random() < 0.5:
            return "accept", attempt(b.accept, s, rt, off, [re(x) for x in rt], off)
        return "accept_rows", attempt(b.accept_rows, s, [re(rng.randrange(k + 1)) for k in ks], rt, off, rt, off)
    if op == 4:
        live = [i for i in range(c) if st[i] in (bm.ACCEPT, bm.ROLLBACK)]
        if live:
            i = rng.choice(live)
            fn = b.resume if st[i] == bm.ACCEPT else b.rollback
            return fn.__name__, attempt(fn, [re(i)])
    if op == 5 and (pre or dec or ver) and rng.random() < 0.3:
        s = rng.choice(pre + dec + ver)
        return "finish", attempt(b.finish, [s])
    if op == 6 and done:
        return "release", attempt(b.release, rng.sample(done, rng.randrange(1, len(done) + 1)))
    if op == 7:
        i = rng.randrange(c + (1 if hostile else 0))
        return "read", (attempt(b.slot_fields, re(i)), attempt(b.draft, re(i)), attempt(b.slots_in, re(rng.randrange(8))))
    # a step
    slots, inputs, off = b.pending()
    n = int(off[-1])
    rows = np.array([rng.randrange(4) for _ in range(n + (rng.choice([0, 0, 1, -1]) if hostile else 0))],
                    dtype=np.int64)
    if n and rows.shape[0] == 0:
        rows = np.zeros(0, dtype=np.int64)
    rule = None
    if hostile and rng.random() < 0.5:
        rule = HostileRule(rng, b, mods)
    elif rng.random() < 0.3:
        from specfsm.accept import rules as accept_rule

        rule = rng.choice([accept_rule.Exact(), accept_rule.MinRun(2)])
    if publish is not None:
        publish(rows)            # another thread scribbles into it while the step reads it
    if hostile and rng.random() < 0.3:
        rows = Hook(rows, reentry(rng, b, mods))
    out = attempt(b.step, rows, rule=rule)
    if out[0] == "ok":
        res = out[1]
        attempt(res.resume_index, re(rng.choice([c, c + 2, 0, max(0, c - 1)])))
        res.emitted_by_slot()
        repr(res)
    return "step", out


class RewritingRule:
    """A rule whose ``accepted_rows`` writes into the caller's row array before the step
    reads the rows it emits (the step must emit from the rows as they were passed)."""

    def __init__(self, rows, fill, n):
        self.rows, self.fill, self.n = rows, fill, n

    def accepted_rows(self, draft, rows):
        self.rows[:] = self.fill
        return min(self.n, len(draft))


def _outcome(fn):
    """What a call did, comparable across implementations: the step's arrays, or the
    exception's type and message."""
    try:
        res = fn()
    except ALLOWED as exc:
        return ("err", type(exc).__name__, str(exc))
    if res is None:
        return ("ok",)
    return ("ok", res.slots.tolist(), res.emitted.tolist(), res.emitted_offsets.tolist(),
            res.accepted.tolist(), res.resume_rows.tolist(), res.rolled_back.tolist())


def lockstep(impl, rng, rounds):
    """The compiled batch and the twin driven by the same calls, negative rows, filler,
    rules that rewrite the caller's rows, trees, budgets and extreme resume_index
    capacities included: every outcome (result, or exception type and message) and every
    state after it must be the same."""
    bonus = rng.random() < 0.5
    pair = [impl.mods["batch"].BatchState(4, 4, bonus), impl.twin["batch"].BatchState(4, 4, bonus)]
    for _ in range(rounds):
        st = pair[1].states
        free = np.flatnonzero(st == 0).tolist()
        dec = np.flatnonzero(st == 2).tolist()
        op = rng.randrange(4)
        if op == 0 and free:
            s = rng.sample(free, rng.randrange(1, len(free) + 1))
            lens = [rng.randrange(1, 4) for _ in s]
            pos = [rng.randrange(4) for _ in range(sum(lens))]
            off = np.cumsum([0] + lens).tolist()
            mt = [rng.randrange(1, 6) for _ in s]
            calls = [lambda b: b.admit(s, pos, off, s, max_tokens=mt)]
        elif op == 1 and dec and rng.random() < 0.5:
            s = rng.choice(dec)
            n = rng.randrange(1, 5)
            toks = [rng.randrange(4) for _ in range(n)]
            if rng.random() < 0.5:
                calls = [lambda b: b.enter_verify([s], toks, [0, n])]
            else:
                par = [rng.randrange(-1, j) for j in range(n)]
                calls = [lambda b: b.enter_verify_tree([s], toks, par, [0, n])]
        elif op == 3:
            s = rng.choice(list(range(4)))
            calls = [lambda b: b.finish([s]), lambda b: b.release([s])]
        else:
            slots, inputs, off = pair[1].pending()
            n = int(off[-1])
            rows = [rng.choice([0, 1, 2, 3, 3, -1, -(2**63), 2**63 - 1]) for _ in range(n)]
            fill = [rng.choice([-5, 0, 7]) for _ in range(n)]
            use_rule = n and rng.random() < 0.3
            acc = rng.randrange(5)

            def step(b, rows=rows, fill=fill, use_rule=use_rule, acc=acc):
                r = np.array(rows, dtype=np.int64)
                res = b.step(r, rule=RewritingRule(r, fill, acc) if use_rule else None)
                for cap in (4, 5, 2**24 + 1, 2**40):
                    attempt(res.resume_index, cap)
                return res
            calls = [step]
        for call in calls:
            got = [_outcome(lambda b=b: call(b)) for b in pair]
            if got[0] != got[1] or snapshot(pair[0]) != snapshot(pair[1]):
                raise Broken(f"compiled and twin differ: {got[0]!r} / {got[1]!r}")


def scenario_batch(impl, rng, seconds):
    mods = impl.mods
    bm = mods["batch"]
    n = 0
    if impl.kind == "compiled":
        for _ in range(20):
            lockstep(impl, rng, rng.randrange(10, 60))
    # single thread: every call, hostile arguments, all-or-nothing checked
    deadline = time.monotonic() + seconds / 2
    while time.monotonic() < deadline:
        b = new_batch(bm, rng)
        for _ in range(rng.randrange(5, 40)):
            n += 1
            hostile = rng.random() < 0.4
            before = snapshot(b)
            cap_before = b.capacity
            name, out = drive(rng, b, mods, hostile)
            if name in ("step", "admit", "advance_prefill", "enter_verify", "accept", "accept_rows",
                        "resume", "rollback", "finish", "release") and out[0] == "err":
                if snapshot(b) != before:
                    raise Broken(f"a refused {name} changed the batch: {out[1]!r}")
            if b.capacity != cap_before or b.busy:
                raise Broken("the batch was re-initialised or left busy by a call")
            check_layout(b)
        # an instance that was never initialised
        u = bm.BatchState.__new__(bm.BatchState)
        for call in (u.pending, lambda: u.step([]), lambda: u.states, lambda: u.admit([0], [1], [0, 1], [0]),
                     lambda: u.slot_fields(0), lambda: len(u), lambda: u.finish([0]), repr):
            try:
                call() if call is not repr else repr(u)
            except RuntimeError:
                pass
        # an __init__ that fails part way leaves an object that refuses
        f = bm.BatchState.__new__(bm.BatchState)
        attempt(f.__init__, rng.randrange(1, 4), 2, BadBool())
        try:
            f.pending()
        except RuntimeError:
            pass
    # threads: one drives steps, the others call everything meanwhile
    b = new_batch(bm, rng)
    stop = threading.Event()
    errors = []

    def loop(fn, r):
        try:
            while not stop.is_set():
                try:
                    fn(r)
                except ALLOWED:
                    pass
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    box = [None]

    def stepper(r):
        drive(r, b, mods, r.random() < 0.2, publish=lambda rows: box.__setitem__(0, rows))
        st = b.states
        if (st == bm.DONE).all() or r.random() < 0.02:
            attempt(b.finish, np.flatnonzero((st != bm.FREE) & (st != bm.DONE)))
            attempt(b.release, np.flatnonzero(b.states == bm.DONE))

    def caller(r):
        reentry(r, b, mods)()

    def scribbler(r):
        rows = box[0]
        if rows is not None and rows.size:
            for _ in range(r.randrange(1, 50)):
                rows[r.randrange(rows.size)] = r.choice([-1, 2**62, -(2**63), 0, 3])

    threads = [threading.Thread(target=loop, args=(stepper, random.Random(rng.randrange(2**32))), daemon=True)]
    threads += [threading.Thread(target=loop, args=(caller, random.Random(rng.randrange(2**32))), daemon=True)
                for _ in range(3)]
    threads.append(threading.Thread(target=loop, args=(scribbler, random.Random(rng.randrange(2**32))), daemon=True))
    for t in threads:
        t.start()
    stop.wait(seconds / 2)
    stop.set()
    for t in threads:
        t.join(60)
        if t.is_alive():
            raise Broken("a thread did not finish within 60 s of being stopped (a deadlock?)")
    if errors:
        raise errors[0]
    check_layout(b)
    return n
