"""Benchmark suite ``dflash`` (:mod:`jaxspec.bench.dflash`) on a tiny random target: the block
sweep rows beside AR / n-gram / SPS, per-position acceptance from the acceptance histogram,
the drafter cost figures, the report, and bad input. No timing figure is asserted."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from jaxspec.bench.dflash import accept_by_position, markdown_report, run_dflash_suite
from jaxspec.bench.records import BenchError, BenchPrompt
from jaxspec.causal.dflash import DFlashSpec, init_drafter
from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model


def test_accept_by_position_from_a_histogram():
    """Entry ``n + 1`` of the histogram counts steps that accepted ``n`` drafts: 10 steps
    accepted none, 6 one, 4 both (k = 2) -> draft 1 accepted in 10 of 20 steps, draft 2 in 4
    of the 10 that reached it; a position no step reached is None."""
    assert accept_by_position([0, 10, 6, 4]) == [0.5, 0.4]
    assert accept_by_position([0, 5, 0, 0]) == [0.0, None]


def _drafter(model, block, seed):
    spec = DFlashSpec.for_target(model.config, block_size=block, layer_ids=(0, 1))
    own = jax.tree_util.tree_map(lambda x: 8.0 * x if x.ndim >= 2 else x, init_drafter(spec, seed))
    return spec, own


def test_suite_rows_on_a_tiny_target(tmp_path):
    """Two prompt sets, drafters of blocks 3 and 5 (given out of order), an SPS draft model, a
    diffusion drafter (SpecDiff and DiffuSpec rows): every system's row per set, all identical
    to AR; the DFlash rows (block 5 also at draft length 2) with their block size and draft
    length ``k``, an acceptance histogram over the timed runs and ``k`` per-position figures;
    one cost row per drafter; the report and files are written. Every set's compiled
    programs are freed once it has run (:func:`jaxspec.bench.ar_suite.free_programs`), so the
    second set starts with none held."""
    from jaxspec.core import runtime

    model, params = tiny_model(64, seed=0)
    draft = tiny_model(64, seed=1, layers=1)
    tok = types.SimpleNamespace(eos_token_ids=[7], pad_token_id=0)
    rng = np.random.default_rng(0)
    sets = {
        name: [
            BenchPrompt(f"{name}/{i}", [int(t) for t in rng.integers(8, 64, size=6)])
            for i in range(2)
        ]
        for name in ("humaneval", "news")
    }
    seen = []
    res = run_dflash_suite(
        (model, params),
        [_drafter(model, 5, 1), _drafter(model, 3, 2)],
        tok,
        prompt_sets=sets,
        max_new_tokens=12,
        draft_model=draft,
        draft_length=3,
        dllm_drafter={
            "dllm_drafter": tiny_diffusion_model("dream", vocab=64, ctx=128),
            "eos_id": 7,
            "proxy": None,
        },
        verify_lengths=(2,),
        model_name="tiny",
        cost_reps=2,
        progress=False,
        log=lambda m: seen.append((m, len(runtime._EXECUTABLES))),
    )
    starts = [n for m, n in seen if "prompt set" in m]
    freed = [int(m.split()[2]) for m, _ in seen if "freed" in m]
    assert len(starts) == len(freed) == 2 and starts[1] == 0, seen
    assert all(n >= 8 for n in freed), freed  # one decode program per row at least
    assert res["config"]["blocks"] == [3, 5] and res["config"]["diffusion_drafter_rows"]
    assert res["config"]["verify_lengths"] == [2]
    for name, s in res["sets"].items():
        methods = [r["method"] for r in s["rows"]]
        want = ["ar", "ngram", "sps", "specdiff+prefix", "diffuspec+prefix", "dflash-b3"]
        assert methods == want + ["dflash-b5-k2", "dflash-b5"], methods
        for r in s["rows"]:
            assert r["prompt_set"] == name and r["identical_to_reference"] is True
            if r["method"].startswith("dflash"):
                k = r["draft_length"]
                assert k == (2 if r["method"].endswith("-k2") else r["block_size"] - 1)
                assert len(r["accept_by_position"]) == k
                assert len(r["accept_hist"]) == k + 1
                # the histogram counts the timed runs' steps, one per target pass after the
                # prompt pass
                ar = next(x for x in s["rows"] if x["method"] == "ar")
                steps = sum(r["accept_hist"])
                assert steps == round(r["new_tokens"] / r["mat"]) - len(sets[name])
                assert ar["mat"] == 1.0
    costs = res["drafter_cost"]
    assert [(c["block_size"], c["draft_length"]) for c in costs] == [(3, 2), (5, 2), (5, 4)]
    for c in costs:
        assert c["drafter_s"] > 0 and c["verify_s"] > 0 and c["one_token_s"] > 0
        assert c["step_over_ar"] == pytest.approx(
            (c["drafter_s"] + c["verify_s"]) / c["one_token_s"], rel=0.05
        )
    text = markdown_report(res)
    assert "dflash-b5" in text and "Drafter cost per forward" in text
    assert "a step costs" in text and "one-token pass" in text

    from jaxspec.bench.dflash import write_results

    out, md = write_results(res, tmp_path / "dflash.json")
    assert out.is_file() and md.is_file() and out.with_suffix(".png").is_file()


# The three row-naming tests below each run the suite again (30-40 s on 2 cores) and are make
# test-all's; the exactness of the draft vocabulary, the n-gram lookup first and several
# drafters is make test's, in tests/causal/test_dflash.py.
@pytest.mark.slow
def test_suite_draft_vocabulary_rows():
    """With a draft vocabulary every DFlash row runs again with the drafter's LM head on it
    (``-v<V_d>``), identical to AR, and the cost table has a row for each head."""
    model, params = tiny_model(64, seed=0)
    tok = types.SimpleNamespace(eos_token_ids=[7], pad_token_id=0)
    sets = {"humaneval": [BenchPrompt("h/0", [9, 10, 11, 12]), BenchPrompt("h/1", [20, 8])]}
    vocab = np.arange(0, 64, 2, dtype=np.int32)
    res = run_dflash_suite(
        (model, params),
        [_drafter(model, 3, 1)],
        tok,
        prompt_sets=sets,
        max_new_tokens=10,
        draft_vocab=vocab,
        model_name="tiny",
        cost_reps=1,
        progress=False,
    )
    rows = res["sets"]["humaneval"]["rows"]
    assert [r["method"] for r in rows] == ["ar", "ngram", "dflash-b3", "dflash-b3-v32"]
    assert all(r["identical_to_reference"] is True for r in rows)
    assert res["config"]["draft_vocab"] == 32
    assert [r.get("draft_vocab") for r in rows] == [None, None, 64, 32]
    assert [(c["draft_length"], c["draft_vocab"]) for c in res["drafter_cost"]] == [
        (2, 64),
        (2, 32),
    ]
    assert "LM head rows" in markdown_report(res)


@pytest.mark.slow
def test_suite_ngram_first_rows():
    """``ngram_first`` adds each DFlash row behind the n-gram lookup (``+ngram``): identical
    to AR, recorded as such, its drafter run on fewer steps than the plain row where the
    answer repeats its context, on each at most once per step."""
    model, params = tiny_model(64, seed=0)
    tok = types.SimpleNamespace(eos_token_ids=[], pad_token_id=0)
    sets = {"humaneval": [BenchPrompt("h/0", [3, 9, 4, 9, 4, 9, 4, 17, 2])]}
    res = run_dflash_suite(
        (model, params),
        [_drafter(model, 4, 1)],
        tok,
        prompt_sets=sets,
        max_new_tokens=24,
        ngram_first=True,
        model_name="tiny",
        cost_reps=1,
        progress=False,
    )
    rows = {r["method"]: r for r in res["sets"]["humaneval"]["rows"]}
    assert list(rows) == ["ar", "ngram", "dflash-b4", "dflash-b4+ngram"]
    assert all(r["identical_to_reference"] is True for r in rows.values())
    plain, both = rows["dflash-b4"], rows["dflash-b4+ngram"]
    assert (plain["ngram_first"], both["ngram_first"]) == (False, True)
    assert plain["drafter_forwards_per_step"] == 1.0
    assert 0 < both["drafter_forwards_per_step"] < 1.0
    assert res["config"]["ngram_first"] is True
    assert "+ngram" in markdown_report(res)


@pytest.mark.slow
def test_two_drafters_of_one_block_size_in_one_run():
    """Two named drafters of block 3 beside one of block 5: rows ``dflash-b3@<name>`` (the
    lone block-5 drafter keeps ``dflash-b5``), each with its name and the figures of a run of
    that drafter alone (its MAT and acceptance histogram, greedy decoding being
    deterministic), all identical to AR; one cost row per drafter, named."""
    model, params = tiny_model(64, seed=0)
    tok = types.SimpleNamespace(eos_token_ids=[7], pad_token_id=0)
    sets = {"humaneval": [BenchPrompt("h/0", [9, 10, 11, 12]), BenchPrompt("h/1", [20, 8])]}
    kw = dict(prompt_sets=sets, max_new_tokens=12, model_name="tiny", cost_reps=1, progress=False)
    a, b, c = _drafter(model, 3, 1), _drafter(model, 3, 4), _drafter(model, 5, 2)
    res = run_dflash_suite((model, params), [a, c, b], tok, drafter_names=["a", "c", "b"], **kw)
    rows = {r["method"]: r for r in res["sets"]["humaneval"]["rows"]}
    assert list(rows) == ["ar", "ngram", "dflash-b3@a", "dflash-b3@b", "dflash-b5"]
    assert all(r["identical_to_reference"] is True for r in rows.values())
    assert res["config"]["drafter_names"] == ["a", "b", "c"]
    for name, d in (("a", a), ("b", b)):
        alone = run_dflash_suite((model, params), [d], tok, **kw)["sets"]["humaneval"]["rows"]
        want = next(r for r in alone if r["method"] == "dflash-b3")
        got = rows[f"dflash-b3@{name}"]
        assert got["drafter"] == name
        assert (got["mat"], got["accept_hist"]) == (want["mat"], want["accept_hist"]), name
    assert rows["dflash-b3@a"]["accept_hist"] != rows["dflash-b3@b"]["accept_hist"]
    assert [(c["drafter"], c["block_size"]) for c in res["drafter_cost"]] == [
        ("a", 3),
        ("b", 3),
        ("c", 5),
    ]


def test_cli_drafter_names(tmp_path, capsys):
    """``--dflash-drafter`` names: the folder of ``drafter.safetensors``, else the stem; two
    files of one name are one ``error:`` line, exit 2."""
    from jaxspec.causal.dflash import save_drafter
    from scripts import benchmark

    assert benchmark.drafter_name("runs/b4-magpie/drafter.safetensors") == "b4-magpie"
    assert benchmark.drafter_name("x/b4-flip2.safetensors") == "b4-flip2"
    model, _ = tiny_model(64, seed=0)
    spec, own = _drafter(model, 3, 1)
    for d in ("one", "two"):
        save_drafter(tmp_path / d / "b3.safetensors", spec, own)
    files = [str(tmp_path / d / "b3.safetensors") for d in ("one", "two")]
    argv = ["--suite", "dflash", "--out", str(tmp_path / "r.json")]
    rc = benchmark.main([*argv, "--dflash-drafter", files[0], "--dflash-drafter", files[1]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "need distinct names" in err[-1] and "'b3', 'b3'" in err[-1], err


def test_drafter_cost_runs_the_decode_plans(monkeypatch):
    """The cost programs run as the decode loop does: one decode plan for AR (drafter None)
    and one per draft length k with that k's drafter, each for generate's cache size (the
    prompt left-padded to generate's bucket + max_new + k + 1), and each timed target pass
    receives its plan's weight tree and the feature layers its plan asks for (none for AR)."""
    import jax

    from jaxspec.bench.dflash import drafter_cost
    from jaxspec.causal import decode as D
    from models.llama import layout

    model, params = tiny_model(64, seed=0)
    spec, own = _drafter(model, 5, 1)
    plans, trees, passes = [], [], []
    real_plan, real_trees, real_pass = D.decode_plan, layout.plan_trees, D.target_pass

    def record_plan(m, p, drafter=None, dp=(), **kw):
        plans.append((None if drafter is None else drafter.draft_length, kw["cache_slots"]))
        return real_plan(m, p, drafter, dp, **kw)

    def shapes(tree):  # the tree and its leaves' shapes: a layout's fingerprint
        return jax.tree.structure(tree), tuple(x.shape for x in jax.tree.leaves(tree))

    def record_trees(p, plan):
        out = real_trees(p, plan)
        trees.append(tuple(shapes(t) for t in out))  # (verify, step)
        return out

    def record_pass(cfg, p, feed, *a, hidden_layers=(), **kw):
        if feed.shape[1] < 8:  # a timed pass, not the prompt pass
            passes.append((shapes(p), tuple(hidden_layers), feed.shape[1]))
        return real_pass(cfg, p, feed, *a, hidden_layers=hidden_layers, **kw)

    monkeypatch.setattr(D, "decode_plan", record_plan)
    monkeypatch.setattr(layout, "plan_trees", record_trees)
    monkeypatch.setattr(D, "target_pass", record_pass)
    rows = drafter_cost(model, params, spec, own, [9, 10, 11], draft_lengths=(2,), max_new=6)
    P = 64  # generate's bucket: the prompt is left-padded to a multiple of 64
    assert plans == [(None, P + 6 + 1), (2, P + 6 + 3), (4, P + 6 + 5)]
    assert passes == [  # AR's one-token pass on the step tree, verification on the verify tree
        (trees[0][1], (), 1),
        (trees[1][0], tuple(spec.layer_ids), 3),
        (trees[2][0], tuple(spec.layer_ids), 5),
    ]
    assert [r["draft_length"] for r in rows] == [2, 4]


def test_suite_bad_input():
    """No drafter, two drafters of one block size without names, names repeated or not one
    per drafter, a drafter for another target: one-line BenchErrors before anything runs."""
    model, params = tiny_model(64, seed=0)
    tok = types.SimpleNamespace(eos_token_ids=[7], pad_token_id=0)
    sets = {"humaneval": [BenchPrompt("p", [9, 10, 11])]}
    kw = dict(prompt_sets=sets, max_new_tokens=4, progress=False)
    with pytest.raises(BenchError, match="at least one trained drafter"):
        run_dflash_suite((model, params), [], tok, **kw)
    two = [_drafter(model, 3, 1), _drafter(model, 3, 2)]
    with pytest.raises(BenchError, match="drafters of one block size need names"):
        run_dflash_suite((model, params), two, tok, **kw)
    for names in (["a", "a"], ["a"]):
        with pytest.raises(BenchError, match="one distinct name per drafter"):
            run_dflash_suite((model, params), two, tok, drafter_names=names, **kw)
    other = tiny_model(48, seed=0)[0]
    with pytest.raises(BenchError, match="vocabulary 48"):
        run_dflash_suite((model, params), [_drafter(other, 3, 1)], tok, **kw)


@pytest.mark.parametrize(
    "extra,message",
    [
        ([], "error: suite dflash needs --dflash-drafter FILE (one per block size)"),
        (["--dflash-drafter", "nothing.safetensors"], "DFlash drafter file does not exist"),
        (["--quant", "int8"], "--quant applies to suites ar, dllm, ssd and spiffy, not dflash"),
        (["--dflash-dllm-drafter", "smollm2-135m-instruct"], "--dflash-dllm-drafter"),
    ],
)
def test_cli_bad_input(tmp_path, capsys, extra, message):
    """``scripts.benchmark --suite dflash``: exit 2 and one ``error:`` line before any model
    loads."""
    from scripts import benchmark

    rc = benchmark.main(["--suite", "dflash", "--out", str(tmp_path / "r.json"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and message in err[-1], err


def test_cli_bad_draft_vocabulary(tmp_path, capsys):
    """``--dflash-draft-vocab``: a missing file and ids outside the drafter's vocabulary are
    one ``error:`` line, exit 2, before the target loads."""
    from jaxspec.causal.dflash import save_drafter
    from scripts import benchmark

    model, _ = tiny_model(64, seed=0)
    spec, own = _drafter(model, 3, 1)
    save_drafter(tmp_path / "d.safetensors", spec, own)
    np.save(tmp_path / "big.npy", np.array([1, 64]))
    base = ["--suite", "dflash", "--out", str(tmp_path / "r.json")]
    base += ["--dflash-drafter", str(tmp_path / "d.safetensors")]
    for vocab, message in (
        ("nothing.npy", "nothing.npy: draft vocabulary file does not exist"),
        (str(tmp_path / "big.npy"), "big.npy: draft vocabulary ids 1..64 outside"),
    ):
        rc = benchmark.main([*base, "--dflash-draft-vocab", vocab])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and message in err[-1], err
