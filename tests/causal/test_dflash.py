"""DFlash (:mod:`jaxspec.causal.dflash`): the target's hidden-state option, greedy identity
with AR, the exact sampled distribution, the drafter's feature cache, bad input, and the
training objective (:mod:`jaxspec.training.dflash`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import generate
from jaxspec.causal.dflash import (
    Config,
    DFlashDrafter,
    DFlashSpec,
    block_logits,
    build_draft_vocab,
    check_draft_vocab,
    context_kv,
    default_layer_ids,
    drafter_params,
    draw_drafts,
    init_drafter,
    load_draft_vocab,
    load_drafter,
    save_drafter,
)
from jaxspec.core.drafters import DraftContext, LookupFirst, NgramDrafter
from jaxspec.core.sampling import SamplingConfig, process_logits
from jaxspec.testing.distribution import check_distribution, enumerate_chain
from jaxspec.testing.tiny import tiny_model
from models.llama.modeling import CausalLM, init_cache, rms_norm, unstack_layers

PROMPTS = [[3, 9, 4, 9, 4, 9, 4, 17, 2], [5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


def _causal(T):
    return jnp.tril(jnp.ones((T, T), bool))[None]


@pytest.mark.parametrize("arch,stacked", [("llama", True), ("qwen2", False)])
def test_hidden_layers_match_a_separate_pass(arch, stacked):
    """A cached pass with ``hidden_layers`` returns the same logits as without it, and the
    residual stream after layer ``i`` equals (after the final norm) the output of a separate
    pass of the model cut to its first ``i + 1`` layers; both layer loops (scan over stacked
    weights, unrolled per-layer weights)."""
    model, params = tiny_model(64, arch=arch, layers=3, seed=4)
    toks = jnp.asarray([[5, 9, 2, 33, 7, 1, 8]])
    T = toks.shape[1]
    pos = jnp.arange(T)[None]
    run = params if stacked else unstack_layers(params)
    cache = init_cache(model.config, 1, T)
    ids = (2, 0, 1)
    plain, _ = model.apply(
        {"params": run}, toks, pos, _causal(T), cache=cache, cache_index=jnp.zeros((1,), jnp.int32)
    )
    logits, _, hidden = model.apply(
        {"params": run},
        toks,
        pos,
        _causal(T),
        cache=cache,
        cache_index=jnp.zeros((1,), jnp.int32),
        hidden_layers=ids,
    )
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(plain))
    assert hidden.shape == (1, T, 3, model.config.hidden_size)
    for j, i in enumerate(ids):
        cut_cfg = model.config.replace(num_layers=i + 1)
        cut = dict(params, layers={k: v[: i + 1] for k, v in params["layers"].items()})
        want, _ = CausalLM(cut_cfg).apply(
            {"params": cut}, toks, pos, _causal(T), return_hidden=True
        )
        got = rms_norm(hidden[:, :, j], params["final_norm"], model.config.rms_norm_eps)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    with pytest.raises(ValueError, match="hidden_layers"):
        model.apply({"params": params}, toks, pos, _causal(T), hidden_layers=(3,))


def _drafter(
    model,
    params,
    block=4,
    layers=1,
    ids=(0, 1),
    seed=1,
    sampling=SamplingConfig(),
    scale=1.0,
    vocab=None,
):
    spec = DFlashSpec.for_target(model.config, block_size=block, num_layers=layers, layer_ids=ids)
    own = jax.tree_util.tree_map(
        lambda x: x * scale if x.ndim >= 2 else x, init_drafter(spec, seed)
    )
    return DFlashDrafter(spec, sampling), drafter_params(own, params, vocab)


@pytest.mark.parametrize(
    "arch,block,layers,vocab",
    [
        ("llama", 4, 1, None),
        ("qwen2", 3, 2, None),
        ("llama", 4, 1, tuple(range(1, 64, 3))),
        ("qwen2", 3, 2, tuple(range(1, 64, 3))),
    ],
)
def test_greedy_identical_to_ar(arch, block, layers, vocab):
    """A padded batch of three prompts with EOS inside the vocabulary (tied and untied LM
    heads, one and two drafter layers, the whole LM head or a draft vocabulary of 21 of the
    64 ids): tokens identical to AR; one drafter forward and ``B - 1`` drafts per
    verification step."""
    model, params = tiny_model(64, arch=arch, seed=0)
    drafter, dparams = _drafter(model, params, block, layers, scale=8.0, vocab=vocab)
    ar = generate(model, params, PROMPTS, max_new_tokens=24, eos_ids=(7,), bucket=16)
    res = generate(
        model,
        params,
        PROMPTS,
        max_new_tokens=24,
        eos_ids=(7,),
        bucket=16,
        drafter=drafter,
        drafter_params=dparams,
    )
    assert res.tokens == ar.tokens
    st = res.stats
    np.testing.assert_array_equal(st.draft_nfe, st.steps)
    np.testing.assert_array_equal(st.drafts_proposed, (block - 1) * st.steps)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_draft_vocabulary_logits(arch):
    """With a draft vocabulary the drafter's logits equal the whole head's on its ids and are
    -inf elsewhere (untied and tied LM heads), so drafts drawn from them stay inside it; the
    registry's entry passes its draft vocabulary through."""
    model, params = tiny_model(64, arch=arch, seed=0)
    vocab = np.arange(1, 64, 3)  # 21 of 64 ids
    spec = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0, 1))
    own = jax.tree_util.tree_map(lambda x: 8.0 * x if x.ndim >= 2 else x, init_drafter(spec, 1))
    full, sub = drafter_params(own, params), drafter_params(own, params, vocab)
    assert ("lm_head" in params) == (arch == "llama")  # untied, tied
    hidden = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 2, model.config.hidden_size))
    pos = jnp.tile(jnp.arange(5)[None], (2, 1))
    ck, cv = context_kv(spec, own, hidden, pos)
    frame = (jnp.array([3, 4]), jnp.tile(jnp.arange(5, 9)[None], (2, 1)), ck, cv)
    mask = jnp.ones((2, 5), bool)
    lf, ls = (block_logits(spec, p, *frame, mask) for p in (full, sub))
    np.testing.assert_allclose(
        np.asarray(ls)[..., vocab], np.asarray(lf)[..., vocab], rtol=1e-5, atol=1e-5
    )
    outside = np.setdiff1d(np.arange(64), vocab)
    assert np.isneginf(np.asarray(ls)[..., outside]).all()
    cfg = SamplingConfig(temperature=1.5, top_p=0.95)
    keys = jax.random.split(jax.random.PRNGKey(3), 200)
    tokens, q = jax.vmap(lambda k: draw_drafts(k, ls, cfg, True))(keys)
    assert np.isin(np.asarray(tokens), vocab).all()
    assert float(np.asarray(q)[..., outside].max()) == 0.0
    # the registry's entry passes its draft vocabulary through
    entry = Config(max_new_tokens=24, draft_length=3, drafter_model=(spec, own), draft_vocab=vocab)
    np.testing.assert_array_equal(entry.drafter_params(params)["vocab"], vocab)


