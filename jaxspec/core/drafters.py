"""Drafters: the protocol every draft source implements, the context n-gram drafter and
the one Eq. 23 context bigram model.

**The Drafter protocol.** A chain method's loop (:mod:`jaxspec.causal.decode`; SPACE and
DiffuSpec will use the same one) asks its drafter for ``k`` draft tokens each step and tells
it afterwards how many were accepted. A drafter is a frozen, hashable object (its settings
are static arguments of the jitted loop) that may own

* **parameters** (a draft model's weights): passed to every call as ``params``, a traced
  argument of the compiled loop, never baked into the program as constants;
* **state** carried through the ``lax.while_loop`` (a draft model's KV cache, an adaptive
  draft length): any pytree, created by :meth:`Drafter.init_state` and returned updated;
* a **traced draft length** ``k_t <= k`` per row (:attr:`Draft.length`), so adaptive draft
  lengths need no recompilation; ``k`` (``draft_length``) fixes the static shapes;
* its own **NFE** (:attr:`Draft.nfe`): draft-model forward passes, reported as
  ``DecodeStats.draft_nfe``.

Methods::

    init_state(params, ctx: DraftContext) -> state
    propose(params, state, ctx: DraftContext, key, sample: bool) -> (Draft, state)
    update(params, state, ctx: DraftContext, n_accepted int32 (B,)) -> state

``update`` sees the context *after* the step's tokens were written (``ctx.length`` grew by
``n_accepted + 1`` on active rows), so a draft model can roll its cache back to the accepted
prefix and an adaptive length can react to ``n_accepted``.

**Optional capabilities.** Declared on :class:`Drafter` with defaults, so a drafter (which
subclasses it) overrides only what it has; the loops read them as plain attributes:

* ``resample`` ("residual"): the verifier's rule after a rejection
  (:func:`jaxspec.core.verify.verify_sample`);
* ``context_length`` (None): a draft model's context (prompt + budget + k must fit);
* ``position_overshoot`` (0): positions past the last emitted token its query rows reach;
* ``query_slots`` (0): the most draft-query rows it appends to a pass (> 0: draft queries);
* ``one_token_steps`` (False): its forwards are mostly one-token steps (weight layout);
* ``eos_id`` (None): the EOS id of its own vocabulary (a drafter of another vocabulary);
* ``proposal_skippable`` (False): ``propose`` leaves the state as it was and ``update`` does
  not depend on the proposal, so a wrapper may skip proposals (:class:`LookupFirst`).

**Draft queries (optional).** A drafter that drafts *inside the target's own forward* (SPACE's
mask groups, :mod:`jaxspec.causal.space`) sets ``query_slots > 0`` and defines::

    draft_queries(last_position (B,), n_drafts: int) -> DraftQueries
    absorb(state, n_accepted (B,), logits (B, E, V)) -> state

Every target pass (the prefill too, with ``n_drafts = 0``) then appends the ``E`` query rows
of :class:`DraftQueries` after ``[context, last token, d_1..d_kk]``. They see the context up
to the last token, the drafts and the other queries their static visibility tables allow,
and nothing sees them, so the verification rows are unchanged. ``absorb`` receives their
logits after the step's acceptance (``n_accepted`` drafts) and keeps what the next
``propose`` needs.

**Drafter weight layout (optional).** A drafter whose forwards are mostly one-token steps (a
draft model drafting token by token, :class:`jaxspec.causal.sps.DraftModelDrafter`) sets the
class attribute ``one_token_steps = True``; :func:`jaxspec.causal.decode.decode_plan` then
plans its weights in the AR loop's output-major decode layout
(:func:`models.llama.layout.decode_layout`) instead of the stored one.

**Context n-gram drafter** (:class:`NgramDrafter`): model-free drafts from the sequence
decoded so far (ASSD paper, Appendix E.5, Algorithm 2, run in left-to-right order; Stewart
et al. 2024 "context n-grams"; prompt lookup decoding):

1. **Suffix match.** For ``n = max_ngram .. min_ngram`` take the last ``n`` tokens of the
   context and look for an earlier occurrence (the most recent one). If found, the draft
   copies the ``k`` tokens that followed it; a copy that runs into the end of the context
   continues from the drafts themselves (periodic continuation). Deterministic given the
   context, so its draft distribution ``q`` is a point mass.
2. **Bigram fallback** (ASSD Eq. 23, :func:`context_bigram`). Otherwise draft token ``i`` is
   drawn from ``c(a | x_cond)`` with ``x_cond`` the previous token (the last context token for
   ``i = 0``, then the previous draft: Algorithm 2 lines 2-6). Under greedy decoding the
   argmax of ``c`` is used; under sampling ``x_i ~ c(. | x_cond)`` and ``q_i = c(. | x_cond)``
   (Alg. 2 lines 7-8). A token never seen followed by another gets a point mass on itself.

**Cost gate** (:class:`CostGate`): wraps a drafter and withholds its drafts while they are
not expected to pay for their verification. On a GPU a ``K + 1``-row target pass costs about
as much as a one-token step; on a 2-core CPU it costs 1.8-2.4 of them (README "Verification
passes on the CPU"), so a draft that is accepted rarely makes decoding slower than AR. The
gate decides from the past only (acceptance so far), so the verifier's output distribution
is untouched: it is as lossless as the drafter it wraps.

**Lookup first** (:class:`LookupFirst`): wraps a model drafter; a row whose context has a
suffix match takes the n-gram copy (step 1 above), the others the model's drafts, and the
model's forward is skipped on steps where every active row has a match. The same hybrid serves
production engines (Arctic Inference's suffix decoding combined with its model speculator;
Oliaro et al., "SuffixDecoding", arXiv:2411.04975): copies are cheap and long where the answer
repeats its context (code), the model drafts where nothing repeats. Which source drafts a
row depends on its context only, and each row's ``q`` is the distribution its draft was drawn
from, so the verifier stays exact.

All shapes are static: the context is a fixed-size buffer with per-row valid ranges
``[pad, length)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Protocol, runtime_checkable

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class DraftContext:
    """What a drafter sees: the decoder's token buffer.

    Attributes:
      buffer: int32 ``(B, S)``; row ``b`` holds its context in slots ``[pad[b], length[b])``.
      length: int32 ``(B,)`` filled slots (padding + prompt + generated tokens).
      pad: int32 ``(B,)`` left-padding slots.
      active: bool ``(B,)`` rows still decoding.
      filled: static ``int`` when every row has the same number of filled slots and the
        loop knows it at trace time (``init_state`` after the prefill: ``P + 1``), else
        ``None``. A draft model uses it to prefill its own cache with a static shape.
    """

    buffer: jax.Array
    length: jax.Array
    pad: jax.Array
    active: jax.Array
    filled: Optional[int] = flax.struct.field(pytree_node=False, default=None)


@flax.struct.dataclass
class Draft:
    """One step's proposal.

    Attributes:
      tokens: int32 ``(B, k)`` draft tokens (entries at ``i >= length`` are ignored).
      q: float32 ``(B, k, V)`` draft distribution ``q_i`` the tokens were drawn from, or
        ``None`` for a deterministic drafter (point masses; greedy decoding needs none).
      has_draft: bool ``(B,)`` rows with a draft worth verifying; when no active row has one
        the loop runs a cheaper single-token step.
      length: int32 ``(B,)`` the per-row draft length ``k_t <= k`` (traced).
      nfe: int32 ``(B,)`` draft-model forward passes spent on this proposal.
    """

    tokens: jax.Array
    q: Optional[jax.Array]
    has_draft: jax.Array
    length: jax.Array
    nfe: jax.Array


@flax.struct.dataclass
class DraftQueries:
    """Query rows a drafter appends to a target pass (module docstring, "Draft queries").

    Attributes:
      tokens: int32 ``(B, E)`` input ids of the query rows (SPACE: the mask id).
      positions: int32 ``(B, E)`` their RoPE positions.
      sees_draft: static bool numpy ``(E, kk)``: query ``e`` attends to draft ``i``.
      sees_query: static bool numpy ``(E, E)``: query ``e`` attends to query ``e'`` (include
        the diagonal: a row sees itself).
    """

    tokens: jax.Array
    positions: jax.Array
    sees_draft: Any = flax.struct.field(pytree_node=False)
    sees_query: Any = flax.struct.field(pytree_node=False)


@runtime_checkable
class Drafter(Protocol):
    """The drafter protocol (module docstring). Implementations are frozen dataclasses that
    subclass it (``class MyDrafter(Drafter)``) and set ``name``, ``draft_length`` (k, static)
    and ``vocab_size`` (checked against the target's: a mismatch is a ``ValueError`` before
    anything compiles); the optional capabilities below keep their defaults unless a drafter
    overrides them (a class attribute, a dataclass field or a property)."""

    name: str
    draft_length: int
    vocab_size: int

    #: the verifier's rule after a rejection: "residual" (lossless) or "target"
    resample: str = "residual"
    #: a draft model's context (prompt + budget + k must fit it), None for no limit
    context_length: Optional[int] = None
    #: how far past the last emitted token the drafter's query rows reach (positions)
    position_overshoot: int = 0
    #: the most draft-query rows appended to a target pass; > 0 means draft queries
    query_slots: int = 0
    #: forwards mostly one-token steps: its weights go in the output-major layout
    one_token_steps: bool = False
    #: the EOS id of the drafter's own vocabulary, None when it has none
    eos_id: Optional[int] = None
    #: target layers whose hidden states every target pass hands to :meth:`absorb_features`
    #: (DFlash); empty: the loop computes and passes none
    feature_layers: tuple = ()
    #: ``propose`` returns the state it got and ``update`` does not depend on the proposal,
    #: so a wrapper may skip a proposal (:class:`LookupFirst`)
    proposal_skippable: bool = False

    def init_state(self, params: Any, ctx: DraftContext) -> Any: ...

    def absorb_features(self, state: Any, first_slot: jax.Array, hidden: jax.Array) -> Any:
        """Take the hidden states ``float32 (B, T, len(feature_layers), D)`` of a target pass
        written from cache slot ``first_slot int32 (B,)``; only called when
        ``feature_layers`` is not empty. The default keeps ``state`` as it is."""
        return state

    def propose(
        self, params: Any, state: Any, ctx: DraftContext, key: jax.Array, sample: bool
    ) -> tuple[Draft, Any]: ...

    def update(self, params: Any, state: Any, ctx: DraftContext, n_accepted: jax.Array) -> Any: ...


def bigram_successors(tokens: jax.Array, known: jax.Array, cond: jax.Array) -> jax.Array:
    """Where ``cond`` was followed by a known token in one row: bool ``(S,)``, True at ``i``
    when positions ``i - 1`` and ``i`` are known and ``x_{i-1} = cond``. The counts of
    :func:`context_bigram` are the tokens at these positions, and
    :func:`sample_context_bigram` draws one of them.

    Args:
      tokens: int32 ``(S,)``; known: bool ``(S,)``; cond: int32 ``()``.
    """
    pair = known[:-1] & known[1:] & (tokens[:-1] == cond)
    return jnp.concatenate([jnp.zeros((1,), bool), pair])


def context_bigram(
    tokens: jax.Array, known: jax.Array, cond: jax.Array, vocab_size: int
) -> tuple[jax.Array, jax.Array]:
    """The context bigram model of ASSD Eq. 23, ``c(. | cond)``, over the known tokens of
    one row: the one implementation used by the n-gram drafter and by ASSD's Algorithm 2.

    Args:
      tokens: int32 ``(S,)`` the row's token buffer.
      known: bool ``(S,)`` positions whose token is known (prompt, accepted or decoded).
      cond: int32 ``()`` the conditioning token ``b``.
      vocab_size: ``V``.

    Returns:
      ``(dist float32 (V,), total float32 ())``: ``dist[a] = #{j: known j, j+1; x_j = b;
      x_{j+1} = a} / total`` with ``total = #{j: known j, j+1; x_j = b}``, and a point mass
      on ``b`` when ``total`` is 0 (a token never seen followed by another).

    Denominator: Eq. 23 as printed divides by the number of known ``b`` whether or not the
    next position is known, which does not sum to 1 over ``a`` when some ``b`` is followed by
    an unknown token; a draft is *sampled* from ``c`` and its density enters the acceptance
    ratio, so the count of ``b`` followed by a known token normalises it (the conditional
    bigram frequency the text describes).
    """
    succ = bigram_successors(tokens, known, cond)
    counts = jnp.zeros((vocab_size,), jnp.float32).at[tokens].add(succ.astype(jnp.float32))
    total = jnp.sum(counts)
    dist = jnp.where(total > 0, counts / jnp.maximum(total, 1.0), jax.nn.one_hot(cond, vocab_size))
    return dist, total


def sample_marked(key: jax.Array, tokens: jax.Array, marked: jax.Array) -> tuple:
    """The token at one uniformly chosen marked position of a row: a draw from the empirical
    distribution of ``tokens[marked]`` (token ``a`` with probability ``#{i marked: x_i = a} /
    #marked``) at the cost of ``S`` Gumbel numbers, not ``V``. Context n-gram drafts are drawn
    this way (:func:`sample_context_bigram`, ASSD's Algorithm 2 in
    :func:`jaxspec.asarm.passes.sample_bigram_draft`): with ``V = 49152`` a vocabulary-wide
    draw cost about 1 ms on a 2-core CPU, once per draft token per row per step.

    Args:
      key: PRNG key; tokens: int32 ``(S,)``; marked: bool ``(S,)``.

    Returns:
      ``(token int32 (), any bool ())``; ``token`` is meaningless when nothing is marked.
    """
    j = jax.random.categorical(key, jnp.where(marked, 0.0, -jnp.inf))
    return tokens[j].astype(jnp.int32), jnp.any(marked)


def sample_context_bigram(
    key: jax.Array, tokens: jax.Array, known: jax.Array, cond: jax.Array
) -> jax.Array:
    """One draw from :func:`context_bigram`'s ``c(. | cond)`` (ASSD Eq. 23; Algorithm 2 line 8)
    without the dense distribution: a uniformly chosen known successor of ``cond``
    (:func:`bigram_successors`, :func:`sample_marked`), or ``cond`` itself when it has none (the
    point mass). Token ``a`` comes out with probability ``c(a | cond)``, so the draft and its
    density ``q = c`` agree.

    Args:
      key: PRNG key; tokens: int32 ``(S,)``; known: bool ``(S,)``; cond: int32 ``()``.

    Returns:
      int32 ``()``.
    """
    tok, seen = sample_marked(key, tokens, bigram_successors(tokens, known, cond))
    return jnp.where(seen, tok, cond).astype(jnp.int32)


def bigram_pair_counts(tokens: jax.Array, known: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For every adjacent known pair ``(x_j, x_{j+1})`` of one row, how often that bigram occurs
    among the row's known pairs: the counts of :func:`context_bigram`, indexed by position
    instead of by token, so greedy drafting needs no ``V``-sized array.

    Args:
      tokens: int32 ``(S,)``; known: bool ``(S,)`` (as in :func:`context_bigram`).

    Returns:
      ``(valid bool (S-1,), counts int32 (S-1,))``: ``valid[j]`` = positions ``j`` and ``j+1``
      are known; ``counts[j]`` = number of valid ``i`` with the same bigram (0 where invalid).
    """
    valid = known[:-1] & known[1:]
    same = (
        (tokens[:-1, None] == tokens[None, :-1])
        & (tokens[1:, None] == tokens[None, 1:])
        & valid[:, None]
        & valid[None, :]
    )
    return valid, jnp.sum(same, axis=0, dtype=jnp.int32)


def context_bigram_argmax(
    tokens: jax.Array, valid: jax.Array, counts: jax.Array, cond: jax.Array
) -> jax.Array:
    """``argmax_a c(a | cond)`` of :func:`context_bigram` (ASSD Eq. 23) without its dense
    ``(V,)`` distribution: the most frequent known successor of ``cond``, the smallest token id
    among equally frequent ones (``jnp.argmax``'s first maximum), and ``cond`` itself when it
    has no known successor (the point mass). ``valid`` / ``counts`` come from
    :func:`bigram_pair_counts`; ``tokens`` int32 ``(S,)``, ``cond`` int32 ``()``. Returns int32
    ``()``. Greedy n-gram drafting uses it: the dense form costs about 11% of a SmolLM2-135M
    decode step on a 2-core CPU (``V = 49152``, ``k`` times per step)."""
    succ = tokens[1:]
    cand = valid & (tokens[:-1] == cond)
    best = jnp.max(jnp.where(cand, counts, -1))
    first = jnp.min(jnp.where(cand & (counts == best), succ, jnp.iinfo(jnp.int32).max))
    return jnp.where(jnp.any(cand), first, cond).astype(jnp.int32)


def context_unigram(tokens: jax.Array, known: jax.Array, vocab_size: int) -> jax.Array:
    """Unigram frequencies of the known tokens of one row, float32 ``(V,)`` (uniform when
    nothing is known): ASSD's draft distribution for a position with no left neighbour."""
    uni = jnp.zeros((vocab_size,), jnp.float32).at[tokens].add(known.astype(jnp.float32))
    tu = jnp.sum(uni)
    return jnp.where(tu > 0, uni / jnp.maximum(tu, 1.0), jnp.full((vocab_size,), 1.0 / vocab_size))


@dataclasses.dataclass(frozen=True)
class NgramDrafter(Drafter):
    """Context n-gram drafter (module docstring): a :class:`Drafter` with no parameters and no
    state (hashable, a static jit argument).

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
                f"max_ngram={self.max_ngram}"
            )

    name = "ngram"

    # -- the Drafter protocol: no parameters, no state ----------------------------------
    def init_state(self, params, ctx: DraftContext):
        """The n-gram drafter carries no state (returns ``()``)."""
        return ()

    def update(self, params, state, ctx: DraftContext, n_accepted: jax.Array):
        return state

    def propose(self, params, state, ctx: DraftContext, key: jax.Array, sample: bool):
        """Draft ``k`` tokens per row.

        Args:
          params: unused (model-free); state: ``()``.
          ctx: the decoder's buffer; row ``b`` holds context in ``[pad[b], length[b])``.
          key: PRNG key (used only by the sampled bigram fallback).
          sample: static; True under temperature > 0 (bigram fallback samples from Eq. 23).

        Returns:
          ``(Draft, state)``: ``q`` is None when ``sample`` is False (greedy verification needs
          no densities); ``has_draft`` is False where the row has neither a suffix match nor
          (with ``bigram_fallback``) an observed bigram successor of its last token; ``length``
          is ``k`` and ``nfe`` 0 on every row.
        """
        B = ctx.buffer.shape[0]
        keys = jax.random.split(key, B)
        draft, q, has = jax.vmap(lambda kk, b, l, p: self._one(kk, b, l, p, sample))(
            keys, ctx.buffer, ctx.length, ctx.pad
        )
        return Draft(
            tokens=draft,
            q=q if sample else None,
            has_draft=has,
            length=jnp.full((B,), self.draft_length, jnp.int32),
            nfe=jnp.zeros((B,), jnp.int32),
        ), state

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
                eq = eq & (bpad[t : t + S] == suf[t])
            # earlier occurrence fully inside the context, followed by >= 1 context token
            ok = eq & (idx >= pad) & (idx + n <= L - 1) & (L - n >= pad)
            j = jnp.max(jnp.where(ok, idx, -1))
            hit = (j >= 0) & ~found
            src = jnp.where(hit, j + n, src).astype(jnp.int32)
            found = found | hit
        return found, src

    def _one(self, key, buf, L, pad, sample: bool):
        k, V = self.draft_length, self.vocab_size
        found, src = self._suffix_match(buf, L, pad)
        keys = jax.random.split(key, k)
        drafts, qs = [], []
        cond = buf[L - 1]
        has_draft = found
        idx = jnp.arange(buf.shape[0])
        known = (idx >= pad) & (idx < L)
        if not sample:
            valid, counts = bigram_pair_counts(buf, known)
        for t in range(k):
            # suffix-match copy (periodic continuation into the drafts themselves)
            pos = src + t
            prev = jnp.stack(drafts) if drafts else jnp.zeros((1,), jnp.int32)
            copy_tok = jnp.where(
                pos < L,
                buf[jnp.minimum(pos, buf.shape[0] - 1)],
                prev[jnp.clip(pos - L, 0, max(t - 1, 0))],
            )
            # bigram fallback (Eq. 23); greedy needs only its argmax, without the (V,) array
            if sample:
                c, tot = context_bigram(buf, known, cond, V)
                big_tok = sample_context_bigram(keys[t], buf, known, cond)
            else:
                big_tok = context_bigram_argmax(buf, valid, counts, cond)
            if t == 0 and self.bigram_fallback:
                if not sample:  # the last token has a known successor
                    tot = jnp.sum(valid & (buf[:-1] == cond))
                has_draft = has_draft | (tot > 0)
            tok = jnp.where(found, copy_tok, big_tok).astype(jnp.int32)
            if sample:
                qs.append(jnp.where(found, jax.nn.one_hot(tok, V), c))
            drafts.append(tok)
            cond = tok
        q = jnp.stack(qs) if sample else jnp.zeros((k, 1), jnp.float32)
        return jnp.stack(drafts), q, has_draft


@dataclasses.dataclass(frozen=True)
class WrappedDrafter(Drafter):
    """Base of the drafters that wrap another (:class:`CostGate`, :class:`LookupFirst`): the
    name, draft length, vocabulary, target feature layers and optional capabilities are the
    wrapped ``drafter``'s (a subclass that reads target features hands them on in its own
    ``absorb_features``, which knows its state).

    Attributes:
      drafter: the wrapped drafter.
    """

    drafter: Any

    @property
    def name(self) -> str:
        return self.drafter.name

    @property
    def draft_length(self) -> int:
        return self.drafter.draft_length

    @property
    def vocab_size(self) -> int:
        return self.drafter.vocab_size

    @property
    def resample(self) -> str:
        return self.drafter.resample

    @property
    def context_length(self) -> Optional[int]:
        return self.drafter.context_length

    @property
    def position_overshoot(self) -> int:
        return self.drafter.position_overshoot

    @property
    def one_token_steps(self) -> bool:
        return self.drafter.one_token_steps

    @property
    def eos_id(self) -> Optional[int]:
        return self.drafter.eos_id

    @property
    def feature_layers(self) -> tuple:
        return tuple(self.drafter.feature_layers)


@flax.struct.dataclass
class GateState:
    """:class:`CostGate`'s state, per row (float32 / int32 / bool ``(B,)``).

    Attributes:
      inner: the wrapped drafter's state.
      alpha: running (exponentially weighted) rate at which the first draft token is right.
      beta: running mean of accepted drafts over verifications that accepted at least one.
      first: the last proposal's first draft token; had: the row had a draft then.
      start: ``ctx.length`` when it was proposed (the slot of the next emitted token).
      verified: bool ``()``: the loop verified that proposal (some active row passed the gate).
    """

    inner: Any
    alpha: jax.Array
    beta: jax.Array
    first: jax.Array
    had: jax.Array
    start: jax.Array
    verified: jax.Array


@dataclasses.dataclass(frozen=True)
class CostGate(WrappedDrafter):
    """A :class:`Drafter` that passes on ``drafter``'s drafts only while they pay for their
    verification (module docstring, "Cost gate").

    A verification pass of ``k + 1`` rows costs ``verify_cost`` one-token steps and yields
    ``1 + E[accepted]`` tokens; a one-token step yields one. So a row asks for verification
    (``has_draft``) when ``alpha * beta > verify_cost - 1``, with ``E[accepted]`` estimated as
    ``alpha * beta``: ``alpha`` the rate at which the first draft token is right, ``beta`` the
    mean accepted length when it is. Both are exponentially weighted (``decay`` per
    observation) and start optimistic (1 and ``k``), so decoding starts by drafting.
    ``alpha`` is observed on every step where the row had a draft: after a verification as
    ``n_accepted >= 1``; after a one-token step as "the emitted token equals the first draft
    token", which for a point-mass draft is the same event, so a row whose drafts become good
    again is switched back on. ``beta`` is observed after verifications only.

    The loop verifies when *any* active row asks (:func:`jaxspec.causal.decode.step`); the
    gate mirrors that rule to know which observation it got. Decisions use the past only, so
    greedy output equals AR's and sampled output keeps the target distribution (tests:
    ``tests/core/test_cost_gate.py``). The wrapped drafter's own cost is paid every step: the
    gate saves target rows, so it suits cheap drafters (:class:`NgramDrafter`).

    Attributes:
      drafter: the wrapped drafter (no draft queries).
      verify_cost: a ``k + 1``-row target pass in one-token steps (>= 1; measured by
        :func:`models.llama.layout.plan`). 1 never withholds a draft.
      decay: weight of the old estimate per observation, in ``[0, 1)``.

    Raises:
      ValueError: ``verify_cost < 1``, ``decay`` outside ``[0, 1)``, a drafter with draft
        queries (SPACE drafts inside the verification pass itself), or one that reads the
        target's hidden states (``feature_layers``: the gate would not hand them on).
    """

    verify_cost: float
    decay: float = 0.75

    def __post_init__(self):
        if not self.verify_cost >= 1.0:
            raise ValueError(f"verify_cost must be >= 1 (one-token steps), got {self.verify_cost}")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")
        if self.drafter.query_slots > 0:
            raise ValueError(
                f"{self.drafter.name} drafts inside the verification pass (draft "
                "queries): a cost gate cannot skip it"
            )
        if self.drafter.feature_layers:
            raise ValueError(
                f"the cost gate cannot wrap {self.drafter.name}, which reads the target's "
                "hidden states (DFlash): decode with gate='off'"
            )

    def init_state(self, params, ctx: DraftContext) -> GateState:
        B = ctx.length.shape[0]
        return GateState(
            inner=self.drafter.init_state(params, ctx),
            alpha=jnp.ones((B,), jnp.float32),
            beta=jnp.full((B,), float(self.draft_length), jnp.float32),
            first=jnp.zeros((B,), jnp.int32),
            had=jnp.zeros((B,), bool),
            start=ctx.length,
            verified=jnp.array(False),
        )

    def propose(self, params, state: GateState, ctx: DraftContext, key: jax.Array, sample: bool):
        """The wrapped drafter's proposal with ``has_draft`` cleared on rows whose expected
        accepted length does not pay for ``verify_cost``."""
        draft, inner = self.drafter.propose(params, state.inner, ctx, key, sample)
        worth = state.alpha * state.beta > self.verify_cost - 1.0
        has = draft.has_draft & worth
        had = draft.has_draft & (draft.length > 0)
        return draft.replace(has_draft=has), state.replace(
            inner=inner,
            first=draft.tokens[:, 0],
            had=had,
            start=ctx.length,
            verified=jnp.any(has & ctx.active),
        )

    def update(self, params, state: GateState, ctx: DraftContext, n_accepted: jax.Array):
        """Tell the wrapped drafter, then update ``alpha`` / ``beta`` on rows that had a draft."""
        inner = self.drafter.update(params, state.inner, ctx, n_accepted)
        seen = state.had & ctx.active
        emitted = jnp.take_along_axis(ctx.buffer, state.start[:, None], axis=1)[:, 0]
        right = jnp.where(state.verified, n_accepted >= 1, emitted == state.first)
        d = self.decay
        alpha = jnp.where(seen, d * state.alpha + (1 - d) * right, state.alpha)
        beta = jnp.where(
            seen & state.verified & (n_accepted >= 1),
            d * state.beta + (1 - d) * n_accepted,
            state.beta,
        )
        return state.replace(inner=inner, alpha=alpha, beta=beta)


@dataclasses.dataclass(frozen=True)
class LookupFirst(WrappedDrafter):
    """A model drafter behind a context n-gram lookup (module docstring, "Lookup first").

    Each step, rows whose last ``n`` tokens (``n = max_ngram .. min_ngram``) occurred earlier
    in their context draft the ``k`` tokens that followed (:class:`NgramDrafter`'s suffix
    match, point-mass ``q``); the other rows draft with ``drafter`` (its tokens, ``q``, length
    and ``has_draft``). ``drafter.propose`` runs under ``lax.cond`` only when some active row
    has no match, so a step where every row copies pays for no model forward (its NFE is 0).
    Which source drafts a row is a function of the row's context, and each draft comes with the
    distribution it was drawn from: greedy output equals AR's and sampled output has AR's
    distribution (Leviathan et al., arXiv:2211.17192, Theorem 3.5, per step).

    Attributes:
      drafter: the model drafter; its proposals must be skippable
        (``proposal_skippable``: DFlash) and it drafts inside no target pass.
      max_ngram, min_ngram: the suffix lengths tried, ``1 <= min_ngram <= max_ngram``.

    The draft length, vocabulary, target feature layers, ``absorb_features`` and the other
    capabilities are the wrapped drafter's.

    Raises:
      ValueError: a drafter whose proposals cannot be skipped (a draft model whose cache
        advances in ``propose``) or that drafts inside the verification pass (draft queries),
        or a bad n-gram range.
    """

    max_ngram: int = 3
    min_ngram: int = 2

    def __post_init__(self):
        if not self.drafter.proposal_skippable:
            raise ValueError(
                f"n-gram lookup first cannot wrap {self.drafter.name}: its proposals change "
                "its state, so they cannot be skipped"
            )
        if self.drafter.query_slots > 0:
            raise ValueError(
                f"{self.drafter.name} drafts inside the verification pass (draft queries): "
                "n-gram lookup first cannot wrap it"
            )
        self.lookup  # checks the n-gram range

    @property
    def lookup(self) -> NgramDrafter:
        """The suffix-match drafter (no bigram fallback: ``has_draft`` marks a match)."""
        return NgramDrafter(
            self.drafter.draft_length,
            self.drafter.vocab_size,
            max_ngram=self.max_ngram,
            min_ngram=self.min_ngram,
            bigram_fallback=False,
        )

    @property
    def name(self) -> str:
        return f"{self.drafter.name}+ngram"

    def absorb_features(self, state, first_slot: jax.Array, hidden: jax.Array):
        return self.drafter.absorb_features(state, first_slot, hidden)

    def init_state(self, params, ctx: DraftContext):
        return self.drafter.init_state(params, ctx)

    def update(self, params, state, ctx: DraftContext, n_accepted: jax.Array):
        return self.drafter.update(params, state, ctx, n_accepted)

    def propose(self, params, state, ctx: DraftContext, key: jax.Array, sample: bool):
        """The lookup's copy on rows with a suffix match, the wrapped drafter's draft on the
        others (its forward skipped when every active row matched).

        Returns:
          ``(Draft, state)``: tokens int32 ``(B, k)``; ``q`` float32 ``(B, k, V)`` (one-hot on
          copying rows; None when greedy); ``has_draft``, ``length`` per source; ``nfe`` the
          wrapped drafter's on steps that ran it (every row: the forward is batched), else 0.
        """
        copy, _ = self.lookup.propose(None, (), ctx, key, False)  # copies ignore ``sample``
        hit = copy.has_draft
        B, k = ctx.buffer.shape[0], self.draft_length

        def model(st):
            return self.drafter.propose(params, st, ctx, key, sample)

        def skip(st):  # the model draft's structure, never used on an active row
            z = jnp.zeros((B,), jnp.int32)
            q = jnp.zeros((B, k, self.vocab_size), jnp.float32) if sample else None
            tokens = jnp.zeros((B, k), jnp.int32)
            return Draft(tokens=tokens, q=q, has_draft=z > 0, length=z, nfe=z), st

        own, state = jax.lax.cond(jnp.all(hit | ~ctx.active), skip, model, state)
        pick = hit[:, None]
        q = None
        if sample:
            q = jnp.where(pick[..., None], jax.nn.one_hot(copy.tokens, self.vocab_size), own.q)
        return Draft(
            tokens=jnp.where(pick, copy.tokens, own.tokens),
            q=q,
            has_draft=hit | own.has_draft,
            length=jnp.where(hit, k, own.length),
            nfe=own.nfe,
        ), state
