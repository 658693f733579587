"""Bad input to ``scripts.generate`` and to the decode API: one line, before any model loads.

Each CLI case runs ``scripts.generate.main`` with model loading patched to fail, and requires
exit code 2 and exactly one stderr line ``error: ...`` holding the expected words; a subset
runs ``python -m scripts.generate`` in a subprocess (undecodable argv bytes included) with the
weight cache pointed at an empty folder. Each API case calls :mod:`jaxspec.methods` and
requires the exception type and words.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxspec.methods import MethodError, get_method, run

ROOT = Path(__file__).resolve().parents[2]
DREAM = ["--model", "dream-smollm2-135m"]
ASARM = ["--model", "asarm-small", "--infill", "x = <mask:3>"]

CLI_CASES = [  # (id, argv, words in the one error line)
    (
        "draft-length-huge",
        ["--draft-length", "100000"],
        "--draft-length must be in 1..1024, got 100000",
    ),
    ("draft-length-zero", ["--draft-length", "0"], "--draft-length must be in 1..1024, got 0"),
    (
        "prompt-not-utf8",
        ["--prompt", b"x\xff\xfe".decode("utf-8", "surrogateescape")],
        "--prompt 1 is not valid UTF-8 (byte 0xff at character 1)",
    ),
    ("prompt-empty", ["--prompt", ""], "--prompt 1 is empty"),
    ("threshold-zero", DREAM + ["--threshold", "0"], "--threshold must lie in (0, 1], got 0.0"),
    (
        "threshold-above-one",
        DREAM + ["--threshold", "1.5"],
        "--threshold must lie in (0, 1], got 1.5",
    ),
    ("temperature-inf", ["--temperature", "inf"], "temperature must be >= 0 and finite, got inf"),
    ("temperature-nan", ["--temperature", "nan"], "temperature must be >= 0 and finite, got nan"),
    (
        "temperature-negative",
        ["--temperature", "-0.5"],
        "temperature must be >= 0 and finite, got -0.5",
    ),
    (
        "gen-length-causal",
        ["--gen-length", "32"],
        "--gen-length does not apply to --method ngram (a causal method); it applies to the "
        "masked-diffusion methods",
    ),
    (
        "cache-causal",
        ["--method", "ar", "--cache", "dual"],
        "--cache does not apply to --method ar",
    ),
    ("limit-zero", ["--limit", "0"], "--limit must be >= 1 (HumanEval prompts), got 0"),
    (
        "min-above-max-ngram",
        ["--min-ngram", "4", "--max-ngram", "3"],
        "--min-ngram 4 exceeds --max-ngram 3; need 1 <= --min-ngram <= --max-ngram",
    ),
    (
        "stepwise-threshold",
        DREAM + ["--method", "stepwise", "--threshold", "0.9"],
        "--threshold does not apply to --method stepwise; use --method threshold / spiffy",
    ),
    (
        "ssd-steps",
        DREAM + ["--method", "ssd", "--steps", "8"],
        "--steps does not apply to --method ssd; use --method stepwise / spiffy",
    ),
    ("fixed-k-without-k", DREAM + ["--method", "fixed-k"], "needs --tokens-per-step K"),
    (
        "ssd-on-causal",
        ["--method", "ssd"],
        "method 'ssd' needs a masked-diffusion model, but 'smollm2-135m-instruct' is causal",
    ),
    ("ngram-on-dllm", DREAM + ["--method", "ngram"], "method 'ngram' needs a causal model"),
    ("unknown-method", ["--method", "medusa"], "unknown method 'medusa'; available: ar, ngram"),
    ("unknown-model", ["--model", "gpt5"], "unknown model 'gpt5'; available:"),
    ("sps-without-draft", ["--method", "sps"], "method 'sps' needs --draft-model NAME"),
    (
        "draft-model-with-ngram",
        ["--draft-model", "qwen2.5-coder-0.5b-instruct"],
        "--draft-model does not apply to --method ngram; use --method sps / diffuspec / specdiff",
    ),
    ("draft-weights-alone", ["--draft-weights", "x.gguf"], "--draft-weights needs --draft-model"),
    ("space-without-mask", ["--method", "space"], "needs a SAR-SFT model with a [MASK] token"),
    ("gate-bad", ["--gate", "fast"], "unknown --gate 'fast'"),
    ("asarm-without-template", ["--model", "asarm-small"], "give a template with --infill"),
    (
        "infill-not-utf8",
        ["--model", "asarm-small", "--infill", b"<mask:2>\xff".decode("utf-8", "surrogateescape")],
        "--infill is not valid UTF-8",
    ),
    (
        "epsilon-greedy",
        ASARM + ["--epsilon", "0.1"],
        "--epsilon 0.1 is a sampling tolerance: it needs --temperature > 0",
    ),
    (
        "epsilon-inf",
        ASARM + ["--epsilon", "inf", "--temperature", "1"],
        "--epsilon must be a finite number >= 0",
    ),
    (
        "asarm-cache",
        ASARM + ["--cache", "dual"],
        "unknown --cache 'dual'; expected one of none, content",
    ),
    ("asarm-quant", ASARM + ["--quant", "int8"], "--quant int8 applies to Llama / Qwen2-layout"),
    ("infill-on-causal", ["--infill", "x = <mask:3>"], "--infill needs an any-order"),
    (
        "draft-vocab-other-method",
        ["--method", "ngram", "--dflash-draft-vocab", str(ROOT / "pyproject.toml")],
        "--dflash-draft-vocab does not apply to --method ngram; use --method dflash",
    ),
    (
        "dflash-drafter-other-method",
        ["--method", "ngram", "--dflash-drafter", str(ROOT / "pyproject.toml")],
        "--dflash-drafter does not apply to --method ngram; use --method dflash",
    ),
    (
        "ngram-first-other-method",
        ["--method", "sps", "--ngram-first"],
        "--ngram-first does not apply to --method sps; use --method dflash",
    ),
    (
        "ngram-first-bad-range",
        ["--method", "dflash", "--ngram-first", "--min-ngram", "4"],
        "--min-ngram 4 exceeds --max-ngram 3",
    ),
    (
        "draft-vocab-missing",
        ["--method", "dflash", "--dflash-draft-vocab", "nothing.npy"],
        "--dflash-draft-vocab nothing.npy: no such file",
    ),
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load (or weight fetch) fails the test."""
    import models.registry
    import scripts.infill

    def loaded(*a, **k):
        raise AssertionError("a model was loaded before the bad input was reported")

    for mod, name in (
        (models.registry, "load_model"),
        (models.registry, "load_asarm"),
        (models.registry, "fetch"),
        (scripts.infill, "load_asarm"),
    ):
        monkeypatch.setattr(mod, name, loaded)


