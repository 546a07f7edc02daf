"""``specfsm`` command line: ``specfsm replay`` drives recorded requests through the
speculative serving loop and reports what speculation saved and what the control plane
cost, with the compiled core and with the pure-Python twin.

Exit status: 0 when every speculative output equals its plain greedy output, 1 when one
does not, 2 for a usage error or a workload that cannot be read (every unreadable line is
named as ``file:line``; a line may hold at most ``specfsm.workload.MAX_LINE_BYTES`` bytes,
64 MiB, and is read in bounded chunks), and for ``--impl compiled`` when some kernel
module is not compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from . import _impl
from .loop import (
    NgramDrafter,
    PromptLookupDrafter,
    Request,
    RequestResult,
    SpeculativeLoop,
    TeacherForcedTarget,
    TraceError,
    compare_outputs,
)
from .workload import MAX_LINE_BYTES, Workload, WorkloadError, load_jsonl, stdlib_workload

__all__ = ["main", "replay"]

_KERNELS = (("common_prefix", "prefix"), ("prompt_lookup", "ngram"), ("settle", "settle"))
_LABELS = {"compiled": "compiled core", "python": "python twin"}
_REPEAT_BUDGET_S = 2.0  # no further repeats once an implementation has run this long


class UsageError(Exception):
    """A bad option value; reported with exit status 2."""


# --------------------------------------------------------------------------------------
# option parsing
# --------------------------------------------------------------------------------------
def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _parse_ngram(text: str) -> tuple[int, int]:
    parts = text.replace("-", ":").split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}") from None
    if len(nums) == 1:
        nums = nums * 2
    if len(nums) != 2 or nums[0] < 1 or nums[0] > nums[1]:
        raise argparse.ArgumentTypeError(
            f"expected N or MIN:MAX with 1 <= MIN <= MAX, got {text!r}"
        )
    return nums[0], nums[1]


def _parse_rule(text: str) -> tuple[str, int]:
    name, _, arg = text.partition(":")
    name = name.strip().lower()
    if name in ("exact", "typical") and not arg:
        return name, 0
    if name == "minrun":
        try:
            m = int(arg)
        except ValueError:
            m = -1
        if m >= 1:
            return "minrun", m
        raise argparse.ArgumentTypeError(f"minrun needs a positive run length, as in minrun:3; got {text!r}")
    if name == "speculative":
        try:
            seed = int(arg) if arg else 0
        except ValueError:
            seed = -1
        if seed >= 0:
            return "speculative", seed
        raise argparse.ArgumentTypeError(f"speculative takes a non-negative seed, as in speculative:7; got {text!r}")
    raise argparse.ArgumentTypeError(f"expected exact, minrun:M, speculative[:SEED] or typical; got {text!r}")


def make_rule(spec: tuple[str, int]) -> Any:
    """A fresh acceptance rule object for a parsed ``--rule`` (each run gets its own, so a
    sampling rule's random stream starts from its seed every time)."""
    from . import accept_rule

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


def _rule_text(spec: tuple[str, int]) -> str:
    name, arg = spec
    if name == "minrun":
        return f"minrun:{arg}"
    if name == "speculative":
        return f"speculative:{arg}"
    return name


def _index_cls(kind: str | None, module: str, name: str) -> Any:
    """Class ``name`` of one implementation's kernel ``module``, or the active one."""
    return getattr(_impl.module(kind, module) if kind is not None else _impl.load(module), name)


#: workloads that ship with the package, by name: SmolLM2-135M-Instruct's greedy outputs
#: on embedded edit prompts (recorded with ``specfsm record``)
SHIPPED_WORKLOADS = {
    "smollm2": os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "smollm2_edits.jsonl"),
}

DRAFTERS = ("suffix", "suffix-shared", "ngram", "prompt", "arctic")
DEFAULT_DRAFTER = "suffix"
_DRAFTER_LABELS = {
    "suffix": "suffix index",
    "suffix-shared": "suffix index + shared cache",
    "ngram": "n-gram index",
    "prompt": "prompt lookup",
    "arctic": "Arctic suffix decoding",
}