def test_draft_vocabulary_build_and_bad_input(tmp_path):
    """build_draft_vocab keeps the most frequent ids (ties to the lower id) and the always-ids;
    a bad vocabulary or file gives one-line errors naming the problem."""
    seqs = [[5, 5, 5, 2, 2, 9], [9, 2, 1, 7]]  # counts: 2 x3, 5 x3, 9 x2, 1 x1, 7 x1
    np.testing.assert_array_equal(build_draft_vocab(seqs, 3), [2, 5, 9])
    np.testing.assert_array_equal(build_draft_vocab(seqs, 3, always=(0,)), [0, 2, 5])
    np.testing.assert_array_equal(build_draft_vocab(seqs, 4, always=(7,)), [2, 5, 7, 9])
    assert build_draft_vocab(seqs, 3).dtype == np.int32
    with pytest.raises(ValueError, match="must be >= 1"):
        build_draft_vocab(seqs, 1, always=(0, 1))
    for bad, msg in (
        ([], "empty"),
        ([1, 1, 2], "repeats 1 ids"),
        ([3, 64], "outside the target's vocabulary 0..63"),
        ([[1, 2]], "1-D array of token ids"),
        ([0.5, 1.0], "1-D array of token ids"),
    ):
        with pytest.raises(ValueError, match=msg):
            check_draft_vocab(bad, 64)
    np.testing.assert_array_equal(check_draft_vocab([9, 1, 4], 64), [1, 4, 9])
    with pytest.raises(ValueError, match="draft vocabulary file does not exist"):
        load_draft_vocab(tmp_path / "none.npy", 64)
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(ValueError, match="junk.npy: not a readable .npy"):
        load_draft_vocab(tmp_path / "junk.npy", 64)
    np.save(tmp_path / "big.npy", np.array([1, 70]))
    with pytest.raises(ValueError, match="big.npy: draft vocabulary ids 1..70 outside"):
        load_draft_vocab(tmp_path / "big.npy", 64)
    np.save(tmp_path / "ok.npy", np.array([8, 3]))
    np.testing.assert_array_equal(load_draft_vocab(tmp_path / "ok.npy", 64), [3, 8])
    model, params = tiny_model(64, seed=0)
    spec = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0, 1))
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        drafter_params(init_drafter(spec, 0), params, [0, 99])


def test_shorter_verify_length_is_identical_to_ar_and_drafts_the_block_prefix():
    """``verify_length`` k < B - 1: the block-5 drafter still forwards its whole block, the
    verifier checks its first k drafts (the LM head's rows equal the full block's first k);
    greedy tokens identical to AR, k drafts per step; a length above B - 1 or below 1 is one
    line."""
    model, params = tiny_model(64, seed=0)
    drafter, dparams = _drafter(model, params, 5, scale=8.0)
    spec = drafter.spec
    ar = generate(model, params, PROMPTS, max_new_tokens=20, eos_ids=(7,), bucket=16)
    for k in (1, 2):
        short = DFlashDrafter(spec, verify_length=k)
        assert short.draft_length == k
        res = generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=20,
            eos_ids=(7,),
            bucket=16,
            drafter=short,
            drafter_params=dparams,
        )
        assert res.tokens == ar.tokens
        np.testing.assert_array_equal(res.stats.drafts_proposed, k * res.stats.steps)
    R, S = 2, 12
    rng = np.random.default_rng(0)
    ctx_k = jnp.asarray(rng.normal(size=(1, R, spec.num_kv_heads, S, spec.head_dim)), jnp.float32)
    args = (
        jnp.asarray([5, 9], jnp.int32),
        jnp.asarray(np.arange(5)[None] + np.array([[6], [3]]), jnp.int32),
        ctx_k,
        -ctx_k,
        jnp.asarray(np.arange(S)[None] < np.array([[6], [3]])),
    )
    full = block_logits(spec, dparams, *args)
    np.testing.assert_allclose(
        np.asarray(block_logits(spec, dparams, *args, rows=2)), np.asarray(full[:, :2]), atol=1e-5
    )
    for bad in (0, 5):
        with pytest.raises(ValueError, match="drafts 1 to 4 tokens"):
            DFlashDrafter(spec, verify_length=bad)


def test_unrolled_layer_loop_drafts_as_the_scan_loop(monkeypatch):
    """The unrolled layer loop (per-layer weights; the CPU's usual decode plan) returns the
    hidden states from its own path: tokens identical to AR, and the same drafts accepted at
    the same steps as under the scan loop (equal acceptance histograms)."""
    model, params = tiny_model(64, seed=0)
    drafter, dparams = _drafter(model, params, 5, 2, ids=(1, 0), scale=8.0)
    ar = generate(model, params, PROMPTS, max_new_tokens=20, eos_ids=(7,), bucket=16)
    runs = {}
    for loop in ("scan", "unrolled"):
        monkeypatch.setenv("JAXSPEC_LAYER_LOOP", loop)
        runs[loop] = generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=20,
            eos_ids=(7,),
            bucket=16,
            drafter=drafter,
            drafter_params=dparams,
        )
        assert runs[loop].tokens == ar.tokens
    assert runs["unrolled"].settings["verify_layout"] != "stacked"
    np.testing.assert_array_equal(
        runs["unrolled"].stats.accept_hist, runs["scan"].stats.accept_hist
    )
    assert runs["scan"].stats.acceptance_rate > 0


