"""The statistics record every decoder returns (docs/design.md, "Decode loops and their state")."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class DecodeStats:
    """Per-row decoding statistics (numpy, host side).

    Attributes:
      method: decoder name (``"ar"``, ``"ngram"``, ...).
      reference: the decoder this one is lossless against (e.g. ``"ar"``).
      target_nfe: int ``(B,)`` target-model forward passes (prefill counts as one).
      draft_nfe: int ``(B,)`` draft-model forward passes (0 for model-free drafters).
      steps: int ``(B,)`` decode-loop iterations while the row was active (excl. prefill).
      accept_hist: int ``(B, k+2)``: ``accept_hist[b, j]`` = number of steps of row ``b``
        that produced ``j`` tokens (``j-1`` accepted drafts + 1 target token).
      new_tokens: int ``(B,)`` tokens generated (up to and including EOS, capped at the budget).
      draft_length: k (0 for autoregressive decoding).
      drafts_proposed: int ``(B,)`` draft tokens sent to verification (``k`` per verifying
        step; steps that found nothing to draft run as plain AR steps and propose 0).
      extra: free-form method-specific figures.
    """

    method: str
    reference: str
    target_nfe: np.ndarray
    draft_nfe: np.ndarray
    steps: np.ndarray
    accept_hist: np.ndarray
    new_tokens: np.ndarray
    draft_length: int
    drafts_proposed: np.ndarray | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def mat(self) -> float:
        """Mean accepted tokens: generated tokens per target forward, over the batch."""
        return float(self.new_tokens.sum() / max(self.target_nfe.sum(), 1))

    @property
    def nfe_per_token(self) -> float:
        """Target forwards per generated token (1.0 for autoregressive decoding)."""
        return float(self.target_nfe.sum() / max(self.new_tokens.sum(), 1))

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafts sent to verification (NaN when none were)."""
        proposed = (
            self.accept_hist.sum() * self.draft_length
            if self.drafts_proposed is None
            else self.drafts_proposed.sum()
        )
        if proposed == 0:
            return float("nan")
        return float(self.accepted_drafts / proposed)

    @property
    def accepted_drafts(self) -> int:
        """Total draft tokens accepted (from the histogram: a step producing j tokens
        accepted j - 1 drafts)."""
        produced = np.arange(self.accept_hist.shape[1])
        return int((self.accept_hist * np.maximum(produced - 1, 0)).sum())

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "reference": self.reference,
            "new_tokens": int(self.new_tokens.sum()),
            "target_nfe": int(self.target_nfe.sum()),
            "draft_nfe": int(self.draft_nfe.sum()),
            "mat": round(self.mat, 4),
            "nfe_per_token": round(self.nfe_per_token, 4),
            "acceptance_rate": (None if self.draft_length == 0 else round(self.acceptance_rate, 4)),
            "drafts_proposed": (
                None if self.drafts_proposed is None else int(self.drafts_proposed.sum())
            ),
            "accept_hist": self.accept_hist.sum(0).tolist(),
            **self.extra,
        }
