"""A model of vLLM's persistent input batch, token side only, to replay row movements.

Written from vLLM's V1 source (``vllm/v1/worker/gpu_input_batch.py`` and the order of
operations in ``GPUModelRunner._update_states`` / ``_bookkeeping_sync`` /
``propose_draft_token_ids``); no vLLM code is used. What it replays:

- finished requests are removed (``remove_request``) and their rows freed;
- unscheduled (preempted) requests are removed but keep their state; resumed ones are
  added again with prompt + outputs (``add_request``);
- new and resumed requests fill the smallest freed rows first, then append;
- ``condense`` moves the last occupied rows into the remaining holes, copying only the
  row's first ``num_tokens`` tokens (the tail of the destination row keeps stale tokens);
- ``swap_states`` swaps two whole rows (the attention backend's decode/prefill reorder);
- the scheduled draft tokens are written after a row's verified tokens
  (``update_req_spec_token_ids``), so the row's tail beyond ``num_tokens_no_spec`` holds
  junk;
- a row that ran only part of its prefill gets ``[]`` sampled tokens;
- bookkeeping appends each row's sampled tokens (1 to K+1) at ``num_tokens_no_spec``;
- a request's output can be cut back in place (``num_output_tokens <
  len(output_token_ids)``: ``num_tokens_no_spec`` shrinks, same row);
- a streaming-session update removes the request and re-adds it with the previous
  outputs folded into its prompt;
- a step whose input does not fit the drafter (the longest history + K past
  ``max_model_len``; also at random, except with ``templated``) appends tokens but calls
  no ``propose``;
- a request stops at ``max_model_len``;
- with ``calm > 0``, steps where nothing moves (as most steps of a busy server are),
  which the proposers serve on their steady path;
- with ``templated > 0``, that share of new requests is a chat turn: one shared system
  prompt, a question of one fixed length (so prompts are equally long), the template's
  tail (questions end in the same three tokens), and a model that always starts its answer with the same token and often stops
  after a few tokens; questions quote the template tail and that first token followed by
  their own tokens, so a row reused by the next such request holds, at the old request's
  length, the same last tokens while drafting from the old history would give another
  draft (what a length-and-tail check cannot tell apart);
- with ``mimic > 0``, that share of new requests copies the final history of the request
  that last finished in the row it will take (it takes the smallest free row), with a
  few tokens in its middle rewritten, so it enters the row exactly as long as that
  request plus its first sampled token, with the same last tokens and system prompt:
  in every array the call passes it looks like the old request grown by one token, and
  only its request id tells them apart (the old index would draft the old history);
- with ``ids=True``, ``propose`` gets each row's request id (``req_ids=``, what the
  proposers read from vLLM's input batch inside vLLM); without, rows go by tokens alone;
- with ``narrow=True``, ``token_ids_cpu`` handed over as any array that still holds every
  row's history: cut to fewer columns (down to the longest history), to the batch's
  rows, as a strided view or a copy, int32 or int64 (so a row cut back can be narrower
  than what its index holds).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import numpy as np

JUNK = -7  # what a never-written cell holds (vLLM's buffer starts as zeros; any value will do)


@dataclass
class Request:
    req_id: str
    prompt: list[int]
    outputs: list[int] = field(default_factory=list)
    prefill_steps: int = 1  # steps of (chunked) prefill left before it samples
    target_len: int = 0
    first: int | None = None  # its first sampled token, when the model's is fixed
    mimic: bool = False  # its prompt copies the last history of the row it takes

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.outputs


class InputBatchModel:
    """``token_ids_cpu`` / ``num_tokens_no_spec`` and the row moves that rewrite them."""

    def __init__(self, max_num_reqs: int, max_model_len: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.token_ids_cpu = np.full((max_num_reqs, max_model_len), JUNK, dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)  # incl. draft tokens
        self.req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self._removed: list[int] = []
        self.condensed = 0  # rows moved by condense

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, req: Request) -> int:
        idx = heapq.heappop(self._removed) if self._removed else self.num_reqs
        assert idx < self.max_num_reqs
        if idx == len(self.req_ids):
            self.req_ids.append(req.req_id)
        else:
            self.req_ids[idx] = req.req_id
        self.req_id_to_index[req.req_id] = idx
        toks = req.tokens
        self.token_ids_cpu[idx, : len(toks)] = toks
        self.num_tokens_no_spec[idx] = len(toks)
        self.num_tokens[idx] = len(toks)
        return idx

    def remove_request(self, req_id: str) -> int | None:
        idx = self.req_id_to_index.pop(req_id, None)
        if idx is None:
            return None
        self.req_ids[idx] = None
        heapq.heappush(self._removed, idx)
        return idx

    def condense(self) -> None:
        holes = sorted(self._removed)
        self._removed = []
        if self.num_reqs == 0:
            self.req_ids.clear()
            return
        last = len(self.req_ids) - 1
        for empty in holes:
            while last >= 0 and self.req_ids[last] is None:
                last -= 1
            if empty >= last:
                break
            rid = self.req_ids[last]
            assert rid is not None
            self.req_ids[empty], self.req_ids[last] = rid, None
            self.req_id_to_index[rid] = empty
            n = int(self.num_tokens[last])
            self.token_ids_cpu[empty, :n] = self.token_ids_cpu[last, :n]
            self.num_tokens[empty] = n
            self.num_tokens_no_spec[empty] = self.num_tokens_no_spec[last]
            self.condensed += 1
            last -= 1
        del self.req_ids[self.num_reqs :]

    def swap_states(self, i1: int, i2: int) -> None:
        a, b = self.req_ids[i1], self.req_ids[i2]
        assert a is not None and b is not None
        self.req_ids[i1], self.req_ids[i2] = b, a
        self.req_id_to_index[a], self.req_id_to_index[b] = i2, i1
        for arr in (self.num_tokens, self.num_tokens_no_spec):
            arr[i1], arr[i2] = arr[i2], arr[i1]
        tmp = self.token_ids_cpu[i1].copy()
        self.token_ids_cpu[i1] = self.token_ids_cpu[i2]
        self.token_ids_cpu[i2] = tmp

    def write_spec_tokens(self, idx: int, draft: list[int]) -> None:
        start = int(self.num_tokens_no_spec[idx])
        end = min(start + len(draft), self.max_model_len)
        self.token_ids_cpu[idx, start:end] = draft[: end - start]
        self.num_tokens[idx] = end

    def append_sampled(self, idx: int, sampled: list[int]) -> None:
        start = int(self.num_tokens_no_spec[idx])
        end = start + len(sampled)
        assert end <= self.max_model_len
        self.token_ids_cpu[idx, start:end] = sampled
        self.num_tokens_no_spec[idx] = end
        self.num_tokens[idx] = end

    def cut_back(self, idx: int, length: int) -> None:
        self.num_tokens_no_spec[idx] = length
        self.num_tokens[idx] = length


class Engine:
    """Drives ``InputBatchModel`` through scheduler steps with random row movements and
    calls ``proposer.propose`` the way vLLM's runner does; ``check`` compares every
    returned draft with ``expected(history, k)``."""

    def __init__(self, proposer, rng: random.Random, *, max_num_reqs: int, max_model_len: int,
                 vocab: int, k: int, long_prompts: bool = False, expected=None, calm: float = 0.0,
                 narrow: bool = False, templated: float = 0.0, mimic: float = 0.0, ids: bool = False) -> None:
        self.p = proposer
        self.templated = templated
        self.mimic = mimic
        self.ids = ids
        self.left: dict[int, list[int]] = {}  # row -> the last history of the request that finished there
        cap = max_model_len
        # a system prompt past SHORT (128) where the cap allows, the template's tail, the
        # answer's first token (token ids from the top of the vocabulary)
        self.template = [vocab - 1, vocab - 2, vocab - 3, vocab - 4, vocab - 5]
        self.first = vocab - 6
        self.ending = [vocab - 7, vocab - 8, vocab - 9]
        self.system = [rng.randrange(max(vocab - 9, 1)) for _ in range(max(min(150, cap // 2 - 24), 1))]
        self.question = 12
        self.calm = calm
        self.narrow = narrow
        self._expected = expected
        self.rng = rng
        self.batch = InputBatchModel(max_num_reqs, max_model_len)
        self.vocab = vocab
        self.k = k
        self.long = long_prompts
        self.running: dict[str, Request] = {}
        self.preempted: dict[str, Request] = {}
        self.next_id = 0
        self.moves: dict[str, int] = {}
        self.calls = 0
        self.checked_rows = 0

    def _count(self, what: str) -> None:
        self.moves[what] = self.moves.get(what, 0) + 1

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def _templated_request(self) -> Request:
        r = self.rng
        q = self._tokens(self.question)
        quote = self.template[-3:] + [self.first] + self._tokens(2)
        at = r.randrange(0, self.question - len(quote) - 3 + 1)
        q[at : at + len(quote)] = quote
        q[-3:] = self.ending  # the question's last words, shared
        prompt = (self.system + q + self.template)[: self.batch.max_model_len - 2]
        self.next_id += 1
        self._count("templated request")
        return Request(f"r{self.next_id}", prompt, [], prefill_steps=1 if r.random() < 0.8 else 2,
                       target_len=len(prompt) + r.randint(1, 3), )

    def _mimic(self, req: Request, old: list[int] | None) -> None:
        """Make ``req`` the previous occupant's final history ``old`` with 6 tokens of
        its middle rewritten: the row's last two tokens, ``req``'s first sampled token
        and three new ones (so its own draft comes from there, the old index's does not)."""
        r = self.rng
        if old is None or len(old) < 24 or len(old) + 2 > self.batch.max_model_len:
            return
        first = r.randrange(self.vocab)
        at = r.randrange(0, len(old) - 8 - 6)
        prompt = list(old)
        prompt[at : at + 6] = old[-2:] + [first] + self._tokens(3)
        req.prompt, req.outputs, req.first = prompt, [], first
        req.prefill_steps, req.target_len = 1, len(prompt) + r.randint(1, 3)
        self._count("new request as long as its row's last one, with its last tokens")

    def _new_request(self) -> Request:
        req = self._any_request()
        req.mimic = bool(self.mimic) and self.rng.random() < self.mimic  # (made when it takes its row)
        return req

    def _any_request(self) -> Request:
        r = self.rng
        cap = self.batch.max_model_len
        if self.templated and r.random() < self.templated:
            return self._templated_request()
        if self.running and r.random() < 0.3:  # parallel sampling / shared system prompt
            other = r.choice(list(self.running.values()))
            prompt = list(other.prompt) if r.random() < 0.5 else other.tokens[: r.randint(1, len(other.tokens))]
            self._count("shared-prompt request")
        else:
            n = r.randint(1, cap // 2) if not self.long else r.randint(cap // 4, cap // 2)
            prompt = self._tokens(n)
            if r.random() < 0.5 and n > 4:  # something for the drafter to find
                s = r.randrange(0, n - 2)
                prompt += prompt[s : s + r.randint(2, 6)]
        prompt = prompt[: cap - 2]
        self.next_id += 1
        return Request(f"r{self.next_id}", prompt, [], prefill_steps=r.randint(1, 3),
                       target_len=r.randint(len(prompt) + 1, cap))

    def step(self) -> None:
        """One scheduler step: row movements (skipped with probability ``calm``: a step
        where nothing moves, as most steps of a busy server are), then the forward pass's
        bookkeeping and the drafter call."""
        if not (self.calm > 0 and self.rng.random() < self.calm):
            self._move()
        self._forward()

    def _move(self) -> None:
        r, b = self.rng, self.batch
        # 1. finished requests
        for rid in list(self.running):
            req = self.running[rid]
            if len(req.tokens) >= req.target_len or (r.random() < 0.05):
                del self.running[rid]
                self.left[b.remove_request(rid)] = list(req.tokens)
                self._count("finish (row freed)")
        # 2. unscheduled / preempted
        for rid in list(self.running):
            if r.random() < 0.08:
                req = self.running.pop(rid)
                b.remove_request(rid)
                self.preempted[rid] = req
                self._count("preempt (row freed, state kept)")
        # 3. streaming update: remove and re-add with outputs folded into the prompt
        readd: list[Request] = []
        for rid in list(self.running):
            req = self.running[rid]
            if req.outputs and r.random() < 0.03 and len(req.tokens) + 3 < b.max_model_len:
                b.remove_request(rid)
                req.prompt = req.tokens + self._tokens(r.randint(0, 2))
                req.outputs = []
                req.prefill_steps = 1
                readd.append(req)
                self._count("streaming re-add")
        # 4. resumed and new requests fill the smallest holes first
        for rid in list(self.preempted):
            if r.random() < 0.4 and b.num_reqs + len(readd) < b.max_num_reqs:
                req = self.preempted.pop(rid)
                req.prefill_steps = r.randint(1, 2)
                readd.append(req)
                self._count("resume after preemption")
        while b.num_reqs + len(readd) < b.max_num_reqs and r.random() < 0.5:
            readd.append(self._new_request())
            self._count("new request")
        for req in readd:
            if req.mimic:  # add_request fills the smallest free row
                self._mimic(req, self.left.get(b._removed[0] if b._removed else b.num_reqs))
                req.mimic = False
            self.running[req.req_id] = req
            b.add_request(req)
        before = b.condensed
        b.condense()
        if b.condensed > before:
            self._count("condense (row moved into a hole)")
        # 5. the attention backend's reorder: swaps of whole rows
        for _ in range(r.randint(0, 2)):
            if b.num_reqs >= 2:
                i, j = r.sample(range(b.num_reqs), 2)
                b.swap_states(i, j)
                self._count("swap_states")
        # 6. an output cut back in place
        for rid, req in self.running.items():
            if req.outputs and r.random() < 0.05:
                keep = r.randint(0, len(req.outputs) - 1)
                del req.outputs[keep:]
                idx = b.req_id_to_index[rid]
                b.cut_back(idx, len(req.tokens))
                self._count("output cut back in place")
        # 7. draft tokens scheduled after each row's verified tokens (junk for the drafter)
        for rid, idx in b.req_id_to_index.items():
            if r.random() < 0.5:
                b.write_spec_tokens(idx, self._tokens(self.k))

    def _forward(self) -> None:
        r, b = self.rng, self.batch
        # 8. forward + bookkeeping: sampled tokens per row
        sampled: list[list[int]] = []
        for idx in range(b.num_reqs):
            rid = b.req_ids[idx]
            assert rid is not None
            req = self.running[rid]
            if req.prefill_steps > 1:
                req.prefill_steps -= 1
                sampled.append([])
                continue
            req.prefill_steps = 0
            room = b.max_model_len - len(req.tokens)
            n = min(r.randint(1, self.k + 1), room)
            s = self._tokens(n) if n > 0 else []
            if s and not req.outputs and req.first is not None:
                s = [req.first]
            elif s and not req.outputs and req.prompt[-len(self.template):] == self.template:
                s = [self.first]  # a templated answer starts with the same token
            elif s and r.random() < 0.5 and len(req.tokens) > 3:  # repeat history: drafts hit
                t = req.tokens
                st = r.randrange(0, len(t) - 1)
                s = (t[st : st + n] + s)[:n]
            req.outputs.extend(s)
            b.append_sampled(idx, s)
            sampled.append(s)
        # 9. the drafter (skipped when the step's input does not fit it)
        # (vLLM skips the drafter when the longest sequence + K passes max_model_len,
        # ``_input_fits_in_drafter``; at random too, except for templated chat turns
        # without request ids, whose equal lengths and tails a skipped call can hide)
        longest = int(b.num_tokens_no_spec[: b.num_reqs].max()) if b.num_reqs else 0
        if longest + self.k > b.max_model_len or ((self.ids or not self.templated) and r.random() < 0.05):
            self._count("step without propose")
            return
        tok = b.token_ids_cpu
        if self.narrow and r.random() < 0.7:
            tok = self._narrowed(tok, b.num_tokens_no_spec[: b.num_reqs])
        self.last = (sampled, b.num_tokens_no_spec.copy(), tok.copy())
        out = self.p.propose(sampled, b.num_tokens_no_spec, tok,
                             req_ids=list(b.req_ids[: b.num_reqs]) if self.ids else None)
        self.calls += 1
        assert len(out) == len(sampled)
        for idx, (s, draft) in enumerate(zip(sampled, out)):
            L = int(b.num_tokens_no_spec[idx])
            rid = b.req_ids[idx]
            assert rid is not None
            assert b.token_ids_cpu[idx, :L].tolist() == self.running[rid].tokens
            if not s or L >= b.max_model_len or L == 0:
                want: list[int] = []
            else:
                want = self.expected(b.token_ids_cpu[idx, :L], min(self.k, b.max_model_len - L))
            assert draft == want, (f"row {idx} ({rid}, {L} tokens): proposed {draft}, "
                                   f"a fresh rescan gives {want}; moves so far {self.moves}")
            self.checked_rows += 1

    def _narrowed(self, tok: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """``tok`` cut to as few columns as still hold every history, or a few more, and
        maybe to the batch's rows; a view or a copy, sometimes int64."""
        r = self.rng
        need = int(lens.max()) if lens.size else 0
        width = r.choice([need, need, min(need + r.randint(1, 3), tok.shape[1])])
        out = tok[: max(len(lens), 1) if r.random() < 0.5 else tok.shape[0], :width]
        pick = r.randrange(3)
        if pick == 0:
            out = np.ascontiguousarray(out)
        elif pick == 1:
            out = out.astype(np.int64)
        self._count("narrower token_ids_cpu")
        return out

    def expected(self, history: np.ndarray, k: int) -> list[int]:
        if self._expected is not None:
            return self._expected(history, k)
        return self.p.rescan(history, k)
