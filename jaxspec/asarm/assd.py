"""ASSD: any-subset speculative decoding for any-subset autoregressive models (XLNet AS-ARM).

Source: Guo & Ermon, "Reviving Any-Subset Autoregressive Models with Principled Parallel
Sampling and Speculative Decoding" (``../shared/papers/assd-any-subset-speculative-decoding.txt``):
Eq. 4 (decoding order), Fig. 1 / Eq. 6 (attention masks), Algorithm 1 (ASSD), Lemma 1,
Theorems 1-2, Appendix E.5 (Algorithm 2, Eq. 23: context n-gram drafter) and Appendix F.5
(epsilon tolerance).

**Task.** A sequence ``x`` of ``N`` tokens in which the positions marked ``masked`` are to be
generated (infilling). The visible positions are the prompt ``x_sigma(<m)``.

**Decoding order** (Eq. 4, :func:`decoding_order`): ``sigma`` lists the prompt positions first
(ascending), then the masked positions left to right. Rank ``r`` of a masked position is its
index among the masked positions (``sigma(m + r)``); in the code ``n`` counts the masked
positions decoded so far (the paper's ``n - m``).

**Target.** ``p(x_sigma(i) | x_sigma(<i))``, read from the XLNet query stream at position
``sigma(i)`` with the density mask of Fig. 1b (:func:`models.xlnet.modeling.density_masks`): the prompt
attends to itself, every masked position to the prompt and to the masked positions before it.
Temperature / top-k / top-p are applied to these logits (:mod:`jaxspec.core.sampling`); the processed
distribution is the one every method samples from.

**Methods** (one jitted ``lax.while_loop``, static shapes, batch >= 1):

* ``"sequential"`` (the reference, paper Sec. 3 "Sequential Sampling"): one forward per masked
  token, ``x_sigma(n) ~ p(. | x_sigma(<n))``; exactly ``N - m`` NFEs.
* ``"assd"`` (Algorithm 1), one iteration with ``t = min(n + k, N - m)``:

  - lines 4-8: one *draft pass* (Fig. 1a, parallel sampling): every query slot
    ``sigma(i), i in [n, t)`` attends to the prompt and the decoded tokens only, so
    ``x~_sigma(i) ~ p(. | x_sigma(<n))`` independently and ``p_sigma(i)`` is its density;
  - lines 9-12: if only one token is speculated (``t = n + 1``: the last token, or ``k = 1``)
    it is accepted without verification (Lemma 1); the paper states this for the last token,
    we apply it whenever a single token is speculated so that ``k = 1`` is sequential decoding
    and Theorem 1 holds for every ``k >= 1``;
  - lines 13-15: one *density pass* (Fig. 1b) over the drafts gives
    ``q_sigma(i) = p(x~_sigma(i) | x_sigma(<n), x~_sigma(n:i))`` for all ``i`` at once;
  - lines 16-25: for ``i = n, n+1, ...``: accept while ``r < min(1, q / p)`` (``r ~ U[0, 1)``);
    at the first rejection resample ``x_sigma(i)`` from ``(q(.) - p(.))_+`` (line 22; the
    normalised positive part) and stop; line 26: ``n <- i + 1``. No bonus token is drawn when
    every draft is accepted (Appendix A, Theorem 2 proof, point 3).

  By Lemma 1 the density row of ``sigma(n)`` equals the draft distribution (both condition on
  ``x_sigma(<n)`` only), so the first draft is always accepted. The verifier uses the draft
  pass's row for ``i = n`` (the same distribution; this keeps float rounding of two separate
  passes from ever rejecting it) and records the largest observed gap between the two rows
  in ``stats.extra["lemma1_max_gap"]``. Lossless (Theorem 2): the output distribution equals
  sequential decoding's; greedy output is identical to sequential greedy.
* ``"assd-ngram"`` (Appendix E.5, Algorithm 2): lines 4-8 of Algorithm 1 are replaced by the
  context bigram model ``c(a | b)`` of Eq. 23 over the tokens known so far (prompt and decoded
  tokens; pairs whose two tokens are both known): draft ``i`` conditions on
  ``x_cond = x_sigma(i)-1`` when that position is known and on the draft there otherwise
  (Alg. 2 lines 2-6; Theorem 3: it is then the previous draft). Drafts are sampled from ``c``
  (greedy: its argmax) and verified as above; there is no Lemma 1, so every iteration is
  verified (one AS-ARM forward, 1 to ``k`` tokens). Cases Eq. 23 leaves undefined, as the
  official code (gabeguo/any-order-speculative-decoding, ``context_ngram.py`` /
  ``speculative_decoding.py``) handles them: a condition never seen followed by a known token
  drafts from the **unigram** frequencies of the known tokens (uniform if none); an iteration
  whose first slot is position 0 (no left neighbour, excluded by Theorem 3) takes its drafts
  from an AS-ARM draft pass as ``"assd"`` does (Lemma 1 applies to it; the pass counts as a
  target NFE). Lossless.
* ``"assd-fused"`` (this library's extension; README "Fused ASSD"): one AS-ARM call per
  iteration verifies the current drafts **and** drafts the next ones, see "Fused ASSD" below.
* ``"assd-fused-ngram"``: Algorithm 2's bigram drafts verified by one call whose density
  queries also cover the position after the drafts (a bonus token after ``k`` acceptances).

**Fused ASSD.** Let ``n`` masked tokens be decoded and ``d_1..d_L`` (``L <= k``) be drafts for
ranks ``n..n+L-1`` with draft distributions ``q_1..q_L``, carried from the previous call. One
XLNet call over the buffer ``x_sigma(<n), d_1..d_L`` (content stream under the density mask of
Fig. 1b, i.e. ``density_order(rank, n + L)``) carries ``(k+1)^2`` query tokens:

- ``k + 1`` density queries: query ``i`` sits at rank ``n + i`` and attends to ranks
  ``< n + i`` (the prompt and ``d_1..d_i``), giving the target ``p_i = p(x_sigma(n+i) |
  x_sigma(<n), d_1..d_i)`` (Alg. 1 lines 13-15, plus the row after the last draft);
- ``k + 1`` draft groups of ``k`` queries: group ``j`` (``j = 0..k``) sits at ranks
  ``n+j+1 .. n+j+k`` and attends to ranks ``< n + j`` only (the prompt, the decoded tokens and
  ``d_1..d_j``; *not* rank ``n + j``, whose token is decided by this call's verification), so
  each of its queries is ``p(x_sigma(r) | x_sigma(<n), d_1..d_j)``: the parallel-sampling pass of
  Fig. 1a that a separate draft pass would run after accepting ``d_1..d_j``, minus that one token.

The query stream never feeds the content stream, and under the density mask the content row of
rank ``r`` attends only to ranks ``<= r``; so a query restricted to ranks ``< c`` computes
exactly what a call holding only those tokens would compute (``test_fused_groups_equal_
separate_passes`` checks this numerically). The chain verifier (:mod:`jaxspec.core.verify`,
``draft_len = L``) accepts ``j`` drafts; on the first rejection it samples rank ``n + j`` from
the residual ``norm(max(p_j - q_{j+1}, 0))``, after ``L`` acceptances it samples the bonus from
``p_L``. The call emits ``j + 1`` tokens, and the next iteration's drafts (ranks ``n+j+1..``,
``L' = min(k, N - m - (n+j+1) - 1)`` of them, so a bonus row always exists) are group ``j``'s
samples (greedy: argmax) with ``q`` = group ``j``'s processed distribution. The first call has
``L = 0``: it samples rank 0 from ``p_0`` and drafts with group 0.

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

**Epsilon tolerance** (Appendix F.5, ``epsilon > 0``, sampling only): acceptance becomes
``r < min(1, q / p + epsilon)``. This is **not lossless** (the output distribution drifts from
sequential decoding's; ``epsilon >= 1`` accepts every draft = parallel sampling) and is marked
``stats.extra["lossless"] = False``.

**NFE** (``stats.target_nfe``) counts every AS-ARM forward: draft passes plus density passes,
the quantity Theorem 1 bounds by ``N - m``. ``stats.draft_nfe`` counts the n-gram drafter's
calls for ``assd-ngram`` (Table 1's "auxiliary draft model calls") and is 0 otherwise.

**Content KV cache** (Appendix F.4; ``cache="content"``). Under the density mask the content
row of a decoded token attends only to the prompt and to lower ranks, all decoded for good, so
its keys/values never change once computed. With the cache the prompt is encoded once
(:func:`prefill`) and every call encodes only the rows it adds: a draft pass the token decoded
last (rank ``n - 1``: a resampled token no pass has encoded yet); a density pass or a fused call
ranks ``n - 1 .. n + k - 1`` (that token and the drafts). Accepted drafts keep the keys/values
their density pass wrote; rejected ones are overwritten or hidden by the masks. Without the
cache (default) every pass is a full content-stream forward over the ``S``-slot buffer plus the
query slots.

**Cost and shapes.** Without the cache every pass is a full content-stream forward over the
``S``-slot buffer plus ``k`` query slots (1 for sequential). Sequences are right-padded to ``S`` = the longest one rounded up to ``bucket``;
pad slots are neither prompt nor masked and nobody attends to them (relative attention makes
the padding invisible). Rows of a batch run in lockstep; a finished row idles. Randomness: one key
``PRNGKey(seed)`` split once per iteration; every row and slot draws its own numbers from it.

**Code layout** (top to bottom): inputs (:func:`prepare_batch`, ranks), the two AS-ARM passes
(:func:`conditionals` under :func:`draft_order` / :func:`density_order`) and the Eq. 23 draft
distribution; the loop's statics (:class:`LoopConfig`), constant inputs (:class:`Inputs`) and
carry (:class:`State`); the phases of one iteration, each a module-level function: the query
window (line 3), the draft phase (:func:`draft_pass`, lines 4-12, or :func:`bigram_drafts`,
Algorithm 2), :func:`density_pass` (lines 13-15), :func:`verify` (lines 16-25, through
:mod:`jaxspec.core.verify`) and :func:`commit` (line 26 and the counters); :func:`step`; one
``lax.while_loop`` (:func:`decode_loop`); the host wrapper :func:`assd_generate`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.batching import bucket_length, place_batch
from jaxspec.core.drafters import context_bigram, context_unigram
from jaxspec.core.runtime import run_compiled
from jaxspec.core.sampling import SamplingConfig, argmax, sample_from_probs, target_probs
from jaxspec.core.stats import DecodeStats
from jaxspec.core.verify import verify_greedy, verify_sample
from models.xlnet.modeling import XLNetCache, XLNetLM, density_masks, init_cache

METHODS = ("sequential", "assd", "assd-ngram", "assd-fused", "assd-fused-ngram")
CACHES = ("none", "content")
_BIG = 1 << 30   # rank of positions nobody may attend (undecoded masked slots, padding)


# --------------------------------------------------------------------------- order and inputs
def decoding_order(masked: Sequence[bool]) -> tuple[np.ndarray, int]:
    """Eq. 4 decoding order of one sequence.

    Args:
      masked: bool ``(N,)``; True at the positions to generate.

    Returns:
      ``(sigma int32 (N,), m)``: ``sigma`` lists the ``m`` prompt positions in ascending order,
      then the masked positions in ascending order (left to right, Eq. 4).
    """
    masked = np.asarray(masked, bool)
    pos = np.arange(masked.shape[0], dtype=np.int32)
    return np.concatenate([pos[~masked], pos[masked]]).astype(np.int32), int((~masked).sum())


def prepare_batch(tokens, masked, vocab_size: int, bucket: int = 16,
                  max_len: Optional[int] = None):
    """Validate and pad a batch of infilling tasks.

    Args:
      tokens: sequence of ``B`` int sequences (lengths may differ); the ids at masked positions
        are ignored (any value in range, e.g. 0).
      masked: sequence of ``B`` bool sequences of the same lengths (True = generate).
      vocab_size: the model's vocabulary size ``V``.
      bucket: the buffer length ``S`` is the longest row rounded up to a multiple of ``bucket``.
      max_len: optional context limit; a row longer than it is an error.

    Returns:
      ``(tokens int32 (B, S), visible bool (B, S), masked bool (B, S), lengths int (B,))``.

    Raises:
      ValueError (one line): empty batch, shape mismatch between a row's tokens and mask, a row
      without masked positions, a row past ``max_len``, or a visible id outside ``[0, V)``.
    """
    if isinstance(tokens, np.ndarray) and tokens.ndim == 1:
        raise ValueError(f"tokens must be a batch (B, N), got shape {tokens.shape}")
    if len(tokens) == 0:
        raise ValueError("empty batch: need at least one sequence")
    if len(masked) != len(tokens):
        raise ValueError(f"{len(tokens)} token rows but {len(masked)} mask rows")
    rows_t, rows_m = [], []
    for b, (t, m) in enumerate(zip(tokens, masked)):
        t = np.asarray(t, np.int64).reshape(-1) if np.ndim(t) <= 1 else None
        m = np.asarray(m, bool).reshape(-1) if np.ndim(m) <= 1 else None
        if t is None or m is None:
            raise ValueError(f"row {b}: tokens and mask must be 1-D sequences")
        if t.shape != m.shape:
            raise ValueError(f"row {b}: {t.shape[0]} tokens but a mask of {m.shape[0]} entries")
        if t.shape[0] == 0:
            raise ValueError(f"row {b}: empty sequence")
        if not m.any():
            raise ValueError(f"row {b}: no masked positions to generate")
        if max_len is not None and t.shape[0] > max_len:
            last = int(np.flatnonzero(m)[-1])
            raise ValueError(f"row {b}: sequence of {t.shape[0]} tokens (last masked position "
                             f"{last}) runs past the context of {max_len}")
        vis = t[~m]
        if vis.size and (vis.min() < 0 or vis.max() >= vocab_size):
            raise ValueError(f"row {b}: token id {int(vis.min() if vis.min() < 0 else vis.max())} "
                             f"outside the model vocabulary [0, {vocab_size})")
        rows_t.append(np.where(m, 0, t))
        rows_m.append(m)
    if int(bucket) < 1:
        raise ValueError(f"bucket must be >= 1, got {bucket}")
    lengths = np.array([len(t) for t in rows_t])
    S = bucket_length(int(lengths.max()), int(bucket))
    B = len(rows_t)
    tok = np.zeros((B, S), np.int32)
    msk = np.zeros((B, S), bool)
    vis = np.zeros((B, S), bool)
    for b, (t, m) in enumerate(zip(rows_t, rows_m)):
        tok[b, :len(t)] = t
        msk[b, :len(t)] = m
        vis[b, :len(t)] = ~m
    return tok, vis, msk, lengths


def _ranks(masked: np.ndarray):
    """``rank int32 (B, S)`` of each masked slot among the masked slots (``_BIG`` elsewhere),
    ``pos_of_rank int32 (B, S)`` (``sigma(m + r)``; padded with the last masked slot) and
    ``G int32 (B,)`` masked counts."""
    B, S = masked.shape
    rank = np.where(masked, np.cumsum(masked, axis=1) - 1, _BIG).astype(np.int32)
    pos = np.zeros((B, S), np.int32)
    G = masked.sum(1).astype(np.int32)
    for b in range(B):
        p = np.flatnonzero(masked[b])
        pos[b, :len(p)] = p
        pos[b, len(p):] = p[-1]
    return rank, pos, G


# --------------------------------------------------------------------------- passes
def conditionals(model: XLNetLM, params, tokens: jax.Array, visible: jax.Array,
                 order: jax.Array, query_pos: jax.Array) -> jax.Array:
    """One AS-ARM forward: query-stream logits at ``query_pos`` under the mask of ``order``.

    Args:
      tokens: int32 ``(B, S)`` (content of every slot; unattended slots are irrelevant).
      visible: bool ``(B, S)`` prompt slots (attend to each other bidirectionally).
      order: int32 ``(B, S)``: rank of each non-prompt slot; slot ``j`` is seen by a masked slot
        ``i`` iff ``order[j] < order[i]`` (``_BIG`` = seen by nobody). With the true ranks of
        ``x_sigma(<t)`` and ``_BIG`` elsewhere this is the density mask of Fig. 1b; with ranks
        ``< n`` kept and ``_BIG`` elsewhere every undecoded slot conditions on ``x_sigma(<n)``
        only (the parallel-sampling mask of Fig. 1a, extended to the decoded tokens).
      query_pos: int32 ``(B, P)`` slots to read.

    Returns:
      float32 ``(B, P, V)`` logits of ``p(x_{query_pos} | attended slots)``.
    """
    cond = jnp.take_along_axis(order, query_pos, axis=1)
    return conditionals_at(model, params, tokens, visible, order, query_pos, cond)


def conditionals_at(model: XLNetLM, params, tokens: jax.Array, visible: jax.Array,
                    order: jax.Array, query_pos: jax.Array, cond: jax.Array) -> jax.Array:
    """One AS-ARM forward whose query ``p`` reads slot ``query_pos[:, p]`` while attending to the
    prompt and the slots with ``order < cond[:, p]`` (content stream under the density mask of
    ``order``). :func:`conditionals` is the case ``cond = order[query_pos]``; fused ASSD gives
    queries at the same slot different conditioning sets (module docstring, "Fused ASSD").

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


