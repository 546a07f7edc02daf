"""The usage error and the argument types of the ``specfsm`` command, shared by the
command's own parser (``specfsm.cli.options``) and the sub-commands other packages add
to it (``specfsm.hf.cli``). It sits outside ``specfsm.cli`` so that a package adding
sub-commands does not import the command that imports it.

Every numeric option is an ``int_range(lo, hi)``: refused when the options are parsed
(exit status 2, one ``error:`` line naming the option and the range), before any work
starts and before any model loads. The bounds are the limits of the code the values
reach (below), or, where nothing binds, ``COUNT_MAX``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .drafting._checks import MAX_SUFFIX_TOKENS
from .drafting._tree_checks import MAX_TREE_NODES
from .machine._checks import MAX_DRAFT, MAX_SLOTS

__all__ = [
    "UsageError", "int_range", "plural", "SubcommandParser",
    "MAX_K", "MAX_TREE_K", "MAX_BATCH", "MAX_NEW_TOKENS", "MAX_THREADS", "COUNT_MAX", "MAX_MATCH", "MAX_SEED",
]

#: ``--k``: the longest draft a batch verifies (``specfsm.machine``'s ``k_max`` limit)
MAX_K = MAX_DRAFT
#: ``generate --k`` with the suffix-tree drafter: the largest tree budget and depth
MAX_TREE_K = MAX_TREE_NODES
#: ``--batch``: the most requests one batch holds (its ``capacity`` limit)
MAX_BATCH = MAX_SLOTS
#: ``--max-new-tokens``: a request's suffix index holds at most this many tokens
MAX_NEW_TOKENS = MAX_SUFFIX_TOKENS
#: ``--threads``: torch takes any int32 count; past this many threads only oversubscribe
MAX_THREADS = 1024
#: counts nothing else bounds (requests, repeats, rounds): well past any real run, so a
#: slip of the keyboard is a usage error instead of a run that never ends
COUNT_MAX = 2**31 - 1
#: ``--ngram``'s lengths: no match is longer than a suffix index holds
MAX_MATCH = MAX_SUFFIX_TOKENS
#: ``--rule speculative:SEED``: a 64-bit seed
MAX_SEED = 2**64 - 1

_SHOWN = 40  # characters of a refused value the message repeats


class UsageError(Exception):
    """A bad option value; reported with exit status 2."""


def _shown(text: str) -> str:
    return repr(text) if len(text) <= _SHOWN else repr(text[:_SHOWN]) + f" ... ({len(text):,} characters)"


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a decimal integer in ``lo..hi``. Anything else (a float such as
    ``1e3`` or ``1.5``, an empty string, a value out of range) is an
    ``ArgumentTypeError`` naming the range, which argparse reports as a usage error
    naming the option."""
    if lo > hi:
        raise ValueError(f"int_range needs lo <= hi, got {lo} > {hi}")

    def parse(text: str) -> int:
        try:
            v = int(text)
        except (TypeError, ValueError):  # also a string past int()'s digit limit
            raise argparse.ArgumentTypeError(
                f"must be an integer between {lo} and {hi}, got {_shown(str(text))}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}, got {_shown(str(v))}")
        return v

    parse.__name__ = f"int_range({lo}, {hi})"
    return parse


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 request``, ``2 requests``, ``1,200 requests`` (``many`` for an irregular
    plural): every count the commands print goes through it."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


class SubcommandParser(argparse.ArgumentParser):
    """The parser of one sub-command (``add_subparsers(parser_class=SubcommandParser)``):
    an argument it does not know is refused here, with this sub-command's usage
    (``specfsm replay --frobnicate`` prints ``usage: specfsm replay ...``), instead of
    being handed up to the top-level parser, whose usage names no sub-command's options."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras
