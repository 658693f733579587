"""The benchmark machinery (``jaxspec.bench.ar_suite`` and its parts, ``scripts.benchmark``) on a
tiny random model: result schema, greedy identity of jaxspec/ngram and transformers/ar with
jaxspec/ar, the markdown report, and the CLI's errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxspec.bench.ar_suite import per_token_speedup, run_ar_suite, write_results
from jaxspec.bench.machine import matvec_bandwidth, n_params, streamed_params
from jaxspec.bench.records import BenchError, BenchPrompt, RunOutput, cut_output
from jaxspec.bench.systems import (
    DEFAULT_SYSTEMS,
    SYSTEMS,
    JaxspecSystem,
    TransformersSystem,
    load_transformers_model,
    parse_systems,
)
from models.llama.modeling import CausalLM
from models.llama.params import load_hf_dir
from models.tokenizer import load_tokenizer

ROW_KEYS = {
    "system",
    "method",
    "model",
    "prompts",
    "new_tokens",
    "median_tokens_per_s",
    "mean_tokens_per_s",
    "nfe_per_token",
    "mat",
    "acceptance_rate",
    "speedup_vs_baseline",
    "identical_to_reference",
    "compile_s",
    "distinct_token_share",
    "repeated_ngram_rate",
    "longest_run",
}
TEXTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "for i in range(10):\n    print(i * 2)\nfor i in range(10):\n",
]


def test_paired_ceiling_share_is_each_prompts_rate_over_its_own_ceiling():
    from jaxspec.bench.ar_suite import _paired_share
    from jaxspec.bench.records import RunOutput

    outs = [RunOutput([1] * 11, 1.1, 11), RunOutput([1] * 21, 2.1, 21), RunOutput([1], 0.5, 1)]
    ttft = [0.1, 0.1, 0.4]  # decode rates 10 and 10 tok/s; undefined for the one-token output
    # a 1e9-byte product in 0.5 s and 0.25 s over a 1e8-byte model: ceilings 20 and 40 tok/s
    assert _paired_share(outs, ttft, [0.5, 0.25, 0.1], 10**9, 10**8) == 0.375
    assert _paired_share(outs, None, [0.5, 0.25, 0.1], 10**9, 10**8) is None
    assert _paired_share(outs, ttft, [0.5], 10**9, 10**8) is None  # not timed per prompt


def test_ab_protocol_alternates_the_arms_and_pairs_the_ratios(monkeypatch):
    """``ab_seconds`` times every arm ``reps`` times per input in alternating order and pairs
    the medians per input; ``ab_table`` reports them (a fake clock: no timing asserted)."""
    import jaxspec.bench.ab as C

    clock, calls = iter(range(1000)), []
    monkeypatch.setattr(C.time, "perf_counter", lambda: next(clock))

    def run(arm, x):  # arm "a" costs 1 tick more per call than arm "b" (ticks between reads)
        calls.append((arm, x))
        if arm == "a":
            next(clock)

    secs, ratios = C.ab_seconds(run, ("a", "b"), ["p", "q"], reps=2)
    assert calls == [
        ("a", "p"),
        ("b", "p"),
        ("b", "p"),
        ("a", "p"),
        ("b", "q"),
        ("a", "q"),
        ("a", "q"),
        ("b", "q"),
    ]
    assert secs == {"a": [2, 2, 2, 2], "b": [1, 1, 1, 1]} and ratios == [2.0, 2.0]
    lines = C.ab_table(secs, ratios, "arm", lambda a: a.upper())
    assert lines[2] == "| A | 2.00 | 2.00 | 1.00x |" and lines[3] == "| B | 1.00 | 1.00 | 2.00x |"
    # sub-second calls (a prompt pass) keep three decimals: milliseconds
    lines = C.ab_table({"a": [0.245, 0.238], "b": [0.209]}, [1.17], "arm")
    assert (
        lines[2] == "| a | 0.241 | 0.238 | 1.00x |" and lines[3] == "| b | 0.209 | 0.209 | 1.17x |"
    )


_ARM_SCALE = {"now": 1.0}


def _scaled(x):
    return x * _ARM_SCALE["now"]  # read at trace time: each arm compiles its own constant


def test_compile_arms_keeps_each_arms_program():
    """``compile_arms`` compiles one program per arm (whose code differs by a traced module
    value) and ``run_arm`` runs an arm on its own, whatever the last switch left in place."""
    import jax
    import jax.numpy as jnp

    import jaxspec.bench.ab as C
    from jaxspec.core.runtime import run_compiled

    jitted, x = jax.jit(_scaled), jnp.ones(3)

    def switch(arm):
        _ARM_SCALE["now"] = {"a": 2.0, "b": 3.0}[arm]

    outs, programs = C.compile_arms(
        ("a", "b"), switch, lambda arm: float(run_compiled(jitted, (x,), {})[0][0])
    )
    assert outs == {"a": 2.0, "b": 3.0} and _ARM_SCALE["now"] == 3.0
    for arm, want in (("a", 2.0), ("b", 3.0), ("a", 2.0)):
        out, compile_s, _ = C.run_arm(programs, arm, run_compiled, jitted, (x,), {})
        assert float(out[0]) == want and compile_s == 0.0
    _ARM_SCALE["now"] = 1.0


def test_ar_suite_on_tiny_model(tiny_llama, tiny_qwen2, tmp_path):
    pytest.importorskip("torch")
    config, params = load_hf_dir(tiny_llama.path)
    qconfig, qparams = load_hf_dir(tiny_qwen2.path)  # same tokenizer: the SPS draft model
    model, tok = CausalLM(config), load_tokenizer(tiny_llama.path)
    prompts = [BenchPrompt(f"tiny/{i}", tok.encode(t)) for i, t in enumerate(TEXTS)]
    eos = tuple(tok.eos_token_ids)
    common = dict(max_new_tokens=20, eos_ids=eos, pad_id=tok.pad_token_id or 0, draft_length=4)
    hf = load_transformers_model(tiny_llama.path, threads=1)
    systems = [
        JaxspecSystem("ar", model, params, **common),
        JaxspecSystem("ngram", model, params, **common),
        JaxspecSystem("ngram-bigram", model, params, **common),
        TransformersSystem("ar", hf, **common),
        TransformersSystem("prompt-lookup", hf, **common),
        JaxspecSystem(
            "sps", model, params, **common, options={"draft_model": (CausalLM(qconfig), qparams)}
        ),
        TransformersSystem(
            "assisted", hf, **common, assistant=load_transformers_model(tiny_qwen2.path, threads=1)
        ),
        JaxspecSystem("ar-scan", model, params, **common),
        JaxspecSystem("ngram-scan", model, params, **common),
        JaxspecSystem("ngram-unrolled", model, params, **common),
        JaxspecSystem("ngram-om", model, params, **common),
        JaxspecSystem("ngram-gate", model, params, **common),
    ]
    res = run_ar_suite(
        systems,
        prompts,
        model_name="tiny-llama",
        num_params=n_params(params),
        config={"max_new_tokens": 20},
        progress=False,
        bandwidth_reps=2,
        decode=tok.decode,
    )
    js, md = write_results(res, tmp_path / "ar.json")
    doc = json.loads(js.read_text())
    png = tmp_path / "ar.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "ar.png" in md.read_text()

    assert {
        "suite",
        "date",
        "machine",
        "config",
        "rows",
        "per_prompt",
        "bandwidth_bound_tokens_per_s",
    } <= set(doc)
    assert doc["suite"] == "ar" and doc["machine"]["cores"] >= 1 and doc["machine"]["cpu"]
    assert doc["bandwidth_bound_tokens_per_s"] > 0
    # the ceiling's product was also timed after each prompt, and paired with the decode rates
    assert len(doc["bandwidth"]["matvec_per_prompt_ms"]) == len(prompts)
    assert doc["bandwidth"]["matvec_per_prompt_gb_per_s_median"] > 0
    assert "Paired with the same product" in md.read_text()
    rows = {f"{r['system']}/{r['method']}": r for r in doc["rows"]}
    assert list(rows) == list(DEFAULT_SYSTEMS) + [
        "jaxspec/sps",
        "transformers/assisted",
        "jaxspec/ar-scan",
        "jaxspec/ngram-scan",
        "jaxspec/ngram-unrolled",
        "jaxspec/ngram-om",
        "jaxspec/ngram-gate",
    ]
    for name, r in rows.items():
        assert ROW_KEYS <= set(r), name
        assert r["prompts"] == 2 and r["model"] == "tiny-llama"
        assert 0 < r["new_tokens"] <= 40 and r["median_tokens_per_s"] > 0
        assert r["speedup_vs_baseline"] > 0
        assert (r["compile_s"] >= 0) if r["system"] == "jaxspec" else (r["compile_s"] is None)
    base = rows["jaxspec/ar"]
    assert base["decode_share_paired"] > 0 and rows["jaxspec/ngram"]["decode_share_paired"] is None
    assert base["nfe_per_token"] == 1.0 and base["speedup_vs_baseline"] == 1.0
    assert base["acceptance_rate"] is None and base["compile_s"] > 0
    assert rows["transformers/ar"]["nfe_per_token"] == 1.0
    # lossless: greedy speculative decoding and transformers' greedy match our AR tokens
    assert rows["jaxspec/ngram"]["identical_to_reference"]
    assert rows["transformers/ar"]["identical_to_reference"]
    assert rows["transformers/prompt-lookup"]["identical_to_reference"]
    assert rows["jaxspec/sps"]["identical_to_reference"]
    assert rows["transformers/assisted"]["identical_to_reference"]
    # the scan layer loop (stacked weights) decodes the same tokens as the CPU decode layout
    assert rows["jaxspec/ar-scan"]["identical_to_reference"]
    assert rows["jaxspec/ngram-scan"]["identical_to_reference"]
    assert rows["jaxspec/ngram-scan"]["nfe_per_token"] == rows["jaxspec/ngram"]["nfe_per_token"]
    # and so does the unrolled per-layer loop (the tests' default loop is the scan)
    assert rows["jaxspec/ngram-unrolled"]["identical_to_reference"]
    assert rows["jaxspec/ngram-unrolled"]["nfe_per_token"] == rows["jaxspec/ngram"]["nfe_per_token"]
    # and so does verification on output-major weights
    assert rows["jaxspec/ngram-om"]["identical_to_reference"]
    assert rows["jaxspec/ngram-om"]["nfe_per_token"] == rows["jaxspec/ngram"]["nfe_per_token"]
    # the rows record the decoder's per-machine choices; under the suite's scan loop the
    # weights stay stacked and the auto gate is off (it is measured on the unrolled loop only)
    assert rows["jaxspec/ngram-gate"]["identical_to_reference"]
    assert rows["jaxspec/ngram-gate"]["verify_layout"] == "stacked"
    assert (
        rows["jaxspec/ngram-gate"]["gate_cost"] is None
        and rows["jaxspec/ar"]["verify_layout"] is None
    )
    # the repeated prompts give the drafters matches: fewer forwards than tokens
    assert rows["jaxspec/ngram"]["nfe_per_token"] < 1.0
    assert 0 <= rows["jaxspec/ngram"]["acceptance_rate"] <= 1
    assert rows["transformers/prompt-lookup"]["nfe_per_token"] <= 1.0
    # the AR systems' time to first token and decode-step rate (what the ceiling bounds)
    for name, r in rows.items():
        ar = name.split("/")[1] in ("ar", "ar-scan")
        assert (r["ttft_s"] is not None) == ar and (r["decode_tokens_per_s"] is not None) == ar
        if ar:
            assert r["ttft_s"] > 0 and r["decode_tokens_per_s"] > 0, name
    assert "decode tok/s" in md.read_text() and "Decode steps alone" in md.read_text()
    for s in (systems[0], systems[3]):  # a one-token budget gives the full run's first token
        one = s.run(prompts[1].ids, max_new_tokens=1)
        assert one.tokens == s.run(prompts[1].ids).tokens[:1] and one.target_nfe == 1, s.name

    assert [p["task_id"] for p in doc["per_prompt"]] == ["tiny/0", "tiny/1"]
    for p in doc["per_prompt"]:
        assert set(p["systems"]) == set(rows) and isinstance(p["reference_output"], str)
        assert all(s["target_nfe"] >= 1 and s["tokens_per_s"] > 0 for s in p["systems"].values())
    text = md.read_text()
    assert "| system |" in text and "jaxspec | ngram" in text and "ceiling" in text


def test_transformers_assisted_drafts_exactly_k_tokens(tiny_llama, tiny_qwen2):
    """The SPS peer drafts K tokens per step: transformers reads the draft length, schedule and
    confidence threshold from the assistant's generation config, so the system sets them there
    (left at the assistant's defaults it drafted up to 20 tokens, or stopped early)."""
    pytest.importorskip("torch")
    tok = load_tokenizer(tiny_llama.path)
    hf = load_transformers_model(tiny_llama.path, threads=1)
    sys_ = TransformersSystem(
        "assisted",
        hf,
        max_new_tokens=30,
        eos_ids=(),
        pad_id=0,
        draft_length=3,
        assistant=load_transformers_model(tiny_qwen2.path, threads=1),
    )
    out = sys_.run(tok.encode(TEXTS[0]))
    calls = list(sys_._calls)
    assert len(out.tokens) == 30 and len(calls) >= 2
    # the prompt's pass holds the prompt + K candidates, every later one the last token + K
    # candidates, except the last K passes, whose candidates the token budget cuts short
    n = len(tok.encode(TEXTS[0]))
    assert calls[0] == n + 3 and all(1 <= c <= 4 for c in calls[1:])
    assert calls[1:-3] and all(c == 4 for c in calls[1:-3])
    assert out.proposed == 3 + sum(c - 1 for c in calls[1:])


def test_helpers():
    assert cut_output([5, 6, 2, 7], [2], 10) == [5, 6, 2]
    assert cut_output([5, 6, 7, 8], [2], 3) == [5, 6, 7]
    assert parse_systems(None) == list(DEFAULT_SYSTEMS)
    assert "jaxspec/sps" in SYSTEMS and "jaxspec/sps" not in DEFAULT_SYSTEMS
    assert parse_systems(["transformers/ar,jaxspec/ngram"]) == [
        "jaxspec/ar",
        "jaxspec/ngram",
        "transformers/ar",
    ]
    with pytest.raises(BenchError, match="unknown system"):
        parse_systems(["jaxspec/magic"])
    with pytest.raises(BenchError, match="baseline"):
        run_ar_suite([], [BenchPrompt("x", [1])], model_name="m", progress=False)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--suite", "nope"], "unknown suite"),
        (["--suite", "ar", "--systems", "jaxspec/magic"], "unknown system"),
        (["--suite", "ar", "--model", "no-such-model"], "unknown model"),
        (["--suite", "ar", "--limit", "0"], "--limit"),
        (
            ["--suite", "diffuspec", "--draft-model", "smollm2-135m-instruct"],
            "takes masked-diffusion",
        ),
        (["--suite", "diffuspec", "--k-min", "40"], "--k-min <= --k-max"),
        (["--suite", "diffuspec", "--quant", "int8"], "--quant applies"),
    ],
)
def test_cli_errors(argv, msg, capsys):
    from scripts.benchmark import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err


