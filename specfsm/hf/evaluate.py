"""The model side of a speculative step for a Hugging Face causal LM: what
``specfsm.hf.generate`` evaluates and how its KV cache follows the serving state.

The ragged batch cache (``RaggedBatch``). All requests share one ``DynamicCache`` of
``T`` columns; a column of row ``b`` is either one of that request's consumed tokens or
a hole. A 2-D attention mask marks the real columns (prompts are left-padded: the padding
is holes; ``prefill`` can prefill each prompt by its own forward and gather the caches,
so no forward computes padding), and explicit ``position_ids`` give every request its
own positions, so holes change nothing a request attends to. A step feeds ``W`` columns
to every row (a request drafting fewer tokens, or decoding, fills its extra columns with
holes); after acceptance each request keeps the leading columns it consumed and the rest
become holes; trailing columns that no request kept are cropped off (``Cache.crop``),
and when the attention it saves outweighs the copy the rows are compacted (each row's
real columns gathered to the right, left-padded; ``cost.CompactionCost`` decides from
the run's measured forwards and gathers). Finished requests leave the batch
(``batch_select_indices``). A batch of one never has holes: rollback is a crop.

The output projection's rows (``HeadRows``). On a CPU a matrix product's cost by rows is
not monotone: MKL evaluates a projection of 2 or 3 rows as that many matrix-vector
products, each streaming the whole weight, and 4 rows as one matrix product (SmolLM2's
49152 x 576 head, one thread: 1 row 9.7 ms, 2 rows 15.5, 3 rows 30.2, 4 rows 12.7). So a
batch of 3 decoding requests cost 86 ms a forward against 63 ms for 4 (the head 22 ms
against 13), and a batch whose request finished early ran its tail slower than
``generate``, which keeps finished rows. ``HeadRows`` measures the head's cost by rows
once per model (when the generator is built, not inside a request; kept beside the
model's converted copy in specfsm's cache, so a later process reads it) and pads its
input with zero rows to the cheapest count at or above the rows asked for (up to 8);
each real row's logits are the padded product's, as a batch of that many rows computes
them.

Also here: the checks of the transformers version, model and cache this relies on
(``check_transformers``, ``check_model``) and ``first_mismatch``.
"""

from __future__ import annotations

import functools
import math
import os
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "SUPPORTED_TRANSFORMERS",
    "UnsupportedModel",
    "check_transformers",
    "check_model",
    "new_cache",
    "croppable",
    "max_positions",
    "prefill",
    "compact",
    "RaggedBatch",
    "HeadRows",
    "eos_ids",
    "measure_costs",
    "first_mismatch",
]

#: The transformers versions whose ``Cache.crop`` semantics this module relies on.
SUPPORTED_TRANSFORMERS = ">=5.0,<6"


class UnsupportedModel(ValueError):
    """A model, cache or transformers version this generator cannot drive exactly."""


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) or "0"
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def check_transformers(version: str | None = None) -> str:
    """Refuse a transformers outside ``SUPPORTED_TRANSFORMERS``: 4.x crops a cache to an
    absolute length (``crop(0)`` empties it) where 5.x removes a count of tokens, and
    6 is unknown. Returns the version checked."""
    if version is None:
        import transformers

        version = transformers.__version__
    v = _version_tuple(version)
    if not (5,) <= v < (6,):
        raise UnsupportedModel(
            f"transformers {version} is not supported: specfsm.hf needs transformers "
            f"{SUPPORTED_TRANSFORMERS} (4.x crops caches to an absolute length, 5.x by a "
            "count of tokens); pip install 'transformers>=5,<6'"
        )
    return version


