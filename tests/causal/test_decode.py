"""Decoders: AR baseline vs an uncached reference loop, speculative greedy identity,
sampling exactness against the enumerated joint distribution, bad input."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from jaxspec.causal.decode import DecodeInputError, generate
from jaxspec.core.drafters import NgramDrafter
from jaxspec.core.sampling import SamplingConfig, process_logits
from jaxspec.testing.tiny import tiny_model


@functools.partial(jax.jit, static_argnums=0)
def _forward(model, params, toks):
    T = toks.shape[1]
    pos = jnp.arange(T, dtype=jnp.int32)[None]
    mask = jnp.tril(jnp.ones((T, T), bool))[None]
    return model.apply({"params": params}, toks, pos, mask)[0]


def _full_logits(model, params, seq):
    """Uncached causal forward over ``seq`` (list of ids) -> last-row logits (numpy)."""
    return np.asarray(_forward(model, params, jnp.asarray([seq], jnp.int32))[0, -1])


def _reference_greedy(model, params, prompt, n, eos=()):
    """Uncached greedy loop; the sequence is right-padded to a fixed length (a causal pass
    never looks right), so one compilation serves every step."""
    seq = list(prompt)
    out = []
    T = 128
    for _ in range(n):
        buf = np.zeros((1, T), np.int32)
        buf[0, :len(seq)] = seq
        logits = np.asarray(_forward(model, params, jnp.asarray(buf))[0, len(seq) - 1])
        t = int(np.argmax(logits))
        out.append(t)
        seq.append(t)
        if t in eos:
            break
    return out


def _prompts(vocab, seed=0):
    rng = np.random.default_rng(seed)
    base = [rng.integers(0, vocab, size=n).tolist() for n in (3, 9, 20)]
    return [b * 3 for b in base]  # repeated text gives the n-gram drafter matches


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ar_matches_uncached_reference(arch):
    model, params = tiny_model(64, arch=arch)
    prompts = _prompts(64)
    res = generate(model, params, prompts, max_new_tokens=24, bucket=16)
    for p, got in zip(prompts, res.tokens):
        assert got == _reference_greedy(model, params, p, 24)
    assert res.stats.nfe_per_token == 1.0
    assert res.stats.target_nfe.tolist() == [24, 24, 24]


@pytest.mark.parametrize("k,fallback", [(1, True), (3, True), (6, True), (4, False)])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ngram_greedy_identical_to_ar(arch, k, fallback):
    model, params = tiny_model(64, arch=arch, seed=1)
    prompts = _prompts(64, seed=2)
    ar = generate(model, params, prompts, max_new_tokens=40, bucket=16)
    sd = generate(model, params, prompts, max_new_tokens=40, bucket=16,
                  drafter=NgramDrafter(k, 64, max_ngram=3, bigram_fallback=fallback))
    assert sd.tokens == ar.tokens
    # the drafter must actually have helped somewhere, otherwise the test checks nothing
    assert sd.stats.accept_hist[:, 2:].sum() > 0
    assert (sd.stats.target_nfe <= ar.stats.target_nfe).all()


def test_eos_and_budget_cut():
    model, params = tiny_model(64, seed=3)
    prompts = _prompts(64, seed=4)
    ar = generate(model, params, prompts, max_new_tokens=30, bucket=16)
    eos = ar.tokens[1][5]  # a token the model does emit
    ref = [_reference_greedy(model, params, p, 30, eos=(eos,)) for p in prompts]
    for drafter in (None, NgramDrafter(4, 64)):
        res = generate(model, params, prompts, max_new_tokens=30, bucket=16, eos_ids=(eos,),
                       drafter=drafter)
        assert res.tokens == ref
        assert res.tokens[1][-1] == eos and len(res.tokens[1]) <= 6


def test_batch_rows_independent_of_padding():
    model, params = tiny_model(64, seed=5)
    prompts = _prompts(64, seed=6)
    batch = generate(model, params, prompts, max_new_tokens=16, bucket=64,
                     drafter=NgramDrafter(3, 64))
    for i, p in enumerate(prompts):
        single = generate(model, params, [p], max_new_tokens=16, bucket=16,
                          drafter=NgramDrafter(3, 64))
        assert single.tokens[0] == batch.tokens[i]


def _exact_joint(model, params, prompt, n_new, cfg):
    """Enumerate p(x_1..x_n | prompt) under the processed distribution of ``cfg``."""
    V = model.config.vocab_size
    probs = {}
    for seq in itertools.product(range(V), repeat=n_new):
        lp = 0.0
        for i in range(n_new):
            logits = _full_logits(model, params, list(prompt) + list(seq[:i]))
            lp += float(process_logits(jnp.asarray(logits), cfg)[seq[i]])
        probs[seq] = np.exp(lp)
    return probs


def _tv_and_chi2(samples, exact):
    n = len(samples)
    keys = list(exact)
    counts = {k: 0 for k in keys}
    for s in samples:
        counts[tuple(s)] += 1
    obs = np.array([counts[k] for k in keys], float)
    exp = np.array([exact[k] for k in keys]) * n
    tv = 0.5 * np.abs(obs / n - exp / n).sum()
    # chi-square over cells with expected count >= 5, the rest pooled into one cell
    big = exp >= 5
    o = np.append(obs[big], obs[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    if e[-1] < 5:
        o, e = o[:-1], e[:-1]
        e = e * o.sum() / e.sum()
    return tv, sps.chisquare(o, e).pvalue


@pytest.mark.parametrize("cfg,k", [(SamplingConfig(temperature=1.0), 3),
                                   (SamplingConfig(temperature=0.8, top_k=4, top_p=0.9), 2)])
def test_sampling_distribution_exact(cfg, k):
    """Speculative (n-gram) and AR sampling both match the enumerated joint distribution."""
    V, n_new, N = 6, 3, 20000
    model, params = tiny_model(V, seed=7, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, n_new, cfg)
    assert abs(sum(exact.values()) - 1) < 1e-4
    results = {}
    for name, drafter in (("ar", None), ("ngram", NgramDrafter(k, V, max_ngram=2, min_ngram=1)),
                          ("ngram-nofb", NgramDrafter(k, V, max_ngram=3, min_ngram=1, bigram_fallback=False))):
        res = generate(model, params, [prompt] * N, max_new_tokens=n_new, sampling=cfg,
                       drafter=drafter, seed=11, bucket=8)
        tv, pval = _tv_and_chi2(res.tokens, exact)
        results[name] = (tv, pval, res.stats.acceptance_rate)
    # noise floor: the TV of N exact samples drawn with numpy
    rng = np.random.default_rng(0)
    keys = list(exact)
    idx = rng.choice(len(keys), size=N, p=np.array([exact[k] for k in keys]) / sum(exact.values()))
    tv_floor, _ = _tv_and_chi2([keys[i] for i in idx], exact)
    for name, (tv, pval, acc) in results.items():
        assert pval > 1e-3, (name, tv, pval, tv_floor)
        assert tv < 2.5 * tv_floor + 0.01, (name, tv, tv_floor)
    for name in ("ngram", "ngram-nofb"):
        assert 0.02 < results[name][2] < 0.95, results  # drafts were accepted and rejected


def test_seed_reproducible():
    model, params = tiny_model(64, seed=8)
    cfg = SamplingConfig(temperature=1.0, top_p=0.95)
    a = generate(model, params, _prompts(64), max_new_tokens=12, sampling=cfg, seed=5,
                 drafter=NgramDrafter(3, 64), bucket=16)
    b = generate(model, params, _prompts(64), max_new_tokens=12, sampling=cfg, seed=5,
                 drafter=NgramDrafter(3, 64), bucket=16)
    c = generate(model, params, _prompts(64), max_new_tokens=12, sampling=cfg, seed=6,
                 drafter=NgramDrafter(3, 64), bucket=16)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def test_bad_input():
    model, params = tiny_model(64, ctx=64)
    with pytest.raises(DecodeInputError, match="exceeds the model's context"):
        generate(model, params, [[1] * 60], max_new_tokens=10)
    with pytest.raises(DecodeInputError, match="empty prompt"):
        generate(model, params, [[]], max_new_tokens=10)
    with pytest.raises(DecodeInputError, match="max_new_tokens"):
        generate(model, params, [[1]], max_new_tokens=0)
    with pytest.raises(DecodeInputError, match="token ids"):
        generate(model, params, [[1, 99]], max_new_tokens=4)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        generate(model, params, [[1]], max_new_tokens=4, drafter=NgramDrafter(2, 128))
    with pytest.raises(ValueError, match="draft length"):
        NgramDrafter(0, 64)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1, top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1, top_p=1.5)
