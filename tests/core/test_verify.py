"""Verification core and n-gram drafter against plain-Python references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.core import sampling
from jaxspec.core.drafters import DraftContext, NgramDrafter
from jaxspec.core.sampling import SamplingConfig, filter_top_k_top_p, process_logits
from jaxspec.core.verify import verify_greedy, verify_sample
from jaxspec.testing.distribution import check_distribution


def _rand_dist(rng, shape, sharp=2.0):
    x = rng.normal(size=shape) * sharp
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def _first_emitted(p, q, N, point_mass, seed=0, **kw):
    """Run :func:`verify_sample` on ``N`` copies of one (p, q) chain; returns the first
    emitted token (draft 0 if accepted, else the residual sample) and ``n`` per row."""
    V, k = p.shape[-1], p.shape[-2] - 1
    kd, kv = jax.random.split(jax.random.PRNGKey(seed))
    if point_mass:
        draft = jnp.full((N, k), 2, jnp.int32)  # deterministic drafter
        qq = None
    else:
        draft = jax.random.categorical(kd, jnp.log(jnp.asarray(q)), shape=(N, k)).astype(jnp.int32)
        qq = jnp.broadcast_to(jnp.asarray(q), (N, k, V))
    n, nxt = verify_sample(kv, jnp.broadcast_to(jnp.asarray(p), (N, k + 1, V)), draft, qq, **kw)
    n, nxt, draft = map(np.asarray, (n, nxt, draft))
    return np.where(n > 0, draft[:, 0], nxt), n


@pytest.mark.parametrize("point_mass", [False, True])
def test_first_emitted_token_is_distributed_as_p0(point_mass):
    """Whatever the drafts, the first emitted token (draft 0 if accepted, else the residual
    sample) must be distributed as p_0 (Leviathan et al. Thm. 1; ASSD Alg. 1 lines 9-17)."""
    V, k, N = 7, 3, 40000
    rng = np.random.default_rng(0)
    p = _rand_dist(rng, (1, k + 1, V))
    q = _rand_dist(rng, (1, k, V), sharp=1.0)
    first, n = _first_emitted(p, q, N, point_mass)
    chk = check_distribution(first, dict(enumerate(p[0, 0])))
    assert chk.passed, chk.why
    # acceptance probability of draft 0 is sum_x min(p, q) (point mass: p(2))
    acc_expected = p[0, 0, 2] if point_mass else np.minimum(p[0, 0], q[0, 0]).sum()
    assert abs((n > 0).mean() - acc_expected) < 4 * np.sqrt(acc_expected / N) + 1e-3


def test_negative_control_always_accept_is_detected():
    """The distribution check has power on the real verifier's output: ``epsilon = 1``
    (ASSD F.5 tolerance at its extreme: every draft is accepted) emits draft 0 ~ q_0, not
    p_0, and is rejected; the same draws with ``epsilon = 0`` pass."""
    V, k, N = 7, 3, 40000
    rng = np.random.default_rng(0)
    p = _rand_dist(rng, (1, k + 1, V))
    q = _rand_dist(rng, (1, k, V), sharp=1.0)
    exact = dict(enumerate(p[0, 0]))
    first, n = _first_emitted(p, q, N, point_mass=False, epsilon=1.0)
    assert (n == k).all()
    chk = check_distribution(first, exact)
    assert not chk.passed and chk.p_value < 1e-6 and chk.tv > chk.tv_floor_quantile, chk.why
    assert check_distribution(_first_emitted(p, q, N, point_mass=False)[0], exact).passed


def test_bonus_token_when_all_accepted():
    """After all ``k_t`` drafts are accepted the bonus token is drawn from ``p_{k_t}``, with a
    real (non-point-mass) q whose support overlaps the bonus row: a verifier that drew it from
    ``max(p - q, 0)`` would never emit tokens 3 or 4 here."""
    V, k, N = 5, 2, 20000
    p = np.zeros((1, k + 1, V), np.float32)
    p[0, 0, 1] = 1.0  # draft 0 = 1 is certain
    p[0, 1] = [0.1, 0.1, 0.1, 0.6, 0.1]  # draft 1 = 3 has p/q = 1.2: accepted
    p[0, 2] = [0.1, 0.2, 0.3, 0.25, 0.15]  # the bonus row
    q = np.zeros((1, k, V), np.float32)
    q[0, 0] = [0.0, 0.7, 0.3, 0.0, 0.0]
    q[0, 1] = [0.0, 0.0, 0.0, 0.5, 0.5]
    draft = jnp.broadcast_to(jnp.asarray([[1, 3]], jnp.int32), (N, k))
    kt = jnp.asarray(np.arange(N) % 2 + 1, jnp.int32)  # rows alternate k_t = 2 and k_t = 1
    n, nxt = verify_sample(
        jax.random.PRNGKey(0),
        jnp.broadcast_to(jnp.asarray(p), (N, k + 1, V)),
        draft,
        jnp.broadcast_to(jnp.asarray(q), (N, k, V)),
        draft_len=kt,
    )
    n, nxt, kt = map(np.asarray, (n, nxt, kt))
    np.testing.assert_array_equal(n, kt)
    for row in (2, 1):  # bonus from p_{k_t}
        chk = check_distribution(nxt[kt == row], dict(enumerate(p[0, row])))
        assert chk.passed, (row, chk.why)
    n, nxt = verify_greedy(jnp.log(jnp.asarray(p) + 1e-9), jnp.asarray([[1, 0]]))
    assert int(n[0]) == 1 and int(nxt[0]) == 3


def test_greedy_verify_batch():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, 9)), jnp.float32)
    am = np.asarray(jnp.argmax(logits, -1))
    draft = am[:, :3].copy()
    draft[0, 0] = (draft[0, 0] + 1) % 9
    draft[1, 2] = (draft[1, 2] + 1) % 9
    n, nxt = verify_greedy(logits, jnp.asarray(draft))
    assert np.asarray(n).tolist() == [0, 2, 3]
    assert np.asarray(nxt).tolist() == [am[0, 0], am[1, 2], am[2, 3]]


def test_top_k_top_p_processing():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    p = np.exp(np.asarray(process_logits(logits, SamplingConfig(1.0, top_k=3))))[0]
    np.testing.assert_allclose(p, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], atol=1e-6)
    p = np.exp(np.asarray(process_logits(logits, SamplingConfig(1.0, top_p=0.7))))[0]
    np.testing.assert_allclose(p, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], atol=1e-6)
    p = np.exp(np.asarray(process_logits(logits, SamplingConfig(1.0, top_p=0.71))))[0]
    np.testing.assert_allclose(p, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], atol=1e-6)
    p = np.exp(np.asarray(process_logits(logits, SamplingConfig(2.0))))[0]
    ref = np.sqrt([0.5, 0.2, 0.15, 0.1, 0.05])
    np.testing.assert_allclose(p, ref / ref.sum(), atol=1e-6)


def _sorted_filter_reference(x: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The top-k / top-p rule by a descending sort, row by row (float64 masses): the kept
    mask. The k-th largest value and every tie with it; then the tokens whose preceding mass
    in the sort is below ``top_p`` and every tie with the last of them."""
    keep = np.ones(x.shape, bool)
    for i, row in enumerate(x):
        if 0 < top_k < row.size:
            keep[i] &= row >= np.sort(row)[::-1][top_k - 1]
        if top_p < 1.0:
            probs = np.asarray(jax.nn.softmax(jnp.where(keep[i], row, -jnp.inf)), np.float64)
            desc = np.sort(probs)[::-1]
            before = np.cumsum(desc) - desc
            keep[i] &= probs >= desc[np.sum(before < top_p) - 1]
    return keep


