"""A draft length that pays: expected tokens per unit of forward cost.

A verify of K rows costs more than one decode (on a CPU, SmolLM2-135M verifying 2 rows
costs about twice a decode, 11 rows about 2.8 times), so a long draft with a low
acceptance rate loses. ``CostModel`` holds the measured cost of one forward by the
number of rows it evaluates; ``AcceptanceStats`` keeps acceptance by draft position;
``choose_width`` picks the step's draft length (0, a plain decode, included) that
maximises expected emitted tokens per unit of cost, for one request or a whole batch.

Row convention (specfsm's): a K-token draft is verified in K rows; accepting ``n < K``
draft tokens emits ``n + 1`` tokens (the accepted ones and the target's own), accepting
all K emits K. So with ``c_j`` the probability that draft position ``j`` is accepted
given that every earlier one was, a K-token draft emits in expectation
``1 + c_1 + c_1 c_2 + ... + c_1 ... c_{K-1}`` tokens, and a 1-token draft is worth
exactly one decode.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence

from .._checks import check_count, nonnegative_real

__all__ = [
    "CostModel",
    "OnlineCost",
    "OnlineCostByBatch",
    "CompactionCost",
    "PRIOR_COST",
    "PRIOR_COSTS",
    "padded_prior",
    "AcceptanceStats",
    "AcceptanceByMatch",
    "RequestBackoff",
    "expected_tokens",
    "choose_width",
    "choose_batch_width",
]


def _rows(value: object, name: str) -> int:
    """A count of at least 1 (rows, requests, columns, cells), or TypeError / ValueError
    naming ``name``."""
    n = check_count(value, name)
    if n < 1:
        raise ValueError(f"{name} must be at least 1, got {n}")
    return n


def _seconds(value: object) -> float:
    """A timing: a finite number of seconds >= 0 (an infinite or NaN one would price
    every width at inf or NaN), or TypeError / ValueError naming ``seconds``."""
    return nonnegative_real(value, "seconds")


class CostModel:
    """The cost of one model forward by the number of rows it evaluates (all requests
    of a batch together), interpolated linearly between measured sizes and extrapolated
    linearly beyond the largest. Refuses an empty table and costs that are not positive and
    finite.

    ``monotone`` (the default) makes a noisy measurement physically sensible before it is
    used: a forward of ``r`` rows costs at most ``r / r0`` times the smallest measured
    forward (``r0`` rows; one batched forward is never slower than the forwards it
    replaces), and no more than any larger forward (the cost of ``r`` rows becomes the
    least measured at ``r`` or more rows), so costs never fall as rows grow. On a loaded
    machine a slow sample at one size otherwise makes that width (or every draft) look
    dear, and the chooser falls back to plain decodes. ``measured`` keeps the table as
    given.

    ``monotone="cap"`` applies only the first rule. A CPU's matrix kernels are cheaper at
    some row counts than at fewer rows (SmolLM2-135M, one thread: 4 rows cost less than
    3, 12 less than 11, multiples of 4 least), and the chooser exploits that when the
    table keeps it: a longer draft at a cheaper width costs less and expects no fewer
    tokens. ``monotone=False`` keeps the table as measured."""

    def __init__(self, costs: Mapping[int, float], *, monotone: bool | str = True) -> None:
        if not costs:
            raise ValueError("costs must hold at least one (rows, seconds) entry")
        items = sorted((int(r), float(c)) for r, c in costs.items())
        for r, c in items:
            if r < 1:
                raise ValueError(f"costs: row count must be positive, got {r}")
            if not (c > 0 and math.isfinite(c)):
                raise ValueError(f"costs: cost of {r} rows must be positive and finite, got {c}")
        self.rows = [r for r, _ in items]
        self.measured = [c for _, c in items]
        if monotone not in (True, False, "cap"):
            raise ValueError(f"monotone must be True, False or 'cap', got {monotone!r}")
        cs = list(self.measured)
        if monotone:
            r0, c0 = self.rows[0], cs[0]
            cs = [min(c, c0 * r / r0) for r, c in zip(self.rows, cs)]
        if monotone is True:
            for i in range(len(cs) - 2, -1, -1):
                cs[i] = min(cs[i], cs[i + 1])
        self.monotone = monotone
        self.costs = cs

    def __call__(self, rows: int) -> float:
        rs, cs = self.rows, self.costs
        if len(rs) == 1:
            return cs[0] * rows / rs[0]
        if rows <= rs[0]:
            return cs[0]
        i = bisect.bisect_left(rs, rows)
        if i == len(rs):
            i -= 1  # extrapolate with the last segment's slope
        r0, r1, c0, c1 = rs[i - 1], rs[i], cs[i - 1], cs[i]
        return max(c0 + (c1 - c0) * (rows - r0) / (r1 - r0), cs[0])

    def __repr__(self) -> str:
        return "CostModel({" + ", ".join(f"{r}: {c:.3g}" for r, c in zip(self.rows, self.costs)) + "})"


def _prior(shape: Sequence[float], wide: Sequence[float]) -> CostModel:
    """A prior of ``shape`` (1 to 32 rows) and ``wide`` (40, 48, 64, 96 and 128 rows)."""
    return CostModel({**{r + 1: c for r, c in enumerate(shape)}, **dict(zip((40, 48, 64, 96, 128), wide))},
                     monotone="cap")


#: the shape of a small model's forward cost on a CPU, in units of one decode: SmolLM2-135M,
#: one torch thread, 900 tokens of context, each row count the fastest of 5 rounds (rows
#: a multiple of 4 run cheaper kernels: 4 rows cost 1.52 decodes, 3 rows 2.02). What
#: ``OnlineCost`` assumes before it has measured anything; kept as measured (``"cap"``).
_PRIOR_SHAPE = (
    1.0, 1.65, 2.02, 1.52, 1.75, 1.73, 1.96, 1.83, 2.06, 2.04, 2.15, 1.99, 2.23, 2.22, 2.47, 2.35,
    2.47, 2.46, 2.7, 2.54, 2.67, 2.69, 2.96, 2.77, 3.0, 3.07, 3.16, 3.16, 3.4, 3.34, 3.34, 3.2,
)
PRIOR_COST = _prior(_PRIOR_SHAPE, (3.75, 4.26, 5.34, 7.52, 9.47))
#: the same shape with the linear layers packed (``linears.pack_linears``), measured the
#: same way (the mean of two measurements, 2026-12-05): 2 to 6 rows cost 1.27-1.35 decodes
#: where they cost 1.52-2.02 stock; past 16 rows attention and the per-row work dominate
_PACKED_SHAPE = (
    1.0, 1.35, 1.34, 1.27, 1.30, 1.35, 1.55, 1.58, 1.56, 1.65, 1.67, 1.69, 1.86, 1.89, 2.03, 2.01,
    2.11, 2.14, 2.38, 2.30, 2.36, 2.43, 2.54, 2.56, 2.70, 2.70, 2.78, 2.77, 2.90, 3.01, 3.11, 3.07,
)
#: both shapes with the attention grouped too (``attention.group_attention``), measured the
#: same way (2026-12-06): packed, 2 to 6 rows cost 1.00-1.09 decodes
_PACKED_GROUPED_SHAPE = (
    1.00, 1.09, 1.05, 1.00, 1.04, 1.05, 1.21, 1.28, 1.31, 1.36, 1.40, 1.46, 1.60, 1.66, 1.73, 1.73,
    1.81, 1.88, 1.98, 2.03, 2.07, 2.16, 2.23, 2.28, 2.41, 2.41, 2.49, 2.50, 2.60, 2.69, 2.79, 2.78,
)
_STOCK_GROUPED_SHAPE = (
    1.00, 1.51, 1.85, 1.38, 1.58, 1.61, 1.79, 1.65, 1.85, 1.85, 2.04, 1.89, 2.09, 2.11, 2.29, 2.16,
    2.37, 2.38, 2.55, 2.42, 2.62, 2.64, 2.80, 2.72, 2.93, 2.91, 3.07, 2.94, 3.13, 3.13, 3.31, 3.19,
)
#: the prior by the model's linear layers and attention (``linears.linears_of``,
#: ``attention.attention_of``)
PRIOR_COSTS = {
    ("stock", "stock"): PRIOR_COST,
    ("packed", "stock"): _prior(_PACKED_SHAPE, (3.75, 4.37, 5.33, 7.86, 10.0)),
    ("packed", "grouped"): _prior(_PACKED_GROUPED_SHAPE, (3.32, 3.89, 4.89, 7.12, 9.40)),
    ("stock", "grouped"): _prior(_STOCK_GROUPED_SHAPE, (3.73, 4.32, 5.16, 7.26, 9.45)),
}


def padded_prior(prior: CostModel, pad: Mapping[int, int]) -> CostModel:
    """``prior`` for a model whose forwards evaluate ``r`` rows at the cost of
    ``pad[r]`` rows or less (``evaluate.HeadRows``: the output projection padded to a
    cheaper row count): each padded row count costs at most what its padded count does.
    Without it a row count the prior found dear only for its head (SmolLM2, one thread:
    3 rows 2.02 decodes, 4 rows 1.52) stays dear in ``OnlineCost``'s table until it is
    timed, and the chooser, avoiding it, never times it: a batch of 3 requests verified
    a 1-token draft each (6 rows, 106 ms a forward) for 43 steps and never decoded;
    with this prior it timed a decode (3 rows, padded to 4) at 86 ms. The table keeps
    ``prior``'s rows and ``monotone``."""
    table = {r: prior(r) for r in prior.rows}
    for r, to in pad.items():
        if to > r >= 1:
            table[r] = min(prior(r), prior(to))
    return CostModel(table, monotone=prior.monotone)


