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
from collections.abc import Mapping, Sequence

__all__ = ["CostModel", "OnlineCost", "PRIOR_COST", "AcceptanceStats", "expected_tokens", "choose_width"]


class CostModel:
    """The cost of one model forward by the number of rows it evaluates (all requests
    of a batch together), interpolated linearly between measured sizes and extrapolated
    linearly beyond the largest. Refuses an empty table and non-positive costs.

    ``monotone`` (the default) makes a noisy measurement physically sensible before it is
    used: a forward of ``r`` rows costs at most ``r / r0`` times the smallest measured
    forward (``r0`` rows; one batched forward is never slower than the forwards it
    replaces), and no more than any larger forward (the cost of ``r`` rows becomes the
    least measured at ``r`` or more rows), so costs never fall as rows grow. On a loaded
    machine a slow sample at one size otherwise makes that width (or every draft) look
    dear, and the chooser falls back to plain decodes. ``measured`` keeps the table as
    given."""

    def __init__(self, costs: Mapping[int, float], *, monotone: bool = True) -> None:
        if not costs:
            raise ValueError("costs must hold at least one (rows, seconds) entry")
        items = sorted((int(r), float(c)) for r, c in costs.items())
        for r, c in items:
            if r < 1:
                raise ValueError(f"costs: row count must be positive, got {r}")
            if not c > 0:
                raise ValueError(f"costs: cost of {r} rows must be positive, got {c}")
        self.rows = [r for r, _ in items]
        self.measured = [c for _, c in items]
        cs = list(self.measured)
        if monotone:
            r0, c0 = self.rows[0], cs[0]
            cs = [min(c, c0 * r / r0) for r, c in zip(self.rows, cs)]
            for i in range(len(cs) - 2, -1, -1):
                cs[i] = min(cs[i], cs[i + 1])
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


#: the shape of a small model's forward cost on a CPU (SmolLM2-135M, one thread, 512
#: tokens of context: 2 rows about twice one decode, 8 about 2x, 17 about 3.3x), in units
#: of one decode: what ``OnlineCost`` assumes before it has measured anything
PRIOR_COST = CostModel({1: 1.0, 2: 1.9, 4: 1.95, 8: 2.0, 12: 2.9, 16: 3.0, 32: 5.5})


class OnlineCost:
    """A cost model learnt from the forwards a generator runs anyway, in place of a
    separate calibration (which on a short run costs more than it saves, and on a loaded
    machine measures the load as much as the model).

    ``record(rows, seconds)`` keeps the fastest forward seen for each row count (the
    least disturbed by other work on the machine). ``model()`` is ``PRIOR_COST`` (or
    ``prior``) scaled to the measurements (by the median ratio measured / prior) with the
    measured row counts in place of the prior's, made monotone by ``CostModel``; before
    any measurement it is the prior itself: a fixed cost shape until there is
    evidence."""

    __slots__ = ("prior", "best", "_model")

    def __init__(self, prior: CostModel | None = None) -> None:
        self.prior = PRIOR_COST if prior is None else prior
        self.best: dict[int, float] = {}
        self._model: CostModel | None = None

    def record(self, rows: int, seconds: float) -> None:
        if rows >= 1 and seconds > 0 and seconds < self.best.get(rows, float("inf")):
            self.best[rows] = seconds
            self._model = None

    def model(self) -> CostModel:
        if self._model is None:
            if not self.best:
                self._model = self.prior
            else:
                ratios = sorted(c / self.prior(r) for r, c in self.best.items())
                scale = ratios[len(ratios) // 2]
                table = {r: self.prior(r) * scale for r in self.prior.rows}
                table.update(self.best)
                self._model = CostModel(table)
        return self._model

    def __repr__(self) -> str:
        return f"OnlineCost(measured={{{', '.join(f'{r}: {c:.3g}' for r, c in sorted(self.best.items()))}}})"


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


def expected_tokens(cond: Sequence[float], k: int) -> float:
    """Expected tokens emitted by a ``k``-token draft with conditional acceptance
    ``cond`` (``k`` 0 or 1: one token, a plain decode's worth)."""
    total, run = 1.0, 1.0
    for j in range(min(k, len(cond) + 1) - 1):
        run *= cond[j]
        total += run
    return total


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
    for w in range(2, top + 1):
        gain = sum(expected_tokens(c, min(w, a)) for c, a in zip(conds, available))
        value = gain / cost(b * w)
        if value > best * (1 + 1e-9):
            best_w, best = w, value
    return best_w
