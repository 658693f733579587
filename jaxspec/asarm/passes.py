"""The AS-ARM passes of ASSD: one forward under a mask, the draft phase (the AS-ARM's draft
pass or Algorithm 2's context bigram) and the density pass.

Source: Guo & Ermon, arXiv:2504.20456 (ICLR 2026 version: "Self-Speculative Decoding
Accelerates Lossless Inference in Any-Order and Any-Subset Autoregressive Models"): Fig. 1 /
Eq. 6 (attention masks), Algorithm 1 lines 4-15, Lemma 1, Appendix E.5 (Algorithm 2, Eq. 23)
and Appendix F.4 (content KV cache).

**Target.** ``p(x_sigma(i) | x_sigma(<i))``, read from the XLNet query stream at position
``sigma(i)`` with the density mask of Fig. 1b (:func:`models.xlnet.modeling.density_masks`):
the prompt attends to itself, every masked position to the prompt and to the masked positions
before it. Temperature / top-k / top-p are applied to these logits (:mod:`jaxspec.core.
sampling`); the processed distribution is the one every variant samples from.

**Draft pass** (Algorithm 1 lines 4-8, Fig. 1a, :func:`draft_pass`): every query slot
``sigma(i), i in [n, t)`` attends to the prompt and the decoded tokens only, so ``x~_sigma(i) ~
p(. | x_sigma(<n))`` independently. Lines 9-12: a row speculating a single token (the last
token, or ``k = 1``) accepts it unverified (Lemma 1; the paper states it for the last token,
applying it whenever one token is speculated makes ``k = 1`` sequential decoding).

**Context bigram drafts** (Appendix E.5, Algorithm 2, :func:`bigram_drafts`): the Eq. 23
bigram ``c(a | b)`` over the known tokens (prompt and decoded; pairs whose two tokens are both
known); draft ``i`` conditions on ``x_sigma(i)-1`` when that position is known, else on the
draft there (lines 2-6; Theorem 3: it is then the previous draft). Cases Eq. 23 leaves
undefined, as the official code (gabeguo/any-order-speculative-decoding, ``context_ngram.py``)
handles them: a condition never seen followed by a known token drafts from the unigram
frequencies of the known tokens; an iteration whose first slot is position 0 (no left
neighbour, excluded by Theorem 3) takes an AS-ARM draft pass (:func:`ngram_drafts`).

**Density pass** (lines 13-15, Fig. 1b, :func:`density_pass`): one pass over the drafts gives
``q_sigma(i) = p(x~_sigma(i) | x_sigma(<n), x~_sigma(n:i))`` for all ``i`` at once.

**Content KV cache** (Appendix F.4; ``cache="content"``). Under the density mask the content
row of a decoded token attends only to the prompt and to lower ranks, all decoded for good, so
its keys/values never change once computed. With the cache the prompt is encoded once
(:func:`prefill`) and every call (:func:`forward`) encodes only the rows it adds: a draft pass
the token decoded last (rank ``n - 1``: a resampled token no pass has encoded yet); a density
pass or a fused call ranks ``n - 1 .. n + k - 1`` (that token and the drafts). Accepted drafts
keep the keys/values their density pass wrote; rejected ones are overwritten or hidden by the
masks. Without the cache (default) every pass is a full content-stream forward over the
``S``-slot buffer plus the query slots.

Reading order: the forward (:func:`conditionals`, :func:`conditionals_at`, :func:`forward`,
:func:`prefill`), :func:`draw`, :class:`Drafts`, the draft phases, :func:`density_pass`.
"""

from __future__ import annotations

from typing import Optional

import flax
import jax
import jax.numpy as jnp

from jaxspec.asarm.config import LoopConfig, State
from jaxspec.asarm.inputs import UNSEEN, Inputs, Window, density_order, draft_order, known_slots
from jaxspec.core.drafters import (
    bigram_successors,
    context_bigram,
    context_unigram,
    sample_marked,
)
from jaxspec.core.sampling import argmax, sample_from_probs, target_probs
from models.xlnet.modeling import XLNetCache, XLNetLM, density_masks, init_cache


