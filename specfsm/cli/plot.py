"""The ``--plot`` figure: acceptance by draft position as a PNG bar chart (matplotlib)."""

from __future__ import annotations

from typing import Any

from .summary import plural

__all__ = ["plot_acceptance"]


def plot_acceptance(s: dict[str, Any], path: str) -> None:
    """Acceptance by draft position from a replay summary, written to ``path`` (a PNG);
    positions with no drafts are drawn empty."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = [0.0 if a is None else a for a in s["acceptance_by_position"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(range(1, len(acc) + 1), [a * 100 for a in acc], color="#4477aa")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted (%)")
    ax.set_ylim(0, 100)
    ax.set_xticks(range(1, len(acc) + 1))
    st = s["settings"]
    tpe = s["tokens_per_evaluation"]
    ax.set_title(
        f"{plural(s['requests'], 'request')}, {st['drafter']} drafter, k={st['k']}, "
        + ("n/a" if tpe is None else f"{tpe:.2f}") + " tokens/evaluation",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
