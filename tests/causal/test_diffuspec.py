"""DiffuSpec building blocks (:mod:`jaxspec.causal.diffuspec`): Eq. 6 pruning, CPS beam search
against brute force over the lattice, the hashed 3-gram proxy against hand counts, and the ADL
controller (Eqs. 8-10) against a hand-computed run."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.diffuspec import NgramProxy, adl_init, adl_update, cps_beam, prune_lattice

EOS = 0


def test_prune_lattice_eq6_keeps_eos():
    p = np.array(
        [
            [0.02, 0.5, 0.3, 0.15, 0.03],  # EOS (id 0) outside the top mass: extra slot
            [0.6, 0.3, 0.05, 0.03, 0.02],
        ]
    )  # EOS is top-1: no extra slot
    tok, lp, ok = prune_lattice(jnp.log(jnp.asarray(p))[None], 0.8, 3, EOS)
    tok, ok = np.asarray(tok[0]), np.asarray(ok[0])
    assert tok[0][ok[0]].tolist() == [1, 2, 0]  # 0.5 + 0.3 reaches 0.8: M = 2, + EOS
    assert tok[1][ok[1]].tolist() == [0, 1]  # 0.6 + 0.3
    np.testing.assert_allclose(np.exp(np.asarray(lp[0, 0, :2])), [0.5, 0.3], rtol=1e-6)
    tok, _, ok = prune_lattice(jnp.log(jnp.asarray(p))[None], 1.0, 2, EOS)
    assert np.asarray(ok).sum(-1).tolist() == [[3, 2]]  # capped at M_max = 2 (+ EOS)
    with pytest.raises(ValueError, match="tau"):
        prune_lattice(jnp.zeros((1, 1, 3)), 0.0, 2, EOS)


def _brute(tokens, lp, valid, ctx2, proxy, lam):
    """Best Eq. 7 score over every lattice path, each cut after its first EOS."""
    K, C = tokens.shape
    best, best_path = -np.inf, None
    for choice in itertools.product(range(C), repeat=K):
        if not all(valid[i, c] for i, c in enumerate(choice)):
            continue
        s, hist, path = 0.0, list(ctx2), []
        for i, c in enumerate(choice):
            t = int(tokens[i, c])
            s += lam * float(lp[i, c]) + (1 - lam) * float(proxy.logprob(hist[-2], hist[-1], t))
            path.append(t)
            hist.append(t)
            if t == EOS:
                break
        if s > best + 1e-6:
            best, best_path = s, path
    return best, best_path


def test_cps_beam_with_a_full_beam_finds_the_brute_force_optimum():
    rng = np.random.default_rng(0)
    V, K = 6, 4
    proxy = NgramProxy.fit(rng.integers(0, V, 400), V, bits=12)
    for trial in range(5):
        logits = rng.normal(size=(1, K, V)) * 2
        logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), -1)
        tok, lp, ok = (np.asarray(x[0]) for x in prune_lattice(logp, 0.9, 3, EOS))
        ctx2 = np.array([3, 4])
        want, want_path = _brute(tok, lp, ok, ctx2, proxy, 0.5)
        path, length = cps_beam(
            jnp.asarray(tok),
            jnp.asarray(lp),
            jnp.asarray(ok),
            jnp.asarray(ctx2),
            proxy,
            lam=0.5,
            beam=256,
            eos_id=EOS,
        )  # >= every path
        got = np.asarray(path)[: int(length)].tolist()
        assert got == want_path, (trial, got, want_path)


def test_ngram_proxy_matches_hand_counts():
    stream = [1, 2, 3, 1, 2, 4, 1, 2, 3]
    V = 5
    px = NgramProxy.fit(stream, V, bits=16)
    l3, l2, l1 = px.weights
    uni = (np.bincount(stream, minlength=V) + 1) / (len(stream) + V)
    # (1, 2) -> 3 twice, -> 4 once; 2 -> 3 twice, -> 4 once
    want = np.log(l3 * 2 / 3 + l2 * 2 / 3 + l1 * uni[3])
    assert float(px.logprob(jnp.int32(1), jnp.int32(2), jnp.int32(3))) == pytest.approx(
        want, rel=1e-5
    )
    want = np.log(l1 * uni[0])  # unseen everything: the unigram floor
    assert float(px.logprob(jnp.int32(4), jnp.int32(4), jnp.int32(0))) == pytest.approx(
        want, rel=1e-5
    )
    with pytest.raises(ValueError, match="token ids"):
        NgramProxy.fit([1, 2], V)


def test_adl_follows_eqs_8_to_10():
    st = adl_init(1, 20.0)
    st, k = adl_update(
        st, jnp.asarray([12]), jnp.asarray([12]), rho=0.5, delta=10.0, k_min=20, k_max=30
    )
    # gen = 16, acc = 16 >= gen: ceil(16 + 10) = 26
    assert float(st.gen[0]) == 16.0 and int(k[0]) == 26
    st, k = adl_update(
        st, jnp.asarray([30]), jnp.asarray([2]), rho=0.5, delta=10.0, k_min=20, k_max=30
    )
    # gen = 23, acc = 9 < gen: ceil(23) = 23
    assert float(st.gen[0]) == 23.0 and float(st.acc[0]) == 9.0 and int(k[0]) == 23
    st, k = adl_update(
        st, jnp.asarray([2]), jnp.asarray([2]), rho=0.5, delta=10.0, k_min=20, k_max=30
    )
    assert int(k[0]) == 20  # gen 12.5 -> 13, clipped up to k_min


@pytest.mark.parametrize("head", ["dream", "llada"])
@pytest.mark.parametrize("steps", [4, 6])  # K = 6: uneven (2, 2, 1, 1) and one per step
def test_refinement_equals_stepwise_decoding_of_one_block(head, steps):
    """S > 1 (Sec. 4.1, Eq. 4): the block the drafter fills in S forwards is the block greedy
    low-confidence stepwise decoding (the dLLM reference, renormalized confidence) fills in S
    steps, and each position's row is its logits at the step it was unmasked."""
    from jaxspec.causal.diffuspec import DiffusionDrafter
    from jaxspec.core.drafters import DraftContext
    from jaxspec.dllm import DiffusionDecodeConfig, diffusion_generate
    from jaxspec.testing.tiny import tiny_diffusion_model

    model, params = tiny_diffusion_model(head, vocab=40, ctx=64)
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 39, 16)]
    K = 6
    ref = diffusion_generate(
        model,
        params,
        [prompt],
        DiffusionDecodeConfig(
            gen_length=K,
            block_length=K,
            steps=steps,
            remasking="low_confidence",
            confidence_softmax="renormalized",
        ),
    )
    drafter = DiffusionDrafter(model, K, eos_id=0, k_min=K, refine_steps=steps)
    buf = jnp.zeros((1, 32), jnp.int32).at[0, :16].set(jnp.asarray(prompt))
    ctx = DraftContext(
        buffer=buf, length=jnp.asarray([16]), pad=jnp.asarray([0]), active=jnp.asarray([True])
    )
    rows = drafter.refine(params, ctx, jnp.asarray([K]))
    assert np.asarray(jnp.argmax(rows, -1))[0].tolist() == np.asarray(ref.full_tokens)[0].tolist()
    one = DiffusionDrafter(model, K, eos_id=0, k_min=K)
    first = np.asarray(ref.transfer_step)[0] == 0  # unmasked in the first forward
    np.testing.assert_allclose(
        np.asarray(rows)[0][first],
        np.asarray(one.refine(params, ctx, jnp.asarray([K])))[0][first],
        rtol=1e-5,
        atol=1e-5,
    )
    with pytest.raises(ValueError, match="refinement steps"):
        DiffusionDrafter(model, K, eos_id=0, k_min=K, refine_steps=0)


