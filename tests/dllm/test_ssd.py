"""SSD (:mod:`jaxspec.dllm.ssd`) is lossless against one-token-per-step stepwise decoding.

Greedy and sampled, LLaDA and Dream heads, no cache and dual cache, chain and mix-order
trees: the same tokens transferred in the same order as
:func:`jaxspec.dllm.decode.diffusion_generate` with the same settings and seed. Sampling is also
checked as a distribution: on a vocabulary of 6 the exact output distribution of stepwise decoding
is enumerated and SSD's samples are tested against it (chi-square), with a negative control.
"""

from __future__ import annotations

import functools
import itertools

import jax
import numpy as np
import pytest

from jaxspec.dllm import DiffusionDecodeConfig, SSDConfig, diffusion_generate, ssd_generate
from jaxspec.dllm.ssd import tree_inclusion
from jaxspec.testing.cover import pairwise_cover
from models.config import ModelConfig
from models.diffusion.modeling import DiffusionConfig, DiffusionLM
from models.llama.modeling import init_params
from tests.dllm.test_dllm import MODELS, PROMPTS


def _check_stats(r, c: SSDConfig, B: int):
    st = r.stats
    G = c.decode.gen_length
    assert st.method == "ssd" and st.reference == "stepwise" and st.draft_length == c.draft_length
    assert (st.steps == G).all()
    assert ((st.accept_hist * np.arange(c.draft_length + 2)).sum(1) == G).all()
    assert (st.accept_hist.sum(1) == st.target_nfe).all() and (st.accept_hist[:, 0] == 0).all()
    assert (st.target_nfe <= G).all()
    assert st.extra["step_reduction"] == pytest.approx(1 - st.target_nfe.sum() / (B * G))


CASES = [
    (h, cache, tree, n, kw)
    for h in ("llada", "dream")
    for cache in ("none", "dual")
    for tree, n in (("chain", 1), ("chain", 3), ("mix-order", 3))
    for kw in ({}, {"temperature": 0.8})
]


_IDS = [f"{h}-{c}-{t}{n}-{'T' if kw else 'greedy'}" for h, c, t, n, kw in CASES]
# `make test` runs a pairwise-covering subset of the 24 (every pair of option values once);
# `make test-all` runs them all (jaxspec.testing.cover)
_COVERED = set(
    pairwise_cover(
        {
            i: dict(head=h, cache=c, tree=f"{t}{n}", mode=bool(kw))
            for i, (h, c, t, n, kw) in zip(_IDS, CASES)
        }
    )
)


@pytest.mark.parametrize(
    "head,cache,tree,n,kw",
    [
        pytest.param(*case, id=i, marks=() if i in _COVERED else pytest.mark.slow)
        for i, case in zip(_IDS, CASES)
    ],
)
def test_identical_to_stepwise(head, cache, tree, n, kw):
    model, params = MODELS[head]
    d = DiffusionDecodeConfig(16, 4, 16, cache=cache, **kw)
    ref = diffusion_generate(model, params, PROMPTS, d, seed=5)
    c = SSDConfig(d, n, tree)
    r = ssd_generate(model, params, PROMPTS, c, seed=5)
    np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
    np.testing.assert_array_equal(r.transfer_step, ref.transfer_step)
    _check_stats(r, c, len(PROMPTS))


@pytest.mark.parametrize(
    "kw",
    [
        dict(remasking="topk_margin"),
        dict(remasking="entropy"),
        dict(remasking="random", temperature=0.5),
        dict(temperature=0.7, top_k=5, top_p=0.9),
        dict(remasking="maskgit_plus", temperature=0.5, alg_temp=0.3),
    ],
)
def test_identical_to_stepwise_other_rules(kw):
    model, params = MODELS["dream"]
    d = DiffusionDecodeConfig(8, 8, 8, **kw)
    ref = diffusion_generate(model, params, PROMPTS, d, seed=2)
    r = ssd_generate(model, params, PROMPTS, SSDConfig(d, 4, "mix-order"), seed=2)
    np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
    np.testing.assert_array_equal(r.transfer_step, ref.transfer_step)


# ----------------------------------------------------------------------------- an easy model


def _repetitive_model():
    """A random LLaDA model whose embedding makes every position predict the token to its
    left: drafts are right, so SSD must accept several tokens per forward."""
    V = 12
    base = ModelConfig(
        arch="llama",
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        qkv_bias=False,
        tie_embeddings=False,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )
    params = jax.tree_util.tree_map(lambda x: x * 0.0, init_params(base, 0))
    params = dict(params)
    # logits = constant bias towards token 3 through the final norm / head
    head = np.zeros((32, V), np.float32)
    head[:, 3] = 1.0
    head[:, 4] = 0.5
    params["lm_head"] = head
    params["final_norm"] = np.ones((32,), np.float32)
    emb = np.random.default_rng(0).normal(size=(V, 32)).astype(np.float32)
    params["embed"] = np.abs(emb)
    return DiffusionLM(DiffusionConfig(base, "llada", V - 1)), params


