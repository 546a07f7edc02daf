"""A transformers model as the serving loop's target: ``ModelTarget`` answers
``specfsm.serving.loop.serve``'s batched evaluations from one ragged batch cache.

One ``ModelTarget`` serves one ``SpeculativeGenerator.generate`` run. Its cache handles
are ``(slot, columns)`` pairs: the request's slot and the count of its tokens the cache
holds (its position). The loop keeps each slot's handle at the row it resumes from, so
at every call the target reads from the handles what the last step kept: a slot now at
``c`` columns consumed ``c - c_fed`` of the columns it was fed (the rest become holes
and trailing columns nobody kept are cropped), a slot missing from the call has
finished (its row leaves the cache), and the rows are compacted when holes pass the
generator's fraction (``specfsm.hf.evaluate.RaggedBatch``). The first call is every
request's prefill (``evaluate.prefill``: each prompt by its own forward, or one padded
forward).

Row tokens are the model's greedy choices, or, when the generator samples, draws from
its processed distribution (every row for a rule that compares tokens, the last row of
each slot otherwise: the bonus row and a decode); ``evaluate_batch_probs`` also gives
that distribution at every row for the rules that decide from probabilities.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .evaluate import RaggedBatch, prefill
from .tree import feed_tree, keep_paths, tree_depths

__all__ = ["ModelTarget", "PROMPT_ROWS"]

#: with a recycling table, the prefill computes the logits of each prompt's last this
#: many rows (at most), and the table learns from them
PROMPT_ROWS = 64


class ModelTarget:
    """``serve``'s target over ``gen``'s model for one run (see the module docstring).
    ``sample_rows``: when sampling, draw a token at every row (a rule that compares
    tokens) or at each slot's last row only."""

    __slots__ = ("gen", "sample_rows", "budget", "rb", "live", "fed", "prompts", "steps", "treed")

    def __init__(self, gen: Any, sample_rows: bool = True, budget: int = 1) -> None:
        self.gen = gen
        self.sample_rows = sample_rows
        self.budget = budget  # the tokens each request may emit
        self.prompts: dict[int, int] = {}  # slot -> its prompt's length
        self.steps = 0  # forwards after the prefill
        self.rb: RaggedBatch | None = None
        self.live: list[int] = []  # the slot at each row of the batch cache
        self.fed: dict[int, int] = {}  # slot -> its columns when it was last fed
        self.treed: dict[int, Any] | None = None  # after a tree forward: slot -> its tree's parents (a chain's too)

    # -- the loop's protocol ------------------------------------------------------------
    def evaluate_batch(self, feeds: Sequence[Sequence[int]], caches: Sequence[tuple[int, ...]],
                       trees: Sequence[Any] | None = None) -> list[tuple[list[int], list[tuple[int, ...]]]]:
        """One step's rows; ``trees[j]``: slot ``j``'s tree parents when it verifies a tree
        (``serve`` passes them for a step with tree slots; None for a chain or a decode),
        its rows then the root and the nodes (``specfsm.hf.tree.feed_tree``). A tree row's
        handle is ``(slot, columns, row)``: the row it resumes from names the kept path."""
        return [(rows, rc) for rows, _p, rc in self._answer(feeds, caches, False, trees)]

    def evaluate_batch_probs(self, feeds: Sequence[Sequence[int]], caches: Sequence[tuple[int, ...]]) -> list[tuple[list[int], Any, list[tuple[int, ...]]]]:
        return self._answer(feeds, caches, True)

    def _compact(self, rb: RaggedBatch, cols: list[int], rows: int) -> None:
        """Gather the rows' real columns when ``gen.compaction`` says the attention saved
        over the forwards left (the longest request's remaining tokens at the run's
        tokens per forward) outweighs the copy; the copy is timed for the next decision."""
        gen = self.gen
        emitted = sum(c - self.prompts[s] + 1 for s, c in zip(self.live, cols))
        per_forward = emitted / max(self.steps + 1, 1) / len(cols)
        left = max(self.budget - (c - self.prompts[s] + 1) for s, c in zip(self.live, cols))
        horizon = max(left, 0) / max(per_forward, 1.0)
        cells = len(cols) * rb.width
        t0 = time.perf_counter()
        if rb.compact(cols, lambda b, width, new: gen.compaction.pays(b, width, new, rows, horizon)):
            gen.compaction.record_copy(cells, time.perf_counter() - t0)
            gen.last_run.compactions += 1

    # -- the model ----------------------------------------------------------------------
    def _kept(self, caches: Sequence[tuple[int, ...]]) -> None:
        """What the last step kept, after a tree forward: each slot's path to the row its
        handle names (a chain row: its leading columns), into ``keep_paths``."""
        assert self.rb is not None and self.treed is not None
        now = {int(c[0]): c for c in caches}
        paths: list[list[int]] = []
        for s in self.live:
            h = now.get(s)
            par = self.treed[s]
            node = (int(h[2]) if len(h) > 2 else int(h[1]) - self.fed[s]) - 1 if h is not None else -1
            path = []
            while node >= 0:
                path.append(node)
                node = int(par[node])
            paths.append(path[::-1])
        keep_paths(self.rb, paths)
        self.treed = None

    def _recycle(self, inputs: list[list[int]], logits: Any, right: bool = False) -> None:
        """Every evaluated row's top-k ids (``logits``: ``(B, W, vocab)``, row ``j``'s
        first ``len(inputs[j])`` columns real, or its last ones when ``right``) into the
        generator's recycling table, each under the token that row fed (nothing without
        a table)."""
        table = self.gen.recycling
        if table is None:
            return
        top = logits.topk(table.k, dim=-1).indices.numpy()
        w = top.shape[1]
        table.update(np.concatenate([np.asarray(r, dtype=np.int64) for r in inputs]),
                     np.concatenate([top[j, w - len(r):] if right else top[j, :len(r)] for j, r in enumerate(inputs)]))

    def _answer(self, feeds: Sequence[Sequence[int]], caches: Sequence[tuple[int, ...]], want_probs: bool,
                trees: Sequence[Any] | None = None) -> list[tuple[list[int], Any, list[tuple[int, ...]]]]:
        import torch

        gen = self.gen
        slots = [int(c[0]) for c in caches]
        cols = [int(c[1]) for c in caches]
        if self.rb is None:
            prompts = [np.asarray(f, dtype=np.int64) for f in feeds]
            keep = min(max(len(p) for p in prompts), PROMPT_ROWS) if gen.recycling is not None else 1
            cache, mask, tail = prefill(gen.model, gen._forward, prompts, gen.prefill == "each", keep)
            # the recycling table learns from the prompt's last rows (each prompt's own)
            self._recycle([p[-min(len(p), keep):].tolist() for p in prompts], tail, right=True)
            logits = tail[:, -1]
            self.rb = RaggedBatch(cache, mask, list(range(len(slots))), gen._forward)
            self.live = slots
            lens = [len(p) for p in prompts]
            self.fed = dict(zip(slots, lens))
            self.prompts = dict(self.fed)
            flat = logits
            counts = [1] * len(slots)
            handles: list[list[tuple[int, ...]]] = [[(s, n)] for s, n in zip(slots, lens)]
        else:
            rb = self.rb
            # what the last step kept: each row's consumed columns, then finished rows out
            if self.treed is not None:
                self._kept(caches)
            else:
                now = dict(zip(slots, cols))
                rb.keep([now[s] - self.fed[s] if s in now else 0 for s in self.live])
            if len(slots) != len(self.live):
                where = {s: r for r, s in enumerate(self.live)}
                rb.select([where[s] for s in slots])
                self.live = slots
            counts = [len(f) for f in feeds]
            w = max(counts)
            self._compact(rb, cols, len(feeds) * w)
            t0 = gen.last_run.model_s
            depths = None
            if trees is not None and any(t is not None for t in trees):
                # chains and decodes in a tree step are paths: node i's parent is node i - 1
                pars = [np.asarray(t, dtype=np.int64) if t is not None else np.arange(-1, n - 2, dtype=np.int64)
                        for t, n in zip(trees, counts)]
                logits = feed_tree(rb, [int(f[0]) for f in feeds],
                                   [(np.asarray(f[1:], dtype=np.int64), p) for f, p in zip(feeds, pars)], cols,
                                   gen.model.dtype)
                self.treed = dict(zip(slots, pars))
                depths = [tree_depths(p).tolist() for p in pars]
            else:
                logits = rb.feed(feeds, cols)
            spent = gen.last_run.model_s - t0
            gen.online.record(len(feeds), len(feeds) * w, spent)
            gen.compaction.record_forward(len(feeds) * w, rb.width, spent)
            self.steps += 1
            self._recycle([list(f) for f in feeds], logits)
            self.fed = {s: c for s, c in zip(slots, cols)}
            if depths is None:
                handles = [[(s, c + i) for i in range(1, n + 1)] for s, c, n in zip(slots, cols, counts)]
            else:
                handles = [[(s, c + d + 1, r) for r, d in enumerate(ds)] for s, c, ds in zip(slots, cols, depths)]
            if not (gen.do_sample or want_probs):  # greedy: the choices, no copy of the logits
                choice = logits.argmax(-1).tolist()
                return [(choice[j][:n], None, handles[j]) for j, n in enumerate(counts)]
            flat = torch.cat([logits[j, :n] for j, n in enumerate(counts)]) if w > 1 else logits[:, 0]
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        probs = None
        if gen.do_sample or want_probs:
            probs = gen.probabilities(flat)
        if gen.do_sample:
            assert probs is not None
            rows = flat.argmax(-1).tolist()  # placeholders where no draw is needed
            at = range(len(rows)) if self.sample_rows else (starts[1:] - 1).tolist()
            for r in at:
                rows[r] = gen._sample(probs[r])
        else:
            rows = flat.argmax(-1).tolist()
        out = []
        for j in range(len(counts)):
            a, b = int(starts[j]), int(starts[j + 1])
            out.append((rows[a:b], probs[a:b] if want_probs and probs is not None else None, handles[j]))
        return out
