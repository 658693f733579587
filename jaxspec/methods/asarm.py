"""Configs of the AS-ARM (XLNet) infilling methods: sequential any-order decoding (the
reference) and the ASSD variants (:func:`jaxspec.asarm.assd.assd_generate`).

Their inputs are infilling tasks: ``B`` pairs ``(tokens, masked)`` of model ids and a bool
per position (True: generate it); :func:`jaxspec.asarm.infill.parse_template` makes one from
a ``<mask:N>`` template.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from jaxspec.asarm.assd import CACHES, assd_generate
from jaxspec.core.method_config import (
    MAX_DRAFT_LENGTH,
    MethodConfig,
    acceptance,
    check_choice,
    check_int,
)


@dataclasses.dataclass(frozen=True)
class SequentialConfig(MethodConfig):
    """``sequential``: one AS-ARM forward per masked token, the reference.

    Attributes:
      cache: ``"none"`` or ``"content"`` (Appendix F.4 content-stream cache; each policy is
        its own reference).
      suppress: model token ids never generated (e.g. the compact vocabulary's UNK,
        ``--suppress-unk``); the reference suppresses the same.
    """

    cache: str = "none"
    suppress: tuple = ()

    family: ClassVar[str] = "asarm"
    reference_method: ClassVar[str] = "sequential"
    variant: ClassVar[str] = "sequential"

    def __post_init__(self):
        super().__post_init__()
        check_choice("cache", self.cache, CACHES)
        object.__setattr__(self, "suppress", tuple(self.suppress))

    @property
    def k(self) -> int:
        return 1

    @property
    def tolerance(self) -> float:
        return 0.0

    def reference(self) -> tuple[str, MethodConfig]:
        return "sequential", SequentialConfig(
            sampling=self.sampling, cache=self.cache, suppress=self.suppress
        )

    def decode(self, model, params, inputs, *, seed: int = 0, eos_ids=(), pad_id: int = 0):
        """Fill the masked positions of ``inputs`` (EOS and padding do not apply)."""
        tokens = [t for t, _ in inputs]
        masked = [m for _, m in inputs]
        return assd_generate(
            model,
            params,
            tokens,
            masked,
            method=self.variant,
            k=self.k,
            sampling=self.sampling,
            seed=seed,
            epsilon=self.tolerance,
            suppress=self.suppress,
            cache=self.cache,
        )

    def report(self, label: str, result) -> list[str]:
        s = result.stats
        k = s.extra["k"] if s.extra["k"] is not None else "-"
        return [
            f"[{label}] masked={int(s.new_tokens.sum())} NFE={int(s.target_nfe.sum())} "
            f"NFE/token={s.nfe_per_token:.3f} "
            f"tokens/iteration={s.extra['tokens_per_iteration']:.2f} k={k} "
            f"acceptance={acceptance(s)} "
            f"lossless={'yes' if s.extra['lossless'] else 'NO (epsilon)'} "
            f"cache={s.extra['cache']} run={result.run_s:.2f}s "
            f"compile={result.compile_s:.1f}s"
        ]


@dataclasses.dataclass(frozen=True)
class AssdConfig(SequentialConfig):
    """``assd``: ASSD Algorithm 1 (self-drafted); the subclasses are its variants.

    Attributes:
      draft_length: k, tokens speculated per iteration (default 5).
      epsilon: Appendix F.5 acceptance tolerance (>= 0, finite; > 0 is NOT lossless and
        needs sampling, temperature > 0).
    """

    draft_length: int = 5
    epsilon: float = 0.0

    variant: ClassVar[str] = "assd"

    def __post_init__(self):
        super().__post_init__()
        check_int("draft_length", self.draft_length, 1, MAX_DRAFT_LENGTH)
        e = self.epsilon
        if (
            isinstance(e, bool)
            or not isinstance(e, (int, float))
            or not (math.isfinite(e) and e >= 0)
        ):
            raise ValueError(f"--epsilon must be a finite number >= 0, got {e!r}")
        if e > 0 and self.sampling.greedy:
            raise ValueError(f"--epsilon {e} is a sampling tolerance: it needs --temperature > 0")

    @property
    def k(self) -> int:
        return int(self.draft_length)

    @property
    def tolerance(self) -> float:
        return float(self.epsilon)

    @property
    def lossless(self) -> bool:
        return self.epsilon == 0


@dataclasses.dataclass(frozen=True)
class AssdNgramConfig(AssdConfig):
    """``assd-ngram``: ASSD Algorithm 2 (context bigram drafts)."""

    variant: ClassVar[str] = "assd-ngram"


@dataclasses.dataclass(frozen=True)
class AssdFusedConfig(AssdConfig):
    """``assd-fused``: one AS-ARM call verifies the drafts and drafts the next ones."""

    variant: ClassVar[str] = "assd-fused"


@dataclasses.dataclass(frozen=True)
class AssdFusedNgramConfig(AssdConfig):
    """``assd-fused-ngram``: fused ASSD with context bigram drafts."""

    variant: ClassVar[str] = "assd-fused-ngram"


__all__ = [
    "SequentialConfig",
    "AssdConfig",
    "AssdNgramConfig",
    "AssdFusedConfig",
    "AssdFusedNgramConfig",
]