class OnlineCost:
    """A cost model learnt from the forwards a generator runs anyway, in place of a
    separate calibration (which on a short run costs more than it saves, and on a loaded
    machine measures the load as much as the model).

    ``record(rows, seconds)`` keeps the last ``window`` timings of each row count;
    ``estimates()`` is their median, for row counts timed at least ``min_samples``
    times. ``model()`` is ``PRIOR_COST`` (or ``prior``) scaled to the estimates (by the
    median ratio estimate / prior), each estimated row count in place of the prior's
    but kept within ``spread`` times the scaled prior either way, made monotone as the
    prior is (``CostModel``'s ``monotone``); before any estimate it is the prior itself.

    Why medians and bounds, not the fastest timing: on a loaded machine the fastest of
    many timings is far below the fastest of a few, so the row count timed most (plain
    decodes, once drafting stops) would look ever cheaper than the rest and the chooser
    would stop drafting for good (measured under load: one row 0.069 s, eight 0.505 s
    as fastest timings, 7.3 times, where the model's shape is 1.8 times)."""

    __slots__ = ("prior", "samples", "window", "min_samples", "spread", "_model")

    def __init__(self, prior: CostModel | None = None, *, window: int = 16, min_samples: int = 3,
                 spread: float = 2.0) -> None:
        if type(window) is not int or window < 1:
            raise ValueError(f"window must be a positive integer, got {window!r}")
        if type(min_samples) is not int or not 1 <= min_samples <= window:
            raise ValueError(f"min_samples must be an integer in 1..window={window}, got {min_samples!r}")
        if not spread >= 1:
            raise ValueError(f"spread must be at least 1, got {spread!r}")
        self.prior = PRIOR_COST if prior is None else prior
        self.samples: dict[int, list[float]] = {}
        self.window, self.min_samples, self.spread = window, min_samples, float(spread)
        self._model: CostModel | None = None

    def record(self, rows: int, seconds: float) -> None:
        """One forward of ``rows`` rows that took ``seconds``. A timing of exactly 0 (a
        clock that did not move) is ignored: it says nothing, and a zero median would
        make the cost table refuse itself. Refuses (before changing anything) ``rows``
        that is not an integer >= 1 and ``seconds`` that is not a finite number >= 0."""
        rows, seconds = _rows(rows, "rows"), _seconds(seconds)
        if seconds > 0:
            got = self.samples.setdefault(rows, [])
            got.append(seconds)
            if len(got) > self.window:
                del got[0]
            self._model = None

    def estimates(self) -> dict[int, float]:
        """The median timing of each row count timed at least ``min_samples`` times."""
        out = {}
        for r, got in self.samples.items():
            if len(got) >= self.min_samples:
                g = sorted(got)
                n = len(g)
                out[r] = g[n // 2] if n % 2 else (g[n // 2 - 1] + g[n // 2]) / 2
        return out

    def model(self) -> CostModel:
        if self._model is None:
            est = self.estimates()
            if not est:
                self._model = self.prior
            else:
                ratios = sorted(c / self.prior(r) for r, c in est.items())
                scale = ratios[len(ratios) // 2]
                table = {r: self.prior(r) * scale for r in self.prior.rows}
                for r, c in est.items():
                    p = self.prior(r) * scale
                    table[r] = min(max(c, p / self.spread), p * self.spread)
                self._model = CostModel(table, monotone=self.prior.monotone)
        return self._model

    def __repr__(self) -> str:
        return f"OnlineCost(estimates={{{', '.join(f'{r}: {c:.3g}' for r, c in sorted(self.estimates().items()))}}})"


class OnlineCostByBatch:
    """``OnlineCost`` kept apart for each batch size: a forward's cost is not a function
    of its rows alone. SmolLM2-135M on one thread, about 300 tokens of context: on a
    clean cache 4 requests of 8 rows cost 290 ms and one request of 32 rows 269 ms
    (``evaluate.measure_costs``), but inside a batch's run, whose ragged cache carries
    holes and is as wide as its widest request, 4 requests of 8 rows took 320-386 ms
    (medians of two runs). A table by rows alone, learnt from single requests (a run of
    them before a batch, as ``specfsm generate --compare`` does) or from a batch's tail
    after most of its requests finished, makes a batch's wide verifies look cheap.

    ``record(batch, rows, seconds)`` files a forward under its batch size;
    ``model(batch)`` is that batch size's ``OnlineCost.model()`` once it has estimates,
    else the nearest batch size's that has them (the larger on a tie), else the prior.
    ``window``, ``min_samples`` and ``spread`` are each batch size's ``OnlineCost``'s."""

    __slots__ = ("prior", "by_batch", "window", "min_samples", "spread")

    def __init__(self, prior: CostModel | None = None, *, window: int = 16, min_samples: int = 3,
                 spread: float = 2.0) -> None:
        OnlineCost(prior, window=window, min_samples=min_samples, spread=spread)  # the arguments' checks
        self.prior = PRIOR_COST if prior is None else prior
        self.window, self.min_samples, self.spread = window, min_samples, float(spread)
        self.by_batch: dict[int, OnlineCost] = {}

    def record(self, batch: int, rows: int, seconds: float) -> None:
        """One forward of ``batch`` requests evaluating ``rows`` rows in all (at least
        one per request) that took ``seconds``; a timing of exactly 0 is ignored, as
        ``OnlineCost.record`` does. Refuses (before changing anything) a ``batch`` or
        ``rows`` that is not an integer, ``batch`` < 1, ``rows`` < ``batch``, and
        ``seconds`` that is not a finite number >= 0."""
        batch, rows, seconds = _rows(batch, "batch"), check_count(rows, "rows"), _seconds(seconds)
        if rows < batch:
            raise ValueError(f"rows must be at least batch={batch} (one per request), got {rows}")
        if seconds > 0:
            got = self.by_batch.get(batch)
            if got is None:
                got = self.by_batch[batch] = OnlineCost(self.prior, window=self.window,
                                                        min_samples=self.min_samples, spread=self.spread)
            got.record(rows, seconds)

    def estimates(self, batch: int) -> dict[int, float]:
        """``batch``'s own median timings by rows (``OnlineCost.estimates``)."""
        got = self.by_batch.get(batch)
        return got.estimates() if got is not None else {}

    def model(self, batch: int = 1) -> CostModel:
        own = self.by_batch.get(batch)
        if own is not None and (m := own.model()) is not own.prior:
            return m  # the usual case: this batch size has timings (its table is cached)
        known = [b for b, o in self.by_batch.items() if o.estimates()]
        if not known:
            return self.prior
        near = min(known, key=lambda b: (abs(b - batch), -b))
        return self.by_batch[near].model()

    def __repr__(self) -> str:
        return "OnlineCostByBatch({" + ", ".join(f"{b}: {o!r}" for b, o in sorted(self.by_batch.items())) + "})"


class CompactionCost:
    """Whether gathering a ragged batch cache pays: the copy against the attention it
    saves, both measured on the run's own forwards.

    Gathering each row's real columns to the right shrinks a cache of ``width`` columns
    to the longest row's ``new_width``; every later forward then attends over
    ``width - new_width`` fewer columns per row. ``record_forward(rows, width, seconds)``
    keeps the last ``window`` forwards (rows evaluated, cache columns, time) and fits
    ``seconds ~ a + b * rows + beta * rows * width`` by least squares: ``beta`` is the
    cost of one row attending over one more column. ``record_copy(cells, seconds)`` keeps
    the cost of a gather per cache cell (rows times columns) from the gathers done.
    ``pays(batch, width, new_width, rows, horizon)`` says whether ``horizon`` more
    forwards of ``rows`` rows save more (``beta * rows * (width - new_width) *
    horizon``) than gathering ``batch * width`` cells costs. Until both are measured (at
    least ``min_samples`` forwards spanning 8 or more cache widths, and one gather), and
    whenever the fit gives no positive ``beta``, the rule is the fallback: gather when it
    removes at least ``fraction`` of the cache. Never when it would remove nothing."""

    __slots__ = ("fraction", "window", "min_samples", "forwards", "copy", "_beta")

    def __init__(self, fraction: float = 0.5, *, window: int = 64, min_samples: int = 12) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        if type(window) is not int or type(min_samples) is not int or not 3 <= min_samples <= window:
            raise ValueError(f"need integers 3 <= min_samples <= window, got {min_samples!r}, {window!r}")
        self.fraction = float(fraction)
        self.window, self.min_samples = window, min_samples
        self.forwards: list[tuple[int, int, float]] = []
        self.copy: float | None = None  # seconds per gathered cell, decayed mean
        self._beta: float | None = None

    def record_forward(self, rows: int, width: int, seconds: float) -> None:
        """A forward of ``rows`` rows over a cache of ``width`` columns that took
        ``seconds`` (exactly 0: ignored). Refuses ``rows`` or ``width`` that is not an
        integer >= 1 and ``seconds`` that is not a finite number >= 0."""
        rows, width, seconds = _rows(rows, "rows"), _rows(width, "width"), _seconds(seconds)
        if seconds > 0:
            self.forwards.append((rows, width, seconds))
            if len(self.forwards) > self.window:
                del self.forwards[0]
            self._beta = None

    def record_copy(self, cells: int, seconds: float) -> None:
        """A gather of ``cells`` cache cells that took ``seconds`` (exactly 0: ignored).
        Refuses ``cells`` that is not an integer >= 1 and ``seconds`` that is not a
        finite number >= 0."""
        cells, seconds = _rows(cells, "cells"), _seconds(seconds)
        if seconds > 0:
            c = seconds / cells
            self.copy = c if self.copy is None else 0.5 * (self.copy + c)

    def beta(self) -> float | None:
        """The fitted cost of one row attending over one more column (None: not enough
        forwards, too narrow a spread of widths, or no positive fit)."""
        if self._beta is None:
            f = self.forwards
            widths = [w for _r, w, _t in f]
            if len(f) < self.min_samples or max(widths) - min(widths) < 8:
                return None
            import numpy as np

            x = np.array([[1.0, r, r * w] for r, w, _t in f])
            y = np.array([t for _r, _w, t in f])
            coef = np.linalg.lstsq(x, y, rcond=None)[0]
            self._beta = float(coef[2]) if coef[2] > 0 else 0.0
        return self._beta if self._beta > 0 else None

    def pays(self, batch: int, width: int, new_width: int, rows: int, horizon: float) -> bool:
        saved = width - new_width
        if saved <= 0:
            return False
        beta = self.beta()
        if beta is None or self.copy is None:
            return saved >= self.fraction * width
        return beta * rows * saved * horizon > self.copy * batch * width

    def __repr__(self) -> str:
        b = self.beta()
        return (f"CompactionCost(beta={'unknown' if b is None else f'{b:.3g}'}, "
                f"copy={'unknown' if self.copy is None else f'{self.copy:.3g}'}, fraction={self.fraction})")


class AcceptanceStats:
    """Acceptance by draft position for one request (``drafted[j]``: drafts reaching
    position ``j``; ``accepted[j]``: of those, how many had position ``j`` accepted).

    ``conditional(k, prior, weight)`` estimates ``c_1..c_k`` by mixing the counts with a
    prior (another ``AcceptanceStats``'s estimate, or a constant) worth ``weight``
    observations."""

    __slots__ = ("drafted", "accepted", "decay")

    def __init__(self, decay: float = 1.0) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.drafted: list[float] = []
        self.accepted: list[float] = []
        self.decay = decay

    def record(self, proposed: int, accepted: int) -> None:
        """One verify: ``proposed`` draft tokens, of which the first ``accepted`` kept.
        Earlier counts are first multiplied by ``decay`` (1: plain counts), so that a
        request's recent drafts weigh most."""
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted must be in 0..proposed={proposed}, got {accepted}")
        if self.decay != 1.0:
            f = self.decay
            self.drafted = [x * f for x in self.drafted]
            self.accepted = [x * f for x in self.accepted]
        while len(self.drafted) < proposed:
            self.drafted.append(0)
            self.accepted.append(0)
        # position j is reached when every earlier one was accepted
        reached = min(proposed, accepted + 1)
        for j in range(reached):
            self.drafted[j] += 1
        for j in range(accepted):
            self.accepted[j] += 1

    def conditional(self, k: int, prior: float | Sequence[float] = 0.8, weight: float = 2.0) -> list[float]:
        out = []
        for j in range(k):
            p = prior if isinstance(prior, (int, float)) else (prior[j] if j < len(prior) else prior[-1])
            d = self.drafted[j] if j < len(self.drafted) else 0
            a = self.accepted[j] if j < len(self.accepted) else 0
            out.append((a + weight * p) / (d + weight))
        return out


class AcceptanceByMatch:
    """Acceptance by draft position, kept apart for each class of match length: how long
    the earlier occurrence the draft copies matches the current suffix (``SuffixIndex``
    or ``NgramIndex`` ``match_length()``). It predicts acceptance well: on SmolLM2's
    edit outputs a 1-token match has its first draft token accepted 22% of the time, a
    4-token one 75%, 12 or more over 90%. So a long match earns a long draft and a short
    one a plain decode, where one estimate per request averages them.

    Classes: match lengths ``0, 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-23, 24-31, 32-63,
    64+`` (``EDGES``), one ``AcceptanceStats`` each, shared by every request of a
    generator. ``conditional(m, k)`` mixes a class's counts with ``prior(m)`` (constant
    across positions, rising with the match length) worth ``weight`` observations."""

    EDGES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)

    __slots__ = ("classes", "weight")

    def __init__(self, weight: float = 2.0, decay: float = 1.0) -> None:
        if not weight >= 0:
            raise ValueError(f"weight must be non-negative, got {weight!r}")
        self.weight = float(weight)
        self.classes = [AcceptanceStats(decay) for _ in self.EDGES]

    @classmethod
    def bucket(cls, match_length: int) -> int:
        """The class of a match length (negative counts as 0)."""
        return max(bisect.bisect_right(cls.EDGES, match_length) - 1, 0)

    @classmethod
    def prior(cls, match_length: int) -> float:
        """The acceptance assumed for a class before evidence: ``0.5 + 0.1 log2(1 + m)``
        at the class's shortest length ``m``, at most 0.95."""
        m = cls.EDGES[cls.bucket(match_length)]
        return min(0.95, 0.5 + 0.1 * math.log2(1 + m))

    def record(self, match_length: int, proposed: int, accepted: int) -> None:
        self.classes[self.bucket(match_length)].record(proposed, accepted)

    def conditional(self, match_length: int, k: int) -> list[float]:
        return self.classes[self.bucket(match_length)].conditional(k, self.prior(match_length), self.weight)


class RequestBackoff:
    """What one request's own drafts achieved recently, laid over the generator's shared
    estimate (``AcceptanceByMatch``, learnt from every request): so a request whose
    drafts keep failing stops drafting however well other requests' drafts did, and
    starts again when its drafter finds a long match.

    Two signals, both decayed by ``decay`` per verify so that recent drafts weigh most:

    * ``ratio()``: the request's accepted draft tokens over those the shared estimate
      predicted for its drafts (``predicted``, passed to ``record``), ``(A + s) / (P + s)``
      with ``s`` = ``smooth`` tokens of neutral evidence, at most ``ceiling`` (a request
      that does better than the shared estimate may draft more). It scales the shared
      conditionals of short matches (below ``long_match`` tokens: where open-ended text
      drafts from chance repeats).
    * per match class below ``2 * long_match`` tokens, the request's own acceptance by
      position (``AcceptanceStats``), mixed with the (scaled) shared estimate worth
      ``weight`` observations: a run of rejections in a class drops that class's
      estimate fast. Longer matches (a verbatim copy in progress) are judged by the
      shared class estimate alone (or mixed at ``long_weight``, when given), which is
      how drafting recovers.

    ``conditional(match_length, shared)`` is the request's estimate ``c_1..c_k`` given
    the shared one (``shared``, a list). Refuses a decay outside (0, 1] and non-positive
    smoothing or weights."""

    __slots__ = ("classes", "decay", "weight", "long_weight", "smooth", "ceiling", "long_match", "acc", "pred",
                 "probe_gap")

    def __init__(self, decay: float = 0.8, weight: float = 3.0, smooth: float = 3.0, ceiling: float = 1.5,
                 long_match: int = 4, long_weight: float | None = None) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        if not weight > 0:
            raise ValueError(f"weight must be positive, got {weight!r}")
        if not smooth > 0:
            raise ValueError(f"smooth must be positive, got {smooth!r}")
        if not ceiling > 0:
            raise ValueError(f"ceiling must be positive, got {ceiling!r}")
        self.decay, self.weight, self.smooth, self.ceiling = float(decay), float(weight), float(smooth), float(ceiling)
        self.long_match = int(long_match)
        if long_weight is not None and not long_weight > 0:
            raise ValueError(f"long_weight must be positive or None, got {long_weight!r}")
        self.long_weight = None if long_weight is None else float(long_weight)
        self.classes: dict[int, AcceptanceStats] = {}
        self.acc = 0.0  # decayed accepted draft tokens
        self.pred = 0.0  # decayed accepted draft tokens the shared estimate predicted
        self.probe_gap = 0  # steps between probes once the request stopped drafting (the generator's)

    def ratio(self) -> float:
        return min((self.acc + self.smooth) / (self.pred + self.smooth), self.ceiling)

    def record(self, match_length: int, proposed: int, accepted: int, predicted: float) -> None:
        """One verify: ``proposed`` draft tokens behind a ``match_length`` match, the first
        ``accepted`` kept, where the shared estimate expected ``predicted`` of them."""
        b = AcceptanceByMatch.bucket(match_length)
        st = self.classes.get(b)
        if st is None:
            st = self.classes[b] = AcceptanceStats(self.decay)
        st.record(proposed, accepted)
        self.acc = self.acc * self.decay + accepted
        self.pred = self.pred * self.decay + max(float(predicted), 0.0)

    def conditional(self, match_length: int, shared: Sequence[float]) -> list[float]:
        k = len(shared)
        if match_length < self.long_match:
            f = self.ratio()
            base = [min(c * f, 0.99) for c in shared]
        else:
            base = list(shared)
        w = self.weight
        if match_length >= 2 * self.long_match:
            if self.long_weight is None:
                return base
            w = self.long_weight
        st = self.classes.get(AcceptanceByMatch.bucket(match_length))
        if st is None:
            return base
        return st.conditional(k, base, w)


def expected_tokens(cond: Sequence[float], k: int) -> float:
    """Expected tokens emitted by a ``k``-token draft with conditional acceptance
    ``cond`` (``k`` 0 or 1: one token, a plain decode's worth)."""
    total, run = 1.0, 1.0
    for j in range(min(k, len(cond) + 1) - 1):
        run *= cond[j]
        total += run
    return total


def _expected_by_width(cond: Sequence[float], top: int) -> list[float]:
    """``expected_tokens(cond, k)`` for every ``k`` in ``0..top``, cumulated in one pass
    (the same sums in the same order)."""
    out, total, run = [1.0, 1.0], 1.0, 1.0
    for j in range(min(top, len(cond) + 1) - 1):
        run *= cond[j]
        total += run
        out.append(total)
    out += [total] * (top + 1 - len(out))
    return out


def choose_width(
    conds: Sequence[Sequence[float]], available: Sequence[int], cost: CostModel, k_max: int
) -> int:
    """The step's draft width ``W`` (0: plain decode for every request) maximising
    expected tokens per unit of cost for a batch stepping together: request ``b`` drafts
    ``min(W, available[b])`` tokens with conditional acceptance ``conds[b]``, and the
    forward evaluates ``B * max(W, 1)`` rows. Ties go to the shorter draft."""
    b = len(available)
    if b == 0:
        return 0
    best_w, best = 0, b / cost(b)
    top = min(k_max, max(available, default=0))
    runs = [_expected_by_width(c, top) for c in conds]
    for w in range(2, top + 1):
        gain = sum(r[min(w, a)] for r, a in zip(runs, available))
        value = gain / cost(b * w)
        if value > best * (1 + 1e-9):
            best_w, best = w, value
    return best_w


def choose_batch_width(
    conds: Sequence[Sequence[float]], available: Sequence[int], remaining: Sequence[int],
    cost_for: Callable[[int], CostModel], k_max: int,
) -> int:
    """The step's width for a batch that ends when its last request does (``generate``'s
    batch): the ``W`` (0 included) whose batch finishes soonest if every step from now on
    ran at ``W``. Request ``b`` has ``remaining[b]`` tokens left and emits
    ``expected_tokens(conds[b], min(W, available[b]))`` per step, so it finishes after
    ``remaining / that`` steps; while any request that drafts at ``W`` is alive every
    step evaluates ``W`` rows per request (one padded forward), after that one row; a
    step of ``n`` requests costs ``cost_for(n)(n * rows)`` (``OnlineCostByBatch.model``).

    Why not tokens per unit of cost (``choose_width``): on a CPU a batch decodes almost
    for the price of one request (SmolLM2-135M, one thread: 4 requests 134 ms, 1 request
    70 ms), so widening every step for the requests that copy, while another request
    that copies nothing keeps the batch going, adds the wide steps' price to the batch's
    end and saves little once the copying requests have finished (measured: a batch of
    a data transform and three open answers at 0.96x batched greedy ``generate``). A
    batch of one is ``choose_width`` exactly: ``remaining`` cancels out. Ties go to the
    shorter draft."""
    b = len(available)
    if b == 0:
        return 0
    if b == 1:
        return choose_width(conds, available, cost_for(1), k_max)
    top = min(k_max, max(available, default=0))
    left = [max(int(r), 1) for r in remaining]
    models: dict[int, CostModel] = {}

    def step_cost(n: int, rows: int) -> float:
        m = models.get(n)
        if m is None:
            m = models[n] = cost_for(n)
        return m(n * rows)

    def finish(gains: Sequence[float], w: int) -> float:
        ends = sorted((r / g, a >= 2) for r, g, a in zip(left, gains, available))
        drafting = sum(1 for _, d in ends if d)
        total, at = 0.0, 0.0
        for i, (end, d) in enumerate(ends):
            n = b - i
            total += (end - at) * step_cost(n, w if drafting and w >= 2 else 1)
            at = end
            drafting -= d
        return total

    runs = [_expected_by_width(c, top) for c in conds]
    best_w = 0
    best = finish([1.0] * b, 1)
    for w in range(2, top + 1):
        gains = [r[min(w, a)] if a >= 2 else 1.0 for r, a in zip(runs, available)]
        t = finish(gains, w)
        if t < best * (1 - 1e-9):
            best_w, best = w, t
    return best_w
