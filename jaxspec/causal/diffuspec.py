"""DiffuSpec building blocks (DiffuSpec, arXiv:2510.02358, Sec. 4): the pruned candidate
lattice (Eq. 6), causal-consistency path search (CPS, Eq. 7) and the adaptive draft-length
controller (ADL, Eqs. 8-10), as static-shape jittable functions.

:class:`DiffusionDrafter` puts them together as a :class:`jaxspec.core.drafters.Drafter`: a
:class:`models.diffusion.modeling.DiffusionLM` proposes a block in one forward (``S = 1``,
the paper's default; ``refine_steps = S > 1`` runs Eq. 4's iterative refinement), CPS picks the
path, ADL sets the next ``k_t``, and the causal loop verifies with a **point-mass** ``q``: the path
is a deterministic function of the history, so accepting ``x`` with probability ``p(x)`` and
resampling ``p`` without ``x`` on rejection is exact under sampling (the paper is exact only under
greedy verification: Prop. 4.1, App. H).

* **Lattice** (:func:`prune_lattice`, Eq. 6): per draft position keep the smallest top-``m``
  whose probability mass reaches ``tau``, at most ``M_max``; EOS is always kept (an extra
  slot), so a path can end there.
* **CPS** (:func:`cps_beam`, Eq. 7): left-to-right beam search of width ``B`` over the lattice
  with score ``sum_i lambda * l_dlm(pi_i) + (1 - lambda) * l_ng(pi_i | pi_<i, context)``; a beam
  that has placed EOS stops growing (its score is frozen), and the best beam's path and length
  (up to and including its first EOS) are returned. The causal proxy ``l_ng`` is any function
  of (the two previous tokens, the candidate) -- here a hashed 3-gram table (:class:`NgramProxy`):
  inside a jitted loop the proxy must be array lookups, and hashing keeps a 3-gram model over a
  49k vocabulary in a fixed-size table.
* **ADL** (:func:`adl_update`, Eqs. 8-10): EMAs of the generated length (up to the raw draft's
  first EOS) and of the accepted length; ``k_{t+1} = clip(ceil(L_gen + delta * 1{L_acc >=
  L_gen}), k_min, k_max)``.
* **Drafter prefix cache** (``prefix_cache=True``; Sec. 4.1 allows the Fast-dLLM prefix cache
  because a draft need not be exact): the drafter keeps the keys / values of the context in
  its own cache (:class:`DrafterCache`) and each forward runs only a window of ``2 k_max + 2``
  slots -- the context tokens accepted since its last forward, the last context token again
  and the ``k_max`` draft positions -- instead of the whole buffer. The context's keys /
  values are those of the forward that last saw them (it attended to that step's masks), as in
  Fast-dLLM's prefix cache; that changes the drafts, never the output: verification is exact
  for any deterministic proposal.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.drafters import Draft, DraftContext, Drafter
from jaxspec.core.sampling import argmax
from models.diffusion.modeling import bidirectional_mask
from models.llama.modeling import KVCache, init_cache, param_dtype

__all__ = [
    "prune_lattice",
    "cps_beam",
    "NgramProxy",
    "ADLState",
    "adl_init",
    "adl_update",
    "DrafterCache",
    "DiffuSpecState",
    "DiffusionDrafter",
]

NEG = -1e30


def prune_lattice(logp: jax.Array, tau: float, m_max: int, eos_id: int):
    """The pruned candidate lattice of Eq. 6.

    Args:
      logp: float32 ``(B, K, V)`` the drafter's log-probabilities per draft position.
      tau: cumulative-mass threshold in ``(0, 1]``; m_max: cap ``M_max`` (>= 1).
      eos_id: the EOS id, always kept.

    Returns:
      ``(tokens int32 (B, K, M + 1), logp float32 (B, K, M + 1), valid bool (B, K, M + 1))``
      with ``M = min(M_max, V)``: the top-``M_i`` tokens by probability (``M_i`` of Eq. 6), then EOS
      in the last slot when it is not already among them.

    Raises:
      ValueError: ``tau`` outside ``(0, 1]`` or ``m_max < 1``.
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must lie in (0, 1], got {tau}")
    if m_max < 1:
        raise ValueError(f"M_max must be >= 1, got {m_max}")
    top_lp, top_tok = jax.lax.top_k(logp, min(m_max, logp.shape[-1]))  # (B, K, M)
    mass_before = jnp.cumsum(jnp.exp(top_lp), axis=-1) - jnp.exp(top_lp)
    keep = mass_before < tau  # rank m kept iff mass of 0..m-1 < tau
    has_eos = jnp.any(keep & (top_tok == eos_id), axis=-1, keepdims=True)
    eos_tok = jnp.full(top_tok.shape[:-1] + (1,), eos_id, jnp.int32)
    eos_lp = logp[..., eos_id][..., None]
    tokens = jnp.concatenate([top_tok.astype(jnp.int32), eos_tok], axis=-1)
    lps = jnp.concatenate([top_lp, eos_lp], axis=-1)
    valid = jnp.concatenate([keep, ~has_eos], axis=-1)
    return tokens, lps, valid