def default_ngram(drafter: str) -> tuple[int, int | None]:
    """``--ngram`` when it is not given: 3 for prompt lookup, 2:4 for the n-gram index,
    and for the suffix drafters a minimum of 1 with no maximum (the longest match)."""
    if drafter == "prompt":
        return (3, 3)
    if drafter == "ngram":
        return (2, 4)
    return (1, None)


def make_drafter(name: str, ngram: tuple[int, int | None], kind: str | None = None) -> Any:
    """The drafter for ``--drafter``/``--ngram``; ``kind`` picks one implementation's
    index (prompt lookup is routed through ``specfsm._impl`` instead). A fresh drafter
    per call: the shared suffix cache must not carry one run's outputs into the next."""
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
        return NgramDrafter(lo, hi, "latest", index_cls=_index_cls(kind, "ngram_index", "NgramIndex"))
    if name in ("suffix", "suffix-shared"):
        from . import suffix_index

        cls = _index_cls(kind, "suffix_index", "SuffixIndex")
        shared = suffix_index.SharedSuffixCache(index_cls=cls) if name == "suffix-shared" else None
        return suffix_index.SuffixDrafter(lo, hi, index_cls=cls, shared=shared)
    if name == "arctic":
        from . import suffix_index

        if not suffix_index.arctic_available():
            raise UsageError(
                "--drafter arctic needs Snowflake's arctic-inference package "
                "(pip install --no-deps arctic-inference)"
            )
        return suffix_index.ArcticDrafter()
    raise UsageError(f"unknown drafter {name!r}; choose from {', '.join(DRAFTERS)}")


@contextmanager
def routed(kind: str) -> Iterator[None]:
    """Route the state machine and prompt lookup through one implementation's kernels
    (``"compiled"`` or ``"python"``), restoring the active ones afterwards."""
    saved = {attr: getattr(_impl, attr) for attr, _ in _KERNELS}
    try:
        for attr, mod in _KERNELS:
            setattr(_impl, attr, getattr(_impl.module(kind, mod), attr))
        yield
    finally:
        for attr, fn in saved.items():
            setattr(_impl, attr, fn)


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


# --------------------------------------------------------------------------------------
# progress
# --------------------------------------------------------------------------------------
class _Progress:
    """A one-line bar on stderr: ``[#####-----]  12/48 label``."""

    def __init__(self, total: int, stream: TextIO, enabled: bool) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.enabled = enabled
        self.label = ""
        self._last = 0.0

    def phase(self, label: str) -> None:
        self.label = label
        self._draw(force=True)

    def step(self, *_: Any) -> None:
        self.done += 1
        self._draw()

    def skip(self, n: int) -> None:
        self.done += n
        self._draw()

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        width = 30
        fill = width * self.done // self.total
        self.stream.write(
            f"\r[{'#' * fill}{'-' * (width - fill)}] {self.done:>{len(str(self.total))}}/{self.total} {self.label:<24}"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (48 + len(str(self.total)) * 2) + "\r")
            self.stream.flush()


# --------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------
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


def _run_batches(
    loop: SpeculativeLoop, requests: list[Request], batch: int, progress: _Progress, bonus: bool = False
) -> list[RequestResult]:
    """Run ``requests`` ``batch`` at a time: on the batch API (one ``BatchState.step`` per
    serving step) when the loop drafts with an n-gram index or not at all, else request by
    request (prompt lookup keeps a history per request)."""
    batched = loop.drafter is None or isinstance(loop.drafter, NgramDrafter)
    out: list[RequestResult] = []
    for i in range(0, len(requests), batch):
        chunk = requests[i : i + batch]
        if batched:
            out += loop.run_batched(chunk, on_done=progress.step, bonus=bonus)
        else:
            out += loop.run_batch(chunk, on_done=progress.step)
    return out


