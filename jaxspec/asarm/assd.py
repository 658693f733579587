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
  verified (one AS-ARM forward, 1 to ``k`` tokens). Conventions shared with
  :class:`jaxspec.core.drafters.NgramDrafter`: a condition never seen followed by a known token drafts
  a point mass on itself. Extension for ``sigma(i) = 0`` (no left neighbour, excluded by
  Theorem 3): the unigram frequencies of the known tokens (uniform if none). Lossless.

**Epsilon tolerance** (Appendix F.5, ``epsilon > 0``, sampling only): acceptance becomes
``r < min(1, q / p + epsilon)``. This is **not lossless** (the output distribution drifts from
sequential decoding's; ``epsilon >= 1`` accepts every draft = parallel sampling) and is marked
``stats.extra["lossless"] = False``.

**NFE** (``stats.target_nfe``) counts every AS-ARM forward: draft passes plus density passes,
the quantity Theorem 1 bounds by ``N - m``. ``stats.draft_nfe`` counts the n-gram drafter's
calls for ``assd-ngram`` (Table 1's "auxiliary draft model calls") and is 0 otherwise.

**Cost and shapes.** No KV cache (Appendix F.4 found none helpful at small sizes): every pass is
a full content-stream forward over the ``S``-slot buffer plus ``k`` query slots (1 for
sequential). Sequences are right-padded to ``S`` = the longest one rounded up to ``bucket``;
pad slots are neither prompt nor masked and nobody attends to them (relative attention makes
the padding invisible). Rows of a batch run in lockstep; a finished row idles. Randomness: one key
``PRNGKey(seed)`` split once per iteration; every row and slot draws its own numbers from it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.drafters import context_bigram, context_unigram
from jaxspec.core.runtime import run_compiled
from jaxspec.core.sampling import SamplingConfig, sample_from_probs, target_probs
from jaxspec.core.stats import DecodeStats
from jaxspec.core.verify import verify_greedy, verify_sample
from models.xlnet.modeling import XLNetLM, density_masks

METHODS = ("sequential", "assd", "assd-ngram")
_BIG = 1 << 30   # rank of positions nobody may attend (undecoded masked slots, padding)


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
    S = int(-(-lengths.max() // bucket) * bucket)
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
    cm, qm_full = density_masks(visible, order)
    qm = jnp.take_along_axis(qm_full, query_pos[:, :, None], axis=1)
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
    bigram :func:`jaxspec.core.drafters.context_bigram` conditioned on ``cond``, or, for a
    position with no left neighbour (``has_cond`` False), the unigram frequencies of the known
    tokens.

    Args:
      tokens: int32 ``(S,)``; known: bool ``(S,)`` (prompt or decoded);
      cond: int32 ``()``; has_cond: bool ``()``.

    Returns:
      float32 ``(V,)``.
    """
    d_big, _ = context_bigram(tokens, known, cond, vocab_size)
    return jnp.where(has_cond, d_big, context_unigram(tokens, known, vocab_size))


# --------------------------------------------------------------------------- the loop
@flax.struct.dataclass
class _State:
    tokens: jax.Array    # int32 (B, S)
    n: jax.Array         # int32 (B,) masked tokens decoded
    key: jax.Array       # PRNG key, split every iteration
    nfe: jax.Array       # int32 (B,) AS-ARM forwards while active
    dnfe: jax.Array      # int32 (B,) n-gram drafter calls
    steps: jax.Array     # int32 (B,)
    hist: jax.Array      # int32 (B, slots+2) iterations that produced j tokens
    proposed: jax.Array  # int32 (B,) drafts sent to verification
    accepted: jax.Array  # int32 (B,) drafts accepted
    dpass: jax.Array     # int32 (B,) draft passes
    vpass: jax.Array     # int32 (B,) density (verification) passes
    gap: jax.Array       # float32 () Lemma 1: max |p_draft - q| at i = n


def _decode(params, tokens, visible, masked, rank, pos_of_rank, G, key, k, epsilon, *,
            model: XLNetLM, method: str, slots: int, sampling: SamplingConfig):
    """The decode loop (module docstring). ``k`` (int32 scalar, ``1 <= k <= slots``) and
    ``epsilon`` (float32 scalar) are traced, so one executable serves every ``k <= slots``."""
    B, S = tokens.shape
    V = model.config.vocab_size
    P = 1 if method == "sequential" else slots
    greedy = sampling.greedy
    rows = jnp.arange(B)[:, None]
    H = P + 2
    j = jnp.arange(P)[None, :]

    def probs(logits):
        return target_probs(logits, sampling)

    def body(st: _State) -> _State:
        active = st.n < G
        live = jnp.where(active, jnp.minimum(jnp.minimum(P, k), G - st.n), 0)   # t - n per row
        qpos = jnp.take_along_axis(pos_of_rank, jnp.minimum(st.n[:, None] + j, S - 1), axis=1)
        use = j < live[:, None]                                                 # live slots
        slot = jnp.where(use, qpos, S)          # write target; S (out of range) drops the write
        key, kd, kv = jax.random.split(st.key, 3)
        known = visible | (masked & (rank < st.n[:, None]))

        if method == "assd-ngram":
            # Algorithm 2: drafts from the context bigram model (Eq. 23), one slot at a time
            drafts, dprobs = [], []
            for i in range(P):
                left = qpos[:, i] - 1
                left_known = jnp.take_along_axis(known, jnp.maximum(left, 0)[:, None], 1)[:, 0]
                left_tok = jnp.take_along_axis(st.tokens, jnp.maximum(left, 0)[:, None], 1)[:, 0]
                prev = drafts[-1] if drafts else left_tok
                cond = jnp.where(left_known | (i == 0), left_tok, prev)      # Alg. 2 lines 2-6
                c = jax.vmap(lambda t, kn, cd, hc: bigram_draft_dist(t, kn, cd, hc, V))(
                    st.tokens, known, cond, left >= 0)
                d = (jnp.argmax(c, axis=-1).astype(jnp.int32) if greedy
                     else sample_from_probs(jax.random.fold_in(kd, i), c))  # Alg. 2 lines 7-8
                drafts.append(d)
                dprobs.append(c)
            draft = jnp.stack(drafts, axis=1)                                   # (B, P)
            d_probs = jnp.stack(dprobs, axis=1)                                 # (B, P, V)
            d_logits = None
            need = live >= 1                                    # no Lemma 1: always verify
        else:
            # Algorithm 1 lines 4-8 (or one sequential step): one draft pass
            d_logits = conditionals(model, params, st.tokens, visible,
                                    draft_order(rank, st.n), qpos)               # (B, P, V)
            if greedy:
                draft = jnp.argmax(d_logits, axis=-1).astype(jnp.int32)
                d_probs = None
            else:
                d_probs = probs(d_logits)
                draft = sample_from_probs(kd, d_probs)
            need = live >= 2                              # lines 9-12: one token -> no check

        gap = st.gap
        if method == "sequential":
            n_acc = live
            nxt = jnp.zeros((B,), jnp.int32)
            resample = jnp.zeros((B,), bool)
        else:
            tok_d = st.tokens.at[rows, slot].set(draft, mode="drop")

            def density(_):                                                  # lines 13-15
                return conditionals(model, params, tok_d, visible,
                                    density_order(rank, st.n + live), qpos)

            t_logits = jax.lax.cond(jnp.any(need), density,
                                    lambda _: jnp.zeros((B, P, V), jnp.float32), None)
            self_draft = method == "assd"
            if greedy:
                if self_draft:   # Lemma 1: the target row of sigma(n) is the draft row
                    t_logits = t_logits.at[:, 0].set(d_logits[:, 0])
                n_v, nxt = verify_greedy(t_logits, draft)
            else:
                t_probs = probs(t_logits)
                if self_draft:
                    g = jnp.abs(t_probs[:, 0] - d_probs[:, 0]).max(-1)
                    gap = jnp.maximum(gap, jnp.max(jnp.where(need, g, 0.0)))
                    t_probs = t_probs.at[:, 0].set(d_probs[:, 0])
                # lines 16-25 (no bonus row: after all live drafts are accepted the next
                # iteration drafts again); epsilon > 0 is Appendix F.5's tolerance
                n_v, nxt = verify_sample(kv, t_probs, draft, d_probs, epsilon=epsilon)
            n_acc = jnp.where(need, jnp.minimum(n_v, live), live)      # accepted (line 20)
            resample = need & (n_v < live)                              # line 22
        produced = jnp.where(active, n_acc + resample.astype(jnp.int32), 0)
        # write accepted drafts, then the resampled token at slot n_acc; line 26: n <- i + 1
        at_rej = resample[:, None] & (j == n_acc[:, None])
        new = jnp.where(at_rej, nxt[:, None], draft)
        keep = use & ((j < n_acc[:, None]) | at_rej)
        tokens = st.tokens.at[rows, jnp.where(keep, qpos, S)].set(new, mode="drop")

        a32 = active.astype(jnp.int32)
        verified = (need & active).astype(jnp.int32)
        if method == "sequential":
            nfe_inc, prop_inc, acc_inc, dp_inc, vp_inc, dn_inc = a32, 0, 0, a32, 0, 0
        elif method == "assd":
            nfe_inc, dp_inc, vp_inc, dn_inc = a32 + verified, a32, verified, 0
            prop_inc, acc_inc = verified * live, verified * n_acc
        else:
            nfe_inc, dp_inc, vp_inc, dn_inc = verified, 0, verified, a32
            prop_inc, acc_inc = verified * live, verified * n_acc
        hist = st.hist.at[jnp.arange(B), jnp.clip(produced, 0, H - 1)].add(a32)
        return _State(tokens=tokens, n=st.n + produced, key=key, nfe=st.nfe + nfe_inc,
                      dnfe=st.dnfe + dn_inc, steps=st.steps + a32, hist=hist,
                      proposed=st.proposed + prop_inc, accepted=st.accepted + acc_inc,
                      dpass=st.dpass + dp_inc, vpass=st.vpass + vp_inc, gap=gap)

    z = jnp.zeros((B,), jnp.int32)
    st = _State(tokens=tokens, n=z, key=key, nfe=z, dnfe=z, steps=z,
                hist=jnp.zeros((B, H), jnp.int32), proposed=z, accepted=z, dpass=z, vpass=z,
                gap=jnp.zeros((), jnp.float32))
    st = jax.lax.while_loop(lambda s: jnp.any(s.n < G), body, st)
    return (st.tokens, st.nfe, st.dnfe, st.steps, st.hist, st.proposed, st.accepted,
            st.dpass, st.vpass, st.gap)


_decode_jit = jax.jit(_decode, static_argnames=("model", "method", "slots", "sampling"))


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def assd_generate(model: XLNetLM, params, tokens, masked, *, method: str = "assd", k: int = 5,
                  sampling: SamplingConfig = SamplingConfig(), seed: int = 0,
                  epsilon: float = 0.0, slots: Optional[int] = None, bucket: int = 16,
                  max_len: Optional[int] = None) -> InfillResult:
    """Fill the masked positions of a batch with sequential decoding or ASSD (module docstring).

    Args:
      model, params: an :class:`models.xlnet.modeling.XLNetLM` and its parameters.
      tokens: ``B`` int sequences of model ids (lengths may differ; ids at masked positions are
        ignored).
      masked: ``B`` bool sequences, True at the positions to generate (any subset).
      method: ``"sequential"`` (reference), ``"assd"`` (Algorithm 1) or ``"assd-ngram"``
        (Algorithm 2 drafts).
      k: tokens speculated per iteration (>= 1; ignored by ``"sequential"``). The paper uses 5.
      sampling: temperature (0 = greedy) / top-k / top-p of the target distribution.
      seed: PRNG seed; the same seed, inputs and batch reproduce a run exactly.
      epsilon: Appendix F.5 tolerance (``>= 0``; ``> 0`` is NOT lossless; sampling only).
      slots: query slots compiled into the loop (static, ``>= k``; default ``k``): one
        executable serves every ``k <= slots`` (a k sweep compiles once; the unused slots cost a
        little query-stream work).
      bucket: buffer length granularity (one compile per bucketed length).
      max_len: optional context limit (e.g. the checkpoint's training length).

    Returns:
      :class:`InfillResult`; ``stats.method`` is ``method``, ``reference`` ``"sequential"``,
      ``target_nfe`` the AS-ARM forwards (<= ``G_b`` for every method: Theorem 1),
      ``draft_length`` ``k`` (0 for sequential); ``extra`` has ``k``, ``epsilon``, ``lossless``,
      ``draft_passes``, ``density_passes``, ``tokens_per_iteration``, ``lemma1_max_gap``.

    Raises:
      ValueError (one line): unknown method, ``k < 1``, ``slots < k``, ``epsilon < 0`` or
      ``epsilon > 0`` with greedy decoding or sequential, and every input error of
      :func:`prepare_batch` (no masks, span past ``max_len``, shape mismatch, id outside the
      vocabulary).
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
    tok, vis, msk, lengths = prepare_batch(tokens, masked, model.config.vocab_size, bucket, max_len)
    rank, pos, G = _ranks(msk)
    seq = method == "sequential"
    k_requested = int(k)
    k, slots = (1, 1) if seq else (int(k), int(slots))
    # t = min(n + k, N - m) (Algorithm 1 line 3): a k or slot count above the most masked
    # positions of any row speculates no more, so compile no more query slots than that
    # (a huge k would otherwise allocate (B, k, V) logits for nothing)
    g_max = max(int(np.max(G)), 1)
    if slots > g_max:
        slots, k = g_max, min(k, g_max)
    statics = dict(model=model, method=method, slots=slots, sampling=sampling)
    args = (params, jnp.asarray(tok), jnp.asarray(vis), jnp.asarray(msk), jnp.asarray(rank),
            jnp.asarray(pos), jnp.asarray(G), jax.random.PRNGKey(seed), jnp.int32(k),
            jnp.float32(epsilon))
    out, compile_s, run_s = run_compiled(_decode_jit, args, statics)
    toks, nfe, dnfe, steps, hist, proposed, accepted, dpass, vpass, gap = (np.asarray(x) for x in out)
    seqs = [toks[b, :lengths[b]].copy() for b in range(len(lengths))]
    inf = [toks[b][msk[b]].copy() for b in range(len(lengths))]
    stats = ASSDStats(
        method=method, reference="sequential", target_nfe=nfe, draft_nfe=dnfe, steps=steps,
        accept_hist=hist[:, :k + 2], new_tokens=G.astype(np.int64), draft_length=0 if seq else k_requested,
        drafts_proposed=None if seq else proposed, accepted=None if seq else accepted,
        extra={"k": None if seq else k_requested, "epsilon": float(epsilon),
               "lossless": bool(epsilon == 0), "draft_passes": int(dpass.sum()),
               "density_passes": int(vpass.sum()),
               "tokens_per_iteration": round(float(G.sum() / max(steps.sum(), 1)), 4),
               "lemma1_max_gap": float(gap)})
    return InfillResult(sequences=seqs, infilled=inf, stats=stats, compile_s=compile_s,
                        run_s=run_s)


__all__ = ["METHODS", "ASSDStats", "InfillResult", "decoding_order", "prepare_batch",
           "conditionals", "draft_order", "density_order", "bigram_draft_dist", "assd_generate"]
