"""The embedded code-editing chat prompts for ``specfsm generate`` and ``specfsm record``.

Built at run time from this Python's standard library, like ``specfsm replay``'s default
workload (``specfsm.workload``): the same modules, the same renaming edit
(``rename_edit``: a module's most-used function and class names get ``_v2``). Each
prompt asks a chat model to apply the renames to the first lines of the module's source
and print the whole edited code, so a good answer copies most of its prompt: the case
n-gram drafting is for.
"""

from __future__ import annotations

import ast
import os
from typing import Any

from ..workload import WorkloadError, candidate_files, defined_names, rename_edit, stdlib_dir, tokenize

__all__ = ["EditPrompt", "edit_prompts", "chat_ids"]

DEFAULT_PROMPTS = 8
_MAX_CHARS = 2_400  # about 700 SmolLM2 tokens of source per prompt


class EditPrompt:
    """One request: the module it came from, the renames, and the chat messages."""

    __slots__ = ("name", "renames", "messages")

    def __init__(self, name: str, renames: dict[str, str], messages: list[dict[str, str]]) -> None:
        self.name = name
        self.renames = renames
        self.messages = messages


def _head(text: str, limit: int) -> str:
    """The module's leading lines, up to ``limit`` characters, ending on a line break."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[: cut + 1 if cut > 0 else limit]


def edit_prompts(count: int = DEFAULT_PROMPTS, root: str | None = None, max_chars: int = _MAX_CHARS) -> list[EditPrompt]:
    """``count`` code-editing chat requests from evenly spaced standard-library modules
    (of those ``specfsm replay``'s embedded workload draws on, the ones whose first lines
    define a name to rename: 67 on CPython 3.11; all of them when ``count`` is larger). Raises ``WorkloadError`` when
    no usable sources are found."""
    if type(count) is not int or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    root = stdlib_dir() if root is None else root
    usable: list[tuple[str, str, dict[str, str]]] = []
    for path in candidate_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        head = _head(text, max_chars)
        try:
            names = defined_names(ast.parse(head))
        except SyntaxError:  # cut inside a multi-line construct: use the whole module's names
            names = defined_names(ast.parse(text)) & set(tokenize(head))
        if not names:
            continue
        _, mapping = rename_edit(tokenize(head), names, count=2)
        if mapping:
            usable.append((os.path.basename(path), head, mapping))
    if not usable:
        raise WorkloadError(f"no standard-library sources found in {root!r} to build the edit prompts")
    if count < len(usable):
        step = len(usable) / count
        usable = [usable[int(i * step)] for i in range(count)]
    out = []
    for name, head, mapping in usable:
        renames = ", ".join(f"`{a}` to `{b}`" for a, b in mapping.items())
        user = (
            f"```python\n{head}```\n\nCopy this code from {name} exactly, line by line, "
            f"changing only one thing: rename {renames}. Reply with the code only."
        )
        system = "You are a careful code editor. You reproduce code exactly and change only what you are asked to."
        out.append(EditPrompt(name, mapping, [{"role": "system", "content": system}, {"role": "user", "content": user}]))
    return out


def chat_ids(tokenizer: Any, prompt: EditPrompt) -> list[int]:
    """The prompt's token ids under ``tokenizer``'s chat template (plain text with the
    reply's opening when it has none)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    text = prompt.messages[-1]["content"] + "\n\n```python\n"
    return [int(t) for t in tokenizer(text)["input_ids"]]
