"""The Drafter protocol with a drafter that owns parameters, loop state, a traced draft
length and a real draft NFE (:class:`jaxspec.testing.drafters.TableDrafter`): greedy output
identical to AR, sampled output distributed as AR's (exact enumeration), NFE accounting."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal import generate
from jaxspec.core.drafters import Drafter, NgramDrafter
from jaxspec.core.sampling import SamplingConfig
from jaxspec.testing.distribution import check_distribution
from jaxspec.testing.drafters import TableDrafter
from jaxspec.testing.tiny import tiny_model
from tests.causal.test_decode import _exact_joint


def _table(V: int, seed: int = 0, scale: float = 3.0):
    return {"logits": scale * jax.random.normal(jax.random.PRNGKey(seed), (V, V))}


def test_both_drafters_implement_the_protocol():
    assert isinstance(NgramDrafter(3, 10), Drafter)
    assert isinstance(TableDrafter(3, 10), Drafter)


def test_optional_capabilities_have_defaults_overrides_and_the_gate_forwards_them():
    """The optional capabilities are declared on the protocol with defaults; a drafter
    overrides only what it has (SPACE's draft queries, SPS's draft-model context and layout),
    and the cost gate forwards the wrapped drafter's."""
    from jaxspec.causal.space import SpaceDrafter
    from jaxspec.causal.sps import DraftModelDrafter
    from jaxspec.core.drafters import CostGate

    caps = lambda d: (
        d.resample,
        d.context_length,
        d.position_overshoot,
        d.query_slots,
        d.one_token_steps,
        d.eos_id,
    )
    assert (
        caps(NgramDrafter(3, 10))
        == caps(TableDrafter(3, 10))
        == ("residual", None, 0, 0, False, None)
    )
    space = SpaceDrafter(3, 10, mask_id=9, space_sampling="paper")
    assert caps(space) == ("target", None, 6, 12, False, None)
    model, _ = tiny_model(32)
    sps = DraftModelDrafter(model, 3)
    ctx = model.config.max_position_embeddings
    assert caps(sps) == ("residual", ctx, 0, 0, True, None)
    gated = CostGate(sps, 2.0)
    assert isinstance(gated, Drafter) and caps(gated) == caps(sps)
    assert (gated.name, gated.draft_length, gated.vocab_size) == ("sps", 3, 32)
    with pytest.raises(ValueError, match="draft queries"):
        CostGate(space, 2.0)


def test_greedy_identical_to_ar_with_params_state_and_traced_length():
    V = 32
    model, params = tiny_model(V, seed=3)
    prompts = [[1, 2, 3, 4, 5], [7, 7, 8], [9, 10, 11, 12, 13, 14, 15]]
    ar = generate(model, params, prompts, max_new_tokens=20, bucket=8)
    d = TableDrafter(4, V)
    sp = generate(
        model, params, prompts, max_new_tokens=20, bucket=8, drafter=d, drafter_params=_table(V)
    )
    assert sp.tokens == ar.tokens
    st = sp.stats
    # one draft forward per drafted token, every step verified a draft of length k_t
    np.testing.assert_array_equal(st.draft_nfe, st.drafts_proposed)
    assert (st.draft_nfe > 0).all()
    # the adaptive length shrank on rejections: fewer drafts than k per step
    assert st.drafts_proposed.sum() < 4 * st.steps.sum()
    # a row never accepts more than it proposed
    assert st.accepted_drafts <= st.drafts_proposed.sum()


def test_other_params_other_drafts_same_output_one_compile():
    """Parameters are traced: a second table reuses the executable and still gives AR's
    output."""
    V = 32
    model, params = tiny_model(V, seed=3)
    prompts = [[1, 2, 3, 4, 5]]
    ar = generate(model, params, prompts, max_new_tokens=16, bucket=8)
    a = generate(
        model,
        params,
        prompts,
        max_new_tokens=16,
        bucket=8,
        drafter=TableDrafter(3, V),
        drafter_params=_table(V, 1),
    )
    b = generate(
        model,
        params,
        prompts,
        max_new_tokens=16,
        bucket=8,
        drafter=TableDrafter(3, V),
        drafter_params=_table(V, 2),
    )
    assert a.tokens == b.tokens == ar.tokens
    assert b.compile_s == 0.0
    assert a.stats.acceptance_rate != b.stats.acceptance_rate


def test_vocab_mismatch_is_an_error():
    model, params = tiny_model(32)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        generate(
            model,
            params,
            [[1, 2]],
            max_new_tokens=4,
            drafter=TableDrafter(2, 33),
            drafter_params=_table(33),
        )


def test_sampled_distribution_equals_ar():
    """q from a real distribution (not point masses), adaptive k_t: the exact joint matches
    (:func:`jaxspec.testing.distribution.check_distribution`). Four new tokens with k = 2,
    so bonus tokens of the first step lie inside the budget."""
    V, k, N = 6, 2, 20000
    n_new = k + 2
    cfg = SamplingConfig(temperature=1.0)
    model, params = tiny_model(V, seed=7, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, n_new, cfg)
    res = generate(
        model,
        params,
        [prompt] * N,
        max_new_tokens=n_new,
        sampling=cfg,
        drafter=TableDrafter(k, V),
        drafter_params=_table(V, 4, 1.0),
        seed=5,
        bucket=8,
    )
    chk = check_distribution(res.tokens, exact)
    assert chk.passed, chk.why
    assert 0.05 < res.stats.acceptance_rate < 0.95
    assert res.stats.accept_hist[:, k + 1].sum() > 0  # bonus tokens were drawn


def test_greedy_bigram_argmax_equals_the_dense_argmax():
    """:func:`context_bigram_argmax` (greedy n-gram drafting) is ``argmax`` of the dense Eq. 23
    distribution :func:`context_bigram` on random rows: repeated tokens (ties between
    successors), unknown stretches, and conditioning tokens never seen followed (point mass)."""
    from jaxspec.core.drafters import bigram_pair_counts, context_bigram, context_bigram_argmax

    V, S = 7, 40
    rng = np.random.default_rng(0)
    dense = jax.jit(lambda t, kn, c: jnp.argmax(context_bigram(t, kn, c, V)[0]))
    fast = jax.jit(lambda t, kn, c: context_bigram_argmax(t, *bigram_pair_counts(t, kn), c))
    checked = {"tie": 0, "none": 0}
    for _ in range(200):
        toks = jnp.asarray(rng.integers(0, V, S), jnp.int32)
        lo, hi = sorted(rng.integers(0, S, 2))
        known = jnp.asarray((np.arange(S) >= lo) & (np.arange(S) < hi + 1))
        for cond in range(V):
            c = jnp.int32(cond)
            assert int(fast(toks, known, c)) == int(dense(toks, known, c)), (toks, lo, hi, cond)
            dist = np.asarray(context_bigram(toks, known, c, V)[0])
            checked["tie"] += int((dist == dist.max()).sum() > 1)
            checked["none"] += int(context_bigram(toks, known, c, V)[1] == 0)
    assert checked["tie"] > 50 and checked["none"] > 50, checked
