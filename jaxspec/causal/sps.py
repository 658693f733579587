"""Draft-model speculative sampling (SPS): a small causal LM drafts for a causal target.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding",
Algorithm 1) and Chen et al. 2023 ("Accelerating Large Language Model Decoding with
Speculative Sampling", Algorithm 2); the baseline "SpS" of the DiffuSpec paper
(DiffuSpec, arXiv:2510.02358, Sec. 5, Table 1).

Each step the draft model ``M_q`` runs ``k`` KV-cached forwards: ``q_1 = M_q(x)``, ``d_1 ~
q_1``, ``q_2 = M_q(x, d_1)``, ..., ``d_k ~ q_k``. The target scores ``[x_last, d_1..d_k]`` in
one pass (:func:`jaxspec.causal.decode.verify_step`), and the shared chain verifier
(:func:`jaxspec.core.verify.verify_sample`) accepts ``d_i`` with probability ``min(1, p_i /
q_i)``, samples the first rejection from the residual ``norm(max(0, p_i - q_i))`` and takes a
bonus token from ``p_{k+1}`` when all ``k`` are accepted (Leviathan Alg. 1 lines 5-10). Under
greedy decoding the drafts are the draft model's argmax and verification keeps the longest
prefix equal to the target's argmax.

Losslessness: each ``d_i`` is drawn before the verifier's uniforms from ``q_i``, a function of
the accepted history and ``d_1..d_{i-1}`` only, and ``q_i`` (the draft model's distribution
after the *same* temperature / top-k / top-p processing) is exactly what the verifier is given;
speculative sampling is exact for any such proposal (Leviathan Theorem 3.5 / Appendix A.1).

**The draft model's KV cache** has the target's slot layout (``S`` slots, RoPE position of slot
``s`` is ``s - pad``). It is rolled back like the target's: nothing is erased; each proposal
re-feeds the two slots ``[L - 2, L)`` before drafting. That window always covers what the cache
lacks: after a step with ``n`` accepted drafts the cache is valid up to slot ``L_old + min(n,
k - 1)`` and the new length is ``L_old + n + 1``, so at most two slots are new (``d_k`` and the
bonus after a full acceptance, else the correction token); re-writing an already valid slot
with the same token and prefix rewrites the same keys and values. Slots past ``L`` hold stale
drafts, masked by the causal mask and overwritten later. So :meth:`DraftModelDrafter.update`
has nothing to do, and the draft NFE is exactly ``k`` forwards per proposal (the first one has
2 query rows, the rest 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxspec.causal.config import DraftedConfig
from jaxspec.causal.decode import model_pass
from jaxspec.core.drafters import Draft, DraftContext, Drafter
from jaxspec.core.method_config import Needs
from jaxspec.core.sampling import SamplingConfig, argmax, sample_from_probs, target_probs
from models.llama.modeling import grow_cache, init_cache, param_dtype

__all__ = ["Config", "DraftModelDrafter"]


@dataclasses.dataclass(frozen=True)
class Config(DraftedConfig):
    """The ``sps`` method (the registry's entry; :class:`DraftedConfig` has the shared knobs).

    Attributes:
      draft_length: k, draft-model forwards (and drafts) per step; default 5.
      draft_model: the draft ``(CausalLM, params)``, sharing the target's tokenizer
        (``scripts.generate --draft-model NAME``); not compared or hashed.

    The drafts are sampled from the draft model's distribution after the target's
    temperature / top-k / top-p (``sampling``), as :class:`DraftModelDrafter` requires.
    """

    draft_model: Any = dataclasses.field(default=None, compare=False)

    default_draft_length: ClassVar[int] = 5
    needs: ClassVar[Needs] = Needs(
        draft_family="causal", same_vocabulary=True, example="qwen2.5-coder-0.5b-instruct"
    )

    def drafter(self, target_config) -> "DraftModelDrafter":
        return DraftModelDrafter(self.draft_model[0], self.k, self.sampling)

    def drafter_params(self, target_params: Any = None) -> Any:
        return self.draft_model[1]


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter(Drafter):
    """A causal draft model as a :class:`jaxspec.core.drafters.Drafter` (SPS).

    Attributes:
      model: the draft :class:`models.llama.modeling.CausalLM` (hashable; its weights are the
        ``drafter_params`` argument of :func:`jaxspec.causal.decode.generate`, traced).
      draft_length: k, drafts per step (>= 1); each costs one draft forward.
      sampling: the distribution the drafts are sampled from under sampled decoding; use the
        target's temperature / top-k / top-p (the registry's ``sps`` method does). Ignored
        under greedy decoding (drafts are the draft model's argmax).

    State: the draft model's KV cache (``models.llama.modeling.KVCache``, float32
    ``(layers, B, S, kv_heads, head_dim)``).

    Raises:
      ValueError: ``draft_length < 1``; at trace time, sampled decoding with a greedy
        ``sampling`` (the drafts would not come from the ``q`` given to the verifier), or an
        ``init_state`` context without a static prefill width.
    """

    model: Any
    draft_length: int
    sampling: SamplingConfig = SamplingConfig()

    name = "sps"
    # k - 1 of its k draft forwards per step are one-token steps: the AR loop's weight layout
    # (output-major, fused q/k/v) runs them faster (jaxspec.core.drafters, "Drafter weight layout")
    one_token_steps = True

    def __post_init__(self):
        if int(self.draft_length) < 1:
            raise ValueError(f"draft length must be >= 1, got {self.draft_length}")

    @property
    def vocab_size(self) -> int:
        """The draft model's vocabulary size (must equal the target's)."""
        return self.model.config.vocab_size

    @property
    def context_length(self) -> int:
        """The draft model's context (prompt + budget + k must fit)."""
        return self.model.config.max_position_embeddings

    # -- the Drafter protocol ---------------------------------------------------------------
    def init_state(self, params, ctx: DraftContext):
        """Prefill the draft model's cache with the ``ctx.filled`` slots the target prefilled
        (prompt and the first generated token)."""
        if ctx.filled is None:
            raise ValueError(
                "DraftModelDrafter.init_state needs ctx.filled (the static prefill width)"
            )
        B, S = ctx.buffer.shape
        start, n = jnp.zeros((B,), jnp.int32), ctx.filled
        # attends over the filled slots only, then grows to the buffer's S (decode.prefill)
        _, cache = model_pass(
            self.model,
            params,
            ctx.buffer[:, :n],
            start,
            ctx.pad,
            init_cache(self.model.config, B, n, param_dtype(params)),
            n,
        )
        return grow_cache(cache, S)

    def update(self, params, state, ctx: DraftContext, n_accepted: jax.Array):
        """Nothing to do: the next proposal re-feeds the slots the cache lacks (module
        docstring)."""
        return state

    def propose(self, params, state, ctx: DraftContext, key: jax.Array, sample: bool):
        """Draft ``k`` tokens per row with ``k`` KV-cached draft-model forwards.

        Args:
          params: the draft model's parameters; state: its KV cache.
          ctx: the decoder's buffer; row ``b`` holds its context in ``[pad[b], length[b])``.
          key: PRNG key for the draft samples (independent of the verifier's key).
          sample: static; True under sampled decoding.

        Returns:
          ``(Draft, cache)``: tokens int32 ``(B, k)``; ``q`` float32 ``(B, k, V)`` the
          processed draft distributions (``None`` when greedy); ``has_draft`` all True;
          ``length`` ``k``; ``nfe`` ``k`` per row.
        """
        if sample and self.sampling.greedy:
            raise ValueError(
                "sampled decoding needs the drafter's sampling config (temperature "
                "> 0): build DraftModelDrafter with the target's SamplingConfig"
            )
        B, S = ctx.buffer.shape
        k = self.draft_length
        L = ctx.length
        window = jax.vmap(lambda row, i: jax.lax.dynamic_slice(row, (i,), (2,)))(ctx.buffer, L - 2)
        logits, cache = model_pass(self.model, params, window, L - 2, ctx.pad, state, S)
        keys = jax.random.split(key, k)
        tok0, q0 = self._draw(keys[0], logits[:, -1], sample)

        def one(carry, key_i):
            cache, tok, slot = carry
            lg, cache = model_pass(self.model, params, tok[:, None], slot, ctx.pad, cache, S)
            nxt, q = self._draw(key_i, lg[:, 0], sample)
            return (cache, nxt, slot + 1), (nxt, q)

        (cache, _, _), (toks, qs) = jax.lax.scan(one, (cache, tok0, L), keys[1:])
        tokens = jnp.concatenate([tok0[:, None], toks.T], axis=1).astype(jnp.int32)
        q = None
        if sample:
            q = jnp.concatenate([q0[:, None], jnp.swapaxes(qs, 0, 1)], axis=1)
        full = jnp.full((B,), k, jnp.int32)
        return Draft(
            tokens=tokens, q=q, has_draft=jnp.ones((B,), bool), length=full, nfe=full
        ), cache

    def _draw(self, key, logits, sample: bool):
        """One draft token per row from float32 ``logits (B, V)``: ``(token (B,), q (B, V) or
        None)``."""
        if not sample:
            return argmax(logits), None
        q = target_probs(logits, self.sampling)
        return sample_from_probs(key, q).astype(jnp.int32), q