def test_accepts_many_tokens_when_drafts_are_right():
    """Drafts from a model whose predictions do not change with context are always right:
    every full iteration accepts N + 1 tokens, so NFE drops to about gen_length / (N + 1)."""
    model, params = _repetitive_model()
    d = DiffusionDecodeConfig(16, 8, 16)
    ref = diffusion_generate(model, params, [[1, 2, 3]], d)
    for tree, nodes in (("chain", 4), ("mix-order", 6)):
        r = ssd_generate(model, params, [[1, 2, 3]], SSDConfig(d, 3, tree))
        np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
        assert r.stats.extra["nodes"] == nodes
        # first iteration has no drafts (1 token); then 4 per iteration: 1 + 4 + 4 + 4 + 3
        assert int(r.stats.target_nfe[0]) == 5, r.stats.accept_hist
        assert r.stats.accept_hist[0, 4] == 3


def test_tree_shapes():
    np.testing.assert_array_equal(
        tree_inclusion(3, "chain"), [[0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    )
    mix = tree_inclusion(3, "mix-order")
    assert mix.shape == (6, 3)
    np.testing.assert_array_equal(mix[4:], [[0, 1, 0], [1, 0, 1]])  # m_1, m_2


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(draft_length=0), "draft_length"),
        (dict(draft_length=5), "draft_length"),
        (dict(tree="bushy"), "tree"),
        (dict(decode=DiffusionDecodeConfig(8, 4, 4)), "one token per step"),
        (dict(decode=DiffusionDecodeConfig(8, 4, tokens_per_step=2)), "one token per step"),
        (dict(decode=DiffusionDecodeConfig(8, 4, 8, cache="prefix")), "cache"),
        (dict(decode=DiffusionDecodeConfig(8, 4, 8, remasking="origin")), "origin"),
        (dict(decode=DiffusionDecodeConfig(8, 4, 8, cfg_scale=1.0)), "guidance"),
    ],
)
def test_config_errors(kw, msg):
    args = dict(decode=DiffusionDecodeConfig(8, 4, 8), draft_length=2)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        SSDConfig(**args)


# ----------------------------------------------------------------------------- distribution

V6, MASK6 = 6, 5


@functools.lru_cache(maxsize=None)
def _vocab6_model(scale: float = 6.0):
    """A one-layer vocabulary-6 LLaDA (mask id 5) with every matrix scaled by ``scale``: at 6 its
    conditionals barely depend on which block positions are filled; at 10 they do (the
    mutation tests use that one, :mod:`tests.dllm.test_mutants`)."""
    base = ModelConfig(
        arch="llama",
        vocab_size=V6,
        hidden_size=16,
        intermediate_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        qkv_bias=False,
        tie_embeddings=False,
        max_position_embeddings=40,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )
    params = jax.tree_util.tree_map(lambda x: x * scale if x.ndim >= 2 else x, init_params(base, 4))
    return DiffusionLM(DiffusionConfig(base, "llada", MASK6)), params


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def exact_stepwise_distribution(prompt, G: int, T: float, scale: float = 6.0) -> dict:
    """Exact output distribution of one-block, one-token-per-step, low-confidence stepwise
    decoding with temperature ``T``: at each state, enumerate every joint draw of the masked
    positions' tokens (independent ``softmax(logits / T)`` samples), transfer the most
    confident (``softmax(logits)[x0]`` over the whole vocabulary, [MASK] included, the default
    ``confidence_softmax="official"``; ties to the lower position) and recurse, for
    ``_vocab6_model(scale)``. Returns ``{block tokens (tuple): probability}``."""
    model, params = _vocab6_model(scale)
    fwd = jax.jit(lambda t: model.apply(params, t, np.arange(t.shape[1])[None])[0])
    n = len(prompt)
    out: dict = {}

    def rec(x, prob):
        masked = [i for i in range(G) if x[n + i] == MASK6]
        if not masked:
            out[tuple(x[n:])] = out.get(tuple(x[n:]), 0.0) + prob
            return
        lg = np.asarray(fwd(np.array([x], np.int32)))[0].astype(np.float64)[n:]
        c = _softmax(lg)  # official confidence: the [MASK] logit stays in the softmax
        lg[:, MASK6] = -np.inf  # ... but [MASK] is never drawn
        q = _softmax(lg / T)
        moves: dict = {}
        for draw in itertools.product(range(V6 - 1), repeat=len(masked)):
            pr = np.prod([q[i, v] for i, v in zip(masked, draw)])
            conf = [c[i, v] for i, v in zip(masked, draw)]
            j = int(np.argmax(conf))
            moves[(masked[j], draw[j])] = moves.get((masked[j], draw[j]), 0.0) + pr
        for (i, v), pr in moves.items():
            y = list(x)
            y[n + i] = v
            rec(y, prob * pr)

    rec(list(prompt) + [MASK6] * G, 1.0)
    return out


# The sampled-distribution tests of SSD (and Spiffy, and their mutants) are in
# tests/dllm/test_mutants.py: 10^4 rows against exact_stepwise_distribution, path identity.


