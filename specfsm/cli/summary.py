"""The table ``specfsm replay`` prints from a replay summary (``--json`` prints the
summary itself); a statistic with no data shows as "n/a" (``null`` in the JSON)."""

from __future__ import annotations

from typing import Any

from .._cli_args import plural

__all__ = ["format_summary", "plural", "LABELS"]

LABELS = {"compiled": "compiled core", "python": "python twin"}
DRAFTER_LABELS = {
    "suffix": "suffix index",
    "suffix-shared": "suffix index + shared cache",
    "ngram": "n-gram index",
    "prompt": "prompt lookup",
    "arctic": "Arctic suffix decoding",
}




def _num(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable table ``specfsm replay`` prints."""
    st = s["settings"]
    lo, hi = st["ngram"]
    ng = f"{lo}" if lo == hi else (f"{lo}.." if hi is None else f"{lo}..{hi}")
    drafter = DRAFTER_LABELS.get(st["drafter"], st["drafter"])
    ratio = s["evaluation_ratio"]
    rows: list[tuple[str, str]] = [
        ("requests", f"{s['requests']:,}"),
        ("prompt tokens", f"{s['prompt_tokens']:,}"),
        ("output tokens", f"{s['output_tokens']:,}" + (
            "   (each output is its prompt with 3 names renamed: as many tokens)"
            if str(s.get("workload", {}).get("source", "")).startswith("embedded: code edits")
            and s["output_tokens"] == s["prompt_tokens"] else "")),
        ("target evaluations, plain greedy", f"{s['evaluations_greedy']:,}"),
        (
            "target evaluations, speculative",
            f"{s['evaluations_speculative']:,}   ("
            + ("n/a" if ratio is None else f"{ratio:.2f}x fewer")
            + f"; {_num(s['tokens_per_evaluation'])} tokens per evaluation)",
        ),
        ("verify rounds", f"{s['verifies']:,}   ({s['rollbacks']:,} rolled back)"),
        (
            "mean accepted length",
            "n/a (no verify rounds)" if s["mean_accepted_length"] is None else
            f"{s['mean_accepted_length']:.2f} of {s['mean_draft_length']:.2f} drafted tokens per verify",
        ),
        (
            "acceptance by draft position",
            "  ".join(f"{i + 1}: {_num(a, '.0%')}" for i, a in enumerate(s["acceptance_by_position"]))
            or "(no drafts)",
        ),
    ]
    cp = s["control_us_per_token"]
    for kind in ("compiled", "python"):
        if kind not in cp:
            continue
        v = cp[kind]
        if v is None:
            text = f"skipped: {s['skipped'].get(kind, 'not available')}" if kind in s["skipped"] else "n/a (no output tokens)"
        else:
            text = f"{v:.2f} µs/token"
            if kind == "python" and cp.get("compiled"):
                text += f"   ({v / cp['compiled']:.0f}x the compiled core)"
        rows.append((f"control plane, {LABELS[kind]}", text))
    width = max(len(r[0]) for r in rows)
    head = (
        f"specfsm replay: {s['workload']['source']}\n"
        f"drafter {drafter} (n-gram {ng}), k {st['k']}, rule {st['rule']}, "
        f"batches of {plural(st['batch'], 'request')}\n"
    )
    body = "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
    measured = [k for k in ("compiled", "python") if k in s["runs"]]
    impls = " and ".join(LABELS[k] for k in measured)
    n = s["requests"]
    if s["identical"]:
        if n == 1:
            tail = f"identity: the speculative output equals its plain greedy output ({impls})"
        else:
            tail = f"identity: all {n:,} speculative outputs equal their plain greedy outputs ({impls})"
    else:
        bad = {k: len(v) for k, v in s["mismatches"].items() if v}
        tail = "IDENTITY FAILED: " + (
            ", ".join(
                f"{plural(m, 'request')} {'differs' if m == 1 else 'differ'} from plain greedy ({LABELS[k]})"
                for k, m in bad.items()
            )
            or "the implementations took different decisions"
        )
    notes = "".join(f"note: {note}\n" for note in s.get("notes", ()))
    return f"{head}\n{body}\n\n{tail}\n{notes}"