# --------------------------------------------------------------------------- the forward
def conditionals(
    model: XLNetLM,
    params,
    tokens: jax.Array,
    visible: jax.Array,
    order: jax.Array,
    query_pos: jax.Array,
) -> jax.Array:
    """One AS-ARM forward: query-stream logits at ``query_pos`` under the mask of ``order``.

    Args:
      tokens: int32 ``(B, S)`` (content of every slot; unattended slots are irrelevant).
      visible: bool ``(B, S)`` prompt slots (attend to each other bidirectionally).
      order: int32 ``(B, S)``: rank of each non-prompt slot; slot ``j`` is seen by a masked slot
        ``i`` iff ``order[j] < order[i]`` (``UNSEEN`` = seen by nobody). With the true ranks of
        ``x_sigma(<t)`` and ``UNSEEN`` elsewhere this is the density mask of Fig. 1b; with ranks
        ``< n`` kept and ``UNSEEN`` elsewhere every undecoded slot conditions on ``x_sigma(<n)``
        only (the parallel-sampling mask of Fig. 1a, extended to the decoded tokens).
      query_pos: int32 ``(B, P)`` slots to read.

    Returns:
      float32 ``(B, P, V)`` logits of ``p(x_{query_pos} | attended slots)``.
    """
    cond = jnp.take_along_axis(order, query_pos, axis=1)
    return conditionals_at(model, params, tokens, visible, order, query_pos, cond)


def conditionals_at(
    model: XLNetLM,
    params,
    tokens: jax.Array,
    visible: jax.Array,
    order: jax.Array,
    query_pos: jax.Array,
    cond: jax.Array,
) -> jax.Array:
    """One AS-ARM forward whose query ``p`` reads slot ``query_pos[:, p]`` while attending to the
    prompt and the slots with ``order < cond[:, p]`` (content stream under the density mask of
    ``order``). :func:`conditionals` is the case ``cond = order[query_pos]``; fused ASSD gives
    queries at the same slot different conditioning sets (:mod:`jaxspec.asarm.fused`).

    Args:
      tokens, visible, order: as in :func:`conditionals`.
      query_pos: int32 ``(B, P)`` slots to read (repeats allowed).
      cond: int32 ``(B, P)``: query ``p`` attends to non-prompt slot ``j`` iff
        ``order[j] < cond[p]`` (never to its own slot).

    Returns:
      float32 ``(B, P, V)`` logits (ASSD token suppression applied later, by the caller).
    """
    S = tokens.shape[1]
    cm, _ = density_masks(visible, order)
    own = query_pos[:, :, None] == jnp.arange(S)[None, None, :]
    qm = (visible[:, None, :] | (order[:, None, :] < cond[:, :, None])) & ~own
    logits, _ = model.apply(params, tokens, cm, qm, query_pos=query_pos)
    return logits


def _cached_forward(
    cfg: LoopConfig,
    params,
    inp: Inputs,
    kv: XLNetCache,
    tokens,
    order,
    query_pos,
    cond,
    rows_from: jax.Array,
    rows: int,
):
    """:func:`forward` with the content cache: encode ``rows`` content rows, read the queries."""
    B, S = tokens.shape
    r = rows_from[:, None] + jnp.arange(rows)[None, :]
    slot = jnp.take_along_axis(inp.pos_of_rank, jnp.clip(r, 0, S - 1), axis=1)
    r_order = jnp.take_along_axis(order, slot, axis=1)
    ok = (r >= 0) & (r < inp.num_masked[:, None]) & (r_order < UNSEEN)
    cpos = jnp.where(ok, slot, S)  # S: not written
    every = jnp.arange(S)[None, None, :]
    cm = (
        inp.visible[:, None, :]
        | (order[:, None, :] < r_order[:, :, None])
        | (every == cpos[:, :, None])
    )
    qm = (inp.visible[:, None, :] | (order[:, None, :] < cond[:, :, None])) & (
        every != query_pos[:, :, None]
    )
    return cfg.model.apply(
        params,
        jnp.take_along_axis(tokens, slot, axis=1),
        cm,
        qm,
        content_pos=cpos,
        query_pos=query_pos,
        cache=kv,
    )