def test_acceptance_limit():
    """Sec. 5.1's ideal verifier on hand-made records, and on a recorded tiny-model run."""
    G = 6
    pos = np.arange(G)
    tok = np.array([1, 2, 3, 4, 5, 6])
    topk = np.zeros((G, G, 2), np.int32)
    for s in range(G):
        topk[s, :, 0] = tok  # every draft right at top-1
    from jaxspec.dllm import acceptance_limit, stepwise_topk

    assert acceptance_limit(pos, tok, topk, 2, 1) == pytest.approx(1 - 2 / 6)  # N/(N+1)
    topk[0, 2, 0] = 9  # step 2's token only at rank 2 of step 0's draft
    topk[0, 2, 1] = 3
    assert acceptance_limit(pos, tok, topk, 2, 1) == pytest.approx(1 - 3 / 6)
    assert acceptance_limit(pos, tok, topk, 2, 2) == pytest.approx(1 - 2 / 6)
    model, params = MODELS["llada"]
    d = DiffusionDecodeConfig(8, 4, 8)
    p, t, tk = stepwise_topk(model, params, PROMPTS[0], d, top_k=3, batch=3)
    ref = diffusion_generate(model, params, [PROMPTS[0]], d)
    assert sorted(p.tolist()) == list(range(8))
    np.testing.assert_array_equal(ref.full_tokens[0][p], t)
    assert (tk[np.arange(8), p, 0] == t).all()  # each step's token is its state's top-1
    lims = [acceptance_limit(p, t, tk, 3, k) for k in (1, 2, 3)]
    assert lims == sorted(lims) and 0 <= lims[0] and lims[-1] <= 3 / 4


_MESH_SCRIPT = r"""
import numpy as np, jax
from jaxspec.dllm import DiffusionDecodeConfig, SSDConfig, ssd_generate, draft_mesh, shard_params
from tests.dllm.test_dllm import MODELS, PROMPTS
assert len(jax.devices()) == 4, jax.devices()
for head, cache, tree in (("llada", "none", "chain"), ("dream", "dual", "mix-order")):
    model, params = MODELS[head]
    c = SSDConfig(DiffusionDecodeConfig(16, 4, 16, cache=cache), 3 if tree == "chain" else 2, tree)
    one = ssd_generate(model, params, PROMPTS, c)
    mesh = draft_mesh(4)
    many = ssd_generate(model, params, PROMPTS, c, mesh=mesh)
    both = ssd_generate(model, shard_params(params, mesh), PROMPTS, c, mesh=mesh)
    for r in (many, both):
        np.testing.assert_array_equal(r.full_tokens, one.full_tokens)
        np.testing.assert_array_equal(r.transfer_step, one.transfer_step)
        np.testing.assert_array_equal(r.stats.target_nfe, one.stats.target_nfe)
    leaf = shard_params(params, mesh)["lm_head"]
    assert len(leaf.sharding.device_set) == 4
# Spiffy shares the sharded node forwards: 2 prompts x 4 nodes = 8 rows over 4 devices
from jaxspec.dllm import DraftGraph, SpiffyConfig, spiffy_generate
g = DraftGraph((((1, 1),), ((1, 2),), ((1, 1), (2, 1))))
for head, cache in (("llada", "dual"), ("dream", "none")):
    model, params = MODELS[head]
    c = SpiffyConfig(DiffusionDecodeConfig(16, 8, 16, cache=cache), g)
    one = spiffy_generate(model, params, PROMPTS, c)
    many = spiffy_generate(model, shard_params(params, mesh), PROMPTS, c, mesh=mesh)
    np.testing.assert_array_equal(many.full_tokens, one.full_tokens)
    np.testing.assert_array_equal(many.transfer_step, one.transfer_step)
    np.testing.assert_array_equal(many.stats.target_nfe, one.stats.target_nfe)
print("MESH-OK")
"""


# `make test-all`; tests/models/test_sharding.py runs SSD on a mesh in `make test`
@pytest.mark.slow
def test_multi_device_verification_matches_one_device():
    """4 fake CPU devices (a fresh process: the device count is fixed at JAX start-up): the
    verification batch sharded over a draft mesh, and the weights split over it too, give the
    same tokens, transfer order and NFE as one device (SSD and Spiffy)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _MESH_SCRIPT],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0 and "MESH-OK" in out.stdout, out.stderr[-3000:]


def test_mesh_must_divide_the_batch():
    from jaxspec.dllm import draft_mesh

    model, params = MODELS["llada"]
    c = SSDConfig(DiffusionDecodeConfig(8, 4, 8), 2, "chain")  # 3 nodes x 2 prompts = 6
    mesh = draft_mesh(1)
    assert ssd_generate(model, params, PROMPTS, c, mesh=mesh).full_tokens.shape == (2, 8)

    class Fake:
        size = 4

    with pytest.raises(ValueError, match="does not divide"):
        ssd_generate(model, params, PROMPTS, c, mesh=Fake())
