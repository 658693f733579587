"""What every benchmark suite shares: its error, a prompt, one decode's output, and the
small helpers its rows are built with (cutting an output, the first differing position,
rounding a figure, the rotating order of systems)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from jaxspec.core.batching import cut_after_eos


class BenchError(ValueError):
    """Bad benchmark request: unknown suite or system, bad budget, a peer that cannot load."""


@dataclasses.dataclass
class BenchPrompt:
    """One benchmark prompt: an identifier (e.g. HumanEval ``task_id``) and its token ids."""

    task_id: str
    ids: list[int]


@dataclasses.dataclass
class RunOutput:
    """One system's decode of one prompt.

    Attributes:
      tokens: generated ids, cut at the budget and after the first EOS (kept).
      seconds: wall-clock seconds of the call, compilation excluded.
      target_nfe: target-model forward passes (the prompt pass counts as one).
      proposed: draft tokens offered for verification (0 for autoregressive systems).
      accepted: draft tokens accepted.
      compile_s: seconds spent compiling during this call (jaxspec only).
      draft_nfe: draft-model forward passes (0 for model-free drafters; jaxspec only).
      steps: decode-loop iterations after the prefill (jaxspec only; 0 = not recorded).
      settings: the decoder's per-machine choices (verification layout, gate cost;
        :attr:`models.llama.layout.DecodePlan.settings`), jaxspec speculative systems only.
    """

    tokens: list[int]
    seconds: float
    target_nfe: int
    proposed: int = 0
    accepted: int = 0
    compile_s: float = 0.0
    draft_nfe: int = 0
    steps: int = 0
    settings: dict = dataclasses.field(default_factory=dict)


def cut_output(tokens: Sequence[int], eos_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """``tokens`` cut to ``max_new_tokens`` and after the first EOS (which is kept): the rule
    :func:`jaxspec.causal.decode.generate` applies, used for every system's output."""
    return cut_after_eos([[int(t) for t in tokens]], eos_ids, budget=[max_new_tokens])[0]


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> Optional[int]:
    """The first position (0-based, in generated tokens) where ``tokens`` and ``reference``
    differ, the shorter length when one is a proper prefix of the other (e.g. an earlier EOS),
    or None when they are identical."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def _num(x: Optional[float], nd: int = 4) -> Optional[float]:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), nd)


def _order(systems: list, i: int) -> list:
    r = i % len(systems)
    return systems[r:] + systems[:r]
