"""Reference masked-diffusion decoders (:mod:`jaxspec.dllm.decode`) against a plain numpy oracle.

The oracle below is a separate, un-jitted, one-row-at-a-time implementation of the same
algorithm (LLaDA ``generate.py`` loop structure, Dream's confidence rules, fixed-k and
Fast-dLLM threshold transfer). It runs each prompt alone, unpadded, so agreement also checks
left padding. It shares only the model forward and the random numbers
(:func:`jaxspec.dllm.reference.row_noise`, keyed by batch row and the row's step). For the Fast-dLLM
caches it keeps its own exact, unpadded windows and (for Dream) the cached logit row, and it
restarts every cached step from the block's first-step cache, using only the model's KV-cache
forward (itself checked against transformers in test_parity).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from jaxspec.dllm import (
    DiffusionDecodeConfig,
    diffusion_generate,
    num_transfer_tokens,
    prefix_widths,
    row_noise,
)
from jaxspec.testing.tiny import tiny_diffusion_model
from models.llama.modeling import init_cache

VOCAB, MASK = 40, 39
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 1, 4]]
SEED = 3


MODELS = {h: tiny_diffusion_model(h, vocab=VOCAB) for h in ("llada", "dream")}
_noise = jax.jit(row_noise, static_argnums=(3, 4, 5))


@functools.lru_cache(maxsize=None)
def _forward(head: str):
    model, params = MODELS[head]
    return jax.jit(lambda toks: model.apply(params, toks, np.arange(toks.shape[1])[None])[0])


@functools.lru_cache(maxsize=None)
def _forward_cached(head: str):
    """Raw (unshifted) logits of ``toks`` placed at slot ``start`` of ``cache`` (one row,
    every cache slot visible), and the updated cache."""
    model, params = MODELS[head]

    def f(toks, cache, start):
        T, S = toks.shape[1], cache.size
        pos = start + np.arange(T)[None]
        return model.apply(
            params,
            toks,
            pos,
            np.ones((1, T, S), bool),
            cache=cache,
            cache_index=np.full((1,), start, np.int32),
            shift=False,
        )

    return jax.jit(f, static_argnums=2)


# ----------------------------------------------------------------------------- the oracle


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def oracle(head, prompt, row, batch, c: DiffusionDecodeConfig, seed, eos=()):
    """Decode one prompt (row ``row`` of a batch of ``batch``) with plain numpy loops.

    Returns ``(tokens (G,), transfer_step (G,), nfe, forward_tokens)``."""
    fwd, fwdc = _forward(head), _forward_cached(head)
    model, _ = MODELS[head]
    cfg_base, shift = model.config.base, int(head == "dream")
    key = jax.random.PRNGKey(seed)
    G, L, T = c.gen_length, c.block_length, c.temperature
    n = len(prompt)
    x = np.array(list(prompt) + [MASK] * G, np.int64)
    is_masked = np.zeros(n + G, bool)
    is_masked[n:] = True
    tstep = np.full(G, -1)
    step = nfe = ftok = 0
    num_blocks = G // L
    for blk in range(num_blocks):
        lo = n + blk * L
        if c.method == "stepwise":
            spb = c.steps // num_blocks
            counts = [L // spb + (1 if i < L % spb else 0) for i in range(spb)]
            t_grid = np.linspace(1.0, c.eps, spb + 1)
        i = 0
        while True:
            if c.method == "stepwise" and i == spb:
                break
            if c.method != "stepwise" and not is_masked[lo : lo + L].any():
                break
            un = x.copy()
            un[:n] = MASK
            seqs = [x, un] if c.cfg_scale > 0 else [x]
            if c.cache == "none":
                outs = [np.asarray(fwd(q[None].astype(np.int32)))[0][lo : lo + L] for q in seqs]
            elif i == 0:  # block's first step: full forward, keep the caches
                outs, caches, prevs = [], [], []
                for q in seqs:
                    raw, cache = fwdc(q[None].astype(np.int32), init_cache(cfg_base, 1, n + G), 0)
                    raw = np.asarray(raw)[0]
                    caches.append(cache)
                    prevs.append(raw[lo - 1])
                    outs.append(raw[lo - shift : lo - shift + L])
            else:  # window against the block's first-step cache
                end = n + G if c.cache == "prefix" else lo + L
                outs = []
                for q, cache, prev in zip(seqs, caches, prevs):
                    raw = np.asarray(fwdc(x[None, lo:end].astype(np.int32), cache, lo)[0])[0]
                    outs.append(np.concatenate([prev[None], raw[: L - 1]]) if shift else raw[:L])
            nfe += len(seqs)
            ftok += (
                n + G if c.cache == "none" or i == 0 else (n + G - lo if c.cache == "prefix" else L)
            )
            logits = outs[0].astype(np.float32)
            if c.cfg_scale > 0:
                unl = outs[1].astype(np.float32)
                logits = unl + np.float32(c.cfg_scale + 1.0) * (logits - unl)
            u_tok, u_pos = _noise(key, row, step, L, VOCAB, T > 0)
            u_pos = np.asarray(u_pos)

            def process(keep_mask):
                lg = logits.copy()
                if not keep_mask:
                    lg[:, MASK] = -np.inf
                if c.logits_eos_inf:
                    lg[:, list(eos)] = -np.inf
                sc = lg / np.float32(T) if T > 0 else lg
                if c.top_k:
                    sc = np.where(sc >= np.sort(sc, -1)[:, -c.top_k][:, None], sc, -np.inf)
                if c.top_p < 1:
                    p_ = _softmax(sc)
                    keep = np.zeros_like(p_, bool)
                    for r_ in range(L):
                        o_ = np.argsort(-p_[r_], kind="stable")
                        need = int(np.searchsorted(np.cumsum(p_[r_][o_]), c.top_p) + 1)
                        keep[r_] = p_[r_] >= p_[r_][o_[min(need, VOCAB) - 1]]
                    sc = np.where(keep, sc, -np.inf)
                return lg, sc

            lg, sc = process(False)
            if T > 0:
                g = -np.log(-np.log(np.asarray(u_tok)))
                x0 = np.argmax(sc + g, -1)
            else:
                x0 = np.argmax(sc, -1)
            if c.confidence_softmax == "official":  # the [MASK] logit stays in the softmax
                lg, sc = process(True)
            if c.remasking in ("random", "origin"):
                conf = u_pos.copy()
            elif c.remasking == "low_confidence":
                conf = _softmax(lg)[np.arange(L), x0]
            else:
                p = _softmax(sc)
                if c.remasking == "maskgit_plus":
                    conf = p[np.arange(L), x0]
                elif c.remasking == "topk_margin":
                    s = np.sort(p, -1)
                    conf = s[:, -1] - s[:, -2]
                else:
                    conf = (p * np.log(p + np.float32(1e-10))).sum(-1)
            m = is_masked[lo : lo + L]
            if c.confidence_eos_eot_inf:
                conf = np.where(np.isin(x0, eos), np.finfo(np.float32).min, conf)
            conf = np.where(m, conf, -np.inf)
            if c.alg_temp > 0:  # Dream's multinomial draw, as Gumbel-top-k
                key_ = np.where(m, conf / np.float32(c.alg_temp) - np.log(-np.log(u_pos)), -np.inf)
                order = np.argsort(-key_, kind="stable")
            else:
                order = np.argsort(-conf, kind="stable")
            chosen = []
            if c.block_start == "first-position" and i == 0:
                # Fast-dLLM's Dream block decoder: the block's full forward writes the first
                # position's prediction only (generation_utils_block.py, _sample)
                chosen = [0]
            elif c.remasking == "origin":
                p_t = 1.0 - t_grid[i + 1] / t_grid[i] if i < spb - 1 else 1.0
                chosen = [j for j in range(L) if m[j] and u_pos[j] < np.float32(p_t)]
            elif c.method == "stepwise" and c.schedule == "dream":
                n_left = int(m.sum())
                frac = np.float32(1.0 - t_grid[i + 1] / t_grid[i])
                k = n_left if i == spb - 1 else int(np.float32(n_left) * frac)
                chosen = list(order[:k])
            elif c.method == "stepwise":
                chosen = list(order[: counts[i]])
            elif c.method == "fixed-k":
                chosen = list(order[: min(c.tokens_per_step, m.sum())])
            else:
                chosen = [order[0]] + [j for j in order[1 : m.sum()] if conf[j] >= c.threshold]
            for j in chosen:
                x[lo + j] = x0[j]
                is_masked[lo + j] = False
                tstep[blk * L + j] = step
            step += 1
            i += 1
    return x[n:], tstep, nfe, ftok


# ----------------------------------------------------------------------------- agreement

FIRST = dict(block_start="first-position")
CASES = [
    ("llada", dict(gen_length=8, block_length=4, steps=8)),  # 1 token / step, greedy
    ("llada", dict(gen_length=16, block_length=8, steps=8)),  # 2 tokens / step
    ("llada", dict(gen_length=8, block_length=8, steps=3)),  # remainder: 3, 3, 2
    ("llada", dict(gen_length=8, block_length=4, steps=4, remasking="random", temperature=1.0)),
    (
        "llada",
        dict(gen_length=8, block_length=8, steps=4, remasking="maskgit_plus", temperature=0.7),
    ),
    ("llada", dict(gen_length=8, block_length=4, steps=4, remasking="topk_margin")),
    ("llada", dict(gen_length=8, block_length=4, steps=6, remasking="origin", temperature=0.5)),
    ("llada", dict(gen_length=8, block_length=4, tokens_per_step=3)),
    ("llada", dict(gen_length=8, block_length=4, threshold=0.3)),
    ("llada", dict(gen_length=8, block_length=4, threshold=0.6, remasking="topk_margin")),
    ("llada", dict(gen_length=8, block_length=4, steps=4, cfg_scale=1.5, temperature=0.8)),
    ("dream", dict(gen_length=8, block_length=4, steps=8, remasking="entropy", temperature=0.5)),
    ("dream", dict(gen_length=8, block_length=8, threshold=0.5, remasking="maskgit_plus")),
    (
        "dream",
        dict(gen_length=8, block_length=8, steps=4, remasking="topk_margin", schedule="dream"),
    ),
    # Dream's sampling knobs: top-k / top-p filtering, alg_temp position sampling
    (
        "dream",
        dict(
            gen_length=8,
            block_length=4,
            steps=8,
            remasking="entropy",
            temperature=0.7,
            top_k=5,
            top_p=0.9,
        ),
    ),
    (
        "dream",
        dict(
            gen_length=8,
            block_length=8,
            steps=4,
            remasking="maskgit_plus",
            temperature=0.5,
            alg_temp=0.5,
        ),
    ),
    ("llada", dict(gen_length=8, block_length=4, tokens_per_step=2, alg_temp=0.2)),
    # jaxspec's earlier confidence rule ([MASK] dropped from the confidence softmax)
    ("llada", dict(gen_length=8, block_length=4, threshold=0.3, confidence_softmax="renormalized")),
    (
        "dream",
        dict(
            gen_length=8,
            block_length=4,
            steps=8,
            remasking="entropy",
            temperature=0.7,
            top_k=5,
            top_p=0.9,
            confidence_softmax="renormalized",
        ),
    ),
    # Fast-dLLM prefix and dual caches (each is its own reference)
    ("llada", dict(gen_length=16, block_length=4, steps=16, cache="prefix")),
    (
        "llada",
        dict(gen_length=16, block_length=1, steps=16, cache="prefix"),
    ),  # 16 blocks: padded widths
    ("llada", dict(gen_length=16, block_length=4, threshold=0.5, cache="dual")),
    (
        "llada",
        dict(gen_length=16, block_length=4, tokens_per_step=2, cache="prefix", temperature=0.8),
    ),
    (
        "llada",
        dict(gen_length=8, block_length=4, steps=4, cfg_scale=1.5, temperature=0.8, cache="dual"),
    ),
    ("dream", dict(gen_length=16, block_length=4, steps=16, cache="dual")),
    # Fast-dLLM's Dream block decoder: threshold 0.9 with the dual cache (its peer setting),
    # the prefix cache, and its non-threshold branch (entropy, Dream schedule from step 1)
    ("dream", dict(gen_length=16, block_length=4, threshold=0.9, cache="dual", **FIRST)),
    ("dream", dict(gen_length=16, block_length=8, threshold=0.3, cache="prefix", **FIRST)),
    (
        "dream",
        dict(
            gen_length=16,
            block_length=8,
            steps=8,
            remasking="entropy",
            schedule="dream",
            cache="dual",
            **FIRST,
        ),
    ),
    ("llada", dict(gen_length=8, block_length=4, threshold=0.3, **FIRST)),
    (
        "dream",
        dict(
            gen_length=16, block_length=4, threshold=0.5, remasking="maskgit_plus", cache="prefix"
        ),
    ),
]


@pytest.mark.parametrize("head,kw", CASES, ids=[f"{h}-{i}" for i, (h, _) in enumerate(CASES)])
def test_matches_numpy_oracle(head, kw):
    c = DiffusionDecodeConfig(**kw)
    model, params = MODELS[head]
    res = diffusion_generate(model, params, PROMPTS, c, seed=SEED)
    assert res.full_tokens.shape == res.transfer_step.shape == (len(PROMPTS), c.gen_length)
    ftok = 0
    for b, p in enumerate(PROMPTS):
        toks, tstep, nfe, ft = oracle(head, p, b, len(PROMPTS), c, SEED)
        np.testing.assert_array_equal(res.full_tokens[b], toks)
        np.testing.assert_array_equal(res.transfer_step[b], tstep)
        assert res.stats.target_nfe[b] == nfe
        ftok += ft
    # forward_tokens: every step pushes the padded sequence (P = 16 here), except cached
    # steps after a block's first, which push the block alone (dual)
    S = 16 + c.gen_length
    if c.cache == "none":
        assert res.stats.extra["forward_tokens"] == res.stats.steps.sum() * S
    elif c.cache == "dual":
        nb = c.num_blocks
        assert res.stats.extra["forward_tokens"] == sum(
            nb * S + (s - nb) * c.block_length for s in res.stats.steps
        )
    assert (res.transfer_step >= 0).all() and (res.full_tokens != MASK).all()
    # blocks are filled in order: every position of block k is transferred before block k+1
    L = c.block_length
    for b in range(len(PROMPTS)):
        per_block = res.transfer_step[b].reshape(-1, L)
        assert (per_block[:-1].max(1) < per_block[1:].min(1)).all()
    st = res.stats
    assert st.method == c.method and st.reference == "stepwise"
    assert (st.accept_hist.sum(1) == st.steps).all()
    assert ((st.accept_hist * np.arange(L + 1)).sum(1) == c.gen_length).all()
    assert (st.target_nfe == st.steps * (2 if c.cfg_scale > 0 else 1)).all()
    if c.method == "stepwise":
        assert (st.steps == c.steps).all()


def test_one_token_per_step_greedy_identical_across_methods():
    """Greedy, one token per step: stepwise (steps = gen_length), fixed-k with k = 1 and an
    unreachable threshold are the same decoder, bit for bit (tokens and transfer order)."""
    model, params = MODELS["llada"]
    runs = [
        diffusion_generate(model, params, PROMPTS, DiffusionDecodeConfig(8, 4, **kw))
        for kw in (dict(steps=8), dict(tokens_per_step=1), dict(threshold=2.0))
    ]
    for r in runs[1:]:
        np.testing.assert_array_equal(r.full_tokens, runs[0].full_tokens)
        np.testing.assert_array_equal(r.transfer_step, runs[0].transfer_step)
        np.testing.assert_array_equal(r.stats.target_nfe, runs[0].stats.target_nfe)
    assert sorted(runs[0].transfer_step[0].tolist()) == list(range(8))
    # batch of one (no padding) gives the same row
    solo = diffusion_generate(model, params, PROMPTS[1:], DiffusionDecodeConfig(8, 4, steps=8))
    np.testing.assert_array_equal(solo.full_tokens[0], runs[0].full_tokens[1])


def test_threshold_parallel_and_seed_reproducible():
    model, params = MODELS["llada"]
    r = diffusion_generate(model, params, PROMPTS, DiffusionDecodeConfig(8, 4, threshold=0.3))
    assert r.stats.steps.max() < 8, "threshold decoding should transfer >1 token in some steps"
    # numeric knobs are traced: another threshold / temperature reuses the executable
    r2 = diffusion_generate(model, params, PROMPTS, DiffusionDecodeConfig(8, 4, threshold=0.9))
    assert r2.compile_s == 0.0 and r2.stats.steps.sum() >= r.stats.steps.sum()
    c2 = DiffusionDecodeConfig(8, 4, steps=4, temperature=1.0, remasking="random")
    a = diffusion_generate(model, params, PROMPTS, c2, seed=7)
    b = diffusion_generate(model, params, PROMPTS, c2, seed=7)
    assert b.compile_s == 0.0
    np.testing.assert_array_equal(a.full_tokens, b.full_tokens)


def test_eos_cut_and_stats():
    model, params = MODELS["llada"]
    c = DiffusionDecodeConfig(8, 4, steps=8)
    r = diffusion_generate(model, params, PROMPTS, c)
    eos = int(r.full_tokens[0, 2])
    cut = diffusion_generate(model, params, PROMPTS, c, eos_ids=(eos,))
    first = int(np.argmax(r.full_tokens[0] == eos))
    assert cut.tokens[0] == r.full_tokens[0, : first + 1].tolist()
    assert cut.stats.new_tokens[0] == first + 1
    assert (cut.stats.target_nfe == 8).all()


def test_schedule():
    np.testing.assert_array_equal(num_transfer_tokens(10, 4), [3, 3, 2, 2])
    np.testing.assert_array_equal(num_transfer_tokens(4, 6), [1, 1, 1, 1, 0, 0])
    assert num_transfer_tokens(32, 8).sum() == 32


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(gen_length=10, block_length=4), "multiple"),
        (dict(gen_length=8, block_length=4, steps=5), "divisible"),
        (dict(remasking="nope"), "remasking"),
        (dict(tokens_per_step=2, threshold=0.5), "exclusive"),
        (dict(tokens_per_step=0), "tokens_per_step"),
        (dict(remasking="origin", threshold=0.5), "origin"),
        (dict(temperature=-1.0), "temperature"),
        (dict(schedule="cosine"), "schedule"),
    ],
)
def test_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        DiffusionDecodeConfig(**kw)


def test_input_errors():
    model, params = MODELS["llada"]
    with pytest.raises(ValueError, match="vocabulary"):
        diffusion_generate(model, params, PROMPTS, DiffusionDecodeConfig(8, 4, 8, mask_id=VOCAB))
    with pytest.raises(ValueError, match="context"):
        diffusion_generate(model, params, PROMPTS, DiffusionDecodeConfig(40, 8, 40))
    with pytest.raises(ValueError, match="prompt"):
        diffusion_generate(model, params, [[]], DiffusionDecodeConfig(8, 4, 8))
    with pytest.raises(ValueError, match="token ids"):
        diffusion_generate(model, params, [[VOCAB]], DiffusionDecodeConfig(8, 4, 8))


def test_threshold_follows_the_official_confidence_softmax():
    """Threshold decoding decides as LLaDA generate.py / Fast-dLLM get_transfer_index do: the
    confidence is softmax(logits)[x0] with the [MASK] logit in the softmax. With the threshold
    set between the official confidence of the second most confident position and its
    renormalized confidence p / (1 - p_mask), the first step transfers only the most confident
    position under the official rule and both under the renormalized one."""
    model, params = MODELS["llada"]
    prompt = PROMPTS[0]
    x = np.array([prompt + [MASK] * 4], np.int32)
    logits = np.asarray(_forward("llada")(x), np.float64)[0, len(prompt) :]
    p_all = _softmax(logits)
    no_mask = logits.copy()
    no_mask[:, MASK] = -np.inf
    x0 = np.argmax(no_mask, -1)
    official = p_all[np.arange(4), x0]
    renorm = official / (1.0 - p_all[:, MASK])
    second = int(np.argsort(-official, kind="stable")[1])
    assert np.argsort(-renorm, kind="stable")[1] == second and renorm[second] > official[second]
    thr = float((official[second] + renorm[second]) / 2)
    assert renorm[second] - official[second] > 1e-4  # a margin float32 cannot blur
    steps = {}
    for rule in ("official", "renormalized"):
        c = DiffusionDecodeConfig(4, 4, threshold=thr, confidence_softmax=rule)
        res = diffusion_generate(model, params, [prompt], c, seed=SEED)
        steps[rule] = res.transfer_step[0]
        toks, tstep, _, _ = oracle("llada", prompt, 0, 1, c, SEED)
        np.testing.assert_array_equal(res.transfer_step[0], tstep)  # the oracle agrees
    assert (steps["official"] == 0).sum() == 1, steps
    assert (steps["renormalized"] == 0).sum() >= 2, steps
    with pytest.raises(ValueError, match="confidence_softmax"):
        DiffusionDecodeConfig(4, 4, confidence_softmax="p")


@pytest.mark.parametrize("opt", ["logits_eos_inf", "confidence_eos_eot_inf"])
def test_eos_options_match_oracle(opt):
    """LLaDA's EOS/EoT options, with the two most frequent greedy tokens playing EOS/EoT."""
    model, params = MODELS["llada"]
    base = diffusion_generate(model, params, PROMPTS, DiffusionDecodeConfig(8, 4, steps=4))
    vals, counts = np.unique(base.full_tokens, return_counts=True)
    eos = tuple(int(v) for v in vals[np.argsort(-counts)[:2]])
    c = DiffusionDecodeConfig(8, 4, steps=4, **{opt: True})
    res = diffusion_generate(model, params, PROMPTS, c, seed=SEED, eos_ids=eos)
    for b, p in enumerate(PROMPTS):
        toks, tstep, _, _ = oracle("llada", p, b, len(PROMPTS), c, SEED, eos)
        np.testing.assert_array_equal(res.full_tokens[b], toks)
        np.testing.assert_array_equal(res.transfer_step[b], tstep)
    if opt == "logits_eos_inf":
        assert not np.isin(res.full_tokens, eos).any()
    else:
        assert not np.array_equal(res.transfer_step, base.transfer_step)
    with pytest.raises(ValueError, match="eos_ids"):
        diffusion_generate(model, params, PROMPTS, c)