def draft_order(rank: jax.Array, n: jax.Array) -> jax.Array:
    """Order for a draft pass after ``n (B,)`` decoded masked tokens (Alg. 1 lines 4-8)."""
    return jnp.where(rank < n[:, None], rank, _BIG)


def density_order(rank: jax.Array, t: jax.Array) -> jax.Array:
    """Order for the density pass over ``x_sigma(<t)`` (Alg. 1 lines 13-15; ``t (B,)`` counts
    the masked tokens decoded or drafted)."""
    return jnp.where(rank < t[:, None], rank, _BIG)


def bigram_draft_dist(tokens: jax.Array, known: jax.Array, cond: jax.Array,
                      has_cond: jax.Array, vocab_size: int) -> jax.Array:
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


# --------------------------------------------------------------------------- loop statics and state
@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Static settings of one compiled decode loop (hashable; a new value compiles anew).

    Attributes:
      model: the :class:`models.xlnet.modeling.XLNetLM` (its config fixes ``V``).
      method: one of :data:`METHODS`.
      slots: draft slots per iteration (``>= k``; 1 for ``"sequential"``).
      sampling: temperature / top-k / top-p of the target distribution.
      suppress: token ids whose logits are set to -inf in every pass (target and drafts alike:
        the reference is sequential decoding with the same suppression).
      cache: ``"none"`` (every call encodes the whole buffer) or ``"content"`` (Appendix F.4:
        the content-stream keys/values of the prompt and the decoded tokens are kept; a call
        encodes only the rows it adds, see "Content KV cache" in the module docstring).
    """

    model: XLNetLM
    method: str
    slots: int
    sampling: SamplingConfig
    suppress: tuple = ()
    cache: str = "none"

    @property
    def fused(self) -> bool:
        """One call per iteration verifies and drafts (module docstring, "Fused ASSD")."""
        return self.method.startswith("assd-fused")

    @property
    def draft_slots(self) -> int:
        """``K``: drafts per iteration compiled into the loop (one for sequential decoding)."""
        return 1 if self.method == "sequential" else self.slots

    @property
    def query_slots(self) -> int:
        """``P``: query tokens of one call: ``K`` (draft and density passes of Algorithm 1),
        ``(K + 1)^2`` for fused ASSD (``K + 1`` density queries and ``K + 1`` groups of ``K``),
        ``K + 1`` for fused ASSD-ngram."""
        K = self.draft_slots
        if not self.fused:
            return K
        return (K + 1) ** 2 if self.self_draft else K + 1

    @property
    def self_draft(self) -> bool:
        """Whether drafts come from the AS-ARM itself (Alg. 1 draft pass, fused groups, the
        sequential step) rather than the context bigram (Alg. 2)."""
        return not self.method.endswith("ngram")


@flax.struct.dataclass
class Inputs:
    """Traced inputs of one compiled loop, constant across its iterations (:func:`prepare_batch`,
    :func:`_ranks`)."""

    visible: jax.Array      # bool (B, S): prompt slots x_sigma(<m)
    masked: jax.Array       # bool (B, S): slots to generate
    rank: jax.Array         # int32 (B, S): rank of a masked slot among the masked ones; _BIG elsewhere
    pos_of_rank: jax.Array  # int32 (B, S): sigma(m + r), the slot of rank r (padded with the last)
    num_masked: jax.Array   # int32 (B,): G, masked slots per row (N - m)
    k: jax.Array            # int32 (): tokens speculated per iteration, 1 <= k <= slots
    epsilon: jax.Array      # float32 (): Appendix F.5 acceptance tolerance (0: lossless)


@flax.struct.dataclass
class State:
    """Loop carry: the token buffer, Algorithm 1's ``n`` and the statistics counters."""

    tokens: jax.Array           # int32 (B, S): prompt, decoded tokens; 0 at undecoded slots
    decoded: jax.Array          # int32 (B,): n, masked tokens decoded so far
    key: jax.Array              # PRNG key, split once per iteration
    target_nfe: jax.Array       # int32 (B,): AS-ARM forwards while the row was active
    draft_nfe: jax.Array        # int32 (B,): context-bigram drafter calls (assd-ngram)
    steps: jax.Array            # int32 (B,): iterations while active
    accept_hist: jax.Array      # int32 (B, P + 2): iterations that produced j tokens
    drafts_proposed: jax.Array  # int32 (B,): drafts sent to verification
    drafts_accepted: jax.Array  # int32 (B,): drafts accepted (line 20)
    draft_passes: jax.Array     # int32 (B,): AS-ARM draft passes (lines 4-8)
    density_passes: jax.Array   # int32 (B,): AS-ARM density passes (lines 13-15; fused calls)
    lemma1_max_gap: jax.Array   # float32 (): max |p - q| at i = n over verified iterations
    # fused ASSD only (width 1 otherwise): the drafts carried to the next call
    next_drafts: jax.Array      # int32 (B, K): drafts for ranks n .. n + K - 1
    next_q: jax.Array           # float32 (B, K, V) their draft distributions ((B, K, 1) if greedy)
    next_live: jax.Array        # int32 (B,): L, how many of them are live
    kv: Optional[XLNetCache]    # content-stream keys/values (cache = "content"), else None


@flax.struct.dataclass
class Window:
    """The masked slots one iteration works on (Alg. 1 line 3: ``t = min(n + k, N - m)``)."""

    active: jax.Array     # bool (B,): rows with masked slots left
    live: jax.Array       # int32 (B,): t - n, tokens speculated (0 on finished rows)
    query_pos: jax.Array  # int32 (B, P): slot sigma(m + n + j) of query j (clamped past the end)
    use: jax.Array        # bool (B, P): j < t - n


@flax.struct.dataclass
class Drafts:
    """One iteration's drafts ``x~_sigma(n + j)``, ``j < P``."""

    tokens: jax.Array                 # int32 (B, P)
    q: Optional[jax.Array]            # float32 (B, P, V) draft distribution; None when greedy
                                      # and self-drafted (greedy verification needs none)
    logits: Optional[jax.Array]       # float32 (B, P, V) draft-pass logits (self-draft only)
    need_check: jax.Array             # bool (B,): rows whose drafts go to verification
    lemma1: jax.Array                 # bool (B,): drafts came from a draft pass (Lemma 1 holds
                                      # at i = n; that pass is a target NFE)


@flax.struct.dataclass
class Verdict:
    """Outcome of verification (Alg. 1 lines 16-25) per row."""

    accepted: jax.Array        # int32 (B,): drafts accepted (all live ones when unverified)
    resampled: jax.Array       # bool (B,): a draft was rejected and its slot resampled (line 22)
    token: jax.Array           # int32 (B,): the resampled token (meaningless unless resampled)
    lemma1_max_gap: jax.Array  # float32 (): State.lemma1_max_gap, updated