def test_context_cache_matches_an_uncached_target_pass():
    """After the prompt pass and one verification step of a padded batch, the drafter's
    context keys / values on the accepted prefix equal :func:`context_kv` of the hidden states
    of one uncached target pass over that prefix (the features come from the right slots, at
    the right positions, and stale ones lie past the prefix only)."""
    from jaxspec.causal import decode as D

    model, params = tiny_model(64, seed=3)
    drafter, dparams = _drafter(model, params, block=4, ids=(1, 0))
    prompts = [[4, 5, 6, 7, 8], [9, 10, 11]]
    buf, pad = D.left_pad(prompts, 8, 0)
    cfg = D.LoopConfig(
        model=model, max_new=12, sampling=SamplingConfig(), drafter=drafter, eos_ids=()
    )
    st = D.prefill(cfg, params, dparams, jnp.asarray(buf), jnp.asarray(pad), jax.random.PRNGKey(0))
    st = D.step(cfg, (params, params), dparams, jnp.asarray(pad), st)
    for b, prompt in enumerate(prompts):
        L, p = int(st.length[b]), int(pad[b])
        seq = np.asarray(st.buffer[b, p : L - 1])[None]
        T = seq.shape[1]
        _, _, hid = model.apply(
            {"params": params},
            jnp.asarray(seq),
            jnp.arange(T)[None],
            _causal(T),
            hidden_layers=drafter.feature_layers,
        )
        k, v = context_kv(drafter.spec, dparams["draft"], hid, jnp.arange(T)[None])
        np.testing.assert_allclose(
            np.asarray(st.drafter_state.ctx_k[:, b, :, p : L - 1]), np.asarray(k[:, 0]), atol=2e-5
        )
        np.testing.assert_allclose(
            np.asarray(st.drafter_state.ctx_v[:, b, :, p : L - 1]), np.asarray(v[:, 0]), atol=2e-5
        )
        assert L - 1 - p > len(prompt)  # the verification pass added features


