"""Fused ASSD (``"assd-fused"``, ``"assd-fused-ngram"``; :mod:`jaxspec.asarm.fused`) and the
official n-gram fallback, position 0 drafted by the AS-ARM and token suppression, on tiny random
XLNet AS-ARMs.

* The attention construction: every fused query equals the same query of separate passes
  (density pass over the drafts; a parallel-sampling pass after accepting ``d_1..d_j``).
* Theorem 1 (NFE <= N - m) and exact token accounting on random tasks for every k.
* Greedy output identical to sequential greedy (also with suppressed ids).
* Sampled output vs the exactly enumerated sequential joint: the 3-masked vocab-5 task of
  ``test_assd.py`` and a 5-masked vocab-3 task where drafts of groups ``j >= 1`` reach the
  verifier; with token suppression against the suppressed joint. Rejected: drafts drawn from
  another distribution than their q, and every verifier mutant (the fused loop has a bonus row
  and a traced draft length, so bonus-from-residual and ignore-draft-len are real bugs here).
  Accepted: groups that also see the draft they may resample (any proposal is exact).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec.asarm.fused as fused_mod
from jaxspec.asarm.assd import assd_generate
from jaxspec.asarm.config import AssdVariant, LoopConfig, init_state
from jaxspec.asarm.fused import fused_pass
from jaxspec.asarm.inputs import (
    Inputs,
    density_order,
    draft_order,
    masked_ranks,
    prepare_batch,
    query_window,
)
from jaxspec.asarm.passes import conditionals
from jaxspec.core.sampling import SamplingConfig, target_probs
from jaxspec.testing.distribution import check_distribution
from jaxspec.testing.mutants import EQUIVALENT, MUTANTS, inject_assd, patched
from jaxspec.testing.tiny import tiny_xlnet
from models.xlnet.modeling import density_masks
from tests.asarm.test_assd import MASK5, PROMPT5, S5, _check_stats, _tasks, exact_sequential_joint

V = 11
FUSED = ("assd-fused", "assd-fused-ngram")
R = 10_000
_model = functools.lru_cache(maxsize=None)(tiny_xlnet)


# ----------------------------------------------------------------------------- attention masks
def test_fused_queries_equal_separate_passes():
    """On random states (decoded count n, L live drafts), the fused call's density queries equal
    a density pass over the drafts, and group j's queries equal a parallel-sampling pass
    (Fig. 1a) run after accepting d_1..d_j, for every j <= L; group j differs from group j+1
    (the comparison has teeth)."""
    model, params = _model()
    K = 4
    toks, masks = _tasks(11, 12, lo=12)
    tok, vis, msk, _ = prepare_batch(toks, masks, V)
    rank, pos, G = masked_ranks(msk)
    rng = np.random.default_rng(5)
    n = np.array([rng.integers(0, max(g - 2, 1)) for g in G], np.int32)
    inp = Inputs(
        visible=jnp.asarray(vis),
        masked=jnp.asarray(msk),
        rank=jnp.asarray(rank),
        pos_of_rank=jnp.asarray(pos),
        num_masked=jnp.asarray(G),
        k=jnp.int32(K),
        epsilon=jnp.float32(0),
    )
    cfg = LoopConfig(
        model=model, variant=AssdVariant(fused=True), slots=K, sampling=SamplingConfig(1.0)
    )
    decoded_tok = np.where(msk & (rank < n[:, None]), rng.integers(0, V, tok.shape), tok)
    st = init_state(cfg, jnp.asarray(decoded_tok, jnp.int32), jax.random.PRNGKey(0)).replace(
        decoded=jnp.asarray(n)
    )
    win = query_window(cfg, inp, st.decoded)
    drafts = jnp.asarray(rng.integers(0, V, (len(G), K)), jnp.int32)
    live = win.live
    target, groups, _ = jax.jit(lambda: fused_pass(cfg, params, inp, st, win, drafts, live))()
    target, groups = np.asarray(target), np.asarray(groups)
    B = len(G)
    full = np.array(decoded_tok)
    for b in range(B):
        for i in range(int(live[b])):
            full[b, pos[b, n[b] + i]] = int(drafts[b, i])
    at = lambda r: np.array(
        [[pos[b, min(r[b] + o, G[b] - 1)] for o in range(K + 1)] for b in range(B)], np.int32
    )
    dens = np.asarray(conditionals(model, params, full, vis, density_order(rank, n + live), at(n)))
    checked = 0
    for b in range(B):
        for i in range(int(live[b]) + 1):
            if n[b] + i < G[b]:
                np.testing.assert_allclose(target[b, i], dens[b, i], atol=2e-4)
    for j in range(K + 1):
        sep = np.asarray(
            conditionals(
                model,
                params,
                full,
                vis,
                draft_order(rank, jnp.asarray(n + j)),
                at(n + j + 1)[:, :K],
            )
        )
        for b in range(B):
            if j > int(live[b]):
                continue
            for r in range(K):
                if n[b] + j + 1 + r < G[b]:
                    np.testing.assert_allclose(groups[b, j, r], sep[b, r], atol=2e-4)
                    checked += 1
    assert checked > 40, checked
    assert np.abs(groups[:, 0, 1:] - groups[:, 1, :-1]).max() > 1e-2


# ----------------------------------------------------------------------------- Theorem 1, identity
@pytest.mark.parametrize("method", FUSED)
def test_theorem1_nfe_bound_and_accounting(method):
    """k = 1..6 (one executable with 6 slots), 32 random tasks each, sampled at T = 1: every
    row's NFE <= N - m, every token accounted for, one call per iteration; fused ASSD saves
    forwards at every k >= 1 (k = 1 and 2 can never save any in Algorithm 1)."""
    model, params = _model()
    for k in range(1, 7):
        toks, masks = _tasks(300 + k, 32)
        r = assd_generate(
            model,
            params,
            toks,
            masks,
            method=method,
            k=k,
            slots=6,
            sampling=SamplingConfig(1.0),
            seed=k,
        )
        _check_stats(r, masks, k, method)
        np.testing.assert_array_equal(r.stats.target_nfe, r.stats.steps)
        assert r.stats.extra["draft_passes"] == 0
        G = np.array([int(m.sum()) for m in masks])
        assert r.stats.target_nfe.sum() < G.sum(), (k, r.stats.target_nfe.sum(), G.sum())
        for seq, inf, t, m in zip(r.sequences, r.infilled, toks, masks):
            np.testing.assert_array_equal(seq[~m], t[~m])
            np.testing.assert_array_equal(seq[m], inf)


# assd-fused-ngram's greedy identity runs in make test-all; make test keeps its exact
# distribution tests below (the same queries, sampled)
@pytest.mark.parametrize(
    "method", [m if m == "assd-fused" else pytest.param(m, marks=pytest.mark.slow) for m in FUSED]
)
def test_greedy_identical_to_sequential(method):
    """k = 1, 3 and 8 (k = 1 has one draft group, 8 runs past most spans; the sampled
    Theorem 1 test covers k = 1..6), also with two suppressed ids, on a model with varied
    greedy infills."""
    model, params = _model(V, 3, 8.0)
    toks, masks = _tasks(21, 24)
    ref = assd_generate(model, params, toks, masks, method="sequential")
    assert len(np.unique(np.concatenate(ref.infilled))) >= 6
    ref_s = assd_generate(model, params, toks, masks, method="sequential", suppress=[3, 7])
    assert any((a != b).any() for a, b in zip(ref.infilled, ref_s.infilled))
    for k in (1, 3, 8):
        r = assd_generate(model, params, toks, masks, method=method, k=k)
        for a, b in zip(r.infilled, ref.infilled):
            np.testing.assert_array_equal(a, b)
        r = assd_generate(model, params, toks, masks, method=method, k=k, suppress=[3, 7])
        for a, b in zip(r.infilled, ref_s.infilled):
            np.testing.assert_array_equal(a, b)
            assert not np.isin(a, [3, 7]).any()


def test_suppress_errors():
    model, params = _model()
    with pytest.raises(ValueError, match="suppressed token id 11"):
        assd_generate(model, params, [[1, 2]], [[0, 1]], suppress=[11])


# ----------------------------------------------------------------------------- distribution
V3 = 3
PROMPT3 = [2, 0, 0, 0, 1, 0, 0]  # 5 masked positions: groups j >= 1 reach the verifier
MASK3 = [False, True, True, True, False, True, True]
S3 = SamplingConfig(1.0)


@functools.lru_cache(maxsize=None)
def exact_joint(vocab, prompt, mask, sampling, suppress=()) -> dict:
    """Exact joint of sequential decoding (Eq. 2) of ``tiny_xlnet(vocab, 2, 5.0)`` under
    ``sampling`` with ``suppress``ed ids at -inf: one teacher-forced density pass per outcome."""
    model, params = _model(vocab, 2, 5.0)
    msk = np.flatnonzero(mask)
    seqs = np.array([prompt] * vocab ** len(msk), np.int32)
    seqs[:, msk] = np.array(list(itertools.product(range(vocab), repeat=len(msk))))
    vis = np.broadcast_to(~np.array(mask), seqs.shape)
    cm, qm = density_masks(vis)
    lg, _ = model.apply(params, seqs, cm, qm)
    if suppress:
        lg = lg.at[..., jnp.asarray(suppress)].set(-jnp.inf)
    pr = np.asarray(target_probs(lg, sampling), np.float64)
    joint = np.prod([pr[np.arange(len(seqs)), i, seqs[:, i]] for i in msk], axis=0)
    return {tuple(s[msk]): float(p) for s, p in zip(seqs, joint) if p > 0}


def _samples(vocab, prompt, mask, sampling, method, k, seed, rows=R, suppress=()):
    model, params = _model(vocab, 2, 5.0)
    r = assd_generate(
        model,
        params,
        [list(prompt)] * rows,
        [list(mask)] * rows,
        method=method,
        k=k,
        sampling=sampling,
        seed=seed,
        bucket=8,
        suppress=suppress,
    )
    return np.stack(r.infilled), r.stats


@pytest.mark.parametrize("method", FUSED)
def test_distribution_equals_sequential_joint_vocab5(method):
    """The 3-masked vocab-5 task (T 0.9, top-4) of test_assd.py: 10^4 samples match the exact
    sequential joint; drafts were both accepted and rejected."""
    x, st = _samples(5, PROMPT5, MASK5, S5, method, 3, seed=3)
    chk = check_distribution(x, exact_sequential_joint())
    assert chk.passed, chk.why
    assert 0.05 < st.acceptance_rate < 0.98 and (st.target_nfe <= 3).all()


@pytest.mark.parametrize(
    "method,k", [("assd-fused", 2), ("assd-fused", 4), ("assd-fused-ngram", 3)]
)
def test_distribution_equals_sequential_joint_five_masked(method, k):
    """5 masked positions, vocab 3, T = 1: 10^4 samples vs the exact joint (243 outcomes), with
    calls that accept 1..k drafts (so drafts of groups j >= 1 are verified)."""
    joint = exact_joint(V3, tuple(PROMPT3), tuple(MASK3), S3)
    x, st = _samples(V3, PROMPT3, MASK3, S3, method, k, seed=7 + k)
    chk = check_distribution(x, joint)
    assert chk.passed, chk.why
    hist = st.accept_hist.sum(0)
    assert hist[2:].sum() > 0.05 * hist.sum(), hist  # multi-token calls happened
    assert st.target_nfe.mean() < 4.5


def test_distribution_with_suppression():
    """Suppressing id 4 changes the target for drafts and verification alike: fused ASSD's
    samples match the exact joint of sequential decoding with the same suppression."""
    joint = exact_joint(5, tuple(PROMPT5), tuple(MASK5), S5, (4,))
    x, _ = _samples(5, PROMPT5, MASK5, S5, "assd-fused", 3, seed=2, suppress=(4,))
    assert not (x == 4).any()
    chk = check_distribution(x, joint)
    assert chk.passed, chk.why


def _leaky_fused_queries(cfg, inp, decoded):
    """Group j also attends to rank n + j, i.e. to the draft d_{j+1} that this call may reject.
    Still exact: a proposal may depend on anything drawn before the verification's uniforms, as
    long as its q is the distribution it was drawn from (module docstring's argument)."""
    pos, cond = _real_fused_queries(cfg, inp, decoded)
    return pos, cond.at[:, cfg.draft_slots + 1 :].add(1)


def _draw_raw(cfg, key, logits):
    """A plausible bug: drafts sampled from the raw softmax (T = 1, no top-k) while q is the
    processed distribution the verifier divides by."""
    tokens, q = _real_draw(cfg, key, logits)
    if q is None:
        return tokens, q
    return jax.random.categorical(key, logits).astype(jnp.int32), q


_real_fused_queries, _real_draw = fused_mod.fused_queries, fused_mod.draw


def test_any_conditioning_of_the_groups_stays_exact():
    """The leaky variant (:func:`_leaky_fused_queries`) matches the exact joint too: fused
    ASSD's exactness does not hinge on which tokens a group sees, only on q being right."""
    joint = exact_joint(V3, tuple(PROMPT3), tuple(MASK3), S3)
    with patched((fused_mod, "fused_queries", _leaky_fused_queries)):
        x, _ = _samples(V3, PROMPT3, MASK3, S3, "assd-fused", 2, seed=9)
    chk = check_distribution(x, joint)
    assert chk.passed, chk.why


def test_negative_control_drafts_not_from_q_rejected():
    """Drafts drawn from another distribution than the q they are verified with
    (:func:`_draw_raw`; T 0.9, top-4 task) must fail the same distribution test."""
    with patched((fused_mod, "draw", _draw_raw)):
        x, _ = _samples(5, PROMPT5, MASK5, S5, "assd-fused", 3, seed=10)
    chk = check_distribution(x, exact_sequential_joint())
    assert not chk.passed and chk.p_value < 1e-6, chk.why


@functools.lru_cache(maxsize=None)
def fused_variant_checks(method):
    """Every verifier variant on its own block of 10^4 rows of the 5-masked task, for one fused
    method (one compile, :func:`jaxspec.testing.mutants.inject_assd`). Cached per method, not a
    module fixture: each xdist worker then computes only the methods of the tests it runs."""
    joint = exact_joint(V3, tuple(PROMPT3), tuple(MASK3), S3)
    variants = tuple(m for m in MUTANTS + EQUIVALENT if not m.needs_raw)
    with inject_assd(variants, rows_per=R):
        x, _ = _samples(V3, PROMPT3, MASK3, S3, method, 3, seed=12, rows=R * len(variants))
    return {
        m.name: check_distribution(x[j * R : (j + 1) * R], joint) for j, m in enumerate(variants)
    }, variants


# the fused loop's draft slots past L hold no sample of their q (zeros on the first call,
# ranks past the end later), so verifying them is a bug here, unlike in the causal loop
_FUSED_BUGS = ("ignore-draft-len",)


# the fused mutant suites (40-70 s of CPU each) run in make test-all; make test keeps the fused
# loops' distribution tests and negative control
@pytest.mark.slow
@pytest.mark.parametrize("method", FUSED)
def test_fused_mutants_rejected_and_equivalents_accepted(method):
    """Mutation check for the fused loops: every wrong verifier is rejected, the
    still-exact variants are accepted."""
    checks, variants = fused_variant_checks(method)
    for m in variants:
        chk = checks[m.name]
        exact = m.lossless and m.name not in _FUSED_BUGS
        print(f"{method}/{m.name}: {chk.why}")
        assert chk.passed == exact, f"{method}/{m.name}: {chk.why}"


# ----------------------------------------------------------------------------- content KV cache
ALL = ("sequential", "assd", "assd-ngram", "assd-fused", "assd-fused-ngram")


# k = 1 and a longer k for the fused loops, whose groups depend on k (k = 1 in `make test-all`)
_CACHE_CASES = [
    pytest.param(m, k, marks=pytest.mark.slow if "fused" in m and k == 1 else ())
    for m in ALL
    for k in ((1,) if m == "sequential" else (1, 4) if "fused" in m else (4,))
]


@pytest.mark.parametrize("method,k", _CACHE_CASES)
def test_content_cache_greedy_identical(method, k):
    """With the content-stream cache (Appendix F.4) every method's greedy output equals
    sequential greedy decoding without a cache on these tasks; NFE is unchanged by the
    cache."""
    model, params = _model(V, 3, 8.0)
    toks, masks = _tasks(23, 24)
    ref = assd_generate(model, params, toks, masks, method="sequential")
    a = assd_generate(model, params, toks, masks, method=method, k=k)
    c = assd_generate(model, params, toks, masks, method=method, k=k, cache="content")
    assert c.stats.extra["cache"] == "content"
    for x, y in zip(c.infilled, ref.infilled):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.stats.target_nfe, c.stats.target_nfe)


def test_content_cache_unknown_name():
    model, params = _model(V, 3, 8.0)
    toks, masks = _tasks(23, 24)
    with pytest.raises(ValueError, match="unknown cache"):
        assd_generate(model, params, toks, masks, cache="kv")


@pytest.mark.parametrize(
    "method,task", [("assd", "v5"), ("assd-ngram", "v5"), ("assd-fused", "five")]
)
def test_content_cache_distribution(method, task):
    """Sampled outputs with the content cache match the exact sequential joint (10^4 rows)."""
    model, params = _model(*((5, 2, 5.0) if task == "v5" else (V3, 2, 5.0)))
    prompt, mask, s, joint = (
        (PROMPT5, MASK5, S5, exact_sequential_joint())
        if task == "v5"
        else (PROMPT3, MASK3, S3, exact_joint(V3, tuple(PROMPT3), tuple(MASK3), S3))
    )
    r = assd_generate(
        model,
        params,
        [list(prompt)] * R,
        [list(mask)] * R,
        method=method,
        k=3,
        sampling=s,
        seed=13,
        bucket=8,
        cache="content",
    )
    chk = check_distribution(np.stack(r.infilled), joint)
    assert chk.passed, chk.why
