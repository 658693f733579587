"""Chain verification: the one lossless accept/reject rule of every chain method.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), the left-to-right special
case of ASSD Algorithm 1 (lines 13-25): draft token ``x_i ~ q_i`` is accepted with
probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection the next token is drawn
from the residual distribution ``norm(max(p_i - q_i, 0))`` (line 22); if all ``k`` drafts are
accepted a bonus token is drawn from ``p_k``. The output is distributed exactly as sampling
from ``p`` token by token. Used by: causal AR / n-gram / draft-model decoding, ASSD, and the
coming SPACE and DiffuSpec loops.

Names (everywhere in jaxspec): ``p`` is the **target** distribution, ``q`` the **draft**
distribution.

Options:
* ``q=None``: a deterministic drafter (n-gram lookup). ``q_i`` is the point mass on ``x_i``,
  so ``x_i`` is accepted with probability ``p_i(x_i)`` and the residual is ``p_i`` with
  ``x_i`` removed.
* ``epsilon > 0``: ASSD Appendix F.5 tolerance, accept when ``r < min(1, p/q + epsilon)``.
  **Not lossless**; ``epsilon = 0`` (default) is the exact rule, bit for bit.
* ``bonus=False``: ``p`` has ``k`` rows (no row after the last draft, as in ASSD's density
  pass); after ``k`` acceptances the returned token is meaningless and must not be used.
* ``draft_len``: a traced per-row draft length ``k_t <= k`` (adaptive draft lengths): drafts
  at ``i >= k_t`` are never accepted and the token after ``k_t`` acceptances is the bonus
  from ``p_{k_t}``.
* ``resample="target"``: after a rejection draw the next token from ``p_n`` itself instead
  of the residual, as SPACE's Algorithm 1 line 18 does. **Not lossless** unless ``q`` is a
  point mass outside ``p``'s support; kept only to reproduce that paper's rule
  (``space_sampling="paper"``). ``"residual"`` (default) is the exact rule.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxspec.core.sampling import argmax, sample_from_probs


def accepted_prefix(accept: jax.Array) -> jax.Array:
    """Length of the all-True prefix of ``accept`` bool ``(B, k)`` -> int32 ``(B,)``."""
    return jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def _within(draft_len: Optional[jax.Array], k: int) -> Optional[jax.Array]:
    if draft_len is None:
        return None
    return jnp.arange(k)[None, :] < draft_len[:, None]


def verify_greedy(
    target_logits: jax.Array, draft: jax.Array, *, draft_len: Optional[jax.Array] = None
):
    """Greedy verification: accept while the draft equals ``argmax p``.

    Args:
      target_logits: float ``(B, k+1, V)`` (or ``(B, k, V)`` without a bonus row); row ``i``
        is the target's next-token logits after the context plus drafts ``0..i-1``.
      draft: int32 ``(B, k)``.
      draft_len: optional int32 ``(B,)`` per-row draft length ``<= k`` (module docstring).

    Returns:
      ``(n_accepted int32 (B,), next_token int32 (B,))``: the target's argmax at the first
      mismatch, or the bonus argmax after all drafts were accepted (without a bonus row the
      last row's argmax, never to be used).
    """
    k = draft.shape[1]
    am = argmax(target_logits)  # (B, k+1) or (B, k)
    ok = am[:, :k] == draft
    within = _within(draft_len, k)
    if within is not None:
        ok = ok & within
    n = accepted_prefix(ok)
    nxt = jnp.take_along_axis(am, jnp.minimum(n, am.shape[1] - 1)[:, None], axis=1)[:, 0]
    return n, nxt


RESAMPLE_RULES = ("residual", "target")


def verify_sample(
    key: jax.Array,
    p: jax.Array,
    draft: jax.Array,
    q: Optional[jax.Array] = None,
    *,
    epsilon=0.0,
    draft_len: Optional[jax.Array] = None,
    resample: str = "residual",
):
    """Stochastic verification of a draft chain (lossless for ``epsilon = 0``).

    Args:
      key: PRNG key (split once: uniforms, then the residual / bonus sample).
      p: float32 ``(B, k+1, V)`` processed target probabilities (rows sum to 1), or
        ``(B, k, V)`` when there is no bonus row.
      draft: int32 ``(B, k)`` draft tokens; ``draft[:, i] ~ q[:, i]``.
      q: float32 ``(B, k, V)`` draft probabilities, or ``None`` for point masses on
        ``draft`` (deterministic drafter).
      epsilon: float (Python or traced scalar) acceptance tolerance, ASSD Appendix F.5;
        ``> 0`` is not lossless.
      draft_len: optional int32 ``(B,)`` per-row draft length ``<= k``.
      resample: ``"residual"`` (exact) or ``"target"`` (SPACE Alg. 1 line 18, approximate).

    Returns:
      ``(n_accepted int32 (B,), next_token int32 (B,))``. ``next_token`` is drawn from the
      residual ``norm(max(p_n - q_n, 0))`` when ``n < k_t`` (falling back to ``p_n`` if the
      residual is numerically empty) and from ``p_{k_t}`` when ``n == k_t`` (the bonus token;
      without a bonus row and ``n == k`` it is not meaningful).
    """
    if resample not in RESAMPLE_RULES:
        raise ValueError(f"unknown resample rule {resample!r}; expected one of {RESAMPLE_RULES}")
    B, rows, V = p.shape
    k = draft.shape[1]
    ku, kr = jax.random.split(key)
    if k > 0:
        px = jnp.take_along_axis(p[:, :k], draft[..., None], axis=-1)[..., 0]
        qx = (
            jnp.ones_like(px)
            if q is None
            else jnp.take_along_axis(q, draft[..., None], axis=-1)[..., 0]
        )
        r = jax.random.uniform(ku, (B, k))
        ok = r * qx < px + epsilon * qx  # r < min(1, px / qx + eps); qx > 0 for a drawn draft
        within = _within(draft_len, k)
        if within is not None:
            ok = ok & within
        n = accepted_prefix(ok)
    else:
        n = jnp.zeros((B,), jnp.int32)
    p_n = jnp.take_along_axis(p, jnp.minimum(n, rows - 1)[:, None, None], axis=1)[:, 0]  # (B, V)
    if k > 0:
        idx = jnp.minimum(n, k - 1)
        if q is None:
            d_n = jnp.take_along_axis(draft, idx[:, None], axis=1)[:, 0]
            q_n = jax.nn.one_hot(d_n, V, dtype=p.dtype)
        else:
            q_n = jnp.take_along_axis(q, idx[:, None, None], axis=1)[:, 0]
        resid = jnp.maximum(p_n - q_n, 0.0)
        k_t = k if draft_len is None else draft_len
        # all accepted -> bonus from p_k; numerically empty residual -> fall back to p_n
        use_resid = (n < k_t) & (jnp.sum(resid, axis=-1) > 0) & (resample == "residual")
        dist = jnp.where(use_resid[:, None], resid, p_n)
    else:
        dist = p_n
    nxt = sample_from_probs(kr, dist)
    return n, nxt
