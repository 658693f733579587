"""Output-quality figures reported next to every acceptance / speedup number.

A collapsed model (one token repeated) agrees with itself and inflates acceptance rates, so
DESIGN.md requires degeneracy figures beside each such number.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def degeneracy(tokens: Sequence[int], n: int = 4) -> dict[str, float]:
    """Degeneracy figures of one generated sequence.

    Args:
      tokens: generated token ids.
      n: n-gram order for the repetition rate (4 by convention).

    Returns:
      ``distinct_token_share``: distinct tokens / tokens (1.0 = no token repeated; a
      collapsed output tends to 0); ``repeated_ngram_rate``: share of the sequence's n-grams
      that already occurred earlier in it (0 = none repeated, ~1 = a loop);
      ``longest_run``: longest run of one identical token.
    """
    t = list(tokens)
    if not t:
        return {"distinct_token_share": 0.0, "repeated_ngram_rate": 0.0, "longest_run": 0}
    grams = [tuple(t[i:i + n]) for i in range(len(t) - n + 1)]
    seen, rep = set(), 0
    for g in grams:
        rep += g in seen
        seen.add(g)
    run = best = 1
    for a, b in zip(t, t[1:]):
        run = run + 1 if a == b else 1
        best = max(best, run)
    return {
        "distinct_token_share": len(set(t)) / len(t),
        "repeated_ngram_rate": rep / len(grams) if grams else 0.0,
        "longest_run": best,
    }


def mean_degeneracy(rows: Sequence[Sequence[int]], n: int = 4) -> dict[str, float]:
    """Mean of :func:`degeneracy` over several sequences (``longest_run`` is the max)."""
    figs = [degeneracy(r, n) for r in rows]
    if not figs:
        return degeneracy([], n)
    return {
        "distinct_token_share": round(sum(f["distinct_token_share"] for f in figs) / len(figs), 4),
        "repeated_ngram_rate": round(sum(f["repeated_ngram_rate"] for f in figs) / len(figs), 4),
        "longest_run": max(f["longest_run"] for f in figs),
    }


def shannon_entropy(tokens: Sequence[int]) -> float:
    """ASSD paper Eq. 22: ``-sum_x f(x) log2 f(x)`` over the token frequencies ``f`` of one sequence (bits)."""
    t = np.asarray(tokens)
    if t.size == 0:
        return 0.0
    _, c = np.unique(t, return_counts=True)
    f = c / c.sum()
    return float(-(f * np.log2(f)).sum())
