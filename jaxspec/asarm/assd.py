"""ASSD: any-subset speculative decoding for any-subset autoregressive models (XLNet AS-ARM):
Algorithm 1's verification and commit, one iteration, the loop and the host wrapper
:func:`assd_generate`.

Source: Guo & Ermon, "Reviving Any-Subset Autoregressive Models with Principled Parallel
Sampling and Speculative Decoding", arXiv:2504.20456 (ICLR 2026 version: "Self-Speculative
Decoding Accelerates Lossless Inference in Any-Order and Any-Subset Autoregressive Models"):
Eq. 4 (decoding order), Fig. 1 / Eq. 6 (attention masks), Algorithm 1 (ASSD), Lemma 1,
Theorems 1-2, Appendix E.5 (Algorithm 2, Eq. 23: context n-gram drafter) and Appendix F.5
(epsilon tolerance). Method page: ``docs/methods/assd.md``.

**Variants** (:class:`jaxspec.asarm.config.AssdVariant`; one jitted ``lax.while_loop``, static
shapes, batch >= 1). The method names of :func:`assd_generate` map to them in one place,
:meth:`~jaxspec.asarm.config.AssdVariant.parse`:

* ``"sequential"`` (``sequential=True``; the reference, paper Sec. 3 "Sequential Sampling"):
  one forward per masked token, ``x_sigma(n) ~ p(. | x_sigma(<n))``; exactly ``N - m`` NFEs.
* ``"assd"`` (Algorithm 1), one iteration with ``t = min(n + k, N - m)`` (line 3): the draft
  pass (lines 4-12, :func:`jaxspec.asarm.passes.draft_pass`; a single speculated token is
  accepted unverified, Lemma 1), the density pass (lines 13-15,
  :func:`~jaxspec.asarm.passes.density_pass`), then for ``i = n, n+1, ...``: accept while
  ``r < min(1, q / p)`` (``r ~ U[0, 1)``); at the first rejection resample ``x_sigma(i)`` from
  ``(q(.) - p(.))_+`` (line 22; the normalised positive part) and stop; line 26: ``n <- i + 1``
  (:func:`verify`, :func:`commit`). No bonus token is drawn when every draft is accepted
  (Appendix A, Theorem 2 proof, point 3).

  By Lemma 1 the density row of ``sigma(n)`` equals the draft distribution (both condition on
  ``x_sigma(<n)`` only), so the first draft is always accepted. The verifier uses the draft
  pass's row for ``i = n`` (the same distribution; this keeps float rounding of two separate
  passes from ever rejecting it) and records the largest observed gap between the two rows
  in ``stats.extra["lemma1_max_gap"]``. Lossless (Theorem 2): the output distribution equals
  sequential decoding's; greedy output is identical to sequential greedy.
* ``"assd-ngram"`` (``drafter="ngram"``; Appendix E.5, Algorithm 2): lines 4-8 are replaced by
  the context bigram of Eq. 23 (:func:`jaxspec.asarm.passes.ngram_drafts`); there is no Lemma 1,
  so every iteration is verified (one AS-ARM forward, 1 to ``k`` tokens), except that an
  iteration whose first slot is position 0 takes an AS-ARM draft pass as ``"assd"`` does (the
  official code's rule; the pass counts as a target NFE). Lossless.
* ``"assd-fused"`` / ``"assd-fused-ngram"`` (``fused=True``; this library's extension): one
  AS-ARM call per iteration verifies the current drafts and drafts the next ones
  (:mod:`jaxspec.asarm.fused`). Lossless.

**Epsilon tolerance** (Appendix F.5, ``epsilon > 0``, sampling only): acceptance becomes
``r < min(1, q / p + epsilon)``. This is **not lossless** (the output distribution drifts from
sequential decoding's; ``epsilon >= 1`` accepts every draft = parallel sampling) and is marked
``stats.extra["lossless"] = False``.

**Cost and shapes.** Every pass is a content-stream forward over the ``S``-slot buffer (or,
with the content cache, over the rows it adds) plus ``K`` query slots (1 for sequential;
``(K + 1)^2`` for a fused call). Rows of a batch run in lockstep; a finished row idles.
Randomness: one key ``PRNGKey(seed)`` split once per iteration; every row and slot draws its own
numbers from it.

**Code layout.** :mod:`jaxspec.asarm.config` (the variant, the loop's statics and carry),
:mod:`jaxspec.asarm.inputs` (task padding, decoding order, attention orders, the query window),
:mod:`jaxspec.asarm.passes` (the AS-ARM forward, the draft phases, the density pass),
:mod:`jaxspec.asarm.fused` (the fused iteration), :mod:`jaxspec.asarm.result` (the result
record), and this module: :class:`Verdict`, :func:`verify` (lines 16-25, through
:mod:`jaxspec.core.verify`), :func:`commit` (line 26 and the counters), :func:`assd_step`,
:func:`step`, :func:`decode_loop` and the host wrapper :func:`assd_generate`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.asarm.config import CACHES, METHODS, AssdVariant, LoopConfig, State, init_state
from jaxspec.asarm.fused import fused_step
from jaxspec.asarm.inputs import Inputs, Window, masked_ranks, prepare_batch, query_window
from jaxspec.asarm.passes import Drafts, density_pass, draft_pass, ngram_drafts, prefill
from jaxspec.asarm.result import ASSDStats, InfillResult, assd_stats
from jaxspec.core.batching import place_batch
from jaxspec.core.runtime import run_compiled
from jaxspec.core.sampling import SamplingConfig, target_probs
from jaxspec.core.verify import verify_greedy, verify_sample
from models.xlnet.modeling import XLNetLM


# --------------------------------------------------------------------------- verification
@flax.struct.dataclass
class Verdict:
    """Outcome of verification (Alg. 1 lines 16-25) per row."""

    accepted: jax.Array  # int32 (B,): drafts accepted (all live ones when unverified)
    resampled: jax.Array  # bool (B,): a draft was rejected and its slot resampled (line 22)
    token: jax.Array  # int32 (B,): the resampled token (meaningless unless resampled)
    lemma1_max_gap: jax.Array  # float32 (): State.lemma1_max_gap, updated


def verify(
    cfg: LoopConfig,
    key: jax.Array,
    target_logits: jax.Array,
    drafts: Drafts,
    win: Window,
    gap: jax.Array,
    epsilon: jax.Array,
) -> Verdict:
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
    return Verdict(
        accepted=jnp.where(need, jnp.minimum(n_ok, win.live), win.live),  # line 20
        resampled=need & (n_ok < win.live),
        token=token,  # line 22
        lemma1_max_gap=gap,
    )


def unverified(win: Window, gap: jax.Array) -> Verdict:
    """Verdict of a sequential step: its one token is accepted as drawn."""
    z = jnp.zeros(win.live.shape, jnp.int32)
    return Verdict(accepted=win.live, resampled=z.astype(bool), token=z, lemma1_max_gap=gap)


def commit(
    cfg: LoopConfig, st: State, key: jax.Array, win: Window, drafts: Drafts, verdict: Verdict
) -> State:
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
        new, mode="drop"
    )
    produced = jnp.where(win.active, n_acc + verdict.resampled.astype(jnp.int32), 0)
    a32 = win.active.astype(jnp.int32)
    verified = (drafts.need_check & win.active).astype(jnp.int32)
    drafted = (drafts.lemma1 & win.active).astype(jnp.int32)  # AS-ARM draft passes
    bigram = a32 - drafted if cfg.variant.drafter == "ngram" else 0  # drafter calls
    hist = st.accept_hist.at[jnp.arange(B), jnp.clip(produced, 0, cfg.draft_slots + 1)].add(a32)
    return st.replace(
        tokens=tokens,
        decoded=st.decoded + produced,
        key=key,
        target_nfe=st.target_nfe + drafted + verified,
        draft_nfe=st.draft_nfe + bigram,
        steps=st.steps + a32,
        accept_hist=hist,
        drafts_proposed=st.drafts_proposed + verified * win.live,
        drafts_accepted=st.drafts_accepted + verified * n_acc,
        draft_passes=st.draft_passes + drafted,
        density_passes=st.density_passes + verified,
        lemma1_max_gap=verdict.lemma1_max_gap,
    )


# --------------------------------------------------------------------------- step and loop
def assd_step(cfg: LoopConfig, params, inp: Inputs, st: State) -> State:
    """One iteration of Algorithm 1 (self drafter), of Algorithm 1 with Algorithm 2's drafts
    (n-gram drafter), or of sequential decoding, for every row in lockstep."""
    win = query_window(cfg, inp, st.decoded)  # line 3
    key, k_draft, k_verify = jax.random.split(st.key, 3)
    if cfg.variant.drafter == "self":
        drafts, kv = draft_pass(cfg, params, inp, st, win, k_draft)  # lines 4-12
    else:
        drafts, kv = ngram_drafts(cfg, params, inp, st, win, k_draft)  # Algorithm 2
    st = st.replace(kv=kv)
    if cfg.variant.sequential:
        verdict = unverified(win, st.lemma1_max_gap)
    else:
        target_logits, kv = density_pass(cfg, params, inp, st, win, drafts)  # lines 13-15
        st = st.replace(kv=kv)
        verdict = verify(
            cfg, k_verify, target_logits, drafts, win, st.lemma1_max_gap, inp.epsilon
        )  # lines 16-25
    return commit(cfg, st, key, win, drafts, verdict)  # line 26


def step(cfg: LoopConfig, params, inp: Inputs, st: State) -> State:
    """One iteration of the loop's variant: :func:`jaxspec.asarm.fused.fused_step` for the
    fused variants, :func:`assd_step` otherwise."""
    return (fused_step if cfg.variant.fused else assd_step)(cfg, params, inp, st)


def decode_loop(
    params, inp: Inputs, tokens: jax.Array, key: jax.Array, *, cfg: LoopConfig
) -> State:
    """Run :func:`step` until every row has decoded all its masked slots (one
    ``lax.while_loop``). ``inp.k`` and ``inp.epsilon`` are traced, so one executable serves
    every ``k <= cfg.slots``.

    Args:
      params: the XLNet's parameters; inp: :class:`jaxspec.asarm.inputs.Inputs`; tokens: int32
        ``(B, S)`` (0 at the masked slots); key: PRNG key.

    Returns:
      The final :class:`jaxspec.asarm.config.State`.
    """
    st = init_state(cfg, tokens, key).replace(kv=prefill(cfg, params, inp, tokens))
    return jax.lax.while_loop(
        lambda s: jnp.any(s.decoded < inp.num_masked), lambda s: step(cfg, params, inp, s), st
    )


_decode_jit = jax.jit(decode_loop, static_argnames=("cfg",))


# --------------------------------------------------------------------------- host wrapper
def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_settings(variant: AssdVariant, k, slots, sampling, epsilon) -> int:
    """Validate :func:`assd_generate`'s decoding settings; returns ``slots`` (default ``k``).

    Raises:
      ValueError (one line): see :func:`assd_generate`.
    """
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
    if epsilon > 0 and (sampling.greedy or variant.sequential):
        raise ValueError("epsilon tolerance applies to ASSD sampling only (temperature > 0)")
    return slots


def _check_suppress(suppress, vocab_size: int) -> tuple:
    """``suppress`` as a sorted tuple of ids in ``[0, V)``.

    Raises:
      ValueError (one line): a non-integer id or one outside the vocabulary."""
    ids = []
    for t in suppress or ():
        if not _is_int(t) or not 0 <= int(t) < vocab_size:
            raise ValueError(
                f"suppressed token id {t!r} is not an id of the model vocabulary [0, {vocab_size})"
            )
        ids.append(int(t))
    return tuple(sorted(set(ids)))


def _loop_slots(variant: AssdVariant, k: int, slots: int, G: np.ndarray) -> tuple[int, int]:
    """``(k, slots)`` the loop runs with: ``(1, 1)`` for sequential decoding; else clamped to
    the most masked positions of any row, since ``t = min(n + k, N - m)`` (Algorithm 1 line 3)
    speculates no more (a huge ``k`` would otherwise allocate ``(B, k, V)`` logits for
    nothing)."""
    if variant.sequential:
        return 1, 1
    k, slots = int(k), int(slots)
    g_max = max(int(np.max(G)), 1)
    if slots > g_max:
        slots, k = g_max, min(k, g_max)
    return k, slots


def assd_generate(
    model: XLNetLM,
    params,
    tokens,
    masked,
    *,
    method: str = "assd",
    k: int = 5,
    sampling: SamplingConfig = SamplingConfig(),
    seed: int = 0,
    epsilon: float = 0.0,
    slots: Optional[int] = None,
    bucket: int = 16,
    max_len: Optional[int] = None,
    suppress: Sequence[int] = (),
    cache: str = "none",
) -> InfillResult:
    """Fill the masked positions of a batch with sequential decoding or ASSD (module docstring).

    Args:
      model, params: an :class:`models.xlnet.modeling.XLNetLM` and its parameters.
      tokens: ``B`` int sequences of model ids (lengths may differ; ids at masked positions are
        ignored).
      masked: ``B`` bool sequences, True at the positions to generate (any subset).
      method: one of :data:`~jaxspec.asarm.config.METHODS`: ``"sequential"`` (reference),
        ``"assd"`` (Algorithm 1), ``"assd-ngram"`` (Algorithm 2 drafts), ``"assd-fused"`` /
        ``"assd-fused-ngram"`` (one call per iteration, :mod:`jaxspec.asarm.fused`).
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
      :class:`~jaxspec.asarm.result.InfillResult`; ``stats.method`` is ``method``,
      ``reference`` ``"sequential"``, ``target_nfe`` the AS-ARM forwards (<= ``G_b`` for every
      method: Theorem 1), ``draft_length`` ``k`` (0 for sequential); ``extra`` has ``k``,
      ``epsilon``, ``lossless``, ``draft_passes``, ``density_passes`` (fused: calls),
      ``tokens_per_iteration``, ``lemma1_max_gap``, ``query_tokens_per_call`` (the extra cost
      of fusing), ``suppressed``, ``cache``.

    Raises:
      ValueError (one line): unknown method, ``k < 1``, ``slots < k``, ``epsilon < 0`` or
      ``epsilon > 0`` with greedy decoding or sequential, and every input error of
      :func:`~jaxspec.asarm.inputs.prepare_batch` (no masks, span past ``max_len``, shape
      mismatch, id outside the vocabulary), a suppressed id outside the vocabulary, an unknown
      cache.
    """
    variant = AssdVariant.parse(method)  # the one place a method name becomes a variant
    slots = _check_settings(variant, k, slots, sampling, epsilon)
    suppress = _check_suppress(suppress, model.config.vocab_size)
    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r}; expected one of {', '.join(CACHES)}")
    tok, vis, msk, lengths = prepare_batch(tokens, masked, model.config.vocab_size, bucket, max_len)
    rank, pos, G = masked_ranks(msk)
    k_run, slots = _loop_slots(variant, k, slots, G)
    vis_d, msk_d, rank_d, pos_d, G_d, tok_d = place_batch(
        params, vis, msk, rank, pos, np.asarray(G), tok
    )
    inp = Inputs(
        visible=vis_d,
        masked=msk_d,
        rank=rank_d,
        pos_of_rank=pos_d,
        num_masked=G_d,
        k=jnp.int32(k_run),
        epsilon=jnp.float32(epsilon),
    )
    cfg = LoopConfig(
        model=model, variant=variant, slots=slots, sampling=sampling, suppress=suppress, cache=cache
    )
    out, compile_s, run_s = run_compiled(
        _decode_jit, (params, inp, tok_d, jax.random.PRNGKey(seed)), dict(cfg=cfg)
    )
    st = jax.tree.map(np.asarray, out.replace(kv=None))
    rows = range(len(lengths))
    return InfillResult(
        sequences=[st.tokens[b, : lengths[b]].copy() for b in rows],
        infilled=[st.tokens[b][msk[b]].copy() for b in rows],
        stats=assd_stats(cfg, st, G, k_run, int(k), epsilon),
        compile_s=compile_s,
        run_s=run_s,
    )


__all__ = [
    "METHODS",
    "CACHES",
    "AssdVariant",
    "ASSDStats",
    "InfillResult",
    "Verdict",
    "verify",
    "unverified",
    "commit",
    "assd_step",
    "step",
    "decode_loop",
    "assd_generate",
]
