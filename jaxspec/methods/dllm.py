"""Configs of the masked-diffusion methods: the stepwise reference, fixed-k and threshold
parallel unmasking (:func:`jaxspec.dllm.decode.diffusion_generate`), SSD
(:func:`jaxspec.dllm.ssd.ssd_generate`) and Spiffy (:func:`jaxspec.dllm.spiffy_generate`).

Each holds one :class:`~jaxspec.core.sampling.SamplingConfig` and builds the decoders'
:class:`~jaxspec.dllm.config.DiffusionDecodeConfig` from it (:meth:`DllmConfig.diffusion`),
so the decoders and their outputs are unchanged.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Optional

from jaxspec.core.method_config import MAX_DRAFT_LENGTH, MethodConfig, check_float, check_int
from jaxspec.dllm import (
    DiffusionDecodeConfig,
    SpiffyConfig,
    SSDConfig,
    diffusion_generate,
    load_graph,
    spiffy_generate,
    ssd_generate,
)
from jaxspec.dllm.spiffy import DraftGraph

DEFAULT_GRAPH = "configs/graphs/dream-smollm2-135m/D10.json"


@dataclasses.dataclass(frozen=True)
class DllmConfig(MethodConfig):
    """The settings every masked-diffusion method shares (the fields of
    :class:`~jaxspec.dllm.config.DiffusionDecodeConfig` the command line sets).

    Attributes:
      gen_length: generated positions (>= 1; with the prompt within the context).
      block_length: semi-autoregressive block size (divides ``gen_length``).
      remasking: the transfer rule (:data:`jaxspec.dllm.REMASKING`).
      cache: ``"none"``, ``"prefix"`` or ``"dual"`` (Fast-dLLM KV caches; each policy is its
        own reference).
      alg_temp: Dream's ``alg_temp`` (0 = most confident first).
      confidence_softmax: ``"official"`` or ``"renormalized"``.

    Raises:
      ValueError: every error of :class:`~jaxspec.dllm.config.DiffusionDecodeConfig`.
    """

    gen_length: int = 64
    block_length: int = 8
    remasking: str = "low_confidence"
    cache: str = "none"
    alg_temp: float = 0.0
    confidence_softmax: str = "official"

    family: ClassVar[str] = "dllm"
    reference_method: ClassVar[str] = "stepwise"
    replays_samples: ClassVar[bool] = True

    def __post_init__(self):
        super().__post_init__()
        check_int("gen_length", self.gen_length, 1)
        check_int("block_length", self.block_length, 1)
        self.diffusion()  # validates the decoders' config now, before any model loads

    # the decoder settings of the subclasses
    def _rule(self) -> dict:
        return {"steps": self.gen_length}

    def diffusion(self, **overrides) -> DiffusionDecodeConfig:
        """The decoders' :class:`~jaxspec.dllm.config.DiffusionDecodeConfig`."""
        s = self.sampling
        kw = dict(
            gen_length=self.gen_length,
            block_length=self.block_length,
            remasking=self.remasking,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            cache=self.cache,
            alg_temp=self.alg_temp,
            confidence_softmax=self.confidence_softmax,
            **self._rule(),
        )
        kw.update(overrides)
        return DiffusionDecodeConfig(**kw)

    def _shared(self) -> dict:
        return dict(
            sampling=self.sampling,
            gen_length=self.gen_length,
            block_length=self.block_length,
            remasking=self.remasking,
            cache=self.cache,
            confidence_softmax=self.confidence_softmax,
        )

    def reference(self) -> tuple[str, MethodConfig]:
        """One-token-per-step stepwise decoding (``steps = gen_length``, no ``alg_temp``)
        with the same remasking rule, sampling, cache and seed."""
        return "stepwise", StepwiseConfig(**self._shared())

    def decode(self, model, params, inputs, *, seed: int = 0, eos_ids=(), pad_id: int = 0):
        return diffusion_generate(
            model, params, inputs, self.diffusion(), seed=seed, eos_ids=eos_ids, pad_id=pad_id
        )

    def describe(self) -> str:
        d = self.diffusion()
        return f"(steps={d.steps if d.method == 'stepwise' else '-'}, cache={d.cache})"

    def report(self, label: str, result) -> list[str]:
        s = result.stats
        toks, gen = int(s.new_tokens.sum()), int(result.full_tokens.size)
        nfe = int(s.target_nfe.sum())
        return [
            f"[{label}] tokens={toks} gen={gen} NFE={nfe} tokens/NFE={gen / max(nfe, 1):.2f} "
            f"tokens/s={toks / max(result.run_s, 1e-9):.1f} run={result.run_s:.2f}s "
            f"compile={result.compile_s:.1f}s"
        ]


