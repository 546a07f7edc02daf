"""The usage error and the argument types of the ``specfsm`` command, shared by the
command's own parser (``specfsm.cli.options``) and the sub-commands other packages add
to it (``specfsm.hf.cli``). It sits outside ``specfsm.cli`` so that a package adding
sub-commands does not import the command that imports it."""

from __future__ import annotations

import argparse

__all__ = ["UsageError", "positive"]


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
