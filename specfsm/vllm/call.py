"""vLLM's ``propose`` call as the proposers read it: its arguments checked and read as
numpy, and the request each batch row holds (the request ids of the model runner's input
batch, found once when vLLM builds the proposer inside its runner, or the caller's).

Why ids: the call vLLM makes carries rows, not requests, and a new request that takes a
finished request's row (vLLM fills the smallest free row first) can look, in every
array the call passes, exactly like that request grown by its sampled token: the same
length, the same last tokens, the same shared system prompt. Its request id is the one
thing that tells them apart. vLLM's V1 runner builds a ``custom_class`` proposer in its
``__init__`` (``self.drafter = create_custom_proposer(self.vllm_config)``) and calls it
with ``self.input_batch.token_ids_cpu``; ``self.input_batch.req_ids[i]`` is the id of
the request in row ``i`` (vLLM keeps that list right through every add, remove,
condense and swap). ``find_runner`` finds that runner from the constructor's calling
frames (the nearest ``self`` that holds this very ``VllmConfig`` and has
``propose_draft_token_ids``) and keeps a weak reference; ``runner_ids`` reads the ids at
each call, and only when the ``token_ids_cpu`` passed is that runner's own array (so the
ids describe those rows). Outside vLLM there is no runner: a caller passes
``req_ids=`` to ``propose``, or the rows go without ids.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from types import FrameType
from typing import Any, Callable

import numpy as np

__all__ = ["as_numpy", "check_call", "find_runner", "given_ids", "runner_ids"]

#: calling frames looked at for the runner (vLLM's is 2 above the proposer's own
#: ``__init__`` frames: ``create_custom_proposer``, then ``GPUModelRunner.__init__``)
MAX_DEPTH = 12


def find_runner(vllm_config: Any) -> Callable[[], Any] | None:
    """A reference (weak where it can be) to the vLLM model runner building this
    proposer now: the nearest calling frame whose ``self`` holds this very
    ``vllm_config`` and has a ``propose_draft_token_ids`` method. None outside vLLM or
    without a config."""
    if vllm_config is None:
        return None
    frame: FrameType | None
    try:
        frame = sys._getframe(1)
    except (AttributeError, ValueError):  # (an interpreter without frames)
        return None
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        obj = frame.f_locals.get("self")
        if (obj is not None and getattr(obj, "vllm_config", None) is vllm_config
                and callable(getattr(obj, "propose_draft_token_ids", None))):
            try:
                return weakref.ref(obj)
            except TypeError:  # (a runner type without weak references)
                return lambda: obj
        frame = frame.f_back
    return None


def runner_ids(runner: Callable[[], Any], token_ids: Any, b: int) -> list | None:
    """The request ids of rows ``0 .. b-1`` from the runner's input batch, when
    ``token_ids`` is that batch's own ``token_ids_cpu``; else None (the rows go without
    ids). (vLLM's list holds None only for a free row while it updates the batch, never
    at the drafter's call; the general step treats a call with a None id as one without
    ids, and the steady step, which compares the ids with the last call's, only passes
    when they equal ids the general step accepted.)"""
    batch = getattr(runner(), "input_batch", None)
    if batch is None or getattr(batch, "token_ids_cpu", None) is not token_ids:
        return None
    ids = getattr(batch, "req_ids", None)
    if type(ids) is not list or len(ids) < b:
        return None
    return ids[:b]  # (a copy: vLLM rewrites its list in place)


def given_ids(req_ids: Any, b: int) -> list:
    """A caller's ``req_ids`` for rows ``0 .. b-1``, as a list (one id per row, any
    values that compare equal for the same request and unequal for different ones).
    Refuses a non-sequence (TypeError), fewer than ``b`` entries or a None entry
    (ValueError)."""
    if isinstance(req_ids, (str, bytes)) or not (hasattr(req_ids, "__len__") and hasattr(req_ids, "__getitem__")):
        raise TypeError(f"req_ids must be a list of request ids (one per batch row), got {type(req_ids).__name__}")
    if len(req_ids) < b:
        raise ValueError(f"req_ids has {len(req_ids)} entries for {b} batch rows")
    ids = list(req_ids[:b])
    if None in ids:
        raise ValueError(f"req_ids[{ids.index(None)}] is None: every batch row needs its request's id")
    return ids


def as_numpy(value: Any, name: str) -> np.ndarray:
    """A numpy view of ``value`` (a numpy array, a CPU ``torch.Tensor`` or a sequence)."""
    if isinstance(value, np.ndarray):
        return value
    to_numpy = getattr(value, "numpy", None)
    if callable(to_numpy):  # torch.Tensor on the CPU (vLLM's token_ids_cpu_tensor)
        try:
            return np.asarray(to_numpy())
        except Exception as exc:  # a CUDA tensor, a tensor that needs grad, ...
            raise TypeError(f"{name} must be a CPU array, got {type(value).__name__} ({exc})") from None
    try:
        return np.asarray(value)
    except Exception as exc:
        raise TypeError(f"{name} must be an integer array, got {type(value).__name__} ({exc})") from None


def check_call(sampled: Any, num_tokens: Any, token_ids: Any) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """The call's arguments checked and read: ``(rows, sampled counts, lengths, token
    array)``; refuses what does not fit (TypeError / ValueError naming the argument)."""
    if not isinstance(sampled, (list, tuple)) and (
        isinstance(sampled, (str, bytes)) or not isinstance(sampled, Sequence)
    ):
        raise TypeError(f"sampled_token_ids must be a list of lists, got {type(sampled).__name__}")
    b = len(sampled)
    try:
        # (a copy the call owns: the row rule compares each row's growth with it)
        ns = np.fromiter(map(len, sampled), dtype=np.int64, count=b)
    except TypeError:
        bad = next(i for i, s in enumerate(sampled) if not hasattr(s, "__len__"))
        raise TypeError(
            f"sampled_token_ids[{bad}] must be a list of token ids, got {type(sampled[bad]).__name__}"
        ) from None
    tok = as_numpy(token_ids, "token_ids_cpu")
    if tok.ndim != 2:
        raise ValueError(f"token_ids_cpu must be 2-D [rows, max_model_len], got shape {tok.shape}")
    if tok.dtype.kind not in "iu" or tok.dtype == np.uint64:
        raise TypeError(f"token_ids_cpu must hold integer token ids, got dtype {tok.dtype}")
    if tok.shape[0] < b:
        raise ValueError(f"token_ids_cpu has {tok.shape[0]} rows for {b} batch rows")
    lens = as_numpy(num_tokens, "num_tokens_no_spec")
    if lens.ndim != 1:
        raise ValueError(f"num_tokens_no_spec must be 1-D, got shape {lens.shape}")
    if lens.dtype.kind not in "iu":
        raise TypeError(f"num_tokens_no_spec must hold integer lengths, got dtype {lens.dtype}")
    if lens.shape[0] < b:
        raise ValueError(f"num_tokens_no_spec has {lens.shape[0]} entries for {b} batch rows")
    L = lens[:b].astype(np.int64)  # a copy the call owns
    if b and (int(L.min()) < 0 or int(L.max()) > tok.shape[1]):
        i = int(np.flatnonzero((L < 0) | (L > tok.shape[1]))[0])
        shown = int(lens[i]) if lens.dtype == np.uint64 else int(L[i])  # (uint64 wraps in L)
        raise ValueError(
            f"num_tokens_no_spec[{i}]={shown} is outside [0, {tok.shape[1]}]: row {i} of "
            f"token_ids_cpu (shape {tok.shape}) cannot hold that history"
        )
    return b, ns, L, tok
