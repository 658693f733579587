"""Output lines shared by the command-line tools."""

from __future__ import annotations


def compare_line(method: str, reference: str, res, ref, verdict: str) -> str:
    """The ``[compare]`` line: output identity verdict, wall-clock speedup and NFE ratio of
    ``res`` (the method) against ``ref`` (its reference decoder)."""
    return (f"[compare] {method} vs {reference} outputs: {verdict}; wall-clock speedup "
            f"{ref.run_s / max(res.run_s, 1e-9):.2f}x; NFE ratio "
            f"{ref.stats.target_nfe.sum() / max(res.stats.target_nfe.sum(), 1):.2f}x")
