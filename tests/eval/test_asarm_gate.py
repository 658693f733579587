"""The AS-ARM infilling gate (jaxspec.eval.quality.run_asarm_gate, scripts.evaluate --gate
asarm-*): figures on hand-made sequences, the pass rule, and the gate end to end on a tiny
random XLNet (written with models.xlnet.modeling.save_xlnet) with a stand-in judge, a
character tokenizer and a fake stdlib of held-out modules."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxspec.eval import quality as Q
from jaxspec.eval.metrics import degeneracy, shannon_entropy
from jaxspec.eval.quality import random_mask
from jaxspec.testing.tiny import CharTok
from models.xlnet.modeling import XLNetConfig, XLNetLM, init_params, save_xlnet

CFG = XLNetConfig(vocab_size=128, d_model=16, n_layer=1, n_head=2, d_inner=32)


def _params(collapse_to=None):
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, init_params(CFG, 0))
    if collapse_to is not None:  # a collapsed model: one token wins every position
        params["lm_bias"] = params["lm_bias"].at[collapse_to].set(1e4)
    return params


def _ppl_judge(calls):
    def judge(rows):  # stand-in for SmolLM2: unigram "perplexity" 2^H
        calls.append([list(r) for r in rows])
        return [float(2 ** shannon_entropy(r)) for r in rows]

    return judge


def test_infill_figures_use_masked_positions_only():
    seq = [7, 7, 7, 7, 1, 2, 3, 4]
    mask = [False] * 4 + [True] * 4
    f = Q.infill_figures([seq], [mask], [3.0])
    p = f["per_sequence"][0]
    assert Q.infill_tokens(seq, mask) == [1, 2, 3, 4]
    assert p["distinct_token_share"] == 1.0 and p["repeated_ngram_rate"] == 0.0
    assert p["longest_run"] == 1 and p["entropy"] == pytest.approx(2.0)
    assert p["seq_entropy"] == pytest.approx(shannon_entropy(seq), abs=1e-4)
    assert not p["degenerate"] and p["infill_tokens"] == 4 and f["gen_ppl_geomean"] == 3.0
    # the visible run of 7s does not count; a masked run of 7s does
    g = Q.infill_figures([[1, 2, 3, 4, 7, 7, 7, 5]], [[False] * 4 + [True] * 4], None)
    assert g["per_sequence"][0]["degenerate"] and g["longest_run"] == 3
    assert g["distinct_token_share"] == 0.5 and g["gen_ppl"] is None
    # aggregation: mean of shares, max of runs, geometric mean of perplexities
    h = Q.infill_figures([seq, [1, 2, 3, 4, 7, 7, 7, 5]], [mask, mask], [2.0, 8.0])
    assert h["distinct_token_share"] == 0.75 and h["longest_run"] == 3
    assert h["gen_ppl_geomean"] == pytest.approx(4.0) and h["degenerate_share"] == 0.5
    with pytest.raises(Q.QualityError):
        Q.infill_figures([seq], [[False] * 8])
    with pytest.raises(Q.QualityError):
        Q.infill_figures([seq], [mask[:-1]])


def _figs(distinct, rep, ppl, degenerate=False):
    return {
        "per_sequence": [{"degenerate": degenerate}],
        "distinct_token_share": distinct,
        "repeated_ngram_rate": rep,
        "gen_ppl_geomean": ppl,
    }


def test_pass_rule():
    truth = _figs(0.6, 0.10, 4.0)
    ok = Q.asarm_gate_checks(_figs(0.5, 0.20, 30.0), truth)
    assert [c["check"] for c in ok] == ["degenerate", "distinct", "repeated_4gram", "gen_ppl"]
    assert Q.gate_verdict(ok) == "PASS"

    def failed(infill):
        return [c["check"] for c in Q.asarm_gate_checks(infill, truth) if c["passed"] is False]

    assert failed(_figs(0.5, 0.2, 30.0, degenerate=True)) == ["degenerate"]
    assert failed(_figs(0.29, 0.2, 30.0)) == ["distinct"]  # bar 0.5 * 0.6 = 0.3
    assert failed(_figs(0.5, 0.36, 30.0)) == ["repeated_4gram"]  # bar 0.10 + 0.25
    assert failed(_figs(0.5, 0.2, 41.0)) == ["gen_ppl"]  # bar 10 * 4.0
    no_judge = Q.asarm_gate_checks(_figs(0.5, 0.2, None), _figs(0.6, 0.1, None))
    assert no_judge[-1]["passed"] is None and Q.gate_verdict(no_judge) == "PASS"


def test_gate_on_tiny_xlnet_scores_the_right_tokens():
    rng = np.random.default_rng(0)
    seqs = [list(map(int, rng.integers(32, 120, 30))) for _ in range(3)]
    calls = []
    res = Q.run_asarm_gate(
        XLNetLM(CFG),
        _params(),
        seqs,
        judge=_ppl_judge(calls),
        decode=CharTok().decode,
        mask_rate=0.9,
        seed=1,
        batch=2,
        bucket=16,
        samples=2,
    )
    masks = [random_mask(30, 0.9, 1 * 100003 + b) for b in range(3)]
    assert res["config"]["masked"] == [int(m.sum()) for m in masks] == [27] * 3
    gated = res["gated_run"]
    assert gated == "sequential T=1" and list(res["figures"]) == [
        "true",
        gated,
        "sequential greedy",
    ]
    # truth figures: the true tokens at the masked positions; the judge saw the true sequences
    t = res["figures"]["true"]["per_sequence"]
    for b, s in enumerate(seqs):
        ref = degeneracy([x for x, m in zip(s, masks[b]) if m])
        assert t[b]["distinct_token_share"] == round(ref["distinct_token_share"], 4)
        assert t[b]["longest_run"] == ref["longest_run"]
    assert calls[0] == seqs
    # infilled sequences: visible positions untouched, figures equal the judge's view at the masks
    for run, rows in zip(res["figures"], calls):
        for b, (s, r) in enumerate(zip(seqs, rows)):
            assert [x for x, m in zip(r, masks[b]) if not m] == [
                x for x, m in zip(s, masks[b]) if not m
            ]
            inf = [x for x, m in zip(r, masks[b]) if m]
            p = res["figures"][run]["per_sequence"][b]
            assert p["entropy"] == round(shannon_entropy(inf), 4)
            assert p["gen_ppl"] == round(2 ** shannon_entropy(r), 4)
    assert res["nfe_per_token"][gated] == 1.0
    assert len(res["samples"]) == 2 and res["samples"][0]["true"] == CharTok().decode(seqs[0])
    assert "[" in res["samples"][0]["prompt"] and res["verdict"] in ("PASS", "FAIL")
    # same seed, same output
    again = Q.run_asarm_gate(
        XLNetLM(CFG),
        _params(),
        seqs,
        judge=None,
        mask_rate=0.9,
        seed=1,
        batch=2,
        bucket=16,
        greedy=False,
    )
    assert again["figures"][gated]["per_sequence"] == [
        dict(p, gen_ppl=None) for p in res["figures"][gated]["per_sequence"]
    ]


def test_collapsed_model_fails_degenerate():
    rng = np.random.default_rng(1)
    seqs = [list(map(int, rng.integers(32, 120, 24))) for _ in range(2)]
    res = Q.run_asarm_gate(
        XLNetLM(CFG),
        _params(collapse_to=65),
        seqs,
        judge=_ppl_judge([]),
        mask_rate=0.9,
        batch=2,
        bucket=16,
    )
    fig = res["figures"][res["gated_run"]]
    assert fig["degenerate_share"] == 1.0 and fig["longest_run"] >= 20
    failed = {c["check"] for c in res["checks"] if c["passed"] is False}
    assert res["verdict"] == "FAIL" and {"degenerate", "distinct"} <= failed
    assert res["greedy_verdict"] == "FAIL"


@pytest.fixture
def fake_stdlib(tmp_path, monkeypatch):
    """A stdlib of two held-out modules of asarm-small's config, a character tokenizer, and a
    stand-in judge in place of SmolLM2."""
    import jaxspec.eval.judge
    import models.registry

    root = tmp_path / "stdlib"
    rng = np.random.default_rng(2)
    words = ["def", "return", "self", "value", "for", "in", "if", "None", "x", "(", ")", ":"]
    for mod in ("json/__init__.py", "csv.py", "os.py"):
        (root / mod).parent.mkdir(parents=True, exist_ok=True)
        (root / mod).write_text(" ".join(rng.choice(words, 200)) + "\n")
    monkeypatch.setattr(Q, "stdlib_root", lambda: root)
    monkeypatch.setattr(models.registry, "load_tokenizer_preset", lambda name, log: CharTok())
    calls = []
    monkeypatch.setattr(jaxspec.eval.judge, "smollm2_judge", lambda log: _ppl_judge(calls))
    path = tmp_path / "w" / "model.safetensors"
    path.parent.mkdir()
    save_xlnet(path, CFG, _params(), meta={"name": "asarm-small", "tokenizer": "chars"})
    return path, calls


def test_cli_writes_gate_json(fake_stdlib, capsys):
    from scripts.evaluate import main

    path, calls = fake_stdlib
    rc = main(
        [
            "--gate",
            "asarm-small",
            "--weights",
            str(path),
            "--sequences",
            "3",
            "--seq-len",
            "32",
            "--batch",
            "3",
            "--samples",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads((path.parent / "gate.json").read_text())
    assert doc["verdict"] in ("PASS", "FAIL") and f"verdict: {doc['verdict']}" in out
    assert {s["source"] for s in doc["snippets"]} <= {"json/__init__.py", "csv.py"}  # held out only
    assert doc["config"]["masked"] == [30] * 3 and doc["config"]["seq_len"] == [32] * 3
    assert len(calls) == 4  # true, sampled, greedy, raw truth
    assert doc["true_unk_share"] == 0.0 and len(doc["samples"]) == 1
    assert "distinct-token share" in out and ("[pass]" in out or "[FAIL]" in out)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--weights", "/nonexistent/model.safetensors"], "AS-ARM weights not found"),
        (["--mask-rate", "1.0"], "--mask-rate"),
        (["--sequences", "0"], "--sequences"),
        (["--seq-len", "4096"], "exceeds the model's context"),
        (["--sequences", "500", "--seq-len", "200"], "held-out windows"),
    ],
)
def test_cli_bad_input(fake_stdlib, capsys, argv, msg):
    from scripts.evaluate import main

    path, _ = fake_stdlib
    args = ["--gate", "asarm-small", "--no-judge"] + argv
    if "--weights" not in argv:
        args += ["--weights", str(path)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and msg in err[-1]
