"""Static configuration and loop carry of the AS-ARM infilling decoders (:mod:`jaxspec.asarm`).

Source: Guo & Ermon, "Reviving Any-Subset Autoregressive Models with Principled Parallel
Sampling and Speculative Decoding" (arXiv:2504.20456): Algorithm 1 (ASSD), Appendix E.5
(Algorithm 2, the context n-gram drafter), Appendix F.4 (content KV cache).

**Variants.** A decoder is one :class:`AssdVariant`, three typed flags: ``sequential`` (the
reference: one AS-ARM forward per masked token, nothing verified), ``fused`` (one AS-ARM call
per iteration verifies the current drafts and drafts the next ones, :mod:`jaxspec.asarm.fused`)
and ``drafter`` (``"self"``: the AS-ARM's own draft pass, Algorithm 1 lines 4-8; ``"ngram"``:
Algorithm 2's context bigram). A method name (``"assd-fused-ngram"``) becomes a variant in one
place, :meth:`AssdVariant.parse`, at the public boundary (:func:`jaxspec.asarm.assd.
assd_generate`); below it only the flags are read.

Reading order: the variant, :class:`LoopConfig` (the compiled loop's statics), :class:`State`
(its carry) and :func:`init_state`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional

import flax
import jax
import jax.numpy as jnp

from jaxspec.core.sampling import SamplingConfig
from models.xlnet.modeling import XLNetCache, XLNetLM

Drafter = Literal["self", "ngram"]
Cache = Literal["none", "content"]
DRAFTERS = ("self", "ngram")
CACHES = ("none", "content")


# --------------------------------------------------------------------------- variant
@dataclasses.dataclass(frozen=True)
class AssdVariant:
    """Which AS-ARM decoder a loop runs (hashable: part of the compiled loop's statics).

    Attributes:
      sequential: the reference (paper Sec. 3, "Sequential Sampling"): one draft slot, its
        token accepted unverified; exactly ``N - m`` forwards.
      fused: one AS-ARM call per iteration verifies and drafts (:mod:`jaxspec.asarm.fused`).
      drafter: ``"self"`` (the AS-ARM's draft pass, Algorithm 1 lines 4-8; fused: the draft
        groups of the one call) or ``"ngram"`` (Algorithm 2, the Eq. 23 context bigram).

    Raises:
      ValueError (one line): an unknown drafter, or ``sequential`` with ``fused`` or the
      n-gram drafter (the reference drafts nothing to verify).
    """

    sequential: bool = False
    fused: bool = False
    drafter: Drafter = "self"

    def __post_init__(self):
        if self.drafter not in DRAFTERS:
            raise ValueError(
                f"unknown drafter {self.drafter!r}; expected one of {', '.join(DRAFTERS)}"
            )
        if self.sequential and (self.fused or self.drafter != "self"):
            raise ValueError("sequential decoding takes neither fused calls nor a drafter")

    @property
    def name(self) -> str:
        """The method name: ``"sequential"``, ``"assd"``, ``"assd-ngram"``, ``"assd-fused"``
        or ``"assd-fused-ngram"``."""
        if self.sequential:
            return "sequential"
        return (
            "assd"
            + ("-fused" if self.fused else "")
            + ("-ngram" if self.drafter == "ngram" else "")
        )

    @classmethod
    def parse(cls, method: str) -> "AssdVariant":
        """The variant of a method name (one of :data:`METHODS`).

        Raises:
          ValueError (one line): an unknown method name."""
        if method not in VARIANTS:
            raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
        return VARIANTS[method]


VARIANTS: dict[str, AssdVariant] = {
    v.name: v
    for v in (
        AssdVariant(sequential=True),
        AssdVariant(),
        AssdVariant(drafter="ngram"),
        AssdVariant(fused=True),
        AssdVariant(fused=True, drafter="ngram"),
    )
}
METHODS = tuple(VARIANTS)
"""The method names, in the order the reports list them."""


# --------------------------------------------------------------------------- loop statics
@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Static settings of one compiled decode loop (hashable; a new value compiles anew).

    Attributes:
      model: the :class:`models.xlnet.modeling.XLNetLM` (its config fixes ``V``).
      variant: the decoder (:class:`AssdVariant`).
      slots: draft slots per iteration (``>= k``; 1 for sequential decoding).
      sampling: temperature / top-k / top-p of the target distribution.
      suppress: token ids whose logits are set to -inf in every pass (target and drafts alike:
        the reference is sequential decoding with the same suppression).
      cache: ``"none"`` (every call encodes the whole buffer) or ``"content"`` (Appendix F.4:
        the content-stream keys/values of the prompt and the decoded tokens are kept; a call
        encodes only the rows it adds, :mod:`jaxspec.asarm.passes`).
    """

    model: XLNetLM
    variant: AssdVariant
    slots: int
    sampling: SamplingConfig
    suppress: tuple = ()
    cache: Cache = "none"

    @property
    def draft_slots(self) -> int:
        """``K``: drafts per iteration compiled into the loop (one for sequential decoding)."""
        return 1 if self.variant.sequential else self.slots

    @property
    def query_slots(self) -> int:
        """``P``: query tokens of one call: ``K`` (draft and density passes of Algorithm 1),
        ``(K + 1)^2`` for fused ASSD (``K + 1`` density queries and ``K + 1`` groups of ``K``),
        ``K + 1`` for fused ASSD-ngram."""
        K = self.draft_slots
        if not self.variant.fused:
            return K
        return (K + 1) ** 2 if self.variant.drafter == "self" else K + 1


# --------------------------------------------------------------------------- loop carry
@flax.struct.dataclass
class State:
    """Loop carry: the token buffer, Algorithm 1's ``n`` and the statistics counters."""

    tokens: jax.Array  # int32 (B, S): prompt, decoded tokens; 0 at undecoded slots
    decoded: jax.Array  # int32 (B,): n, masked tokens decoded so far
    key: jax.Array  # PRNG key, split once per iteration
    target_nfe: jax.Array  # int32 (B,): AS-ARM forwards while the row was active
    draft_nfe: jax.Array  # int32 (B,): context-bigram drafter calls (n-gram drafter)
    steps: jax.Array  # int32 (B,): iterations while active
    accept_hist: jax.Array  # int32 (B, K + 2): iterations that produced j tokens
    drafts_proposed: jax.Array  # int32 (B,): drafts sent to verification
    drafts_accepted: jax.Array  # int32 (B,): drafts accepted (line 20)
    draft_passes: jax.Array  # int32 (B,): AS-ARM draft passes (lines 4-8)
    density_passes: jax.Array  # int32 (B,): AS-ARM density passes (lines 13-15; fused calls)
    lemma1_max_gap: jax.Array  # float32 (): max |p - q| at i = n over verified iterations
    # fused ASSD only (width 1 otherwise): the drafts carried to the next call
    next_drafts: jax.Array  # int32 (B, K): drafts for ranks n .. n + K - 1
    next_q: jax.Array  # float32 (B, K, V) their draft distributions ((B, K, 1) if greedy)
    next_live: jax.Array  # int32 (B,): L, how many of them are live
    kv: Optional[XLNetCache]  # content-stream keys/values (cache = "content"), else None


def init_state(cfg: LoopConfig, tokens: jax.Array, key: jax.Array) -> State:
    """Loop carry before the first iteration: nothing decoded, every counter 0, no cache."""
    B = tokens.shape[0]
    z = jnp.zeros((B,), jnp.int32)
    fused = cfg.variant.fused
    K = cfg.draft_slots if fused else 1
    Vq = 1 if (cfg.sampling.greedy or not fused) else cfg.model.config.vocab_size
    return State(
        tokens=tokens,
        decoded=z,
        key=key,
        target_nfe=z,
        draft_nfe=z,
        steps=z,
        accept_hist=jnp.zeros((B, cfg.draft_slots + 2), jnp.int32),
        drafts_proposed=z,
        drafts_accepted=z,
        draft_passes=z,
        density_passes=z,
        lemma1_max_gap=jnp.zeros((), jnp.float32),
        next_drafts=jnp.zeros((B, K), jnp.int32),
        next_q=jnp.zeros((B, K, Vq), jnp.float32),
        next_live=z,
        kv=None,
    )


__all__ = [
    "Drafter",
    "Cache",
    "DRAFTERS",
    "CACHES",
    "AssdVariant",
    "VARIANTS",
    "METHODS",
    "LoopConfig",
    "State",
    "init_state",
]