def new_cache(model: Any) -> Any:
    """A fresh ``DynamicCache`` for ``model``."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def croppable(cache: Any) -> bool:
    """Whether ``crop`` puts ``cache`` back exactly (every layer a plain ``DynamicLayer``)."""
    flag = getattr(cache, "is_croppable", None)
    if flag is not None:
        return bool(flag)
    layers = getattr(cache, "layers", ())
    return all(type(layer).__name__ == "DynamicLayer" for layer in layers)


def check_model(model: Any, cache: Any = None) -> None:
    """Refuse what cannot be rolled back exactly: stateful models (a recurrent state
    has no ``crop``), encoder-decoder models, and caches whose ``crop`` cannot put them
    back as they were (quantised caches, sliding-window layers)."""
    check_transformers()
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(model, "forward", None)):
        raise UnsupportedModel(f"model must be a transformers causal LM, got {type(model).__name__}")
    if getattr(model, "_is_stateful", False):
        raise UnsupportedModel(
            f"{type(model).__name__} is stateful: its recurrent state cannot be cropped back "
            "after a rejected draft, so speculative decoding cannot be exact"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModel(f"{type(model).__name__} is an encoder-decoder model; only causal LMs are supported")
    cache = new_cache(model) if cache is None else cache
    if not croppable(cache):
        raise UnsupportedModel(
            f"the {type(cache).__name__} of {type(model).__name__} cannot be cropped exactly "
            "(quantised or sliding-window layers): a rejected draft could not be rolled back"
        )


def prefill(model: Any, forward: Callable[..., Any], prompts: list[np.ndarray], each: bool,
            keep: int = 1) -> tuple[Any, Any, Any]:
    """The prompts (int64 arrays) into a left-padded batch cache (holes masked, positions
    from 0 at each request's first token); returns ``(cache, mask, logits)``, the logits
    of the last ``keep`` columns ``(B, keep, vocab)`` (row ``j``'s last ``min(keep,
    len(prompts[j]))`` real, the rest zeros with ``each`` and padding's otherwise).
    ``each``: one forward per prompt, the caches gathered; else one forward over the
    left-padded prompts. ``forward(ids, pos, mask, cache, keep=None)`` runs the model and
    returns its logits."""
    import torch

    b = len(prompts)
    t = max(len(r) for r in prompts)
    mask = torch.zeros((b, t), dtype=torch.long)
    for i, r in enumerate(prompts):
        mask[i, t - len(r) :] = 1
    if b > 1 and each:
        caches, logits = [], []
        for r in prompts:
            c = new_cache(model)
            ids = torch.from_numpy(r)[None]
            out = forward(ids, None, None, c, keep=min(keep, len(r)))
            if out.shape[1] < keep:
                out = torch.cat([out.new_zeros((1, keep - out.shape[1], out.shape[2])), out], dim=1)
            logits.append(out)
            caches.append(c)
        cache = caches[0]
        for li, layer in enumerate(cache.layers):
            if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
                continue
            k, v = layer.keys, layer.values
            keys = k.new_zeros((b, k.shape[1], t, k.shape[3]))
            values = v.new_zeros((b, v.shape[1], t, v.shape[3]))
            for i, (c, r) in enumerate(zip(caches, prompts)):
                n = len(r)
                keys[i, :, t - n :] = c.layers[li].keys[0]
                values[i, :, t - n :] = c.layers[li].values[0]
            layer.keys, layer.values = keys, values
        return cache, mask, torch.cat(logits)
    ids = torch.zeros((b, t), dtype=torch.long)
    pos = torch.zeros((b, t), dtype=torch.long)
    for i, r in enumerate(prompts):
        n = len(r)
        ids[i, t - n :] = torch.from_numpy(r)
        pos[i, t - n :] = torch.arange(n)
    cache = new_cache(model)
    logits = forward(ids, pos, mask if b > 1 else None, cache, keep=keep)
    return cache, mask, logits


def compact(cache: Any, buf: Any, width: int) -> int:
    """Gather each row's real columns to the right end of a narrower cache (left
    padding), in place of the holes; returns the new width."""
    import torch

    mask = buf[:, :width]
    counts = mask.sum(1)
    new = int(counts.max())
    b = mask.shape[0]
    index = torch.zeros((b, new), dtype=torch.long)
    for i in range(b):
        cols = torch.nonzero(mask[i], as_tuple=True)[0]
        index[i, new - cols.numel() :] = cols
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or getattr(layer, "keys", None) is None:
            continue
        k = layer.keys
        g = index[:, None, :, None].expand(b, k.shape[1], new, k.shape[3])
        layer.keys = torch.gather(k, 2, g)
        layer.values = torch.gather(layer.values, 2, g)
    buf[:, :new] = (torch.arange(new)[None, :] >= (new - counts)[:, None]).long()
    buf[:, new:width] = 0
    return new


class RaggedBatch:
    """The ragged batch cache of the live requests (one row each, in order): one
    ``DynamicCache`` of ``width`` columns and its 2-D attention mask, kept in a buffer
    with room to grow (``buf[:, :width]`` is live; 1 marks a consumed token, 0 a hole).

    ``feed`` runs one forward of W columns (each row its own tokens, padded with holes,
    at its own positions), ``keep`` keeps each row's leading consumed columns and crops
    the trailing columns no row kept, ``select`` drops finished rows and ``compact``
    gathers each row's real columns to the right when the caller's cost rule says it
    pays (``cost.CompactionCost``; a lone row: at once, so it decodes without a mask)."""

    __slots__ = ("cache", "buf", "width", "fed", "forward")

    def __init__(self, cache: Any, mask: Any, rows: list[int], forward: Callable[..., Any]) -> None:
        """From a prefill's ``cache`` and ``mask``, keeping its rows ``rows`` (ascending)."""
        import torch

        if len(rows) < mask.shape[0]:
            if rows:
                cache.batch_select_indices(torch.tensor(rows))
            mask = mask[rows]
        self.cache = cache
        self.buf = torch.zeros((mask.shape[0], max(64, 2 * mask.shape[1])), dtype=torch.long)
        self.buf[:, : mask.shape[1]] = mask
        self.width = int(mask.shape[1])
        self.fed = 0
        self.forward = forward

    def feed(self, feeds: Sequence[Any], valid: Sequence[int]) -> Any:
        """One forward: row ``j`` feeds ``feeds[j]`` (a non-empty 1-D sequence of ids) at
        positions from ``valid[j]`` (the tokens its cache holds); returns the logits."""
        import torch

        b = len(feeds)
        w = max(len(f) for f in feeds)
        ids = torch.empty((b, w), dtype=torch.long)
        pos = torch.empty((b, w), dtype=torch.long)
        width, buf = self.width, self.buf
        if width + w > buf.shape[1]:
            nb = torch.zeros((b, 2 * (width + w)), dtype=torch.long)
            nb[:, :width] = buf[:, :width]
            self.buf = buf = nb
        buf[:, width : width + w] = 0
        for j, feed in enumerate(feeds):
            n = len(feed)
            t = torch.from_numpy(feed) if isinstance(feed, np.ndarray) else torch.tensor(feed)
            ids[j, :n] = t
            ids[j, n:] = t[-1]
            pos[j] = torch.arange(valid[j], valid[j] + w).clamp_(max=valid[j] + n - 1)
            buf[j, width : width + n] = 1
        self.width = width = width + w
        self.fed = w
        return self.forward(ids, pos, buf[:, :width] if b > 1 else None, self.cache)

    def keep(self, consumed: Sequence[int]) -> None:
        """Row ``j`` keeps the first ``consumed[j]`` columns of the last ``feed`` (the rest
        become holes); trailing columns that no row kept are cropped off."""
        width, w = self.width, self.fed
        for j, used in enumerate(consumed):
            self.buf[j, width - w + used : width] = 0
        trailing = w - max(consumed)
        if trailing:
            self.cache.crop(-trailing)
            self.width = width - trailing

    def select(self, alive: list[int]) -> None:
        """Keep rows ``alive`` (ascending, not empty) of the batch."""
        import torch

        if len(alive) < self.buf.shape[0]:
            sel = torch.tensor(alive)
            self.cache.batch_select_indices(sel)
            self.buf = self.buf[sel]

    def compact(self, valid: Sequence[int], pays: Callable[[int, int, int], bool]) -> bool:
        """Gather the rows' real columns (``valid[j]`` each) when ``pays(rows, width,
        new_width)`` says so for a cache wider than 32 columns, or at once for a lone row
        with holes; returns whether it did."""
        b = len(valid)
        if b > 1:
            if not (self.width > 32 and pays(b, self.width, max(valid))):
                return False
        elif not (b == 1 and valid[0] < self.width):
            return False
        self.width = compact(self.cache, self.buf, self.width)
        return True


