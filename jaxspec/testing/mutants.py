"""Plausible wrong variants ("mutants") of the chain verifier, and a test-only seam that
runs them inside the causal decode loop, for mutation-checked distribution tests:
the suite must reject every mutant that is not lossless and accept the real code.

Each mutant is the real rule of :func:`jaxspec.core.verify.verify_sample` with one knob of
:func:`verify_variant` turned: with no knob turned :func:`verify_variant` *is*
``verify_sample``, bit for bit (same keys, same draws). A knob may also describe an
*equivalent* variant (``Mutant.lossless``), a change that is still exact and that the
distribution tests must therefore accept (a specificity control).

The seam: :func:`inject_causal` replaces ``jaxspec.causal.decode.accept`` (the loop's
acceptance phase, looked up when the loop is traced) by :func:`causal_accept` of one mutant,
or of several run side by side on blocks of rows of one batch (one compile for all), and
clears the compile cache (:func:`jaxspec.core.runtime.clear_compiled`) on entry and on exit,
since a cached executable of the real program would otherwise be reused. Nothing in the
real code changes. :func:`inject_assd` does the same for ASSD's verifier call
(:func:`assd_verify_sample`).

Equivalent variants (:data:`EQUIVALENT`; lossless, so they are controls, not bugs): scoring
sampled drafts as point masses, and ignoring the adaptive draft length ``k_t`` when
accepting (drafts beyond ``k_t`` are still samples of their ``q``; only the NFE accounting
would change).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec.asarm.assd as assd_mod
import jaxspec.asarm.fused as assd_fused_mod
import jaxspec.causal.decode as causal_decode
from jaxspec.core.runtime import clear_compiled
from jaxspec.core.sampling import sample_from_probs, target_probs
from jaxspec.core.verify import accepted_prefix, verify_greedy, verify_sample

__all__ = [
    "Mutant",
    "MUTANTS",
    "EQUIVALENT",
    "verify_variant",
    "run_variants",
    "causal_accept",
    "patched",
    "inject_causal",
    "assd_verify_sample",
    "inject_assd",
    "DLLM_MUTANTS",
    "inject_dllm",
    "DFlashMutant",
    "DFLASH_MUTANTS",
    "DFLASH_EQUIVALENT",
    "inject_dflash",
]


def verify_variant(
    key: jax.Array,
    p: jax.Array,
    draft: jax.Array,
    q: Optional[jax.Array] = None,
    *,
    draft_len: Optional[jax.Array] = None,
    p_raw: Optional[jax.Array] = None,
    epsilon: float = 0.0,
    bonus_from_residual: bool = False,
    reject_from_p: bool = False,
    residual_from_raw: bool = False,
    shared_uniform: bool = False,
    reuse_uniform: bool = False,
    point_mass_q: bool = False,
    ignore_draft_len: bool = False,
):
    """``verify_sample`` with optional deliberate errors (shapes as there).

    Args:
      key, p, draft, q, draft_len, epsilon: as :func:`jaxspec.core.verify.verify_sample`.
      p_raw: float32 ``(B, k+1, V)`` the *unprocessed* target distribution (temperature 1,
        no top-k / top-p), needed by ``residual_from_raw``.
      bonus_from_residual: after all ``k_t`` drafts are accepted, draw the bonus from
        ``norm(max(p_{k_t} - q_{min(k_t, k-1)}, 0))`` instead of ``p_{k_t}``.
      reject_from_p: at the first rejection resample from ``p_n`` instead of the residual.
      residual_from_raw: the residual is ``max(p_raw_n - q_n, 0)`` while acceptance uses
        the processed ``p``.
      shared_uniform: one acceptance uniform per row, shared by all ``k`` drafts.
      reuse_uniform: the uniform that rejected draft ``n`` is reused to draw the residual
        token by inverse CDF (instead of fresh randomness).
      point_mass_q: score sampled drafts as point masses (ignore ``q``): still lossless.
      ignore_draft_len: verify all ``k`` drafts whatever ``draft_len`` says: still lossless
        (the drafts beyond ``k_t`` are samples of their ``q`` too).

    Returns: ``(n_accepted int32 (B,), next_token int32 (B,))``.
    """
    B, rows, V = p.shape
    k = draft.shape[1]
    if k == 0:  # a plain autoregressive step: nothing to get wrong
        return verify_sample(key, p, draft, q, draft_len=draft_len)
    if point_mass_q:
        q = None
    if ignore_draft_len:
        draft_len = None
    ku, kr = jax.random.split(key)
    px = jnp.take_along_axis(p[:, :k], draft[..., None], axis=-1)[..., 0]
    qx = (
        jnp.ones_like(px)
        if q is None
        else jnp.take_along_axis(q, draft[..., None], axis=-1)[..., 0]
    )
    r = jax.random.uniform(ku, (B, 1) if shared_uniform else (B, k))
    r = jnp.broadcast_to(r, (B, k))
    ok = r * qx < px + epsilon * qx
    if draft_len is not None:
        ok = ok & (jnp.arange(k)[None, :] < draft_len[:, None])
    n = accepted_prefix(ok)
    p_n = jnp.take_along_axis(p, jnp.minimum(n, rows - 1)[:, None, None], axis=1)[:, 0]
    src = p_raw if residual_from_raw else p
    src_n = jnp.take_along_axis(src, jnp.minimum(n, rows - 1)[:, None, None], axis=1)[:, 0]
    idx = jnp.minimum(n, k - 1)
    if q is None:
        q_n = jax.nn.one_hot(
            jnp.take_along_axis(draft, idx[:, None], axis=1)[:, 0], V, dtype=p.dtype
        )
    else:
        q_n = jnp.take_along_axis(q, idx[:, None, None], axis=1)[:, 0]
    resid = jnp.maximum(src_n - q_n, 0.0)
    k_t = k if draft_len is None else draft_len
    rejected = n < k_t
    use_resid = (rejected | bonus_from_residual) & (jnp.sum(resid, axis=-1) > 0)
    if reject_from_p:
        use_resid = jnp.zeros_like(use_resid)
    dist = jnp.where(use_resid[:, None], resid, p_n)
    nxt = sample_from_probs(kr, dist)
    if reuse_uniform:
        u = jnp.take_along_axis(r, idx[:, None], axis=1)[:, 0]
        cdf = jnp.cumsum(dist, axis=-1) / jnp.sum(dist, axis=-1, keepdims=True)
        inv = jnp.minimum(jnp.sum(cdf <= u[:, None], axis=-1), V - 1).astype(jnp.int32)
        nxt = jnp.where(rejected, inv, nxt)
    return n, nxt


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A named variant of the chain verifier.

    Attributes:
      name: short id (test ids, result tables).
      description: what is wrong (or, for an equivalent variant, what differs).
      knobs: keyword arguments of :func:`verify_variant`, as ``((name, value), ...)``.
      lossless: True for an equivalent variant the tests must accept.
      needs_processing: the variant differs from the real rule only when the sampling
        config processes logits (temperature != 1, top-k or top-p).
      needs_raw: the variant needs the unprocessed distribution (not every seam has it).
    """

    name: str
    description: str
    knobs: tuple = ()
    lossless: bool = False
    needs_processing: bool = False
    needs_raw: bool = False


