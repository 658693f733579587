"""Output-quality figures reported next to every acceptance / speedup number.

A collapsed model (one token repeated) agrees with itself and inflates acceptance rates, so
the docs report degeneracy figures beside each such number (docs/design.md).
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
    grams = [tuple(t[i : i + n]) for i in range(len(t) - n + 1)]
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


def eos_completion_figures(
    completions: Sequence[Sequence[int]], eos_ids: Sequence[int], budget: int
) -> dict:
    """Figures of completions (``int`` id lists of ``budget`` tokens, EOS tails included).

    Returns ``{"per_completion": [...], "mean": {...}}``: per completion the answer length
    (tokens before the first EOS), whether an EOS occurs within ``budget``, the share of
    EOS positions in the whole completion, and the degeneracy figures
    (:func:`jaxspec.eval.metrics.degeneracy`) of the text before the first EOS; means of all
    of them (``ends_with_eos`` as a share)."""
    eos = {int(e) for e in eos_ids}
    rows = []
    for c in completions:
        c = [int(t) for t in c][:budget]
        first = next((i for i, t in enumerate(c) if t in eos), None)
        answer = c if first is None else c[:first]
        rows.append(
            {
                "answer_tokens": len(answer),
                "ends_with_eos": first is not None,
                "eos_share": sum(t in eos for t in c) / max(len(c), 1),
                **degeneracy(answer),
            }
        )
    keys = (
        "answer_tokens",
        "eos_share",
        "distinct_token_share",
        "repeated_ngram_rate",
        "longest_run",
    )
    mean = {k: float(np.mean([r[k] for r in rows])) if rows else 0.0 for k in keys}
    mean["ends_with_eos"] = float(np.mean([r["ends_with_eos"] for r in rows])) if rows else 0.0
    return {"per_completion": rows, "mean": mean}


def answer_degeneracy(
    completions: Sequence[Sequence[int]], eos_ids: Sequence[int], budget: int
) -> dict[str, float]:
    """Row figures of a diffusion benchmark: :func:`degeneracy` of the text before
    each completion's first EOS (means; ``longest_run`` the max), the mean answer length
    ``answer_tokens`` and the mean share of EOS positions ``eos_share`` (the EOS tail that
    instruct dLLMs pad a block with, easy to accept, reported apart from the answer).

    Args:
      completions: every generated position of each completion (``budget`` ids, no cut).
      eos_ids: the EOS ids; budget: the generation length.
    """
    eos = {int(e) for e in eos_ids}
    rows = [[int(t) for t in c][:budget] for c in completions]
    answers = [next((r[:i] for i, t in enumerate(r) if t in eos), r) for r in rows]
    n = max(len(rows), 1)
    return {
        **mean_degeneracy(answers),
        "answer_tokens": round(sum(map(len, answers)) / n, 2),
        "eos_share": round(sum(sum(t in eos for t in r) / max(len(r), 1) for r in rows) / n, 4),
    }


def shannon_entropy(tokens: Sequence[int]) -> float:
    """ASSD paper Eq. 22: ``-sum_x f(x) log2 f(x)`` over the token frequencies ``f`` of one
    sequence (bits)."""
    t = np.asarray(tokens)
    if t.size == 0:
        return 0.0
    _, c = np.unique(t, return_counts=True)
    f = c / c.sum()
    return float(-(f * np.log2(f)).sum())
