"""Replay workloads: recorded requests (prompt and output token ids) for ``specfsm replay``.

The embedded default is built at run time from CPython's own standard-library sources, so
it needs no download: each request is a code edit, its prompt a module's source and its
output the same source with a few of the module's own function and class names renamed,
both split by a small deterministic tokenizer. ``load_jsonl`` reads a user's traces.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Trace",
    "Workload",
    "WorkloadError",
    "tokenize",
    "Vocabulary",
    "rename_edit",
    "stdlib_workload",
    "load_jsonl",
    "read_jsonl",
    "DEFAULT_REQUESTS",
    "MAX_LINE_BYTES",
    "stdlib_dir",
    "defined_names",
    "candidate_files",
    "trace_ids",
]

DEFAULT_REQUESTS = 24
_MIN_BYTES = 4_000
_MAX_BYTES = 24_000
_RENAMES = 3
_INT64_MAX = 2**63 - 1
MAX_LINE_BYTES = 64 << 20  # longest line ``load_jsonl`` reads: one request, 64 MiB of JSON


class WorkloadError(ValueError):
    """A workload that cannot be replayed: a bad JSONL file (the message names the file
    and every offending line) or no standard-library sources to build the default from."""


@dataclass(frozen=True)
class Trace:
    """One recorded request: ``prompt`` and the ``output`` a greedy model produced."""

    prompt: list[int]
    output: list[int]
    name: str = ""
    eos: int | None = None


@dataclass
class Workload:
    traces: list[Trace]
    source: str
    details: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.traces)


# --------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into words, whitespace runs and single punctuation characters.
    Lossless: ``"".join(tokenize(text)) == text``."""
    return _TOKEN.findall(text)


class Vocabulary:
    """Token strings to ids: the sorted set of every token the workload uses, so the same
    texts always give the same ids."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.strings = sorted(set(tokens))
        self.ids = {s: i for i, s in enumerate(self.strings)}

    def __len__(self) -> int:
        return len(self.strings)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        ids = self.ids
        return [ids[t] for t in tokens]

    def decode(self, ids: Iterable[int]) -> str:
        s = self.strings
        return "".join(s[i] for i in ids)


# --------------------------------------------------------------------------------------
# the embedded default workload
# --------------------------------------------------------------------------------------
def stdlib_dir() -> str:
    """This Python's standard-library directory (where the embedded workload is built from)."""
    return sysconfig.get_paths()["stdlib"]