# ----------------------------------------------------------------------------- suite dllm


def test_dllm_suite_on_tiny_model(tmp_path):
    """Suite ``dllm`` on a random tiny LLaDA model: every (method, cache) row, stepwise as
    each cache policy's reference, NFE bookkeeping, loop overhead, the report and chart."""
    from jaxspec.bench.dllm import run_dllm_suite
    from jaxspec.bench.dllm import write_results as write_dllm
    from tests.dllm.test_dllm import MODELS, PROMPTS

    model, params = MODELS["llada"]
    prompts = [BenchPrompt(f"tiny/{i}", p) for i, p in enumerate(PROMPTS)]
    res = run_dllm_suite(
        model,
        params,
        prompts,
        model_name="tiny-llada",
        gen_length=8,
        block_length=4,
        methods=["fixed-2", "threshold-0.5"],
        caches=["none", "dual"],
        progress=False,
        overhead_reps=1,
    )
    js, md = write_dllm(res, tmp_path / "dllm.json")
    doc = json.loads(js.read_text())
    assert (tmp_path / "dllm.png").read_bytes()[:4] == b"\x89PNG" and "dllm.png" in md.read_text()
    rows = {(r["method"], r["cache"]): r for r in doc["rows"]}
    assert list(rows) == [
        (m, c) for c in ("none", "dual") for m in ("stepwise", "fixed-2", "threshold-0.5")
    ]
    for (m, c), r in rows.items():
        assert r["prompts"] == 2 and r["tokens_per_s"] > 0 and r["compile_s"] >= 0
        assert r["nfe"] == {"stepwise": 8, "fixed-2": 4}.get(m, r["nfe"])
        assert 1 <= r["nfe"] <= 8 and r["tokens_per_nfe"] == round(8 / r["nfe"], 3)
        if m == "stepwise":
            assert r["identical_fraction"] == 1.0 and r["speedup_vs_stepwise"] == 1.0
            assert r["loop_overhead"] is not None and r["loop_overhead"] > -0.9
        else:
            assert r["loop_overhead"] is None
    # the dual cache pushes fewer query tokens through the model than no cache
    assert (
        rows[("stepwise", "dual")]["forward_tokens"] < rows[("stepwise", "none")]["forward_tokens"]
    )
    assert rows[("stepwise", "none")]["forward_tokens"] == 8 * (16 + 8)
    assert set(doc["per_prompt"][0]["runs"]) == {f"{m}/{c}" for m, c in rows}
    assert set(doc["per_prompt"][0]["forward_seconds"]["dual"]) == {"full", "window_4"}
    assert "| stepwise | dual |" in md.read_text()