def forward(
    cfg: LoopConfig,
    params,
    inp: Inputs,
    kv: Optional[XLNetCache],
    tokens,
    order,
    query_pos,
    cond,
    rows_from: jax.Array,
    rows: int,
):
    """One AS-ARM forward with ``cfg.suppress`` applied: ``(logits float32 (B, P, V), kv)``
    with suppressed ids at -inf.

    Without a cache it is :func:`conditionals_at` over the whole buffer ``tokens`` (``kv`` is
    returned as given, None). With the content cache it encodes only the ``rows`` content rows
    of ranks ``rows_from .. rows_from + rows - 1`` (int32 ``(B,)``; rows of ranks outside the
    masked range or unattended under ``order`` are not written), each attending to the prompt,
    the slots of lower ``order`` and itself, writes their keys/values into ``kv`` and reads
    the queries against the whole cache (the updated cache is returned)."""
    if cfg.cache == "none":
        logits = conditionals_at(cfg.model, params, tokens, inp.visible, order, query_pos, cond)
    else:
        logits, kv = _cached_forward(
            cfg, params, inp, kv, tokens, order, query_pos, cond, rows_from, rows
        )
    if cfg.suppress:
        logits = logits.at[..., jnp.asarray(cfg.suppress, jnp.int32)].set(-jnp.inf)
    return logits, kv


def prefill(cfg: LoopConfig, params, inp: Inputs, tokens: jax.Array) -> Optional[XLNetCache]:
    """The content cache after encoding the prompt slots (cache ``"content"``; else None):
    one content-only forward in which every prompt row attends to the prompt."""
    if cfg.cache == "none":
        return None
    B, S = tokens.shape
    c = cfg.model.config
    cm, _ = density_masks(inp.visible, jnp.full((B, S), UNSEEN, jnp.int32))
    pos = jnp.where(inp.visible, jnp.arange(S)[None, :], S)  # S: nothing written
    _, kv = cfg.model.apply(
        params,
        tokens,
        cm & inp.visible[:, :, None],
        None,
        content_pos=pos,
        cache=init_cache(c, B, S),
    )
    return kv


def draw(cfg: LoopConfig, key: jax.Array, logits: jax.Array):
    """Drafts from ``logits (B, K, V)``: ``(tokens int32 (B, K), q)`` with the argmax and
    ``q = None`` (greedy), else independent samples and ``q`` the processed probabilities."""
    if cfg.sampling.greedy:
        return argmax(logits), None
    q = target_probs(logits, cfg.sampling)
    return sample_from_probs(key, q), q


# --------------------------------------------------------------------------- draft phase
@flax.struct.dataclass
class Drafts:
    """One iteration's drafts ``x~_sigma(n + j)``, ``j < K``."""

    tokens: jax.Array  # int32 (B, K)
    q: Optional[jax.Array]  # float32 (B, K, V) draft distribution; None when greedy
    # and self-drafted (greedy verification needs none)
    logits: Optional[jax.Array]  # float32 (B, K, V) draft-pass logits (self-draft only)
    need_check: jax.Array  # bool (B,): rows whose drafts go to verification
    lemma1: jax.Array  # bool (B,): drafts came from a draft pass (Lemma 1 holds
    # at i = n; that pass is a target NFE)


