"""Spiffy (:mod:`jaxspec.dllm.spiffy`) is lossless against the reference diffusion decoders.

Greedy and sampled, LLaDA and Dream heads, no cache and dual cache, stepwise / fixed-k /
threshold unmasking: the same tokens transferred at the same steps as
:func:`jaxspec.dllm.decode.diffusion_generate` with the same settings and seed. Sampling is also
checked as a distribution against the exactly enumerated stepwise distribution (vocab 6).
Graph files, Eqs. 6-8 and the calibration (Algorithm 2, Eqs. 24-28) are checked on hand-made
inputs with known answers.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest

from jaxspec.dllm import DiffusionDecodeConfig, diffusion_generate
from jaxspec.dllm.spiffy import (
    DraftGraph,
    GraphError,
    SpiffyConfig,
    calibration_counts,
    load_graph,
    plot_graph,
    record_calibration,
    save_graph,
    select_graph,
    spiffy_generate,
)
from jaxspec.testing.distribution import check_distribution
from tests.dllm.test_dllm import MODELS, PROMPTS
from tests.dllm.test_ssd import _repetitive_model, _vocab6_model, exact_stepwise_distribution

GRAPH = DraftGraph(
    (
        ((1, 1),),
        ((1, 2),),
        ((1, 1), (2, 1)),
        ((1, 1), (2, 2)),
        ((1, 2), (2, 1)),
        ((1, 1), (2, 1), (3, 1)),
        ((1, 1), (2, 1), (3, 1), (4, 1)),
    )
)


def _check_stats(r, ref, c: SpiffyConfig):
    st = r.stats
    assert st.method == "spiffy" and st.reference == c.decode.method
    np.testing.assert_array_equal(st.steps, ref.stats.steps)  # every reference step replayed
    # each forward takes 1 + accepted steps
    assert ((st.accept_hist * np.arange(c.graph.size + 2)).sum(1) == st.steps).all()
    assert (st.accept_hist.sum(1) == st.target_nfe).all() and (st.accept_hist[:, 0] == 0).all()
    assert st.extra["nfe_speedup"] == pytest.approx(st.steps.sum() / st.target_nfe.sum())


CASES = [
    (h, cache, kw)
    for h in ("llada", "dream")
    for cache in ("none", "dual")
    for kw in ({}, {"temperature": 0.8}, {"tokens_per_step": 2}, {"threshold": 0.3})
]


@pytest.mark.parametrize(
    "head,cache,kw",
    CASES,
    ids=[f"{h}-{c}-{'-'.join(f'{k}{v}' for k, v in kw.items()) or 'greedy'}" for h, c, kw in CASES],
)
def test_identical_to_reference(head, cache, kw):
    model, params = MODELS[head]
    d = DiffusionDecodeConfig(16, 8, 16, cache=cache, **kw)
    ref = diffusion_generate(model, params, PROMPTS, d, seed=3)
    c = SpiffyConfig(d, GRAPH)
    r = spiffy_generate(model, params, PROMPTS, c, seed=3)
    np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
    np.testing.assert_array_equal(r.transfer_step, ref.transfer_step)
    _check_stats(r, ref, c)


@pytest.mark.parametrize(
    "kw",
    [
        dict(remasking="topk_margin", steps=8),
        dict(remasking="entropy", schedule="dream"),
        dict(remasking="random", temperature=0.5),
        dict(remasking="origin", temperature=0.5),
        dict(temperature=0.7, top_k=5, top_p=0.9),
        dict(remasking="maskgit_plus", temperature=0.5, alg_temp=0.3),
    ],
)
def test_identical_to_reference_other_rules(kw):
    model, params = MODELS["dream"]
    d = DiffusionDecodeConfig(**dict(dict(gen_length=8, block_length=8, steps=8), **kw))
    ref = diffusion_generate(model, params, PROMPTS, d, seed=2)
    r = spiffy_generate(model, params, PROMPTS, SpiffyConfig(d, GRAPH), seed=2)
    np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
    np.testing.assert_array_equal(r.transfer_step, ref.transfer_step)


def test_empty_graph_is_the_reference():
    model, params = MODELS["llada"]
    d = DiffusionDecodeConfig(16, 8, 16, cache="dual")
    ref = diffusion_generate(model, params, PROMPTS, d)
    r = spiffy_generate(model, params, PROMPTS, SpiffyConfig(d, DraftGraph(())))
    np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
    np.testing.assert_array_equal(r.stats.target_nfe, ref.stats.target_nfe)


def test_accepts_a_whole_chain_when_drafts_are_right():
    """Predictions that never change with context make every chain draft right: after the
    block's first step (no drafting distribution yet) each forward takes 1 + 3 steps."""
    model, params = _repetitive_model()
    chain = DraftGraph((((1, 1),), ((1, 1), (2, 1)), ((1, 1), (2, 1), (3, 1))))
    for cache in ("none", "dual"):
        d = DiffusionDecodeConfig(16, 8, 16, cache=cache)
        ref = diffusion_generate(model, params, [[1, 2, 3]], d)
        r = spiffy_generate(model, params, [[1, 2, 3]], SpiffyConfig(d, chain))
        np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
        # per block of 8: 1 (root only) + 4 + 3 (the block ends) = 3 forwards
        assert int(r.stats.target_nfe[0]) == 6, r.stats.accept_hist
        assert r.stats.accept_hist[0, 4] == 2 and r.stats.extra["nfe_speedup"] == pytest.approx(
            16 / 6
        )
    # fixed-k = 2 with the same graph: only even-sized formulas can equal a state (Eq. 7)
    even = DraftGraph(
        (((1, 1),), ((1, 1), (2, 1)), ((1, 1), (2, 1), (3, 1)), ((1, 1), (2, 1), (3, 1), (4, 1)))
    )
    d = DiffusionDecodeConfig(16, 8, tokens_per_step=2)
    ref = diffusion_generate(model, params, [[1, 2, 3]], d)
    r = spiffy_generate(model, params, [[1, 2, 3]], SpiffyConfig(d, even))
    np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
    # per block: 1 forward (2 tokens), then 2 + 2 + 2 tokens in one forward
    assert int(r.stats.target_nfe[0]) == 4 and int(ref.stats.target_nfe[0]) == 8