def test_interleaved_runs_warm_every_key_up_first_and_time_only_the_later_runs():
    """Each key runs once on the first prompt before anything is timed; that run is
    discarded (its compile seconds kept), and the timed runs rotate the key order."""
    import types

    from jaxspec.bench.dllm import run_interleaved

    calls = []

    def run(key):
        def f(ids):
            calls.append((key, tuple(ids)))
            first = sum(k == key for k, _ in calls) == 1
            return types.SimpleNamespace(compile_s=2.0 if first else 0.0, run_s=1.0, ids=ids)

        return f

    prompts = [BenchPrompt("a", [1, 2]), BenchPrompt("b", [3])]
    outs, compile_s = run_interleaved({"x": run("x"), "y": run("y")}, prompts, 8, False, "t")
    assert calls[:2] == [("x", (1, 2)), ("y", (1, 2))]  # the warm-ups
    assert calls[2:] == [("x", (1, 2)), ("y", (1, 2)), ("y", (3,)), ("x", (3,))]
    assert [r.ids for r in outs["x"]] == [[1, 2], [3]] and compile_s == {"x": 2.0, "y": 2.0}
    calls.clear()
    outs, _ = run_interleaved({"x": run("x")}, prompts, 8, False, "t", warmup=False)
    assert len(calls) == 2 and len(outs["x"]) == 2


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_dllm_forward_costs_in_bfloat16(cache):
    """The lone forwards behind ``loop overhead`` run in the model's own dtype: with bfloat16
    parameters (the GPU default) the cache they fill is bfloat16 too (a float32 cache broke the
    layer scan's carry on an H100, the first GPU run of the suite)."""
    import jax.numpy as jnp

    from jaxspec.bench.dllm import forward_costs, method_config
    from models.registry import cast_params
    from tests.dllm.test_dllm import MODELS

    model, params = MODELS["llada"]
    cfg = method_config("stepwise", gen_length=8, block_length=4, cache=cache)
    costs = forward_costs(model, cast_params(params, jnp.bfloat16), 5, cfg, reps=1)
    assert costs["full"] > 0 and len(costs) >= 2 and all(v > 0 for v in costs.values())