def defined_names(tree: ast.AST) -> set[str]:
    """The function and class names a module defines (dunder names left out): the names an edit renames."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not (node.name.startswith("__") and node.name.endswith("__")):
                names.add(node.name)
    return names


def rename_edit(tokens: Sequence[str], names: set[str], count: int = _RENAMES) -> tuple[list[str], dict[str, str]]:
    """The deterministic edit: rename the ``count`` names from ``names`` used most often
    in ``tokens`` (ties broken by name) to ``<name>_v2``, everywhere they occur as a word."""
    uses = Counter(t for t in tokens if t in names)
    chosen = sorted(uses, key=lambda n: (-uses[n], n))[:count]
    mapping = {n: f"{n}_v2" for n in chosen}
    return [mapping.get(t, t) for t in tokens], mapping


def candidate_files(root: str) -> list[str]:
    """The standard-library modules under ``root`` an edit prompt can be built from, sorted."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".py") or name.startswith("_"):
            continue
        path = os.path.join(root, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if _MIN_BYTES <= size <= _MAX_BYTES:
            out.append(path)
    return out


def stdlib_workload(requests: int | None = None, root: str | None = None) -> Workload:
    """Code-editing requests built from standard-library modules.

    Takes the top-level public ``.py`` modules of 4-24 kB in ``root`` (default: this
    Python's stdlib), sorted by name, and picks ``requests`` of them evenly spaced
    (default ``DEFAULT_REQUESTS``, 24), or all of them when there are fewer (74 on
    CPython 3.11, so ``requests=100`` gives 74 requests). Each must parse and define a function or class; its prompt is the
    source and its output the source after ``rename_edit``. Raises ``WorkloadError``
    when no usable source files are found (for example a Python without its .py files).
    """
    n = DEFAULT_REQUESTS if requests is None else requests
    if type(n) is not int or n < 1:
        raise ValueError(f"requests must be a positive integer, got {requests!r}")
    root = stdlib_dir() if root is None else root
    usable: list[tuple[str, list[str], list[str], dict[str, str]]] = []
    for path in candidate_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        names = defined_names(tree)
        if not names:
            continue
        toks = tokenize(text)
        edited, mapping = rename_edit(toks, names)
        usable.append((os.path.basename(path), toks, edited, mapping))
    if not usable:
        raise WorkloadError(
            f"no standard-library sources found in {root!r} to build the default workload; "
            "pass --workload FILE.jsonl"
        )
    if n < len(usable):
        step = len(usable) / n
        usable = [usable[int(i * step)] for i in range(n)]
    vocab = Vocabulary(t for _, a, b, _ in usable for t in (*a, *b))
    traces = [
        Trace(vocab.encode(a), vocab.encode(b), name=name) for name, a, b, _ in usable
    ]
    return Workload(
        traces,
        source=f"embedded: code edits of {len(traces)} CPython standard-library module{'' if len(traces) == 1 else 's'}",
        details={
            "stdlib": root,
            "files": [u[0] for u in usable],
            "renames": {u[0]: u[3] for u in usable},
            "vocabulary": len(vocab),
        },
    )


# --------------------------------------------------------------------------------------
# user traces: JSON lines
# --------------------------------------------------------------------------------------
def trace_ids(value: Any, key: str) -> tuple[list[int] | None, str | None]:
    """``(ids, None)`` when ``value`` is a JSON list of token ids (ints in 0..2**63-1),
    else ``(None, message)`` naming ``key`` and the first bad entry."""
    if not isinstance(value, list):
        return None, f"{key!r} must be a list of token ids, got {type(value).__name__}"
    for i, x in enumerate(value):
        if type(x) is not int:
            return None, f"{key}[{i}] is not an integer token id: {_show(x)}"
        if x < 0 or x > _INT64_MAX:
            return None, f"{key}[{i}] = {_show(x)} is outside the token id range 0..2**63-1"
    return value, None


def _trace_from(obj: Any, lineno: int) -> tuple[Trace | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    missing = [k for k in ("prompt", "output") if k not in obj]
    if missing:
        return None, "missing field " + " and ".join(repr(k) for k in missing)
    prompt, err = trace_ids(obj["prompt"], "prompt")
    if err:
        return None, err
    output, err = trace_ids(obj["output"], "output")
    if err:
        return None, err
    if not prompt:
        return None, "'prompt' is empty (prefill needs at least one token)"
    if not output:
        return None, "'output' is empty (nothing to replay)"
    eos = obj.get("eos")
    if eos is not None:
        if type(eos) is not int or eos < 0:
            return None, f"'eos' must be a non-negative integer token id, got {_show(eos)}"
        if eos > _INT64_MAX:
            return None, f"'eos' = {_show(eos)} is outside the token id range 0..2**63-1"
        if eos in output[:-1]:
            return None, (
                f"'eos' {eos} occurs at output[{output.index(eos)}] before the end: "
                "a greedy model stops there"
            )
    name = obj.get("name", f"line {lineno}")
    if not isinstance(name, str):
        return None, f"'name' must be a string, got {type(name).__name__}"
    return Trace(prompt, output, name=name, eos=eos), None


def _show(value: Any, limit: int = 60) -> str:
    """A short JSON rendering of ``value`` for an error message."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _lines(f: Any, max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """``(line number, line)`` for each line of the binary file ``f``, reading at most
    ``max_line_bytes + 1`` bytes at a time; a longer line is skipped in bounded chunks and
    given as ``None``, so it is never held in memory whole."""
    chunk = 1 << 20
    lineno = 0
    while True:
        line = f.readline(max_line_bytes + 1)
        if not line:
            return
        lineno += 1
        if len(line) > max_line_bytes and not (len(line) == max_line_bytes + 1 and line.endswith(b"\n")):
            while not line.endswith(b"\n"):
                line = f.readline(chunk)
                if not line:
                    break
            yield lineno, None
        else:
            yield lineno, line


def read_jsonl(path: str, what: str, parse: Callable[[Any, int], tuple[Any, str | None]],
               max_errors: int = 20, max_line_bytes: int = MAX_LINE_BYTES) -> list[Any]:
    """Every line of the JSON-lines file ``path`` (``what`` it holds: ``"workload"``,
    ``"prompts"``) parsed by ``parse(obj, lineno) -> (item, error)``; blank lines skipped.
    All or nothing: a file with bad lines (not UTF-8, not readable JSON, longer than
    ``max_line_bytes`` bytes, or refused by ``parse``) raises ``WorkloadError`` naming
    each as ``file:line`` (up to ``max_errors``, then a count); so does a file that
    holds no item."""
    if type(max_line_bytes) is not int or max_line_bytes < 1:
        raise ValueError(f"max_line_bytes must be a positive integer, got {max_line_bytes!r}")
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise WorkloadError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
    items: list[Any] = []
    errors: list[str] = []
    with f:
        lineno = 0
        try:
            for lineno, raw in _lines(f, max_line_bytes):
                obj, err = _json_line(raw, max_line_bytes)
                if err is None and obj is not None:
                    item, err = parse(obj, lineno)
                    if err is None:
                        items.append(item)
                if err is not None:
                    errors.append(f"{path}:{lineno}: {err}")
        except OSError as exc:
            errors.append(f"{path}:{lineno + 1}: cannot read ({exc.strerror or exc})")
    verb = "have" if what == "prompts" else "has"
    if errors:
        shown = errors[:max_errors]
        more = len(errors) - len(shown)
        tail = f"\n... and {more} more bad lines" if more else ""
        note = " (nothing was replayed)" if what == "workload" else ""
        raise WorkloadError(
            f"{what} {path!r} {verb} {len(errors)} bad line{'s' if len(errors) != 1 else ''}{note}:\n"
            + "\n".join(shown) + tail
        )
    if not items:
        raise WorkloadError(f"{what} {path!r} {'hold' if what == 'prompts' else 'holds'} no requests (every line is blank)")
    return items


def _json_line(raw: bytes | None, max_line_bytes: int) -> tuple[Any, str | None]:
    """One line as a JSON value, ``(None, None)`` for a blank line, or ``(None, why not)``."""
    if raw is None:
        return None, f"line longer than {max_line_bytes} bytes (the limit on one request's line; not read)"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text ({exc.reason} at byte {exc.start + 1})"
    if not line.strip():
        return None, None
    try:
        return json.loads(line), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})"
    except RecursionError:
        return None, "not readable JSON (nested too deeply)"
    except ValueError as exc:  # e.g. an integer longer than int's digit limit
        return None, f"not readable JSON ({exc})"


def load_jsonl(
    path: str | os.PathLike[str], max_errors: int = 20, max_line_bytes: int = MAX_LINE_BYTES
) -> Workload:
    """Read one request per line: a JSON object with ``prompt`` and ``output`` (lists of
    integer token ids in 0..2**63-1, neither empty), optionally ``eos`` (an id in the same
    range that may only end the output) and ``name``. Blank lines are skipped; other keys
    are ignored. An empty prompt is a bad line: the state machine accepts an empty prompt,
    as its design says; the CLI refuses it as bad input.

    Every line is checked: a file with bad lines raises ``WorkloadError`` naming each of
    them as ``file:line`` (up to ``max_errors``, then a count), never returning the good
    part alone. A line is bad when it is not UTF-8, not JSON (including JSON nested too
    deeply for the parser and integers with more digits than Python converts), not a
    valid request, or longer than ``max_line_bytes`` bytes (default ``MAX_LINE_BYTES``,
    64 MiB, newline excluded): lines are read in bounded chunks, so an overlong line is
    skipped without ever being held in memory whole.
    """
    path = os.fspath(path)
    traces = read_jsonl(path, "workload", _trace_from, max_errors, max_line_bytes)
    return Workload(traces, source=f"file: {path} ({len(traces)} request{'' if len(traces) == 1 else 's'})", details={"path": path})


def _tokens(n: int) -> str:
    return f"{n} token{'' if n == 1 else 's'}"


# --------------------------------------------------------------------------------------
# the teacher-forced target (specfsm.serving.loop names it among its own)
# --------------------------------------------------------------------------------------
__all__ += ["TeacherForcedTarget", "TeacherForcedBatch", "TraceError"]


class TraceError(ValueError):
    """A teacher-forced target was asked something its recording cannot answer: an input
    that departs from the recording where the loop should only feed confirmed tokens, a
    cache from a row past a rejected draft token, or a position past the recording's end."""


class TeacherForcedTarget:
    """A target that answers from a recording: ``prompt`` followed by ``continuation``,
    the tokens a greedy model produced. It is what that model would answer on every
    evaluation the loop can legitimately make, so drafters can be evaluated on traces.

    The cache is the number of tokens consumed (``None`` before prefill). An input row
    at position ``p`` that equals the recording there is *on trace* and answers the
    recorded token at ``p + 1`` with cache ``p + 1``. Once a row's input departs from the
    recording (a wrong draft token), that row and every later row of the same evaluation
    are *off trace*: they answer ``off_trace`` (default -1, never a real id) with cache
    -1, so no acceptance rule can confirm a token after a divergence by coincidence.
    Rows past the recording's end answer the same. Refuses (``TraceError``) a prefill
    that is not the recorded prompt, a first row that departs from the recording (the
    loop fed an unconfirmed token), a cache of -1 (the loop resumed past a rejected row),
    and a first row past the recording's end.

    For the sampling rules the target also answers ``evaluate_probs(inputs, cache) ->
    (row_tokens, row_probs, row_caches)``, ``row_probs`` a float64 array of one row per
    input over ``vocab`` ids (default: the largest recorded id + 2). With
    ``temperature=0`` (the default) each row is one-hot on its row token (an off-trace
    row on id ``vocab - 1``), so every rule reproduces greedy decoding. With
    ``temperature > 0`` the target is *positional*: the row for position ``q`` is the
    recorded token ``sequence[q + 1]`` smoothed as ``softmax(onehot / temperature)``
    over ``vocab`` ids, whatever the inputs (a sampled token that departs from the
    recording is answered, not refused), so a sampling rule's emitted tokens can be
    checked against that known distribution.

    A row is dense, so ``evaluate_probs`` refuses (ValueError naming the vocabulary and
    ``MAX_VOCAB``, 2**22 ids: 32 MiB a row) a vocabulary larger than that, as the default
    one is for a recording with large ids; ``specfsm replay`` first maps a workload's ids
    to a compact vocabulary (``specfsm.cli.orchestrate.compact_ids``).
    """

    __slots__ = ("sequence", "prompt_len", "off_trace", "vocab", "temperature")

    #: the largest vocabulary ``evaluate_probs`` builds dense rows for
    MAX_VOCAB = 1 << 22

    def __init__(
        self, prompt: Sequence[Any], continuation: Sequence[Any], off_trace: Any = -1, *,
        vocab: int | None = None, temperature: float = 0.0,
    ) -> None:
        if len(prompt) == 0:
            raise ValueError("prompt must hold at least one token")
        self.sequence = list(prompt) + list(continuation)
        self.prompt_len = len(prompt)
        self.off_trace = off_trace
        t = float(temperature)
        if not (t >= 0.0 and t < float("inf")):
            raise ValueError(f"temperature must be finite and non-negative, got {temperature!r}")
        self.temperature = t
        if vocab is None:
            ids = [x for x in self.sequence if type(x) is int]
            vocab = (max(ids) + 2) if ids else 2
        if type(vocab) is not int or vocab < 2:
            raise ValueError(f"vocab must be an int of at least 2, got {vocab!r}")
        self.vocab = vocab

    def evaluate_probs(self, inputs: Sequence[Any], cache: Any) -> tuple[list[Any], Any, list[Any]]:
        """``evaluate`` with one probability row per input (see the class docstring)."""
        import numpy as np

        v = self.vocab
        if v > self.MAX_VOCAB:
            ids = [x for x in self.sequence if type(x) is int]
            largest = f"the recording's largest id is {max(ids)}; " if ids else ""
            raise ValueError(
                f"vocab={v} is too large for dense probability rows ({largest}the limit is "
                f"MAX_VOCAB={self.MAX_VOCAB} ids): map the ids to a compact vocabulary first, "
                "as specfsm replay does"
            )
        rows, caches = self.evaluate(inputs, cache)
        probs = np.zeros((len(rows), v), dtype=np.float64)
        if self.temperature == 0.0:
            for i, t in enumerate(rows):
                probs[i, t if (type(t) is int and 0 <= t < v - 1) else v - 1] = 1.0
            return rows, probs, caches
        hi = np.exp(1.0 / self.temperature) if self.temperature > 1e-3 else np.inf
        if hi == np.inf:
            lo_p, hi_p = 0.0, 1.0
        else:
            lo_p, hi_p = 1.0 / (hi + v - 1), hi / (hi + v - 1)
        probs.fill(lo_p)
        for i, t in enumerate(rows):
            if not (type(t) is int and 0 <= t < v):
                raise TraceError(f"recorded token {t!r} is outside vocab={v}")
            probs[i, t] = hi_p
        return rows, probs, caches

    def evaluate(self, inputs: Sequence[Any], cache: Any) -> tuple[list[Any], list[Any]]:
        seq = self.sequence
        end = len(seq)
        n = len(inputs)
        pos = 0 if cache is None else cache
        if type(pos) is not int:
            raise TraceError(f"cache must be None or a position (int), got {type(cache).__name__}")
        if pos < 0:
            raise TraceError(
                "evaluation from cache -1: the loop resumed from a row past a rejected draft token"
            )
        if pos == 0:
            if list(inputs) != seq[: self.prompt_len]:
                raise TraceError("prefill inputs are not the recorded prompt")
            if end <= n:
                raise TraceError("the recording has no continuation tokens to answer prefill with")
            return seq[1 : n + 1], list(range(1, n + 1))
        if pos + 1 >= end:
            raise TraceError(
                f"asked for the token after position {pos}, past the recording's "
                f"{end - self.prompt_len} continuation token{'' if end - self.prompt_len == 1 else 's'}"
            )
        if self.temperature > 0.0:  # positional: every row answers its position
            if pos + n >= end:
                raise TraceError(
                    f"asked for {n} rows after position {pos}, past the recording's "
                    f"{end - self.prompt_len} continuation token{'' if end - self.prompt_len == 1 else 's'}"
                )
            return seq[pos + 1 : pos + 1 + n], list(range(pos + 1, pos + 1 + n))
        if inputs[0] != seq[pos]:
            raise TraceError(
                f"input {inputs[0]!r} at position {pos} departs from the recorded "
                f"{seq[pos]!r}: the loop fed a token the target never confirmed"
            )
        # rows on trace: inputs[0..m-1] match seq[pos..pos+m-1]
        m = 1
        limit = min(n, end - pos)
        while m < limit and inputs[m] == seq[pos + m]:
            m += 1
        hi = min(pos + m + 1, end)
        rows = seq[pos + 1 : hi]
        caches = list(range(pos + 1, pos + 1 + len(rows)))
        if n > len(rows):
            rows += [self.off_trace] * (n - len(rows))
            caches += [-1] * (n - len(caches))
        return rows, caches

    def evaluate_tree(self, inputs: Sequence[Any], parents: Sequence[int], cache: Any) -> tuple[list[Any], list[Any]]:
        """One tree evaluation (``specfsm.tree``'s format): ``inputs[0]`` is the last
        confirmed token, at position ``cache``; ``inputs[i + 1]`` is node ``i``, whose
        parent is ``parents[i]`` (-1: the root), at its depth's position. A row is on
        trace when the path from the root to it is the recording: it answers the
        recorded token after it with that position as its cache; every other row, and
        a row past the recording's end, answers ``off_trace`` with cache -1. Greedy
        only (``temperature`` 0). Refuses what ``evaluate`` refuses for the first row,
        and parents that are not a tree of ``len(inputs) - 1`` nodes (ValueError)."""
        if self.temperature > 0.0:
            raise TraceError("a tree evaluation answers greedily: this target samples (temperature > 0)")
        n = len(inputs) - 1
        par = [int(p) for p in parents]
        if len(par) != n:
            raise ValueError(f"a tree of {n} nodes needs {n} parents, got {len(par)}")
        for i, p in enumerate(par):
            if not -1 <= p < i:
                raise ValueError(f"parents[{i}] = {p}: a node's parent must come before it (or be -1, the root)")
        if cache is None or cache == 0:
            raise TraceError("a tree is evaluated after prefill, from a position past the prompt's start")
        root_rows, root_caches = self.evaluate(inputs[:1], cache)
        pos = cache
        seq = self.sequence
        end = len(seq)
        rows = root_rows + [self.off_trace] * n
        caches = root_caches + [-1] * n
        depth = [0] * n
        on = [False] * n
        for i, p in enumerate(par):
            d = depth[i] = 1 if p < 0 else depth[p] + 1
            q = pos + d      # the node's position
            if (p < 0 or on[p]) and q < end and inputs[i + 1] == seq[q]:
                on[i] = True
                if q + 1 < end:
                    rows[i + 1] = seq[q + 1]
                    caches[i + 1] = q + 1
        return rows, caches

    def __repr__(self) -> str:
        return (
            f"TeacherForcedTarget(prompt={_tokens(self.prompt_len)}, "
            f"continuation={_tokens(len(self.sequence) - self.prompt_len)})"
        )



class TeacherForcedBatch:
    """One shared target over several recordings, for a serving loop that evaluates
    trees (``serve`` passes a step's tree parents to one shared ``evaluate_batch``).
    Request ``i`` answers from ``targets[i]`` (``TeacherForcedTarget``s); its cache is
    ``(i, position)``, so requests start from ``cache=(i, None)`` (``requests``). A slot
    with parents is a tree (``TeacherForcedTarget.evaluate_tree``), else rows as
    ``evaluate``. Refuses a cache that is not such a pair (TraceError)."""

    __slots__ = ("targets",)

    def __init__(self, targets: Sequence[TeacherForcedTarget]) -> None:
        self.targets = list(targets)

    def _target(self, cache: Any) -> tuple[int, Any]:
        if type(cache) is not tuple or len(cache) != 2 or type(cache[0]) is not int or not (
                0 <= cache[0] < len(self.targets)):
            raise TraceError(f"cache must be (request, position) for one of {len(self.targets)} recordings, got {cache!r}")
        return cache

    def evaluate(self, inputs: Sequence[Any], cache: Any) -> tuple[list[Any], list[Any]]:
        i, pos = self._target(cache)
        rows, caches = self.targets[i].evaluate(inputs, pos)
        return rows, [(i, c) for c in caches]

    def evaluate_batch(self, inputs_list: Sequence[Sequence[Any]], caches: Sequence[Any],
                       trees: Sequence[Any] | None = None) -> list[tuple[list[Any], list[Any]]]:
        out = []
        for j, (inputs, cache) in enumerate(zip(inputs_list, caches)):
            parents = None if trees is None else trees[j]
            if parents is None:
                out.append(self.evaluate(inputs, cache))
                continue
            i, pos = self._target(cache)
            rows, rc = self.targets[i].evaluate_tree(inputs, parents, pos)
            out.append((rows, [(i, c) for c in rc]))
        return out

    def __repr__(self) -> str:
        return f"TeacherForcedBatch({len(self.targets)} recordings)"