# --------------------------------------------------------------------------- phases
def init_state(cfg: LoopConfig, tokens: jax.Array, key: jax.Array) -> State:
    """Loop carry before the first iteration: nothing decoded, every counter 0."""
    B = tokens.shape[0]
    z = jnp.zeros((B,), jnp.int32)
    K = cfg.draft_slots if cfg.fused else 1
    Vq = 1 if (cfg.sampling.greedy or not cfg.fused) else cfg.model.config.vocab_size
    return State(tokens=tokens, decoded=z, key=key, target_nfe=z, draft_nfe=z, steps=z,
                 accept_hist=jnp.zeros((B, cfg.draft_slots + 2), jnp.int32), drafts_proposed=z,
                 drafts_accepted=z, draft_passes=z, density_passes=z,
                 lemma1_max_gap=jnp.zeros((), jnp.float32),
                 next_drafts=jnp.zeros((B, K), jnp.int32),
                 next_q=jnp.zeros((B, K, Vq), jnp.float32), next_live=z, kv=None)


def prefill(cfg: LoopConfig, params, inp: Inputs, tokens: jax.Array) -> Optional[XLNetCache]:
    """The content cache after encoding the prompt slots (cache ``"content"``; else None):
    one content-only forward in which every prompt row attends to the prompt."""
    if cfg.cache == "none":
        return None
    B, S = tokens.shape
    c = cfg.model.config
    cm, _ = density_masks(inp.visible, jnp.full((B, S), _BIG, jnp.int32))
    pos = jnp.where(inp.visible, jnp.arange(S)[None, :], S)    # S: nothing written
    _, kv = cfg.model.apply(params, tokens, cm & inp.visible[:, :, None], None, content_pos=pos,
                            cache=init_cache(c, B, S))
    return kv


def query_window(cfg: LoopConfig, inp: Inputs, decoded: jax.Array) -> Window:
    """The draft slots after ``decoded`` (``n``, int32 ``(B,)``) tokens (Alg. 1 line 3:
    ``t = min(n + k, N - m)``; fused methods keep one more slot for the bonus row:
    ``t = min(n + k, N - m - 1)``)."""
    P = cfg.draft_slots
    S = inp.visible.shape[1]
    j = jnp.arange(P)[None, :]
    active = decoded < inp.num_masked
    room = inp.num_masked - decoded - (1 if cfg.fused else 0)
    live = jnp.where(active, jnp.clip(jnp.minimum(jnp.minimum(P, inp.k), room), 0), 0)
    qpos = jnp.take_along_axis(inp.pos_of_rank, jnp.minimum(decoded[:, None] + j, S - 1), axis=1)
    return Window(active=active, live=live, query_pos=qpos, use=j < live[:, None])


def known_slots(inp: Inputs, decoded: jax.Array) -> jax.Array:
    """bool ``(B, S)``: the prompt and the ``decoded`` (int32 ``(B,)``) masked slots."""
    return inp.visible | (inp.masked & (inp.rank < decoded[:, None]))


def draft_pass(cfg: LoopConfig, params, inp: Inputs, st: State, win: Window,
               key: jax.Array) -> tuple[Drafts, Optional[XLNetCache]]:
    """Algorithm 1 lines 4-8 (and one sequential step): one draft pass (Fig. 1a) in which every
    query slot conditions on ``x_sigma(<n)`` only; drafts are its argmax (greedy) or samples.
    Lines 9-12: a row speculating a single token skips verification (Lemma 1)."""
    order = draft_order(inp.rank, st.decoded)
    logits, kv = call(cfg, params, inp, st, st.tokens, order, win.query_pos,         # (B, P, V)
                      jnp.take_along_axis(order, win.query_pos, axis=1), st.decoded - 1, 1)
    tokens, q = draw(cfg, key, logits)
    return Drafts(tokens=tokens, q=q, logits=logits, need_check=win.live >= 2,
                  lemma1=jnp.ones_like(win.active)), kv