def test_report_header_names_the_accelerator():
    """Every suite's page names the accelerator JAX ran on, and only the peer suites torch."""
    from jaxspec.bench.report import report_header

    res = {
        "date": "d",
        "machine": {
            "cpu": "Xeon",
            "cores": 16,
            "jax": "0.11.2",
            "accelerator": "NVIDIA H100 80GB HBM3",
            "torch": "2.11",
        },
        "config": {"dtype": "bfloat16"},
    }
    line = report_header("t", res)[2]
    assert line == "d · Xeon · 16 cores · NVIDIA H100 80GB HBM3 · jax 0.11.2"
    assert "torch 2.11" in report_header("t", res, peers=True)[2]
    assert report_header("t", res)[4] == "Config: `dtype=bfloat16`"
    res["machine"].pop("accelerator")
    assert report_header("t", res)[2] == "d · Xeon · 16 cores · jax 0.11.2"


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--suite", "dllm", "--model", "smollm2-135m-instruct"], "causal"),
        (["--suite", "dllm", "--limit", "0"], "--limit"),
    ],
)
def test_dllm_cli_errors(argv, msg, capsys):
    from scripts.benchmark import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err


def test_dllm_method_names():
    from jaxspec.bench.dllm import method_config

    c = method_config("fixed-3", gen_length=8, block_length=4, cache="prefix")
    assert c.tokens_per_step == 3 and c.cache == "prefix" and c.steps == 8
    assert (
        method_config("threshold-0.8", gen_length=8, block_length=4, cache="none").threshold == 0.8
    )
    for bad in ("fixed-x", "magic"):
        with pytest.raises(BenchError, match="method"):
            method_config(bad, gen_length=8, block_length=4, cache="none")