def _exact_joint(model, params, prompt, n_new, cfg):
    """Enumerated ``p(x_1..x_n | prompt)`` under ``cfg`` (uncached causal passes)."""
    P = len(prompt)
    T = -(-(P + n_new) // 8) * 8
    fwd = jax.jit(lambda t: model.apply({"params": params}, t, jnp.arange(T)[None], _causal(T))[0])

    def next_logprobs(prefixes):
        M, i = prefixes.shape
        toks = np.zeros((M, T), np.int32)
        toks[:, :P] = prompt
        toks[:, P : P + i] = prefixes
        return np.asarray(process_logits(fwd(jnp.asarray(toks))[:, P + i - 1], cfg))

    return enumerate_chain(next_logprobs, n_new)


def test_sampling_distribution_exact_with_a_shorter_verify_length():
    """A block-4 drafter verifying only its first 2 drafts (``verify_length``): 10^4 sampled
    continuations follow the enumerated AR joint distribution, drafts accepted and rejected."""
    cfg = SamplingConfig(temperature=1.0)
    V, N, k = 6, 10_000, 2
    model, params = tiny_model(V, seed=7, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, k + 2, cfg)
    full, dparams = _drafter(model, params, 4, ids=(1,), sampling=cfg, scale=30.0)
    res = generate(
        model,
        params,
        [prompt] * N,
        max_new_tokens=k + 2,
        sampling=cfg,
        drafter=DFlashDrafter(full.spec, cfg, verify_length=k),
        drafter_params=dparams,
        seed=11,
        bucket=8,
    )
    chk = check_distribution(res.tokens, exact)
    assert chk.passed, chk.why
    assert 0.02 < res.stats.acceptance_rate < 0.95, res.stats.acceptance_rate


@pytest.mark.parametrize(
    "cfg,vocab,ngram",
    [
        (SamplingConfig(temperature=1.0), None, None),
        (SamplingConfig(temperature=0.8, top_k=4, top_p=0.9), None, None),
        (SamplingConfig(temperature=1.0), (0, 2, 3, 5), None),
        (SamplingConfig(temperature=1.0), None, (2, 3)),
        (SamplingConfig(temperature=1.0), None, (3, 3)),
    ],
)
def test_sampling_distribution_exact(cfg, vocab, ngram):
    """10^4 sampled continuations (block 3: two drafts per step; ``k + 2`` new tokens, so a
    bonus token lies inside the budget) follow the enumerated AR joint distribution
    (:func:`jaxspec.testing.distribution.check_distribution`), with drafts both accepted and
    rejected and full acceptances (bonus tokens) drawn; also with a draft vocabulary of 4 of
    the 6 ids (``q`` zero on the other two, which only the residual can emit), and behind the
    n-gram lookup (:class:`LookupFirst`, suffixes of 2-3 or only 3 tokens: point-mass copies
    on some rows, the drafter's ``q`` on the others)."""
    V, N, block = 6, 10_000, 3
    k = block - 1
    model, params = tiny_model(V, seed=7, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, k + 2, cfg)
    assert abs(sum(exact.values()) - 1) < 1e-4
    drafter, dparams = _drafter(
        model, params, block, ids=(1,), sampling=cfg, scale=30.0, vocab=vocab
    )
    if ngram is not None:
        drafter = LookupFirst(drafter, max_ngram=ngram[1], min_ngram=ngram[0])
    res = generate(
        model,
        params,
        [prompt] * N,
        max_new_tokens=k + 2,
        sampling=cfg,
        drafter=drafter,
        drafter_params=dparams,
        seed=11,
        bucket=8,
    )
    chk = check_distribution(res.tokens, exact)
    assert chk.passed, chk.why
    st = res.stats
    assert 0.02 < st.acceptance_rate < 0.95, st.acceptance_rate
    assert st.accept_hist[:, k + 1].sum() > 0


@pytest.mark.parametrize("batch", [PROMPTS, PROMPTS[:1]])
def test_ngram_first_identical_to_ar_and_skips_the_drafter(batch):
    """With the n-gram lookup first (:class:`LookupFirst`), a padded batch with EOS and one
    prompt alone without EOS (its answer repeats ``48 4 29 48 24``) decode AR's tokens; on the
    lone prompt some steps copy and run no drafter forward, others run it."""
    model, params = tiny_model(64, seed=0)
    drafter, dparams = _drafter(model, params, 4, scale=8.0)
    kw = dict(max_new_tokens=24, eos_ids=(7,) if len(batch) > 1 else (), bucket=16)
    ar = generate(model, params, batch, **kw)
    res = generate(model, params, batch, **kw, drafter=LookupFirst(drafter), drafter_params=dparams)
    assert res.tokens == ar.tokens
    st = res.stats
    assert (st.draft_nfe <= st.steps).all()
    if len(batch) == 1:
        assert 0 < st.draft_nfe[0] < st.steps[0], (st.draft_nfe, st.steps)


@pytest.mark.parametrize("sample", [False, True])
def test_ngram_first_drafts_per_row(sample):
    """One proposal on two rows, one whose suffix occurred before and one without: the first
    row gets the n-gram copy (``q`` one-hot), the second the DFlash drafts and ``q``; with a
    match on every active row the drafter's forward is skipped (NFE 0)."""
    cfg = SamplingConfig(temperature=1.0) if sample else SamplingConfig()
    model, params = tiny_model(64, seed=0)
    drafter, dparams = _drafter(model, params, 4, scale=8.0, sampling=cfg)
    S = 32
    buf = np.zeros((2, S), np.int32)
    buf[0, :8] = [5, 6, 7, 8, 9, 5, 6, 7]  # suffix "6 7" occurred, followed by 8 9 5
    buf[1, :8] = [10, 11, 12, 13, 14, 15, 16, 17]
    length = jnp.array([8, 8], jnp.int32)
    ctx = DraftContext(
        buffer=jnp.asarray(buf), length=length, pad=jnp.zeros((2,), jnp.int32), active=None
    )
    state = drafter.init_state(dparams, ctx)
    state = drafter.absorb_features(
        state,
        jnp.zeros((2,), jnp.int32),
        jax.random.normal(jax.random.PRNGKey(3), (2, S, 2, model.config.hidden_size)),
    )
    key = jax.random.PRNGKey(0)
    both = LookupFirst(drafter)
    ctx = ctx.replace(active=jnp.array([True, True]))
    got, _ = both.propose(dparams, state, ctx, key, sample)
    own, _ = drafter.propose(dparams, state, ctx, key, sample)
    copy, _ = NgramDrafter(3, 64, bigram_fallback=False).propose(None, (), ctx, key, False)
    np.testing.assert_array_equal(got.tokens[0], [8, 9, 5])
    np.testing.assert_array_equal(got.tokens[0], copy.tokens[0])
    np.testing.assert_array_equal(got.tokens[1], own.tokens[1])
    np.testing.assert_array_equal(got.nfe, [1, 1])
    if sample:
        np.testing.assert_array_equal(got.q[0], jax.nn.one_hot(jnp.array([8, 9, 5]), 64))
        # the same function in two compiled programs (float32 sums may be fused differently)
        np.testing.assert_allclose(got.q[1], own.q[1], rtol=1e-5, atol=1e-7)
    else:
        assert got.q is None
    # the second row done: every active row copies, and no drafter forward runs
    got, _ = both.propose(dparams, state, ctx.replace(active=jnp.array([True, False])), key, sample)
    np.testing.assert_array_equal(got.nfe, [0, 0])
    np.testing.assert_array_equal(got.tokens[0], [8, 9, 5])


def test_ngram_first_bad_input():
    """One-line errors: a drafter whose proposals cannot be skipped, a bad n-gram range, a
    non-bool ``ngram_first``; the registry's entry wraps the drafter only when asked."""
    model, params = tiny_model(64, seed=0)
    drafter, _ = _drafter(model, params, 4)
    with pytest.raises(ValueError, match="cannot be skipped"):
        LookupFirst(NgramDrafter(3, 64))
    with pytest.raises(ValueError, match="min_ngram"):
        LookupFirst(drafter, max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="--min-ngram 4 exceeds --max-ngram 3"):
        Config(drafter_model=(drafter.spec, None), ngram_first=True, min_ngram=4)
    with pytest.raises(ValueError, match="apply to dflash with --ngram-first only"):
        Config(drafter_model=(drafter.spec, None), max_ngram=4)
    with pytest.raises(TypeError, match="--ngram-first must be a bool"):
        Config(drafter_model=(drafter.spec, None), ngram_first="yes")
    plain = Config(drafter_model=(drafter.spec, None), draft_length=3)
    both = Config(drafter_model=(drafter.spec, None), draft_length=3, ngram_first=True)
    assert isinstance(plain.drafter(model.config), DFlashDrafter)
    wrapped = both.drafter(model.config)
    assert isinstance(wrapped, LookupFirst) and wrapped.name == "dflash+ngram"
    assert wrapped.feature_layers == drafter.spec.layer_ids and wrapped.draft_length == 3


def test_bad_input():
    """One-line errors: a drafter built for another target (width, layers, vocabulary), a
    block size it was not built for, bad specs, sampling without the target's config."""
    model, params = tiny_model(64, seed=0)
    drafter, dparams = _drafter(model, params)
    spec = drafter.spec
    with pytest.raises(ValueError, match="built for block size 4"):
        DFlashDrafter(spec, block_size=16)
    for other, what in (
        (tiny_model(64, layers=3)[0], "number of layers 2"),
        (tiny_model(48)[0], "vocabulary 64"),
    ):
        with pytest.raises(ValueError, match=what):
            spec.check_target(other.config)
        with pytest.raises(ValueError, match=what):
            Config(
                max_new_tokens=4, draft_length=3, drafter_model=(spec, dparams["draft"])
            ).drafter(other.config)
    with pytest.raises(ValueError, match="block size 9"):
        Config(max_new_tokens=4, draft_length=8, drafter_model=(spec, dparams["draft"])).drafter(
            model.config
        )
    wide = DFlashSpec.for_target(model.config.replace(hidden_size=48), block_size=4, layer_ids=(0,))
    with pytest.raises(ValueError, match="hidden width 48"):
        wide.check_target(model.config)
    with pytest.raises(ValueError, match="built for"):  # the loop's own check, at trace time
        generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=4,
            drafter=DFlashDrafter(wide),
            drafter_params=drafter_params(init_drafter(wide), params),
        )
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        other_v = DFlashSpec.for_target(tiny_model(48)[0].config, block_size=4, layer_ids=(0,))
        generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=4,
            drafter=DFlashDrafter(other_v),
            drafter_params=dparams,
        )
    with pytest.raises(ValueError, match="layer_ids"):
        DFlashSpec.for_target(model.config, layer_ids=(2,))
    with pytest.raises(ValueError, match="num_layers"):
        DFlashSpec.for_target(model.config, num_layers=6)
    with pytest.raises(ValueError, match="block_size"):
        DFlashSpec.for_target(model.config, block_size=1)
    with pytest.raises(ValueError, match="target's SamplingConfig"):
        generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=4,
            sampling=SamplingConfig(temperature=1.0),
            drafter=drafter,
            drafter_params=dparams,
        )
    with pytest.raises(ValueError, match="cost gate"):
        generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=4,
            drafter=drafter,
            drafter_params=dparams,
            gate=2.0,
        )
    assert default_layer_ids(28, 1) == (14,)
    assert default_layer_ids(28, 5) == (1, 7, 13, 19, 25)