def call(cfg: LoopConfig, params, inp: Inputs, st: State, tokens, order, query_pos, cond,
         rows_from: jax.Array, rows: int):
    """One AS-ARM forward with ``cfg.suppress`` applied: ``(logits float32 (B, P, V), kv)``
    with suppressed ids at -inf.

    Without a cache it is :func:`conditionals_at` over the whole buffer ``tokens`` (``kv`` is
    ``st.kv``, None). With the content cache it encodes only the ``rows`` content rows of
    ranks ``rows_from .. rows_from + rows - 1`` (int32 ``(B,)``; rows of ranks outside the
    masked range or unattended under ``order`` are not written), each attending to the prompt,
    the slots of lower ``order`` and itself, writes their keys/values into ``st.kv`` and reads
    the queries against the whole cache (``kv`` is the updated cache)."""
    if cfg.cache == "none":
        logits, kv = conditionals_at(cfg.model, params, tokens, inp.visible, order, query_pos,
                                     cond), st.kv
    else:
        B, S = tokens.shape
        r = rows_from[:, None] + jnp.arange(rows)[None, :]
        slot = jnp.take_along_axis(inp.pos_of_rank, jnp.clip(r, 0, S - 1), axis=1)
        r_order = jnp.take_along_axis(order, slot, axis=1)
        ok = (r >= 0) & (r < inp.num_masked[:, None]) & (r_order < _BIG)
        cpos = jnp.where(ok, slot, S)                                   # S: not written
        every = jnp.arange(S)[None, None, :]
        cm = (inp.visible[:, None, :] | (order[:, None, :] < r_order[:, :, None])
              | (every == cpos[:, :, None]))
        qm = ((inp.visible[:, None, :] | (order[:, None, :] < cond[:, :, None]))
              & (every != query_pos[:, :, None]))
        logits, kv = cfg.model.apply(params, jnp.take_along_axis(tokens, slot, axis=1), cm, qm,
                                     content_pos=cpos, query_pos=query_pos, cache=st.kv)
    if cfg.suppress:
        logits = logits.at[..., jnp.asarray(cfg.suppress, jnp.int32)].set(-jnp.inf)
    return logits, kv


def draw(cfg: LoopConfig, key: jax.Array, logits: jax.Array):
    """Drafts from ``logits (B, K, V)``: ``(tokens int32 (B, K), q)`` with the argmax and
    ``q = None`` (greedy), else independent samples and ``q`` the processed probabilities."""
    if cfg.sampling.greedy:
        return argmax(logits), None
    q = target_probs(logits, cfg.sampling)
    return sample_from_probs(key, q), q


def bigram_drafts(cfg: LoopConfig, inp: Inputs, st: State, win: Window, key: jax.Array) -> Drafts:
    """Algorithm 2: drafts from the Eq. 23 context bigram over the known tokens, slot by slot.

    Lines 2-6: draft ``j`` conditions on the token left of its slot when that one is known
    (always for ``j = 0``), else on draft ``j - 1``; lines 7-8: it is that distribution's argmax
    (greedy) or a sample (key ``fold_in(key, j)``). No Lemma 1: every live row is verified."""
    V = cfg.model.config.vocab_size
    known = known_slots(inp, st.decoded)
    dist = jax.vmap(lambda t, kn, c, h: bigram_draft_dist(t, kn, c, h, V))
    tokens, qs = [], []
    for i in range(cfg.draft_slots):
        left = win.query_pos[:, i] - 1
        left_known = jnp.take_along_axis(known, jnp.maximum(left, 0)[:, None], 1)[:, 0]
        left_tok = jnp.take_along_axis(st.tokens, jnp.maximum(left, 0)[:, None], 1)[:, 0]
        prev = tokens[-1] if tokens else left_tok
        c = dist(st.tokens, known, jnp.where(left_known | (i == 0), left_tok, prev), left >= 0)
        tokens.append(argmax(c) if cfg.sampling.greedy
                      else sample_from_probs(jax.random.fold_in(key, i), c))
        qs.append(c)
    return Drafts(tokens=jnp.stack(tokens, axis=1), q=jnp.stack(qs, axis=1), logits=None,
                  need_check=win.live >= 1, lemma1=jnp.zeros_like(win.active))


def ngram_drafts(cfg: LoopConfig, params, inp: Inputs, st: State, win: Window,
                 key: jax.Array) -> tuple[Drafts, Optional[XLNetCache]]:
    """ASSD-ngram's drafts (module docstring): :func:`bigram_drafts`, except on rows whose
    first slot is position 0, which take an AS-ARM draft pass (:func:`draft_pass`) as the
    official code does; that pass runs only when some row needs it."""
    big = bigram_drafts(cfg, inp, st, win, key)
    at0 = win.active & (win.query_pos[:, 0] == 0) & (win.live >= 1)
    V = cfg.model.config.vocab_size
    big = big.replace(logits=jnp.zeros(big.q.shape[:2] + (V,), jnp.float32))

    def with_pass(_):
        own, kv = draft_pass(cfg, params, inp, st, win, key)
        row = at0[:, None]
        return Drafts(tokens=jnp.where(row, own.tokens, big.tokens),
                      q=big.q if own.q is None else jnp.where(row[..., None], own.q, big.q),
                      logits=jnp.where(row[..., None], own.logits, big.logits),
                      need_check=jnp.where(at0, own.need_check, big.need_check), lemma1=at0), kv

    return jax.lax.cond(jnp.any(at0), with_pass, lambda _: (big, st.kv), None)


def density_pass(cfg: LoopConfig, params, inp: Inputs, st: State, win: Window,
                 drafts: Drafts):
    """Algorithm 1 lines 13-15: one density pass (Fig. 1b) over ``x_sigma(<n)`` plus the live
    drafts gives ``p(x~_sigma(i) | x_sigma(<n), x~_sigma(n:i))`` at every query slot. Skipped
    (zeros) when no row needs verification.

    Returns: ``(float32 (B, P, V) target logits, kv)``; with the content cache the call
    encodes the rows of ranks ``n - 1 .. n + P - 1`` (the token decoded last, which no pass
    has encoded when it was resampled, and the drafts)."""
    B, S = st.tokens.shape
    slot = jnp.where(win.use, win.query_pos, S)     # S (out of range) drops the write
    with_drafts = st.tokens.at[jnp.arange(B)[:, None], slot].set(drafts.tokens, mode="drop")

    def run(_):
        order = density_order(inp.rank, st.decoded + win.live)
        return call(cfg, params, inp, st, with_drafts, order, win.query_pos,
                    jnp.take_along_axis(order, win.query_pos, axis=1), st.decoded - 1,
                    cfg.query_slots + 1)

    zeros = jnp.zeros((B, cfg.query_slots, cfg.model.config.vocab_size), jnp.float32)
    return jax.lax.cond(jnp.any(drafts.need_check), run, lambda _: (zeros, st.kv), None)


def verify(cfg: LoopConfig, key: jax.Array, target_logits: jax.Array, drafts: Drafts,
           win: Window, gap: jax.Array, epsilon: jax.Array) -> Verdict:
    """Algorithm 1 lines 16-25 with :func:`jaxspec.core.verify.verify_greedy` /
    :func:`~jaxspec.core.verify.verify_sample` (no bonus row: after all live drafts are accepted
    the next iteration drafts again; ``epsilon > 0`` is Appendix F.5's tolerance).

    Rows drafted by a draft pass (``drafts.lemma1``) use the draft row for ``i = n`` as its
    target row (Lemma 1: the same distribution), recording the largest gap between the two
    under sampling."""
    l1 = drafts.lemma1 & drafts.need_check
    if cfg.sampling.greedy:
        if drafts.logits is not None:
            row0 = jnp.where(l1[:, None], drafts.logits[:, 0], target_logits[:, 0])
            target_logits = target_logits.at[:, 0].set(row0)
        n_ok, token = verify_greedy(target_logits, drafts.tokens)
    else:
        p = target_probs(target_logits, cfg.sampling)
        g = jnp.abs(p[:, 0] - drafts.q[:, 0]).max(-1)
        gap = jnp.maximum(gap, jnp.max(jnp.where(l1, g, 0.0)))
        p = p.at[:, 0].set(jnp.where(l1[:, None], drafts.q[:, 0], p[:, 0]))
        n_ok, token = verify_sample(key, p, drafts.tokens, drafts.q, epsilon=epsilon)
    need = drafts.need_check
    return Verdict(accepted=jnp.where(need, jnp.minimum(n_ok, win.live), win.live),   # line 20
                   resampled=need & (n_ok < win.live), token=token,                 # line 22
                   lemma1_max_gap=gap)


