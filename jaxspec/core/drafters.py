"""Context n-gram drafter: prompt-lookup suffix matching with a bigram fallback.

Model-free drafts from the sequence decoded so far (ASSD paper, Appendix E.5, Algorithm 2,
run in left-to-right order; Stewart et al. 2024 "context n-grams"; prompt lookup decoding):

1. **Suffix match.** For ``n = max_ngram .. min_ngram`` take the last ``n`` tokens of the
   context and look for an earlier occurrence (the most recent one). If found, the draft
   copies the ``k`` tokens that followed it; a copy that runs into the end of the context
   continues from the drafts themselves (periodic continuation). Deterministic given the
   context, so its draft distribution ``q`` is a point mass.
2. **Bigram fallback** (ASSD Eq. 23). Otherwise draft token ``i`` is drawn from
   ``c(a | x_cond) = #{j: x_j = x_cond, x_{j+1} = a} / #{j: x_j = x_cond, x_{j+1} exists}``
   with ``x_cond`` the previous token (the last context token for ``i = 0``, then the
   previous draft: Algorithm 2 lines 2-6). Under greedy decoding the argmax of ``c`` is
   used; under sampling ``x_i ~ c(. | x_cond)`` and ``q_i = c(. | x_cond)`` (Alg. 2 lines
   7-8). A token never seen followed by another gets a point mass on itself.

All shapes are static: the context is a fixed-size buffer with per-row valid ranges
``[pad, length)``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class NgramDrafter:
    """Context n-gram drafter (hashable, usable as a static jit argument).

    Attributes:
      draft_length: k, tokens drafted per step (>= 1).
      max_ngram: longest suffix tried (>= min_ngram).
      min_ngram: shortest suffix tried (>= 1); below it the bigram fallback is used.
      vocab_size: V, needed for the bigram counts and ``q``.
      bigram_fallback: draft from the Eq. 23 bigram model when no suffix matches. If False,
        rows without a match report ``has_draft = False`` and the decoder may run a cheaper
        single-token step instead of verifying low-quality drafts.

    Raises:
      ValueError: draft_length < 1 or an invalid n-gram range.
    """

    draft_length: int
    vocab_size: int
    max_ngram: int = 3
    min_ngram: int = 2
    bigram_fallback: bool = True

    def __post_init__(self):
        if int(self.draft_length) < 1:
            raise ValueError(f"draft length must be >= 1, got {self.draft_length}")
        if not (1 <= self.min_ngram <= self.max_ngram):
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got min_ngram={self.min_ngram}, "
                f"max_ngram={self.max_ngram}")

    name = "ngram"

    def __call__(self, key: jax.Array, buffer: jax.Array, length: jax.Array,
                 pad: jax.Array, sample: bool):
        """Draft ``k`` tokens per row.

        Args:
          key: PRNG key (used only by the sampled bigram fallback).
          buffer: int32 ``(B, S)`` token buffer; row ``b`` holds context in ``[pad[b], length[b])``.
          length, pad: int32 ``(B,)``.
          sample: static; True under temperature > 0 (bigram fallback samples from Eq. 23).

        Returns:
          ``(draft int32 (B, k), q float32 (B, k, V) or None, has_draft bool (B,))``; ``q``
          is None when ``sample`` is False (greedy verification needs no densities);
          ``has_draft`` is False where the row has neither a suffix match nor (with
          ``bigram_fallback``) an observed bigram successor of its last token.
        """
        keys = jax.random.split(key, buffer.shape[0])
        draft, q, has = jax.vmap(lambda kk, b, l, p: self._one(kk, b, l, p, sample))(
            keys, buffer, length, pad)
        return draft, (q if sample else None), has

    # -- one row ---------------------------------------------------------------------------
    def _suffix_match(self, buf, L, pad):
        S = buf.shape[0]
        idx = jnp.arange(S)
        bpad = jnp.concatenate([buf, jnp.full((self.max_ngram,), -1, buf.dtype)])
        found = jnp.array(False)
        src = jnp.array(0, jnp.int32)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            suf = jax.lax.dynamic_slice(bpad, (jnp.maximum(L - n, 0),), (n,))
            eq = jnp.ones((S,), bool)
            for t in range(n):
                eq = eq & (bpad[t:t + S] == suf[t])
            # earlier occurrence fully inside the context, followed by >= 1 context token
            ok = eq & (idx >= pad) & (idx + n <= L - 1) & (L - n >= pad)
            j = jnp.max(jnp.where(ok, idx, -1))
            hit = (j >= 0) & ~found
            src = jnp.where(hit, j + n, src).astype(jnp.int32)
            found = found | hit
        return found, src

    def _bigram_counts(self, buf, L, pad, cond):
        S = buf.shape[0]
        i = jnp.arange(S - 1)
        ok = (buf[:-1] == cond) & (i >= pad) & (i + 1 < L)
        return jnp.zeros((self.vocab_size,), jnp.float32).at[buf[1:]].add(ok.astype(jnp.float32))

    def _one(self, key, buf, L, pad, sample: bool):
        k, V = self.draft_length, self.vocab_size
        found, src = self._suffix_match(buf, L, pad)
        keys = jax.random.split(key, k)
        drafts, qs = [], []
        cond = buf[L - 1]
        has_draft = found
        for t in range(k):
            # suffix-match copy (periodic continuation into the drafts themselves)
            pos = src + t
            prev = jnp.stack(drafts) if drafts else jnp.zeros((1,), jnp.int32)
            copy_tok = jnp.where(pos < L, buf[jnp.minimum(pos, buf.shape[0] - 1)],
                                 prev[jnp.clip(pos - L, 0, max(t - 1, 0))])
            # bigram fallback (Eq. 23)
            counts = self._bigram_counts(buf, L, pad, cond)
            tot = jnp.sum(counts)
            if t == 0 and self.bigram_fallback:
                has_draft = has_draft | (tot > 0)
            if sample:
                c = jnp.where(tot > 0, counts / jnp.maximum(tot, 1.0), jax.nn.one_hot(cond, V))
                big_tok = jax.random.categorical(keys[t], jnp.log(c)).astype(jnp.int32)
            else:
                big_tok = jnp.where(tot > 0, jnp.argmax(counts), cond).astype(jnp.int32)
            tok = jnp.where(found, copy_tok, big_tok).astype(jnp.int32)
            if sample:
                qs.append(jnp.where(found, jax.nn.one_hot(tok, V), c))
            drafts.append(tok)
            cond = tok
        q = jnp.stack(qs) if sample else jnp.zeros((k, 1), jnp.float32)
        return jnp.stack(drafts), q, has_draft
