"""Weight-only int8 (:mod:`models.quant`, ``--quant int8``): the per-channel error bound, the
int8 forward equals the float forward of the dequantized weights and stays close to float32,
every layout computes the same int8 logits, speculative decoding of the int8 model is lossless
against int8 AR, the ``-int8`` benchmark systems report drift, and bad input fails clearly."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.bench.ar_suite import run_ar_suite
from jaxspec.bench.records import BenchError, BenchPrompt, first_divergence
from jaxspec.bench.systems import JaxspecSystem, parse_systems, quantized_params
from jaxspec.causal.decode import generate
from jaxspec.core.drafters import NgramDrafter
from jaxspec.testing.tiny import tiny_model, tiny_xlnet
from models.llama.layout import decode_layout
from models.llama.modeling import MATRICES, CausalLM, param_dtype, unstack_layers
from models.llama.params import load_hf_dir
from models.quant import (
    QuantError,
    dequantize_matrix,
    is_quantized,
    quantize_matrix,
    quantize_params,
)
from models.registry import PresetError, load_model
from scripts import generate as gen_cli


def _forward(model, params, T=9, seed=3):
    cfg = model.config
    tokens = jnp.asarray(np.random.RandomState(seed).randint(0, cfg.vocab_size, size=(2, T)))
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (2, T, T))
    return np.asarray(model.apply({"params": params}, tokens, pos, mask)[0])


def test_error_bound_shapes_and_dtypes():
    w = np.random.RandomState(0).standard_normal((3, 40, 24)).astype(np.float32)
    w[1, :, 5] = 0.0  # an all-zero output channel
    q, s = quantize_matrix(w, axis=-2)
    assert q.dtype == jnp.int8 and q.shape == w.shape
    assert s.dtype == jnp.float32 and s.shape == (3, 24)
    q, s = np.asarray(q, np.int32), np.asarray(s)
    assert np.abs(q).max() <= 127 and (np.abs(q).max(axis=1) == 127).sum() == 3 * 24 - 1
    assert s[1, 5] == 1.0 and not q[1, :, 5].any()
    err = np.abs(w - q * s[:, None, :])
    assert (err <= s[:, None, :] / 2 * (1 + 1e-6)).all()  # |w - s q| <= s / 2
    assert np.allclose(np.asarray(dequantize_matrix(q.astype(np.int8), s)), q * s[:, None, :])

    model, params = tiny_model(arch="qwen2")
    qp = quantize_params(params)
    lay = qp["layers"]
    for m in MATRICES:
        L, din, dout = params["layers"][m].shape
        assert m not in lay and lay[m + "_q"].dtype == jnp.int8
        assert lay[m + "_q"].shape == (L, din, dout) and lay[m + "_s"].shape == (L, dout)
        assert lay[m + "_s"].dtype == jnp.float32
    for k in ("embed", "final_norm"):  # embedding (the tied head) and norms stay float
        assert qp[k] is params[k]
    assert lay["bq"] is params["layers"]["bq"] and param_dtype(qp) == jnp.float32
    assert is_quantized(qp) and not is_quantized(params) and is_quantized({"params": qp})
    # quantizing the per-layer output-major layout gives the transposes of the stacked result
    qt = quantize_params(unstack_layers(params, output_major=True))
    assert np.array_equal(np.asarray(qt["layers"][1]["w_up_q_t"]), np.asarray(lay["w_up_q"][1]).T)
    assert np.array_equal(np.asarray(qt["layers"][1]["w_up_s"]), np.asarray(lay["w_up_s"][1]))
    # an activation dtype casts the float rest; int8 matrices and float32 scales are kept
    q16 = quantize_params({"params": params}, dtype=jnp.bfloat16)["params"]
    assert param_dtype(q16) == jnp.bfloat16 and q16["layers"]["attn_norm"].dtype == jnp.bfloat16
    assert q16["layers"]["wq_q"].dtype == jnp.int8 and q16["layers"]["wq_s"].dtype == jnp.float32


def test_int8_logits_equal_dequantized_and_close_to_f32(tiny_llama):
    cfg, params = load_hf_dir(tiny_llama.path)
    model = CausalLM(cfg)
    qp = quantize_params(params)
    deq = {
        **params,
        "layers": {
            **{k: v for k, v in params["layers"].items() if k not in MATRICES},
            **{
                m: dequantize_matrix(qp["layers"][m + "_q"], qp["layers"][m + "_s"])
                for m in MATRICES
            },
        },
    }
    f32, q8, d32 = _forward(model, params), _forward(model, qp), _forward(model, deq)
    scale = float(np.abs(f32).max())
    # (x @ q) * s is the float forward of the weights s * q, up to float32 rounding
    assert np.abs(q8 - d32).max() <= 1e-5 * scale
    # each weight moves by at most 1/254 of its channel's largest magnitude (0.4%): through
    # two layers the logits move by about that share of their range, not more
    d = float(np.abs(q8 - f32).max())
    print(f"int8 vs f32: max |logit diff| {d:.3g}, max |logit| {scale:.3g}")
    assert 0 < d < 0.02 * scale


def test_layouts_give_the_same_int8_logits():
    model, params = tiny_model(arch="qwen2")  # biases and a tied head
    qp = quantize_params(params)
    ref = _forward(model, qp)  # stacked weights, lax.scan
    for tree in (
        unstack_layers(qp),
        unstack_layers(qp, output_major=True),
        decode_layout(qp, "unrolled", output_major=True),
        quantize_params(unstack_layers(params, output_major=True)),
    ):
        assert isinstance(tree["layers"], tuple) and is_quantized(tree)
        np.testing.assert_allclose(_forward(model, tree), ref, rtol=0, atol=1e-5)
    assert decode_layout(qp, "scan") is qp
    # fusing q/k/v (output-major) commutes with per-output-channel quantization
    a, b = unstack_layers(qp, output_major=True), quantize_params(unstack_layers(params, True))
    for key in ("wqkv_q_t", "wqkv_s"):
        np.testing.assert_array_equal(a["layers"][0][key], b["layers"][0][key])
    assert "wq_s" not in a["layers"][0] and a["layers"][0]["wqkv_q_t"].dtype == jnp.int8


def test_int8_speculative_decoding_identical_to_int8_ar():
    model, params = tiny_model(vocab=16)  # a 16-token vocabulary loops: drafts get accepted
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 9]]
    for dtype in (None, jnp.bfloat16):
        qp = quantize_params(params, dtype=dtype)
        ar = generate(model, qp, prompts, max_new_tokens=20, seed=4)
        ng = generate(model, qp, prompts, max_new_tokens=20, seed=4, drafter=NgramDrafter(3, 16))
        assert ng.tokens == ar.tokens and all(len(t) == 20 for t in ar.tokens)
        assert ng.stats.target_nfe.sum() < ar.stats.target_nfe.sum()  # drafts were accepted


def test_bad_input():
    _, params = tiny_model()
    with pytest.raises(QuantError, match="unknown quantization scheme 'int4'"):
        quantize_params(params, "int4")
    with pytest.raises(QuantError, match="already quantized"):
        quantize_params(quantize_params(params))
    _, xparams = tiny_xlnet()
    with pytest.raises(QuantError, match="Llama / Qwen2-layout"):
        quantize_params(xparams)
    with pytest.raises(PresetError, match="unknown quantization 'fp8'; choose one of none, int8"):
        load_model("smollm2-135m-instruct", quant="fp8")
    with pytest.raises(PresetError, match="not to the XLNet AS-ARM 'asarm-small'"):
        load_model("asarm-small", quant="int8")
    with pytest.raises(BenchError, match="drop --quant int8"):
        quantized_params(quantize_params(params))


def test_generate_cli_int8_compare(tiny_llama, capsys):
    rc = gen_cli.main(
        [
            "--model",
            "hf-directory",
            "--weights",
            str(tiny_llama.path),
            "--quant",
            "int8",
            "--method",
            "ngram",
            "--draft-length",
            "3",
            "--prompt",
            "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
            "--max-new-tokens",
            "16",
            "--compare",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[compare] ngram vs ar outputs: identical" in out
    for argv, needle in (
        (["--quant", "fp8"], "unknown quantization 'fp8'"),
        (
            ["--model", "asarm-small", "--quant", "int8", "--infill", "a<mask:2>"],
            "not to AS-ARM infilling",
        ),
    ):
        base = ["--model", "hf-directory", "--weights", str(tiny_llama.path), "--prompt", "x"]
        assert gen_cli.main(base + argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and needle in err and "\n" not in err


def test_int8_benchmark_systems_report_drift():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1 and first_divergence([1, 2], [1, 2, 3]) == 2
    assert parse_systems(["jaxspec/ngram-int8"]) == [
        "jaxspec/ar",
        "jaxspec/ar-int8",
        "jaxspec/ngram-int8",
    ]
    model, params = tiny_model(vocab=16)
    common = dict(max_new_tokens=12, eos_ids=(), pad_id=0, draft_length=3)
    systems = [JaxspecSystem(m, model, params, **common) for m in ("ar", "ar-int8", "ngram-int8")]
    assert systems[1].params is systems[2].params and is_quantized(systems[1].params)
    prompts = [BenchPrompt("p0", [1, 2, 3, 1, 2, 3]), BenchPrompt("p1", [7, 8, 9, 7])]
    res = run_ar_suite(systems, prompts, model_name="tiny", progress=False)
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["ngram-int8"]["identical_to_quant_reference"] is True
    assert rows["ar"]["identical_to_quant_reference"] is None
    assert rows["ar-int8"]["identical_to_quant_reference"] is None  # it is the reference
    assert rows["ar"]["identical_share"] == 1.0 and rows["ar"]["first_divergence"] is None
    for m in ("ar-int8", "ngram-int8"):
        div = [p["systems"][f"jaxspec/{m}"]["first_divergence"] for p in res["per_prompt"]]
        assert rows[m]["identical_share"] == sum(d is None for d in div) / 2
        assert rows[m]["identical_to_reference"] == all(d is None for d in div)