# ----------------------------------------------------------------------------- training


def _train(model, params, spec, seqs, steps, n_anchors=8, gamma=4.0, lr=1e-2, seed=0):
    """Adam on the DFlash loss over fixed right-padded ``seqs`` (all trainable), anchors
    redrawn each step; returns the trained tree and the loss at every step (each on the
    step's own anchors) and the loss on fixed anchors before / after."""
    import optax

    from jaxspec.training.dflash import dflash_loss, sample_anchors, target_features

    tokens = jnp.asarray(seqs, jnp.int32)
    trainable = jnp.ones(tokens.shape, bool)
    hidden = target_features(model, params, tokens, spec.layer_ids)
    shared = {k: v for k, v in params.items() if k in ("embed", "lm_head")}
    own = init_drafter(spec, seed)
    opt = optax.adam(lr)
    opt_state = opt.init(own)

    def loss_at(own, key):
        anchors, ok = sample_anchors(key, trainable, n_anchors)
        return dflash_loss(spec, own, shared, tokens, hidden, trainable, anchors, ok, gamma)[0]

    @jax.jit
    def step(own, opt_state, key):
        loss, g = jax.value_and_grad(loss_at)(own, key)
        upd, opt_state = opt.update(g, opt_state)
        return optax.apply_updates(own, upd), opt_state, loss

    fixed = jax.random.PRNGKey(99)
    before = float(jax.jit(loss_at)(own, fixed))
    for i in range(steps):
        own, opt_state, _ = step(own, opt_state, jax.random.PRNGKey(i))
    after = float(jax.jit(loss_at)(own, fixed))
    return own, before, after


def test_training_lowers_the_loss_on_a_fixed_batch():
    """A few Adam steps on a tiny target's sequences lower the weighted block loss on fixed
    anchors; the loss ignores tokens no block scores (changing a token that is neither a
    label nor in any block's context leaves it unchanged)."""
    from jaxspec.training.dflash import dflash_loss, position_weights, target_features

    model, params = tiny_model(32, seed=5)
    spec = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0, 1))
    rng = np.random.default_rng(0)
    seqs = rng.integers(1, 32, size=(4, 24))
    _, before, after = _train(model, params, spec, seqs, steps=20)
    assert after < 0.8 * before, (before, after)
    # one anchor at position 5: labels are positions 6..8, context positions 0..4
    tokens = jnp.asarray(seqs, jnp.int32)
    hidden = target_features(model, params, tokens, spec.layer_ids)
    trainable = jnp.ones(tokens.shape, bool)
    own = init_drafter(spec, 1)
    shared = {"embed": params["embed"], "lm_head": params["lm_head"]}
    anchors, ok = jnp.full((4, 1), 5, jnp.int32), jnp.ones((4, 1), bool)
    base = dflash_loss(spec, own, shared, tokens, hidden, trainable, anchors, ok, 4.0)[0]
    far = tokens.at[:, 12].set((tokens[:, 12] + 1) % 32)
    hid_far = target_features(model, params, far, spec.layer_ids)
    same = dflash_loss(spec, own, shared, far, hid_far, trainable, anchors, ok, 4.0)[0]
    np.testing.assert_allclose(float(same), float(base), rtol=1e-6)
    near = tokens.at[:, 7].set((tokens[:, 7] + 1) % 32)  # a label: the loss changes
    moved = dflash_loss(
        spec,
        own,
        shared,
        near,
        target_features(model, params, near, spec.layer_ids),
        trainable,
        anchors,
        ok,
        4.0,
    )[0]
    assert abs(float(moved) - float(base)) > 1e-4
    np.testing.assert_allclose(
        np.asarray(position_weights(4, 4.0)), np.exp(-np.arange(3) / 4.0), rtol=1e-6
    )
    with pytest.raises(ValueError, match="gamma"):
        position_weights(4, 0.0)


def test_trained_drafter_is_accepted_and_stays_exact():
    """Trained on the target's own greedy continuations, the drafter's drafts are accepted
    far more often than an untrained one's, and greedy output is still identical to AR."""
    model, params = tiny_model(64, seed=0)
    prompts = [
        [int(t) for t in np.random.default_rng(i).integers(1, 64, size=6)] for i in range(16)
    ]
    ar = generate(model, params, prompts, max_new_tokens=26, bucket=8)
    seqs = [p + t for p, t in zip(prompts, ar.tokens)]
    spec = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0, 1))
    own, before, after = _train(model, params, spec, seqs, steps=150, n_anchors=12)
    assert after < before
    test_prompts = prompts[:4]
    rates = {}
    for name, tree in (("trained", own), ("untrained", init_drafter(spec, 0))):
        res = generate(
            model,
            params,
            test_prompts,
            max_new_tokens=24,
            bucket=8,
            drafter=DFlashDrafter(spec),
            drafter_params=drafter_params(tree, params),
        )
        assert res.tokens == [t[:24] for t in ar.tokens[:4]], name
        rates[name] = res.stats.acceptance_rate
    assert rates["trained"] > max(0.3, 2 * rates["untrained"]), rates
    # the registry's entry decodes the same tokens
    res = Config(max_new_tokens=24, draft_length=3, drafter_model=(spec, own)).decode(
        model, params, test_prompts
    )
    assert res.tokens == [t[:24] for t in ar.tokens[:4]]
    assert res.stats.acceptance_rate == rates["trained"]