def draft_pass(
    cfg: LoopConfig, params, inp: Inputs, st: State, win: Window, key: jax.Array
) -> tuple[Drafts, Optional[XLNetCache]]:
    """Algorithm 1 lines 4-8 (and one sequential step): one draft pass (Fig. 1a) in which every
    query slot conditions on ``x_sigma(<n)`` only; drafts are its argmax (greedy) or samples.
    Lines 9-12: a row speculating a single token skips verification (Lemma 1)."""
    order = draft_order(inp.rank, st.decoded)
    logits, kv = forward(
        cfg,
        params,
        inp,
        st.kv,
        st.tokens,
        order,
        win.query_pos,  # (B, K, V)
        jnp.take_along_axis(order, win.query_pos, axis=1),
        st.decoded - 1,
        1,
    )
    tokens, q = draw(cfg, key, logits)
    return Drafts(
        tokens=tokens,
        q=q,
        logits=logits,
        need_check=win.live >= 2,
        lemma1=jnp.ones_like(win.active),
    ), kv


def bigram_draft_dist(
    tokens: jax.Array, known: jax.Array, cond: jax.Array, has_cond: jax.Array, vocab_size: int
) -> jax.Array:
    """ASSD's draft distribution for one position (Algorithm 2 lines 2-8): the Eq. 23 context
    bigram :func:`jaxspec.core.drafters.context_bigram` conditioned on ``cond``; the unigram
    frequencies of the known tokens when ``cond`` never started a known bigram (the official
    code's rule; Eq. 23 leaves the case undefined) or the position has no left neighbour
    (``has_cond`` False).

    Args:
      tokens: int32 ``(S,)``; known: bool ``(S,)`` (prompt or decoded);
      cond: int32 ``()``; has_cond: bool ``()``.

    Returns:
      float32 ``(V,)``.
    """
    d_big, total = context_bigram(tokens, known, cond, vocab_size)
    return jnp.where(has_cond & (total > 0), d_big, context_unigram(tokens, known, vocab_size))


def sample_bigram_draft(
    key: jax.Array,
    tokens: jax.Array,
    known: jax.Array,
    cond: jax.Array,
    has_cond: jax.Array,
    vocab_size: int,
) -> jax.Array:
    """One draw from :func:`bigram_draft_dist` (Algorithm 2 line 8) without the dense
    distribution: a uniformly chosen known successor of ``cond``
    (:func:`jaxspec.core.drafters.bigram_successors`) when the bigram applies, else a uniformly
    chosen known token (the unigram frequencies), else a uniform token id (nothing known). The
    same distribution as ``bigram_draft_dist``, drawn with ``S`` Gumbel numbers
    (:func:`jaxspec.core.drafters.sample_marked`) instead of ``V``.

    Args: as :func:`bigram_draft_dist`, with ``key`` a PRNG key. Returns int32 ``()``.
    """
    succ = bigram_successors(tokens, known, cond)
    use_bigram = has_cond & jnp.any(succ)
    k_pos, k_uni = jax.random.split(key)
    tok, seen = sample_marked(k_pos, tokens, jnp.where(use_bigram, succ, known))
    return jnp.where(seen, tok, jax.random.randint(k_uni, (), 0, vocab_size)).astype(jnp.int32)


def bigram_drafts(cfg: LoopConfig, inp: Inputs, st: State, win: Window, key: jax.Array) -> Drafts:
    """Algorithm 2: drafts from the Eq. 23 context bigram over the known tokens, slot by slot.

    Lines 2-6: draft ``j`` conditions on the token left of its slot when that one is known
    (always for ``j = 0``), else on draft ``j - 1``; lines 7-8: it is that distribution's argmax
    (greedy) or a sample (key ``fold_in(key, j)``). No Lemma 1: every live row is verified."""
    V = cfg.model.config.vocab_size
    known = known_slots(inp, st.decoded)
    dist = jax.vmap(lambda t, kn, c, h: bigram_draft_dist(t, kn, c, h, V))
    draw = jax.vmap(lambda kk, t, kn, c, h: sample_bigram_draft(kk, t, kn, c, h, V))
    tokens, qs = [], []
    for i in range(cfg.draft_slots):
        left = win.query_pos[:, i] - 1
        left_known = jnp.take_along_axis(known, jnp.maximum(left, 0)[:, None], 1)[:, 0]
        left_tok = jnp.take_along_axis(st.tokens, jnp.maximum(left, 0)[:, None], 1)[:, 0]
        prev = tokens[-1] if tokens else left_tok
        cond, has_cond = jnp.where(left_known | (i == 0), left_tok, prev), left >= 0
        c = dist(st.tokens, known, cond, has_cond)
        if cfg.sampling.greedy:
            tokens.append(argmax(c))
        else:
            keys = jax.random.split(jax.random.fold_in(key, i), known.shape[0])
            tokens.append(draw(keys, st.tokens, known, cond, has_cond))
        qs.append(c)
    return Drafts(
        tokens=jnp.stack(tokens, axis=1),
        q=jnp.stack(qs, axis=1),
        logits=None,
        need_check=win.live >= 1,
        lemma1=jnp.zeros_like(win.active),
    )