def _fnv(ids, bits: int, xp):
    """32-bit FNV-1a over int arrays, the top ``bits`` bits: the same on host (numpy) and in a
    jitted program (jax.numpy, where 64-bit integers are off by default)."""
    acc = xp.asarray(2166136261, dtype=xp.uint32)
    for x in ids:
        acc = (acc ^ xp.asarray(x).astype(xp.uint32)) * xp.asarray(16777619, dtype=xp.uint32)
    return (acc >> xp.asarray(32 - bits, dtype=xp.uint32)).astype(xp.int32)


@flax.struct.dataclass
class NgramProxy:
    """A hashed interpolated 3-gram model: the causal proxy ``l_ng`` of Eq. 7 as array lookups
    (a pytree: pass it to a jitted program as an argument, e.g. inside drafter parameters).

    ``log P(c | a, b) = log(l3 * f3(c | a, b) + l2 * f2(c | b) + l1 * f1(c))`` with relative
    frequencies from a token stream; 3-gram and 2-gram counts live in tables of ``2^bits``
    slots indexed by a 32-bit FNV-1a hash (colliding n-grams share counts: a proxy, not a
    language model of record; each relative frequency is clipped to 1, since a colliding
    count can exceed its context's: unclipped, ``log P`` reached +1.57 for " number number
    number" with 2^20 slots over the 3.3M-token stdlib, and CPS drafted that loop). The paper fits a
    KenLM 3-gram offline; inside a jitted loop the proxy has to be array lookups, and hashing keeps
    a 3-gram model over a 49k vocabulary in a fixed-size table. Build with :meth:`fit`.

    Attributes:
      tri, tri_ctx: float32 ``(2^bits,)`` counts of hashed (a, b, c) and of hashed (a, b).
      bi: float32 ``(2^bits,)`` counts of hashed (b, c); bi_ctx: float32 ``(V,)`` counts of b.
      uni: float32 ``(V,)`` add-one unigram frequencies.
      weights: static ``(l3, l2, l1)`` interpolation weights.
    """

    tri: jax.Array
    tri_ctx: jax.Array
    bi: jax.Array
    bi_ctx: jax.Array
    uni: jax.Array
    weights: tuple = flax.struct.field(pytree_node=False, default=(0.6, 0.3, 0.1))

    @classmethod
    def fit(cls, stream: Sequence[int], vocab_size: int, bits: int = 22) -> "NgramProxy":
        """Counts of a token stream (e.g. the stdlib training split).

        Raises:
          ValueError: a stream shorter than 3 tokens, ids outside ``[0, vocab_size)``.
        """
        s = np.asarray(stream, np.int64)
        if s.size < 3 or s.min() < 0 or s.max() >= vocab_size:
            raise ValueError(f"need >= 3 token ids in [0, {vocab_size}), got {s.size} ids")
        n = 1 << bits
        count = lambda *ids: np.bincount(_fnv(ids, bits, np), minlength=n).astype(np.float32)  # noqa: E731
        uni = np.bincount(s, minlength=vocab_size).astype(np.float32) + 1.0
        return cls(
            tri=jnp.asarray(count(s[:-2], s[1:-1], s[2:])),
            tri_ctx=jnp.asarray(count(s[:-2], s[1:-1])),
            bi=jnp.asarray(count(s[:-1], s[1:])),
            bi_ctx=jnp.asarray(np.bincount(s[:-1], minlength=vocab_size).astype(np.float32)),
            uni=jnp.asarray(uni / uni.sum()),
        )

    def logprob(self, a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
        """``log P(c | a, b)`` elementwise over broadcastable int arrays (jittable)."""
        bits = int(np.log2(self.tri.shape[0]))
        l3, l2, l1 = self.weights
        # a hashed count may include colliding n-grams: a relative frequency is at most 1
        f3 = jnp.minimum(
            self.tri[_fnv((a, b, c), bits, jnp)]
            / jnp.maximum(self.tri_ctx[_fnv((a, b), bits, jnp)], 1.0),
            1.0,
        )
        f2 = jnp.minimum(self.bi[_fnv((b, c), bits, jnp)] / jnp.maximum(self.bi_ctx[b], 1.0), 1.0)
        return jnp.log(l3 * f3 + l2 * f2 + l1 * self.uni[c])


def cps_beam(
    tokens: jax.Array,
    lp: jax.Array,
    valid: jax.Array,
    ctx2: jax.Array,
    proxy: NgramProxy | None,
    *,
    lam: float,
    beam: int,
    eos_id: int,
    limit: jax.Array | None = None,
):
    """Causal-consistency path search (Eq. 7) for one row.

    Args:
      tokens, lp, valid: one row of :func:`prune_lattice`, ``(K, C)`` each.
      ctx2: int32 ``(2,)`` the last two context tokens (the proxy's history at position 1).
      proxy: the causal proxy, or None (``lambda`` is then effectively 1).
      lam: the weight of the drafter's log-score; beam: ``B`` (>= 1); eos_id: EOS.
      limit: optional int32 ``()`` draft length ``k_t <= K``: positions from ``k_t`` on are
        not searched (the paths stop there).

    Returns:
      ``(path int32 (K,), length int32 ())``: the best beam's tokens (after its first EOS,
      EOS repeated) and its length up to and including that EOS (``K`` if none).
    """
    K, C = tokens.shape
    w_ng = 0.0 if proxy is None else 1.0 - lam
    w_dlm = 1.0 if proxy is None else lam
    # beams: tokens (B, K), score (B,) = Eq. 7 sum, done (B,), length (B,), last two tokens
    paths = jnp.zeros((beam, K), jnp.int32)
    score = jnp.full((beam,), NEG).at[0].set(0.0)  # one live beam at the start
    done = jnp.zeros((beam,), bool)
    length = jnp.zeros((beam,), jnp.int32)
    hist = jnp.broadcast_to(ctx2.astype(jnp.int32), (beam, 2))

    def body(i, carry):
        paths, score, done_, length, hist = carry
        done = done_ if limit is None else done_ | (i >= limit)  # past k_t: frozen
        cand, clp, ok = tokens[i], lp[i], valid[i]  # (C,)
        step = w_dlm * clp[None, :]
        if proxy is not None:
            step = step + w_ng * proxy.logprob(hist[:, :1], hist[:, 1:], cand[None, :])
        new = jnp.where(ok[None, :], score[:, None] + step, NEG)  # (B, C) live beams
        # a finished beam has one continuation: itself (repeat EOS, score unchanged)
        keep = jnp.full((beam, C), NEG).at[:, 0].set(score)
        new = jnp.where(done[:, None], keep, new)
        top, idx = jax.lax.top_k(new.reshape(-1), beam)
        b, c = idx // C, idx % C
        tok = jnp.where(done[b], eos_id, cand[c])
        paths = paths[b].at[:, i].set(tok)
        length = jnp.where(done[b], length[b], i + 1)
        done = done_[b] | (~done[b] & (tok == eos_id))
        hist = jnp.stack([hist[b, 1], tok], axis=1)
        return paths, top, done, length, hist

    paths, score, done, length, hist = jax.lax.fori_loop(
        0, K, body, (paths, score, done, length, hist)
    )
    best = jnp.argmax(score)
    return paths[best], length[best]


@flax.struct.dataclass
class ADLState:
    """EMAs of the generated and accepted lengths (Eq. 9), float32 ``(B,)`` each."""

    gen: jax.Array
    acc: jax.Array


def adl_init(batch: int, k0: float) -> ADLState:
    """Both EMAs start at the first draft length ``k0``."""
    return ADLState(
        gen=jnp.full((batch,), k0, jnp.float32), acc=jnp.full((batch,), k0, jnp.float32)
    )


def adl_update(
    state: ADLState,
    l_gen: jax.Array,
    l_acc: jax.Array,
    *,
    rho: float,
    delta: float,
    k_min: int,
    k_max: int,
):
    """Eqs. 9-10: update the EMAs with this step's generated length ``L_gen`` (Eq. 8: the raw
    draft's length before its first EOS, at most ``k_t``) and accepted length ``L_acc``, and
    return ``(state, k_next int32 (B,))`` with ``k_next = clip(ceil(gen + delta * 1{acc >=
    gen}), k_min, k_max)``."""
    gen = (1.0 - rho) * state.gen + rho * l_gen.astype(jnp.float32)
    acc = (1.0 - rho) * state.acc + rho * l_acc.astype(jnp.float32)
    k_hat = jnp.ceil(gen + delta * (acc >= gen).astype(jnp.float32))
    return ADLState(gen=gen, acc=acc), jnp.clip(k_hat, k_min, k_max).astype(jnp.int32)


# ----------------------------------------------------------------------------- the drafter


@flax.struct.dataclass
class DrafterCache:
    """The drafter's prefix cache (``DiffusionDrafter(prefix_cache=True)``).

    Attributes:
      kv: the drafter's :class:`models.llama.modeling.KVCache`, ``S + 2 k_max + 2`` slots
        (``S`` = the decoder's buffer width) in the buffer's slot layout.
      cached: int32 ``(B,)``: slots ``[pad, cached)`` hold context keys / values; the next
        forward's window starts at slot ``cached`` (always ``<= length - 1``).
    """

    kv: KVCache
    cached: jax.Array


@flax.struct.dataclass
class DiffuSpecState:
    """ADL state (:class:`ADLState`) plus the draft length in force ``k`` int32 ``(B,)``,
    this step's raw generated length ``gen`` int32 ``(B,)`` (Eq. 8, set by ``propose``) and
    the drafter's :class:`DrafterCache` (``None`` without ``prefix_cache``)."""

    adl: ADLState
    k: jax.Array
    gen: jax.Array
    cache: Optional[DrafterCache] = None


@dataclasses.dataclass(frozen=True)
class DiffusionDrafter(Drafter):
    """DiffuSpec's drafter (Sec. 4) as a :class:`jaxspec.core.drafters.Drafter`.

    Parameters (``drafter_params``): ``(dllm_params, proxy)`` -- the diffusion model's params
    and an :class:`NgramProxy` (or ``None``: CPS then ranks paths by the drafter's log-scores
    alone). Static settings (paper defaults in brackets; ``draft_length`` is ``k_max``, the
    static buffer width):

    Attributes:
      model: the drafter :class:`models.diffusion.modeling.DiffusionLM` (LLaDA or Dream head).
      draft_length: ``k_max`` [30]; k_min: [20]; eos_id: the EOS the lattice keeps.
      cps: causal-consistency path search on (off: argmax per position, SpecDiff).
      adl: adaptive draft length on (off: ``k_t = draft_length`` every step).
      tau [0.8], m_max [15], beam [3], lam [0.5], delta [10], rho [0.5]: Eqs. 6-10.
      refine_steps: ``S`` [1], drafter forwards per proposal (Sec. 4.1, Eq. 4: each step
        unmasks the most confident share of the block; :meth:`refine`).
      prefix_cache: keep the context's keys / values in a drafter cache and run each forward
        over a window of :attr:`window` slots (module docstring; off: every forward re-reads
        the whole buffer, the paper's setting).

    State: :class:`DiffuSpecState`. NFE: ``S`` drafter forwards per proposal (with
    ``prefix_cache``, plus one uncounted forward over the prompt in ``init_state``, as a draft
    model's prefill in :mod:`jaxspec.causal.sps`).

    Raises:
      ValueError: ``k_max < 1``, ``k_min > k_max`` (with ADL), ``tau`` outside ``(0, 1]``,
        ``beam < 1``, ``m_max < 1``, ``rho`` outside ``(0, 1]``, ``lam`` outside ``[0, 1]``,
        ``refine_steps < 1``.
    """

    model: object
    draft_length: int
    eos_id: int
    k_min: int = 20
    cps: bool = True
    adl: bool = True
    tau: float = 0.8
    m_max: int = 15
    beam: int = 3
    lam: float = 0.5
    delta: float = 10.0
    rho: float = 0.5
    refine_steps: int = 1
    prefix_cache: bool = False

    name = "diffuspec"

    def __post_init__(self):
        checks = (
            (self.draft_length >= 1, f"k_max must be >= 1, got {self.draft_length}"),
            (
                not self.adl or 1 <= self.k_min <= self.draft_length,
                f"need 1 <= k_min <= k_max, got k_min={self.k_min}, k_max={self.draft_length}",
            ),
            (0.0 < self.tau <= 1.0, f"tau must lie in (0, 1], got {self.tau}"),
            (self.beam >= 1, f"beam width B must be >= 1, got {self.beam}"),
            (self.m_max >= 1, f"M_max must be >= 1, got {self.m_max}"),
            (0.0 < self.rho <= 1.0, f"rho must lie in (0, 1], got {self.rho}"),
            (0.0 <= self.lam <= 1.0, f"lambda must lie in [0, 1], got {self.lam}"),
            (self.refine_steps >= 1, f"refinement steps S must be >= 1, got {self.refine_steps}"),
        )
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def context_length(self) -> int:
        return self.model.config.base.max_position_embeddings

    @property
    def window(self) -> int:
        """Query slots of a cached forward: ``2 k_max + 2`` (at most ``k_max + 1`` tokens
        accepted since the last forward, the last context token before them, ``k_max`` draft
        positions)."""
        return 2 * self.draft_length + 2

    def init_state(self, params, ctx: DraftContext) -> DiffuSpecState:
        """ADL at ``k_min`` (``k_max`` without ADL); with ``prefix_cache``, one drafter forward
        over the ``ctx.filled`` prefilled slots (bidirectional over the context) fills the
        cache.

        Raises:
          ValueError: ``prefix_cache`` with a context that has no static ``filled`` width
            (the cross-vocabulary loop rebuilds the drafter's context every step)."""
        B, S = ctx.buffer.shape
        k0 = self.draft_length if not self.adl else self.k_min
        state = DiffuSpecState(
            adl=adl_init(B, float(k0)),
            k=jnp.full((B,), k0, jnp.int32),
            gen=jnp.zeros((B,), jnp.int32),
        )
        if not self.prefix_cache:
            return state
        if ctx.filled is None:
            raise ValueError(
                "DiffusionDrafter(prefix_cache=True) needs a decoder context with a "
                "static prefill width (ctx.filled); the cross-vocabulary loop has "
                "none: use prefix_cache=False there"
            )
        dparams = params[0]
        kv = init_cache(self.model.config.base, B, S + self.window, param_dtype(dparams))
        slots = jnp.broadcast_to(jnp.arange(ctx.filled, dtype=jnp.int32)[None], (B, ctx.filled))
        _, kv = self._forward(
            dparams,
            ctx.buffer[:, : ctx.filled],
            slots,
            ctx,
            kv,
            jnp.zeros((B,), jnp.int32),
            ctx.length,
            None,
        )
        return state.replace(cache=DrafterCache(kv=kv, cached=ctx.length - 1))

    def _forward(self, dparams, tokens, slots, ctx: DraftContext, kv, first_slot, key_end, rows):
        """One drafter forward of ``tokens`` int32 ``(B, T)`` sitting at buffer ``slots``
        ``(B, T)``; keys at slots ``[pad, key_end)`` are visible (bidirectional). With ``kv``
        the new keys / values are written from ``first_slot`` and the cached slots are read
        too. ``rows``: ``(start, n)`` raw LM-head rows (None: one row, for the keys / values
        alone). Returns ``(logits, kv or None)``."""
        positions = jnp.maximum(slots - ctx.pad[:, None], 0)
        if kv is None:
            valid = (slots >= ctx.pad[:, None]) & (slots < key_end[:, None])
            return self.model.apply(
                dparams, tokens, positions, bidirectional_mask(valid), rows=rows
            )
        keys = jnp.arange(kv.size)[None, None, :]
        mask = ((keys >= ctx.pad[:, None, None]) & (keys < key_end[:, None, None])) | (
            keys == slots[:, :, None]
        )
        if rows is None:  # only the keys / values are wanted: the head on one row
            rows = (jnp.zeros_like(first_slot), 1)
        return self.model.apply(
            dparams, tokens, positions, mask, cache=kv, cache_index=first_slot, rows=rows
        )

    def block_logprobs(
        self, dparams, ctx: DraftContext, draft: jax.Array | None = None
    ) -> jax.Array:
        """One drafter forward over ``[context, draft block]``: float32 ``(B, k_max, V)``
        log-probabilities of the draft positions (the mask token excluded).

        ``draft``: optional int32 ``(B, k_max)`` block contents (the mask id where still
        masked, Eq. 4's ``y^(s-1)``); ``None`` is the all-mask block ``y^(0)``."""
        return self._block(dparams, ctx, draft, None)[0]

    def _block(self, dparams, ctx: DraftContext, draft, cache: Optional[DrafterCache]):
        """:meth:`block_logprobs` over the whole buffer (``cache`` None) or over the
        :attr:`window` from ``cache.cached`` on; returns ``(logp, kv or None)``."""
        B, S = ctx.buffer.shape
        K, cfg = self.draft_length, self.model.config
        L = ctx.length[:, None]
        if cache is None:
            slots = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32)[None], (B, S))
            src, start = ctx.buffer, jnp.zeros((B,), jnp.int32)
        else:
            start = cache.cached
            slots = start[:, None] + jnp.arange(self.window, dtype=jnp.int32)[None]
            src = jnp.take_along_axis(jnp.pad(ctx.buffer, ((0, 0), (0, self.window))), slots, 1)
        draft_zone = (slots >= L) & (slots < L + K)
        block = jnp.full(slots.shape, cfg.mask_token_id, jnp.int32)
        if draft is not None:  # place draft[:, i] at slot L + i
            block = jnp.take_along_axis(draft.astype(jnp.int32), jnp.clip(slots - L, 0, K - 1), 1)
        tokens = jnp.where(draft_zone, block, src)
        first = ctx.length - (1 if cfg.head == "dream" else 0) - start  # raw row scoring slot L
        logits, kv = self._forward(
            dparams,
            tokens,
            slots,
            ctx,
            None if cache is None else cache.kv,
            start,
            ctx.length + K,
            (first, K),
        )
        logits = logits.at[..., cfg.mask_token_id].set(-jnp.inf)
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), kv

    def refine(self, dparams, ctx: DraftContext, k_t: jax.Array) -> jax.Array:
        """Iterative refinement (Sec. 4.1, Eq. 4) in ``S = refine_steps`` drafter forwards:
        float32 ``(B, k_max, V)`` per-position log-probabilities, each position's row taken
        from the forward in which it was unmasked.

        Step ``s = 1..S`` unmasks the ``n_s`` still-masked positions among the first ``k_t``
        with the highest confidence (max probability, [MASK] excluded) and fills them with
        their argmax (Eq. 4, ``U_s`` = top by confidence); ``n_s = k_t // S + 1{s <= k_t mod
        S}`` as LLaDA's ``get_num_transfer_tokens``, so the filled block equals greedy
        low-confidence stepwise decoding of one ``k_t`` block in ``S`` steps with the
        ``renormalized`` confidence rule. Positions past ``k_t`` keep the rows of the last
        forward. ``S = 1`` is the single pass of :meth:`block_logprobs`."""
        return self._refine(dparams, ctx, k_t, None)[0]

    def _refine(self, dparams, ctx: DraftContext, k_t: jax.Array, cache: Optional[DrafterCache]):
        """:meth:`refine`, through the prefix cache when given: ``(rows, kv or None)``."""
        if self.refine_steps == 1:
            return self._block(dparams, ctx, None, cache)
        B, K = ctx.buffer.shape[0], self.draft_length
        mask_id = self.model.config.mask_token_id
        pos = jnp.arange(K)[None]
        k_t = k_t.astype(jnp.int32)[:, None]
        draft = jnp.full((B, K), mask_id, jnp.int32)
        masked = jnp.ones((B, K), bool)
        rows = kv = None
        for s in range(self.refine_steps):  # static S: one traced forward per step
            logp, kv = self._block(dparams, ctx, None if s == 0 else draft, cache)
            rows = logp if rows is None else jnp.where(masked[..., None], logp, rows)
            n_s = k_t // self.refine_steps + (s < k_t % self.refine_steps)  # LLaDA's schedule
            conf = jnp.where(masked & (pos < k_t), jnp.max(logp, axis=-1), -jnp.inf)
            rank = jnp.argsort(jnp.argsort(-conf, axis=-1), axis=-1)  # 0 = most confident
            pick = (rank < n_s) & masked & (pos < k_t)
            draft = jnp.where(pick, argmax(logp), draft)
            masked = masked & ~pick
        return rows, kv

    def propose(self, params, state: DiffuSpecState, ctx: DraftContext, key, sample: bool):
        """Draft (``S`` refinement forwards, through the prefix cache when on), then CPS (or
        argmax), with length ``min(path length, k_t)``; ``q`` is ``None`` (point masses) under
        greedy and sampled decoding alike: the refinement (argmax fills), the cache and CPS
        are deterministic in the history."""
        dparams, proxy = params
        B, K = ctx.buffer.shape[0], self.draft_length
        k_t = state.k
        logp, kv = self._refine(dparams, ctx, k_t, state.cache)  # (B, K, V)
        if state.cache is not None:  # the window's context keys stay; it restarts at length - 1
            state = state.replace(
                cache=DrafterCache(
                    kv=kv, cached=jnp.where(ctx.active, ctx.length - 1, state.cache.cached)
                )
            )
        raw = argmax(logp)  # (B, K)
        pos = jnp.arange(K)[None]
        first_eos = jnp.min(jnp.where(raw == self.eos_id, pos, K), axis=-1)
        gen = jnp.minimum(first_eos, k_t)  # Eq. 8
        if self.cps:
            tok, lp, ok = prune_lattice(logp, self.tau, self.m_max, self.eos_id)
            prev = jax.vmap(lambda b, L: jax.lax.dynamic_slice(b, (L - 2,), (2,)))(
                ctx.buffer, ctx.length
            )
            search = lambda t, l, o, c, k: cps_beam(
                t,
                l,
                o,
                c,
                proxy,
                lam=self.lam,  # noqa: E731
                beam=self.beam,
                eos_id=self.eos_id,
                limit=k,
            )
            tokens, plen = jax.vmap(search)(tok, lp, ok, prev, k_t)
            length = jnp.clip(plen, 1, k_t)
        else:  # SpecDiff: argmax per position, fixed length
            tokens, length = raw, k_t
        return Draft(
            tokens=tokens,
            q=None,
            has_draft=jnp.ones((B,), bool),
            length=length.astype(jnp.int32),
            nfe=jnp.full((B,), self.refine_steps, jnp.int32),
        ), state.replace(gen=gen.astype(jnp.int32))

    def update(self, params, state: DiffuSpecState, ctx: DraftContext, n_accepted):
        """ADL (Eqs. 9-10) from this step's generated and accepted lengths."""
        if not self.adl:
            return state
        adl, k = adl_update(
            state.adl,
            state.gen,
            n_accepted,
            rho=self.rho,
            delta=self.delta,
            k_min=self.k_min,
            k_max=self.draft_length,
        )
        return state.replace(adl=adl, k=k)
