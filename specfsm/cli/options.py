"""Option parsing for the ``specfsm`` command: the ``replay`` sub-command's parser and its
argument types (``generate`` and ``record`` add theirs from ``specfsm.hf.cli``; the usage
error and the shared argument types are in ``specfsm._cli_args``)."""

from __future__ import annotations

import argparse
import os

from .._cli_args import COUNT_MAX, MAX_BATCH, MAX_K, MAX_MATCH, MAX_SEED, SubcommandParser, UsageError, int_range
from ..drafting._checks import MAX_LEVELS
from ..serving.workload import DEFAULT_REQUESTS, MAX_LINE_BYTES

__all__ = ["UsageError", "build_parser", "check_plot_path", "rule_text"]

DRAFTERS = ("suffix", "suffix-tree", "suffix-shared", "ngram", "prompt", "arctic")
DEFAULT_DRAFTER = "suffix"


#: the argparse types of replay's numeric options (``specfsm._cli_args`` says where each
#: bound comes from)
_k = int_range(1, MAX_K)
_batch = int_range(1, MAX_BATCH)
_count = int_range(1, COUNT_MAX)
_length = int_range(1, MAX_MATCH)
_run = int_range(1, MAX_K)  # minrun:M: a draft of at most MAX_K tokens never matches more
_seed = int_range(0, MAX_SEED)


def _parse_ngram(text: str) -> tuple[int, int]:
    parts = text.replace("-", ":").split(":")
    if len(parts) > 2 or not all(p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}")
    try:
        nums = [_length(p) for p in parts]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX: each {exc}") from None
    if len(nums) == 1:
        nums = nums * 2
    if nums[0] > nums[1]:
        raise argparse.ArgumentTypeError(
            f"expected N or MIN:MAX with MIN <= MAX, got {text!r}"
        )
    return nums[0], nums[1]


def _parse_rule(text: str) -> tuple[str, int]:
    name, _, arg = text.partition(":")
    name = name.strip().lower()
    if name in ("exact", "typical") and not arg:
        return name, 0
    if name == "minrun":
        try:
            return "minrun", _run(arg)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"minrun:M (as in minrun:3): M {exc}") from None
    if name == "speculative":
        try:
            return "speculative", _seed(arg) if arg else 0
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"speculative:SEED (as in speculative:7): SEED {exc}") from None
    raise argparse.ArgumentTypeError(f"expected exact, minrun:M, speculative[:SEED] or typical; got {text!r}")


def rule_text(spec: tuple[str, int]) -> str:
    """A parsed ``--rule`` as the user would write it."""
    name, arg = spec
    if name == "minrun":
        return f"minrun:{arg}"
    if name == "speculative":
        return f"speculative:{arg}"
    return name


def check_plot_path(path: str) -> None:
    """Refuse a ``--plot`` path that cannot take the PNG (a directory, a missing parent
    directory, another extension) or a missing matplotlib, before any replay work."""
    if os.path.isdir(path):
        raise UsageError(f"--plot {path}: is a directory; give a file name ending in .png")
    if os.path.splitext(path)[1].lower() != ".png":
        raise UsageError(f"--plot {path}: the plot is a PNG; give a file name ending in .png")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"--plot {path}: the directory {parent} does not exist")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib, which is not installed "
            "(pip install 'specfsm[plot]' or pip install matplotlib)"
        ) from None


def _version() -> str:
    from .. import __version__

    return f"specfsm {__version__}"


def build_parser() -> argparse.ArgumentParser:
    """The ``specfsm`` parser with every sub-command."""
    p = argparse.ArgumentParser(prog="specfsm", description="specfsm: a control plane for speculative decoding.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=SubcommandParser)
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
            "the limit, a bad request, an empty prompt or output, an id or eos outside 0..2**63-1) is "
            "refused with its file:line and exit status 2. (The state machine accepts an empty "
            "prompt, as the original design does; the CLI refuses it as bad input.)"
        ),
    )
    r.add_argument("--drafter", choices=DRAFTERS, default=DEFAULT_DRAFTER, help=(
        "suffix (default): the longest earlier match of the history's suffix, any length (SuffixIndex); "
        "suffix-tree: the same index's trees of at most --k nodes, verified in one evaluation each "
        "(SuffixIndex.propose_tree; greedy, --rule exact, always with the bonus row); "
        "suffix-shared: the same, also drafting from earlier requests' outputs (SharedSuffixCache); "
        "ngram: the incremental n-gram index; prompt: prompt lookup (a rescan per step); "
        "arctic: Snowflake Arctic's suffix decoding, when arctic-inference is installed"))
    r.add_argument("--k", type=_k, default=5, help=f"most tokens per draft, 1..{MAX_K} (the batch's limit; default 5)")
    r.add_argument("--ngram", type=_parse_ngram, default=None, metavar="N|MIN:MAX", help=f"n-gram length: for prompt one N (default 3); for ngram a MIN:MAX range, longest match first (default 2:4); for suffix a minimum match N or MIN:MAX (default 1, no maximum); each length 1..{MAX_MATCH}, and --drafter ngram keeps at most {MAX_LEVELS} lengths")
    r.add_argument("--rule", type=_parse_rule, default=("exact", 0), metavar="RULE", help=f"acceptance rule: exact (default), minrun:M (M 1..{MAX_K}), speculative[:SEED] (rejection sampling; the teacher-forced target gives one-hot rows; SEED 0..2**64-1) or typical")
    r.add_argument("--bonus", action="store_true", help="verify a K-token draft with K + 1 rows, so a fully accepted draft emits K + 1 tokens (the batch API's option; with --drafter suffix or ngram)")
    r.add_argument("--requests", type=_count, default=None, metavar="N", help=(
        "how many requests: for a --workload file its first N (default all); for the embedded "
        f"workload N code edits, one per standard-library module, evenly spaced over this Python's "
        f"usable modules (default {DEFAULT_REQUESTS}; 74 modules on CPython 3.11); at most {COUNT_MAX}. Asking for more "
        "than the workload holds replays all of them, with a note"))
    r.add_argument("--batch", type=_batch, default=8, help=f"requests stepping together, 1..{MAX_BATCH} (default 8)")
    r.add_argument("--repeat", type=_count, default=3, help=f"runs per implementation, fewer once one has taken 2 s (default 3); the fastest control-plane time is reported; at most {COUNT_MAX}")
    r.add_argument("--impl", choices=("both", "compiled", "python"), default="both", help="implementations to measure (default both); compiled needs every kernel module compiled (see specfsm.extensions())")
    r.add_argument("--json", action="store_true", help="print the summary as JSON instead of the table")
    r.add_argument("--progress", action="store_true", help="show a progress bar on stderr even when it is not a terminal")
    r.add_argument("--plot", metavar="FILE.png", help="write acceptance by draft position as a PNG (needs matplotlib); the path is checked before the replay")
    from ..hf import cli as hf_cli  # imports neither torch nor transformers until it runs

    hf_cli.add_parsers(sub)
    return p