def unverified(win: Window, gap: jax.Array) -> Verdict:
    """Verdict of a sequential step: its one token is accepted as drawn."""
    z = jnp.zeros(win.live.shape, jnp.int32)
    return Verdict(accepted=win.live, resampled=z.astype(bool), token=z, lemma1_max_gap=gap)


def commit(cfg: LoopConfig, st: State, key: jax.Array, win: Window, drafts: Drafts,
           verdict: Verdict) -> State:
    """Write the accepted drafts and the resampled token, then ``n <- i + 1`` (line 26), and
    count: target NFE (draft + density passes), bigram calls, drafts proposed / accepted, the
    tokens-per-iteration histogram."""
    B, S = st.tokens.shape
    j = jnp.arange(cfg.query_slots)[None, :]
    n_acc = verdict.accepted
    at_rej = verdict.resampled[:, None] & (j == n_acc[:, None])
    keep = win.use & ((j < n_acc[:, None]) | at_rej)
    new = jnp.where(at_rej, verdict.token[:, None], drafts.tokens)
    tokens = st.tokens.at[jnp.arange(B)[:, None], jnp.where(keep, win.query_pos, S)].set(
        new, mode="drop")
    produced = jnp.where(win.active, n_acc + verdict.resampled.astype(jnp.int32), 0)
    a32 = win.active.astype(jnp.int32)
    verified = (drafts.need_check & win.active).astype(jnp.int32)
    drafted = (drafts.lemma1 & win.active).astype(jnp.int32)     # AS-ARM draft passes
    bigram = 0 if cfg.self_draft else a32 - drafted              # drafter calls
    hist = st.accept_hist.at[jnp.arange(B), jnp.clip(produced, 0, cfg.draft_slots + 1)].add(a32)
    return st.replace(tokens=tokens, decoded=st.decoded + produced, key=key,
                 target_nfe=st.target_nfe + drafted + verified, draft_nfe=st.draft_nfe + bigram,
                 steps=st.steps + a32, accept_hist=hist,
                 drafts_proposed=st.drafts_proposed + verified * win.live,
                 drafts_accepted=st.drafts_accepted + verified * n_acc,
                 draft_passes=st.draft_passes + drafted,
                 density_passes=st.density_passes + verified,
                 lemma1_max_gap=verdict.lemma1_max_gap)


# --------------------------------------------------------------------------- fused ASSD phases
def fused_queries(cfg: LoopConfig, inp: Inputs, decoded: jax.Array):
    """Slots and conditioning of one fused call's ``P`` query tokens (module docstring, "Fused
    ASSD"): ``K + 1`` density queries (rank ``n + i``, attending to ranks ``< n + i``), then,
    for self-drafting, ``K + 1`` groups of ``K`` (group ``j``: ranks ``n+j+1 .. n+j+K``,
    attending to ranks ``< n + j``).

    Returns: ``(query_pos int32 (B, P), cond int32 (B, P))`` for :func:`conditionals_at`."""
    K = cfg.draft_slots
    B, S = inp.visible.shape
    n = decoded[:, None]
    rank, cond = n + jnp.arange(K + 1)[None, :], n + jnp.arange(K + 1)[None, :]
    if cfg.self_draft:
        j, r = jnp.arange(K + 1)[:, None], jnp.arange(K)[None, :]
        g_rank = (n[:, :, None] + (j + 1 + r)[None]).reshape(B, -1)
        g_cond = jnp.broadcast_to(n[:, :, None] + j[None], (B, K + 1, K)).reshape(B, -1)
        rank, cond = jnp.concatenate([rank, g_rank], 1), jnp.concatenate([cond, g_cond], 1)
    pos = jnp.take_along_axis(inp.pos_of_rank, jnp.minimum(rank, S - 1), axis=1)
    return pos, cond


def fused_pass(cfg: LoopConfig, params, inp: Inputs, st: State, win: Window,
               drafts: jax.Array, live: jax.Array):
    """The one AS-ARM call of a fused iteration: content stream over ``x_sigma(<n)`` and the
    ``live`` (int32 ``(B,)``) drafts ``drafts`` (int32 ``(B, K)``) under the density mask, and
    the queries of :func:`fused_queries`.

    Returns: ``(target float32 (B, K + 1, V), groups float32 (B, K + 1, K, V) or None, kv)``
    (content cache: the rows of ranks ``n - 1 .. n + K - 1`` are encoded, i.e. the token the
    previous call sampled and the drafts):
    ``target[:, i]`` is ``p(x_sigma(n+i) | x_sigma(<n), d_1..d_i)`` (valid for ``i <= live``),
    ``groups[:, j, r]`` is ``p(x_sigma(n+j+1+r) | x_sigma(<n), d_1..d_j)``."""
    B, S = st.tokens.shape
    K, V = cfg.draft_slots, cfg.model.config.vocab_size
    use = jnp.arange(K)[None, :] < live[:, None]
    buf = st.tokens.at[jnp.arange(B)[:, None], jnp.where(use, win.query_pos, S)].set(
        drafts, mode="drop")
    pos, cond = fused_queries(cfg, inp, st.decoded)
    logits, kv = call(cfg, params, inp, st, buf, density_order(inp.rank, st.decoded + live),
                      pos, cond, st.decoded - 1, K + 1)
    groups = logits[:, K + 1:].reshape(B, K + 1, K, V) if cfg.self_draft else None
    return logits[:, :K + 1], groups, kv


def fused_verify(cfg: LoopConfig, key: jax.Array, target: jax.Array, drafts: jax.Array,
                 q: Optional[jax.Array], live: jax.Array, epsilon: jax.Array):
    """Chain verification of the ``live`` drafts with a bonus row (:mod:`jaxspec.core.verify`,
    ``draft_len = live``): ``(accepted int32 (B,), token int32 (B,))``, the token being the
    residual sample at the first rejection or the bonus from ``p_live``."""
    if cfg.sampling.greedy:
        return verify_greedy(target, drafts, draft_len=live)
    return verify_sample(key, target_probs(target, cfg.sampling), drafts, q, epsilon=epsilon,
                         draft_len=live)


