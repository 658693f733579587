"""Spiffy's directed draft graphs (Sec. 4.3, Eqs. 6-8; Fig. 4): the formulas, their JSON
files and their picture.

A draft formula is a set of pairs ``(i, j)``, 1-based: "unmask the position of position rank
``i`` with its vocabulary-rank-``j`` token". A graph is ``D`` formulas; formula ``A`` is a
parent of ``B`` when ``B`` adds exactly one pair to ``A`` (Eqs. 6-8 at the calibration rate
``S = 1``); size-1 formulas are children of the current state. A node can have several
parents.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from jaxspec.core.plotting import pyplot


class GraphError(ValueError):
    """A draft graph that does not parse or violates Eqs. 6-8."""


@dataclasses.dataclass(frozen=True)
class DraftGraph:
    """A directed draft graph: ``D`` draft formulas (frozen, hashable).

    Attributes:
      formulas: ``D`` formulas, each a sorted tuple of 1-based ``(position rank i, vocabulary
        rank j)`` pairs, with distinct ``i`` inside a formula.
      counts: optional calibration ``count(w)`` per formula (same order), for the picture.
      meta: free-form provenance (calibration settings) as sorted ``(key, value)`` pairs.

    Raises:
      GraphError: an empty formula, a pair that is not two positive ints, a repeated position
        rank inside a formula, a repeated formula, or a formula of size ``k > 1`` with no
        parent (a size ``k - 1`` subset) in the graph (Eqs. 6-8).
    """

    formulas: tuple
    counts: tuple = ()
    meta: tuple = ()

    def __post_init__(self):
        forms = []
        for f in self.formulas:
            pairs = []
            for pr in f:
                if (
                    not isinstance(pr, (tuple, list))
                    or len(pr) != 2
                    or any(
                        isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1
                        for x in pr
                    )
                ):
                    raise GraphError(
                        f"draft formula {list(f)}: every pair must be two positive "
                        f"integers (i, j), got {pr!r}"
                    )
                pairs.append((int(pr[0]), int(pr[1])))
            if not pairs:
                raise GraphError("a draft formula is empty (it must unmask at least one token)")
            if len({i for i, _ in pairs}) != len(pairs):
                raise GraphError(f"draft formula {pairs}: a position rank i appears twice")
            forms.append(tuple(sorted(pairs)))
        if len(set(forms)) != len(forms):
            raise GraphError("the graph repeats a draft formula")
        have = set(forms)
        for f in forms:
            if len(f) > 1 and not any(tuple(p for p in f if p != q) in have for q in f):
                raise GraphError(
                    f"draft formula {list(f)} (level {len(f)}) has no parent in the "
                    f"graph: Eqs. 6-8 need a level-{len(f) - 1} formula that it "
                    "extends by one pair"
                )
        object.__setattr__(self, "formulas", tuple(forms))
        if self.counts and len(self.counts) != len(forms):
            raise GraphError(f"{len(self.counts)} counts for {len(forms)} formulas")
        object.__setattr__(self, "counts", tuple(int(c) for c in self.counts))
        object.__setattr__(self, "meta", tuple(sorted(dict(self.meta).items())))

    @property
    def size(self) -> int:
        """``D``, the number of draft blocks."""
        return len(self.formulas)

    @property
    def max_pairs(self) -> int:
        """The largest formula's number of pairs (0 for an empty graph)."""
        return max((len(f) for f in self.formulas), default=0)

    @property
    def max_vocab_rank(self) -> int:
        """The largest vocabulary rank ``j`` named (1 for an empty graph)."""
        return max((j for f in self.formulas for _, j in f), default=1)

    def parents(self, q: int) -> list[int]:
        """Indices of the parents of formula ``q`` (Eqs. 6-8 at ``S = 1``)."""
        f = set(self.formulas[q])
        return [p for p, g in enumerate(self.formulas) if len(g) + 1 == len(f) and set(g) < f]

    def check_block(self, block_length: int) -> None:
        """Raises GraphError when a position rank exceeds ``block_length``."""
        bad = [f for f in self.formulas if max(i for i, _ in f) > block_length]
        if bad:
            raise GraphError(
                f"draft formula {list(bad[0])} names a position rank above the "
                f"block length {block_length}"
            )

    def to_json(self) -> dict:
        """``{"D", "formulas": [[[i, j], ...], ...], "counts", "meta"}`` (:func:`save_graph`)."""
        return {
            "D": self.size,
            "formulas": [[list(p) for p in f] for f in self.formulas],
            "counts": list(self.counts),
            "meta": dict(self.meta),
        }