@dataclasses.dataclass(frozen=True)
class StepwiseConfig(DllmConfig):
    """``stepwise``: LLaDA / Dream stepwise unmasking, the reference.

    Attributes:
      steps: total steps (None: ``gen_length``, one token per step; divisible by the number
        of blocks). With fewer steps than ``gen_length`` several tokens are unmasked per step
        and the run is no longer the one-token-per-step reference.
    """

    steps: Optional[int] = None

    def __post_init__(self):
        if self.steps is None:
            object.__setattr__(self, "steps", self.gen_length)
        check_int("steps", self.steps, 1)
        super().__post_init__()

    def _rule(self) -> dict:
        return {"steps": self.steps}

    @property
    def lossless(self) -> bool:
        return self == self.reference()[1]


@dataclasses.dataclass(frozen=True)
class FixedKConfig(DllmConfig):
    """``fixed-k``: unmask ``tokens_per_step`` tokens per step (not lossless).

    Attributes:
      tokens_per_step: K (>= 1; required).
    """

    tokens_per_step: Optional[int] = None

    def __post_init__(self):
        if self.tokens_per_step is None:
            raise ValueError("method 'fixed-k' needs --tokens-per-step K (>= 1)")
        super().__post_init__()  # DiffusionDecodeConfig checks K >= 1

    def _rule(self) -> dict:
        return {"steps": self.gen_length, "tokens_per_step": self.tokens_per_step}

    @property
    def lossless(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True)
class ThresholdConfig(DllmConfig):
    """``threshold``: Fast-dLLM confidence-threshold unmasking (not lossless).

    Attributes:
      threshold: unmask every position with confidence >= T (at least one per step); T in
        ``(0, 1]`` (required).
      block_start: ``"rule"`` (default) or ``"first-position"``: Fast-dLLM's Dream block
        decoder, whose block-opening full forward commits the block's first position only
        (:class:`~jaxspec.dllm.config.DiffusionDecodeConfig`).
    """

    threshold: Optional[float] = None
    block_start: str = "rule"

    def __post_init__(self):
        if self.threshold is None:
            raise ValueError("method 'threshold' needs --threshold T in (0, 1]")
        check_float("threshold", self.threshold, 0.0, 1.0, low_open=True)
        super().__post_init__()

    def _rule(self) -> dict:
        return {
            "steps": self.gen_length,
            "threshold": float(self.threshold),
            "block_start": self.block_start,
        }

    @property
    def lossless(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True)
class SSDMethodConfig(DllmConfig):
    """``ssd``: SSD self-speculative decoding (:mod:`jaxspec.dllm.ssd`), lossless against
    one-token-per-step stepwise decoding with the same cache policy (``none`` or ``dual``).

    Attributes:
      draft_length: N, candidates verified per iteration (1..``block_length``; default 3).
      tree: ``"chain"`` or ``"mix-order"``.
    """

    draft_length: int = 3
    tree: str = "chain"

    def __post_init__(self):
        check_int("draft_length", self.draft_length, 1, MAX_DRAFT_LENGTH)
        super().__post_init__()
        self.ssd()

    def ssd(self) -> SSDConfig:
        """The decoder's :class:`~jaxspec.dllm.ssd.SSDConfig`."""
        return SSDConfig(self.diffusion(), self.draft_length, self.tree)

    def decode(self, model, params, inputs, *, seed: int = 0, eos_ids=(), pad_id: int = 0):
        return ssd_generate(
            model, params, inputs, self.ssd(), seed=seed, eos_ids=eos_ids, pad_id=pad_id
        )

    def describe(self) -> str:
        return ""

    def report(self, label: str, result) -> list[str]:
        s = result.stats
        return super().report(label, result) + [
            f"[ssd] draft_length={s.draft_length} tree={s.extra['tree']} "
            f"nodes={s.extra['nodes']} step_reduction={s.extra['step_reduction']:.3f} "
            f"acceptance={s.acceptance_rate:.3f} accept_hist={s.accept_hist.sum(0).tolist()}"
        ]


