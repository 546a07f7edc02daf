"""Checked by mypy (``.ci/typecheck``), never run: what a type checker sees of the state
machine's generics and of the kernels through the twins (the compiled core is held to
their signatures by ``tests/test_signatures.py``). ``assert_type`` fails the check when
an inferred type changes."""

from __future__ import annotations

import numpy as np
from typing_extensions import assert_type

from specfsm import Accept, Decode, Done, Prefill, Rollback, ServingState, Verify, VerifyTree
from specfsm import accept_tree, accept_tree_batch, check_tree
from specfsm import NgramIndex
from specfsm.accept import _accept_py as accept_kernels
from specfsm.machine import _settle_py as settle_kernel


class BlockTable:
    """A paged-KV cache handle."""


def walk(table: BlockTable, other: BlockTable) -> None:
    prefill = ServingState.start([1, 2, 3], table)
    assert_type(prefill, Prefill[int, BlockTable])
    decode = prefill.advance_prefill(4, table)
    assert_type(decode, Decode[int, BlockTable])
    assert_type(decode.last, int)
    verify = decode.enter_verify([5, 6])
    assert_type(verify, Verify[int, BlockTable])
    assert_type(verify.snapshot, BlockTable)
    settled = verify.accept([5, 7], [table, other])
    assert_type(settled, Accept[int, BlockTable] | Rollback[int, BlockTable])
    if isinstance(settled, Accept):
        assert_type(settled.next, int)
        assert_type(settled.resume(), Decode[int, BlockTable])
    else:
        assert_type(settled.to, int)
        assert_type(settled.snapshot, BlockTable)
    assert_type(decode.finish(), Done[int, BlockTable])
    tree = decode.enter_verify_tree([5, 6], [-1, 0])
    assert_type(tree, VerifyTree[int, BlockTable])
    assert_type(tree.tokens, tuple[int, ...])
    assert_type(tree.path([5, 6, 7]), list[int])
    assert_type(tree.accept([5, 6, 7], [table, other, table]), Accept[int, BlockTable] | Rollback[int, BlockTable])
    assert_type(check_tree([5, 6], [-1, 0]), tuple[np.ndarray, np.ndarray])
    assert_type(accept_tree([5], [-1], [5, 6]), np.ndarray)
    assert_type(accept_tree_batch([5], [-1], [0, 1], [5, 6]), tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray])


def kernels() -> None:
    assert_type(settle_kernel.settle(2, 1, 2, 2, "accept"), int)
    tokens, accepted = accept_kernels.exact_batch(np.array([1]), np.array([1]), np.array([0, 1]))
    assert_type(accepted, np.ndarray)
    index = NgramIndex(1, 3)
    assert_type(index.propose(4), list[int])
