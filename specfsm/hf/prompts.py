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

__all__ = ["EditPrompt", "edit_prompts", "chat_ids", "PromptSpec", "load_prompts", "embedded_prompts", "token_ids",
           "per_category", "spec_bench_group", "SPEC_BENCH_GROUPS", "NextTurn", "next_turns"]

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


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Chat ``messages``' token ids under ``tokenizer``'s chat template, with the reply's
    opening (without a template: the last message's text and the opening of a code
    block, as the embedded edit prompts want)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    text = messages[-1]["content"] + "\n\n```python\n"
    return [int(t) for t in tokenizer(text)["input_ids"]]


# --------------------------------------------------------------------------------------
# the prompts of one run: a --prompts file, or the embedded edits, as token ids
# --------------------------------------------------------------------------------------
class PromptSpec:
    """One prompt: token ids, or text to tokenize, or chat messages, and a name; a
    multi-turn request keeps its user ``turns`` (its ``messages`` are the first turn's)."""

    __slots__ = ("name", "ids", "text", "messages", "lineno", "kind", "turns")

    def __init__(self, name: str, ids: list[int] | None = None, text: str | None = None,
                 messages: list[dict[str, str]] | None = None, lineno: int = 0, kind: str | None = None,
                 turns: list[str] | None = None) -> None:
        self.name, self.ids, self.text, self.messages, self.lineno = name, ids, text, messages, lineno
        self.kind = kind
        self.turns = turns


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
    """Read ``{"prompt": [ids]}``, ``{"text": "..."}`` (raw text, no chat template),
    ``{"messages": [...]}`` (chat messages, templated) or ``{"turns": ["...", ...]}``
    (user turns, each answered after the model's own answer to the one before) objects,
    one per line; Spec-Bench's ``question.jsonl`` lines (``question_id``, ``category``,
    ``turns``) are turns lines named ``<category>-<question_id>``, of kind ``category``.
    Every bad line is reported as ``FILE:LINE: why`` (``WorkloadError``), nothing
    returned. An empty prompt (or text, or turn) is such a bad line: the state machine
    accepts an empty prompt, as the original design does; the CLI refuses it as bad
    input."""
    return read_jsonl(path, "prompts", _prompt_from, max_errors)


def _prompt_from(obj: Any, lineno: int) -> tuple[PromptSpec | None, str | None]:
    """One line's prompt, or why the line is bad."""
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        return None, f"'category' must be a string, got {type(category).__name__}"
    qid = obj.get("question_id")
    name = obj.get("name", f"line {lineno}" if qid is None else f"{category or 'question'}-{qid}")
    if not isinstance(name, str):
        return None, f"'name' must be a string, got {type(name).__name__}"
    kind = obj.get("kind", category)
    if kind is not None and not isinstance(kind, str):
        return None, f"'kind' must be a string, got {type(kind).__name__}"
    if sum(key in obj for key in ("prompt", "text", "messages", "turns")) != 1:
        return None, ("expected exactly one of 'prompt' (token ids), 'text' (raw text), "
                      "'messages' (chat messages) and 'turns' (user turns)")
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            return None, "'turns' must be a non-empty list of non-empty strings (the user's turns)"
        first = [{"role": "user", "content": turns[0]}]
        return PromptSpec(name, messages=first, lineno=lineno, kind=kind, turns=list(turns)), None
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


def per_category(specs: list[PromptSpec], n: int) -> list[PromptSpec]:
    """The first ``n`` prompts of each kind (Spec-Bench's category), in file order."""
    taken: dict[str | None, int] = {}
    out = []
    for s in specs:
        if taken.get(s.kind, 0) < n:
            taken[s.kind] = taken.get(s.kind, 0) + 1
            out.append(s)
    return out


#: Spec-Bench's groups of categories, as its leaderboard reports them: MT-bench's eight
#: categories are "multi-turn conversation", the other five each a group of their own
SPEC_BENCH_GROUPS: dict[str, tuple[str, ...]] = {
    "multi-turn": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"),
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}


def spec_bench_group(category: str | None) -> str | None:
    """The Spec-Bench group of ``category`` (``SPEC_BENCH_GROUPS``), None when it is not one of its 13."""
    for group, cats in SPEC_BENCH_GROUPS.items():
        if category in cats:
            return group
    return None


class NextTurn:
    """The prompts of a multi-turn request's later turns, as Spec-Bench builds them: turn
    ``t``'s prompt is the chat template over the user turns up to ``t`` and the model's
    own answers to the ones before (decoded to text without special tokens, stripped).
    Called with the answers so far (token ids, one list per turn), it returns the next
    turn's prompt ids, or None when every turn is answered."""

    __slots__ = ("turns", "tokenizer")

    def __init__(self, turns: list[str], tokenizer: Any) -> None:
        self.turns, self.tokenizer = turns, tokenizer

    def __call__(self, answers: list[list[int]]) -> list[int] | None:
        if len(answers) >= len(self.turns):
            return None
        msgs: list[dict[str, str]] = []
        for user, ids in zip(self.turns, answers):
            reply = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        msgs.append({"role": "user", "content": self.turns[len(answers)]})
        return chat_ids(self.tokenizer, msgs)


def next_turns(specs: list[PromptSpec], tokenizer: Any) -> list[NextTurn | None]:
    """Per prompt, its ``NextTurn`` when it has more than one turn, else None."""
    return [NextTurn(s.turns, tokenizer) if s.turns is not None and len(s.turns) > 1 else None for s in specs]


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
            ids = chat_ids(tokenizer, s.messages)
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
