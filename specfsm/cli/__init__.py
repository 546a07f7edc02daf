"""``specfsm`` command line: ``specfsm replay`` drives recorded requests through the
speculative serving loop and reports what speculation saved and what the control plane
cost, with the compiled core and with the pure-Python twin; ``specfsm generate`` and
``specfsm record`` (``specfsm.hf.cli``) run a Hugging Face model. This module is the
entry point (``main``); its parts are ``options`` (parsing), ``orchestrate`` (the
replay runs and the summary), ``summary`` (the table), ``progress`` (the bar) and
``plot`` (the ``--plot`` figure).

Exit status: 0 when every speculative output equals its plain greedy output, 1 when one
does not, 2 for a usage error (a bad ``--plot`` path is refused before the replay), a
workload that cannot be read (every unreadable line is named as ``file:line``; a line
may hold at most ``specfsm.serving.workload.MAX_LINE_BYTES`` bytes, 64 MiB, and is read in
bounded chunks), ``--impl compiled`` when some kernel module is not compiled, and a
plot that could not be written after the results were printed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from ..serving.loop import TraceError
from ..serving.workload import WorkloadError, load_jsonl, stdlib_workload
from . import plot
from .options import DEFAULT_DRAFTER, DRAFTERS, UsageError, build_parser, check_plot_path
from .orchestrate import SHIPPED_WORKLOADS, available_kinds, default_ngram, make_drafter, make_rule, replay
from .progress import Progress, isatty
from .summary import LABELS, format_summary, plural

__all__ = ["main", "replay"]

# the names this module held before it became a package
_parser = build_parser
_Progress = Progress
_isatty = isatty
plot_acceptance = plot.plot_acceptance


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("generate", "record"):
        return args.hf_main(args)
    if args.command != "replay":
        parser.print_help(sys.stderr)
        return 2
    ngram = args.ngram or default_ngram(args.drafter)
    notes: list[str] = []
    try:
        if args.plot:
            check_plot_path(args.plot)
        make_drafter(args.drafter, ngram)
        if args.bonus and args.drafter not in ("ngram", "suffix", "suffix-tree"):
            raise UsageError(
                "--bonus runs on the batch API, which drafts with an index per request: "
                "use it with --drafter suffix or --drafter ngram"
            )
        if args.workload:
            workload = load_jsonl(SHIPPED_WORKLOADS.get(args.workload, args.workload))
            if args.requests is not None and args.requests < len(workload):
                total = len(workload)
                workload.traces = workload.traces[: args.requests]
                workload.source += f", first {args.requests} replayed"
                workload.details["requests_in_file"] = total
        else:
            workload = stdlib_workload(args.requests)
        if args.requests is not None and args.requests > len(workload):
            holds = (
                f"the workload holds {plural(len(workload), 'request')}" if args.workload else
                f"the embedded workload holds {plural(len(workload), 'request')} on this Python "
                "(one per usable standard-library module)"
            )
            notes.append(
                f"--requests {args.requests}: {holds}; "
                f"replaying {'it' if len(workload) == 1 else 'all of them'}"
            )
            print(f"specfsm replay: note: {notes[-1]}", file=sys.stderr)
        kinds, skipped = available_kinds()
        if args.impl != "both":
            if args.impl not in kinds:
                raise UsageError(f"--impl {args.impl}: the {LABELS[args.impl]} is {skipped[args.impl]}")
            kinds = [args.impl]
            skipped = {}
        show = args.progress or isatty(sys.stderr)
        n_runs = 1 + len(kinds) * args.repeat
        bar = Progress(n_runs * len(workload), sys.stderr, show)
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
        summary["notes"] = notes
    except (UsageError, WorkloadError) as exc:
        print(f"specfsm replay: {exc}", file=sys.stderr)
        return 2
    except TraceError as exc:  # speculation fed the target a token greedy never produced
        print(
            f"specfsm replay: IDENTITY FAILED: speculative decoding departed from the recording: {exc}",
            file=sys.stderr,
        )
        return 1
    status = 0 if summary["identical"] else 1
    try:
        if args.json:
            json.dump(summary, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(format_summary(summary))
        sys.stdout.flush()
    except BrokenPipeError:  # `specfsm replay | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    if args.plot:  # after the results are out, so a plotting error cannot lose them
        try:
            plot.plot_acceptance(summary, args.plot)
        except Exception as exc:  # noqa: BLE001 - any plotting failure is reported, not raised
            print(f"specfsm replay: --plot {args.plot}: the plot was not written: {exc}", file=sys.stderr)
            return 2
        if not args.json:
            print(f"acceptance by draft position written to {args.plot}")
    return status