@pytest.mark.parametrize("argv,words", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input_is_one_line_before_any_model_loads(argv, words, no_model_loads, capsys):
    from scripts import generate

    assert generate.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert words in err, err


SUBPROCESS = (
    "draft-length-huge",
    "prompt-not-utf8",
    "threshold-zero",
    "temperature-inf",
    "limit-zero",
    "stepwise-threshold",
)


@pytest.mark.parametrize(
    "argv,words",
    [c[1:] for c in CLI_CASES if c[0] in SUBPROCESS],
    ids=[c[0] for c in CLI_CASES if c[0] in SUBPROCESS],
)
def test_cli_subprocess_exit_2(argv, words, tmp_path):
    """The command as a user runs it (argv bytes that are not UTF-8 included): exit code 2,
    one stderr line, nothing fetched into an empty weight cache."""
    env = dict(os.environ, JAXSPEC_CACHE=str(tmp_path), JAX_PLATFORMS="cpu")
    argv = [os.fsencode(a) for a in argv]  # keeps the undecodable bytes of the UTF-8 case
    r = subprocess.run(
        [sys.executable, "-m", "scripts.generate", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    err = r.stderr.decode("utf-8", "replace").strip()
    assert r.returncode == 2, (r.returncode, err)
    assert err.startswith("error: ") and "\n" not in err, err
    assert words in err, err
    assert not list(tmp_path.iterdir()), "a model was fetched"


def test_help_texts():
    """--help: a whole first sentence, the presets listed under --model, every method."""
    from jaxspec.methods import METHODS
    from models.registry import available
    from scripts.generate import build_parser

    ap = build_parser()
    assert ap.description.endswith(".") and "or a" not in ap.description[-8:]
    model = next(a for a in ap._actions if a.dest == "model")
    assert all(p in model.help for p in available())
    method = next(a for a in ap._actions if a.dest == "method")
    assert all(n in method.help for n in METHODS)


def test_evaluate_lists_every_asarm_method_and_no_issue_numbers():
    from jaxspec.methods import methods_of
    from scripts.evaluate import build_parser

    ap = build_parser()
    method = next(a for a in ap._actions if a.dest == "method")
    assert tuple(method.choices) == methods_of("asarm")
    assert "issue" not in ap.format_help()


# ----------------------------------------------------------------------------- the API


@pytest.fixture(scope="module")
def causal():
    from jaxspec.testing.tiny import tiny_model

    return tiny_model(64, seed=0)


API_CONFIG_CASES = [  # (method, options, exception, words)
    ("ngram", dict(draft_length=100000), ValueError, "--draft-length must be in 1..1024"),
    ("ngram", dict(draft_length=2.0), TypeError, "--draft-length must be an int, got 2.0"),
    ("threshold", dict(threshold=0), ValueError, "--threshold must lie in (0, 1], got 0"),
    ("threshold", dict(threshold=1.5), ValueError, "--threshold must lie in (0, 1], got 1.5"),
    ("ngram", dict(temperature=math.inf), ValueError, "temperature must be >= 0 and finite"),
    ("stepwise", dict(temperature=math.nan), ValueError, "temperature must be >= 0 and finite"),
    ("assd", dict(temperature=-1.0), ValueError, "temperature must be >= 0 and finite"),
    ("ngram", dict(gen_length=32), MethodError, "--gen-length does not apply to --method ngram"),
    ("ar", dict(cache="dual"), MethodError, "--cache does not apply to --method ar"),
    ("ngram", dict(min_ngram=4, max_ngram=3), ValueError, "--min-ngram 4 exceeds --max-ngram 3"),
    ("stepwise", dict(threshold=0.9), MethodError, "use --method threshold"),
    ("ssd", dict(draft_length=9), ValueError, "draft_length must be an int in [1, block_length=8]"),
    ("assd", dict(epsilon=-0.1), ValueError, "--epsilon must be a finite number >= 0"),
]


@pytest.mark.parametrize("name,options,exc,words", API_CONFIG_CASES)
def test_api_config_errors(name, options, exc, words):
    with pytest.raises(exc) as e:
        get_method(name).configure(options)
    assert words in str(e.value) and "\n" not in str(e.value)


API_RUN_CASES = [  # (method, inputs, exception, words)
    ("ar", [[1.0, 2.0]], TypeError, "prompt 0 holds 1.0 (float): prompts must be int token ids"),
    ("ar", "def f():", TypeError, "prompts must be a list, one entry per row; got a str"),
    ("ngram", ["def f():"], TypeError, "prompt 0 is a str"),
    ("ar", [1, 2, 3], TypeError, "got one list of ids: pass [ids]"),
    ("ar", [[]], ValueError, "prompt 0 is empty"),
    ("ar", [], ValueError, "no inputs given"),
    ("ssd", [[1, 2]], MethodError, "ssd needs a dllm model (got a causal model)"),
    ("assd", [[1, 2]], MethodError, "assd needs an asarm model (got a causal model)"),
    ("space", [[1, 2]], ValueError, "needs a SAR-SFT model with a [MASK] token"),
    ("sps", [[1, 2]], ValueError, "method 'sps' needs a causal draft model"),
    ("ar", np.ones((1, 2, 3), int), TypeError, "of shape (B, T); got shape (1, 2, 3), dtype int"),
    ("ar", np.ones((1, 3)), TypeError, "of shape (B, T); got shape (1, 3), dtype float64"),
    ("ar", np.arange(3), TypeError, "got shape (3,), dtype int64 (one prompt: pass ids[None])"),
]


@pytest.mark.parametrize("name,inputs,exc,words", API_RUN_CASES)
def test_api_run_errors(causal, name, inputs, exc, words):
    model, params = causal
    with pytest.raises(exc) as e:
        run(name, model, params, inputs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_api_run_takes_prompts_as_one_2d_int_array(causal):
    """A numpy or JAX int array ``(B, T)`` decodes as its ``B`` rows given as lists."""
    import jax.numpy as jnp

    model, params = causal
    ids = [[1, 2, 3], [4, 5, 6]]
    config = get_method("ngram").configure(max_new_tokens=6)
    want = run("ngram", model, params, ids, config).tokens
    assert run("ngram", model, params, np.array(ids), config).tokens == want
    assert run("ngram", model, params, jnp.asarray(ids, jnp.int32), config).tokens == want


def test_api_draft_length_past_the_context(causal):
    model, params = causal
    k = model.config.max_position_embeddings - 2 - 8 + 1  # one draft position too many
    assert 1 <= k <= 1024
    config = get_method("ngram").configure(max_new_tokens=8, draft_length=k)
    with pytest.raises(ValueError, match=r"does not fit: prompt of 2 tokens \+ 8 new tokens"):
        run("ngram", model, params, [[1, 2]], config)


def test_api_wrong_config_type(causal):
    model, params = causal
    with pytest.raises(TypeError, match="takes a NgramConfig, got CausalConfig"):
        run("ngram", model, params, [[1, 2]], get_method("ar").configure())


def test_acceptance_is_na_when_nothing_was_drafted():
    import numpy as np

    from jaxspec.core.method_config import acceptance
    from jaxspec.core.stats import DecodeStats

    z = np.zeros(1, int)
    stats = DecodeStats("ngram", "ar", z + 4, z, z + 3, np.array([[0, 3, 0]]), z + 3, 4, z)
    assert acceptance(stats) == "n/a"
    assert acceptance(DecodeStats("ar", "ar", z, z, z, np.zeros((1, 2), int), z, 0)) == "-"