def test_ssd_suite_on_tiny_model(tmp_path):
    """Suite ``ssd`` on the tiny random Dream model: reference rows per cache policy, SSD rows
    identical to them, step reduction bookkeeping, the Table 2 analysis and the report."""
    from jaxspec.bench.ssd import parse_rows, run_ssd_suite
    from jaxspec.bench.ssd import write_results as write_ssd
    from tests.dllm.test_dllm import MODELS, PROMPTS

    model, params = MODELS["dream"]
    prompts = [BenchPrompt(f"tiny/{i}", p) for i, p in enumerate(PROMPTS)]
    rows = parse_rows(["2:chain:dual", "2:mix-order:none"])
    res = run_ssd_suite(
        model,
        params,
        prompts,
        model_name="tiny-dream",
        gen_length=8,
        block_length=4,
        rows=rows,
        progress=False,
        limit_draft_lengths=(2, 3),
        limit_top_ks=(1, 2),
    )
    js, md = write_ssd(res, tmp_path / "ssd.json")
    doc = json.loads(js.read_text())
    got = {(r["method"], r["draft_length"], r["tree"], r["cache"]): r for r in doc["rows"]}
    assert set(got) == {
        ("stepwise", None, None, "dual"),
        ("stepwise", None, None, "none"),
        ("ssd", 2, "chain", "dual"),
        ("ssd", 2, "mix-order", "none"),
    }
    for k, r in got.items():
        assert r["identical_to_reference"] is True, k
        assert r["nfe"] <= 8 and r["step_reduction"] == round(1 - r["nfe"] / 8, 4)
        if k[0] == "stepwise":
            assert r["nfe"] == 8 and r["speedup"] == 1.0 and r["nodes"] == 1
    assert got[("ssd", 2, "mix-order", "none")]["nodes"] == 4
    for k, r in got.items():  # accept_hist[j]: iterations that accepted j tokens
        h = np.array(r["accept_hist"])
        assert (h * np.arange(len(h))).sum() == 8 * 2 and h.sum() == r["nfe"] * 2, k
    lim = doc["acceptance_limits"]
    assert [r["draft_length"] for r in lim["rows"]] == [2, 3]
    for r in lim["rows"]:
        assert r["step_reduction"] == sorted(r["step_reduction"])
        assert r["step_reduction"][-1] <= r["upper_bound"]
    text = md.read_text()
    assert "Step↓" in text and "Table 2" in text and (tmp_path / "ssd.png").exists()
    with pytest.raises(BenchError, match="N:tree:cache"):
        parse_rows(["x:chain"])


