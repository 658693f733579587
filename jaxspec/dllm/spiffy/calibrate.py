"""Spiffy's offline calibration (Algorithm 2, Eq. 24, Appendix E): which draft graph to use.

:func:`record_calibration` runs the reference (Spiffy with an empty graph) and records, for
every step, the drafting ranks; :func:`calibration_counts` turns the runs into ``count(w)`` of
every look-ahead set ``w`` (Parts 1-2); :func:`select_graph` picks the size-``D`` subgraph
that maximises degree-1 accumulation (Eq. 24), degree-0 (Eq. 26) or total accumulation
(Eqs. 27-28) (Part 3). ``python -m scripts.calibrate`` drives them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable, Optional, Sequence

import numpy as np

from jaxspec.dllm.config import DiffusionDecodeConfig
from jaxspec.dllm.spiffy.decode import SpiffyConfig, run_spiffy
from jaxspec.dllm.spiffy.graph import DraftGraph
from models.diffusion.modeling import DiffusionLM

STRATEGIES = ("degree-1", "degree-0", "total")


@dataclasses.dataclass
class CalibrationRecord:
    """One reference run, recorded for Algorithm 2 (Part 1).

    Attributes:
      transfer_step: int32 ``(B, G)`` the step that unmasked each position.
      tokens: int32 ``(B, G)`` the generated tokens.
      rank: int32 ``(B, G, L)`` before step ``s``: the position rank (0-based, Eq. 12) of every
        position of the step's block under the drafting distribution (the last one computed).
      top: int32 ``(B, G, L, J)`` its top-``J`` tokens per position (Eq. 13).
      ok: bool ``(B, G)`` step ``s`` had a drafting distribution (not a block's first step).
      block_length: ``L``.
    """

    transfer_step: np.ndarray
    tokens: np.ndarray
    rank: np.ndarray
    top: np.ndarray
    ok: np.ndarray
    block_length: int


def record_calibration(
    model: DiffusionLM,
    params,
    prompts: Sequence[Sequence[int]],
    decode: DiffusionDecodeConfig,
    max_vocab_rank: int = 3,
    seed: int = 0,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    max_context: Optional[int] = None,
) -> CalibrationRecord:
    """Run the reference (Spiffy with an empty graph: the vanilla decoder) and record, before
    every step, the drafting ranks (Algorithm 2, Part 1).

    Raises: ValueError: no prompts, or as :func:`spiffy_generate`."""
    if not prompts:
        raise ValueError("the calibration set has no samples")
    cfg = SpiffyConfig(decode, DraftGraph(()))
    (toks, tstep, _, rec), _, _ = run_spiffy(
        model, params, prompts, cfg, seed, eos_ids, pad_id, 16, max_context, None, max_vocab_rank
    )
    return CalibrationRecord(tstep, toks, rec.rank, rec.top, rec.ok, decode.block_length)


def _transfers_by_step(transfer_step: np.ndarray) -> dict:
    """``{step: [positions]}`` of one row, steps in order (positions stable-sorted)."""
    order: dict = {}
    for p in np.argsort(transfer_step, kind="stable"):
        order.setdefault(int(transfer_step[p]), []).append(int(p))
    return order


def _lookahead_sets(rec: CalibrationRecord, b: int, s: int, order: dict, lookahead: int):
    """Yield ``(k - 1, w)`` for the look-aheads ``k = 1..lookahead`` from step ``s`` of row
    ``b``: ``w`` the frozenset of 1-based ``(i, j)`` pairs of the tokens unmasked in steps
    ``s .. s+k-1``; stops at the block's end or at a token outside the recorded top-``J``."""
    L = rec.block_length
    blk = order[s][0] // L
    pairs = set()
    for k in range(lookahead):
        ps = order.get(s + k)
        if ps is None or ps[0] // L != blk:
            return
        for p in ps:
            hit = np.nonzero(rec.top[b, s, p % L] == rec.tokens[b, p])[0]
            if not len(hit):
                return
            pairs.add((int(rec.rank[b, s, p % L]) + 1, int(hit[0]) + 1))
        yield k, frozenset(pairs)


def calibration_counts(records: Iterable[CalibrationRecord], lookahead: int) -> list[Counter]:
    """``count(w)`` of every look-ahead set (Algorithm 2, Parts 1-2).

    For every recorded step ``s`` with a drafting distribution and every look-ahead
    ``k = 1..lookahead`` whose steps ``s .. s+k-1`` stay in ``s``'s block, the set ``w`` of
    ``(i, j)`` pairs (1-based, Eqs. 12-13, relative to the drafting distribution before step
    ``s``) of the tokens unmasked in those steps is counted at level ``k``. Sets with a token
    outside the recorded top-``J`` are not representable and are skipped.

    Returns: ``counts[k - 1]`` a Counter of frozensets at look-ahead ``k``.

    Raises: ValueError: no recorded step had a drafting distribution (no samples).
    """
    counts = [Counter() for _ in range(lookahead)]
    seen = 0
    for rec in records:
        for b in range(rec.tokens.shape[0]):
            order = _transfers_by_step(rec.transfer_step[b])
            for s in order:
                if not rec.ok[b, s]:
                    continue
                seen += 1
                for k, w in _lookahead_sets(rec, b, s, order, lookahead):
                    counts[k][w] += 1
    if not seen:
        raise ValueError(
            "the calibration set has no samples (no step with a drafting distribution was recorded)"
        )
    return counts


def candidate_graph(counts: Sequence[Counter], per_level: int = 3):
    """Part 2: the top-``per_level`` most frequent sets of every look-ahead level.

    Returns: ``(levels, count)``: ``levels[k]`` the chosen frozensets of level ``k + 1`` and
    ``count`` a dict set -> frequency."""
    levels, count = [], {}
    for c in counts:
        top = sorted(c.items(), key=lambda kv: (-kv[1], sorted(kv[0])))[:per_level]
        levels.append([w for w, _ in top])
        count.update(top)
    return levels, count


def _subsets(cands: list):
    """Every non-empty subset of ``cands`` (bit-mask order)."""
    n = len(cands)
    for mask in range(1, 1 << n):
        yield [cands[t] for t in range(n) if mask >> t & 1]


def _level_scores(
    sub: list, prev: list, prev_tot: dict, first: bool, count: dict, strategy: str
) -> Optional[dict]:
    """The score of every formula of ``sub`` (one level's choice) under ``strategy`` (Eqs. 24,
    26, 27-28), given the previous level's choice ``prev`` and its scores ``prev_tot``;
    ``None`` when a member has no parent in ``prev`` (Eqs. 6-8)."""
    tot = {}
    for q in sub:
        par = [] if first else [p for p in prev if len(p) + 1 == len(q) and p < q]
        if not first and not par:
            return None
        if strategy == "degree-0":
            tot[q] = count[q]
        elif strategy == "degree-1":
            tot[q] = count[q] + sum(count[p] for p in par)
        else:
            tot[q] = count[q] + sum(prev_tot[p] for p in par)
    return tot


def _subgraphs(
    levels: list,
    count: dict,
    strategy: str,
    k: int,
    prev: list,
    prev_tot: dict,
    chosen: list,
    score: float,
    left: int,
):
    """Yield ``(score, formulas)`` of every valid subgraph of ``left`` more formulas from
    level ``k`` on (exhaustive, depth first)."""
    if left == 0:
        yield score, chosen
        return
    if k >= len(levels):
        return
    for sub in _subsets(levels[k]):
        if len(sub) > left:
            continue
        tot = _level_scores(sub, prev, prev_tot, k == 0, count, strategy)
        if tot is not None:
            sc = 0.0
            for v in tot.values():
                sc += v
            yield from _subgraphs(
                levels, count, strategy, k + 1, sub, tot, chosen + sub, score + sc, left - len(sub)
            )


def select_graph(
    counts: Sequence[Counter],
    D: int,
    strategy: str = "degree-1",
    per_level: int = 3,
    meta: Optional[dict] = None,
) -> DraftGraph:
    """Part 3: the size-``D`` subgraph of the candidate graph that satisfies Eqs. 6-8 and
    maximises the calibration score.

    ``strategy``: ``"degree-1"`` (Eq. 24: ``count(q) + sum of count(p)`` over ``q``'s parents
    in the subgraph), ``"degree-0"`` (Eq. 26) or ``"total"`` (Eqs. 27-28, recursive). A valid
    subgraph takes, level by level, a non-empty subset of each level's candidates in which
    every member has a parent among the previous level's chosen ones. Exhaustive search over
    those subsets (at most 7 per level with 3 candidates); ties keep the first found.

    Raises: ValueError: unknown strategy, ``D < 1``, or fewer than ``D`` reachable candidates.
    """
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown calibration strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}"
        )
    if D < 1:
        raise ValueError(f"D must be >= 1, got {D}")
    levels, count = candidate_graph(counts, per_level)
    best = (-1.0, None)
    for score, chosen in _subgraphs(levels, count, strategy, 0, [], {}, [], 0.0, D):
        if score > best[0]:
            best = (score, chosen)
    if best[1] is None:
        n = sum(len(v) for v in levels)
        raise ValueError(
            f"only {n} candidate draft formulas were found; cannot pick D={D} "
            "(record more calibration samples or a longer look-ahead)"
        )
    chosen = best[1]
    forms = tuple(tuple(sorted(w)) for w in chosen)
    info = dict(meta or {}, strategy=strategy, score=best[0])
    return DraftGraph(forms, tuple(count[w] for w in chosen), tuple(info.items()))


__all__ = [
    "STRATEGIES",
    "CalibrationRecord",
    "record_calibration",
    "calibration_counts",
    "candidate_graph",
    "select_graph",
]