def load_graph(path) -> DraftGraph:
    """Read a graph written by :func:`save_graph` (``{"formulas": [[[i, j], ...], ...]}``).

    Raises: GraphError naming the file when it is missing, not JSON, has no ``formulas`` list,
    has no formula, or violates Eqs. 6-8."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise GraphError(f"draft graph file {path} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GraphError(f"draft graph file {path} is not valid JSON: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("formulas"), list):
        raise GraphError(f"draft graph file {path}: expected an object with a 'formulas' list")
    if not d["formulas"]:
        raise GraphError(f"draft graph file {path} has no draft formula")
    try:
        return DraftGraph(
            tuple(
                tuple(tuple(p) if isinstance(p, list) else p for p in f)
                if isinstance(f, list)
                else f
                for f in d["formulas"]
            ),
            tuple(d.get("counts") or ()),
            tuple((d.get("meta") or {}).items()),
        )
    except GraphError as e:
        raise GraphError(f"draft graph file {path}: {e}") from None
    except TypeError as e:
        raise GraphError(f"draft graph file {path}: malformed formulas ({e})") from None


def save_graph(graph: DraftGraph, path) -> None:
    """Write ``graph`` as JSON (:meth:`DraftGraph.to_json`; :func:`load_graph` reads it)."""
    Path(path).write_text(json.dumps(graph.to_json(), indent=1) + "\n")


def formula_arrays(graph: DraftGraph):
    """The formulas as arrays: int32 ``(D, K)`` 0-based position ranks ``i - 1`` and
    vocabulary ranks ``j - 1``, bool ``(D, K)`` live pair (``K`` = the largest formula)."""
    D, K = graph.size, max(graph.max_pairs, 1)
    fi = np.zeros((max(D, 1), K), np.int32)
    fj = np.zeros((max(D, 1), K), np.int32)
    fv = np.zeros((max(D, 1), K), bool)
    for m, f in enumerate(graph.formulas):
        for k, (i, j) in enumerate(f):
            fi[m, k], fj[m, k], fv[m, k] = i - 1, j - 1, True
    return fi[:D], fj[:D], fv[:D]


def plot_graph(graph: DraftGraph, path, title: str = "") -> None:
    """Draw the graph (levels left to right, parent -> child edges, ``count`` per node) as a
    PNG (the style of the paper's Fig. 4)."""
    plt = pyplot()

    by_level: dict = {}
    for q, f in enumerate(graph.formulas):
        by_level.setdefault(len(f), []).append(q)
    n_lv = max(by_level) if by_level else 1
    height = max(len(v) for v in by_level.values()) if by_level else 1
    fig, ax = plt.subplots(figsize=(2.3 * (n_lv + 1), 1.2 * height + 1.2))
    xy = {-1: (0.0, 0.0)}
    for lv, qs in by_level.items():
        for r, q in enumerate(qs):
            xy[q] = (float(lv), (len(qs) - 1) / 2.0 - r)
    for q, f in enumerate(graph.formulas):
        pars = graph.parents(q) if len(f) > 1 else [-1]
        for p in pars:
            ax.annotate(
                "",
                xy=xy[q],
                xytext=xy[p],
                arrowprops=dict(arrowstyle="->", color="0.5", shrinkA=22, shrinkB=22),
            )
    ax.text(
        *xy[-1], "X(t)", ha="center", va="center", bbox=dict(boxstyle="round", fc="0.85", ec="0.3")
    )
    for q, f in enumerate(graph.formulas):
        label = "\n".join(f"c{i},{j}" for i, j in f)
        if graph.counts:
            label += f"\n[{graph.counts[q]}]"
        ax.text(
            *xy[q],
            label,
            ha="center",
            va="center",
            fontsize=7,
            bbox=dict(boxstyle="round", fc="#dbe9f6", ec="#2b6ca3"),
        )
    ax.set_xlim(-0.6, n_lv + 0.6)
    ax.set_ylim(-height / 2.0 - 0.6, height / 2.0 + 0.6)
    ax.set_xticks(range(n_lv + 1))
    ax.set_xticklabels(["state"] + [f"level {k}" for k in range(1, n_lv + 1)])
    ax.set_yticks([])
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    ax.set_title(title or f"Spiffy draft graph, D = {graph.size} (c_i,j; [count])")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["GraphError", "DraftGraph", "load_graph", "save_graph", "plot_graph", "formula_arrays"]
