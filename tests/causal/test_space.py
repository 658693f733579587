"""SPACE auto-correct decoding (:mod:`jaxspec.causal.space`): greedy identity with AR, the
mask groups' attention and positions against explicit uncached passes, the paper's sampling
rule shown approximate, and bad input. The exact rule's distribution (exact enumeration, every
verifier mutant rejected) is tested with the other chain methods in
``tests/causal/test_mutants.py``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import LoopConfig, generate, target_pass
from jaxspec.causal.space import SpaceDrafter, mask_groups, space_generate
from jaxspec.core.batching import DecodeInputError
from jaxspec.core.sampling import SamplingConfig
from jaxspec.testing.distribution import check_groups
from jaxspec.testing.tiny import tiny_model
from models.llama.modeling import init_cache

PROMPTS = [[3, 9, 4, 9, 4, 9, 4, 17, 2], [5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


@pytest.mark.parametrize("arch,k", [("llama", 1), ("qwen2", 5)])
def test_greedy_identical_to_ar(arch, k):
    """A padded batch of three prompts with EOS inside the vocabulary: tokens identical to AR
    greedy decoding of the same model; one target forward per step, no draft NFE."""
    model, params = tiny_model(64, arch=arch, seed=0, mask_token_id=63)
    ar = generate(model, params, PROMPTS, max_new_tokens=24, eos_ids=(7,), bucket=16)
    res = space_generate(
        model, params, PROMPTS, max_new_tokens=24, mask_groups=k, eos_ids=(7,), bucket=16
    )
    assert res.tokens == ar.tokens
    st = res.stats
    assert st.method == "space" and int(st.draft_nfe.sum()) == 0
    np.testing.assert_array_equal(st.target_nfe, st.steps + 1)  # + the prefill
    np.testing.assert_array_equal(st.drafts_proposed, k * st.steps)


def _uncached_logits(model, params, seq, T=16):
    """Last-row logits of an uncached causal pass over ``seq`` (right-padded to ``T``: a
    causal pass never looks right, and one compile serves every length)."""
    toks = np.zeros((1, T), np.int32)
    toks[0, : len(seq)] = seq
    mask = jnp.tril(jnp.ones((T, T), bool))[None]
    logits = _apply(model, params, jnp.asarray(toks), jnp.arange(T)[None], mask)
    return np.asarray(logits[0, len(seq) - 1])


@functools.partial(jax.jit, static_argnums=0)
def _apply(model, params, toks, pos, mask):
    return model.apply({"params": params}, toks, pos, mask)[0]


def test_mask_groups_equal_explicit_sar_inputs():
    """Each mask row of one cached pass equals the last row of an uncached causal pass over
    the SAR input it stands for (Eq. 2: ``[context, x_l, c_1..c_g, M x (j+1)]``), and the
    verification rows equal AR rows: the attention mask and position ids are right. A
    left-padded row checks the padding offset."""
    k, mask_id = 3, 31
    model, params = tiny_model(32, seed=5, mask_token_id=mask_id)
    drafter = SpaceDrafter(k, 32, mask_id)
    cfg = LoopConfig(model=model, max_new=8, sampling=SamplingConfig(), drafter=drafter, eos_ids=())
    ctx_tokens = [[4, 5, 6, 7, 8, 9], [10, 11, 12, 13]]
    cands = [[20, 21, 22], [23, 24, 25]]
    B, P, S = 2, 6, 48
    pad = jnp.asarray([0, 2], jnp.int32)
    buf = np.zeros((B, P), np.int32)
    for b, t in enumerate(ctx_tokens):
        buf[b, P - len(t) :] = t
    # prefill the context except its last token, then one pass [x_l, c_1..c_k] + k+1 groups
    _, _, cache = target_pass(
        cfg,
        params,
        jnp.asarray(buf[:, : P - 1]),
        jnp.zeros((B,), jnp.int32),
        pad,
        init_cache(model.config, B, S),
        S,
    )
    feed = jnp.concatenate([jnp.asarray(buf[:, P - 1 :]), jnp.asarray(cands, jnp.int32)], axis=1)
    queries = mask_groups(P - 1 - pad, k, k, mask_id)
    logits, qlogits, _ = target_pass(
        cfg, params, feed, jnp.full((B,), P - 1, jnp.int32), pad, cache, S, queries, k
    )
    for b in range(B):
        for i in range(k + 1):  # verification rows: AR logits after x_l, c_1..c_i
            want = _uncached_logits(model, params, ctx_tokens[b] + cands[b][:i])
            np.testing.assert_allclose(np.asarray(logits[b, i]), want, atol=2e-4)
        for g in range(k + 1):
            for j in range(k):
                seq = ctx_tokens[b] + cands[b][:g] + [mask_id] * (j + 1)
                want = _uncached_logits(model, params, seq)
                np.testing.assert_allclose(np.asarray(qlogits[b, g * k + j]), want, atol=2e-4)


def test_paper_sampling_rule_is_approximate():
    """Algorithm 1 line 18 (the extra token from p instead of the residual) fails the exact
    distribution test that the default rule passes, on the mutant suite's setting."""
    from tests.causal.test_decode import _exact_joint
    from tests.causal.test_mutants import CFG, EOS, N_NEW, SEED, K, N, V
    from tests.causal.test_mutants import PROMPTS as MP

    model, params = tiny_model(V, seed=7, scale=6.0)
    exact = [_exact_joint(model, params, p, N_NEW, CFG, eos=(EOS,)) for p in MP]
    prompts = [p for p in MP for _ in range(N)]
    drafter = SpaceDrafter(K, V, 4, CFG, "paper")
    res = space_generate(
        model,
        params,
        prompts,
        max_new_tokens=N_NEW,
        mask_groups=K,
        sampling=CFG,
        space_sampling="paper",
        mask_id=4,
        seed=SEED,
        eos_ids=(EOS,),
        bucket=8,
    )
    toks = res.tokens
    chk = check_groups([(toks[i * N : (i + 1) * N], ex) for i, ex in enumerate(exact)])
    assert drafter.resample == "target"
    assert not chk.passed, chk.why
    assert 0.05 < res.stats.acceptance_rate < 0.9  # rejections happen, so the rule matters


def test_bad_input():
    model, params = tiny_model(64, seed=0)
    with pytest.raises(ValueError, match="no mask token"):
        space_generate(model, params, PROMPTS, max_new_tokens=4)
    with pytest.raises(ValueError, match="k must be >= 1"):
        space_generate(model, params, PROMPTS, max_new_tokens=4, mask_groups=0, mask_id=3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        space_generate(model, params, PROMPTS, max_new_tokens=4, mask_id=64)
    with pytest.raises(ValueError, match="space_sampling"):
        space_generate(model, params, PROMPTS, max_new_tokens=4, mask_id=3, space_sampling="x")
    short, sparams = tiny_model(64, seed=0, ctx=40, mask_token_id=63)
    with pytest.raises(DecodeInputError, match="context"):
        space_generate(short, sparams, PROMPTS, max_new_tokens=25, mask_groups=5)
