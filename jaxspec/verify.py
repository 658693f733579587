"""Lossless verification of a chain of draft tokens (static shapes, batch >= 1).

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), the left-to-right special
case of ASSD Algorithm 1 (lines 9-17): draft token ``x_i ~ q_i`` is accepted with
probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection the next token is drawn
from the residual distribution ``norm(max(p_i - q_i, 0))``; if all ``k`` drafts are accepted a
bonus token is drawn from ``p_k``. The output is distributed exactly as sampling from ``p``
token by token.

Deterministic drafters (n-gram lookup) pass ``q=None``: ``q_i`` is the point mass on
``x_i``, so ``x_i`` is accepted with probability ``p_i(x_i)`` and the residual is ``p_i``
with ``x_i`` removed.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxspec.sampling import sample_from_probs


def _accepted_prefix(accept: jax.Array) -> jax.Array:
    """Length of the all-True prefix of ``accept (B, k)`` -> int32 ``(B,)``."""
    return jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def verify_greedy(target_logits: jax.Array, draft: jax.Array):
    """Greedy verification: accept while the draft equals ``argmax p``.

    Args:
      target_logits: float ``(B, k+1, V)``; row ``i`` is the target's next-token logits
        after the context plus drafts ``0..i-1``.
      draft: int32 ``(B, k)``.

    Returns:
      ``(n_accepted int32 (B,), next_token int32 (B,))``: the target's argmax at the first
      mismatch, or the bonus argmax after ``k`` accepted drafts.
    """
    k = draft.shape[1]
    am = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # (B, k+1)
    n = _accepted_prefix(am[:, :k] == draft)
    nxt = jnp.take_along_axis(am, n[:, None], axis=1)[:, 0]
    return n, nxt


def verify_sample(key: jax.Array, p: jax.Array, draft: jax.Array,
                  q: Optional[jax.Array] = None):
    """Stochastic lossless verification of a draft chain.

    Args:
      key: PRNG key (split internally for the uniforms and the residual sample).
      p: float32 ``(B, k+1, V)`` processed target probabilities (rows sum to 1).
      draft: int32 ``(B, k)`` draft tokens; ``draft[:, i] ~ q[:, i]``.
      q: float32 ``(B, k, V)`` draft probabilities, or ``None`` for point masses on
        ``draft`` (deterministic drafter).

    Returns:
      ``(n_accepted int32 (B,), next_token int32 (B,))``. ``next_token`` is drawn from the
      residual ``norm(max(p_n - q_n, 0))`` when ``n < k`` and from ``p_k`` when ``n == k``.
    """
    B, k1, V = p.shape
    k = k1 - 1
    ku, kr = jax.random.split(key)
    if k > 0:
        px = jnp.take_along_axis(p[:, :k], draft[..., None], axis=-1)[..., 0]
        qx = (jnp.ones_like(px) if q is None
              else jnp.take_along_axis(q, draft[..., None], axis=-1)[..., 0])
        r = jax.random.uniform(ku, (B, k))
        n = _accepted_prefix(r * qx < px)  # r < min(1, px / qx), qx > 0 for a drawn draft
    else:
        n = jnp.zeros((B,), jnp.int32)
    p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # (B, V)
    if k > 0:
        idx = jnp.minimum(n, k - 1)
        if q is None:
            d_n = jnp.take_along_axis(draft, idx[:, None], axis=1)[:, 0]
            q_n = jax.nn.one_hot(d_n, V, dtype=p.dtype)
        else:
            q_n = jnp.take_along_axis(q, idx[:, None, None], axis=1)[:, 0]
        resid = jnp.maximum(p_n - q_n, 0.0)
        # all accepted -> bonus from p_k; numerically empty residual -> fall back to p_n
        use_resid = (n < k) & (jnp.sum(resid, axis=-1) > 0)
        dist = jnp.where(use_resid[:, None], resid, p_n)
    else:
        dist = p_n
    nxt = sample_from_probs(kr, dist)
    return n, nxt
