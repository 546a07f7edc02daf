"""Teacher-forced tokens per evaluation of tree drafts against chains.

Replays the default workload (``specfsm.serving.workload.stdlib_workload``, the traces
``specfsm replay`` uses) teacher-forced: per step the drafter proposes from the history
(prompt and output so far), the step accepts what the recorded output confirms and
emits the accepted path plus the target's next token (the bonus-row convention), and the
history grows by those tokens. For each budget it compares ``SuffixIndex.propose(B)``
(a chain of B tokens) with ``SuffixIndex.propose_tree(B)`` (a tree of B nodes), both on
the suffix drafter's settings (no cap, earliest, anchor 16), and prints tokens per
evaluation and the control plane's mean cost of one proposal.

``--crude`` adds the issue's floor, a crude brute-force tree: the continuations of every
earlier occurrence of the longest matched suffix and of the two next shorter ones (the
suffix automaton's contexts), expanded best-first by how many of those occurrences
continue through a node, 16 deep, no width limit. ``--by-kind`` prints one table per
kind (a trace named "kind: name", as ``benchmarks/smollm2_kinds_traces.jsonl``'s are:
SmolLM2-135M-Instruct's greedy outputs for ``benchmarks/prompts_kinds.jsonl``, 256 new
tokens, recorded by ``benchmarks/record_kinds.py``).

Then the control plane's cost of building trees (``--cost``, budget 32 by default):
one ``propose_tree`` per request (B = 1) and one ``propose_tree_batch`` of 256 requests.

Run: python benchmarks/tree_replay.py [--requests N] [--budgets 8,16,32,64] [--width W]
     [--depth D] [--cost 32] [--twin] [--workload FILE] [--crude] [--by-kind]
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from pathlib import Path

import numpy as np

try:
    import specfsm  # noqa: F401  (the installed package)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specfsm import _impl  # noqa: E402
from specfsm.tree.tree import accept_tree  # noqa: E402
from specfsm.serving.workload import Trace, Vocabulary, load_jsonl, stdlib_workload, tokenize  # noqa: E402


def accepted_nodes(tokens, parents, recorded):
    """How many nodes of the tree the teacher-forced target accepts: its choice after a
    node at depth d is the recorded output's token d (``recorded[0]`` after the root),
    and ``specfsm.tree.accept_tree`` walks the tree by those choices."""
    depth = np.zeros(len(parents) + 1, dtype=np.int64)
    for i, p in enumerate(parents.tolist()):
        depth[i + 1] = depth[p + 1] + 1
    rec = np.asarray(recorded, dtype=np.int64)
    rows = rec[np.minimum(depth, len(rec) - 1)]  # past the recording's end: the walk is cut by the caller
    return len(accept_tree(tokens, parents, rows))


CRUDE_DEPTH = 16


def crude_tree(hist, ctx, budget, depth=CRUDE_DEPTH):
    """The issue's crude tree (the module docstring) over the history ``hist`` (an int64
    array) for the context lengths ``ctx``, longest first."""
    L = len(hist)
    if not ctx or L < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ends = np.nonzero(hist[: L - 1] == hist[L - 1])[0] + 1      # earlier ends after the last token
    ml = np.ones(len(ends), dtype=np.int64)
    live = ends.copy()
    idx = np.arange(len(ends))
    for j in range(1, ctx[0]):
        ok = live - 1 - j >= 0
        ok[ok] = hist[live[ok] - 1 - j] == hist[L - 1 - j]
        live, idx = live[ok], idx[ok]
        if not len(live):
            break
        ml[idx] += 1
    occ = ends[ml >= ctx[-1]].tolist()          # the shortest context's occurrences hold the others'
    toks, pars = [], []
    heap = []
    h = hist.tolist()

    def spawn(parent, d, es):
        if d >= depth:
            return
        groups = {}
        for e in es:
            if e + d < L:
                groups.setdefault(h[e + d], []).append(e)
        for tok, g in groups.items():
            heapq.heappush(heap, (-len(g), g[0], parent, tok, d + 1, g))

    spawn(-1, 0, occ)
    while heap and len(toks) < budget:
        _, _, parent, tok, d, g = heapq.heappop(heap)
        toks.append(tok)
        pars.append(parent)
        spawn(len(toks) - 1, d, g)
    return np.asarray(toks, np.int64), np.asarray(pars, np.int64)


def replay(mod, traces, budget, kind, depth, width):
    """Tokens per evaluation and seconds per proposal of one drafter over the traces."""
    emitted = evals = 0
    spent = 0.0
    calls = 0
    for tr in traces:
        ix = mod.SuffixIndex(1, None, "earliest", anchor_n=16)
        ix.extend(tr.prompt)
        twin = None
        if kind == "crude":       # the twin index for the automaton's context lengths
            twin = _impl.kernels("python", "suffix_index").SuffixIndex(1, None, "earliest", anchor_n=16)
            twin.extend(tr.prompt)
        out = tr.output
        pos = 0
        while pos < len(out):
            t0 = time.perf_counter()
            if kind == "chain":
                draft = ix.propose(budget)
            elif kind == "crude":
                toks, pars = crude_tree(ix.tokens, twin._tree_contexts(), budget)
            else:
                toks, pars = ix.propose_tree(budget, depth, width)
            spent += time.perf_counter() - t0
            calls += 1
            rest = out[pos:]
            if kind == "chain":
                a = 0
                while a < len(draft) and a < len(rest) and draft[a] == rest[a]:
                    a += 1
            else:
                a = accepted_nodes(toks, pars, rest) if len(toks) else 0
            step = min(a + 1, len(rest))
            ix.extend(rest[:step])
            if twin is not None:
                twin.extend(rest[:step])
            pos += step
            emitted += step
            evals += 1
    return emitted / evals, spent / calls


def cost(mod, traces, budget, depth=None, reps=200):
    """The control plane's cost of building trees: one ``propose_tree(budget, depth)``
    (B = 1) and one ``propose_tree_batch`` of B = 256 indexes, index i a request of the
    workload (i + 1) / 257 of the way through its output; the best of ``reps`` rounds,
    in microseconds. (A chain that fills the budget is the tree, returned without
    counting; ``depth`` below the budget makes every call count occurrences.)"""
    ixs = []
    for i in range(256):
        tr = traces[i % len(traces)]
        ix = mod.SuffixIndex(1, None, "earliest", anchor_n=16)
        cut = (len(tr.output) * (i + 1)) // 257
        ix.extend(tr.prompt + tr.output[:cut])
        ixs.append(ix)
    one = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for ix in ixs:
            ix.propose_tree(budget, depth)
        one.append((time.perf_counter() - t0) / len(ixs))
    chain = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for ix in ixs:
            ix.propose(budget)
        chain.append((time.perf_counter() - t0) / len(ixs))
    batch = []
    for _ in range(max(reps // 8, 3)):
        t0 = time.perf_counter()
        mod.propose_tree_batch(ixs, budget, depth)
        batch.append(time.perf_counter() - t0)
    full = sum(len(ix.propose(budget if depth is None else min(depth, budget))) == budget for ix in ixs)
    return min(one) * 1e6, min(chain) * 1e6, min(batch) * 1e6, np.median(batch) * 1e6, full


def records_workload(requests=24, seed=0):
    """A synthetic structured workload (not the replay's): each request's prompt is 20
    JSON-like records and its output 60 more, whose fields take a few values each, so a
    key is followed by different values (where a tree can hedge and a chain bets)."""
    rng = np.random.default_rng(seed)
    status = ["open", "closed", "pending"]
    owners = ["ana", "bo", "chen", "dee", "eli"]
    tags = ["bug", "docs", "perf", "ui"]
    texts = []
    for r in range(requests):
        lines = []
        for i in range(80):
            t = ", ".join(f'"{x}"' for x in rng.choice(tags, size=int(rng.integers(1, 3)), replace=False))
            lines.append(f'{{"id": {100 * r + i}, "status": "{rng.choice(status)}", '
                         f'"owner": "{rng.choice(owners)}", "tags": [{t}]}}\n')
        texts.append((tokenize("".join(lines[:20])), tokenize("".join(lines[20:]))))
    vocab = Vocabulary(t for a, b in texts for t in (*a, *b))
    return [Trace(vocab.encode(a), vocab.encode(b), name=f"records-{i}") for i, (a, b) in enumerate(texts)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=None, help="requests of the default workload (default: its 24)")
    ap.add_argument("--budgets", default="8,16,32,64", help="comma-separated node budgets")
    ap.add_argument("--depth", type=int, default=None, help="propose_tree max_depth (default: the budget)")
    ap.add_argument("--width", type=int, default=None, help="propose_tree max_width (default: its own)")
    ap.add_argument("--workload", default=None,
                    help="a JSONL file of traces (specfsm replay's format) instead of the default; "
                         "'records' for a synthetic structured workload")
    ap.add_argument("--cost", type=int, default=32, help="budget of the cost measurement (0: skip it)")
    ap.add_argument("--twin", action="store_true", help="the pure-Python twin (slow) instead of the compiled core")
    ap.add_argument("--crude", action="store_true", help="also the issue's crude brute-force tree (slow)")
    ap.add_argument("--by-kind", action="store_true", help="one table per kind (traces named 'kind: name')")
    args = ap.parse_args(argv)
    mod = _impl.kernels("python" if args.twin else "compiled", "suffix_index")
    if args.workload == "records":
        traces, source = records_workload(args.requests or 24), "synthetic structured records"
    elif args.workload:
        wl = load_jsonl(args.workload)
        traces, source = wl.traces, wl.source
    else:
        wl = stdlib_workload(args.requests)
        traces, source = wl.traces, wl.source
    budgets = [int(b) for b in args.budgets.split(",")]
    print(f"workload: {source}; {sum(len(t.output) for t in traces)} output tokens")
    groups = {"all": traces}
    if args.by_kind:
        groups = {}
        for t in traces:
            groups.setdefault(t.name.split(":")[0] if ":" in t.name else t.name, []).append(t)
    for name, trs in groups.items():
        if args.by_kind:
            print(f"kind: {name} ({len(trs)} requests, {sum(len(t.output) for t in trs)} output tokens)")
        print(f"{'budget':>6} {'chain tok/eval':>14} {'tree tok/eval':>13} {'tree/chain':>10} "
              + (f"{'crude tok/eval':>14} {'tree/crude':>10} " if args.crude else "")
              + f"{'chain us/call':>13} {'tree us/call':>12}")
        for b in budgets:
            c, ct = replay(mod, trs, b, "chain", args.depth, args.width)
            t, tt = replay(mod, trs, b, "tree", args.depth, args.width)
            cr = f"{replay(mod, trs, b, 'crude', None, None)[0]:>14.3f} " if args.crude else ""
            if args.crude:
                cr += f"{t / float(cr):>10.3f} "
            print(f"{b:>6} {c:>14.3f} {t:>13.3f} {t / c:>10.3f} {cr}{ct * 1e6:>13.2f} {tt * 1e6:>12.2f}")
    if args.cost:
        for depth in (None, max(args.cost // 4, 1)):
            one, chain, best, med, full = cost(mod, traces, args.cost, depth, 20 if args.twin else 200)
            print(f"cost, budget {args.cost}, max_depth {depth}: propose_tree {one:.2f} us per index "
                  f"(B = 1, best round; propose {chain:.2f} us), propose_tree_batch B = 256: {best:.1f} us "
                  f"best, {med:.1f} us median; chain fills the budget on {full} of 256")


if __name__ == "__main__":
    main()
