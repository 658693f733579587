"""The distribution-test helper itself (:mod:`jaxspec.testing.distribution`): exact samples
pass at the stated rate, shifted ones fail, one sample on an impossible outcome fails, rare
cells are pooled without dropping samples, and the chain enumeration is exact."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from jaxspec.testing.distribution import (
    _pooled_cells,
    check_distribution,
    check_groups,
    enumerate_chain,
)


def _exact(seed=0, K=40, zeros=5):
    """A peaked distribution over variable-length outcomes, some with probability 0."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(K, 0.4))
    p[:zeros] = 0.0
    p /= p.sum()
    keys = [tuple(range(i % 4 + 1)) + (i,) for i in range(K)]
    return dict(zip(keys, p))


def _draw(exact, n, seed, p=None):
    keys = list(exact)
    p = np.array([exact[k] for k in keys]) if p is None else p
    idx = np.random.default_rng(seed).choice(len(keys), size=n, p=p / p.sum())
    return [keys[i] for i in idx]


def test_exact_samples_pass():
    exact = _exact()
    res = check_distribution(_draw(exact, 20000, seed=1), exact)
    assert res.passed, res.why
    assert res.n == 20000 and res.impossible == 0
    assert 0 < res.tv <= res.tv_floor_quantile
    assert res.p_value > 1e-3 and res.df > 10
    assert res.why.startswith("ok")


def test_false_rejection_rate_is_small():
    """200 exact sample sets: the rule's stated rate is <= 2e-3 per check."""
    exact = _exact(seed=3, K=20)
    fails = sum(
        not check_distribution(_draw(exact, 2000, seed=s), exact).passed for s in range(200)
    )
    assert fails <= 3


def test_shifted_distribution_fails():
    exact = _exact()
    keys = list(exact)
    p = np.array([exact[k] for k in keys])
    q = np.roll(p, 1) * (p > 0)  # a different law on the same support
    shifted = 0.9 * p + 0.1 * q / q.sum()
    res = check_distribution(_draw(exact, 20000, seed=2, p=shifted), exact)
    assert not res.passed and res.impossible == 0
    assert res.p_value < 1e-3 and res.tv > res.tv_floor_quantile
    assert res.why.startswith("FAIL")


def test_one_sample_on_an_impossible_outcome_fails():
    exact = _exact()
    zero = next(k for k, v in exact.items() if v == 0)
    samples = _draw(exact, 20000, seed=1)
    samples[7] = zero
    res = check_distribution(samples, exact)
    assert not res.passed and res.impossible == 1
    assert "zero-probability" in res.why
    # an outcome the enumeration does not list is impossible too
    samples[7] = (99, 98)
    assert check_distribution(samples, exact).impossible == 1


def test_tv_alone_rejects_a_spread_out_deviation():
    """A small deviation spread over many cells: the TV part is computed over every
    outcome, with the floor of this n (not a hand-set slack)."""
    exact = _exact(seed=4, K=30, zeros=0)
    keys = list(exact)
    p = np.array([exact[k] for k in keys])
    res = check_distribution(_draw(exact, 50000, seed=5, p=np.sqrt(p)), exact)
    assert not res.passed and res.tv > res.tv_floor_quantile


def test_scalar_and_sequence_outcomes_are_one_key():
    exact = {0: 0.5, (1,): 0.25, 2: 0.25}
    samples = np.random.default_rng(0).choice(3, size=10000, p=[0.5, 0.25, 0.25])
    assert check_distribution(samples, exact).passed
    assert check_distribution(samples[:, None], exact).passed
    with pytest.raises(ValueError, match="sum to"):
        check_distribution(samples, {0: 0.5, 1: 0.25})


def test_pooling_keeps_every_sample():
    rng = np.random.default_rng(0)
    exp = np.concatenate([rng.uniform(5, 50, 10), rng.uniform(0, 2, 30)])
    obs = rng.poisson(exp).astype(float)
    o, e = _pooled_cells(obs, exp, 5.0)
    assert o.sum() == obs.sum() and np.isclose(e.sum(), exp.sum())
    assert (e >= 5).all() and len(o) > 10
    o, e = _pooled_cells(np.array([3.0, 1.0]), np.array([2.0, 1.0]), 5.0)  # all rare
    assert o.tolist() == [4.0] and e.tolist() == [3.0]


def test_groups_fail_together_and_split_alpha():
    exact = _exact()
    good = (_draw(exact, 10000, seed=1), exact)
    keys = list(exact)
    p = np.array([exact[k] for k in keys])
    bad = (_draw(exact, 10000, seed=2, p=p**2), exact)
    ok = check_groups([good, good])
    assert ok.passed and ok.n == 20000 and len(ok.groups) == 2
    res = check_groups([good, bad])
    assert not res.passed and res.why.startswith("group 1")


def test_enumerate_chain_with_eos_matches_brute_force():
    V, n, eos = 4, 3, 3
    rng = np.random.default_rng(0)
    table = np.log(rng.dirichlet(np.ones(V), size=V + 1))  # next | last token (V = start)
    table[1, 2] = -np.inf  # 1 is never followed by 2
    table[1] -= np.log(np.exp(table[1]).sum())

    def next_lp(prefixes):
        last = prefixes[:, -1] if prefixes.shape[1] else np.full(len(prefixes), V)
        return table[last]

    got = enumerate_chain(next_lp, n, eos_ids=(eos,))
    want = {}
    for seq in itertools.product(range(V), repeat=n):
        cut = seq[: seq.index(eos) + 1] if eos in seq else seq
        if cut in want:
            continue
        lp, prev = 0.0, V
        for t in cut:
            lp += table[prev, t]
            prev = t
        if np.isfinite(lp):
            want[cut] = np.exp(lp)
    assert set(got) == set(want)
    assert all(np.isclose(got[k], want[k]) for k in want)
    assert np.isclose(sum(got.values()), 1.0)
    assert not any(1 in k[:-1] and k[k.index(1) + 1] == 2 for k in got if 1 in k[:-1])
