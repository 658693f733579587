"""The result every decoder returns: :class:`DecodeResult`.

Each family adds its extras in a subclass (:class:`jaxspec.causal.decode.GenerationResult`:
the per-machine ``settings``; :class:`jaxspec.dllm.config.DiffusionResult`: ``full_tokens``
and the transfer order; :class:`jaxspec.asarm.assd.InfillResult`: the filled ``sequences``),
so code that reads ``tokens``, ``stats``, ``compile_s`` and ``run_s`` works for every method
(:func:`jaxspec.methods.run`).
"""

from __future__ import annotations

import dataclasses

from jaxspec.core.stats import DecodeStats


@dataclasses.dataclass(kw_only=True)
class DecodeResult:
    """What one decode call returns, for every method of every family.

    Attributes:
      tokens: per row, the generated token ids as Python ints (causal: cut at the budget and
        after the first EOS, which is kept; masked diffusion: the generated positions cut
        after the first EOS; AS-ARM: the filled positions, left to right).
      stats: :class:`jaxspec.core.stats.DecodeStats` (NFE, MAT, acceptance, ...).
      compile_s: seconds spent compiling (0 when a cached executable was reused).
      run_s: wall-clock seconds of the decode itself (no compilation).
    """

    tokens: list[list[int]]
    stats: DecodeStats
    compile_s: float
    run_s: float

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens (all rows) per second of :attr:`run_s`."""
        return float(sum(len(t) for t in self.tokens) / max(self.run_s, 1e-9))


__all__ = ["DecodeResult"]
