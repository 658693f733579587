"""Benchmark suite ``assd`` (jaxspec/bench/assd.py) end to end on a tiny random XLNet with a
stand-in judge and a tiny infilling task; metric helpers (Eq. 22, Welch's t-test, masks)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxspec.bench.assd import markdown_report, run_assd_suite, welch_p, write_results
from jaxspec.eval.metrics import shannon_entropy
from jaxspec.eval.quality import random_mask
from jaxspec.eval.tasks import LineTask
from models.xlnet.modeling import XLNetConfig, XLNetLM, init_params


class CharTok:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_metric_helpers():
    assert shannon_entropy([3, 3, 3, 3]) == 0.0
    assert shannon_entropy([1, 2, 3, 4]) == pytest.approx(2.0)
    assert shannon_entropy([1, 1, 2, 2]) == pytest.approx(1.0)
    m = random_mask(20, 0.95, 1)
    assert m.sum() == 19 and (random_mask(20, 0.95, 1) == m).all()
    assert random_mask(3, 0.01, 0).sum() == 1 and random_mask(3, 0.99, 0).sum() == 2
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 200), rng.normal(0, 1, 200)
    assert welch_p(a, b) > 0.01 and welch_p(a, b + 1.0) < 1e-6
    assert welch_p([1.0], [2.0, 3.0]) is None and welch_p([2, 2], [2, 2]) == 1.0


def test_suite_end_to_end(tmp_path):
    cfg = XLNetConfig(vocab_size=128, d_model=16, n_layer=1, n_head=2, d_inner=32)
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, init_params(cfg, 0))
    model = XLNetLM(cfg)
    rng = np.random.default_rng(0)
    seqs = [list(rng.integers(32, 120, 40)) for _ in range(4)]
    judged = []

    def judge(xs):  # stand-in for SmolLM2: per-sequence unigram "PPL"
        judged.append(len(xs))
        return [float(2 ** shannon_entropy(x)) for x in xs]

    task = LineTask(
        task_id="toy/L0",
        problem="toy",
        line=0,
        prefix="def f(x):\n",
        indent="    ",
        target="return x",
        suffix="",
        test="def check(f):\n    assert f(2) == 2\n",
        entry_point="f",
    )
    res = run_assd_suite(
        model,
        params,
        seqs,
        model_name="tiny",
        judge=judge,
        mask_rate=0.9,
        k=4,
        k_sweep=(2, 4),
        temperature=1.0,
        infill_tasks=[task],
        tokenizer=CharTok(),
        infill_temperature=0.0,
        progress=False,
        config={"test": True},
    )
    rows = {r["method"]: r for r in res["rows"]}
    assert list(rows) == ["sequential", "assd", "assd-ngram", "assd-fused", "assd-fused-ngram"]
    assert rows["sequential"]["nfe_per_token"] == 1.0 and rows["sequential"]["ppl_p_value"] is None
    assert rows["assd"]["nfe_per_token"] < 1.0 and rows["assd-ngram"]["nfe_per_token"] <= 1.0
    assert rows["assd-fused"]["nfe_per_token"] < 1.0
    assert rows["assd-ngram"]["draft_calls"] > 0 and rows["assd"]["draft_calls"] == 0
    assert rows["assd-fused"]["query_tokens_per_call"] == 25  # (k + 1)^2 at k = 4
    for r in res["rows"][1:]:
        assert 0.0 <= r["ppl_p_value"] <= 1.0 and 0.0 <= r["entropy_p_value"] <= 1.0
        assert r["gen_ppl"] > 1 and r["entropy"] > 0 and r["masked_tokens"] == 36
    assert judged == [4] * 6  # 5 main rows + the k=2 sweep row
    assert [s["k"] for s in res["k_sweep"]] == [2, 4]
    assert res["k_sweep"][0]["nfe_per_token"] == 1.0  # k = 2 never saves forwards (Table 5)
    inf = {r["method"]: r for r in res["infill"]["rows"]}
    assert inf["assd"]["identical_fraction"] == 1.0  # greedy: same completion
    assert inf["sequential"]["nfe"] == 8 and inf["assd"]["nfe"] <= 8
    assert res["infill"]["per_task"][0]["sequential"]["status"] in ("passed", "failed")
    assert len(res["per_sequence"]) == 4
    js, md = write_results(res, tmp_path / "assd.json")
    assert json.loads(js.read_text())["suite"] == "assd"
    text = md.read_text()
    assert "k sweep" in text and "pass@1" in text and "assd-ngram (k=4)" in markdown_report(res)


def test_every_row_and_sequence_samples_with_its_own_seed():
    """Identical sequences with identical masks in one run must get independent samples (the
    Welch tests assume independent per-sequence values). One seed per row made every sequence
    of a row draw the same noise, so identical tasks came out token for token the same and the
    row means of two runs differed beyond their standard errors (issue 14's entropy
    question)."""
    import jaxspec.bench.assd as suite

    cfg = XLNetConfig(vocab_size=64, d_model=16, n_layer=1, n_head=2, d_inner=32)
    params = jax.tree.map(lambda x: x * 2.0 if x.ndim >= 2 else x, init_params(cfg, 0))
    seq = list(np.random.default_rng(1).integers(8, 60, 24))
    outputs = []
    real = suite.assd_generate

    def recording(*a, **kw):
        out = real(*a, **kw)
        outputs.append((kw["method"], kw["seed"], np.asarray(out.sequences[0]).tolist()))
        return out

    suite.assd_generate = recording
    try:
        run_assd_suite(
            XLNetLM(cfg),
            params,
            [seq] * 4,
            model_name="tiny",
            mask_rate=0.9,
            k=3,
            k_sweep=(),
            temperature=1.0,
            methods=("assd",),
            mask_seed=0,
            seed=5,
            progress=False,
        )
    finally:
        suite.assd_generate = real
    # one untimed warm-up run per row first (run_interleaved), then the timed runs
    warm, timed = outputs[:2], outputs[2:]
    assert [m for m, _, _ in warm] == ["sequential", "assd"]
    assert len({s for _, s, _ in timed}) == len(timed) == 8  # 2 rows x 4 sequences
    for method in ("sequential", "assd"):
        samples = [o for m, _, o in timed if m == method]
        assert len({tuple(o) for o in samples}) > 1, method  # not one draw repeated
    assert suite.row_seed(5, 1, 2) == suite.row_seed(5, 1, 2) != suite.row_seed(5, 2, 1)