def test_spiffy_suite_on_tiny_model(tmp_path):
    """Suite ``spiffy`` on the tiny random LLaDA model: a reference row per unmasking rule,
    Spiffy rows identical to their reference, NFE bookkeeping, Table 2 products, the report."""
    from jaxspec.bench.spiffy import parse_rows, run_spiffy_suite
    from jaxspec.bench.spiffy import write_results as write_sp
    from tests.dllm.test_dllm import MODELS, PROMPTS
    from tests.dllm.test_spiffy import GRAPH

    model, params = MODELS["llada"]
    prompts = [BenchPrompt(f"tiny/{i}", p) for i, p in enumerate(PROMPTS)]
    rows = parse_rows(["7:stepwise", "7:threshold-0.3"])
    res = run_spiffy_suite(
        model,
        params,
        prompts,
        model_name="tiny-llada",
        graphs={7: GRAPH},
        gen_length=16,
        block_length=8,
        rows=rows,
        progress=False,
    )
    js, md = write_sp(res, tmp_path / "spiffy.json")
    doc = json.loads(js.read_text())
    got = {(r["method"], r["graph_D"], r["unmasking"]): r for r in doc["rows"]}
    assert set(got) == {
        ("reference", 0, "stepwise"),
        ("reference", 0, "threshold-0.3"),
        ("spiffy", 7, "stepwise"),
        ("spiffy", 7, "threshold-0.3"),
    }
    for k, r in got.items():
        assert r["identical_to_reference"] is True, k
    ref_t = got[("reference", 0, "threshold-0.3")]
    assert got[("reference", 0, "stepwise")]["nfe"] == 16
    assert ref_t["parallel_speedup"] == round(16 / ref_t["nfe"], 3)
    sp = got[("spiffy", 7, "threshold-0.3")]
    assert sp["nfe_speedup"] == round(ref_t["nfe"] / sp["nfe"], 3)
    assert sp["total_speedup"] == pytest.approx(16 / sp["nfe"], rel=2e-3)
    assert sp["forward_tokens_per_forward"] > 8  # D + 1 blocks per verifying forward
    assert "NFE speedup" in md.read_text() and (tmp_path / "spiffy.png").exists()
    with pytest.raises(BenchError, match="D:rule"):
        parse_rows(["x"])
    with pytest.raises(BenchError, match="unknown method"):
        parse_rows(["3:sometimes"])
    with pytest.raises(BenchError, match="no draft graph"):
        run_spiffy_suite(model, params, prompts, model_name="m", graphs={}, rows=[(3, "stepwise")])


