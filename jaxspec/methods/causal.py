"""Configs of the causal methods whose module holds no config of its own yet: n-gram, SPACE,
DiffuSpec and SpecDiff. Each is a :class:`jaxspec.causal.config.DraftedConfig` that names its
drafter; :meth:`jaxspec.causal.config.CausalConfig.decode` runs them all."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from jaxspec.causal.config import DraftedConfig, check_ngram_range
from jaxspec.causal.diffuspec import DiffusionDrafter
from jaxspec.causal.space import SPACE_SAMPLING, SpaceDrafter
from jaxspec.core.drafters import NgramDrafter
from jaxspec.core.method_config import Needs, check_choice, check_int

FALLBACKS = ("none", "bigram")
DRAFTER_CACHES = ("none", "prefix")


@dataclasses.dataclass(frozen=True)
class NgramConfig(DraftedConfig):
    """``ngram``: context n-gram drafts (:class:`jaxspec.core.drafters.NgramDrafter`).

    Attributes:
      draft_length: k (default 8).
      max_ngram, min_ngram: the longest and shortest suffix matched
        (``1 <= min_ngram <= max_ngram``).
      fallback: when no suffix matches: ``"none"`` (a plain AR step) or ``"bigram"`` (the
        ASSD Eq. 23 context bigram model drafts).
    """

    max_ngram: int = 3
    min_ngram: int = 2
    fallback: str = "none"

    def __post_init__(self):
        super().__post_init__()
        check_ngram_range(self.max_ngram, self.min_ngram)
        check_choice("fallback", self.fallback, FALLBACKS)

    def drafter(self, target_config) -> NgramDrafter:
        return NgramDrafter(
            self.k,
            target_config.vocab_size,
            max_ngram=self.max_ngram,
            min_ngram=self.min_ngram,
            bigram_fallback=self.fallback == "bigram",
        )


@dataclasses.dataclass(frozen=True)
class SpaceConfig(DraftedConfig):
    """``space``: SPACE auto-correct decoding on a SAR-SFT model (:mod:`jaxspec.causal.space`).

    Attributes:
      mask_groups: k, candidates per step = [MASK] tokens per group (>= 1; paper default 5).
      space_sampling: the rule after a rejection: ``"exact"`` (the residual: lossless) or
        ``"paper"`` (Algorithm 1 line 18: approximate under sampling).
    """

    mask_groups: int = 5
    space_sampling: str = "exact"

    needs: ClassVar[Needs] = Needs(mask_token=True, example="smollm2-135m-space")

    def __post_init__(self):
        super().__post_init__()
        check_int("mask_groups", self.mask_groups, 1)
        check_choice("space_sampling", self.space_sampling, SPACE_SAMPLING)

    @property
    def lossless(self) -> bool:
        return self.space_sampling == "exact" or self.sampling.greedy

    def drafter(self, target_config) -> SpaceDrafter:
        return SpaceDrafter(
            self.mask_groups,
            target_config.vocab_size,
            target_config.mask_token_id,
            self.sampling,
            self.space_sampling,
        )


@dataclasses.dataclass(frozen=True)
class SpecDiffConfig(DraftedConfig):
    """``specdiff``: a diffusion LM's argmax block of fixed length ``draft_length`` (default
    30) drafts (:class:`jaxspec.causal.diffuspec.DiffusionDrafter` without CPS and ADL).

    Attributes:
      dllm_drafter: the drafter ``(DiffusionLM, params)`` (``--draft-model NAME``); not
        compared or hashed.
      proxy: the causal proxy of CPS (:class:`~jaxspec.causal.diffuspec.NgramProxy` or None).
      eos_id: the EOS the CPS lattice keeps.
      refine_steps: S, drafter forwards per proposal (>= 1).
      drafter_cache: ``"none"`` (every drafter forward re-reads the context, the paper's
        setting) or ``"prefix"`` (:class:`jaxspec.causal.diffuspec.DrafterCache`; same
        vocabulary only).
      vocab_adapter: ``(target tokenizer, drafter tokenizer)`` for a drafter of another
        vocabulary (drafts translated through text, :mod:`jaxspec.causal.hetero`), else None.
    """

    dllm_drafter: Any = dataclasses.field(default=None, compare=False)
    proxy: Any = dataclasses.field(default=None, compare=False)
    eos_id: int = 0
    refine_steps: int = 1
    drafter_cache: str = "none"
    vocab_adapter: Any = dataclasses.field(default=None, compare=False)

    default_draft_length: ClassVar[int] = 30
    needs: ClassVar[Needs] = Needs(
        draft_family="dllm", draft_field="dllm_drafter", example="dream-smollm2-135m"
    )

    def __post_init__(self):
        super().__post_init__()
        check_int("refine_steps", self.refine_steps, 1)
        check_choice("drafter_cache", self.drafter_cache, DRAFTER_CACHES)
        if self.drafter_cache == "prefix" and self.vocab_adapter is not None:
            raise ValueError(
                "--drafter-cache prefix needs the target's vocabulary: a drafter "
                "of another vocabulary re-encodes its context every step"
            )

    def _lattice(self) -> tuple[bool, bool, int]:
        """``(cps, adl, k_min)``: SpecDiff drafts a fixed-length argmax block."""
        return False, False, self.k

    def drafter(self, target_config) -> DiffusionDrafter:
        cps, adl, k_min = self._lattice()
        return DiffusionDrafter(
            self.dllm_drafter[0],
            self.k,
            eos_id=self.eos_id,
            k_min=k_min,
            cps=cps,
            adl=adl,
            refine_steps=self.refine_steps,
            prefix_cache=self.drafter_cache == "prefix",
        )

    def drafter_params(self, target_params: Any = None) -> Any:
        return (self.dllm_drafter[1], self.proxy)

    def adapter(self):
        return self.vocab_adapter


@dataclasses.dataclass(frozen=True)
class DiffuSpecConfig(SpecDiffConfig):
    """``diffuspec``: DiffuSpec (:mod:`jaxspec.causal.diffuspec`): :class:`SpecDiffConfig`
    plus causal-consistency path search and adaptive draft length.

    Attributes:
      draft_length: k_max (default 30).
      k_min: ADL's shortest draft (>= 1, default 20; clipped to k_max).
      cps, adl: the Table 2 ablations (``--no-cps``, ``--no-adl``).
    """

    k_min: int = 20
    cps: bool = True
    adl: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_int("k_min", self.k_min, 1)

    def _lattice(self) -> tuple[bool, bool, int]:
        return self.cps, self.adl, min(self.k_min, self.k) if self.adl else self.k


__all__ = ["NgramConfig", "SpaceConfig", "SpecDiffConfig", "DiffuSpecConfig"]