def fused_commit(cfg: LoopConfig, inp: Inputs, st: State, key: jax.Array, k_draft: jax.Array,
                 win: Window, drafts: jax.Array, live: jax.Array, groups, n_ok: jax.Array,
                 token: jax.Array, kv: Optional[XLNetCache]) -> State:
    """Write ``d_1..d_j`` and the sampled token at rank ``n + j`` (``j = n_ok``), ``n <- n +
    j + 1``; the next drafts are group ``j``'s samples (greedy: argmax) with their ``q``; count
    one target NFE per call."""
    B, S = st.tokens.shape
    rows = jnp.arange(B)
    act = win.active
    keep = (jnp.arange(cfg.draft_slots)[None, :] < n_ok[:, None]) & act[:, None]
    tokens = st.tokens.at[rows[:, None], jnp.where(keep, win.query_pos, S)].set(drafts, mode="drop")
    at = jnp.take_along_axis(inp.pos_of_rank, jnp.minimum(st.decoded + n_ok, S - 1)[:, None], 1)
    tokens = tokens.at[rows, jnp.where(act, at[:, 0], S)].set(token, mode="drop")
    produced = jnp.where(act, n_ok + 1, 0)
    decoded = st.decoded + produced
    nxt, q = st.next_drafts, st.next_q
    if groups is not None:
        nxt, q_new = draw(cfg, k_draft, groups[rows, jnp.minimum(n_ok, cfg.draft_slots)])
        q = q if q_new is None else q_new
    a32 = act.astype(jnp.int32)
    hist = st.accept_hist.at[rows, jnp.clip(produced, 0, cfg.draft_slots + 1)].add(a32)
    return st.replace(tokens=tokens, decoded=decoded, key=key, target_nfe=st.target_nfe + a32,
                      draft_nfe=st.draft_nfe + (0 if cfg.self_draft else a32 * (live >= 1)),
                      steps=st.steps + a32, accept_hist=hist,
                      drafts_proposed=st.drafts_proposed + a32 * live,
                      drafts_accepted=st.drafts_accepted + a32 * n_ok,
                      density_passes=st.density_passes + a32, next_drafts=nxt, next_q=q,
                      next_live=query_window(cfg, inp, decoded).live, kv=kv)


def fused_step(cfg: LoopConfig, params, inp: Inputs, st: State) -> State:
    """One fused iteration (``"assd-fused"`` / ``"assd-fused-ngram"``) for every row in
    lockstep: drafts (carried, or Algorithm 2's bigram), one call, verification, commit."""
    win = query_window(cfg, inp, st.decoded)
    key, k_draft, k_verify = jax.random.split(st.key, 3)
    if cfg.self_draft:
        live = jnp.minimum(st.next_live, win.live)
        drafts, q = st.next_drafts, (None if cfg.sampling.greedy else st.next_q)
    else:
        big = bigram_drafts(cfg, inp, st, win, k_draft)                   # Algorithm 2
        live, drafts, q = win.live, big.tokens, big.q
    target, groups, kv = fused_pass(cfg, params, inp, st, win, drafts, live)
    n_ok, token = fused_verify(cfg, k_verify, target, drafts, q, live, inp.epsilon)
    return fused_commit(cfg, inp, st, key, k_draft, win, drafts, live, groups, n_ok, token, kv)


# --------------------------------------------------------------------------- the loop
def step(cfg: LoopConfig, params, inp: Inputs, st: State) -> State:
    """One iteration of Algorithm 1 (``"assd"``), of Algorithm 1 with Algorithm 2's drafts
    (``"assd-ngram"``), of sequential decoding, or of fused ASSD (:func:`fused_step`), for
    every row in lockstep."""
    if cfg.fused:
        return fused_step(cfg, params, inp, st)
    win = query_window(cfg, inp, st.decoded)
    key, k_draft, k_verify = jax.random.split(st.key, 3)
    if cfg.self_draft:
        drafts, kv = draft_pass(cfg, params, inp, st, win, k_draft)       # lines 4-12
    else:
        drafts, kv = ngram_drafts(cfg, params, inp, st, win, k_draft)     # Algorithm 2
    st = st.replace(kv=kv)
    if cfg.method == "sequential":
        verdict = unverified(win, st.lemma1_max_gap)
    else:
        target_logits, kv = density_pass(cfg, params, inp, st, win, drafts)   # lines 13-15
        st = st.replace(kv=kv)
        verdict = verify(cfg, k_verify, target_logits, drafts, win, st.lemma1_max_gap,
                         inp.epsilon)                                     # lines 16-25
    return commit(cfg, st, key, win, drafts, verdict)                     # line 26


def decode_loop(params, inp: Inputs, tokens: jax.Array, key: jax.Array, *,
                cfg: LoopConfig) -> State:
    """Run :func:`step` until every row has decoded all its masked slots (one
    ``lax.while_loop``). ``inp.k`` and ``inp.epsilon`` are traced, so one executable serves
    every ``k <= cfg.slots``.

    Args:
      params: the XLNet's parameters; inp: :class:`Inputs`; tokens: int32 ``(B, S)`` (0 at the
        masked slots); key: PRNG key.

    Returns:
      The final :class:`State`.
    """
    st = init_state(cfg, tokens, key).replace(kv=prefill(cfg, params, inp, tokens))
    return jax.lax.while_loop(lambda s: jnp.any(s.decoded < inp.num_masked),
                              lambda s: step(cfg, params, inp, s), st)


_decode_jit = jax.jit(decode_loop, static_argnames=("cfg",))


# --------------------------------------------------------------------------- results
@dataclasses.dataclass
class ASSDStats(DecodeStats):
    """:class:`jaxspec.core.stats.DecodeStats` for ASSD (module docstring, "NFE").

    ``accept_hist[b, j]`` counts the iterations of row ``b`` that produced ``j`` tokens. ASSD has
    no bonus token, so an iteration that accepts all its drafts produced exactly that many
    tokens; the true number of accepted drafts is therefore kept in ``accepted`` (int ``(B,)``)
    and :attr:`accepted_drafts` / :attr:`acceptance_rate` use it. ``drafts_proposed`` counts the
    drafts sent to verification (unverified single-token iterations propose none). For
    ``"assd"`` these include each verified iteration's first draft, which Lemma 1 accepts with
    certainty, so the acceptance rate is at least ``1 / k``; the rate over the later drafts is
    ``(accepted - iterations) / (proposed - iterations)`` over the verified iterations.
    """

    accepted: Optional[np.ndarray] = None

    @property
    def accepted_drafts(self) -> int:
        if self.accepted is None:
            return super().accepted_drafts
        return int(self.accepted.sum())


@dataclasses.dataclass
class InfillResult:
    """Output of :func:`assd_generate`.

    Attributes:
      sequences: per row, int32 ``(N_b,)``: the input with every masked position filled.
      infilled: per row, int32 ``(G_b,)``: the generated tokens in decoding order (left to right).
      stats: :class:`ASSDStats` (``new_tokens`` = ``G_b``).
      compile_s: seconds spent compiling (0 when a cached executable was reused).
      run_s: wall-clock seconds of the decode itself.
    """

    sequences: list
    infilled: list
    stats: ASSDStats
    compile_s: float
    run_s: float