def default_graph(block_length: int) -> DraftGraph:
    """The default draft graph (:data:`DEFAULT_GRAPH`, calibrated at block 32) without the
    formulas that name a position rank above ``block_length``: they cannot be drafted in a
    smaller block. Their descendants name it too, so the rest is still a valid graph (Eqs.
    6-8), and any graph keeps Spiffy lossless. A graph given by name is never pruned (a
    rank above the block length is an error there)."""
    g = load_graph(Path(__file__).resolve().parents[2] / DEFAULT_GRAPH)  # any working dir
    keep = [n for n, f in enumerate(g.formulas) if max(i for i, _ in f) <= block_length]
    if len(keep) == len(g.formulas):
        return g
    return DraftGraph(
        tuple(g.formulas[n] for n in keep),
        tuple(g.counts[n] for n in keep) if g.counts else (),
        g.meta,
    )


@dataclasses.dataclass(frozen=True)
class SpiffyMethodConfig(DllmConfig):
    """``spiffy``: Spiffy draft graphs (:mod:`jaxspec.dllm.spiffy`), lossless against the
    decoder it accelerates: stepwise (any ``steps``), fixed-k or threshold.

    Attributes:
      steps, tokens_per_step, threshold: the accelerated decoder (as in
        :class:`StepwiseConfig`, :class:`FixedKConfig`, :class:`ThresholdConfig`; at most one
        of the last two).
      graph: a draft-graph JSON path or a :class:`~jaxspec.dllm.spiffy.DraftGraph` (None:
        :func:`default_graph` of the block length).
    """

    steps: Optional[int] = None
    tokens_per_step: Optional[int] = None
    threshold: Optional[float] = None
    graph: Any = None

    def __post_init__(self):
        if self.steps is None:
            object.__setattr__(self, "steps", self.gen_length)
        check_int("steps", self.steps, 1)
        if self.threshold is not None:
            check_float("threshold", self.threshold, 0.0, 1.0, low_open=True)
        super().__post_init__()
        if isinstance(self.graph, (str, Path)):
            object.__setattr__(self, "graph", load_graph(self.graph))
        self.spiffy()

    def _rule(self) -> dict:
        return {
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "threshold": None if self.threshold is None else float(self.threshold),
        }

    def spiffy(self) -> SpiffyConfig:
        """The decoder's :class:`~jaxspec.dllm.spiffy.SpiffyConfig`."""
        graph = default_graph(self.block_length) if self.graph is None else self.graph
        return SpiffyConfig(self.diffusion(), graph)

    def reference(self) -> tuple[str, MethodConfig]:
        """The decoder Spiffy accelerates, with the same settings."""
        shared = dict(self._shared(), alg_temp=self.alg_temp)
        if self.tokens_per_step is not None:
            return "fixed-k", FixedKConfig(tokens_per_step=self.tokens_per_step, **shared)
        if self.threshold is not None:
            return "threshold", ThresholdConfig(threshold=self.threshold, **shared)
        return "stepwise", StepwiseConfig(steps=self.steps, **shared)

    def decode(self, model, params, inputs, *, seed: int = 0, eos_ids=(), pad_id: int = 0):
        return spiffy_generate(
            model, params, inputs, self.spiffy(), seed=seed, eos_ids=eos_ids, pad_id=pad_id
        )

    def report(self, label: str, result) -> list[str]:
        s = result.stats
        return super().report(label, result) + [
            f"[spiffy] D={s.extra['graph_D']} unmasking={s.extra['unmasking']} "
            f"reference_nfe={int(s.steps.sum())} nfe_speedup={s.extra['nfe_speedup']:.2f}x "
            f"steps_per_forward_hist={s.accept_hist.sum(0).tolist()}"
        ]


__all__ = [
    "DllmConfig",
    "StepwiseConfig",
    "FixedKConfig",
    "ThresholdConfig",
    "SSDMethodConfig",
    "SpiffyMethodConfig",
    "default_graph",
    "DEFAULT_GRAPH",
]