@pytest.mark.parametrize("cps,adl,cache", [(True, False, "none"), (False, True, "prefix")])
def test_refined_and_ablated_diffuspec_is_greedy_identical_to_ar(cps, adl, cache):
    """The Table 2 ablations, S = 2 and the drafter prefix cache through the registry (two
    prompts of different lengths: left padding): tokens equal AR greedy, and the drafter
    spends S forwards per proposal."""
    from jaxspec.methods import get_method
    from tests.test_methods import _inputs

    model, params, prompts, opts = _inputs("causal")
    opts = dict(opts, refine_steps=2, cps=cps, adl=adl, draft_length=5, drafter_cache=cache)
    m = get_method("diffuspec")
    res = m.run(model, params, prompts, m.configure(opts, strict=False), seed=0)
    ar = get_method("ar").run(
        model, params, prompts, get_method("ar").configure(opts, strict=False), seed=0
    )
    assert res.tokens == ar.tokens
    s = res.stats
    assert (np.asarray(s.draft_nfe) == 2 * np.asarray(s.steps)).all()  # S forwards per step


def test_ngram_proxy_probabilities_stay_below_one_under_hash_collisions():
    """With 2^4 slots nearly every n-gram collides; each relative frequency is clipped to 1,
    so log P <= 0 (unclipped, a colliding trigram count over a rare context gave log P > 0
    on the real stdlib proxy, and CPS drafted loops of that trigram)."""
    rng = np.random.default_rng(0)
    V = 50
    px = NgramProxy.fit(rng.integers(0, V, 2000), V, bits=4)
    a, b, c = (jnp.asarray(rng.integers(0, V, 4000), jnp.int32) for _ in range(3))
    assert float(jnp.max(px.logprob(a, b, c))) <= 0.0