def ngram_drafts(
    cfg: LoopConfig, params, inp: Inputs, st: State, win: Window, key: jax.Array
) -> tuple[Drafts, Optional[XLNetCache]]:
    """The n-gram drafter of Algorithm 1 (module docstring): :func:`bigram_drafts`, except on
    rows whose first slot is position 0, which take an AS-ARM draft pass (:func:`draft_pass`)
    as the official code does; that pass runs only when some row needs it."""
    big = bigram_drafts(cfg, inp, st, win, key)
    at0 = win.active & (win.query_pos[:, 0] == 0) & (win.live >= 1)
    V = cfg.model.config.vocab_size
    big = big.replace(logits=jnp.zeros(big.q.shape[:2] + (V,), jnp.float32))

    def with_pass(_):
        own, kv = draft_pass(cfg, params, inp, st, win, key)
        row = at0[:, None]
        return Drafts(
            tokens=jnp.where(row, own.tokens, big.tokens),
            q=big.q if own.q is None else jnp.where(row[..., None], own.q, big.q),
            logits=jnp.where(row[..., None], own.logits, big.logits),
            need_check=jnp.where(at0, own.need_check, big.need_check),
            lemma1=at0,
        ), kv

    return jax.lax.cond(jnp.any(at0), with_pass, lambda _: (big, st.kv), None)


# --------------------------------------------------------------------------- density pass
def density_pass(cfg: LoopConfig, params, inp: Inputs, st: State, win: Window, drafts: Drafts):
    """Algorithm 1 lines 13-15: one density pass (Fig. 1b) over ``x_sigma(<n)`` plus the live
    drafts gives ``p(x~_sigma(i) | x_sigma(<n), x~_sigma(n:i))`` at every query slot. Skipped
    (zeros) when no row needs verification.

    Returns: ``(float32 (B, K, V) target logits, kv)``; with the content cache the call
    encodes the rows of ranks ``n - 1 .. n + K - 1`` (the token decoded last, which no pass
    has encoded when it was resampled, and the drafts)."""
    B, S = st.tokens.shape
    slot = jnp.where(win.use, win.query_pos, S)  # S (out of range) drops the write
    with_drafts = st.tokens.at[jnp.arange(B)[:, None], slot].set(drafts.tokens, mode="drop")

    def run(_):
        order = density_order(inp.rank, st.decoded + win.live)
        return forward(
            cfg,
            params,
            inp,
            st.kv,
            with_drafts,
            order,
            win.query_pos,
            jnp.take_along_axis(order, win.query_pos, axis=1),
            st.decoded - 1,
            cfg.query_slots + 1,
        )

    zeros = jnp.zeros((B, cfg.query_slots, cfg.model.config.vocab_size), jnp.float32)
    return jax.lax.cond(jnp.any(drafts.need_check), run, lambda _: (zeros, st.kv), None)


__all__ = [
    "conditionals",
    "conditionals_at",
    "forward",
    "prefill",
    "draw",
    "Drafts",
    "draft_pass",
    "bigram_draft_dist",
    "sample_bigram_draft",
    "bigram_drafts",
    "ngram_drafts",
    "density_pass",
]