def test_prefix_widths():
    """Prefix-cache windows: at most 8 distinct widths, each covering its block's exact
    window ``gen_length - b * block_length``, and a cache big enough for all of them."""
    for G, L, P in ((16, 1, 16), (256, 32, 160), (256, 8, 48), (12, 4, 16)):
        c = DiffusionDecodeConfig(G, L, G, cache="prefix")
        widths, size = prefix_widths(P, c)
        assert len(widths) == G // L and len(set(widths)) <= 8
        assert all(w >= G - b * L and w % L == 0 for b, w in enumerate(widths))
        assert size == max(P + b * L + w for b, w in enumerate(widths)) and size >= P + G
    assert prefix_widths(16, DiffusionDecodeConfig(12, 4, 12, cache="prefix"))[0] == (12, 8, 4)


def test_first_position_block_start_opens_every_block_with_its_first_position():
    """Fast-dLLM's Dream block rule: a block's first step transfers its first position alone
    (on this model and prompt the plain threshold rule decides differently there)."""
    model, params = MODELS["dream"]
    kw = dict(gen_length=16, block_length=4, threshold=0.05, cache="dual")
    first = diffusion_generate(
        model, params, PROMPTS, DiffusionDecodeConfig(**kw, block_start="first-position")
    )
    plain = diffusion_generate(model, params, PROMPTS, DiffusionDecodeConfig(**kw))
    for res, opening_alone in ((first, True), (plain, False)):
        ts = np.asarray(res.transfer_step).reshape(len(PROMPTS), 4, 4)  # (B, blocks, L)
        at_open = ts == ts.min(-1, keepdims=True)
        alone = (at_open.sum(-1) == 1) & at_open[..., 0]
        assert alone.all() == opening_alone, ts


@pytest.mark.parametrize(
    "kw",
    [
        dict(block_start="first"),
        dict(block_start="first-position", steps=16),  # LLaDA schedule
        dict(block_start="first-position", tokens_per_step=2),
    ],
)
def test_block_start_errors(kw):
    with pytest.raises(ValueError, match="block_start"):
        DiffusionDecodeConfig(gen_length=16, block_length=4, **kw)


def test_block_start_through_the_registry():
    from jaxspec.methods import MethodError, get_method

    c = get_method("threshold").configure(
        threshold=0.9, block_start="first-position", gen_length=16, block_length=4
    )
    assert c.diffusion().block_start == "first-position"
    with pytest.raises(MethodError, match="block-start"):
        get_method("stepwise").configure(block_start="first-position")
