"""The prompts of ``specfsm generate`` and ``specfsm record``: the embedded code-editing
chat prompts, a ``--prompts`` file (``load_prompts``), and both as token ids.

Built at run time from this Python's standard library, like ``specfsm replay``'s default
workload (``specfsm.serving.workload``): the same modules, the same renaming edit
(``rename_edit``: a module's most-used function and class names get ``_v2``). Each
prompt asks a chat model to apply the renames to the first lines of the module's source
and print the whole edited code, so a good answer copies most of its prompt: the case
n-gram drafting is for.
"""

from __future__ import annotations

import ast
import os
from typing import Any

from .._cli_args import UsageError
from ..serving.workload import (
    WorkloadError,
    candidate_files,
    defined_names,
    read_jsonl,
    rename_edit,
    stdlib_dir,
    tokenize,
    trace_ids,
)

__all__ = ["EditPrompt", "edit_prompts", "chat_ids", "PromptSpec", "load_prompts", "embedded_prompts", "token_ids"]

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


# --------------------------------------------------------------------------------------
# the prompts of one run: a --prompts file, or the embedded edits, as token ids
# --------------------------------------------------------------------------------------
class PromptSpec:
    """One prompt: token ids, or text to tokenize, and a name."""

    __slots__ = ("name", "ids", "text", "messages", "lineno", "kind")

    def __init__(self, name: str, ids: list[int] | None = None, text: str | None = None,
                 messages: list[dict[str, str]] | None = None, lineno: int = 0, kind: str | None = None) -> None:
        self.name, self.ids, self.text, self.messages, self.lineno = name, ids, text, messages, lineno
        self.kind = kind


def _messages(value: Any) -> tuple[list[dict[str, str]] | None, str | None]:
    """``"messages"`` of a prompts line: a non-empty list of ``{"role": str, "content":
    str}`` objects; ``(messages, None)`` or ``(None, why not)``."""
    if not isinstance(value, list) or not value:
        return None, "'messages' must be a non-empty list of {\"role\": ..., \"content\": ...} objects"
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            return None, f"messages[{i}] must be an object, got {type(m).__name__}"
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            return None, f"messages[{i}]: 'role' must be a non-empty string, got {role!r}"
        if not isinstance(content, str):
            return None, f"messages[{i}]: 'content' must be a string, got {type(content).__name__}"
        out.append({"role": role, "content": content})
    if not any(m["content"] for m in out):
        return None, "'messages' hold no text (every content is empty)"
    return out, None


def load_prompts(path: str, max_errors: int = 20) -> list[PromptSpec]:
    """Read ``{"prompt": [ids]}``, ``{"text": "..."}`` (raw text, no chat template) or
    ``{"messages": [...]}`` (chat messages, templated) objects, one per line; every bad
    line is reported as ``FILE:LINE: why`` (``WorkloadError``), nothing returned. An empty
    prompt (or text) is such a bad line: the state machine accepts an empty prompt, as the
    original design does; the CLI refuses it as bad input."""
    return read_jsonl(path, "prompts", _prompt_from, max_errors)


def _prompt_from(obj: Any, lineno: int) -> tuple[PromptSpec | None, str | None]:
    """One line's prompt, or why the line is bad."""
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    name = obj.get("name", f"line {lineno}")
    if not isinstance(name, str):
        return None, f"'name' must be a string, got {type(name).__name__}"
    kind = obj.get("kind")
    if kind is not None and not isinstance(kind, str):
        return None, f"'kind' must be a string, got {type(kind).__name__}"
    if sum(key in obj for key in ("prompt", "text", "messages")) != 1:
        return None, ("expected exactly one of 'prompt' (token ids), 'text' (raw text) "
                      "and 'messages' (chat messages)")
    if "messages" in obj:
        msgs, err = _messages(obj["messages"])
        return (None, err) if err else (PromptSpec(name, messages=msgs, lineno=lineno, kind=kind), None)
    if "prompt" in obj:
        ids, err = trace_ids(obj["prompt"], "prompt")
        if err is None and not ids:
            err = "'prompt' is empty (prefill needs at least one token)"
        return (None, err) if err else (PromptSpec(name, ids=ids, lineno=lineno, kind=kind), None)
    text = obj["text"]
    if not isinstance(text, str) or not text:
        return None, "'text' must be a non-empty string"
    return PromptSpec(name, text=text, lineno=lineno, kind=kind), None


def embedded_prompts(count: int) -> list[PromptSpec]:

    return [PromptSpec(p.name, messages=p.messages) for p in edit_prompts(count)]


def token_ids(specs: list[PromptSpec], tokenizer: Any, vocab: int, source: str) -> list[list[int]]:

    out, errors = [], []
    for s in specs:
        where = f"{source}:{s.lineno}" if s.lineno else s.name
        if s.ids is not None:
            ids = s.ids
        elif tokenizer is None:
            errors.append(f"{where}: a text prompt needs the model's tokenizer, and this model has none; give token ids")
            continue
        elif s.messages is not None:
            ids = chat_ids(tokenizer, EditPrompt(s.name, {}, s.messages))
        else:
            ids = [int(t) for t in tokenizer(s.text)["input_ids"]]
        bad = [t for t in ids if t >= vocab]
        if bad:
            errors.append(f"{where}: token id {bad[0]} is outside the model's vocabulary 0..{vocab - 1}")
            continue
        out.append(ids)
    if errors:
        raise UsageError("\n".join(errors))
    return out
