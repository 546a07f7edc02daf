"""The row bookkeeping of the vLLM proposers: which batch row still holds its request,
and one index update and proposal per step.

One incremental index per batch row. vLLM moves requests between rows (finished rows
reused, condense, swaps, preemption and resume, outputs cut back, streaming re-adds,
steps that skip the drafter) and its call carries rows, not requests. The row rule: a
row kept its request only if it holds the request its index was built for (the request
ids of vLLM's input batch, ``request_ids``), its index covered the row at the last call,
and the row grew by exactly its sampled tokens since; its last ``TAIL`` (8) tokens are
compared too (and, one row in ``DEEP`` (8) per step, ``SPREAD`` (7) spread positions).
Exact for every movement vLLM makes: within one request in one row vLLM only appends
and cuts back at the end, and a cut back or a skipped call changes the growth. Anything
else is a movement: the row takes the index that moved with its request (from another
row or the pool of indexes no row holds, found by length and tail, taken only after
every token is compared), or a new index. Without ids (a caller outside vLLM that passes
no ``req_ids``) rows of at most ``SHORT`` (128) tokens and "twins" (rows or kept indexes
sharing length and tail, or an index as long as a row that holds none) are compared in
full, and so is a row whose indexed length and tail are those of an index not confirmed
this call at that length (its request may have been cut back and moved there); a new
request that enters a row as long as its previous request plus one token, with its last
8 tokens and spread tokens, keeps the old index (a wrong draft costs acceptance, never output); ``verify="full"``
compares every token every step. A step where nothing moved runs the same checks in
one kernel call (``steady_rows``, compiled or twin) and one serving call.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _impl
from .._checks import check_count
from .call import as_numpy, check_call, find_runner, given_ids, runner_ids
from .settings import log_settings, verify_setting

__all__ = ["RowTrackingProposer"]

_NO_CAP = 2**62
#: the steady step's kernel (``steady_rows``), the active implementation's
_steady_rows = _impl.load("rows").steady_rows


class RowTrackingProposer:
    """Base of the vLLM proposers: one index per batch row, kept right across vLLM's
    row movements, and one batched proposal per step.

    A subclass supplies the index type through two hooks: ``_new_index()`` (a fresh,
    empty index) and ``_serve_indexes(indexes, tokens, offsets, ks)`` (one serving step
    for a list of indexes, all or nothing: append ``tokens[offsets[i]:offsets[i + 1]]``
    to ``indexes[i]``, then propose up to ``ks`` tokens, one count or one per index;
    returns one draft per index, each a list of ints). An index needs ``tokens`` (its
    contents, for the exact checks).
    Configuration: ``num_speculative_tokens`` (K) and ``max_model_len`` from the
    ``VllmConfig`` unless given as keywords; ``verify`` is ``"sparse"`` (default) or
    ``"full"``. Built inside vLLM's V1 runner, it reads each row's request id from the
    runner's input batch (``call.find_runner``); elsewhere ``propose`` takes ``req_ids``.

    Not thread-safe: a second concurrent ``propose`` raises RuntimeError. Constructing
    this class itself, or a subclass without the two required hooks, raises TypeError
    (vLLM would otherwise load it by class path and fail at the first ``propose``).
    """

    #: tokens at the end of a row's indexed history compared every step
    TAIL = 8
    #: positions spread over the history (at fixed fractions of an anchor length)
    #: compared for one row in ``DEEP`` each step, and for every moved row
    SPREAD = 7
    DEEP = 8
    #: histories up to this many tokens are compared in full every step
    SHORT = 128
    #: indexes kept for requests that left the batch (preempted ones come back), LRU:
    #: at most ``POOL`` of them, holding at most ``POOL_TOKENS`` tokens together
    POOL = 64
    POOL_TOKENS = 1 << 20
    #: default ``verify`` mode (overridden by ``SPECFSM_VLLM_VERIFY`` and the keyword)
    verify_default = "sparse"

    def __init__(
        self,
        vllm_config: Any = None,
        *,
        num_speculative_tokens: Any = None,
        max_model_len: Any = None,
        verify: Any = None,
    ) -> None:
        cls = type(self)
        if cls._new_index is RowTrackingProposer._new_index or (
            cls._serve_indexes is RowTrackingProposer._serve_indexes
        ):
            raise TypeError(
                f"{cls.__name__} is a base class to subclass (it supplies _new_index and "
                "_serve_indexes for an index type), not a proposer: load "
                "specfsm.vllm.SpecfsmNgramProposer or specfsm.vllm.SpecfsmSuffixProposer"
            )
        spec = getattr(vllm_config, "speculative_config", None)
        model = getattr(vllm_config, "model_config", None)
        if num_speculative_tokens is None:
            num_speculative_tokens = getattr(spec, "num_speculative_tokens", None)
        if num_speculative_tokens is None:
            raise ValueError(
                "num_speculative_tokens is not set: pass a VllmConfig whose "
                "speculative_config has it, or num_speculative_tokens=K"
            )
        self.num_speculative_tokens = check_count(num_speculative_tokens, "num_speculative_tokens")
        # vLLM re-fits max_model_len after profiling (max_model_len=-1, "auto-fit"): the
        # worker writes the new value into this same model_config, so a cap read from it
        # is re-read at every call (a keyword cap is fixed)
        self._model_config = model if max_model_len is None else None
        if max_model_len is None:
            max_model_len = getattr(model, "max_model_len", None)
        self.max_model_len = self._cap_from(max_model_len)
        self.verify = verify_setting(verify, vllm_config, self.verify_default)
        # the vLLM runner building this proposer, whose input batch names each row's request
        self._runner = find_runner(vllm_config)
        self._guard = threading.Lock()
        self._clear()
        self._tail_off = np.arange(-self.TAIL, 0, dtype=np.int64)
        self._spread_mul = np.arange(1, self.SPREAD + 1, dtype=np.int64)
        self._spread_mulv = self._spread_mul.reshape(-1, 1)
        self.stats = {"steps": 0, "steady": 0, "extended": 0, "adopted": 0, "rebuilt": 0, "rebuilt_tokens": 0,
                      "with_ids": 0}

    @staticmethod
    def _cap_from(value: Any) -> int | None:
        """``max_model_len`` as a cap: None (no cap) for None or vLLM's -1 (not fitted yet)."""
        if value is None or (type(value) is int and value < 0):
            return None
        return check_count(value, "max_model_len")

    def _follow_cap(self) -> None:
        """Take up a ``max_model_len`` vLLM changed in the config since the last call."""
        m = self._model_config
        if m is not None:
            v = getattr(m, "max_model_len", None)
            if v != self.max_model_len:
                self.max_model_len = self._cap_from(v)

    def settings(self) -> dict:
        """The settings this proposer runs with (what the once-per-worker log line says)."""
        return {"class": type(self).__name__, "num_speculative_tokens": self.num_speculative_tokens,
                "max_model_len": self.max_model_len, "verify": self.verify,
                "request_ids": "vLLM's input batch" if self._runner is not None else "req_ids= or none"}

    def _log(self) -> None:
        log_settings("specfsm proposer settings: " + ", ".join(f"{k}={v!r}" for k, v in self.settings().items()))

    def _clear(self) -> None:
        self._ix: list[Any] = []  # per row: its index or None
        self._len = np.zeros(0, dtype=np.int64)  # per row: tokens indexed (-1: none)
        # per row: its num_tokens_no_spec at the last call (-1: not in that batch). A row
        # kept its request only if it grew by exactly its sampled tokens since then
        self._seen = np.zeros(0, dtype=np.int64)
        # per row: the request id its index was built or confirmed for (None: unknown)
        self._rid: list = []
        self._has_ids = False  # some row's entry in _rid is not None
        self._general_ids: list | None = None  # the ids the last general step went by
        self._live: set | None = None  # the same as a set (made on demand)
        # rows whose (length, tail) at the last call another row or a pooled index shared:
        # a move between such twins passes the row rule, so they are compared in full
        self._twin = np.zeros(0, dtype=bool)
        self._any_twin = False
        self._twins_stale = False  # calls with ids left the twins unmarked
        self._pool_h = np.zeros(0, dtype=np.uint64)  # the pooled indexes' key hashes
        self._pool_f = np.zeros(0, dtype=np.uint64)  # their (length, last two tokens) filter, sorted
        # (the per-row token blocks are stored position-major, ``[TAIL, rows]``, and
        # used through their transposes: whole-batch numpy calls then run along rows)
        self._tail = np.zeros((self.TAIL, 0), dtype=np.int64).T  # its last TAIL tokens
        self._anc = np.zeros(0, dtype=np.int64)  # a length the spread positions derive from
        self._spread = np.zeros((self.SPREAD, 0), dtype=np.int64).T  # tokens there
        self._spos = np.zeros((self.SPREAD, 0), dtype=np.int64).T  # the positions (from the anchor)
        self._arange = np.zeros(1, dtype=np.int64)
        self._base = np.zeros(0, dtype=np.int64)  # row * width of token_ids_cpu
        self._base_t = self._base
        self._base_width = -1
        self._cols = np.zeros(0, dtype=np.int64)  # 0, 1, 2, ...
        self._colv = self._cols.reshape(-1, 1)  # the same as a column
        self._pool: OrderedDict[tuple, tuple] = OrderedDict()  # indexes no row holds now
        self._pool_tokens = 0  # the tokens they hold (each key starts with its length)
        self._used = 0  # rows that may hold an index

    # -- hooks for the index type ---------------------------------------------------------
    def _new_index(self) -> Any:
        raise NotImplementedError

    def _serve_indexes(self, indexes: list, tokens: np.ndarray, offsets: np.ndarray,
                       ks: Any) -> list[list[int]]:
        raise NotImplementedError

    def _retire(self, index: Any) -> None:
        """A request left the batch (finished, aborted or preempted) with ``index``, its
        history's index: nothing to do here (the suffix proposer keeps its history for
        other requests to draft from)."""

    def rescan(self, history: Any, max_k: int) -> list:
        """The draft a fresh index over ``history`` would give (for tests and checks)."""
        h = np.asarray(history, dtype=np.int64)
        return self._serve_indexes(
            [self._new_index()], h, np.asarray([0, h.shape[0]], dtype=np.int64),
            np.asarray([max_k], dtype=np.int64))[0]

    # -- vLLM's interface ----------------------------------------------------------------
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM calls this once; there is no model to load."""

    def reset(self) -> None:
        """Forget every row's index (the next call rebuilds what it needs)."""
        with self._guard:
            self._clear()

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
        req_ids: Any = None,
    ) -> list[list[int]]:
        """One draft per batch row, as vLLM's n-gram proposer gives them: ``[]`` for a
        row with no sampled tokens this step or whose history has reached
        ``max_model_len``; otherwise up to ``min(K, max_model_len - length)`` tokens.
        ``slot_mappings`` is ignored. ``req_ids`` (not part of vLLM's call): the id of
        each row's request, for a caller outside vLLM; inside vLLM the proposer reads
        them from the runner's input batch. Refuses rows, lengths, ids or arrays that do
        not fit one another (ValueError / TypeError naming the argument)."""
        if not self._guard.acquire(blocking=False):
            raise RuntimeError("propose was called while another propose call on this proposer is running")
        try:
            if self._model_config is not None:
                self._follow_cap()
            return self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, req_ids)
        finally:
            self._guard.release()

    # -- the step ------------------------------------------------------------------------
    def _reserve(self, rows: int) -> None:
        """Room for at least ``rows`` rows (grown geometrically; sized by the batch, not
        by ``token_ids_cpu``'s row count, which costs the caller nothing to make huge)."""
        have = self._len.shape[0]
        if rows <= have:
            return
        more = max(rows, 2 * have) - have
        rows = have + more
        self._arange = np.arange(rows + 1, dtype=np.int64)  # (one more: offsets)
        self._ix.extend([None] * more)
        self._rid.extend([None] * more)
        self._len = np.concatenate([self._len, np.full(more, -1, dtype=np.int64)])
        self._seen = np.concatenate([self._seen, np.full(more, -1, dtype=np.int64)])
        self._twin = np.concatenate([self._twin, np.zeros(more, dtype=bool)])
        self._tail = np.concatenate([self._tail.T, np.zeros((self.TAIL, more), dtype=np.int64)], axis=1).T
        self._anc = np.concatenate([self._anc, np.zeros(more, dtype=np.int64)])
        self._spread = np.concatenate([self._spread.T, np.zeros((self.SPREAD, more), dtype=np.int64)], axis=1).T
        self._spos = np.concatenate([self._spos.T, np.zeros((self.SPREAD, more), dtype=np.int64)], axis=1).T

    #: fixed random odd 64-bit multipliers for the (length, tail) key hash (a linear
    #: hash in wrapping uint64 arithmetic: two different keys collide with chance ~2**-63)
    _KEY_MUL = np.random.default_rng(0x5EED).integers(0, 2**63, size=TAIL + 1, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    #: the multipliers of the (length, last two tokens) filter key, as ``steady_rows`` takes them
    _FILTER_MUL = _KEY_MUL[[0, 2, 3]].copy()
    _KEY_MUL.flags.writeable = _FILTER_MUL.flags.writeable = False  # (shared by every instance)

    def _key_hash(self, lens: np.ndarray, tails: np.ndarray, salt: int = 1) -> np.ndarray:
        """One uint64 per (length, tail tokens) key; equal keys hash equal (a collision
        only costs a full comparison). (uint64 array arithmetic wraps.)"""
        h = lens.astype(np.uint64) * self._KEY_MUL[0]
        h += (tails.astype(np.uint64) * self._KEY_MUL[salt : salt + tails.shape[1]]).sum(axis=1, dtype=np.uint64)
        return h

    def _mark_twins(self, b: int, pool_changed: bool) -> None:
        """Flag the rows whose key (indexed length, tail) equals another row's or a
        pooled index's: the row rule cannot tell such rows' requests apart, so the next
        call compares them in full. So are the rows whose indexed length equals that of
        a row holding no index (a request prefilling or resumed, which sampled nothing):
        if that request moves into such a row and grows as much as the row's own would,
        length, growth and tail agree (its tail was not read). For many rows a cheap
        filter first, (length, last two tokens) hashed, sorted and compared with its
        neighbours and with the pool's; only a batch that passes it hashes whole tails."""
        if pool_changed:
            keys = list(self._pool)
            if keys:
                plens = np.fromiter((k[0] for k in keys), dtype=np.int64, count=len(keys))
                ptails = np.frombuffer(b"".join(k[1] for k in keys), dtype=np.int64).reshape(len(keys), self.TAIL)
                self._pool_h = self._key_hash(plens, ptails)
                self._pool_f = np.sort(self._key_hash(plens, ptails[:, -2:], 2))
            else:
                self._pool_h = self._pool_f = np.zeros(0, dtype=np.uint64)
        if self._any_twin:
            self._twin[:] = False
            self._any_twin = False
        if b == 0:
            return
        L = self._len[:b]
        bare = L < 0
        if bare.any():
            seen = self._seen[:b][bare]
            twins = np.flatnonzero(np.isin(L, seen[seen > 0]))
            if twins.size:
                self._twin[twins] = True
                self._any_twin = True
        f = self._key_hash(L, self._tail[:b, -2:], 2)  # the filter: length and last two tokens
        sf = np.sort(f)
        pf = self._pool_f
        if not (sf[1:] == sf[:-1]).any() and not (
            pf.shape[0] and (pf[np.minimum(np.searchsorted(pf, f), pf.shape[0] - 1)] == f).any()
        ):
            return
        h = self._key_hash(L, self._tail[:b])
        allh = np.concatenate([h, self._pool_h])
        order = np.argsort(allh, kind="stable")
        sh = allh[order]
        dup = sh[1:] == sh[:-1]
        if not dup.any():
            return
        mark = np.zeros(allh.shape[0], dtype=bool)
        mark[order[1:][dup]] = True
        mark[order[:-1][dup]] = True
        twins = np.flatnonzero(mark[:b] & (L >= 0))
        if twins.size:
            self._twin[twins] = True
            self._any_twin = True

    def _short(self, ids: list | None) -> int:
        """Rows up to this long are compared in full every step, not spread-checked:
        ``SHORT`` without request ids; with ids (which tell requests apart) only rows
        shorter than the tail (``TAIL - 1``), so every step of a batch of short
        histories can be the steady one."""
        return self.SHORT if ids is None else self.TAIL - 1

    def _release(self, r: int) -> None:
        """Move row ``r``'s index into the pool of indexes no row holds; when its request
        has left the batch (its id is not among this call's), hand it to ``_retire``."""
        ix = self._ix[r]
        if ix is None:
            return
        rid = self._rid[r]
        if rid is not None and self._general_ids is not None:
            if self._live is None:
                self._live = set(self._general_ids)
            if rid not in self._live:
                self._retire(ix)
        key = (int(self._len[r]), self._tail[r].tobytes())
        if key not in self._pool:
            self._pool_tokens += key[0]
        self._pool[key] = (ix, int(self._anc[r]), self._spread[r].copy())
        self._pool.move_to_end(key)
        self._ix[r] = None
        self._rid[r] = None
        self._len[r] = -1

    def _trim_pool(self) -> None:
        while self._pool and (len(self._pool) > self.POOL or self._pool_tokens > self.POOL_TOKENS):
            self._pool_tokens -= self._pool.popitem(last=False)[0][0]

    def _tail_pos(self, n: np.ndarray) -> np.ndarray:
        """Positions n - TAIL .. n - 1 of each history (clamped into [0, n - 1])."""
        pos = n.reshape(-1, 1) + self._tail_off
        if n.shape[0] and int(n.min()) < self.TAIL:
            np.maximum(pos, 0, out=pos)
            np.minimum(pos, np.maximum(n - 1, 0).reshape(-1, 1), out=pos)
        return pos

    def _spread_pos(self, anc: np.ndarray) -> np.ndarray:
        """Positions anc * j / (SPREAD + 1), j = 1 .. SPREAD (all below anc when anc > 0)."""
        return (anc.reshape(-1, 1) * self._spread_mul) // (self.SPREAD + 1)

    def _gather(self, tok: np.ndarray, rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``tok[rows[i], pos[i, j]]`` (int64), through one flat ``take`` when it can."""
        if tok.flags.c_contiguous:
            flat = pos + (rows * tok.shape[1]).reshape(-1, 1)
            return tok.reshape(-1).take(flat).astype(np.int64, copy=False)
        return tok[rows.reshape(-1, 1), pos].astype(np.int64, copy=False)

    def _holds(self, tok: np.ndarray, r: int, ix: Any, n: int) -> bool:
        """Exact check: row ``r``'s first ``n`` tokens are the ``n`` tokens of ``ix``."""
        return bool(np.array_equal(tok[r, :n], ix.tokens))

    def _propose(self, sampled: Any, num_tokens: Any, token_ids: Any, req_ids: Any) -> list[list[int]]:
        # each row's request id: the caller's (checked after the arguments), or the
        # runner's input batch's, or none (the row rule then goes by the tokens alone)
        if req_ids is not None:
            ids: list | None = given_ids(req_ids, check_call(sampled, num_tokens, token_ids)[0])
        elif self._runner is not None and type(sampled) is list:
            ids = runner_ids(self._runner, token_ids, len(sampled))
        else:
            ids = None
        out = self._steady(sampled, num_tokens, token_ids, ids) if self.verify == "sparse" else None
        if out is None:
            out = self._general(sampled, num_tokens, token_ids, ids)
            ids = self._general_ids
        if ids is not None:
            self.stats["with_ids"] += 1
        return out

    # -- the steady state: every row kept its request and only grew --------------------
    def _steady(self, sampled: Any, num_tokens: Any, tok: Any, ids: list | None) -> list[list[int]] | None:
        """The step when nothing moved: the same rows as last step, every row sampled,
        every history past ``SHORT``, grown by exactly its sampled tokens and below
        ``max_model_len``, and every check passes. Returns None, having changed nothing,
        when any of that does not hold (or an argument looks odd): the general step then
        decides, checks and raises. When it answers, the answer and the state it leaves
        are those of the general step: the rows' checks and new tokens come from one
        kernel call (``steady_rows``, the same checks the general step makes)."""
        if type(sampled) is not list:
            return None
        if type(tok) is not np.ndarray or type(num_tokens) is not np.ndarray:
            try:  # a CPU torch.Tensor (vLLM's token_ids_cpu_tensor) through its numpy view
                tok = as_numpy(tok, "token_ids_cpu")
                num_tokens = as_numpy(num_tokens, "num_tokens_no_spec")
            except TypeError:
                return None
        b = len(sampled)
        if b == 0 or b != self._used or self.num_speculative_tokens == 0:
            return None
        if ids is None:  # twins, and rows last seen with ids, are the general step's
            if self._any_twin or self._has_ids:
                return None
        elif ids != self._rid[:b]:  # a row holds another request than its index's
            return None
        cap = _NO_CAP if self.max_model_len is None else self.max_model_len
        step = self.stats["steps"]
        got = _steady_rows(
            sampled, num_tokens, tok, self._len, self._seen, self._tail.T, self._spos.T, self._spread.T,
            self._anc, (-step) % self.DEEP, self.DEEP, self._short(ids), cap, self._pool_f, self._FILTER_MUL)
        if got is None:
            return None
        L, new, offsets, tails, lmax, twins, renew = got
        # every row confirmed: one serving step (all or nothing), then commit
        K = self.num_speculative_tokens
        ks = K if cap - lmax >= K else np.minimum(K, cap - L)
        drafts = self._serve_indexes(self._ix[:b], new, offsets, ks)
        self.stats["steps"] = step + 1
        self.stats["steady"] += 1
        self.stats["extended"] += int(offsets[-1])
        self._tail.T[:, :b] = tails
        self._len[:b] = L
        self._seen[:b] = L
        if ids is not None:
            self._twins_stale = True
        elif twins:  # some row may share its key: the whole check
            self._mark_twins(b, False)
        elif self._any_twin:
            self._twin[:] = False
            self._any_twin = False
        if renew:
            rn = np.asarray(renew, dtype=np.int64)
            self._anc[rn] = Lr = L[rn]
            self._spos[rn] = at = self._spread_pos(Lr)
            self._spread[rn] = self._gather(tok, rn, at)
        return drafts

    # -- the general step ----------------------------------------------------------------
    def _general(self, sampled: Any, num_tokens: Any, token_ids: Any, ids: list | None) -> list[list[int]]:
        b, counts, L, tok = check_call(sampled, num_tokens, token_ids)
        if ids is not None and None in ids:  # (a row without an id: the call goes without)
            ids = None
        if ids is None and self._twins_stale:  # the twins of the last call's rows and pool
            self._mark_twins(self._used, True)
            self._twins_stale = False
        self._general_ids = ids  # (what the call went by, for the stats and _release)
        self._live = None  # (its ids as a set, made when _release first needs it)
        self._reserve(b)
        out = self._general_step(sampled, b, counts, L, tok, ids)
        # a row that sampled nothing (a request prefilling: new in the row, perhaps as long
        # as the last one and ending alike, or resumed) or is now shorter than its index
        # (cut back) may no longer hold what its index does: the index goes to the pool,
        # where only a comparison of every token gives it back to a row
        shrunk = np.flatnonzero(((counts == 0) | (L < self._len[:b])) & (self._len[:b] >= 0))
        if shrunk.size:
            for r in shrunk.tolist():
                self._release(r)
            self._trim_pool()
        # every row's length at this call, for the next call's row rule
        self._seen[:b] = L
        self._seen[b:] = -1
        if ids is None:
            self._mark_twins(b, True)
        else:  # (the ids tell twins apart: marked only when a call comes without them)
            self._twins_stale = True
        return out

    def _general_step(self, sampled: Any, b: int, counts: np.ndarray, L: np.ndarray,
                      tok: np.ndarray, ids: list | None) -> list[list[int]]:
        """One draft per row of a checked call: the rows that draft (all, or those vLLM
        drafts for), each confirmed by the row rule or given an index, then one serving
        step for them all and their state written; ``[]`` for every other row."""
        K = self.num_speculative_tokens
        cap = _NO_CAP if self.max_model_len is None else self.max_model_len
        if b == 0 or K == 0:
            return [[] for _ in range(b)]
        # (None: every row sampled something, the steady state)
        ns = None if int(counts.min()) > 0 else counts
        step = self.stats["steps"]
        self.stats["steps"] = step + 1
        # (without ids: the indexes of rows past the batch, which may have moved into it)
        gone = [(int(self._len[r]), self._ix[r]) for r in range(b, self._used)
                if self._ix[r] is not None] if ids is None and self.verify != "full" else []
        if self._used > b:  # rows past the batch hold no request now
            for r in range(b, self._used):
                self._release(r)
            self._trim_pool()
        self._used = b
        lmin, lmax = int(L.min()), int(L.max())
        # every row drafts (the steady state), or only those vLLM would draft for
        every = ns is None and lmin > 0 and lmax < cap
        if every:
            rows = self._arange[:b]
            sel: Any = slice(0, b)  # rows as a slice: views and slice assignment
            Lr = L
        else:
            act = (L > 0) & (L < cap)
            rows = np.flatnonzero(act if ns is None else act & (ns > 0))
            if rows.size == 0:
                return [[] for _ in range(b)]
            sel = rows
            Lr = L[rows]
            lmax = int(Lr.max())
        n_old = self._len[sel].copy()
        got = self._row_tails(tok, rows, n_old, Lr, lmin)
        grown = counts[sel]
        ok, deep = self._row_rule(tok, rows, sel, every, step, b, got, n_old, Lr, grown, ids)
        if ids is None and self.verify != "full" and (gone or not ok.all() or not every):
            self._recheck_for_movers(tok, rows, ok, n_old, b, gone)
        fresh = None
        if ok.all():
            start = n_old
        else:
            start = np.where(ok, n_old, 0)
            fresh = self._relocate(tok, rows, Lr, grown, np.flatnonzero(~ok), start)
        ixs = self._ix[:b] if every else [self._ix[r] for r in rows.tolist()]
        ks = K if cap - lmax >= K else np.minimum(K, cap - Lr)
        tail_new = got[:, self.TAIL:]
        drafts = self._serve_rows(ixs, tok, rows, Lr, start, tail_new, ks)
        self._commit_rows(tok, rows, sel, every, b, Lr, tail_new, ids, fresh, deep)
        if every:
            return drafts
        out: list[list[int]] = [[] for _ in range(b)]
        for j, r in enumerate(rows.tolist()):
            out[r] = drafts[j]
        return out

    def _row_tails(self, tok: np.ndarray, rows: np.ndarray, n_old: np.ndarray, Lr: np.ndarray,
                   lmin: int) -> np.ndarray:
        """The last ``TAIL`` tokens of each drafting row at its indexed length (columns
        ``:TAIL``) and at its new length (``TAIL:``), int64, in one gather. A row cut back
        below its index (``n_old > Lr``) fails the row rule whatever it reads, so it
        reads at ``Lr``: the row may now be narrower than its index (vLLM handing a
        ``token_ids_cpu`` cut to fewer columns)."""
        T = self.TAIL
        n_at = np.minimum(n_old, Lr)
        if tok.flags.c_contiguous and int(n_at.min()) >= T and lmin >= T:
            # no clamping needed: flat positions straight from the row starts
            base = rows * tok.shape[1]
            flat = np.empty((rows.size, 2 * T), dtype=np.int64)
            np.add((n_at + base).reshape(-1, 1), self._tail_off, out=flat[:, :T])
            np.add((Lr + base).reshape(-1, 1), self._tail_off, out=flat[:, T:])
            return tok.reshape(-1).take(flat).astype(np.int64, copy=False)
        return self._gather(tok, rows, np.concatenate([self._tail_pos(n_at), self._tail_pos(Lr)], axis=1))

    def _row_rule(self, tok: np.ndarray, rows: np.ndarray, sel: Any, every: bool, step: int, b: int,
                  got: np.ndarray, n_old: np.ndarray, Lr: np.ndarray, grown: np.ndarray,
                  ids: list | None) -> tuple[np.ndarray, Any]:
        """Which drafting rows kept their request, by the row rule: a row kept it only
        if its index covered the row at the last call (its tail tokens ``got[:, :TAIL]``
        unchanged), the row grew by exactly its sampled tokens (``grown``) since, and it
        holds the request its index was built for (by ``ids``, when there are ids);
        with ``verify="sparse"`` the rows whose turn it is (one in ``DEEP``, rotating
        with ``step``) also pass the spread check, and without ids short rows and twins
        are compared in full; with ``"full"`` every row is. Anything else (a new or
        resumed request, a move, a cut back, a call vLLM skipped) is a movement, which
        ``_relocate`` settles by exact comparisons. Returns ``(ok, deep)``: one bool per
        drafting row, and the positions (into ``rows``) spread-checked this step (None
        with ``"full"``)."""
        T = self.TAIL
        seen = self._seen[sel]
        twin = self._twin[sel].copy()  # (before _relocate rewrites the rows' state)
        ok = (got[:, :T] == self._tail[sel]).all(axis=1)
        ok &= n_old >= 0
        ok &= n_old == seen
        ok &= Lr == seen + grown
        if ids is not None:  # and it holds the request its index was built for (exact)
            pick = rows.tolist()
            now = ids if every else [ids[r] for r in pick]
            had = self._rid[:b] if every else [self._rid[r] for r in pick]
            ok &= np.fromiter(map(operator.eq, had, now), dtype=bool, count=rows.size)
        deep: Any = None
        if self.verify == "full":
            exact = np.flatnonzero(ok).tolist()
        else:
            # the spread check, for the rows whose turn it is (one in DEEP, rotating)
            if every:  # the rows r with (r + step) % DEEP == 0
                deep = self._arange[(-step) % self.DEEP : b : self.DEEP]
            else:
                deep = np.flatnonzero((rows + step) % self.DEEP == 0)
            deep = deep[ok[deep] & (n_old[deep] > self._short(ids))]
            if deep.size:
                rd = rows[deep]
                ok[deep] = (self._gather(tok, rd, self._spread_pos(self._anc[rd])) == self._spread[rd]).all(axis=1)
            # (short rows and twins are compared in full when there are no ids to go by)
            exact = np.flatnonzero(ok & ((n_old <= self.SHORT) | twin)).tolist() if ids is None else []
        for j in exact:
            r = int(rows[j])
            ok[j] = self._holds(tok, r, self._ix[r], int(n_old[j]))
        return ok, deep

    def _recheck_for_movers(self, tok: np.ndarray, rows: np.ndarray, ok: np.ndarray, n_old: np.ndarray,
                            b: int, gone: list) -> None:
        """Without ids: a request whose row's index was not confirmed this call (its row
        failed the rule, sampled nothing or left the batch, ``gone``) may have moved into
        another row after being cut back, to that row's indexed length, where it holds the
        same last tokens: the row rule passes it. So every passing row whose indexed
        length and tail are those of such an index's history at that length is compared
        in full (``ok`` updated in place)."""
        passing = np.zeros(b, dtype=bool)
        passing[rows[ok]] = True
        movers = gone + [(int(self._len[r]), self._ix[r]) for r in np.flatnonzero(~passing & (self._len[:b] > 0))
                         if self._ix[r] is not None]
        if not movers:
            return
        n_ok = n_old[ok]
        at = np.flatnonzero(ok)
        suspect = np.zeros(at.size, dtype=bool)
        for m, ix in movers:
            cand = np.flatnonzero((n_ok < m) & (n_ok > self.SHORT) & ~suspect)
            if cand.size:
                held = ix.tokens
                pos = self._tail_pos(n_ok[cand])
                suspect[cand] = (held[pos] == self._tail[rows[at[cand]]]).all(axis=1)
        for j in at[suspect].tolist():
            r = int(rows[j])
            ok[j] = self._holds(tok, r, self._ix[r], int(n_old[j]))

    def _serve_rows(self, ixs: list, tok: np.ndarray, rows: np.ndarray, Lr: np.ndarray, start: np.ndarray,
                    tail_new: np.ndarray, ks: Any) -> list[list[int]]:
        """One serving step for every drafting row (one batched call, all or nothing,
        before the rows' state is written): ``ixs[j]`` gets row ``rows[j]``'s tokens
        ``start[j]:Lr[j]``, then proposes up to ``ks`` tokens. ``tail_new``: each row's
        last ``TAIL`` tokens (its newest last)."""
        grow = Lr - start
        cmin, cmax = int(grow.min()), int(grow.max())
        if cmin == 1 and cmax == 1:  # one token per row (a step without accepted drafts)
            drafts = self._serve_indexes(ixs, np.ascontiguousarray(tail_new[:, self.TAIL - 1]),
                                         self._arange[: rows.size + 1], ks)
            self.stats["extended"] += rows.size
            return drafts
        offsets = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(grow, out=offsets[1:])
        total = int(offsets[-1])
        row_of = np.repeat(rows, grow)
        col = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1] - start, grow)
        drafts = self._serve_indexes(ixs, tok[row_of, col], offsets, ks)
        self.stats["extended"] += total
        return drafts

    def _commit_rows(self, tok: np.ndarray, rows: np.ndarray, sel: Any, every: bool, b: int, Lr: np.ndarray,
                     tail_new: np.ndarray, ids: list | None, fresh: Any, deep: Any) -> None:
        """Write the drafting rows' state after their serving step: indexed length and
        tail, the request each index now belongs to, and the spread anchors of new
        indexes (``fresh``, positions into ``rows``) and of histories that doubled since
        their anchor (checked for the rows spread-checked this step, ``deep``, or every
        row with ``verify="full"``)."""
        self._len[sel] = Lr
        self._tail[sel] = tail_new
        # the requests the drafting rows' indexes now belong to
        if ids is None:
            if self._has_ids:
                self._rid = [None] * len(self._rid)
                self._has_ids = False
        else:
            if every:
                self._rid[:b] = ids
            else:
                for r in rows.tolist():
                    self._rid[r] = ids[r]
            self._has_ids = True
        # (re)anchor the spread positions of new indexes, and of histories that doubled
        # since their anchor when their turn for the spread check comes
        if fresh is not None:
            renew = fresh
        elif self.verify == "full":
            renew = np.flatnonzero(Lr >= 2 * self._anc[sel])
        else:
            renew = deep[Lr[deep] >= 2 * self._anc[rows[deep]]] if deep.size else deep
        if len(renew):
            rn = rows[renew]
            self._anc[rn] = Lr[renew]
            self._spos[rn] = at = self._spread_pos(Lr[renew])
            self._spread[rn] = self._gather(tok, rn, at)

    def _relocate(self, tok: np.ndarray, rows: np.ndarray, Lr: np.ndarray, grown: np.ndarray,
                  bad: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Give every row in ``rows[bad]`` (the rows the row rule calls moved) an index:
        one that moved here with its request from another row or came back from the pool
        of indexes no row holds (a preempted request), or the row's own index when the
        row only grew more than its sampled tokens (a call vLLM skipped), each taken only
        after comparing every token it holds with the row; else a new one. ``grown`` is
        each row's sampled-token count. Returns the positions (into ``rows``) whose
        spread anchor must be renewed."""
        confirmed = set(rows.tolist()) - set(rows[bad].tolist())
        own = {}  # row -> (length, tail) of the index it held, to look for it again
        for j in bad.tolist():
            r = int(rows[j])
            if self._ix[r] is not None:
                own[r] = (int(self._len[r]), self._tail[r].tobytes())
        # every index not confirmed in place this step may be the one that moved
        for r, ix in enumerate(self._ix):
            if ix is not None and r not in confirmed:
                self._release(r)
        renew = []
        for j in bad.tolist():
            r = int(rows[j])
            L = int(Lr[j])
            hit = None
            # its length when last proposed for, if it moved here; then the row's own
            # index (the same request, grown by more than this call's sampled tokens)
            tries = [L - int(grown[j])]
            if r in own and own[r][0] not in tries:
                tries.append(own[r][0])
            for n in tries:
                if not 0 < n <= L:
                    continue
                key = (n, self._gather(tok, rows[j : j + 1], self._tail_pos(np.asarray([n]))).tobytes())
                cand = self._pool.get(key)
                if cand is not None and self._holds(tok, r, cand[0], n):  # every token compared
                    hit = n, self._pool.pop(key)
                    self._pool_tokens -= n
                    break
            if hit is not None:
                n, (ix, anc, spread) = hit
                self.stats["adopted"] += 1
                start[j] = n
                self._ix[r] = ix
                self._anc[r], self._spread[r] = anc, spread
                self._spos[r] = self._spread_pos(np.asarray([anc]))[0]
                continue
            self._ix[r] = self._new_index()
            self.stats["rebuilt"] += 1
            self.stats["rebuilt_tokens"] += L
            start[j] = 0
            renew.append(j)
        self._trim_pool()
        anc = self._anc[rows]
        return np.union1d(np.asarray(renew, dtype=np.int64), np.flatnonzero((Lr >= 2 * anc) | (anc <= 0)))


