"""What the AS-ARM infilling decoders return: :class:`InfillResult` and its statistics record
:class:`ASSDStats` (host side, numpy), built from a finished loop by :func:`assd_stats`.

Source: Guo & Ermon, arXiv:2504.20456: Theorem 1 (NFE <= N - m), Table 1 (AS-ARM function
evaluations and auxiliary draft model calls), Lemma 1, Appendix F.5 (epsilon tolerance).

**NFE** (``stats.target_nfe``) counts every AS-ARM forward: draft passes plus density passes
(fused variants: calls), the quantity Theorem 1 bounds by ``N - m``. ``stats.draft_nfe``
counts the n-gram drafter's calls (Table 1's "auxiliary draft model calls") and is 0 otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from jaxspec.asarm.config import LoopConfig, State
from jaxspec.core.results import DecodeResult
from jaxspec.core.stats import DecodeStats


@dataclasses.dataclass
class ASSDStats(DecodeStats):
    """:class:`jaxspec.core.stats.DecodeStats` for ASSD (module docstring, "NFE").

    ``accept_hist[b, j]`` counts the iterations of row ``b`` that produced ``j`` tokens. ASSD has
    no bonus token, so an iteration that accepts all its drafts produced exactly that many
    tokens; the true number of accepted drafts is therefore kept in ``accepted`` (int ``(B,)``)
    and :attr:`accepted_drafts` / :attr:`acceptance_rate` use it. ``drafts_proposed`` counts the
    drafts sent to verification (unverified single-token iterations propose none). For
    ``"assd"`` these include each verified iteration's first draft, which Lemma 1 accepts with
    certainty, so the acceptance rate is at least ``1 / k``; the rate over the later drafts is
    ``(accepted - iterations) / (proposed - iterations)`` over the verified iterations.
    """

    accepted: Optional[np.ndarray] = None

    @property
    def accepted_drafts(self) -> int:
        if self.accepted is None:
            return super().accepted_drafts
        return int(self.accepted.sum())


@dataclasses.dataclass
class InfillResult(DecodeResult):
    """Output of :func:`jaxspec.asarm.assd.assd_generate`.

    Attributes:
      tokens: per row, :attr:`infilled` as a list of ints (set from it).
      sequences: per row, int32 ``(N_b,)``: the input with every masked position filled.
      infilled: per row, int32 ``(G_b,)``: the generated tokens in decoding order (left to right).
      stats: :class:`ASSDStats` (``new_tokens`` = ``G_b``).
      compile_s: seconds spent compiling (0 when a cached executable was reused).
      run_s: wall-clock seconds of the decode itself.
    """

    sequences: list
    infilled: list
    stats: ASSDStats
    compile_s: float
    run_s: float
    tokens: list = dataclasses.field(init=False)

    def __post_init__(self):
        self.tokens = [[int(t) for t in row] for row in self.infilled]


def assd_stats(
    cfg: LoopConfig, st: State, G: np.ndarray, k: int, k_requested: int, epsilon: float
) -> ASSDStats:
    """The statistics record of a finished loop.

    Args:
      cfg: the loop's statics; st: its final carry as numpy arrays (``kv`` dropped).
      G: int ``(B,)`` masked counts; k: the draft slots the loop ran with (after clamping to
        the most masked positions of any row); k_requested: the caller's ``k``.
      epsilon: the Appendix F.5 tolerance (``> 0``: not lossless).
    """
    seq = cfg.variant.sequential
    return ASSDStats(
        method=cfg.variant.name,
        reference="sequential",
        target_nfe=st.target_nfe,
        draft_nfe=st.draft_nfe,
        steps=st.steps,
        accept_hist=st.accept_hist[:, : k + 2],
        new_tokens=G.astype(np.int64),
        draft_length=0 if seq else k_requested,
        drafts_proposed=None if seq else st.drafts_proposed,
        accepted=None if seq else st.drafts_accepted,
        extra={
            "k": None if seq else k_requested,
            "epsilon": float(epsilon),
            "lossless": bool(epsilon == 0),
            "draft_passes": int(st.draft_passes.sum()),
            "density_passes": int(st.density_passes.sum()),
            "tokens_per_iteration": round(float(G.sum() / max(st.steps.sum(), 1)), 4),
            "lemma1_max_gap": float(st.lemma1_max_gap),
            "query_tokens_per_call": cfg.query_slots,
            "suppressed": list(cfg.suppress),
            "cache": cfg.cache,
        },
    )


__all__ = ["ASSDStats", "InfillResult", "assd_stats"]