class HeadRows:
    """Pads the rows of a model's output projection (``get_output_embeddings()``, a
    ``torch.nn.Linear`` on the CPU) to the cheapest row count at or above them, measured
    once per head, CPU and torch thread count (``HeadRows.for_model``, which the
    generator calls at construction). ``with head:`` around a forward installs the
    padding hooks for that forward only; the user's model is left without them."""

    #: the most rows padded to, and the least saving that a padding must bring to be
    #: used: a fraction of the unpadded cost and seconds (the hooks' own price, so a
    #: tiny head, timed in noise, is never padded)
    TOP = 8
    MARGIN = 0.1
    FLOOR = 5e-5
    #: row counts within this fraction of the cheapest cost the same (``choose``)
    TIE = 0.05
    #: head -> {what the measurement depends on (``_key``): the padding}; this process's
    _measured: weakref.WeakKeyDictionary[Any, dict[str, dict[int, int]]] = weakref.WeakKeyDictionary()

    __slots__ = ("head", "pad", "_shape", "_handles")

    def __init__(self, head: Any, pad: dict[int, int]) -> None:
        self.head = head
        #: rows -> the rows the head evaluates (only entries that pad)
        self.pad = pad
        self._shape: tuple[int, ...] | None = None
        self._handles: list[Any] = []

    @classmethod
    def for_model(cls, model: Any, repeat: int = 3) -> HeadRows | None:
        """The padding for ``model``'s head, or None where the head is not a CPU
        ``torch.nn.Linear`` or no row count pays to pad. Measured (``measure``: each row
        count ``1..TOP`` timed ``repeat`` times, the fastest kept) once per head and
        ``_key`` in a process; for a model loaded from a converted copy in specfsm's
        cache (``loading.calibration_file``) the padding is read from beside it, or
        measured once and stored there (announced on stderr)."""
        import torch

        get = getattr(model, "get_output_embeddings", None)
        head = get() if callable(get) else None
        if type(head) is not torch.nn.Linear or head.weight.device.type != "cpu":
            return None
        key = cls._key(head)
        known = cls._measured.setdefault(head, {})
        pad = known.get(key)
        if pad is None:
            from .loading import calibration_file, store_calibration, stored_calibration

            path = calibration_file(model)
            pad = cls._pads(stored_calibration(path, "head_rows", key))
            if pad is None:
                t0 = time.perf_counter()
                pad = cls.measure(head, repeat)
                spent = time.perf_counter() - t0
                store_calibration(path, "head_rows", key, {str(m): n for m, n in pad.items()},
                                  f"timed the output projection by rows once ({spent:.2f} s)")
            known[key] = pad
        return cls(head, pad) if pad else None

    @classmethod
    def _key(cls, head: Any) -> str:
        """What a measurement of ``head`` depends on: the CPU, torch's version and thread
        count, the weight's shape and dtype, its linear layers (``linears.linears_of``) and the
        rule's constants."""
        import torch

        from .linears import linears_of

        w = head.weight
        return (f"{_cpu_name()}|torch {torch.__version__}|threads {torch.get_num_threads()}|"
                f"{tuple(w.shape)} {str(w.dtype).replace('torch.', '')} {linears_of(head)}|top {cls.TOP} margin {cls.MARGIN} "
                f"floor {cls.FLOOR} tie {cls.TIE}")

    @classmethod
    def _pads(cls, stored: Any) -> dict[int, int] | None:
        """A stored padding (``{"rows": padded rows}``) when it is well formed (each pad
        in ``rows + 1 .. TOP``), else None (measured again)."""
        if not isinstance(stored, dict):
            return None
        out = {}
        for m, n in stored.items():
            if not (isinstance(m, str) and m.isdigit() and type(n) is int and 1 <= int(m) < n <= cls.TOP):
                return None
            out[int(m)] = n
        return out

    @classmethod
    def measure(cls, head: Any, repeat: int = 3) -> dict[int, int]:
        """``{rows: padded rows}`` for the row counts whose cheapest padding (a count in
        ``rows..TOP``, the fewest rows among those that cost the same: ``choose``) costs
        less than ``1 - MARGIN`` of evaluating them as they are and saves at least
        ``FLOOR`` seconds; each count timed ``repeat`` times, the fastest kept."""
        import torch

        w = head.weight
        g = torch.Generator().manual_seed(0)
        xs = {m: torch.randn((m, w.shape[1]), generator=g, dtype=w.dtype) for m in range(1, cls.TOP + 1)}
        cost = {m: float("inf") for m in xs}
        with torch.inference_mode():
            for _ in range(max(1, repeat)):
                for m, x in xs.items():
                    t0 = time.perf_counter()
                    head(x)
                    cost[m] = min(cost[m], time.perf_counter() - t0)
        return cls.choose(cost)

    @classmethod
    def choose(cls, cost: dict[int, float]) -> dict[int, int]:
        """``measure``'s rule on seconds by rows ``1..TOP``: each row count pads to the
        fewest rows (at least its own) that cost within ``TIE`` of the cheapest, when
        that saves ``MARGIN`` and ``FLOOR``. Counts that cost the same up to timing noise
        (on MKL 4 and 5 rows are both one matrix product) are one choice, so a
        measurement kept on disk does not keep a coin toss."""
        pad = {}
        for m in range(1, cls.TOP + 1):
            cheapest = min(cost[n] for n in range(m, cls.TOP + 1))
            best = next(n for n in range(m, cls.TOP + 1) if cost[n] <= cheapest * (1 + cls.TIE))
            if best != m and cost[best] < (1 - cls.MARGIN) * cost[m] and cost[m] - cost[best] >= cls.FLOOR:
                pad[m] = best
        return pad

    def _pre(self, _mod: Any, args: tuple[Any, ...]) -> Any:
        x = args[0]
        rows = x.numel() // x.shape[-1]
        to = self.pad.get(rows)
        if to is None or len(args) != 1:
            self._shape = None
            return None
        self._shape = tuple(x.shape)
        xp = x.new_zeros((to, x.shape[-1]))
        xp[:rows] = x.reshape(rows, x.shape[-1])
        return (xp,)

    def _post(self, _mod: Any, _args: Any, out: Any) -> Any:
        shape, self._shape = self._shape, None
        if shape is None:
            return None
        return out[: math.prod(shape[:-1])].view(*shape[:-1], out.shape[-1])

    def __enter__(self) -> HeadRows:
        self._handles = [self.head.register_forward_pre_hook(self._pre), self.head.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._shape = None


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    """The processor's model name (Linux's ``/proc/cpuinfo``, else ``platform``)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{platform.machine()} {line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} x{os.cpu_count()}"


def max_positions(config: Any) -> int | None:
    """The longest sequence ``config`` declares, or None."""
    for name in ("max_position_embeddings", "n_positions"):
        v = getattr(config, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def eos_ids(value: Any, model: Any, vocab: int) -> frozenset[int]:
    """The ids that end a request: ``"model"`` (the model's generation config, taken as
    it is), None, an id or a collection of ids (each an integer in ``0..vocab-1``)."""
    if isinstance(value, str):
        if value != "model":
            raise ValueError(f"eos_token_id must be 'model', None, an id or ids, got {value!r}")
        value = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if value is None:
            return frozenset()
        return frozenset((int(value),) if isinstance(value, (int, np.integer)) else (int(e) for e in value))
    if value is None:
        return frozenset()
    many = not isinstance(value, (int, np.integer, bool, np.bool_))
    if many:
        if isinstance(value, (bytes, bytearray, float, np.floating)) or not hasattr(value, "__iter__"):
            raise TypeError(f"eos_token_id must be 'model', None, an id or ids, got {type(value).__name__} {value!r}")
        items = list(value)
    else:
        items = [value]
    out = []
    for i, e in enumerate(items):
        where = f"eos_token_id[{i}]" if many else "eos_token_id"
        if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer)):
            raise TypeError(f"{where} must be an integer token id, got {type(e).__name__} {e!r}")
        if not 0 <= e < vocab:
            raise ValueError(f"{where}={int(e)} is outside the model's vocabulary 0..{vocab - 1}")
        out.append(int(e))
    return frozenset(out)


def measure_costs(model: Any, forward: Callable[..., Any], batch: int, context: int, widths: Sequence[int],
                  repeat: int) -> dict[int, float]:
    """Seconds per forward by rows (``batch`` times each of ``widths``) on a
    ``context``-token cache (cut to the model's positions), the fastest of ``repeat``
    rounds (each round measures every width, so a burst of load on a shared machine hits
    all widths alike, not one)."""
    import torch

    vocab = int(model.config.vocab_size)
    limit = max_positions(model.config)
    if limit is not None:
        context = max(1, min(context, limit - max(widths)))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, context), generator=g)
    pos = torch.arange(context).expand(batch, context)
    cache = new_cache(model)
    # a batch decodes with an explicit mask (holes), so its cost is measured with one
    ones = torch.ones((batch, context + max(widths)), dtype=torch.long) if batch > 1 else None
    forward(ids, pos, None if ones is None else ones[:, :context], cache, keep=1)
    costs = {batch * w: float("inf") for w in widths}
    inputs = []
    for w in widths:
        x = torch.randint(0, vocab, (batch, w), generator=g)
        p = torch.arange(context, context + w).expand(batch, w)
        inputs.append((w, x, p, None if ones is None else ones[:, : context + w]))
    for _ in range(max(1, repeat)):
        for w, x, p, m in inputs:
            s = time.perf_counter()
            forward(x, p, m, cache)
            costs[batch * w] = min(costs[batch * w], time.perf_counter() - s)
            cache.crop(-w)
    return costs


def first_mismatch(model: Any, prompt: Sequence[int], got: Sequence[int], want: Sequence[int]) -> dict[str, Any] | None:
    """Where ``got`` parts from ``want`` (both generated after ``prompt``), with the gap
    between the model's top two logits there: a gap near zero is a floating-point tie,
    a large one a bug. None when they are equal."""
    import torch

    n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if n is None:
        if len(got) == len(want):
            return None
        n = min(len(got), len(want))
        return {"index": n, "got": list(got[n : n + 1]), "want": list(want[n : n + 1]), "top2_gap": None,
                "note": f"lengths differ: {len(got)} vs {len(want)}"}
    ids = torch.tensor([list(prompt) + list(want[:n])])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return {
        "index": n,
        "got": int(got[n]),
        "want": int(want[n]),
        "top2_gap": float(top.values[0] - top.values[1]),
        "logit_gap_want_got": float(logits[int(want[n])] - logits[int(got[n])]),
    }
