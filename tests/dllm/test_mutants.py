"""Mutation-checked losslessness tests of SSD and Spiffy (issue 17).

Both replay their reference's sample path: for a seed they return the tokens *and* transfer
order of one-token-per-step stepwise decoding, random numbers included. The tests check that
on ``10^4`` rows of a vocabulary-6 LLaDA with weights scaled by ``SCALE`` = 10 (3 masked
positions, T = 0.9; Spiffy at scale 6: the stepwise distribution is enumerated exactly,
:func:`tests.dllm.test_ssd.exact_stepwise_distribution`):

* the real SSD (chain and mix-order trees) and Spiffy reproduce the reference path row for row
  and pass the distribution test (:func:`jaxspec.testing.distribution.check_distribution`);
* every mutant of :data:`jaxspec.testing.mutants.DLLM_MUTANTS` (nodes scored with the root's
  logits; batch rows sharing random numbers), injected with
  :func:`~jaxspec.testing.mutants.inject_dllm`, is rejected twice: its path differs from the
  reference's, and the distribution test alone rejects it too. At scale 6 (the model of the
  other SSD tests) the conditionals barely depend on which block positions are filled, and
  SSD's root-logits mutant passed the distribution test (TV 0.034 against a floor of 0.042);
  at scale 10 it is rejected (results/mutants.md).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from jaxspec.dllm import (
    DiffusionDecodeConfig,
    DraftGraph,
    SpiffyConfig,
    SSDConfig,
    diffusion_generate,
    spiffy_generate,
    ssd_generate,
)
from jaxspec.testing.distribution import check_distribution
from jaxspec.testing.mutants import DLLM_MUTANTS, inject_dllm
from tests.dllm.test_ssd import _vocab6_model, exact_stepwise_distribution

PROMPT, G, T, N, SEED = [1, 2, 3, 4], 3, 0.9, 10_000, 11
DECODE = DiffusionDecodeConfig(G, G, G, temperature=T)
# the weight scale of each method's model: the one on which both of its mutants leave the
# reference path *and* fail the distribution test (Spiffy's root-logits mutant replays the
# reference path at scale 10; SSD's passes the distribution test at scale 6)
SCALE = {"ssd-chain": 10.0, "ssd-mix-order": 10.0, "spiffy": 6.0}
METHODS = tuple(SCALE)
# D = 6 draft blocks of up to 3 positions (the whole 3-position block in one walk)
GRAPH = DraftGraph(
    (
        ((1, 1),),
        ((1, 2),),
        ((1, 1), (2, 1)),
        ((1, 1), (2, 2)),
        ((1, 2), (2, 1)),
        ((1, 1), (2, 1), (3, 1)),
    )
)


def _run(method):
    model, params = _vocab6_model(SCALE[method])
    if method == "spiffy":
        return spiffy_generate(model, params, [PROMPT] * N, SpiffyConfig(DECODE, GRAPH), seed=SEED)
    tree = method.split("-", 1)[1]
    return ssd_generate(model, params, [PROMPT] * N, SSDConfig(DECODE, 2, tree), seed=SEED)


@functools.lru_cache(maxsize=None)
def _reference(scale: float):
    model, params = _vocab6_model(scale)
    return (
        diffusion_generate(model, params, [PROMPT] * N, DECODE, seed=SEED),
        exact_stepwise_distribution(PROMPT, G, T, scale),
    )


def _same_path(res, ref) -> bool:
    return np.array_equal(res.full_tokens, ref.full_tokens) and np.array_equal(
        res.transfer_step, ref.transfer_step
    )


@pytest.mark.parametrize("method", METHODS)
def test_real_decoder_replays_the_reference_and_passes(method):
    ref, dist = _reference(SCALE[method])
    assert check_distribution(ref.full_tokens, dist).passed  # the reference itself
    res = _run(method)
    assert _same_path(res, ref)
    chk = check_distribution(res.full_tokens, dist)
    assert chk.passed, chk.why
    assert res.stats.accept_hist[:, 2:].sum() > 0  # drafts were accepted: verification ran


@pytest.mark.parametrize("mutant", DLLM_MUTANTS)
@pytest.mark.parametrize("method", METHODS)
def test_every_mutant_rejected(method, mutant):
    ref, dist = _reference(SCALE[method])
    with inject_dllm(method.split("-")[0], mutant):
        res = _run(method)
    chk = check_distribution(res.full_tokens, dist)
    print(f"{method}/{mutant}: same path {_same_path(res, ref)}; distribution {chk.why}")
    assert not _same_path(res, ref), f"{method}/{mutant} replays the reference path"
    assert not chk.passed, f"{method}/{mutant} passes the distribution test: {chk.why}"


# Beyond the enumerable model: the Dream head (shifted logits) with the Fast-dLLM dual cache,
# sampled, two blocks, a padded batch of different prompts; SSD's mix-order tree and Spiffy
# over threshold decoding. The reference path is the check here (the joint of 16 positions is
# not enumerable): the real decoders replay it, every mutant leaves it.
WIDE = {
    "ssd": DiffusionDecodeConfig(16, 8, 16, cache="dual", temperature=0.8),
    "spiffy": DiffusionDecodeConfig(16, 8, 16, cache="dual", temperature=0.8, threshold=0.3),
}


def _run_wide(method, decode):
    from tests.dllm.test_dllm import MODELS, PROMPTS

    model, params = MODELS["dream"]
    prompts = PROMPTS * 4
    if method == "reference":
        return diffusion_generate(model, params, prompts, decode, seed=5)
    if method == "spiffy":
        return spiffy_generate(model, params, prompts, SpiffyConfig(decode, GRAPH), seed=5)
    return ssd_generate(model, params, prompts, SSDConfig(decode, 3, "mix-order"), seed=5)


@functools.lru_cache(maxsize=None)
def _wide_reference(method):
    return _run_wide("reference", WIDE[method])


@pytest.mark.parametrize("mutant", (None,) + DLLM_MUTANTS)
@pytest.mark.parametrize("method", tuple(WIDE))
def test_dream_dual_cache_paths(method, mutant):
    ref = _wide_reference(method)
    if mutant is None:
        res = _run_wide(method, WIDE[method])
        assert _same_path(res, ref)
        assert res.stats.accept_hist[:, 2:].sum() > 0  # drafts were accepted
        return
    with inject_dllm(method, mutant):
        res = _run_wide(method, WIDE[method])
    assert not _same_path(res, ref), f"{method}/{mutant} replays the reference path"
