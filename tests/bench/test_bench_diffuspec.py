"""Suite ``diffuspec`` (:mod:`jaxspec.bench.diffuspec`) end to end on a tiny random causal
target and a tiny Dream drafter with the same vocabulary: every part runs, every DiffuSpec
variant is identical to AR, drafter NFE is counted (S per proposal), the report and chart are
written; bad input is one BenchError."""

from __future__ import annotations

import json

import pytest

from jaxspec.bench.diffuspec import run_diffuspec_suite, write_results
from jaxspec.bench.records import BenchError, BenchPrompt
from jaxspec.causal.diffuspec import NgramProxy
from jaxspec.testing.tiny import CharTok, tiny_diffusion_model, tiny_model


@pytest.mark.slow  # 60 s on a slow 2-core machine: make test-all (the decoders' own tests stay)
def test_diffuspec_suite_on_tiny_models(tmp_path, monkeypatch):
    import jaxspec.bench.diffuspec as suite

    target = tiny_model(128, seed=0)
    tok = CharTok()
    tok.eos_token_ids, tok.pad_token_id = (), 0
    texts = ["def add(a, b):\n    return a + b\n", "for i in range(3):\n    print(i)\n"]
    monkeypatch.setattr(
        suite,
        "suite_prompts",
        lambda tok, sets, limit: {
            "humaneval": [BenchPrompt(f"t/{i}", tok.encode(t)) for i, t in enumerate(texts)]
        },
    )
    drafter = {
        "dllm_drafter": tiny_diffusion_model("dream", vocab=128, ctx=512),
        "eos_id": 0,
        "proxy": NgramProxy.fit(tok.encode("".join(texts) * 3), 128, bits=12),
    }
    res = run_diffuspec_suite(
        target,
        drafter,
        tok,
        sets=("humaneval",),
        limit=2,
        k_max=6,
        k_min=3,
        fixed_k=(4,),
        refine_steps=(2,),
        max_new_tokens=12,
        drafter_caches=("none", "prefix"),
        progress=False,
    )
    rows = {r["method"]: r for r in res["sets"]["humaneval"]}
    assert set(rows) == {
        "ar",
        "ngram",
        "specdiff",
        "diffuspec",
        "specdiff+prefix",
        "diffuspec+prefix",
    }
    assert all(r["identical_to_reference"] for r in rows.values())
    assert rows["ar"]["mat"] == 1.0 and rows["ar"]["draft_nfe_per_token"] == 0.0
    assert rows["diffuspec"]["draft_nfe_per_token"] > 0
    for r in rows.values():  # the verifier stops at the EOS: every forward is an answer forward
        assert r["answer_tokens_per_nfe"] == pytest.approx(r["mat"], abs=1e-3)
        assert r["answer_length"] * r["prompts"] == pytest.approx(r["new_tokens"])
    d = rows["diffuspec"]
    assert d["answer_tokens_per_draft_nfe"] == pytest.approx(1 / d["draft_nfe_per_token"], rel=1e-2)
    assert rows["ar"]["answer_speedup"] == 1.0 and rows["ar"]["answer_tokens_per_draft_nfe"] is None
    assert {r["method"] for r in res["ablations"]} == {
        "ar",
        "diffuspec",
        "cps-only",
        "adl-only",
        "specdiff",
    }
    assert all(
        r["identical_to_reference"] for r in res["ablations"] + res["fixed_k"] + res["refine_steps"]
    )
    assert [r["k"] for r in res["fixed_k"]] == [4]
    by_s = {r["S"]: r for r in res["refine_steps"]}
    assert set(by_s) == {0, 2}
    # S = 2 spends two drafter forwards per proposal, S = 1 (the set's diffuspec row) one
    drafts = {
        s: r["draft_nfe_per_token"] * r["new_tokens"]
        for s, r in ((1, rows["diffuspec"]), (2, by_s[2]))
    }
    assert drafts[2] > drafts[1]
    js, md = write_results(res, tmp_path / "diffuspec.json")
    assert json.loads(js.read_text())["suite"] == "diffuspec"
    text = md.read_text()
    assert "Table 2 ablations" in text and "Fixed draft length" in text and "diffuspec.png" in text
    header = next(line for line in text.splitlines() if line.startswith("| set"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[:6] == [
        "set",
        "method",
        "prompts",
        "answer len",
        "answer tok/s",
        "answer speedup vs AR",
    ] and cols.index("flag") < cols.index("tokens")
    assert (tmp_path / "diffuspec.png").read_bytes()[:4] == b"\x89PNG"


def test_diffuspec_suite_bad_input():
    target = tiny_model(128, seed=0)
    tok = CharTok()
    tok.eos_token_ids, tok.pad_token_id = (), 0
    with pytest.raises(BenchError, match="needs a diffusion drafter"):
        run_diffuspec_suite(target, {}, tok)
    with pytest.raises(BenchError, match="k_min <= k_max"):
        run_diffuspec_suite(target, {"dllm_drafter": object()}, tok, k_max=5, k_min=8)
    with pytest.raises(BenchError, match="unknown prompt set 'bogus'"):
        run_diffuspec_suite(target, {"dllm_drafter": object()}, tok, sets=("long", "bogus"))
    with pytest.raises(BenchError, match="unknown drafter cache"):
        run_diffuspec_suite(target, {"dllm_drafter": object()}, tok, drafter_caches=("dual",))
