"""ASSD (:mod:`jaxspec.asarm.assd`) on tiny random XLNet AS-ARMs.

* The typed variants: method names round-trip, impossible combinations are refused.

* Theorem 1 as a property test: many random prompts / masks / k, NFE <= N - m per row.
* Lemma 1: the first draft of an iteration is always accepted, and the draft pass and the
  density pass give the same distribution at ``sigma(n)``.
* Losslessness: on a vocabulary-5 model with 3 masked positions the exact sequential joint is
  enumerated (125 outcomes, teacher-forced density pass straight from models.xlnet.modeling); 10^4
  samples of sequential, ASSD and ASSD-ngram are compared with it (total variation + chi-square),
  and the always-accept negative control (epsilon = 1) is rejected.
* Greedy ASSD / ASSD-ngram output identical to sequential, which equals a plain Python loop.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.asarm.assd import assd_generate
from jaxspec.asarm.config import METHODS, VARIANTS, AssdVariant
from jaxspec.asarm.inputs import decoding_order, density_order, draft_order, prepare_batch
from jaxspec.asarm.passes import bigram_draft_dist, conditionals, sample_bigram_draft
from jaxspec.core.sampling import SamplingConfig, target_probs
from jaxspec.testing.distribution import check_distribution
from jaxspec.testing.mutants import EQUIVALENT, MUTANTS, inject_assd
from jaxspec.testing.tiny import tiny_xlnet
from models.xlnet.modeling import density_masks

V = 11


_model = functools.lru_cache(maxsize=None)(tiny_xlnet)  # (vocab=V, seed=1, scale=4.0)


def _tasks(seed: int, B: int, lo: int = 3, hi: int = 16):
    """Random rows: length in [lo, hi], a random non-empty mask (sometimes all masked, sometimes
    position 0 masked), random visible ids."""
    rng = np.random.default_rng(seed)
    toks, masks = [], []
    for _ in range(B):
        n = int(rng.integers(lo, hi + 1))
        m = rng.random(n) < rng.uniform(0.3, 1.0)
        if not m.any():
            m[rng.integers(n)] = True
        toks.append(rng.integers(0, V, n))
        masks.append(m)
    return toks, masks


def _check_stats(r, masks, k, method):
    st = r.stats
    G = np.array([int(np.sum(m)) for m in masks])
    np.testing.assert_array_equal(st.new_tokens, G)
    produced = (st.accept_hist * np.arange(st.accept_hist.shape[1])).sum(1)
    np.testing.assert_array_equal(produced, G)  # every token accounted for
    np.testing.assert_array_equal(st.accept_hist.sum(1), st.steps)
    assert (st.target_nfe <= G).all(), (st.target_nfe, G)  # Theorem 1
    assert st.method == method and st.reference == "sequential"
    if method == "sequential":
        np.testing.assert_array_equal(st.target_nfe, G)  # exactly N - m
    elif method == "assd":
        # Lemma 1: every verified iteration keeps its first draft, so it yields >= 2 tokens
        assert st.accept_hist[:, 0].sum() == 0
        assert st.extra["density_passes"] == 0 or st.accept_hist[:, 2:].sum() > 0
        assert st.extra["draft_passes"] + st.extra["density_passes"] == st.target_nfe.sum()
        assert st.accepted.sum() <= st.drafts_proposed.sum()
    elif method.startswith("assd-fused"):
        # one call per iteration, each emitting >= 1 token (Theorem 1 for the fused loop)
        assert st.accept_hist[:, 0].sum() == 0
        assert st.extra["density_passes"] == st.target_nfe.sum() == st.steps.sum()
        assert st.accepted.sum() <= st.drafts_proposed.sum()
        assert st.draft_nfe.sum() <= (st.steps.sum() if method.endswith("ngram") else 0)
    else:
        # bigram drafts, except iterations whose first slot is position 0 (a draft pass)
        assert st.draft_nfe.sum() + st.extra["draft_passes"] == st.steps.sum()
        assert st.accept_hist[:, 0].sum() == 0


# ----------------------------------------------------------------------------- input errors
@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(k=0), "k .*>= 1"),
        (dict(k=2.5), "k .*>= 1"),
        (dict(method="beam"), "unknown method"),
        (dict(epsilon=-0.1, sampling=SamplingConfig(1.0)), "epsilon must be >= 0"),
        (dict(epsilon=0.1), "sampling only"),
        (dict(masked=[[False, False, False]]), "no masked positions"),
        (dict(masked=[[True, False]]), "3 tokens but a mask of 2"),
        (dict(tokens=[[1, V, 3]], masked=[[True, False, False]]), "outside the model vocabulary"),
        (dict(tokens=[[1, -1, 3]], masked=[[True, False, False]]), "outside the model vocabulary"),
        (dict(max_len=2), "runs past the context of 2"),
        (dict(tokens=[], masked=[]), "empty batch"),
        (dict(sampling="greedy"), "SamplingConfig"),
        (dict(epsilon="0.1", sampling=SamplingConfig(1.0)), "epsilon must be a number"),
    ],
)
def test_input_errors(kw, msg):
    model, params = _model()
    args = dict(tokens=[[1, 2, 3]], masked=[[False, True, False]])
    args.update(kw)
    toks, masks = args.pop("tokens"), args.pop("masked")
    with pytest.raises(ValueError, match=msg):
        assd_generate(model, params, toks, masks, **args)


def test_variants_round_trip_and_refuse_impossible_combinations():
    """Every method name parses to a distinct typed variant whose name is that method; the
    flags read as documented; combinations no method has are refused."""
    assert METHODS == ("sequential", "assd", "assd-ngram", "assd-fused", "assd-fused-ngram")
    assert len(set(VARIANTS.values())) == len(METHODS)
    for name in METHODS:
        assert AssdVariant.parse(name).name == name
    v = AssdVariant.parse("assd-fused-ngram")
    assert v.fused and v.drafter == "ngram" and not v.sequential
    assert AssdVariant.parse("sequential") == AssdVariant(sequential=True)
    with pytest.raises(ValueError, match="sequential decoding takes neither"):
        AssdVariant(sequential=True, fused=True)
    with pytest.raises(ValueError, match="sequential decoding takes neither"):
        AssdVariant(sequential=True, drafter="ngram")
    with pytest.raises(ValueError, match="unknown drafter 'draft-model'"):
        AssdVariant(drafter="draft-model")
    with pytest.raises(ValueError, match="unknown method 'assd-self'"):
        AssdVariant.parse("assd-self")


def test_decoding_order_eq4():
    sigma, m = decoding_order([True, False, True, True, False, True])
    assert m == 2 and sigma.tolist() == [1, 4, 0, 2, 3, 5]
    tok, vis, msk, lengths = prepare_batch(
        [[5, 6, 7], [1, 2, 3, 4, 5]], [[0, 1, 0], [1, 1, 0, 0, 1]], V, bucket=4
    )
    assert tok.shape == (2, 8) and lengths.tolist() == [3, 5]
    assert not (vis | msk)[0, 3:].any() and (vis ^ msk)[1, :5].all()  # padding is neither


def test_bigram_eq23():
    # known: 4 1 4 2 ? 4 1 ; pairs (4,1), (1,4), (4,2), (4,1) -> c(.|4) = 2/3 on 1, 1/3 on 2
    t = jnp.array([4, 1, 4, 2, 0, 4, 1])
    known = jnp.array([1, 1, 1, 1, 0, 1, 1], bool)
    c = np.asarray(bigram_draft_dist(t, known, jnp.int32(4), jnp.bool_(True), 6))
    np.testing.assert_allclose(c, [0, 2 / 3, 1 / 3, 0, 0, 0], atol=1e-6)
    c = np.asarray(bigram_draft_dist(t, known, jnp.int32(2), jnp.bool_(True), 6))
    # 2 -> ? unknown: the unigram of the known tokens (the official code's rule)
    np.testing.assert_allclose(c, [0, 2 / 6, 1 / 6, 0, 3 / 6, 0], atol=1e-6)
    c = np.asarray(bigram_draft_dist(t, known, jnp.int32(0), jnp.bool_(False), 6))
    np.testing.assert_allclose(c, [0, 2 / 6, 1 / 6, 0, 3 / 6, 0], atol=1e-6)  # unigram


@pytest.mark.parametrize(
    "cond,has_cond,n_known",
    [(4, True, 7), (2, True, 7), (0, False, 7), (3, True, 0)],
    ids=["bigram", "unigram-unknown-successor", "unigram-no-left", "nothing-known"],
)
def test_bigram_draws_follow_the_draft_distribution(cond, has_cond, n_known):
    """The drafts of Algorithm 2 (``sample_bigram_draft``, a draw among known positions) follow
    ``bigram_draft_dist``, the q the verifier divides by: 10^4 draws, chi-square + TV."""
    t = jnp.array([4, 1, 4, 2, 0, 4, 1])
    known = jnp.array([1, 1, 1, 1, 0, 1, 1], bool) & (jnp.arange(7) < n_known)
    c = np.asarray(bigram_draft_dist(t, known, jnp.int32(cond), jnp.bool_(has_cond), 6))
    keys = jax.random.split(jax.random.PRNGKey(0), 10_000)
    draw = jax.vmap(lambda k: sample_bigram_draft(k, t, known, jnp.int32(cond), has_cond, 6))
    chk = check_distribution(
        np.asarray(draw(keys)).tolist(), {a: float(p) for a, p in enumerate(c) if p > 0}
    )
    assert chk.passed, chk.why


# ----------------------------------------------------------------------------- Theorem 1, Lemma 1
@pytest.mark.parametrize("method,seed", [("assd", 0), ("assd-ngram", 1)])
def test_theorem1_nfe_bound(method, seed):
    """Property test: for k = 1..6 (one executable with 6 slots), 48 random tasks each (lengths
    3-16, random masks incl. all-masked rows and a masked position 0), sampled at temperature 1:
    every row's NFE <= N - m and the token accounting is exact. ASSD: k = 1 and k = 2 cost
    exactly N - m (2 forwards always give 2 tokens: Lemma 1 + accept-or-resample, the paper's
    Table 5 observation), k >= 3 saves forwards, the first draft is never rejected (Lemma 1)."""
    model, params = _model()
    total = {}
    for k in range(1, 7):
        toks, masks = _tasks(100 * seed + k, 48)
        G = np.array([int(m.sum()) for m in masks])
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
        for seq, inf, t, m in zip(r.sequences, r.infilled, toks, masks):
            np.testing.assert_array_equal(seq[~m], t[~m])  # the prompt is untouched
            np.testing.assert_array_equal(seq[m], inf)
            assert ((inf >= 0) & (inf < V)).all()
        if method == "assd":
            assert r.stats.extra["lemma1_max_gap"] < 1e-5
            assert r.stats.accept_hist.shape[1] == k + 2
            if k <= 2:
                np.testing.assert_array_equal(r.stats.target_nfe, G)
        total[k] = r.stats.target_nfe.sum() / G.sum()
    assert total[5] < 0.9 and total[6] < 0.9, total  # a real saving
    if method == "assd":  # epsilon tolerance (not lossless) keeps Theorem 1 and accepts more
        toks, masks = _tasks(99, 48)
        a = assd_generate(model, params, toks, masks, k=5, slots=6, sampling=SamplingConfig(1.0))
        e = assd_generate(
            model, params, toks, masks, k=5, slots=6, sampling=SamplingConfig(1.0), epsilon=0.3
        )
        _check_stats(e, masks, 5, "assd")
        assert e.stats.extra["lossless"] is False and a.stats.extra["lossless"] is True
        assert e.stats.acceptance_rate > a.stats.acceptance_rate


def test_lemma1_draft_and_density_rows_agree():
    """At sigma(n) the draft pass (Fig. 1a conditioning on x_sigma(<n)) and the density pass
    over the drafts (Fig. 1b) give the same distribution, compared directly on random states;
    the density row of the next position differs (the comparison has teeth)."""
    model, params = _model()
    toks, masks = _tasks(7, 16, lo=6)
    tok, vis, msk, _ = prepare_batch(toks, masks, V)
    rng = np.random.default_rng(3)
    rank = jnp.asarray(np.where(msk, np.cumsum(msk, 1) - 1, 1 << 30).astype(np.int32))
    G = msk.sum(1)
    n = np.array([rng.integers(0, g) for g in G], np.int32)
    t = np.minimum(n + 4, G).astype(np.int32)
    tok = np.where(msk, rng.integers(0, V, tok.shape), tok).astype(np.int32)  # decoded + drafts
    at = lambda off: np.array(
        [[np.flatnonzero(msk[b])[min(n[b] + off, G[b] - 1)]] for b in range(len(G))], np.int32
    )
    f = jax.jit(lambda o, q: conditionals(model, params, tok, vis, o, q))
    s = SamplingConfig(0.9, top_k=6)
    d = np.asarray(target_probs(f(draft_order(rank, jnp.asarray(n)), at(0)), s))
    q = np.asarray(target_probs(f(density_order(rank, jnp.asarray(t)), at(0)), s))
    q1 = np.asarray(target_probs(f(density_order(rank, jnp.asarray(t)), at(1)), s))
    assert np.max(np.abs(d - q)) < 1e-5
    assert np.max(np.abs(d - q1)) > 1e-2


# ----------------------------------------------------------------------------- greedy identity
def _python_sequential_greedy(model, params, toks, masks):
    """Reference: one plain model.apply per masked rank, left to right (Eq. 4), with the
    default density mask of models.xlnet.modeling (right padding sits after every real position)."""
    tok, vis, msk, lengths = prepare_batch(toks, masks, V)
    cm, qm = density_masks(vis)
    fwd = jax.jit(lambda x: model.apply(params, x, cm, qm)[0])
    x = tok.copy()
    for r in range(int(msk.sum(1).max())):
        am = np.asarray(jnp.argmax(fwd(x), -1))
        for b in range(len(lengths)):
            p = np.flatnonzero(msk[b])
            if r < len(p):
                x[b, p[r]] = am[b, p[r]]
    return [x[b, : lengths[b]] for b in range(len(lengths))]


def test_greedy_identical_to_sequential():
    """On a model whose greedy infills are varied (the default tiny model's are one repeated id,
    which any decoder reproduces), ASSD and ASSD-ngram equal sequential greedy decoding."""
    model, params = _model(V, 3, 8.0)
    toks, masks = _tasks(11, 48)
    ref = assd_generate(model, params, toks, masks, method="sequential")
    _check_stats(ref, masks, 1, "sequential")
    assert len(np.unique(np.concatenate(ref.infilled))) >= 6
    for a, b in zip(ref.sequences, _python_sequential_greedy(model, params, toks, masks)):
        np.testing.assert_array_equal(a, b)
    for method in ("assd", "assd-ngram"):
        for k in (3, 6):
            r = assd_generate(model, params, toks, masks, method=method, k=k, slots=6)
            _check_stats(r, masks, k, method)
            for a, b in zip(ref.sequences, r.sequences):
                np.testing.assert_array_equal(a, b)
            assert r.stats.target_nfe.sum() < ref.stats.target_nfe.sum()


def test_draft_length_above_the_masked_count_is_clamped():
    """k far above the masked count speculates min(n + k, N - m) tokens (Algorithm 1 line 3):
    the loop compiles only as many query slots as the longest row needs, and the output equals
    the run with k = that count (greedy: identical to sequential)."""
    model, params = _model()
    toks, masks = _tasks(5, 6, lo=4, hi=9)
    g_max = max(int(np.sum(m)) for m in masks)
    ref = assd_generate(model, params, toks, masks, method="sequential")
    big = assd_generate(model, params, toks, masks, method="assd", k=10**6)
    same = assd_generate(model, params, toks, masks, method="assd", k=g_max)
    for a, b, c in zip(ref.sequences, big.sequences, same.sequences):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(big.stats.target_nfe, same.stats.target_nfe)
    assert big.stats.draft_length == 10**6 and big.stats.extra["k"] == 10**6
    _check_stats(big, masks, g_max, "assd")


# ----------------------------------------------------------------------------- distribution
V5 = 5
PROMPT5 = [1, 0, 3, 0, 0, 2]  # positions 1, 3, 4 are masked (4's left neighbour is 3)
MASK5 = [False, True, False, True, True, False]
S5 = SamplingConfig(0.9, top_k=4)
R = 10_000


@functools.lru_cache(maxsize=None)
def exact_sequential_joint() -> dict:
    """Exact joint of sequential decoding: prod_i p(x_sigma(i) | x_sigma(<i)) (Eq. 2) with the
    processed (T = 0.9, top-4) target, from one teacher-forced density pass per outcome."""
    model, params = _model(V5, 2, 5.0)
    msk = np.flatnonzero(MASK5)
    seqs = np.array([PROMPT5] * V5**3, np.int32)
    seqs[:, msk] = np.array(list(itertools.product(range(V5), repeat=3)))
    vis = np.broadcast_to(~np.array(MASK5), seqs.shape)
    cm, qm = density_masks(vis)
    lg, _ = model.apply(params, seqs, cm, qm)
    pr = np.asarray(target_probs(lg, S5), np.float64)
    joint = np.prod([pr[np.arange(len(seqs)), i, seqs[:, i]] for i in msk], axis=0)
    return {tuple(s[msk]): float(p) for s, p in zip(seqs, joint) if p > 0}


def _samples(method, k=3, epsilon=0.0, seed=0):
    model, params = _model(V5, 2, 5.0)
    r = assd_generate(
        model,
        params,
        [PROMPT5] * R,
        [MASK5] * R,
        method=method,
        k=k,
        sampling=S5,
        seed=seed,
        epsilon=epsilon,
        bucket=8,
    )
    return np.stack(r.infilled), r.stats


@pytest.mark.parametrize("method", ["sequential", "assd", "assd-ngram"])
def test_output_distribution_equals_sequential_joint(method):
    """10^4 samples vs the exactly enumerated sequential joint
    (:func:`jaxspec.testing.distribution.check_distribution`: no impossible outcome,
    chi-square, TV within the noise floor's quantile; Theorem 2). The verifiers really
    rejected drafts."""
    dist = exact_sequential_joint()
    assert abs(sum(dist.values()) - 1) < 1e-5 and len(dist) > 30
    x, st = _samples(method, seed=3)
    chk = check_distribution(x, dist)
    assert chk.passed, chk.why
    if method != "sequential":
        assert 0.1 < st.acceptance_rate < 0.98  # rejections (and resampling) happened
        assert (st.target_nfe <= 3).all()


def test_output_distribution_with_k_above_the_masked_count():
    """k = 8 > 3 masked positions takes the clamped-slot path of assd_generate (3 query slots
    compiled): still the exact sequential joint (Theorem 2)."""
    x, st = _samples("assd", k=8, seed=5)
    chk = check_distribution(x, exact_sequential_joint())
    assert chk.passed, chk.why
    assert st.extra["k"] == 8 and (st.target_nfe <= 3).all()


def test_negative_control_always_accept_is_rejected():
    """epsilon = 1 accepts every draft (pure parallel sampling, Appendix F.5 taken to the
    extreme), through the real ``verify_sample``: the same test must reject it."""
    x, st = _samples("assd", epsilon=1.0, seed=4)
    chk = check_distribution(x, exact_sequential_joint())
    assert st.extra["lossless"] is False and st.acceptance_rate == 1.0
    assert not chk.passed and chk.p_value < 1e-6, chk.why


# ASSD has no bonus row (after k acceptances it drafts again), so the bonus mutant cannot
# reach its output; it passes no draft length, so ignore-draft-len is the real rule; the
# unprocessed-residual mutant needs logits the seam does not see (the causal suite runs it).
ASSD_VARIANTS = tuple(
    m
    for m in MUTANTS + EQUIVALENT
    if m.name not in ("bonus-from-residual", "ignore-draft-len") and not m.needs_raw
)


@functools.lru_cache(maxsize=None)
def assd_variant_checks(method):
    """Every variant of :data:`ASSD_VARIANTS` on its own block of 10^4 rows, for one method (one
    compile, :func:`jaxspec.testing.mutants.inject_assd`). Cached per method, not a module
    fixture: each xdist worker then computes only the method of the test it runs."""
    dist = exact_sequential_joint()
    model, params = _model(V5, 2, 5.0)
    with inject_assd(ASSD_VARIANTS, rows_per=R):
        r = assd_generate(
            model,
            params,
            [PROMPT5] * (R * len(ASSD_VARIANTS)),
            [MASK5] * (R * len(ASSD_VARIANTS)),
            method=method,
            k=3,
            sampling=S5,
            seed=6,
            bucket=8,
        )
    x = np.stack(r.infilled)
    return {
        m.name: check_distribution(x[j * R : (j + 1) * R], dist)
        for j, m in enumerate(ASSD_VARIANTS)
    }


@pytest.mark.parametrize("method", ["assd", pytest.param("assd-ngram", marks=pytest.mark.slow)])
def test_assd_mutants_rejected_and_equivalents_accepted(method):
    """Mutation check: the distribution test rejects every wrong verifier and
    accepts the equivalent variants, for self-drafted ASSD and ASSD-ngram (one test per method:
    its variants come from one batched run)."""
    checks = assd_variant_checks(method)
    wrong = []
    for m in ASSD_VARIANTS:
        chk = checks[m.name]
        print(f"{method}/{m.name}: {chk.why}")
        if chk.passed != m.lossless:
            wrong.append(f"{m.name} ({'lossless' if m.lossless else 'mutant'}): {chk.why}")
    assert not wrong, f"{method}: " + "; ".join(wrong)