def test_refined_drafts_keep_the_ar_distribution():
    """S = 2 with the drafter prefix cache under sampling: the refined CPS path, drafted from
    cached keys / values, is still a deterministic function of the history, verified as point
    masses, so the output has the AR distribution (the mutant suite's setting: V = 6, EOS,
    padded batch, exact enumeration, 10^4 samples per prompt)."""
    steps = 2
    from jaxspec.causal.decode import generate
    from jaxspec.causal.diffuspec import DiffusionDrafter
    from jaxspec.testing.distribution import check_groups
    from jaxspec.testing.tiny import tiny_model
    from models.diffusion.modeling import DiffusionConfig, DiffusionLM
    from tests.causal.test_decode import _exact_joint
    from tests.causal.test_mutants import CFG, N_NEW, PROMPTS, SEED, K, N, V
    from tests.causal.test_mutants import EOS as M_EOS

    target, tparams = tiny_model(V, seed=7, scale=6.0)
    dream = DiffusionLM(DiffusionConfig(base=target.config, head="dream", mask_token_id=4))
    proxy = NgramProxy.fit(np.random.default_rng(1).integers(0, V, 300), V, bits=10)
    drafter = DiffusionDrafter(dream, K, eos_id=4, adl=False, refine_steps=steps, prefix_cache=True)
    res = generate(
        target,
        tparams,
        [p for p in PROMPTS for _ in range(N)],
        max_new_tokens=N_NEW,
        sampling=CFG,
        drafter=drafter,
        drafter_params=(tparams, proxy),
        seed=SEED,
        bucket=8,
        eos_ids=(M_EOS,),
    )
    exact = [_exact_joint(target, tparams, p, N_NEW, CFG, eos=(M_EOS,)) for p in PROMPTS]
    chk = check_groups([(res.tokens[i * N : (i + 1) * N], ex) for i, ex in enumerate(exact)])
    assert chk.passed, chk.why
    assert (np.asarray(res.stats.draft_nfe) == steps * np.asarray(res.stats.steps)).all()


@pytest.mark.parametrize("head", ["dream", "llada"])
def test_prefix_cache_window_over_an_empty_cache_equals_the_full_forward(head):
    """The cached forward's plumbing (window slots, RoPE positions, key mask, the Dream
    row offset, left padding, a partly filled block for S > 1): with nothing cached
    (``cached = pad``) and the whole context inside the window, the drafter's block
    log-probabilities equal the uncached forward over the whole buffer."""
    from jaxspec.causal.diffuspec import DiffusionDrafter, DrafterCache
    from jaxspec.core.drafters import DraftContext
    from jaxspec.testing.tiny import tiny_diffusion_model
    from models.llama.modeling import init_cache

    model, params = tiny_diffusion_model(head, vocab=40, ctx=64)
    K, S, L = 5, 24, 7
    drafter = DiffusionDrafter(model, K, eos_id=0, k_min=K, prefix_cache=True)
    assert drafter.window == 2 * K + 2 and L + K <= drafter.window  # pad 0: all of it fits
    rng = np.random.default_rng(3)
    pad = np.array([0, 2])
    buf = np.zeros((2, S), np.int32)
    for b in range(2):
        buf[b, pad[b] : L] = rng.integers(1, 39, L - pad[b])
    ctx = DraftContext(
        buffer=jnp.asarray(buf),
        length=jnp.full((2,), L, jnp.int32),
        pad=jnp.asarray(pad, jnp.int32),
        active=jnp.ones((2,), bool),
    )
    cache = DrafterCache(
        kv=init_cache(model.config.base, 2, S + drafter.window), cached=jnp.asarray(pad, jnp.int32)
    )
    draft = jnp.where(
        jnp.arange(K)[None] % 2 == 0,
        model.config.mask_token_id,
        jnp.asarray(rng.integers(1, 39, (2, K)), jnp.int32),
    )
    for d in (None, draft):
        got, kv = drafter._block(params, ctx, d, cache)
        want = drafter.block_logprobs(params, ctx, d)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
        assert kv.size == S + drafter.window


def test_prefix_cache_is_refused_without_a_static_context_and_across_vocabularies():
    """The cross-vocabulary loop rebuilds the drafter's context every step: a prefix cache
    would be stale, so both the drafter and the registry say so."""
    from jaxspec.causal.diffuspec import DiffusionDrafter
    from jaxspec.core.drafters import DraftContext
    from jaxspec.methods import get_method
    from tests.test_methods import _inputs

    model, params, _, opts = _inputs("causal")
    dmodel, dparams = opts["dllm_drafter"]
    ctx = DraftContext(
        buffer=jnp.zeros((1, 16), jnp.int32),
        length=jnp.asarray([4]),
        pad=jnp.asarray([0]),
        active=jnp.asarray([True]),
    )
    with pytest.raises(ValueError, match="static prefill width"):
        DiffusionDrafter(dmodel, 4, eos_id=7, k_min=2, prefix_cache=True).init_state(
            (dparams, None), ctx
        )
    with pytest.raises(ValueError, match="another vocabulary"):
        get_method("diffuspec").configure(
            dict(opts, drafter_cache="prefix", vocab_adapter=(object(), object())), strict=False
        )
    with pytest.raises(ValueError, match="drafter-cache"):
        get_method("diffuspec").configure(dict(opts, drafter_cache="dual"), strict=False)