@pytest.mark.parametrize("kw", [{}, {"threshold": 0.6}])
def test_sampling_distribution_equals_stepwise(kw):
    """Sampled Spiffy outputs follow the exactly enumerated stepwise distribution (3000 rows,
    own random numbers each) and equal the reference's for the same seed."""
    model, params = _vocab6_model()
    prompt, G, T, R = [1, 2, 3, 4], 3, 0.9, 3000
    d = DiffusionDecodeConfig(G, G, G, temperature=T, **kw)
    g = DraftGraph((((1, 1),), ((1, 2),), ((2, 1),), ((1, 1), (2, 1))))
    r = spiffy_generate(model, params, [prompt] * R, SpiffyConfig(d, g), seed=11)
    assert r.stats.accept_hist[:, 2:].sum() > 100  # drafts were accepted
    ref = diffusion_generate(model, params, [prompt] * R, d, seed=11)
    np.testing.assert_array_equal(r.full_tokens, ref.full_tokens)
    if not kw:
        dist = exact_stepwise_distribution(prompt, G, T)
        chk = check_distribution(r.full_tokens, dist)
        assert chk.passed, chk.why


def test_mesh_must_divide_the_batch():
    """(Identity on 4 fake devices runs with SSD's in one subprocess:
    tests/test_ssd.py::test_multi_device_verification_matches_one_device.)"""
    model, params = MODELS["llada"]

    class Fake:
        size = 4

    c = SpiffyConfig(DiffusionDecodeConfig(8, 4, 8), DraftGraph((((1, 1),),)))  # 2 x 2 rows
    with pytest.raises(ValueError, match="does not divide"):
        spiffy_generate(model, params, PROMPTS + PROMPTS[:1], c, mesh=Fake())


# ----------------------------------------------------------------------------- graphs


@pytest.mark.parametrize(
    "forms,msg",
    [
        ([[]], "empty"),
        ([[[1, 1], [1, 2]]], "twice"),
        ([[[0, 1]]], "positive"),
        ([[[1, "a"]]], "positive"),
        ([[[1, 1]], [[1, 1]]], "repeats"),
        ([[[1, 1]], [[2, 1], [3, 1]]], "no parent"),
        ([[[1, 1]], [[1, 1], [2, 1], [3, 1]]], "no parent"),
    ],
)
def test_graph_violations(forms, msg, tmp_path):
    p = tmp_path / "g.json"
    p.write_text(json.dumps({"formulas": forms}))
    with pytest.raises(GraphError, match=msg):
        load_graph(p)


def test_graph_files(tmp_path):
    with pytest.raises(GraphError, match="does not exist"):
        load_graph(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GraphError, match="not valid JSON"):
        load_graph(tmp_path / "bad.json")
    (tmp_path / "none.json").write_text('{"formulas": []}')
    with pytest.raises(GraphError, match="no draft formula"):
        load_graph(tmp_path / "none.json")
    save_graph(GRAPH, tmp_path / "g.json")
    g = load_graph(tmp_path / "g.json")
    assert g == GRAPH and g.size == 7
    assert sorted(g.parents(5)) == [2]  # {c11,c21,c31} <- {c11,c21}
    assert sorted(g.parents(2)) == [0]
    with pytest.raises(GraphError, match="block length"):
        SpiffyConfig(DiffusionDecodeConfig(8, 2, 8), GRAPH)
    plot_graph(GRAPH, tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "kw,msg", [(dict(cache="prefix"), "cache"), (dict(cfg_scale=1.0), "guidance")]
)
def test_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SpiffyConfig(DiffusionDecodeConfig(8, 4, 8, **kw), GRAPH)