def replay(
    workload: Workload,
    drafter: str = DEFAULT_DRAFTER,
    k: int = 5,
    ngram: tuple[int, int | None] | None = None,
    rule: tuple[str, int] = ("exact", 0),
    batch: int = 8,
    repeat: int = 3,
    kinds: Sequence[str] | None = None,
    progress: _Progress | None = None,
    bonus: bool = False,
) -> dict[str, Any]:
    """Replay ``workload`` with speculation under each implementation in ``kinds`` and
    with plain greedy decoding; return the summary ``specfsm replay --json`` prints."""
    requests = _requests(workload)
    if ngram is None:
        ngram = default_ngram(drafter)
    if kinds is None:
        kinds, skipped = available_kinds()
    else:
        skipped = {}
    make_rule(rule)
    make_drafter(drafter, ngram)  # refuse bad combinations before any work
    bar = progress or _Progress(1, sys.stderr, False)

    bar.phase("plain greedy")
    greedy = _run_batches(SpeculativeLoop(None), requests, batch, bar)
    recorded = compare_outputs(greedy, [t.output for t in workload.traces])
    if recorded:  # the teacher-forced target is a greedy model of the recording
        raise RuntimeError(f"plain greedy replay departs from the recording: {recorded[:5]}")

    runs: dict[str, list[RequestResult]] = {}
    control: dict[str, float | None] = {}
    runs_done: dict[str, int] = {}
    for kind in kinds:
        bar.phase(f"speculative, {_LABELS[kind]}")
        best: float | None = None
        started = time.monotonic()
        for i in range(repeat):
            if i and time.monotonic() - started > _REPEAT_BUDGET_S:
                bar.skip((repeat - i) * len(requests))
                break
            runs_done[kind] = i + 1
            loop = SpeculativeLoop(None, make_drafter(drafter, ngram, kind), k, make_rule(rule))
            with routed(kind):
                results = _run_batches(loop, requests, batch, bar, bonus)
            ns = sum(r.stats.control_ns for r in results)
            toks = sum(r.stats.output_tokens for r in results)
            per = ns / 1e3 / toks
            if best is None or per < best:
                best, runs[kind] = per, results
        control[kind] = best
    for kind in skipped:
        control[kind] = None
    bar.close()

    first = runs[kinds[0]]
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
            "drafter": drafter,
            "ngram": list(ngram),
            "k": k,
            "rule": _rule_text(rule),
            "batch": batch,
            "repeat": repeat,
            "bonus": bonus,
        },
        "runs": runs_done,
        "requests": len(requests),
        "prompt_tokens": sum(s.prompt_tokens for s in stats),
        "output_tokens": out_tokens,
        "evaluations_greedy": ev_greedy,
        "evaluations_speculative": ev_spec,
        "evaluation_ratio": ev_greedy / ev_spec if ev_spec else 0.0,
        "tokens_per_evaluation": out_tokens / ev_spec if ev_spec else 0.0,
        "verifies": verifies,
        "rollbacks": sum(s.rollbacks for s in stats),
        "drafted": drafted,
        "accepted": accepted,
        "mean_accepted_length": accepted / verifies if verifies else 0.0,
        "mean_draft_length": drafted / verifies if verifies else 0.0,
        "drafted_by_position": dpos,
        "accepted_by_position": apos,
        "acceptance_by_position": [a / d if d else 0.0 for a, d in zip(apos, dpos)],
        "control_us_per_token": control,
        "skipped": skipped,
        "identical": identical,
        "implementations_agree": counts_agree,
        "mismatches": {kind: [list(m) for m in bad] for kind, bad in mismatches.items()},
        "per_request": [
            {
                "name": req.name,
                "prompt_tokens": s.prompt_tokens,
                "output_tokens": s.output_tokens,
                "evaluations_greedy": g.stats.evaluations,
                "evaluations_speculative": s.evaluations,
                "tokens_per_evaluation": s.tokens_per_evaluation,
                "mean_accepted_length": s.mean_accepted,
                "control_us_per_token": {kind: runs[kind][i].stats.control_us_per_token for kind in runs},
                "identical": all(runs[kind][i].output == g.output for kind in runs),
            }
            for i, (req, s, g) in enumerate(zip(requests, stats, greedy))
        ],
    }


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable table ``specfsm replay`` prints."""
    st = s["settings"]
    lo, hi = st["ngram"]
    ng = f"{lo}" if lo == hi else (f"{lo}.." if hi is None else f"{lo}..{hi}")
    drafter = _DRAFTER_LABELS.get(st["drafter"], st["drafter"])
    rows: list[tuple[str, str]] = [
        ("requests", _fmt_int(s["requests"])),
        ("prompt tokens", _fmt_int(s["prompt_tokens"])),
        ("output tokens", _fmt_int(s["output_tokens"])),
        ("target evaluations, plain greedy", _fmt_int(s["evaluations_greedy"])),
        (
            "target evaluations, speculative",
            f"{_fmt_int(s['evaluations_speculative'])}   ({s['evaluation_ratio']:.2f}x fewer; "
            f"{s['tokens_per_evaluation']:.2f} tokens per evaluation)",
        ),
        (
            "verify rounds",
            f"{_fmt_int(s['verifies'])}   ({_fmt_int(s['rollbacks'])} rolled back)",
        ),
        (
            "mean accepted length",
            f"{s['mean_accepted_length']:.2f} of {s['mean_draft_length']:.2f} drafted tokens per verify",
        ),
        (
            "acceptance by draft position",
            "  ".join(f"{i + 1}: {a:.0%}" for i, a in enumerate(s["acceptance_by_position"])) or "(no drafts)",
        ),
    ]
    cp = s["control_us_per_token"]
    for kind in ("compiled", "python"):
        if kind not in cp:
            continue
        v = cp[kind]
        if v is None:
            text = f"skipped: {s['skipped'].get(kind, 'not available')}"
        else:
            text = f"{v:.2f} µs/token"
            if kind == "python" and cp.get("compiled"):
                text += f"   ({v / cp['compiled']:.0f}x the compiled core)"
        rows.append((f"control plane, {_LABELS[kind]}", text))
    width = max(len(r[0]) for r in rows)
    head = (
        f"specfsm replay: {s['workload']['source']}\n"
        f"drafter {drafter} (n-gram {ng}), k {st['k']}, rule {st['rule']}, "
        f"batches of {st['batch']} requests\n"
    )
    body = "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
    measured = [k for k in ("compiled", "python") if cp.get(k) is not None]
    impls = " and ".join(_LABELS[k] for k in measured)
    if s["identical"]:
        tail = (
            f"identity: all {s['requests']} speculative outputs equal their plain greedy "
            f"outputs ({impls})"
        )
    else:
        bad = {k: len(v) for k, v in s["mismatches"].items() if v}
        tail = "IDENTITY FAILED: " + (
            ", ".join(f"{n} requests differ from plain greedy ({_LABELS[k]})" for k, n in bad.items())
            or "the implementations took different decisions"
        )
    return f"{head}\n{body}\n\n{tail}\n"


def plot_acceptance(s: dict[str, Any], path: str) -> None:
    """Acceptance by draft position as a bar chart in a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = s["acceptance_by_position"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(range(1, len(acc) + 1), [a * 100 for a in acc], color="#4477aa")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted (%)")
    ax.set_ylim(0, 100)
    ax.set_xticks(range(1, len(acc) + 1))
    st = s["settings"]
    ax.set_title(
        f"{s['requests']} requests, {st['drafter']} drafter, k={st['k']}, "
        f"{s['tokens_per_evaluation']:.2f} tokens/evaluation",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specfsm", description="specfsm: a control plane for speculative decoding.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    r = sub.add_parser(
        "replay",
        help="replay recorded requests through the speculative serving loop",
        description=(
            "Replay recorded requests through the speculative serving loop against a "
            "teacher-forced target, and report target evaluations saved, acceptance and "
            "control-plane time with the compiled core and the pure-Python twin. Without "
            "--workload, uses code-editing requests built from this Python's standard library."
        ),
    )
    r.add_argument(
        "--workload",
        metavar="FILE.jsonl",
        help=(
            "'smollm2' (SmolLM2-135M-Instruct's recorded greedy outputs, shipped with the package) or "
            "a file: one JSON object per line: {\"prompt\": [ids], \"output\": [ids]} (optional \"eos\", "
            f"\"name\"); at most {MAX_LINE_BYTES >> 20} MiB per line. A file with an unreadable "
            "line (not UTF-8, not JSON, too deeply nested, an integer too long, a line over "
            "the limit, a bad request) is refused with its file:line and exit status 2"
        ),
    )
    r.add_argument("--drafter", choices=DRAFTERS, default=DEFAULT_DRAFTER, help=(
        "suffix (default): the longest earlier match of the history's suffix, any length (SuffixIndex); "
        "suffix-shared: the same, also drafting from earlier requests' outputs (SharedSuffixCache); "
        "ngram: the incremental n-gram index; prompt: prompt lookup (a rescan per step); "
        "arctic: Snowflake Arctic's suffix decoding, when arctic-inference is installed"))
    r.add_argument("--k", type=_positive, default=5, help="most tokens per draft (default 5)")
    r.add_argument("--ngram", type=_parse_ngram, default=None, metavar="N|MIN:MAX", help="n-gram length: for prompt one N (default 3); for ngram a MIN:MAX range, longest match first (default 2:4); for suffix a minimum match N or MIN:MAX (default 1, no maximum)")
    r.add_argument("--rule", type=_parse_rule, default=("exact", 0), metavar="RULE", help="acceptance rule: exact (default), minrun:M, speculative[:SEED] (rejection sampling; the teacher-forced target gives one-hot rows) or typical")
    r.add_argument("--bonus", action="store_true", help="verify a K-token draft with K + 1 rows, so a fully accepted draft emits K + 1 tokens (the batch API's option; needs --drafter ngram)")
    r.add_argument("--requests", type=_positive, default=None, help="replay only this many requests (default: 24 embedded, or the whole file)")
    r.add_argument("--batch", type=_positive, default=8, help="requests stepping together (default 8)")
    r.add_argument("--repeat", type=_positive, default=3, help="runs per implementation, fewer once one has taken 2 s (default 3); the fastest control-plane time is reported")
    r.add_argument("--impl", choices=("both", "compiled", "python"), default="both", help="implementations to measure (default both); compiled needs every kernel module compiled (see specfsm.extensions())")
    r.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    r.add_argument("--progress", action="store_true", help="show a progress bar on stderr even when it is not a terminal")
    r.add_argument("--plot", metavar="FILE.png", help="write acceptance by draft position as a PNG (needs matplotlib)")
    from .hf import cli as hf_cli  # imports neither torch nor transformers until it runs

    hf_cli.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in ("generate", "record"):
        return args.hf_main(args)
    if args.command != "replay":
        parser.print_help(sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "specfsm replay: --plot needs matplotlib, which is not installed "
                "(pip install 'specfsm[plot]' or pip install matplotlib)",
                file=sys.stderr,
            )
            return 2
    ngram = args.ngram or default_ngram(args.drafter)
    try:
        make_drafter(args.drafter, ngram)
        if args.bonus and args.drafter != "ngram":
            raise UsageError("--bonus runs on the batch API, which drafts with an index per request: use it with --drafter ngram")
        if args.workload:
            workload = load_jsonl(SHIPPED_WORKLOADS.get(args.workload, args.workload))
            if args.requests is not None and args.requests < len(workload):
                total = len(workload)
                workload.traces = workload.traces[: args.requests]
                workload.source += f", first {args.requests} replayed"
                workload.details["requests_in_file"] = total
        else:
            workload = stdlib_workload(args.requests)
        kinds, skipped = available_kinds()
        if args.impl != "both":
            if args.impl not in kinds:
                raise UsageError(f"--impl {args.impl}: the {_LABELS[args.impl]} is {skipped[args.impl]}")
            kinds = [args.impl]
            skipped = {}
        show = args.progress or _isatty(sys.stderr)
        n_runs = 1 + len(kinds) * args.repeat
        bar = _Progress(n_runs * len(workload), sys.stderr, show)
        summary = replay(
            workload,
            drafter=args.drafter,
            k=args.k,
            ngram=ngram,
            rule=args.rule,
            batch=args.batch,
            repeat=args.repeat,
            kinds=kinds,
            progress=bar,
            bonus=args.bonus,
        )
        summary["skipped"] = skipped
        for kind in skipped:
            summary["control_us_per_token"][kind] = None
    except (UsageError, WorkloadError) as exc:
        print(f"specfsm replay: {exc}", file=sys.stderr)
        return 2
    except TraceError as exc:  # speculation fed the target a token greedy never produced
        print(
            f"specfsm replay: IDENTITY FAILED: speculative decoding departed from the recording: {exc}",
            file=sys.stderr,
        )
        return 1
    if args.plot:
        plot_acceptance(summary, args.plot)
    try:
        if args.json:
            json.dump(summary, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(format_summary(summary))
            if args.plot:
                print(f"acceptance by draft position written to {args.plot}")
        sys.stdout.flush()
    except BrokenPipeError:  # `specfsm replay | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0 if summary["identical"] else 1


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
