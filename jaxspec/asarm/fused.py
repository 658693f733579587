"""Fused ASSD: one AS-ARM call per iteration verifies the current drafts **and** drafts the next
ones (this library's extension of Algorithm 1; variants ``AssdVariant(fused=True)``, method
names ``"assd-fused"`` and ``"assd-fused-ngram"``).

Source: Guo & Ermon, arXiv:2504.20456 (ICLR 2026 version: "Self-Speculative Decoding
Accelerates Lossless Inference in Any-Order and Any-Subset Autoregressive Models"): Algorithm 1
(the draft and density passes fused here), Theorems 1-2, Appendix E.5 (Algorithm 2); the
exactness argument is Leviathan et al. 2023 (arXiv:2211.17192), Thm. 1.

**One call.** Let ``n`` masked tokens be decoded and ``d_1..d_L`` (``L <= k``) be drafts for
ranks ``n..n+L-1`` with draft distributions ``q_1..q_L``, carried from the previous call. One
XLNet call over the buffer ``x_sigma(<n), d_1..d_L`` (content stream under the density mask of
Fig. 1b, i.e. ``density_order(rank, n + L)``) carries ``(k+1)^2`` query tokens:

- ``k + 1`` density queries: query ``i`` sits at rank ``n + i`` and attends to ranks
  ``< n + i`` (the prompt and ``d_1..d_i``), giving the target ``p_i = p(x_sigma(n+i) |
  x_sigma(<n), d_1..d_i)`` (Alg. 1 lines 13-15, plus the row after the last draft);
- ``k + 1`` draft groups of ``k`` queries: group ``j`` (``j = 0..k``) sits at ranks
  ``n+j+1 .. n+j+k`` and attends to ranks ``< n + j`` only (the prompt, the decoded tokens and
  ``d_1..d_j``; *not* rank ``n + j``, whose token is decided by this call's verification), so
  each of its queries is ``p(x_sigma(r) | x_sigma(<n), d_1..d_j)``: the parallel-sampling pass
  of Fig. 1a that a separate draft pass would run after accepting ``d_1..d_j``, minus that one
  token.

The query stream never feeds the content stream, and under the density mask the content row of
rank ``r`` attends only to ranks ``<= r``; so a query restricted to ranks ``< c`` computes
exactly what a call holding only those tokens would compute (``test_fused_queries_equal_
separate_passes`` checks this numerically). The chain verifier (:mod:`jaxspec.core.verify`,
``draft_len = L``) accepts ``j`` drafts; on the first rejection it samples rank ``n + j`` from
the residual ``norm(max(p_j - q_{j+1}, 0))``, after ``L`` acceptances it samples the bonus from
``p_L``. The call emits ``j + 1`` tokens, and the next iteration's drafts (ranks ``n+j+1..``,
``L' = min(k, N - m - (n+j+1) - 1)`` of them, so a bonus row always exists) are group ``j``'s
samples (greedy: argmax) with ``q`` = group ``j``'s processed distribution. The first call has
``L = 0``: it samples rank 0 from ``p_0`` and drafts with group 0.

**With the n-gram drafter** (``drafter="ngram"``): Algorithm 2's bigram drafts, drawn at the
start of the iteration, are verified by one call whose ``k + 1`` density queries also cover the
position after the drafts (a bonus token after ``k`` acceptances); there are no draft groups.

*Why it stays exact.* Speculative sampling outputs a token distributed as ``p`` for **any**
proposal ``q`` as long as the draft is drawn from ``q`` before, and independently of, the
verification's random numbers, and ``q`` depends only on the history (Leviathan et al. 2023,
Thm. 1; ASSD Theorem 2 is the same argument along ``sigma``). Group ``j``'s drafts are drawn in
call ``t`` with a key split off before call ``t + 1``'s verification key, and their distribution
is a function of ``x_sigma(<n+j)``, part of the history at the time they are verified (the
token at rank ``n + j`` is simply not used: a worse proposal, never a biased one). Hence every
emitted token is distributed as ``p(. | x_sigma(<i))`` and the output joint equals sequential
decoding's. Greedy: every emitted token is the target's argmax given the emitted prefix, so
the output is identical to sequential greedy. *NFE <= N - m* (Theorem 1): every call emits at
least one token. Unlike Algorithm 1 there is no Lemma 1 (the first draft of an iteration is
conditioned on one token less than its target, so it can be rejected); in exchange an
iteration costs one call instead of two.

Reading order: the call (:func:`fused_queries`, :func:`fused_pass`), :func:`fused_verify`,
:func:`fused_commit`, :func:`fused_step`. The loop and the host wrapper are
:mod:`jaxspec.asarm.assd`'s.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxspec.asarm.config import LoopConfig, State
from jaxspec.asarm.inputs import Inputs, Window, density_order, query_window
from jaxspec.asarm.passes import bigram_drafts, draw, forward
from jaxspec.core.sampling import target_probs
from jaxspec.core.verify import verify_greedy, verify_sample
from models.xlnet.modeling import XLNetCache


# --------------------------------------------------------------------------- the call
def fused_queries(cfg: LoopConfig, inp: Inputs, decoded: jax.Array):
    """Slots and conditioning of one fused call's ``P`` query tokens (module docstring): ``K +
    1`` density queries (rank ``n + i``, attending to ranks ``< n + i``), then, for the self
    drafter, ``K + 1`` groups of ``K`` (group ``j``: ranks ``n+j+1 .. n+j+K``, attending to
    ranks ``< n + j``).

    Returns: ``(query_pos int32 (B, P), cond int32 (B, P))`` for
    :func:`jaxspec.asarm.passes.conditionals_at`."""
    K = cfg.draft_slots
    B, S = inp.visible.shape
    n = decoded[:, None]
    rank, cond = n + jnp.arange(K + 1)[None, :], n + jnp.arange(K + 1)[None, :]
    if cfg.variant.drafter == "self":
        j, r = jnp.arange(K + 1)[:, None], jnp.arange(K)[None, :]
        g_rank = (n[:, :, None] + (j + 1 + r)[None]).reshape(B, -1)
        g_cond = jnp.broadcast_to(n[:, :, None] + j[None], (B, K + 1, K)).reshape(B, -1)
        rank, cond = jnp.concatenate([rank, g_rank], 1), jnp.concatenate([cond, g_cond], 1)
    pos = jnp.take_along_axis(inp.pos_of_rank, jnp.minimum(rank, S - 1), axis=1)
    return pos, cond


def fused_pass(
    cfg: LoopConfig, params, inp: Inputs, st: State, win: Window, drafts: jax.Array, live: jax.Array
):
    """The one AS-ARM call of a fused iteration: content stream over ``x_sigma(<n)`` and the
    ``live`` (int32 ``(B,)``) drafts ``drafts`` (int32 ``(B, K)``) under the density mask, and
    the queries of :func:`fused_queries`.

    Returns: ``(target float32 (B, K + 1, V), groups float32 (B, K + 1, K, V) or None, kv)``
    (content cache: the rows of ranks ``n - 1 .. n + K - 1`` are encoded, i.e. the token the
    previous call sampled and the drafts):
    ``target[:, i]`` is ``p(x_sigma(n+i) | x_sigma(<n), d_1..d_i)`` (valid for ``i <= live``),
    ``groups[:, j, r]`` is ``p(x_sigma(n+j+1+r) | x_sigma(<n), d_1..d_j)`` (None for the
    n-gram drafter)."""
    B, S = st.tokens.shape
    K, V = cfg.draft_slots, cfg.model.config.vocab_size
    use = jnp.arange(K)[None, :] < live[:, None]
    buf = st.tokens.at[jnp.arange(B)[:, None], jnp.where(use, win.query_pos, S)].set(
        drafts, mode="drop"
    )
    pos, cond = fused_queries(cfg, inp, st.decoded)
    logits, kv = forward(
        cfg,
        params,
        inp,
        st.kv,
        buf,
        density_order(inp.rank, st.decoded + live),
        pos,
        cond,
        st.decoded - 1,
        K + 1,
    )
    groups = logits[:, K + 1 :].reshape(B, K + 1, K, V) if cfg.variant.drafter == "self" else None
    return logits[:, : K + 1], groups, kv


# --------------------------------------------------------------------------- verify, commit
def fused_verify(
    cfg: LoopConfig,
    key: jax.Array,
    target: jax.Array,
    drafts: jax.Array,
    q: Optional[jax.Array],
    live: jax.Array,
    epsilon: jax.Array,
):
    """Chain verification of the ``live`` drafts with a bonus row (:mod:`jaxspec.core.verify`,
    ``draft_len = live``): ``(accepted int32 (B,), token int32 (B,))``, the token being the
    residual sample at the first rejection or the bonus from ``p_live``."""
    if cfg.sampling.greedy:
        return verify_greedy(target, drafts, draft_len=live)
    return verify_sample(
        key, target_probs(target, cfg.sampling), drafts, q, epsilon=epsilon, draft_len=live
    )


def _write_emitted(
    inp: Inputs, st: State, win: Window, drafts: jax.Array, n_ok: jax.Array, token: jax.Array
) -> jax.Array:
    """The buffer with ``d_1..d_j`` and the sampled token at rank ``n + j`` (``j = n_ok``)
    written on the active rows: int32 ``(B, S)``."""
    B, S = st.tokens.shape
    rows = jnp.arange(B)
    act = win.active
    keep = (jnp.arange(drafts.shape[1])[None, :] < n_ok[:, None]) & act[:, None]
    tokens = st.tokens.at[rows[:, None], jnp.where(keep, win.query_pos, S)].set(drafts, mode="drop")
    at = jnp.take_along_axis(inp.pos_of_rank, jnp.minimum(st.decoded + n_ok, S - 1)[:, None], 1)
    return tokens.at[rows, jnp.where(act, at[:, 0], S)].set(token, mode="drop")


def fused_commit(
    cfg: LoopConfig,
    inp: Inputs,
    st: State,
    key: jax.Array,
    k_draft: jax.Array,
    win: Window,
    drafts: jax.Array,
    live: jax.Array,
    groups,
    n_ok: jax.Array,
    token: jax.Array,
    kv: Optional[XLNetCache],
) -> State:
    """Write ``d_1..d_j`` and the sampled token at rank ``n + j`` (``j = n_ok``), ``n <- n +
    j + 1``; the next drafts are group ``j``'s samples (greedy: argmax) with their ``q``; count
    one target NFE per call."""
    rows = jnp.arange(st.tokens.shape[0])
    tokens = _write_emitted(inp, st, win, drafts, n_ok, token)
    produced = jnp.where(win.active, n_ok + 1, 0)
    decoded = st.decoded + produced
    nxt, q = st.next_drafts, st.next_q
    if groups is not None:
        nxt, q_new = draw(cfg, k_draft, groups[rows, jnp.minimum(n_ok, cfg.draft_slots)])
        q = q if q_new is None else q_new
    a32 = win.active.astype(jnp.int32)
    hist = st.accept_hist.at[rows, jnp.clip(produced, 0, cfg.draft_slots + 1)].add(a32)
    ngram = cfg.variant.drafter == "ngram"
    return st.replace(
        tokens=tokens,
        decoded=decoded,
        key=key,
        target_nfe=st.target_nfe + a32,
        draft_nfe=st.draft_nfe + (a32 * (live >= 1) if ngram else 0),
        steps=st.steps + a32,
        accept_hist=hist,
        drafts_proposed=st.drafts_proposed + a32 * live,
        drafts_accepted=st.drafts_accepted + a32 * n_ok,
        density_passes=st.density_passes + a32,
        next_drafts=nxt,
        next_q=q,
        next_live=query_window(cfg, inp, decoded).live,
        kv=kv,
    )


# --------------------------------------------------------------------------- step
def fused_step(cfg: LoopConfig, params, inp: Inputs, st: State) -> State:
    """One fused iteration for every row in lockstep: drafts (carried from the previous call,
    or Algorithm 2's bigram), one call, verification, commit."""
    win = query_window(cfg, inp, st.decoded)
    key, k_draft, k_verify = jax.random.split(st.key, 3)
    if cfg.variant.drafter == "self":
        live = jnp.minimum(st.next_live, win.live)
        drafts, q = st.next_drafts, (None if cfg.sampling.greedy else st.next_q)
    else:
        big = bigram_drafts(cfg, inp, st, win, k_draft)  # Algorithm 2
        live, drafts, q = win.live, big.tokens, big.q
    target, groups, kv = fused_pass(cfg, params, inp, st, win, drafts, live)
    n_ok, token = fused_verify(cfg, k_verify, target, drafts, q, live, inp.epsilon)
    return fused_commit(cfg, inp, st, key, k_draft, win, drafts, live, groups, n_ok, token, kv)


__all__ = ["fused_queries", "fused_pass", "fused_verify", "fused_commit", "fused_step"]