def test_matvec_bandwidth_matrix_is_capped():
    """The ceiling's matrix is model-sized up to ``max_bytes`` and no larger (a 1.5B model's
    6.2 GB copy ran a 24 GB machine out of memory after an ``ar`` run)."""
    small = matvec_bandwidth(100_000, reps=1, rows=100)
    assert small["matrix_bytes"] == 4 * 100_000
    capped = matvec_bandwidth(10**9, reps=1, rows=100, max_bytes=400_000)
    assert capped["matrix_bytes"] == 400_000 and capped["gb_per_s"] > 0


def test_device_matvec_bandwidth_counts_the_dtypes_bytes():
    """The accelerator ceiling's matrix holds ``num_params`` scalars of the weight dtype (2 bytes
    for bfloat16), capped like the CPU one; the peers' device follows JAX's backend."""
    from jaxspec.bench.machine import device_matvec_bandwidth
    from jaxspec.bench.records import BenchError
    from jaxspec.bench.systems import torch_device

    bf = device_matvec_bandwidth(100_000, "bfloat16", reps=1, rows=100)
    assert bf["matrix_bytes"] == 2 * 100_000 and bf["gb_per_s"] > 0
    f32 = device_matvec_bandwidth(10**9, "float32", reps=1, rows=100, max_bytes=400_000)
    assert f32["matrix_bytes"] == 400_000
    import jax

    if jax.default_backend() == "cpu":
        assert torch_device("auto") == "cpu"
    assert torch_device("cuda") == "cuda"
    with pytest.raises(BenchError, match="torch device"):
        torch_device("tpu")