@pytest.mark.parametrize("bisection", [True, False], ids=["bisection", "sort"])
@pytest.mark.parametrize("V", [7, 300, 49152])
def test_top_k_top_p_filter_matches_a_sorted_reference(V, bisection, monkeypatch):
    """``filter_top_k_top_p`` keeps exactly the tokens a sort keeps, with its CPU thresholds
    (bisection) and its accelerator thresholds (``lax.top_k`` / ``jnp.sort``): random logits
    with ties (values on a grid), ``-inf`` entries and a constant row."""
    monkeypatch.setattr(sampling, "THRESHOLDS_BY_BISECTION", bisection)
    rng = np.random.default_rng(V)
    rows = rng.normal(size=(12, V)) * rng.choice([0.5, 3.0, 10.0], size=(12, 1))
    rows[::3] = np.round(rows[::3] * 2) / 2  # ties
    rows[1, : V // 3] = -np.inf
    rows[2] = 1.25
    x = rows.astype(np.float32)
    for top_k, top_p in [(0, 0.9), (0, 0.5), (1, 1.0), (3, 1.0), (50, 0.95), (V - 1, 0.3)]:
        got = np.asarray(filter_top_k_top_p(jnp.asarray(x), top_k, top_p)) > -np.inf
        ref = _sorted_filter_reference(x, top_k, top_p)
        np.testing.assert_array_equal(got, ref, err_msg=f"top_k={top_k} top_p={top_p}")


# ---- n-gram drafter ------------------------------------------------------------------------


def _ref_ngram(ctx, k, max_n, min_n):
    """Plain-Python prompt lookup: most recent earlier occurrence of the longest suffix,
    periodic copy; else greedy Eq. 23 bigram chain (ties -> smallest id, unseen -> repeat)."""
    L = len(ctx)
    for n in range(max_n, min_n - 1, -1):
        if L < n:
            continue
        suf = ctx[L - n :]
        for j in range(L - n - 1, -1, -1):
            if ctx[j : j + n] == suf:
                ext = list(ctx)
                for t in range(k):
                    ext.append(ext[j + n + t])
                return ext[L:], True
    out, cond = [], ctx[-1]
    for _ in range(k):
        succ = [ctx[i + 1] for i in range(L - 1) if ctx[i] == cond]
        if succ:
            c = np.bincount(succ)
            cond = int(np.argmax(c))
        out.append(cond)
    return out, False


@pytest.mark.parametrize("max_n,min_n", [(3, 2), (4, 1), (2, 2)])
def test_ngram_drafter_matches_python_reference(max_n, min_n):
    rng = np.random.default_rng(max_n * 10 + min_n)
    V, k, S = 12, 5, 48
    drafter = NgramDrafter(k, V, max_ngram=max_n, min_ngram=min_n)
    bufs, lens, pads, ctxs = [], [], [], []
    for _ in range(64):
        pad = int(rng.integers(0, 8))
        L = pad + int(rng.integers(1, 24))
        ctx = rng.integers(0, rng.integers(2, V), size=L - pad).tolist()
        buf = np.full(S, 7)
        buf[pad:L] = ctx
        bufs.append(buf)
        lens.append(L)
        pads.append(pad)
        ctxs.append(ctx)
    dctx = DraftContext(
        buffer=jnp.asarray(np.stack(bufs), jnp.int32),
        length=jnp.asarray(lens, jnp.int32),
        pad=jnp.asarray(pads, jnp.int32),
        active=jnp.ones((len(bufs),), bool),
    )
    d, _ = drafter.propose((), (), dctx, jax.random.PRNGKey(0), False)
    draft, q = d.tokens, d.q
    assert q is None
    for b, ctx in enumerate(ctxs):
        ref, found = _ref_ngram(ctx, k, max_n, min_n)
        assert np.asarray(draft[b]).tolist() == ref, ctx
    # without the bigram fallback, has_draft is exactly "a suffix matched"
    nofb = NgramDrafter(k, V, max_ngram=max_n, min_ngram=min_n, bigram_fallback=False)
    has = nofb.propose((), (), dctx, jax.random.PRNGKey(0), False)[0].has_draft
    found = [_ref_ngram(c, k, max_n, min_n)[1] for c in ctxs]
    assert np.asarray(has).tolist() == found
    assert 0 < sum(found) < len(found)


def test_ngram_bigram_sampling_q_is_eq23():
    """Sampled bigram drafts come with q = c(.|x_cond) of Eq. 23 and follow it."""
    V, k = 6, 2
    ctx = [0, 1, 0, 2, 0, 1, 3, 0]  # no repeated 2-gram suffix "3 0"? (3,0) occurs once
    drafter = NgramDrafter(k, V, max_ngram=2, min_ngram=2)
    N = 10_000
    buf = jnp.asarray([ctx + [5] * 4] * N, jnp.int32)
    L = jnp.full((N,), len(ctx), jnp.int32)
    d, _ = drafter.propose(
        (),
        (),
        DraftContext(
            buffer=buf, length=L, pad=jnp.zeros((N,), jnp.int32), active=jnp.ones((N,), bool)
        ),
        jax.random.PRNGKey(3),
        True,
    )
    draft, q = d.tokens, d.q
    # c(.|0): successors of 0 are 1, 2, 1 -> (0, 2/3, 1/3, 0, 0, 0)
    np.testing.assert_allclose(np.asarray(q[0, 0]), [0, 2 / 3, 1 / 3, 0, 0, 0], atol=1e-6)
    chk = check_distribution(np.asarray(draft[:, 0]).tolist(), {1: 2 / 3, 2: 1 / 3})
    assert chk.passed, chk.why
    # the second draft is conditioned on the first (Alg. 2 lines 2-6)
    d1 = np.asarray(draft[:, 1])
    first = np.asarray(draft[:, 0])
    assert set(d1[first == 2].tolist()) == {0}  # 2 is always followed by 0
    np.testing.assert_allclose(
        np.asarray(q[first == 1][0, 1]), [1 / 2, 0, 0, 1 / 2, 0, 0], atol=1e-6
    )
