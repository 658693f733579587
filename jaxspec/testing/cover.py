"""Pairwise covering subsets of a test cross-product.

``make test`` runs a subset of a large parametrised cross-product (the tiny goldens) in which
every pair of option values that occurs in the full product still occurs at least once;
``make test-all`` runs the whole product. This is the classic all-pairs design: most
interaction bugs involve at most two options, and the subset is a fraction of the product.
"""

from __future__ import annotations

from itertools import combinations
from typing import Hashable, Mapping


def _pairs(factors: Mapping[str, Hashable]) -> set:
    items = sorted(factors.items())
    return {(a, b) for a, b in combinations(items, 2)}


def pairwise_cover(cases: Mapping[str, Mapping[str, Hashable]]) -> list[str]:
    """Names of a subset of ``cases`` that covers every option pair of the full set.

    Args:
        cases: case name -> {factor name: value}; every case should name the same factors.

    Returns:
        Case names, in the order chosen (greedy: each pick covers the most pairs not yet
        covered; ties go to the smallest name, so the subset is deterministic). A case with
        fewer than two factors is always chosen.
    """
    need = {name: _pairs(f) for name, f in cases.items()}
    chosen = [name for name, f in sorted(cases.items()) if len(f) < 2]
    left = set().union(*need.values()) if need else set()
    while left:
        best = max(sorted(need), key=lambda n: len(need[n] & left))
        chosen.append(best)
        left -= need[best]
    return chosen