MUTANTS = (
    Mutant(
        "bonus-from-residual",
        "bonus token from norm(max(p_k - q, 0)) instead of p_k",
        (("bonus_from_residual", True),),
    ),
    Mutant(
        "reject-from-p",
        "on rejection resample from p instead of the residual",
        (("reject_from_p", True),),
    ),
    Mutant(
        "residual-unprocessed",
        "residual from the unprocessed softmax(logits) (T=1, no "
        "top-k/top-p); acceptance uses the processed p",
        (("residual_from_raw", True),),
        needs_processing=True,
        needs_raw=True,
    ),
    Mutant(
        "epsilon-0.5", "ASSD F.5 tolerance: accept when r < min(1, p/q + 0.5)", (("epsilon", 0.5),)
    ),
    Mutant(
        "shared-uniform",
        "one acceptance uniform per row for all k drafts",
        (("shared_uniform", True),),
    ),
    Mutant(
        "reused-uniform",
        "the rejecting uniform reused (inverse CDF) for the residual draw",
        (("reuse_uniform", True),),
    ),
)
"""The mutants every sampled chain method's distribution tests must reject."""

EQUIVALENT = (
    Mutant(
        "point-mass-q",
        "sampled drafts scored as point masses (q ignored): accepted with "
        "p(x), residual p without x; still exact",
        (("point_mass_q", True),),
        lossless=True,
    ),
    Mutant(
        "ignore-draft-len",
        "all k drafts verified whatever the adaptive k_t (drafts beyond "
        "k_t are samples of their q too); still exact",
        (("ignore_draft_len", True),),
        lossless=True,
    ),
)
"""Variants that are still lossless: the distribution tests must accept them."""