def test_save_and_load(tmp_path):
    """A saved drafter loads with its spec and weights; a file without the spec, a missing
    file and a non-safetensors file are one-line errors."""
    from safetensors.numpy import save_file

    model, params = tiny_model(64, seed=0)
    spec = DFlashSpec.for_target(model.config, block_size=4, num_layers=2, layer_ids=(1, 0))
    own = init_drafter(spec, 3)
    path = tmp_path / "drafter.safetensors"
    assert save_drafter(path, spec, own) > 0
    spec2, own2 = load_drafter(path)
    assert spec2 == spec
    jax.tree_util.tree_map(np.testing.assert_array_equal, own2, own)
    half = tmp_path / "half.safetensors"  # float16 storage, widened to float32 on load
    assert save_drafter(half, spec, own, dtype="float16") < path.stat().st_size
    _, own16 = load_drafter(half)
    for a, b in zip(jax.tree.leaves(own16), jax.tree.leaves(own)):
        assert a.dtype == jnp.float32
        np.testing.assert_array_equal(a, np.asarray(b).astype(np.float16).astype(np.float32))
    with pytest.raises(ValueError, match="dtype must be"):
        save_drafter(half, spec, own, dtype="int8")
    save_file({"fc": np.zeros((2, 2), np.float32)}, str(tmp_path / "bare.safetensors"))
    with pytest.raises(ValueError, match="no DFlash drafter config"):
        load_drafter(tmp_path / "bare.safetensors")
    with pytest.raises(ValueError, match="does not exist"):
        load_drafter(tmp_path / "nothing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="not a readable"):
        load_drafter(tmp_path / "junk.safetensors")


# ----------------------------------------------------------------------------- scripts.train


def _distill_file(tmp_path, model, params):
    """A self-distillation file of the tiny target (``scripts.distill``'s row format): its
    greedy answers (EOS 7 inside the vocabulary, budget 24) to 24 random prompts, and as the
    ``val`` split four of those rows again (the evaluation then scores a fixed batch of
    training blocks). Returns ``(path, prompts, their AR answers)``."""
    import json

    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(8, 64, size=rng.integers(4, 10))] for _ in range(24)]
    ar = generate(model, params, prompts, max_new_tokens=24, eos_ids=(7,), bucket=8)
    path = tmp_path / "distill.jsonl"
    with path.open("w") as f:
        for i, (p, a) in enumerate(list(zip(prompts, ar.tokens)) * 2):
            if i >= 28:
                break
            answer = [t for t in a if t != 7]  # stored without its EOS, as scripts.distill does
            row = {"i": i, "split": "val" if i >= 24 else "train", "prompt": p, "answer": answer}
            f.write(json.dumps(row) + "\n")
    return path, prompts, ar.tokens


def _dflash_cfg(path, **train):
    from jaxspec.training.config import config_from_dict

    return config_from_dict(
        {
            "name": "dflash-tiny",
            "model": {"init": "preset", "preset": "tiny"},
            "data": {"source": "distill", "distill": str(path), "seq_len": 40, "batch_size": 4},
            "objective": {"kind": "dflash"},
            "dflash": {
                "block_size": 4,
                "layer_ids": [0, 1],
                "blocks_per_seq": 8,
                "gamma": 4.0,
                "answer_cap": 24,
            },
            "optim": {"lr": 0.003, "warmup_steps": 0, "weight_decay": 0.0, "clip_norm": 10.0},
            "train": {
                "steps": 60,
                "eval_every": 1,
                "eval_batches": 2,
                "log_every": 10,
                "ckpt_every": 25,
                **train,
            },
        }
    )


def test_train_objective_smoke_resume_and_export(tmp_path):
    """``objective.kind: dflash`` through the shared training loop on a tiny random target
    and its own greedy answers: the evaluation loss on fixed blocks falls, an interrupted run
    resumed from its checkpoint ends with the uninterrupted run's weights, and the exported
    drafter file loads with its spec and training metadata and decodes AR's greedy tokens,
    with more drafts accepted than an untrained drafter. The evaluation rows repeat four
    training rows: the loss on that fixed batch of blocks (fixed anchors) must fall."""
    import json

    from safetensors import safe_open

    from jaxspec.training.dflash_run import train_dflash as train

    model, params = tiny_model(64, seed=0)
    path, prompts, answers = _distill_file(tmp_path, model, params)
    cfg = _dflash_cfg(path)
    whole = train(cfg, tmp_path / "a", model_and_params=(model, params), progress=False)
    part = train(
        cfg, tmp_path / "b", model_and_params=(model, params), progress=False, stop_after=25
    )
    assert part["step"] == 25 and part["stopped_early"] is False
    rest = train(cfg, tmp_path / "b", model_and_params=(model, params), progress=False, resume=True)
    assert rest["step"] == 60
    jax.tree_util.tree_map(np.testing.assert_array_equal, rest["trainable"], whole["trainable"])
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == list(range(1, 61))
    assert evals[-1]["val_loss"] < 0.85 * evals[0]["val_loss"], (evals[0], evals[-1])
    assert len(evals[-1]["val_acc_pos"]) == 3 and evals[-1]["val_greedy_tau"] > 1.0
    assert all(r["loss"] > 0 for r in rows if r["kind"] == "train")

    file = tmp_path / "a" / "drafter.safetensors"
    assert whole["drafter_bytes"] == file.stat().st_size
    spec, own = load_drafter(file)
    assert spec == DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0, 1))
    with safe_open(str(file), framework="numpy") as f:
        meta = json.loads(f.metadata()["dflash_meta"])
    assert meta["step"] == 60 and meta["gamma"] == 4.0
    rates = {}
    for name, tree in (("trained", own), ("untrained", init_drafter(spec, 0))):
        res = generate(
            model,
            params,
            prompts[:8],
            max_new_tokens=24,
            eos_ids=(7,),
            bucket=8,
            drafter=DFlashDrafter(spec),
            drafter_params=drafter_params(tree, params),
        )
        assert res.tokens == answers[:8], name
        rates[name] = res.stats.acceptance_rate
    assert rates["trained"] > rates["untrained"], rates


