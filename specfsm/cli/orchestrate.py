"""Replay orchestration for ``specfsm replay``: the workload's requests driven through
the speculative loop with plain greedy decoding and with speculation under each
implementation, and the summary those runs add up to (``specfsm.cli.summary`` formats
it). The active implementation (``specfsm._impl``'s choice at import) runs in this
process; the pure-Python twin, when the compiled core is active, runs in a child
process with ``SPECFSM_NO_EXTENSIONS=1`` (``specfsm.cli.twin``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from .. import _impl
from ..drafting.lookup import PromptLookupDrafter
from ..serving.loop import (
    Request,
    RequestResult,
    RequestStats,
    SpeculativeLoop,
    batchable_drafter,
    compare_outputs,
    needs_probs,
    serve,
)
from ..drafting.ngram_index import NgramDrafter
from ..serving.workload import TeacherForcedBatch, TeacherForcedTarget, Trace, Workload
from .options import DEFAULT_DRAFTER, DRAFTERS, UsageError, rule_text
from .progress import Progress
from .summary import LABELS

__all__ = [
    "replay", "speculative_runs", "make_rule", "make_drafter", "available_kinds", "active_kind", "default_ngram",
    "compact_ids", "SHIPPED_WORKLOADS",
]

_REPEAT_BUDGET_S = 2.0  # no further repeats once an implementation has run this long

#: workloads that ship with the package, by name: SmolLM2-135M-Instruct's greedy outputs
#: on embedded edit prompts (recorded with ``specfsm record``)
SHIPPED_WORKLOADS = {
    "smollm2": os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "smollm2_edits.jsonl"),
}


def make_rule(spec: tuple[str, int]) -> Any:
    """A fresh acceptance rule object for a parsed ``--rule`` (each run gets its own, so a
    sampling rule's random stream starts from its seed every time)."""
    from ..accept import rules as accept_rule

    name, arg = spec
    if name == "exact":
        return accept_rule.Exact()
    if name == "minrun":
        return accept_rule.MinRun(arg)
    if name == "speculative":
        return accept_rule.SpeculativeSampling(seed=arg)
    if name == "typical":
        return accept_rule.TypicalAcceptance()
    raise ValueError(f"unknown rule {name!r}")


def active_kind() -> str:
    """The implementation this process runs on: ``"python"`` where ``SPECFSM_NO_EXTENSIONS``
    (or a non-CPython interpreter) switched the compiled core off, else ``"compiled"``."""
    return "python" if _impl.NO_EXTENSIONS else "compiled"


def default_ngram(drafter: str) -> tuple[int, int | None]:
    """``--ngram`` when it is not given: 3 for prompt lookup, 2:4 for the n-gram index,
    and for the suffix drafters a minimum of 1 with no maximum (the longest match)."""
    if drafter == "prompt":
        return (3, 3)
    if drafter == "ngram":
        return (2, 4)
    return (1, None)


def make_drafter(name: str, ngram: tuple[int, int | None]) -> Any:
    """The drafter for ``--drafter``/``--ngram``, on the active implementation. A fresh
    drafter per call: the shared suffix cache must not carry one run's outputs into the
    next."""
    lo, hi = ngram
    if name == "prompt":
        if lo != hi:
            raise UsageError(
                f"--drafter prompt takes one n-gram length, got --ngram {lo}:{hi} "
                "(a range needs --drafter ngram or suffix)"
            )
        return PromptLookupDrafter(lo)
    if name == "ngram":
        if hi is None:
            raise UsageError("--drafter ngram needs a bounded range, as in --ngram 2:4")
        try:
            return NgramDrafter(lo, hi, "latest")
        except ValueError as exc:  # more lengths than the index keeps one table for
            raise UsageError(f"--ngram {lo}:{hi}: {exc}") from None
    if name in ("suffix", "suffix-shared"):
        from ..drafting import suffix_index

        shared = suffix_index.SharedSuffixCache() if name == "suffix-shared" else None
        return suffix_index.SuffixDrafter(lo, hi, shared=shared)
    if name == "suffix-tree":
        from ..serving.trees import SuffixTreeDrafter

        return SuffixTreeDrafter(lo, hi)
    if name == "arctic":
        from ..drafting import suffix_index

        if not suffix_index.arctic_available():
            raise UsageError(
                "--drafter arctic needs Snowflake's arctic-inference package "
                "(with torch installed: pip install nanobind cmake wheel, then pip install --no-deps --no-build-isolation arctic-inference)"
            )
        return suffix_index.ArcticDrafter()
    raise UsageError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")


def available_kinds() -> tuple[list[str], dict[str, str]]:
    """Implementations to measure, and why any is skipped.

    The compiled core is measured only when every kernel module is compiled
    (``specfsm.extensions()``): with some of them on the twin, its timings would be the
    twin's, reported as compiled ones.
    """
    kinds, skipped = [], {}
    if _impl.NO_EXTENSIONS:
        skipped["compiled"] = "switched off (SPECFSM_NO_EXTENSIONS or a non-CPython interpreter)"
    else:
        missing = {name: st.error for name, st in _impl.extensions().items() if not st.compiled}
        if not missing:
            kinds.append("compiled")
        elif len(missing) == len(_impl.KERNEL_MODULES):
            skipped["compiled"] = "not built"
        else:
            skipped["compiled"] = "only partly built: " + "; ".join(
                f"specfsm._core.{name} does not import ({err})" for name, err in missing.items()
            )
    kinds.append("python")
    return kinds, skipped


def _requests(workload: Workload) -> list[Request]:
    return [
        Request(
            t.prompt,
            len(t.output),
            eos=t.eos,
            target=TeacherForcedTarget(t.prompt, t.output),
            name=t.name,
        )
        for t in workload.traces
    ]


def compact_ids(workload: Workload) -> Workload:
    """``workload`` with every id (prompt, output, eos) replaced by its rank among the
    distinct ids the workload uses, so ids run 0..V-1 for V distinct ids.

    The sampling rules (``--rule speculative``, ``--rule typical``) read one probability
    row over the whole vocabulary per target row, and the teacher-forced target's
    vocabulary is the largest id + 2: with ids as large as 2**63 - 1 that row could not
    be allocated. The mapping keeps the ids' order and is one to one, and everything the
    replay computes depends only on which ids are equal (the drafters' matches, the
    recording) or on one-hot rows whose draws do not depend on the row's length, so the
    summary is the same as with the original ids."""
    ids: set[int] = set()
    for t in workload.traces:
        ids.update(t.prompt)
        ids.update(t.output)
        if t.eos is not None:
            ids.add(t.eos)
    rank = {x: i for i, x in enumerate(sorted(ids))}
    traces = [
        Trace(
            [rank[x] for x in t.prompt],
            [rank[x] for x in t.output],
            name=t.name,
            eos=None if t.eos is None else rank[t.eos],
        )
        for t in workload.traces
    ]
    return Workload(traces, workload.source, dict(workload.details))


def _run_batches(
    loop: SpeculativeLoop, requests: list[Request], batch: int, progress: Progress, bonus: bool = False
) -> list[RequestResult]:
    """Run ``requests`` ``batch`` at a time: on the batch API (one ``BatchState.step`` per
    serving step) when the loop drafts with an index per request (``NgramDrafter``, a
    ``SuffixDrafter`` without a shared cache) or not at all, else request by request
    (prompt lookup keeps a history per request; the shared suffix cache and arctic work
    per request)."""
    batched = loop.drafter is None or batchable_drafter(loop.drafter)
    trees = getattr(loop.drafter, "trees", False)
    out: list[RequestResult] = []
    for i in range(0, len(requests), batch):
        chunk = requests[i : i + batch]
        if trees:
            # one shared target evaluates the step's trees: the recordings behind one
            # TeacherForcedBatch, each request's cache (its index, its position); a tree
            # resumes with the target's token after its last node, so chains take the
            # bonus row too
            shared = TeacherForcedBatch([r.target for r in chunk])
            reqs = [Request(r.prompt, r.max_tokens, eos=r.eos, cache=(j, None), name=r.name)
                    for j, r in enumerate(chunk)]
            # (greedy: the batch's own exact settle, as replay() allows only --rule exact)
            out += serve(reqs, shared, loop.drafter, loop.k, None, loop.clone, bonus=True,
                         on_done=progress.step)
        elif batched:
            out += loop.run_batched(chunk, on_done=progress.step, bonus=bonus)
        else:
            out += loop.run_batch(chunk, on_done=progress.step)
    return out


def speculative_runs(
    workload: Workload,
    drafter: str,
    ngram: tuple[int, int | None],
    k: int,
    rule: tuple[str, int],
    batch: int,
    repeat: int,
    bonus: bool = False,
    progress: Progress | None = None,
) -> tuple[float | None, list[RequestResult], int]:
    """Up to ``repeat`` speculative replays of ``workload`` on this process's
    implementation (no further repeats once they have taken ``_REPEAT_BUDGET_S``):
    ``(best control-plane µs per token, that run's results, runs made)``."""
    requests = _requests(workload)
    bar = progress or Progress(1, sys.stderr, False)
    best: float | None = None
    results: list[RequestResult] = []
    done = 0
    started = time.monotonic()
    for i in range(repeat):
        if i and time.monotonic() - started > _REPEAT_BUDGET_S:
            bar.skip((repeat - i) * len(requests))
            break
        done = i + 1
        loop = SpeculativeLoop(None, make_drafter(drafter, ngram), k, make_rule(rule))
        got = _run_batches(loop, requests, batch, bar, bonus)
        ns = sum(r.stats.control_ns for r in got)
        toks = sum(r.stats.output_tokens for r in got)
        per = ns / 1e3 / toks if toks else None
        if per is None or best is None or per < best:
            best, results = per, got
    return best, results, done


def replay(
    workload: Workload,
    drafter: str = DEFAULT_DRAFTER,
    k: int = 5,
    ngram: tuple[int, int | None] | None = None,
    rule: tuple[str, int] = ("exact", 0),
    batch: int = 8,
    repeat: int = 3,
    kinds: Sequence[str] | None = None,
    progress: Progress | None = None,
    bonus: bool = False,
) -> dict[str, Any]:
    """Replay ``workload`` with speculation under each implementation in ``kinds`` and
    with plain greedy decoding; return the summary ``specfsm replay --json`` prints."""
    if needs_probs(make_rule(rule)):  # probability rows sized by the ids present
        workload = compact_ids(workload)
    requests = _requests(workload)
    if ngram is None:
        ngram = default_ngram(drafter)
    if kinds is None:
        kinds, skipped = available_kinds()
    else:
        skipped = {}
    make_rule(rule)
    make_drafter(drafter, ngram)  # refuse bad combinations before any work
    if drafter == "suffix-tree":
        if rule[0] != "exact":
            raise UsageError(f"--drafter suffix-tree verifies trees greedily: it takes --rule exact, not {rule[0]}")
        bonus = True  # a tree resumes with the target's token after its last accepted node
    bar = progress or Progress(1, sys.stderr, False)

    bar.phase("plain greedy")
    greedy = _run_batches(SpeculativeLoop(None), requests, batch, bar)
    recorded = compare_outputs(greedy, [t.output for t in workload.traces])
    if recorded:  # the teacher-forced target is a greedy model of the recording
        raise RuntimeError(f"plain greedy replay departs from the recording: {recorded[:5]}")

    settings: dict[str, Any] = dict(drafter=drafter, ngram=ngram, k=k, rule=rule, batch=batch, repeat=repeat, bonus=bonus)
    runs, control, runs_done = _speculative_by_kind(workload, kinds, settings, bar, len(requests))
    for kind in skipped:
        control[kind] = None
    bar.close()
    return _replay_summary(workload, requests, settings, greedy, runs, kinds[0], control, runs_done, skipped)


def _speculative_by_kind(
    workload: Workload, kinds: Sequence[str], settings: dict[str, Any], bar: Progress, n_requests: int
) -> tuple[dict[str, list[RequestResult]], dict[str, float | None], dict[str, int]]:
    """The speculative replays under each implementation in ``kinds`` (``settings``:
    ``speculative_runs``' keywords): the active one in this process, the twin in a
    child process. Returns per kind its results, its best control-plane µs per token
    and the runs it made."""
    runs: dict[str, list[RequestResult]] = {}
    control: dict[str, float | None] = {}
    runs_done: dict[str, int] = {}
    for kind in kinds:
        bar.phase(f"speculative, {LABELS[kind]}")
        if kind == active_kind():
            control[kind], runs[kind], runs_done[kind] = speculative_runs(workload, progress=bar, **settings)
        else:
            from .twin import run_twin

            control[kind], runs[kind], runs_done[kind] = run_twin(workload, settings)
            bar.skip(settings["repeat"] * n_requests)
    return runs, control, runs_done


def _replay_summary(
    workload: Workload,
    requests: list[Request],
    settings: dict[str, Any],
    greedy: list[RequestResult],
    runs: dict[str, list[RequestResult]],
    first_kind: str,
    control: dict[str, float | None],
    runs_done: dict[str, int],
    skipped: dict[str, str],
) -> dict[str, Any]:
    """``replay``'s summary: the settings, the speculative run's counts (those of
    ``first_kind``'s run) against plain greedy's, acceptance by draft position, each
    implementation's control-plane time, identity with greedy and between the
    implementations, and the same per request."""
    first = runs[first_kind]
    mismatches = {kind: compare_outputs(res, greedy) for kind, res in runs.items()}
    counts_agree = all(
        [r.stats.counts() for r in res] == [r.stats.counts() for r in first] for res in runs.values()
    )
    stats = [r.stats for r in first]
    width = max((len(s.drafted_by_position) for s in stats), default=0)
    dpos = [sum(s.drafted_by_position[i] for s in stats if i < len(s.drafted_by_position)) for i in range(width)]
    apos = [sum(s.accepted_by_position[i] for s in stats if i < len(s.accepted_by_position)) for i in range(width)]
    out_tokens = sum(s.output_tokens for s in stats)
    ev_spec = sum(s.evaluations for s in stats)
    ev_greedy = sum(r.stats.evaluations for r in greedy)
    verifies = sum(s.verifies for s in stats)
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    identical = counts_agree and not any(mismatches.values())
    return {
        "workload": {"source": workload.source, **workload.details},
        "settings": {
            "drafter": settings["drafter"],
            "ngram": list(settings["ngram"]),
            "k": settings["k"],
            "rule": rule_text(settings["rule"]),
            "batch": settings["batch"],
            "repeat": settings["repeat"],
            "bonus": settings["bonus"],
        },
        "runs": runs_done,
        "requests": len(requests),
        "prompt_tokens": sum(s.prompt_tokens for s in stats),
        "output_tokens": out_tokens,
        "evaluations_greedy": ev_greedy,
        "evaluations_speculative": ev_spec,
        "evaluation_ratio": ev_greedy / ev_spec if ev_spec else None,
        "tokens_per_evaluation": out_tokens / ev_spec if ev_spec else None,
        "verifies": verifies,
        "rollbacks": sum(s.rollbacks for s in stats),
        "drafted": drafted,
        "accepted": accepted,
        "mean_accepted_length": accepted / verifies if verifies else None,
        "mean_draft_length": drafted / verifies if verifies else None,
        "drafted_by_position": dpos,
        "accepted_by_position": apos,
        "acceptance_by_position": [a / d if d else None for a, d in zip(apos, dpos)],
        "control_us_per_token": control,
        "skipped": skipped,
        "identical": identical,
        "implementations_agree": counts_agree,
        "mismatches": {kind: [list(m) for m in bad] for kind, bad in mismatches.items()},
        "per_request": _per_request(requests, stats, greedy, runs),
    }


def _per_request(
    requests: list[Request], stats: list[RequestStats], greedy: list[RequestResult], runs: dict[str, list[RequestResult]]
) -> list[dict[str, Any]]:
    """``replay``'s summary per request: its tokens, greedy's and the speculative run's
    (``stats``: each request's) evaluations, each implementation's control-plane time,
    and identity with greedy under every implementation."""
    return [
        {
            "name": req.name,
            "prompt_tokens": s.prompt_tokens,
            "output_tokens": s.output_tokens,
            "evaluations_greedy": g.stats.evaluations,
            "evaluations_speculative": s.evaluations,
            "tokens_per_evaluation": s.tokens_per_evaluation if s.evaluations else None,
            "mean_accepted_length": s.mean_accepted if s.verifies else None,
            "control_us_per_token": {kind: _per_token(runs[kind][i]) for kind in runs},
            "identical": all(runs[kind][i].output == g.output for kind in runs),
        }
        for i, (req, s, g) in enumerate(zip(requests, stats, greedy))
    ]


def _per_token(result: RequestResult) -> float | None:
    s = result.stats
    return s.control_us_per_token if s.output_tokens else None


if __name__ == "__main__":  # the twin's child process (``twin.run_twin``)
    from .twin import serve_child

    serve_child(speculative_runs)