def _as_tuple(mutants, rows_per: Optional[int]) -> tuple:
    if mutants is None or isinstance(mutants, (Mutant, DFlashMutant)):
        mutants = (mutants,)
    mutants = tuple(mutants)
    if len(mutants) > 1 and not rows_per:
        raise ValueError("rows_per is needed to run several mutants in one batch")
    return mutants


def run_variants(
    mutants: tuple,
    rows_per: Optional[int],
    key,
    p,
    draft,
    q,
    *,
    draft_len=None,
    p_raw=None,
    epsilon=0.0,
):
    """:func:`verify_variant` of each mutant on its block of rows: rows ``[j * rows_per,
    (j + 1) * rows_per)`` run ``mutants[j]`` with key ``fold_in(key, j)`` (the last block
    takes any remaining rows; a single mutant runs on all rows with ``key``). Rows of the chain
    loops are independent, so each block is a run of its own mutant."""
    knobs = lambda m: dict(m.knobs) if m is not None else {}  # noqa: E731
    if len(mutants) == 1:
        return verify_variant(
            key, p, draft, q, draft_len=draft_len, p_raw=p_raw, epsilon=epsilon, **knobs(mutants[0])
        )
    B = p.shape[0]
    ns, nxts = [], []
    for j, m in enumerate(mutants):  # static row blocks
        a, b = j * rows_per, (B if j == len(mutants) - 1 else (j + 1) * rows_per)
        rows = slice(min(a, B), min(b, B))
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        kw = {"epsilon": epsilon, **knobs(m)}
        n, nxt = verify_variant(
            jax.random.fold_in(key, j),
            p[rows],
            draft[rows],
            pick(q),
            draft_len=pick(draft_len),
            p_raw=pick(p_raw),
            **kw,
        )
        ns.append(n)
        nxts.append(nxt)
    return jnp.concatenate(ns), jnp.concatenate(nxts)


def causal_accept(mutants, rows_per: Optional[int] = None):
    """A drop-in for ``jaxspec.causal.decode.accept(cfg, key, logits, draft)`` that runs
    mutated verifiers (greedy decoding is left as it is).

    Args:
      mutants: one :class:`Mutant` (``None``: :func:`verify_variant` with no knob, the real
        rule), or a sequence of them for one compiled program serving all, each on its own
        block of ``rows_per`` rows (:func:`run_variants`).
      rows_per: rows per mutant block (needed for a sequence of more than one).
    """
    mutants = _as_tuple(mutants, rows_per)

    def accept(cfg, key, logits, draft):
        length = draft.length if draft.tokens.shape[1] > 0 else None
        if cfg.sampling.greedy:
            return verify_greedy(logits, draft.tokens, draft_len=length)
        p = target_probs(logits, cfg.sampling)
        p_raw = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        return run_variants(
            mutants, rows_per, key, p, draft.tokens, draft.q, draft_len=length, p_raw=p_raw
        )

    return accept


def assd_verify_sample(mutants, rows_per: Optional[int] = None):
    """A drop-in for ``verify_sample`` as :func:`jaxspec.asarm.assd.verify` (``(key, p, draft,
    q, *, epsilon)``, no bonus row) and :func:`jaxspec.asarm.fused.fused_verify` (with
    ``draft_len``) call it, running mutated verifiers on row blocks (:func:`run_variants`). The
    unprocessed distribution is not at hand there, so mutants that need it (``needs_raw``)
    cannot run through this seam."""
    mutants = _as_tuple(mutants, rows_per)
    if any(m is not None and m.needs_raw for m in mutants):
        raise ValueError("the ASSD seam has no unprocessed distribution for needs_raw mutants")

    def verify_sample(key, p, draft, q=None, *, epsilon=0.0, draft_len=None):
        return run_variants(
            mutants, rows_per, key, p, draft, q, draft_len=draft_len, epsilon=epsilon
        )

    return verify_sample