def test_train_objective_bad_input(tmp_path, capsys):
    """One-line errors for a ``dflash`` run: a target that is not a preset, data that are
    not a distillation file, a position decay <= 0, a LoRA section, a start drafter built
    for another spec; ``scripts.train`` exits 2 with one ``error:`` line."""
    from jaxspec.training.config import TrainConfigError, config_from_dict
    from jaxspec.training.dflash_run import build_rows, build_target
    from scripts import train as train_cli

    model, params = tiny_model(64, seed=0)
    path = tmp_path / "none.jsonl"
    cfg = _dflash_cfg(path)
    with pytest.raises(TrainConfigError, match="data.distill must name a file"):
        build_rows(cfg, 7)
    d = cfg.to_dict()
    with pytest.raises(TrainConfigError, match="data.source must be 'distill'"):
        build_rows(config_from_dict({**d, "data": {**d["data"], "source": "stdlib"}}), 7)
    with pytest.raises(TrainConfigError, match="dflash.gamma must be > 0"):
        config_from_dict({**d, "dflash": {**d["dflash"], "gamma": 0.0}})
    with pytest.raises(TrainConfigError, match="lora"):
        config_from_dict({**d, "lora": {"rank": 4}})
    with pytest.raises(TrainConfigError, match="dflash: layer_ids"):
        build_target(
            config_from_dict({**d, "dflash": {**d["dflash"], "layer_ids": [5]}}),
            model_and_params=(model, params),
        )
    other = tmp_path / "other.safetensors"
    wrong = DFlashSpec.for_target(model.config, block_size=8, layer_ids=(0,))
    save_drafter(other, wrong, init_drafter(wrong))
    rows = tmp_path / "one.jsonl"
    rows.write_text('{"split": "train", "prompt": [9, 10, 11], "answer": [12, 13, 14, 15]}\n')
    bad = config_from_dict(
        {
            **d,
            "data": {**d["data"], "distill": str(rows)},
            "dflash": {**d["dflash"], "init_weights": str(other)},
        }
    )
    with pytest.raises(TrainConfigError, match="init_weights .* spec differs"):
        from jaxspec.training.dflash_run import train_dflash as train

        train(bad, tmp_path / "x", model_and_params=(model, params), progress=False)
    rc = train_cli.main(
        [
            "--config",
            "configs/train/dlm-tiny.yaml",
            "--set",
            "objective.kind=dflash",
            "--out",
            str(tmp_path / "cli"),
            "--no-progress",
        ]
    )
    from pathlib import Path

    from jaxspec.training.config import load_config

    root = Path(__file__).resolve().parents[2]
    real = load_config(root / "configs/train/dflash-smollm2-135m.yaml")  # the committed recipe
    assert real.objective.kind == "dflash" and real.dflash.gamma == 7.0
    assert real.dflash.block_size == 16 and (root / real.data.distill).is_file()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1] == (
        "error: objective.kind = dflash needs model.init: preset and model.preset (the target)"
    ), err


def test_init_weights_may_come_from_another_block_size(tmp_path):
    """``dflash.init_weights`` from a drafter trained at another block size starts the run
    from exactly its weights (they do not depend on the block size); any other difference of
    the spec is refused (``test_train_objective_bad_input``)."""
    from jaxspec.training.config import config_from_dict
    from jaxspec.training.dflash_run import _start_weights

    model, _ = tiny_model(64, seed=0)
    b16 = DFlashSpec.for_target(model.config, block_size=16, layer_ids=(0, 1))
    own = init_drafter(b16, seed=3)
    start = tmp_path / "b16.safetensors"
    save_drafter(start, b16, own)
    d = _dflash_cfg(tmp_path / "rows.jsonl").to_dict()
    cfg = config_from_dict({**d, "dflash": {**d["dflash"], "init_weights": str(start)}})
    b4 = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0, 1))
    got = _start_weights(cfg, b4)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, own)
    assert not np.array_equal(got["fc"], init_drafter(b4, cfg.train.seed)["fc"])


