"""Draft-model speculative sampling (:mod:`jaxspec.causal.sps`): greedy identity with AR,
the draft model's rolled-back KV cache, the drafter's NFE, and bad input. The sampled
distribution (exact enumeration, 10^4 samples per prompt, every verifier mutant rejected) is
tested with the other chain methods in ``tests/causal/test_mutants.py``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import generate
from jaxspec.causal.sps import DraftModelDrafter
from jaxspec.core.batching import DecodeInputError
from jaxspec.core.drafters import DraftContext
from jaxspec.core.sampling import SamplingConfig
from jaxspec.testing.tiny import tiny_model

PROMPTS = [[3, 9, 4, 9, 4, 9, 4, 17, 2], [5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]


@pytest.mark.parametrize("arch,k", [("llama", 1), ("qwen2", 4)])
def test_greedy_identical_to_ar(arch, k):
    """A padded batch of three prompts, EOS inside the vocabulary: tokens identical to AR."""
    model, params = tiny_model(64, arch=arch, seed=0)
    dmodel, dparams = tiny_model(64, arch=arch, seed=1, layers=1)
    ar = generate(model, params, PROMPTS, max_new_tokens=24, eos_ids=(7,), bucket=16)
    res = generate(
        model,
        params,
        PROMPTS,
        max_new_tokens=24,
        eos_ids=(7,),
        bucket=16,
        drafter=DraftModelDrafter(dmodel, k),
        drafter_params=dparams,
    )
    assert res.tokens == ar.tokens
    st = res.stats
    # k draft forwards per verification step, on every row
    np.testing.assert_array_equal(st.draft_nfe, k * st.steps)
    np.testing.assert_array_equal(st.drafts_proposed, k * st.steps)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.9, top_k=20)])
def test_self_drafting_accepts_every_draft(sampling):
    """The target drafting for itself: every draft is accepted (q = p), so each step emits
    k + 1 tokens. Any slip in the draft cache's rollback (a stale slot, a wrong position)
    would make q differ from p and show up as rejections."""
    model, params = tiny_model(64, seed=2)
    k, n_new = 3, 25
    res = generate(
        model,
        params,
        PROMPTS,
        max_new_tokens=n_new,
        sampling=sampling,
        seed=5,
        bucket=16,
        drafter=DraftModelDrafter(model, k, sampling),
        drafter_params=params,
    )
    st = res.stats
    assert st.acceptance_rate == 1.0
    assert all(len(t) == n_new for t in res.tokens)
    # 1 prefill + ceil((n_new - 1) / (k + 1)) verification steps
    np.testing.assert_array_equal(st.target_nfe, 1 + -(-(n_new - 1) // (k + 1)))


def test_draft_cache_matches_an_uncached_draft_model():
    """After prefill, one step and the update, the next proposal's q equals the draft
    model's uncached next-token distribution at every draft position."""
    model, params = tiny_model(32, seed=3)
    drafter = DraftModelDrafter(model, 3, SamplingConfig(temperature=1.0))
    prompt = [4, 5, 6, 7, 8]
    B, S = 1, 24
    buf = jnp.zeros((B, S), jnp.int32).at[0, :6].set(jnp.asarray(prompt + [9]))
    ctx = DraftContext(
        buffer=buf,
        length=jnp.asarray([6], jnp.int32),
        pad=jnp.zeros((1,), jnp.int32),
        active=jnp.ones((1,), bool),
        filled=6,
    )
    state = drafter.init_state(params, ctx)
    d1, state = drafter.propose(
        params, state, ctx.replace(filled=None), jax.random.PRNGKey(0), True
    )
    # accept one draft and write a correction token
    toks = [int(d1.tokens[0, 0]), 11]
    buf = buf.at[0, 6:8].set(jnp.asarray(toks))
    ctx2 = ctx.replace(buffer=buf, length=jnp.asarray([8], jnp.int32), filled=None)
    state = drafter.update(params, state, ctx2, jnp.asarray([1]))
    d2, _ = drafter.propose(params, state, ctx2, jax.random.PRNGKey(1), True)
    seq = prompt + [9] + toks + [int(t) for t in d2.tokens[0]]
    T = len(seq)
    mask = jnp.tril(jnp.ones((T, T), bool))[None]
    logits, _ = model.apply({"params": params}, jnp.asarray([seq]), jnp.arange(T)[None], mask)
    want = jax.nn.softmax(logits[0, 7 : 7 + 3], axis=-1)
    np.testing.assert_allclose(np.asarray(d2.q[0]), np.asarray(want), atol=2e-5)


def test_bad_input():
    model, params = tiny_model(64, seed=0)
    other, oparams = tiny_model(48, seed=1)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=4,
            drafter=DraftModelDrafter(other, 2),
            drafter_params=oparams,
        )
    short, sparams = tiny_model(64, seed=1, ctx=16)
    with pytest.raises(DecodeInputError, match="draft model's context"):
        generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=8,
            drafter=DraftModelDrafter(short, 2),
            drafter_params=sparams,
        )
    with pytest.raises(ValueError, match="draft length"):
        DraftModelDrafter(model, 0)
    with pytest.raises(ValueError, match="target's SamplingConfig"):
        generate(
            model,
            params,
            PROMPTS,
            max_new_tokens=4,
            sampling=SamplingConfig(temperature=1.0),
            drafter=DraftModelDrafter(model, 2),
            drafter_params=params,
        )