@contextlib.contextmanager
def patched(*patches):
    """Replace module attributes ``(module, name, value)`` inside the ``with`` block: the
    compile cache (:func:`jaxspec.core.runtime.clear_compiled`) is cleared on entry and exit,
    since a cached executable of the real program would otherwise be reused, and the real
    attributes are restored even on error. Test-only; not thread-safe."""
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    clear_compiled()
    for mod, name, value in patches:
        setattr(mod, name, value)
    try:
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)
        clear_compiled()


def inject_causal(mutants, rows_per: Optional[int] = None):
    """Run the causal decode loop (:mod:`jaxspec.causal.decode`) with mutated verifiers
    (:func:`causal_accept`'s arguments) inside the ``with`` block (:func:`patched`)."""
    return patched((causal_decode, "accept", causal_accept(mutants, rows_per)))


def inject_assd(mutants, rows_per: Optional[int] = None):
    """Run ASSD (:mod:`jaxspec.asarm.assd`, :mod:`jaxspec.asarm.fused`) with mutated verifiers
    (:func:`assd_verify_sample`) inside the ``with`` block (:func:`patched`)."""
    sample = assd_verify_sample(mutants, rows_per)
    return patched((assd_mod, "verify_sample", sample), (assd_fused_mod, "verify_sample", sample))


# ----------------------------------------------------------------------------- dLLM mutants
# SSD and Spiffy replay their reference's sample path (same tokens, same transfer order, same
# random numbers for a seed), so a wrong verifier shows up as a different path, and as a
# different distribution. Two plausible bugs per method, injected by replacing one phase:

DLLM_MUTANTS = ("root-logits", "shared-row-noise")
"""``root-logits``: every node (SSD) / every walk step (Spiffy) is scored with the root
node's logits instead of its own state's. ``shared-row-noise``: every batch row uses row 0's
random numbers (rows sharing randomness)."""


def _root_rows(rows: jax.Array) -> jax.Array:
    return jnp.broadcast_to(rows[:, :1], rows.shape)


def _row0_noise(real_row_noise):
    return lambda key, row, step, *a, **kw: real_row_noise(key, 0 * row, step, *a, **kw)


@contextlib.contextmanager
def inject_dllm(method: str, mutant: str):
    """Run SSD (``method="ssd"``) or Spiffy (``"spiffy"``) with one :data:`DLLM_MUTANTS` bug
    inside the ``with`` block; the reference decoder (:mod:`jaxspec.dllm.decode`) is left
    real. Compile cache cleared on entry and exit, real phases restored even on error.
    Test-only; not thread-safe."""
    import jaxspec.dllm.reference as reference
    import jaxspec.dllm.spiffy.decode as spiffy_mod
    import jaxspec.dllm.ssd as ssd_mod

    if method not in ("ssd", "spiffy") or mutant not in DLLM_MUTANTS:
        raise ValueError(f"unknown dLLM method/mutant {method!r}/{mutant!r}")
    patches = []
    if method == "ssd" and mutant == "root-logits":
        real = ssd_mod.node_steps
        patches.append(
            (
                ssd_mod,
                "node_steps",
                lambda loop, rows, nmask, steps: real(loop, _root_rows(rows), nmask, steps),
            )
        )
    elif method == "ssd":
        patches.append((ssd_mod, "row_noise", _row0_noise(reference.row_noise)))
    elif mutant == "root-logits":
        real = spiffy_mod.walk_step
        patches.append(
            (
                spiffy_mod,
                "walk_step",
                lambda loop, st, rows, nodes, dd, w: real(loop, st, _root_rows(rows), nodes, dd, w),
            )
        )
    else:
        real_step = reference.reference_step

        def shared(rule, blk, bmask, key, steps, sib):
            # every row draws the numbers row 0 would draw at that row's step
            saved = reference.step_noise
            reference.step_noise = lambda k, st, L, V, t: jax.vmap(
                lambda s: reference.row_noise(k, 0, s, L, V, t)
            )(st)
            try:
                return real_step(rule, blk, bmask, key, steps, sib)
            finally:
                reference.step_noise = saved

        patches.append((spiffy_mod, "reference_step", shared))
    with patched(*patches):
        yield