# --------------------------------------------------------------------------- host wrapper
def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_settings(method: str, k, slots, sampling, epsilon) -> int:
    """Validate :func:`assd_generate`'s decoding settings; returns ``slots`` (default ``k``).

    Raises:
      ValueError (one line): see :func:`assd_generate`.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    if not _is_int(k) or k < 1:
        raise ValueError(f"k (tokens speculated per iteration) must be an int >= 1, got {k!r}")
    slots = int(k) if slots is None else slots
    if not _is_int(slots) or slots < k:
        raise ValueError(f"slots must be an int >= k = {k}, got {slots!r}")
    if not isinstance(sampling, SamplingConfig):
        raise ValueError("sampling must be a jaxspec.core.sampling.SamplingConfig")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if epsilon > 0 and (sampling.greedy or method == "sequential"):
        raise ValueError("epsilon tolerance applies to ASSD sampling only (temperature > 0)")
    return slots


def _check_suppress(suppress, vocab_size: int) -> tuple:
    """``suppress`` as a sorted tuple of ids in ``[0, V)``.

    Raises:
      ValueError (one line): a non-integer id or one outside the vocabulary."""
    ids = []
    for t in suppress or ():
        if not _is_int(t) or not 0 <= int(t) < vocab_size:
            raise ValueError(f"suppressed token id {t!r} is not an id of the model vocabulary "
                             f"[0, {vocab_size})")
        ids.append(int(t))
    return tuple(sorted(set(ids)))


def _stats(method: str, st: State, G: np.ndarray, k: int, k_requested: int,
           epsilon: float, cfg: LoopConfig) -> ASSDStats:
    """The host-side statistics record of a finished loop (``st`` as numpy arrays)."""
    seq = method == "sequential"
    return ASSDStats(
        method=method, reference="sequential", target_nfe=st.target_nfe, draft_nfe=st.draft_nfe,
        steps=st.steps, accept_hist=st.accept_hist[:, :k + 2], new_tokens=G.astype(np.int64),
        draft_length=0 if seq else k_requested,
        drafts_proposed=None if seq else st.drafts_proposed,
        accepted=None if seq else st.drafts_accepted,
        extra={"k": None if seq else k_requested, "epsilon": float(epsilon),
               "lossless": bool(epsilon == 0), "draft_passes": int(st.draft_passes.sum()),
               "density_passes": int(st.density_passes.sum()),
               "tokens_per_iteration": round(float(G.sum() / max(st.steps.sum(), 1)), 4),
               "lemma1_max_gap": float(st.lemma1_max_gap),
               "query_tokens_per_call": cfg.query_slots, "suppressed": list(cfg.suppress),
               "cache": cfg.cache})


def assd_generate(model: XLNetLM, params, tokens, masked, *, method: str = "assd", k: int = 5,
                  sampling: SamplingConfig = SamplingConfig(), seed: int = 0,
                  epsilon: float = 0.0, slots: Optional[int] = None, bucket: int = 16,
                  max_len: Optional[int] = None, suppress: Sequence[int] = (),
                  cache: str = "none") -> InfillResult:
    """Fill the masked positions of a batch with sequential decoding or ASSD (module docstring).

    Args:
      model, params: an :class:`models.xlnet.modeling.XLNetLM` and its parameters.
      tokens: ``B`` int sequences of model ids (lengths may differ; ids at masked positions are
        ignored).
      masked: ``B`` bool sequences, True at the positions to generate (any subset).
      method: ``"sequential"`` (reference), ``"assd"`` (Algorithm 1), ``"assd-ngram"``
        (Algorithm 2 drafts), ``"assd-fused"`` / ``"assd-fused-ngram"`` (one call per
        iteration; module docstring, "Fused ASSD").
      k: tokens speculated per iteration (>= 1; ignored by ``"sequential"``). The paper uses 5.
      sampling: temperature (0 = greedy) / top-k / top-p of the target distribution.
      seed: PRNG seed; the same seed, inputs and batch reproduce a run exactly.
      epsilon: Appendix F.5 tolerance (``>= 0``; ``> 0`` is NOT lossless; sampling only).
      slots: query slots compiled into the loop (static, ``>= k``; default ``k``): one
        executable serves every ``k <= slots`` (a k sweep compiles once; the unused slots cost a
        little query-stream work).
      bucket: buffer length granularity (one compile per bucketed length).
      max_len: optional context limit (e.g. the checkpoint's training length).
      suppress: model token ids never generated (logits set to -inf in every pass, target
        and drafts; e.g. ``asarm-small``'s UNK). This changes the target distribution, so the
        reference is sequential decoding with the same ``suppress``.
      cache: ``"none"`` or ``"content"`` (Appendix F.4 content-stream KV cache: a call encodes
        only the rows it adds). Each policy is its own reference: greedy output is identical to
        sequential decoding with the same cache (float rounding differs between the two).

    Returns:
      :class:`InfillResult`; ``stats.method`` is ``method``, ``reference`` ``"sequential"``,
      ``target_nfe`` the AS-ARM forwards (<= ``G_b`` for every method: Theorem 1),
      ``draft_length`` ``k`` (0 for sequential); ``extra`` has ``k``, ``epsilon``, ``lossless``,
      ``draft_passes``, ``density_passes`` (fused: calls), ``tokens_per_iteration``,
      ``lemma1_max_gap``, ``query_tokens_per_call`` (the extra cost of fusing), ``suppressed``.

    Raises:
      ValueError (one line): unknown method, ``k < 1``, ``slots < k``, ``epsilon < 0`` or
      ``epsilon > 0`` with greedy decoding or sequential, and every input error of
      :func:`prepare_batch` (no masks, span past ``max_len``, shape mismatch, id outside the
      vocabulary), a suppressed id outside the vocabulary.
    """
    slots = _check_settings(method, k, slots, sampling, epsilon)
    suppress = _check_suppress(suppress, model.config.vocab_size)
    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r}; expected one of {', '.join(CACHES)}")
    tok, vis, msk, lengths = prepare_batch(tokens, masked, model.config.vocab_size, bucket, max_len)
    rank, pos, G = _ranks(msk)
    k_requested = int(k)
    k, slots = (1, 1) if method == "sequential" else (int(k), int(slots))
    # t = min(n + k, N - m) (Algorithm 1 line 3): a k or slot count above the most masked
    # positions of any row speculates no more, so compile no more query slots than that
    # (a huge k would otherwise allocate (B, k, V) logits for nothing)
    g_max = max(int(np.max(G)), 1)
    if slots > g_max:
        slots, k = g_max, min(k, g_max)
    vis_d, msk_d, rank_d, pos_d, G_d, tok_d = place_batch(
        params, vis, msk, rank, pos, np.asarray(G), tok)
    inp = Inputs(visible=vis_d, masked=msk_d, rank=rank_d, pos_of_rank=pos_d, num_masked=G_d,
                 k=jnp.int32(k), epsilon=jnp.float32(epsilon))
    cfg = LoopConfig(model=model, method=method, slots=slots, sampling=sampling, suppress=suppress,
                     cache=cache)
    out, compile_s, run_s = run_compiled(
        _decode_jit, (params, inp, tok_d, jax.random.PRNGKey(seed)), dict(cfg=cfg))
    st = jax.tree.map(np.asarray, out.replace(kv=None))
    return InfillResult(sequences=[st.tokens[b, :lengths[b]].copy() for b in range(len(lengths))],
                        infilled=[st.tokens[b][msk[b]].copy() for b in range(len(lengths))],
                        stats=_stats(method, st, G, k, k_requested, epsilon, cfg),
                        compile_s=compile_s, run_s=run_s)


__all__ = ["METHODS", "ASSDStats", "InfillResult", "decoding_order", "prepare_batch",
           "conditionals", "conditionals_at", "draft_order", "density_order", "bigram_draft_dist", "LoopConfig",
           "Inputs", "State", "query_window", "draft_pass", "bigram_drafts", "density_pass",
           "verify", "commit", "fused_queries", "fused_pass", "fused_verify", "fused_commit",
           "fused_step", "ngram_drafts", "step", "decode_loop", "assd_generate"]
