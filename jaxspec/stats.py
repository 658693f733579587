"""The statistics record every decoder returns (DESIGN.md, "Conventions")."""

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
        """Accepted drafts / proposed drafts (NaN when no drafts were proposed)."""
        k = self.draft_length
        if k == 0:
            return float("nan")
        produced = np.arange(self.accept_hist.shape[1])
        accepted = (self.accept_hist * np.maximum(produced - 1, 0)).sum()
        proposed = self.accept_hist.sum() * k
        return float(accepted / max(proposed, 1))

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
            "accept_hist": self.accept_hist.sum(0).tolist(),
            **self.extra,
        }