def test_streamed_params_leave_out_an_untied_embedding_table():
    """The ceiling's bytes: a decode step gathers one row of an untied embedding table but
    reads a tied one whole (it is the LM head)."""
    layers = {"wq": np.zeros((2, 8, 8), np.float32)}
    tied = {"embed": np.zeros((100, 8), np.float32), "final_norm": np.zeros(8), "layers": layers}
    untied = {**tied, "lm_head": np.zeros((8, 100), np.float32)}
    assert streamed_params(tied) == n_params(tied) == 800 + 8 + 128
    assert n_params(untied) == 1736
    assert streamed_params(untied) == 1736 - 800


def test_map_headroom_turns_the_compiler_abort_into_a_clear_error(monkeypatch):
    """Near the kernel's memory-map limit the suite stops with a BenchError that names the
    limit before it compiles (an XLA CPU compile there aborts the whole process); with room
    left it runs. The real reader counts this process's maps."""
    import jaxspec.bench.machine as machine
    from jaxspec.testing.tiny import tiny_model

    held, limit = machine.memory_maps()
    assert 0 < held < limit
    model, params = tiny_model(64, seed=0)
    prompts = [BenchPrompt("tiny/0", [5, 6, 7, 8])]
    systems = [JaxspecSystem("ar", model, params, max_new_tokens=4, eos_ids=(), pad_id=0)]
    monkeypatch.setattr(machine, "memory_maps", lambda: (62_000, 65_530))
    with pytest.raises(BenchError, match=r"warm-up of jaxspec/ar: .* 62,000 of the 65,530 "):
        run_ar_suite(systems, prompts, model_name="tiny", progress=False)
    monkeypatch.setattr(machine, "memory_maps", lambda: (60_000, 65_530))
    res = run_ar_suite(systems, prompts, model_name="tiny", progress=False)
    assert res["rows"][0]["identical_to_reference"] is True
    machine.check_map_headroom("x", maps=lambda: None)  # no reader (not Linux): no check


def test_speedup_is_per_token_so_a_shorter_output_earns_nothing():
    """The device run of 2026-11-29 put a bf16 transformers peer that stopped at token 54 of
    jaxspec's 103 at "1.61x" (the ratio of call seconds); per token it was 0.84x."""
    ref = RunOutput(tokens=list(range(103)), seconds=103 / 343.9, target_nfe=103)
    short = RunOutput(tokens=list(range(54)), seconds=54 / 289.6 + 0.0, target_nfe=54)
    assert per_token_speedup(ref, short) == pytest.approx(289.6 / 343.9)
    assert ref.seconds / short.seconds > 1.5  # what the old column showed
    # same tokens: the plain ratio of seconds, as before
    same = RunOutput(tokens=list(range(103)), seconds=ref.seconds / 2, target_nfe=52)
    assert per_token_speedup(ref, same) == pytest.approx(2.0)
    assert per_token_speedup(ref, RunOutput(tokens=[], seconds=0.1, target_nfe=1)) == 0.0
