"""The usage error and the argument types of the ``specfsm`` command, shared by the
command's own parser (``specfsm.cli.options``) and the sub-commands other packages add
to it (``specfsm.hf.cli``). It sits outside ``specfsm.cli`` so that a package adding
sub-commands does not import the command that imports it."""

from __future__ import annotations

import argparse

__all__ = ["UsageError", "positive", "plural", "SubcommandParser"]


class UsageError(Exception):
    """A bad option value; reported with exit status 2."""


def positive(text: str) -> int:
    """An argparse type: a positive integer."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


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