def test_init_from_target_starts_as_the_target_layer(tmp_path):
    """``init_target_layers``: the copied drafter layer's context values equal the target's
    own values at that layer (its KV cache after a prompt pass) and its context keys equal
    the target's keys scaled per head to RMS ``qk_scale[1]`` (the drafter's key norm); the
    layer's matrices and norms are the target's; the training run starts from exactly this
    tree; bad layer choices are one-line errors."""
    from jaxspec.causal.dflash import init_from_target, target_qk_scale
    from jaxspec.training.config import TrainConfigError, config_from_dict
    from jaxspec.training.dflash_run import _start_weights

    model, params = tiny_model(64, layers=3, seed=2)
    spec = DFlashSpec.for_target(model.config, block_size=4, num_layers=1, layer_ids=(0, 1))
    toks = jnp.asarray([[5, 9, 2, 33, 7, 1, 8, 40]])
    T = toks.shape[1]
    _, cache, hidden = model.apply(
        {"params": params},
        toks,
        jnp.arange(T)[None],
        _causal(T),
        cache=init_cache(model.config, 1, T),
        cache_index=jnp.zeros((1,), jnp.int32),
        hidden_layers=spec.layer_ids,
    )
    own = init_from_target(spec, params, (2,), qk_scale=(1.7, 1.3))
    k, v = context_kv(spec, own, hidden, jnp.arange(T)[None])
    want_v = jnp.swapaxes(cache.v[2], -1, -2)  # (B, K, T, Dh)
    np.testing.assert_allclose(np.asarray(v[0]), np.asarray(want_v), atol=1e-5)
    tk = cache.k[2]
    want_k = 1.3 * tk / jnp.sqrt(jnp.mean(tk * tk, axis=-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(k[0]), np.asarray(want_k), atol=1e-4)
    for name in ("wq", "wo", "w_down", "mlp_norm"):
        np.testing.assert_array_equal(own["blocks"][name][0], params["layers"][name][2])
    np.testing.assert_array_equal(own["final_norm"], params["final_norm"])
    np.testing.assert_array_equal(
        own["blocks"]["q_norm"], np.full((1, spec.head_dim), 1.7, np.float32)
    )

    d = _dflash_cfg(tmp_path / "rows.jsonl").to_dict()
    cfg = config_from_dict({**d, "dflash": {**d["dflash"], "init_target_layers": [2]}})
    got = _start_weights(cfg, spec, params, lambda: hidden)
    scale = target_qk_scale(spec, params, hidden, 2)
    jax.tree_util.tree_map(
        np.testing.assert_array_equal, got, init_from_target(spec, params, (2,), 0, scale)
    )
    for layers, msg in (
        ((0,), "layer id -1, must be among"),
        ((2, 1), "one target layer per drafter layer"),
        ((3,), "outside the target's layers"),
    ):
        with pytest.raises(ValueError, match=msg):
            init_from_target(spec, params, layers)
        bad = config_from_dict({**d, "dflash": {**d["dflash"], "init_target_layers": list(layers)}})
        with pytest.raises(TrainConfigError, match="dflash.init_target_layers: .*" + msg):
            _start_weights(bad, spec, params, lambda: hidden)
    with pytest.raises(TrainConfigError, match="exclude each other"):
        config_from_dict(
            {**d, "dflash": {**d["dflash"], "init_target_layers": [2], "init_weights": "x"}}
        )


def test_distill_sequences():
    """A row ended by the target gets its EOS (a label); a cut one (answer at the budget)
    none; a row cut by ``seq_len`` keeps its first ``T`` tokens; one whose prompt leaves no
    label is dropped; padding and prompt are never trainable."""
    from jaxspec.training.dflash_run import DFlashRows, distill_sequences

    rows = [
        {"prompt": [3, 4], "answer": [5, 6]},  # ended (2 < cap 4): + EOS 7
        {"prompt": [3], "answer": [5, 6, 8, 9]},  # at the cap: no EOS
        {"prompt": [3, 4, 5, 6, 8], "answer": [9]},  # 5 prompt tokens of T = 6: dropped
        {"prompt": [3, 4, 5], "answer": [9, 9, 9]},  # 3 + 3 + EOS > 6: cut, EOS falls off
    ]
    tokens, trainable, st = distill_sequences(rows, 6, eos_id=7, answer_cap=4, pad_id=0)
    np.testing.assert_array_equal(
        tokens, [[3, 4, 5, 6, 7, 0], [3, 5, 6, 8, 9, 0], [3, 4, 5, 9, 9, 9]]
    )
    np.testing.assert_array_equal(
        trainable.astype(int), [[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    )
    assert st == {"rows": 4, "kept": 3, "ended": 1, "dropped": 1, "trainable_tokens": 10}
    ds = DFlashRows(tokens, trainable, seed=0)
    b = ds.batch(1, 2)  # samples 2 and 3: the end of epoch 0, the start of epoch 1
    assert b.shape == (2, 2, 6) and set(map(tuple, b[:, 0])) <= set(map(tuple, tokens))
    np.testing.assert_array_equal(ds.batch(1, 2), b)  # a pure function of the step


def test_train_objective_time_budget(tmp_path):
    """``max_seconds`` (``scripts.train --max-minutes``): the first step past the budget is
    the last; the run checkpoints it, writes its eval row and exports the drafter, and
    ``resume`` continues the schedule."""
    import json

    from jaxspec.training.dflash_run import train_dflash

    model, params = tiny_model(64, seed=0)
    path, _, _ = _distill_file(tmp_path, model, params)
    cfg = _dflash_cfg(path, steps=6, eval_every=50)
    kw = dict(model_and_params=(model, params), progress=False)
    res = train_dflash(cfg, tmp_path / "run", max_seconds=1e-3, **kw)
    assert res["step"] == 1 and res["stopped_early"] is True
    assert (tmp_path / "run" / "checkpoints" / "1").is_dir()
    assert (tmp_path / "run" / "drafter.safetensors").is_file()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["train", "eval"]
    res = train_dflash(cfg, tmp_path / "run", resume=True, **kw)
    assert res["step"] == 6 and res["stopped_early"] is False


def test_panel_layout_computes_the_same_drafts(monkeypatch):
    """On the CPU panel kernel's layout (per-layer panels, fc / head panels, unrolled layers)
    the drafter's block logits and context keys / values equal the stacked tree's, with the full
    head and with a draft vocabulary."""
    from jaxspec.causal.dflash import context_kv, panel_layout
    from models.llama import panels

    try:
        panels.build()
    except panels.KernelBuildError as e:
        pytest.skip(f"panel kernel unavailable: {e}")
    monkeypatch.setattr(panels, "PANELS", True)  # off by default without AVX-512 or AVX2 + FMA
    model, params = tiny_model(64, seed=0)
    spec = DFlashSpec.for_target(model.config, block_size=4, num_layers=2)
    own = init_drafter(spec, 1)
    hidden = jax.random.normal(jax.random.PRNGKey(2), (2, 6, 2, model.config.hidden_size))
    pos = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    assert isinstance(drafter_params(own, params)["draft"]["blocks"], tuple)  # laid out
    for vocab in (None, np.arange(0, 64, 2)):
        with monkeypatch.context() as m:
            m.setattr(panels, "PANELS", False)
            stacked = drafter_params(own, params, vocab)  # XLA's products
        assert isinstance(stacked["draft"]["blocks"], dict)
        laid = panel_layout(stacked, params)
        assert isinstance(laid["draft"]["blocks"], tuple) and "fc_p" in laid["draft"]
        assert ("vocab_head_p" in laid) == (vocab is not None)
        kv = [context_kv(spec, t["draft"], hidden, pos) for t in (stacked, laid)]
        for a, b in zip(*kv):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        args = (jnp.array([3, 9]), pos[:, :4] + 6, *kv[0], jnp.ones((2, 6), bool))
        want = np.asarray(block_logits(spec, stacked, *args))
        got = np.asarray(block_logits(spec, laid, *args))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
