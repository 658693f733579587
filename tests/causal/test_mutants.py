"""Mutation-checked losslessness tests of the causal chain methods (issue 17).

The distribution test (:func:`jaxspec.testing.distribution.check_groups`, exact enumeration,
``10^4`` samples per prompt) must accept the real code and reject every plausible wrong
verifier of :data:`jaxspec.testing.mutants.MUTANTS`, injected through the test-only seam
:func:`jaxspec.testing.mutants.inject_causal`; the equivalent (still lossless) variants of
:data:`~jaxspec.testing.mutants.EQUIVALENT` must be accepted.

Configuration, chosen so that each mutant's wrong step reaches the output: a tiny causal
model (V = 6), temperature 0.8 with top-k 4 (processing differs from the raw softmax),
draft length 2 and 5 new tokens (the bonus of the first step is token 4, later residuals
and bonuses land on token 5), EOS inside the vocabulary (outcomes of different lengths), a
left-padded batch of two different prompts. Methods: the context n-gram drafter (suffix
copies with point-mass q, Eq. 23 bigram fallback with its real q), the model-based
:class:`~jaxspec.testing.drafters.TableDrafter` (real q, adaptive k_t), SPS
(:class:`~jaxspec.causal.sps.DraftModelDrafter`: a one-layer draft model with a KV cache) and
SPACE (:class:`~jaxspec.causal.space.SpaceDrafter`: q from the target's own mask groups),
DiffuSpec (:class:`~jaxspec.causal.diffuspec.DiffusionDrafter`: CPS paths with ADL, point-mass
q) and DFlash (:class:`~jaxspec.causal.dflash.DFlashDrafter`: a random one-layer block drafter
on the target's hidden states, block 3, real q).

DFlash also has mutants of its own path (:data:`~jaxspec.testing.mutants.DFLASH_MUTANTS`:
a wrong q, drafts not drawn from their q, target logits taken at a feature layer), which the
distribution test (and, where greedy output changes, the greedy-identity test on 50 prompts)
must reject, and variants that are still exact (:data:`~jaxspec.testing.mutants.
DFLASH_EQUIVALENT`: block positions one off, a stale feature in the context, no bonus token),
which those tests must accept and which other checks catch: the decode loop's block
distributions against the training objective's for the same anchor, and the acceptance
histogram.

One compile per method for the real code and one for all the mutants together (each mutant
runs its own block of rows, :func:`~jaxspec.testing.mutants.causal_accept`). Set
``JAXSPEC_MUTANTS_MD=results/mutants.md`` to write the result table.

Error rates: each must-accept check (real code, equivalent variants: 6 here) falsely
rejects with probability <= 2e-3, so about 1% of seeds fail one somewhere; the wrong
variants are rejected with chi-square p <= 1e-20 and a wide TV margin. Seed 3 was such a
seed: ``table / ignore-draft-len`` had TV 0.0610 > 0.0601 (the null TV's mean is 0.0498,
sd 0.0030) with chi-square p 0.003; at 10^5 samples per prompt that variant and the real
code both pass with the same TV (0.0165 vs floor 0.0189), so it was chance, and the suite
runs with seed 4.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import generate
from jaxspec.causal.dflash import DFlashDrafter, DFlashSpec, drafter_params, init_drafter
from jaxspec.causal.diffuspec import DiffusionDrafter, NgramProxy
from jaxspec.causal.space import SpaceDrafter
from jaxspec.causal.sps import DraftModelDrafter
from jaxspec.core.drafters import DraftContext, NgramDrafter
from jaxspec.core.sampling import SamplingConfig
from jaxspec.core.verify import verify_sample
from jaxspec.testing.distribution import check_distribution, check_groups
from jaxspec.testing.drafters import TableDrafter
from jaxspec.testing.mutants import (
    DFLASH_EQUIVALENT,
    DFLASH_MUTANTS,
    EQUIVALENT,
    MUTANTS,
    inject_causal,
    inject_dflash,
    verify_variant,
)
from jaxspec.testing.tiny import tiny_model
from models.diffusion.modeling import DiffusionConfig, DiffusionLM
from tests.causal.test_decode import _exact_joint

V, EOS, K, N_NEW, N = 6, 5, 2, 5, 10_000
SEED = 4  # seed 3: one chance false rejection of a lossless variant (see the module docstring)
CFG = SamplingConfig(temperature=0.8, top_k=4)
# prompt 0: n-gram suffix copies (point-mass q); prompt 1 (shorter: left padding): no
# repeated 2-gram, so the n-gram drafter falls back to the Eq. 23 bigram, whose q after the
# last token 0 is (1/2 on 1, 1/2 on 3), not a point mass
PROMPTS = ([1, 2, 3, 1, 2, 3, 1, 2], [2, 0, 1, 0, 3, 4, 0])
VARIANTS = MUTANTS + EQUIVALENT
# masks are told apart by their place in the feed, so any id works; with id 4 most of
# SPACE's draft ratios p/q are >= 1 and the shared-uniform mutant hides (chi2 p 0.01), with
# id 0 about half the drafts are rejected and every mutant is rejected at p <= 1e-39
SPACE_MASK = 0
METHODS = ("ngram", "table", "sps", "space", "diffuspec", "dflash")
DFLASH_VARIANTS = DFLASH_MUTANTS + DFLASH_EQUIVALENT


def _drafter(method):
    if method == "ngram":  # max_ngram 3, min_ngram 2, bigram fallback on
        return NgramDrafter(K, V), ()
    if method == "sps":  # a one-layer draft model with its own KV cache, q its softmax
        dmodel, dparams = tiny_model(V, seed=8, scale=6.0, layers=1)
        return DraftModelDrafter(dmodel, K, CFG), dparams
    if method == "space":  # the target's own mask-group rows are q
        return SpaceDrafter(K, V, SPACE_MASK, CFG), ()
    if method == "diffuspec":
        # CPS paths of a Dream-head drafter over the target's weights (bidirectional, so it
        # differs from the target), verified as point masses. Fixed k, and the lattice's EOS
        # is the mask id (never drafted), so paths run the full k and bonus tokens reach the
        # output; the suite's EOS still ends rows through the target.
        target, tparams = tiny_model(V, seed=7, scale=6.0)
        dream = DiffusionLM(DiffusionConfig(base=target.config, head="dream", mask_token_id=4))
        proxy = NgramProxy.fit(np.random.default_rng(1).integers(0, V, 300), V, bits=10)
        return DiffusionDrafter(dream, K, eos_id=4, adl=False), (tparams, proxy)
    # features of layer 0 of 2 (the early-exit mutant then reads logits short of the last layer)
    if method == "dflash":  # random weights x 20: sharp q rows that differ along the block
        target, tparams = tiny_model(V, seed=7, scale=6.0)
        spec = DFlashSpec.for_target(target.config, block_size=K + 1, layer_ids=(0,))
        own = jax.tree_util.tree_map(
            lambda x: 20.0 * x if x.ndim >= 2 else x, init_drafter(spec, seed=1)
        )
        return DFlashDrafter(spec, CFG), drafter_params(own, tparams)
    table = {"logits": 2.0 * jax.random.normal(jax.random.PRNGKey(4), (V, V))}  # sharp q
    return TableDrafter(K, V), table


class _Suite:
    """Lazily computed runs, shared by the tests of this module."""

    def __init__(self):
        self.model, self.params = tiny_model(V, seed=7, scale=6.0)
        self.exact = [
            _exact_joint(self.model, self.params, p, N_NEW, CFG, eos=(EOS,)) for p in PROMPTS
        ]
        self.results: dict = {}

    def _generate(self, method, prompts):
        drafter, dparams = _drafter(method)
        return generate(
            self.model,
            self.params,
            prompts,
            max_new_tokens=N_NEW,
            sampling=CFG,
            drafter=drafter,
            drafter_params=dparams,
            seed=SEED,
            bucket=8,
            eos_ids=(EOS,),
        )

    def _check(self, tokens):
        return check_groups([(tokens[i * N : (i + 1) * N], ex) for i, ex in enumerate(self.exact)])

    def real(self, method):
        if (method, "real") not in self.results:
            res = self._generate(method, [p for p in PROMPTS for _ in range(N)])
            self.results[(method, "real")] = (self._check(res.tokens), res)
        return self.results[(method, "real")]

    def variant(self, method, name):
        if (method, name) not in self.results:
            block = len(PROMPTS) * N
            with inject_causal(VARIANTS, rows_per=block):
                res = self._generate(
                    method, [p for _ in VARIANTS for p in PROMPTS for _ in range(N)]
                )
            for j, m in enumerate(VARIANTS):
                toks = res.tokens[j * block : (j + 1) * block]
                self.results[(method, m.name)] = (self._check(toks), None)
        return self.results[(method, name)]

    def dflash_variant(self, name):
        """The DFlash-path variants, all from one batched run (each on its own rows)."""
        if ("dflash", name) not in self.results:
            block = len(PROMPTS) * N
            with inject_dflash(DFLASH_VARIANTS, rows_per=block):
                res = self._generate(
                    "dflash", [p for _ in DFLASH_VARIANTS for p in PROMPTS for _ in range(N)]
                )
            for j, m in enumerate(DFLASH_VARIANTS):
                rows = slice(j * block, (j + 1) * block)
                self.results[("dflash", m.name)] = (
                    self._check(res.tokens[rows]),
                    res.stats.accept_hist[rows],
                )
        return self.results[("dflash", name)]

    def table(self) -> str:
        lines = [
            "| method | verifier | lossless | distribution test | worst TV | TV floor "
            "quantile | chi2 p (adj.) | impossible |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for method in METHODS:
            extra = DFLASH_VARIANTS if method == "dflash" else ()
            for m in (None,) + VARIANTS + extra:
                name = "real" if m is None else m.name
                if (method, name) not in self.results:
                    continue
                chk = self.results[(method, name)][0]
                lossless = m is None or m.lossless
                lines.append(
                    f"| {method} | {name} | {'yes' if lossless else 'no'} | "
                    f"{'accepted' if chk.passed else 'rejected'} | {chk.tv:.4f} | "
                    f"{chk.tv_floor_quantile:.4f} | {chk.p_value:.2g} | {chk.impossible} |"
                )
        return "\n".join(lines)


@pytest.fixture(scope="module")
def suite():
    s = _Suite()
    yield s
    text = s.table()
    print("\n" + text)
    out = os.environ.get("JAXSPEC_MUTANTS_MD")
    if out:
        head = (
            "# Mutation-checked distribution tests (causal chain methods)\n\n"
            f"`tests/causal/test_mutants.py`: V={V}, EOS={EOS}, k={K}, {N_NEW} new tokens, "
            f"{CFG}, prompts {list(PROMPTS)}, {N} samples per prompt; "
            f"seed {SEED}; `check_groups` (alpha 1e-3, TV floor quantile 0.999, "
            "Bonferroni over the prompts). Mutants: `jaxspec/testing/mutants.py`. "
            "Worst TV / floor: of the prompt with the largest TV-to-floor ratio.\n\n"
        )
        desc = "\n".join(f"- `{m.name}`: {m.description}" for m in VARIANTS + DFLASH_VARIANTS)
        note = (
            "\n\nSeed 3 falsely rejected `table / ignore-draft-len` (TV 0.0610 > 0.0601; "
            "null TV mean 0.0498, sd 0.0030; chi2 p 0.003): at 10^5 samples per prompt it "
            "and the real code pass with the same TV (0.0165 vs floor 0.0189). Each "
            "must-accept check has a false-rejection rate <= 2e-3."
        )
        Path(out).write_text(head + text + "\n\n" + desc + note + "\n")


@pytest.mark.parametrize("method", METHODS)
def test_real_code_accepted(suite, method):
    chk, res = suite.real(method)
    assert chk.passed, chk.why
    st = res.stats
    # the configuration reaches what the mutants break
    assert 0.05 < st.acceptance_rate < 0.9, st.acceptance_rate  # accepts and rejects
    assert st.accept_hist[:, K + 1].sum() > 1000  # all k accepted: bonus drawn
    lens = np.array([len(t) for t in res.tokens])
    assert (lens < N_NEW).mean() > 0.05  # EOS cut rows short
    assert len({len(p) for p in PROMPTS}) > 1  # a padded batch
    if method == "ngram":  # the bigram fallback's q on prompt 1 is a real distribution
        drafter, _ = _drafter(method)
        buf = jnp.zeros((1, 16), jnp.int32).at[0, : len(PROMPTS[1])].set(jnp.asarray(PROMPTS[1]))
        ctx = DraftContext(
            buffer=buf,
            length=jnp.asarray([len(PROMPTS[1])], jnp.int32),
            pad=jnp.zeros((1,), jnp.int32),
            active=jnp.ones((1,), bool),
        )
        d, _ = drafter.propose((), (), ctx, jax.random.PRNGKey(0), True)
        assert bool(d.has_draft[0]) and int((np.asarray(d.q[0, 0]) > 0).sum()) == 2


# Open finding (issue 17): with DiffuSpec's point-mass CPS drafts the bonus-from-residual
# mutant only removes the last draft's token from the bonus distribution, and at this setting
# (10^4 samples per prompt) the test cannot tell it from the real code (TV 0.051 vs floor
# 0.060, chi2 p 0.16; a proxy that favours repeating the last draft did not help either).
# strict: the suite notices the day it can. On a vocabulary of 3 the same test does reject it:
# test_diffuspec_bonus_from_residual_seen_on_a_smaller_vocabulary.
_UNSEEN = {("diffuspec", "bonus-from-residual")}


@pytest.mark.slow  # a power check of the distribution test (28 s): make test-all
def test_diffuspec_bonus_from_residual_seen_on_a_smaller_vocabulary():
    """The open finding above, settled: on a vocabulary of 3 (the drafter never drafts id 2,
    its mask and lattice EOS), temperature 1, k = 2 and 4 new tokens, every third draft chain
    is accepted whole, the target often repeats the last draft, and the same distribution test
    accepts the real DiffuSpec code and rejects bonus-from-residual (measured: chi2 p 1.8e-35
    and 6.6e-70 on the two prompts)."""
    v, k, n_new, cfg = 3, 2, 4, SamplingConfig(temperature=1.0)
    model, params = tiny_model(v, seed=7, scale=6.0)
    prompts = ([1, 2, 1, 2, 1, 2], [0, 1, 0, 2])
    exact = [_exact_joint(model, params, p, n_new, cfg, eos=()) for p in prompts]
    dream = DiffusionLM(DiffusionConfig(base=model.config, head="dream", mask_token_id=v - 1))
    proxy = NgramProxy.fit(np.random.default_rng(1).integers(0, v, 300), v, bits=10)
    drafter = DiffusionDrafter(dream, k, eos_id=v - 1, adl=False)
    rows = [p for p in prompts for _ in range(N)]

    def check():
        res = generate(
            model,
            params,
            rows,
            max_new_tokens=n_new,
            sampling=cfg,
            drafter=drafter,
            drafter_params=(params, proxy),
            seed=SEED,
            bucket=8,
        )
        chk = check_groups([(res.tokens[i * N : (i + 1) * N], ex) for i, ex in enumerate(exact)])
        return chk, res

    real, res = check()
    assert real.passed, real.why
    assert res.stats.accept_hist[:, k + 1].sum() > 0.1 * len(rows)  # bonus tokens drawn
    bonus = [m for m in MUTANTS if m.name == "bonus-from-residual"]
    with inject_causal(bonus, rows_per=len(rows)):
        mutant, _ = check()
    assert not mutant.passed and mutant.p_value < 1e-10, mutant.why


# the mutant suite of the model-based table drafter (real q, adaptive k_t) runs in
# ``make test``; those of ngram, sps, space and diffuspec (the same verifier behind other
# drafters, about 250 s of CPU together) in ``make test-all``. Every method's real code keeps
# its distribution test above.
FAST_MUTANT_SUITES = ("table",)


@pytest.mark.parametrize(
    "method",
    [m if m in FAST_MUTANT_SUITES else pytest.param(m, marks=pytest.mark.slow) for m in METHODS],
)
def test_every_mutant_rejected_and_equivalent_accepted(suite, method):
    """Every mutant of the shared chain verifier is rejected, and every equivalent variant
    accepted, by the distribution test on ``method``'s outputs. All variants of a method come
    from one batched run, so they are one test: pytest-xdist then computes each batch on one
    worker only (split into a test per variant, both workers computed every batch)."""
    wrong = []
    for m in MUTANTS:
        chk, _ = suite.variant(method, m.name)
        if (method, m.name) in _UNSEEN:  # strict: fails the day the test can see it
            if not chk.passed:
                wrong.append(
                    f"{m.name} is now rejected: the open finding is settled, update _UNSEEN"
                )
        elif chk.passed:
            wrong.append(f"mutant {m.name} not rejected: {chk.why}")
    for m in EQUIVALENT:
        chk, _ = suite.variant(method, m.name)
        if not chk.passed:
            wrong.append(f"equivalent {m.name} rejected: {chk.why}")
    assert not wrong, f"{method}: " + "; ".join(wrong)


def test_dflash_path_mutants_rejected_and_exact_variants_accepted(suite):
    """Every DFlash-path mutant (a wrong q, drafts not drawn from their q, target logits from
    a feature layer) is rejected by the distribution test, and every variant that is still
    exact (block positions one off, a stale feature in the context, no bonus token) is
    accepted. The dropped bonus shows in the acceptance histogram instead: no step of that
    variant takes ``k + 1`` tokens, against over a thousand of the real code's. One batched
    run for all variants."""
    wrong = []
    for m in DFLASH_VARIANTS:
        chk, _ = suite.dflash_variant(m.name)
        if m.lossless and not chk.passed:
            wrong.append(f"exact variant {m.name} rejected: {chk.why}")
        if not m.lossless and chk.passed:
            wrong.append(f"mutant {m.name} not rejected: {chk.why}")
    assert not wrong, "; ".join(wrong)
    _, res = suite.real("dflash")
    assert res.stats.accept_hist[:, K + 1].sum() > 1000
    _, hist = suite.dflash_variant("no-bonus")
    assert hist[:, K + 1].sum() == 0 and hist[:, K].sum() > 1000


def test_dflash_greedy_identity_rejects_the_logit_mutant_on_50_prompts():
    """Greedy decoding of 50 prompts (EOS inside the vocabulary) with a random block-4
    drafter: the real code and every still-exact variant give AR's tokens on every prompt;
    the mutant whose target logits come from a feature layer changes them. One batched run,
    each variant on its own 50 rows."""
    model, params = tiny_model(64, seed=0)
    # features of layer 0 of 2: the mutant's logits come from a layer short of the last
    spec = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(0,))
    own = jax.tree_util.tree_map(lambda x: 8.0 * x if x.ndim >= 2 else x, init_drafter(spec, 1))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(1, 64, size=rng.integers(3, 12))] for _ in range(50)]
    kw = dict(max_new_tokens=24, eos_ids=(7,), bucket=16)
    ar = generate(model, params, prompts, **kw)
    variants = (None,) + DFLASH_VARIANTS
    with inject_dflash(variants, rows_per=len(prompts)):
        res = generate(
            model,
            params,
            prompts * len(variants),
            drafter=DFlashDrafter(spec),
            drafter_params=drafter_params(own, params),
            **kw,
        )
    for j, m in enumerate(variants):
        toks = res.tokens[j * len(prompts) : (j + 1) * len(prompts)]
        same = sum(a == b for a, b in zip(toks, ar.tokens))
        if m is not None and m.greedy_visible:
            assert same < len(prompts) // 2, (m.name, same)
        else:
            assert same == len(prompts), (m and m.name, same)
    assert res.stats.acceptance_rate > 0


def _decode_block_q(model, params, spec, own, prompts):
    """After the prompt pass and one verification step of a left-padded batch: the q of the
    next block (temperature 1: the drafter's softmax), the buffer, lengths and padding."""
    from jaxspec.causal import decode as D

    cfg = SamplingConfig(temperature=1.0)
    drafter, dparams = DFlashDrafter(spec, cfg), drafter_params(own, params)
    buf, pad = D.left_pad(prompts, 8, 0)
    buf, pad = jnp.asarray(buf), jnp.asarray(pad)
    loop = D.LoopConfig(model=model, max_new=12, sampling=cfg, drafter=drafter, eos_ids=())
    st = D.prefill(loop, params, dparams, buf, pad, jax.random.PRNGKey(0))
    st = D.step(loop, (params, params), dparams, pad, st)
    ctx = DraftContext(buffer=st.buffer, length=st.length, pad=pad, active=~st.done)
    d, _ = drafter.propose(dparams, st.drafter_state, ctx, jax.random.PRNGKey(1), True)
    return np.asarray(d.q), np.asarray(st.buffer), np.asarray(st.length), np.asarray(pad)


def test_dflash_decode_blocks_match_the_training_objective():
    """The decode loop's next-block distributions equal the training objective's for the
    same anchor (:func:`jaxspec.training.dflash.blocks_at` on the unpadded sequence, one
    uncached target pass): block positions, context (features before the anchor) and
    anchor agree between training and decoding. Both still-exact frame variants, which the
    exactness tests cannot see, break this parity."""
    from jaxspec.training.dflash import blocks_at, target_features

    model, params = tiny_model(64, seed=3)
    spec = DFlashSpec.for_target(model.config, block_size=4, layer_ids=(1, 0))
    own = jax.tree_util.tree_map(lambda x: 8.0 * x if x.ndim >= 2 else x, init_drafter(spec, 2))
    shared = {k: params[k] for k in ("embed", "lm_head")}
    prompts = [[4, 5, 6, 7, 8], [9, 10, 11]]

    def gap(q, buf, length, pad):
        worst = 0.0
        for b in range(len(prompts)):
            seq = jnp.asarray(buf[b, pad[b] : length[b]])[None]
            hid = target_features(model, params, seq, spec.layer_ids)
            anchor = jnp.asarray([[seq.shape[1] - 1]], jnp.int32)
            logits = blocks_at(spec, own, shared, seq, hid, anchor)[0, 0]
            want = np.asarray(jax.nn.softmax(logits, axis=-1))
            worst = max(worst, float(np.abs(q[b] - want).max()))
        return worst

    assert gap(*_decode_block_q(model, params, spec, own, prompts)) < 1e-5
    for m in DFLASH_EQUIVALENT:
        if m.phase != "frame":
            continue
        with inject_dflash(m):
            q, *rest = _decode_block_q(model, params, spec, own, prompts)
        assert gap(q, *rest) > 1e-3, m.name


# ---- verifier level --------------------------------------------------------------------------


def _rand(rng, shape, sharp=2.0):
    x = rng.normal(size=shape) * sharp
    e = np.exp(x - x.max(-1, keepdims=True))
    return jnp.asarray(e / e.sum(-1, keepdims=True), jnp.float32)


@pytest.mark.parametrize("with_q", [True, False])
def test_knob_free_variant_is_verify_sample(with_q):
    """Every mutant is the real rule with one knob turned: with none turned,
    :func:`verify_variant` reproduces :func:`verify_sample` bit for bit."""
    rng = np.random.default_rng(0)
    B, k = 512, 3
    p = _rand(rng, (B, k + 1, V))
    q = _rand(rng, (B, k, V), 1.0)
    draft = jax.random.categorical(jax.random.PRNGKey(1), jnp.log(q)).astype(jnp.int32)
    q = q if with_q else None
    kt = jnp.asarray(rng.integers(1, k + 1, B), jnp.int32)
    for kw in ({}, {"draft_len": kt}):
        key = jax.random.PRNGKey(2)
        a = verify_sample(key, p, draft, q, **kw)
        b = verify_variant(key, p, draft, q, **kw)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bonus_unit_setting_rejects_the_bonus_mutant():
    """The verifier-level bonus test's setting (tests/core/test_verify.py) tells the real
    bonus from the ``bonus-from-residual`` mutant."""
    Nb, k = 20000, 2
    p = np.zeros((1, k + 1, 5), np.float32)
    p[0, 0, 1] = 1.0
    p[0, 1] = [0.1, 0.1, 0.1, 0.6, 0.1]
    p[0, 2] = [0.1, 0.2, 0.3, 0.25, 0.15]
    q = np.zeros((1, k, 5), np.float32)
    q[0, 0] = [0.0, 0.7, 0.3, 0.0, 0.0]
    q[0, 1] = [0.0, 0.0, 0.0, 0.5, 0.5]
    args = (
        jax.random.PRNGKey(0),
        jnp.broadcast_to(jnp.asarray(p), (Nb, k + 1, 5)),
        jnp.broadcast_to(jnp.asarray([[1, 3]], jnp.int32), (Nb, k)),
        jnp.broadcast_to(jnp.asarray(q), (Nb, k, 5)),
    )
    exact = dict(enumerate(p[0, 2]))
    assert check_distribution(np.asarray(verify_variant(*args)[1]), exact).passed
    bad = check_distribution(np.asarray(verify_variant(*args, bonus_from_residual=True)[1]), exact)
    assert not bad.passed, bad.why


def test_seam_restores_the_real_code_and_clears_compiled_programs():
    """``inject_causal`` swaps the loop's acceptance phase only inside the block, and drops
    cached executables on entry and exit (a cached real program would hide the mutant)."""
    import jaxspec.causal.decode as decode
    from jaxspec.core import runtime

    real = decode.accept
    runtime._EXECUTABLES["sentinel"] = None
    with pytest.raises(RuntimeError):
        with inject_causal(MUTANTS[0]):
            assert decode.accept is not real
            assert "sentinel" not in runtime._EXECUTABLES
            runtime._EXECUTABLES["inside"] = None
            raise RuntimeError
    assert decode.accept is real
    assert "inside" not in runtime._EXECUTABLES
    with pytest.raises(ValueError, match="rows_per"):
        inject_causal(MUTANTS, rows_per=None).__enter__()
    assert decode.accept is real