# ----------------------------------------------------------------------------- calibration


def _brute_force(counts, D, strategy, per_level=3):
    """Every size-D subset of the top-3-per-level candidates that satisfies Eqs. 6-8."""
    cands, count = [], {}
    for c in counts:
        top = sorted(c.items(), key=lambda kv: (-kv[1], sorted(kv[0])))[:per_level]
        cands += [w for w, _ in top]
        count.update(top)
    best = -1
    for Q in itertools.combinations(cands, D):
        Qs = set(Q)
        par = {q: [p for p in Qs if len(p) + 1 == len(q) and p < q] for q in Q}
        if any(len(q) > 1 and not par[q] for q in Q):
            continue
        if strategy == "degree-0":
            s = sum(count[q] for q in Q)
        elif strategy == "degree-1":
            s = sum(count[q] + sum(count[p] for p in par[q]) for q in Q)
        else:
            tot = {}
            for q in sorted(Q, key=len):
                tot[q] = count[q] + sum(tot[p] for p in par[q])
            s = sum(tot.values())
        best = max(best, s)
    return best


@pytest.mark.parametrize("strategy", ["degree-1", "degree-0", "total"])
def test_select_graph_is_optimal(strategy):
    rng = np.random.default_rng(0)
    f = lambda *p: frozenset(p)
    a, b, c, d_ = (1, 1), (2, 1), (1, 2), (3, 1)
    lv1 = Counter({f(a): 90, f(c): 30, f(b): 20})
    lv2 = Counter({f(a, b): 40, f(a, d_): 35, f(c, b): 33, f((2, 2), d_): 50})
    lv3 = Counter({f(a, b, d_): 25, f(c, b, d_): 24, f(a, (2, 2), d_): 23})
    lv4 = Counter({f(a, b, d_, (4, 1)): int(rng.integers(5, 15))})
    counts = [lv1, lv2, lv3, lv4]
    for D in (2, 3, 5, 8):
        g = select_graph(counts, D, strategy)
        assert g.size == D
        assert dict(g.meta)["score"] == _brute_force(counts, D, strategy)
    assert select_graph(counts, 1, strategy).formulas == (((1, 1),),)


def test_select_graph_errors():
    counts = [Counter({frozenset({(1, 1)}): 3})]
    with pytest.raises(ValueError, match="only 1 candidate"):
        select_graph(counts, 2)
    with pytest.raises(ValueError, match="strategy"):
        select_graph(counts, 1, "best")


def test_calibration_records_the_reference_run():
    """The recorded run is the reference; level-1 counts cover every step that had a drafting
    distribution; with a context-free model every look-ahead is the chain c11, c21, ..."""
    model, params = MODELS["llada"]
    d = DiffusionDecodeConfig(16, 8, 16, cache="dual")
    rec = record_calibration(model, params, PROMPTS, d, max_vocab_rank=4)
    ref = diffusion_generate(model, params, PROMPTS, d)
    np.testing.assert_array_equal(rec.tokens, ref.full_tokens)
    np.testing.assert_array_equal(rec.transfer_step, ref.transfer_step)
    assert rec.ok.sum() == len(PROMPTS) * (16 - 2)  # all but each block's first step
    counts = calibration_counts([rec], 3)
    assert sum(counts[0].values()) <= rec.ok.sum() and all(len(w) == 1 for w in counts[0])
    assert all(len(w) == 2 for w in counts[1])
    model, params = _repetitive_model()
    rec = record_calibration(model, params, [[1, 2, 3]], d)
    counts = calibration_counts([rec], 4)
    chain = [frozenset((i, 1) for i in range(1, k + 1)) for k in range(1, 5)]
    # steps with a drafting distribution: 7 per block; look-ahead k fits in 8 - k of them
    assert [dict(c) for c in counts] == [{chain[k]: 2 * (7 - k)} for k in range(4)]
    with pytest.raises(ValueError, match="no samples"):
        record_calibration(model, params, [], d)


def test_calibrate_cli_errors(tmp_path, capsys):
    """scripts.calibrate: an empty calibration set or missing records give one error line."""
    from scripts.calibrate import main

    assert main(["--prompts", "0", "--out-dir", str(tmp_path)]) == 2
    assert "--prompts must lie in [1, 164]" in capsys.readouterr().err
    assert main(["--reuse", "--out-dir", str(tmp_path)]) == 2
    assert "records.npz does not exist" in capsys.readouterr().err
