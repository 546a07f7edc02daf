"""The documentation's benchmark commands work as written after the README's install.

Every shell command of README.md and docs/*.md that runs pytest on ``benchmarks/`` (in a
shell block, a plain fenced block or an inline code span, which may wrap across lines)
is run from the checkout's root with ``--collect-only -q`` added (nothing is timed), as
a newcomer would run it after ``pip install .``: through the ``pytest`` script, without
``PYTHONPATH`` or ``SPECFSM_NO_EXTENSIONS``, so it must import the installed package with
its compiled core (``benchmarks/conftest.py`` stops any run on the pure-Python twin).
That needs specfsm installed outside the checkout, as ``.ci/run`` installs it; where it
is not (a development checkout built in place and run with ``python -m pytest``), those
tests skip with the reason, as they do on CI's twin run (``SPECFSM_NO_EXTENSIONS=1``: the
commands run without it, so the compiled run has checked them). Without any install, the commands are also checked as text:
none may run the benchmarks through ``python -m pytest`` or ``PYTHONPATH``, which put the
checkout's never-built ``specfsm/`` ahead of the installed one.

The refusal itself is tested as well: ``python -m pytest`` on a benchmark from the
checkout's root either stops with the way out (the checkout's specfsm is the twin, as in
CI's fresh clone) or collects (the checkout is built in place).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import pytest

from specfsm import _impl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
BENCH_CONFTEST = os.path.join(ROOT, "benchmarks", "conftest.py")

#: fenced blocks whose lines are shell commands (a plain ``` fence included)
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
#: what separates commands on one line
SEPARATORS = {"&&", "||", ";", "|", "&"}
UNDER_ASAN = "asan" in os.environ.get("LD_PRELOAD", "")


@dataclass(frozen=True)
class Command:
    where: str                      # README.md:142
    text: str                       # the segment as printed
    argv: tuple[str, ...]           # its words, environment assignments removed
    env: tuple[tuple[str, str], ...] = field(default=())

    @property
    def python_m(self) -> bool:
        return len(self.argv) >= 3 and re.fullmatch(r"python3?", self.argv[0]) is not None \
            and self.argv[1:3] == ("-m", "pytest")

    @property
    def pytest_args(self) -> tuple[str, ...] | None:
        """The arguments after ``pytest`` (or ``python -m pytest``); None for another program."""
        if self.argv[:1] == ("pytest",):
            return self.argv[1:]
        if self.python_m:
            return self.argv[3:]
        return None

    @property
    def runs_benchmarks(self) -> bool:
        args = self.pytest_args
        return args is not None and any(a == "benchmarks" or a.startswith("benchmarks/") for a in args)


def doc_files() -> list[str]:
    files = ["README.md"] if os.path.exists(README) else []
    files += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(DOCS, "*.md")))
    return files


def _snippets(rel: str) -> list[tuple[int, str]]:
    """(line, text) of every shell line of the file's shell fences (continuations joined)
    and of every inline code span outside fences (a paragraph's lines joined by spaces)."""
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        lines = f.read().split("\n")
    found: list[tuple[int, str]] = []
    fence: str | None = None
    para: list[tuple[int, str]] = []

    def flush_paragraph() -> None:
        # a code span may wrap: join the paragraph's lines, then map each span to its line
        starts, text = [], ""
        for n, t in para:
            starts.append((len(text), n))
            text += t + " "
        for m in re.finditer(r"`([^`]+)`", text):
            found.append((max(n for at, n in starts if at <= m.start()), m.group(1)))
        para.clear()

    pending = ""
    start = 0
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence is None:
                flush_paragraph()
                fence = stripped[3:].strip().lower()
            else:
                fence = None
            continue
        if fence is not None:
            if fence in SHELL_FENCES:
                if not pending:
                    start = n
                if stripped.endswith("\\"):
                    pending += stripped[:-1] + " "
                    continue
                found.append((start, pending + stripped))
                pending = ""
            continue
        if not stripped or stripped.startswith(("#", "|")):
            flush_paragraph()
        else:
            para.append((n, stripped))
    flush_paragraph()
    return found


def _segments(text: str) -> list[list[str]]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    out: list[list[str]] = [[]]
    for w in words:
        if w in SEPARATORS:
            out.append([])
        else:
            out[-1].append(w)
    return [s for s in out if s]


def commands_of(rel: str) -> list[Command]:
    found = []
    for line, text in _snippets(rel):
        if "pytest" not in text:
            continue
        try:
            segments = _segments(text)
        except ValueError:  # unbalanced quotes: not a command as printed
            if "benchmarks" in text:
                found.append(Command(f"{rel}:{line}", text, ("<unparsable>",)))
            continue
        for words in segments:
            env = []
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                key, _, value = words.pop(0).partition("=")
                env.append((key, value))
            if words:
                found.append(Command(f"{rel}:{line}", text, tuple(words), tuple(env)))
    return found


def benchmark_commands() -> list[Command]:
    return [c for rel in doc_files() for c in commands_of(rel)
            if c.runs_benchmarks or c.argv == ("<unparsable>",)]


COMMANDS = benchmark_commands()
_FIRST: dict = {}
for _c in COMMANDS:          # each distinct command once, where it is first printed
    _FIRST.setdefault((_c.argv, _c.env), _c)
UNIQUE = list(_FIRST.values())


# -- the commands as text ------------------------------------------------------------------

def test_the_extraction_reads_wrapped_spans_fences_and_chains():
    cmds = commands_of("README.md") if os.path.exists(README) else []
    if not cmds:
        pytest.skip("the README is not next to the tests (an installed copy)")
    assert any(c.runs_benchmarks for c in cmds), "the README's numbers name no benchmark command"
    c = _segments('pip install ".[test,bench]" && pytest -c benchmarks/pytest.ini benchmarks/x.py -k "a or b"')
    assert c == [["pip", "install", ".[test,bench]"],
                 ["pytest", "-c", "benchmarks/pytest.ini", "benchmarks/x.py", "-k", "a or b"]]


@pytest.mark.skipif(not COMMANDS, reason="no documentation next to the tests (an installed copy)")
def test_no_benchmark_command_puts_the_checkout_first():
    """``python -m pytest`` and ``PYTHONPATH=.`` import the checkout's specfsm/, which
    ``pip install .`` does not build: such a command times the twin, or stops."""
    bad = [f"{c.where}: {c.text}" for c in COMMANDS
           if c.python_m or any(k == "PYTHONPATH" for k, _ in c.env) or c.argv == ("<unparsable>",)]
    assert not bad, "benchmark commands that do not run as printed after `pip install .`:\n" + "\n".join(bad)


# -- the commands run (collection only) -----------------------------------------------------

def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECFSM_NO_EXTENSIONS")}
    env.update(extra)
    return env


def _installed() -> tuple[str | None, str]:
    """The pytest script to run the commands with, or None and why they cannot run here."""
    if UNDER_ASAN:
        return None, "under AddressSanitizer: the commands are about the installed package"
    if _impl.NO_EXTENSIONS:
        return None, ("SPECFSM_NO_EXTENSIONS is set: the commands, which run without it, are "
                      "checked by the compiled run")
    if importlib.util.find_spec("pytest_benchmark") is None:
        return None, 'pytest-benchmark is not installed (pip install ".[test]")'
    with tempfile.TemporaryDirectory() as away:   # -I: no PYTHONPATH, no checkout on sys.path
        probe = subprocess.run(
            [sys.executable, "-I", "-c", "import specfsm; print(specfsm.USE_EXTENSIONS)"],
            cwd=away, env=_clean_env(), capture_output=True, text=True, timeout=120,
        )
    if probe.returncode != 0:
        return None, ("specfsm is not installed in this environment (the commands run after "
                      "the README's `pip install .`, as .ci/run installs it)")
    if probe.stdout.split()[-1:] != ["True"]:
        return None, "the installed specfsm has no compiled core (a twin-only install)"
    script = os.path.join(os.path.dirname(sys.executable), "pytest")
    if not os.path.exists(script):
        return None, f"no pytest script next to {sys.executable}"
    return script, ""


@pytest.fixture(scope="module")
def pytest_script():
    script, why = _installed()
    if script is None:
        pytest.skip(why)
    return script


@pytest.mark.skipif(not UNIQUE, reason="no documentation next to the tests (an installed copy)")
@pytest.mark.parametrize("cmd", UNIQUE or [None], ids=[c.where for c in UNIQUE] or ["none"])
def test_a_benchmark_command_collects_on_the_installed_compiled_core(cmd, pytest_script):
    if cmd.python_m or cmd.argv == ("<unparsable>",):
        pytest.fail(f"{cmd.where}: {cmd.text}: see test_no_benchmark_command_puts_the_checkout_first")
    proc = subprocess.run(
        [pytest_script, *cmd.pytest_args, "--collect-only", "-q"],
        cwd=ROOT, env=_clean_env(**dict(cmd.env)), capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{cmd.where}: `{cmd.text}` does not collect (exit {proc.returncode}):\n{out[-3000:]}"
    assert re.search(r"\b\d+ tests? collected|\b\d+/\d+ tests? collected", out), out[-2000:]


# -- the refusal --------------------------------------------------------------------------

BENCH = ["-c", "benchmarks/pytest.ini", "benchmarks/test_bench_state.py", "--collect-only", "-q"]


@pytest.mark.skipif(UNDER_ASAN, reason="under AddressSanitizer the checkout is a sanitized copy on PYTHONPATH")
@pytest.mark.skipif(not os.path.exists(BENCH_CONFTEST), reason="benchmarks/ is not next to the tests")
def test_python_m_pytest_on_the_twin_stops_with_the_way_out():
    """From the checkout's root, ``python -m`` imports the checkout's specfsm: if that is
    the twin (never built), the benchmarks stop before collecting, naming both ways out;
    if it is built in place, they collect."""
    probe = subprocess.run([sys.executable, "-c", "import specfsm; print(specfsm.USE_EXTENSIONS)"],
                           cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    compiled = probe.stdout.split()[-1:] == ["True"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *BENCH], cwd=ROOT, env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if compiled:
        assert proc.returncode == 0, out[-3000:]
    else:
        assert proc.returncode == 4, out[-3000:]
        for words in ("runs on the pure-Python twin", "python setup.py build_ext --inplace",
                      'pip install ".[test,bench]"', "pytest -c benchmarks/pytest.ini",
                      "SPECFSM_NO_EXTENSIONS=1"):
            assert words in out, (words, out[-3000:])
        assert "collected" not in out


@pytest.mark.skipif(UNDER_ASAN, reason="under AddressSanitizer the checkout is a sanitized copy on PYTHONPATH")
@pytest.mark.skipif(not os.path.exists(BENCH_CONFTEST), reason="benchmarks/ is not next to the tests")
def test_the_twin_on_purpose_runs_under_a_banner():
    proc = subprocess.run([sys.executable, "-m", "pytest", *BENCH], cwd=ROOT,
                          env=_clean_env(SPECFSM_NO_EXTENSIONS="1"), capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "SPECFSM_NO_EXTENSIONS is set: the public layer runs on the pure-Python twin" in out


@pytest.mark.skipif(not os.path.exists(BENCH_CONFTEST), reason="benchmarks/ is not next to the tests")
def test_the_refusal_names_what_is_wrong():
    """``twin_refusal``, the rule of benchmarks/conftest.py and the stand-alone scripts
    (benchmarks/_twin_check.py), read from the file itself."""
    spec = importlib.util.spec_from_file_location(
        "_bench_twin_check", os.path.join(os.path.dirname(BENCH_CONFTEST), "_twin_check.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    refuse = mod.twin_refusal
    assert refuse(True, False, False, {}, "/x") is None                   # compiled
    assert refuse(False, True, False, {}, "/x") is None                   # the twin on purpose
    never = refuse(False, False, True, {}, "/src/specfsm")
    assert "/src/specfsm" in never and "never built" in never
    partial = refuse(False, False, False, {"batch": "No module named 'specfsm._core.batch'"}, "/x")
    assert "specfsm._core.batch (No module named 'specfsm._core.batch')" in partial
