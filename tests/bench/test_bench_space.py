"""Suite ``space`` (:mod:`jaxspec.bench.space`) end to end on a tiny random SAR model: every
part runs, SPACE is identical to AR, the report and chart are written."""

from __future__ import annotations

import json

from jaxspec.bench.space import run_space_suite, write_results
from jaxspec.testing.tiny import CharTok, tiny_model


def test_space_suite_on_tiny_model(tmp_path, monkeypatch):
    import jaxspec.bench.space as space
    from jaxspec.bench.records import BenchPrompt

    model, params = tiny_model(128, seed=0, mask_token_id=127)
    _, base = tiny_model(128, seed=1)
    tok = CharTok()
    tok.eos_token_ids, tok.pad_token_id = (), 0
    texts = ["def add(a, b):\n    return a + b\n", "for i in range(3):\n    print(i)\n"]
    monkeypatch.setattr(
        space,
        "suite_prompts",
        lambda tok, sets, limit: {
            "humaneval": [BenchPrompt(f"t/{i}", tok.encode(t)) for i, t in enumerate(texts)]
        },
    )
    res = run_space_suite(
        (model, params),
        base,
        tok,
        sets=("humaneval",),
        limit=2,
        k=3,
        ks=(2,),
        batch_sizes=(2,),
        max_new_tokens=12,
        progress=False,
    )
    rows = {r["method"]: r for r in res["sets"]["humaneval"]["rows"]}
    assert set(rows) == {"ar", "space", "ngram", "ar-base"}
    assert rows["space"]["identical_to_reference"] and rows["ngram"]["identical_to_reference"]
    assert rows["space"]["speedup_vs_base_ar"] > 0 and rows["ar"]["mat"] == 1.0
    assert [r["k"] for r in res["k_sweep"]] == [0, 2]
    assert all(r["identical_to_reference"] for r in res["k_sweep"])
    assert [(r["batch"], r["method"]) for r in res["batch"]] == [(2, "ar"), (2, "space")]
    js, md = write_results(res, tmp_path / "space.json")
    assert json.loads(js.read_text())["suite"] == "space"
    text = md.read_text()
    assert "k ablation" in text and "Batch sizes" in text and "space.png" in text
    assert (tmp_path / "space.png").read_bytes()[:4] == b"\x89PNG"