# ----------------------------------------------------------------------------- DFlash mutants
# Plausible bugs of the DFlash path (jaxspec.causal.dflash and the target's hidden-state pass),
# injected by swapping one phase of the decode loop. A drafter is lossless whatever its weights
# as long as every draft d_i is drawn from the q_i the verifier gets, independently, before the
# verifier's uniforms, and the target's logits are untouched (Leviathan et al. 2023, Thm 3.5):
# bugs that break that are *not* lossless and the exactness tests must reject them; bugs that
# only make the drafts worse (wrong block positions, a stale feature in the context, a dropped
# bonus token) are still exact, so the exactness tests must accept them, and other checks
# catch them (tests/causal/test_mutants.py: train/decode parity, the acceptance histogram).


@dataclasses.dataclass(frozen=True)
class DFlashMutant:
    """A named variant of one phase of the DFlash decode path.

    Attributes:
      name: short id; description: what is wrong.
      phase: the swapped phase: ``"frame"`` (:func:`jaxspec.causal.dflash.block_frame`),
        ``"draw"`` (:func:`jaxspec.causal.dflash.draw_drafts`), ``"target"``
        (:func:`jaxspec.causal.decode.model_pass` of a pass that returns hidden states) or
        ``"accept"`` (:func:`jaxspec.causal.decode.accept`).
      lossless: True when the variant is still exact (a control the exactness tests must
        accept); greedy_visible: the variant changes greedy output (greedy identity rejects
        it); needs_processing: it differs from the real code only when the sampling config
        processes logits.
    """

    name: str
    description: str
    phase: str
    lossless: bool = False
    greedy_visible: bool = False
    needs_processing: bool = False


DFLASH_MUTANTS = (
    DFlashMutant(
        "q-unprocessed",
        "drafts drawn from the processed q, but the verifier gets softmax(logits) "
        "(T=1, no top-k/top-p)",
        "draw",
        needs_processing=True,
    ),
    DFlashMutant(
        "q-off-by-one",
        "the verifier gets, for draft i, the q of block row i - 1 (draft 0 its own): "
        "each q one row off the row its draft was drawn from",
        "draw",
    ),
    DFlashMutant(
        "argmax-drafts",
        "drafts are the argmax of q while the verifier is told they were drawn from q",
        "draw",
    ),
    DFlashMutant(
        "shared-draft-uniform",
        "all drafts of a block drawn by inverse CDF from one uniform (not independent)",
        "draw",
    ),
    DFlashMutant(
        "early-exit-logits",
        "a target pass that returns hidden states takes its logits from the last "
        "feature layer instead of the last layer",
        "target",
        greedy_visible=True,
    ),
)
"""DFlash-path mutants that are not lossless: the exact-distribution test must reject each
(``greedy_visible`` ones also the greedy-identity test)."""

DFLASH_EQUIVALENT = (
    DFlashMutant(
        "block-positions+1",
        "the block's RoPE positions start one past the anchor's (worse drafts; still exact)",
        "frame",
        lossless=True,
    ),
    DFlashMutant(
        "stale-anchor-feature",
        "the context also holds the anchor's slot, a stale or empty feature (worse "
        "drafts; still exact)",
        "frame",
        lossless=True,
    ),
    DFlashMutant(
        "no-bonus",
        "when every draft is accepted the last draft is committed as the next token and "
        "no bonus is drawn (fewer tokens per step; still exact)",
        "accept",
        lossless=True,
    ),
)
"""DFlash-path variants that are still exact: the exactness tests must accept them."""


def _block_rows(j: int, n: int, rows_per: int, B: int) -> jax.Array:
    """bool ``(B,)``: the rows of mutant ``j`` of ``n`` (:func:`run_variants`' blocks)."""
    r = jnp.arange(B)
    hi = B if j == n - 1 else (j + 1) * rows_per
    return (r >= j * rows_per) & (r < hi)


def _pick(rows: jax.Array, new, old):
    """Rows ``rows`` of every leaf from ``new``, the others from ``old`` (leading axis B)."""
    return jax.tree.map(
        lambda a, b: jnp.where(rows.reshape(rows.shape + (1,) * (a.ndim - 1)), a, b), new, old
    )


def _frame_variant(name, real):
    def frame(ctx, block_size):
        anchor, pos, ctx_mask = real(ctx, block_size)
        if name == "block-positions+1":
            return anchor, pos + 1, ctx_mask
        slot = jnp.arange(ctx.buffer.shape[1])[None]  # stale-anchor-feature
        return anchor, pos, ctx_mask | (slot == (ctx.length - 1)[:, None])

    return frame


def _draw_variant(name, real):
    def draw(key, logits, sampling, sample):
        tokens, q = real(key, logits, sampling, sample)
        if not sample:
            return tokens, q
        if name == "q-unprocessed":
            return tokens, jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        if name == "q-off-by-one":
            return tokens, jnp.concatenate([q[:, :1], q[:, :-1]], axis=1)
        if name == "argmax-drafts":
            return jnp.argmax(q, axis=-1).astype(jnp.int32), q
        # shared-draft-uniform: d_i = F_i^{-1}(u), one u per row
        u = jax.random.uniform(key, q.shape[:1] + (1, 1))
        cdf = jnp.cumsum(q, axis=-1) / jnp.sum(q, axis=-1, keepdims=True)
        inv = jnp.sum(cdf <= u, axis=-1)
        return jnp.minimum(inv, q.shape[-1] - 1).astype(jnp.int32), q

    return draw


def _early_exit_pass(real):
    from models.llama.modeling import lm_logits, rms_norm

    def model_pass(model, params, feed, slot, pad, cache, S, last_rows=None, hidden_layers=()):
        out = real(model, params, feed, slot, pad, cache, S, last_rows, hidden_layers)
        if not hidden_layers:
            return out
        logits, new_cache, hidden = out
        h = hidden[:, :, int(np.argmax(hidden_layers))]  # the deepest feature layer
        if last_rows is not None:
            h = h[:, h.shape[1] - last_rows :]
        h = rms_norm(h, params["final_norm"], model.config.rms_norm_eps)
        return lm_logits(h, params["embed"], params.get("lm_head")), new_cache, hidden

    return model_pass


def _no_bonus_accept(real):
    def accept(cfg, key, logits, draft):
        n, nxt = real(cfg, key, logits, draft)
        k = draft.tokens.shape[1]
        if k == 0:
            return n, nxt
        full = n >= draft.length
        last = jnp.take_along_axis(draft.tokens, jnp.maximum(n - 1, 0)[:, None], axis=1)[:, 0]
        return jnp.where(full, n - 1, n), jnp.where(full, last, nxt)

    return accept


def inject_dflash(mutants, rows_per: Optional[int] = None):
    """Run the DFlash decode path with :data:`DFLASH_MUTANTS` / :data:`DFLASH_EQUIVALENT`
    variants inside the ``with`` block (:func:`patched`): one variant on every row, or several
    side by side, variant ``j`` on rows ``[j * rows_per, (j + 1) * rows_per)`` (the last
    takes any remaining rows; ``None`` in the sequence: the real code on its block). Every
    swapped phase runs the real phase first and replaces the rows of its variants, so rows of
    other variants see the real code. Test-only; not thread-safe."""
    import jaxspec.causal.dflash as dflash_mod

    mutants = _as_tuple(mutants, rows_per)
    n = len(mutants)
    real = {
        "frame": dflash_mod.block_frame,
        "draw": dflash_mod.draw_drafts,
        "target": causal_decode.model_pass,
        "accept": causal_decode.accept,
    }
    build = {
        "frame": _frame_variant,
        "draw": _draw_variant,
        "target": lambda name, f: _early_exit_pass(f),
        "accept": lambda name, f: _no_bonus_accept(f),
    }

    def dispatch(phase, batch_of):
        variants = [
            (j, build[phase](m.name, real[phase]))
            for j, m in enumerate(mutants)
            if m is not None and m.phase == phase
        ]

        def run(*args, **kw):
            out = real[phase](*args, **kw)
            B = batch_of(*args)
            for j, f in variants:
                rows = _block_rows(j, n, rows_per or B, B)
                new = f(*args, **kw)
                if phase == "target":  # only the logits differ (the cache's axis 0 is layers)
                    out = (_pick(rows, new[0], out[0]),) + tuple(out[1:])
                else:
                    out = _pick(rows, new, out)
            return out

        return run if variants else real[phase]

    return patched(
        (dflash_mod, "block_frame", dispatch("frame", lambda ctx, *a: ctx.buffer.shape[0])),
        (dflash_mod, "draw_drafts", dispatch("draw", lambda key, logits, *a: logits.shape[0])),
        (causal_decode, "model_pass", dispatch("target", lambda m, p, feed, *a: feed.shape[0])),
        (causal_decode, "accept", dispatch("accept", lambda cfg, key, lg, *a: lg.shape[0])),
    )
