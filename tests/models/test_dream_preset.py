"""The ``dream-smollm2-135m`` preset (SmolLM2 base + committed LoRA delta, a Dream-style
masked-diffusion LM) and the diffusion methods of ``scripts.generate``: loading, corrupt or
missing deltas, CLI bad-input paths (exit 2) and one real stepwise run."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import models.registry as presets
from models.diffusion.delta import LORA_TARGETS
from models.llama.params import WeightFileError
from models.registry import PresetError, get_preset, load_model, sha256_of
from scripts import generate as gen_cli

NAME = "dream-smollm2-135m"
REAL = get_preset(NAME)  # read before any test swaps the preset directory


def test_preset_fields_and_committed_delta_hash():
    p = get_preset(NAME)
    assert (p.format, p.base, p.head, p.mask_token_id) == (
        "delta",
        "smollm2-135m-instruct",
        "dream",
        16,
    )
    assert p.is_diffusion and not get_preset("smollm2-135m-instruct").is_diffusion
    assert p.delta == "checkpoints/dream-smollm2-135m-v2/delta.safetensors"  # v2 is the default
    assert sha256_of(presets.delta_path(p)) == p.sha256
    assert NAME in presets.available()
    v1 = get_preset("dream-smollm2-135m-v1")  # issue 15: v1 stays loadable, same base and head
    assert v1.delta == "checkpoints/dream-smollm2-135m-v1/delta.safetensors"
    assert (v1.base, v1.head, v1.mask_token_id) == (p.base, p.head, p.mask_token_id)
    assert sha256_of(presets.delta_path(v1)) == v1.sha256 != p.sha256


@pytest.fixture
def preset_dir(tmp_path, monkeypatch):
    """A private preset directory holding the base preset; ``write(**fields)`` adds a delta
    preset named ``bad`` (absolute delta path) to it."""
    d = tmp_path / "presets"
    d.mkdir()
    shutil.copyfile(
        presets.CONFIG_DIR / "smollm2-135m-instruct.yaml", d / "smollm2-135m-instruct.yaml"
    )
    monkeypatch.setattr(presets, "CONFIG_DIR", d)

    def write(**fields):
        base = dict(
            name="bad",
            format="delta",
            base="smollm2-135m-instruct",
            delta=str(tmp_path / "delta.safetensors"),
            sha256="0" * 64,
            head="dream",
            mask_token_id=16,
        )
        base.update(fields)
        (d / "bad.yaml").write_text(
            "".join(f"{k}: {v}\n" for k, v in base.items() if v is not None)
        )
        return tmp_path / "delta.safetensors"

    return write


def _real_delta():
    return presets.delta_path(REAL)


def test_missing_delta(preset_dir):
    preset_dir()
    with pytest.raises(WeightFileError, match="does not exist"):
        load_model("bad")


def test_corrupt_delta_fails_sha256(preset_dir):
    path = preset_dir(sha256=REAL.sha256)
    data = bytearray(_real_delta().read_bytes())
    data[5000] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(WeightFileError, match=r"corrupt \(sha256"):
        load_model("bad")


def test_unreadable_delta_with_matching_hash(preset_dir, tmp_path):
    junk = tmp_path / "delta.safetensors"
    junk.write_bytes(b"this is not safetensors" * 20)
    preset_dir(sha256=sha256_of(junk))
    with pytest.raises(WeightFileError, match="not a readable safetensors delta"):
        load_model("bad")


def test_delta_metadata_must_match_preset(preset_dir):
    path = preset_dir(sha256=REAL.sha256, mask_token_id=17)
    shutil.copyfile(_real_delta(), path)
    with pytest.raises(PresetError, match="mask_token_id=16 disagrees"):
        load_model("bad")


def test_malformed_delta_preset(preset_dir):
    preset_dir(head=None)
    with pytest.raises(PresetError, match="delta preset lacks head"):
        get_preset("bad")


def test_cli_corrupt_delta_exit_2(preset_dir, capsys):
    preset_dir()
    assert gen_cli.main(["--model", "bad", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "delta file" in err and "\n" not in err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", NAME, "--method", "ar"], "method 'ar' needs a causal model"),
        (["--model", NAME, "--method", "ngram"], "method 'ngram' needs a causal model"),
        (
            ["--method", "stepwise"],
            "needs a masked-diffusion model, but 'smollm2-135m-instruct' is causal",
        ),
        (["--method", "threshold", "--threshold", "0.9"], "needs a masked-diffusion model"),
        (["--model", "hf-directory", "--method", "fixed-k"], "needs --weights PATH"),
        (["--method", "ngram", "--tokens-per-step", "2"], "--tokens-per-step does not apply"),
        (["--model", NAME, "--method", "medusa"], "unknown method 'medusa'"),
        (["--model", NAME, "--method", "fixed-k"], "method 'fixed-k' needs --tokens-per-step K"),
        (["--model", NAME, "--method", "threshold"], "method 'threshold' needs --threshold T"),
        (
            ["--model", NAME, "--gen-length", "12"],
            "gen_length 12 is not a multiple of block_length 8",
        ),
        (["--model", NAME, "--gen-length", "16", "--steps", "3"], "steps 3 is not divisible"),
        (["--model", NAME, "--remasking", "greedy"], "unknown remasking 'greedy'"),
        (["--model", NAME, "--tokens-per-step", "0"], "tokens_per_step must be >= 1"),
        (["--model", NAME, "--tokens-per-step", "2", "--threshold", "0.5"], "exclusive"),
        (
            ["--model", NAME, "--remasking", "origin", "--threshold", "0.5"],
            "only works with stepwise",
        ),
        (["--model", NAME, "--temperature", "-1"], "temperature must be >= 0"),
        (
            ["--model", NAME, "--method", "ssd", "--threshold", "0.9"],
            "--threshold does not apply to --method ssd",
        ),
        (
            ["--model", NAME, "--method", "ssd", "--draft-length", "9"],
            "draft_length must be an int in [1, block_length=8]",
        ),
        (
            ["--model", NAME, "--method", "ssd", "--cache", "prefix"],
            "SSD supports cache 'none' or 'dual'",
        ),
        (["--method", "ngram", "--cache", "dual"], "--cache does not apply to --method ngram"),
    ],
)
def test_cli_diffusion_bad_input_exit_2(args, needle, capsys):
    assert gen_cli.main(args + ["--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err, err


# ------------------------------------------------------------------ real weights
@pytest.mark.real
def test_merged_params_differ_from_base_exactly_in_the_delta(smollm2_gguf):
    model, merged, tok, preset = load_model(NAME, str(smollm2_gguf), log=lambda m: None)
    _, base, _, _ = load_model("smollm2-135m-instruct", str(smollm2_gguf), log=lambda m: None)
    from models.diffusion.modeling import DiffusionLM

    assert isinstance(model, DiffusionLM) and preset.name == NAME
    assert (model.config.head, model.config.mask_token_id) == ("dream", 16)
    assert tok.vocab_size == model.config.vocab_size == 49152
    for name in LORA_TARGETS + ("attn_norm", "mlp_norm"):
        a, b = np.asarray(merged["layers"][name]), np.asarray(base["layers"][name])
        assert a.shape == b.shape and not np.array_equal(a, b), name
    assert set(merged["layers"]) == set(LORA_TARGETS) | {"attn_norm", "mlp_norm"}
    assert not np.array_equal(np.asarray(merged["final_norm"]), np.asarray(base["final_norm"]))
    emb_m, emb_b = np.asarray(merged["embed"]), np.asarray(base["embed"])
    rows = np.flatnonzero(np.any(emb_m != emb_b, axis=1))
    assert rows.tolist() == [16]
    assert set(merged) == set(base)


@pytest.mark.real
# `make test-all`: the CLI path of stepwise on real weights (21 s); the real goldens run the
# decoder
@pytest.mark.slow
def test_real_cli_stepwise(smollm2_gguf, capsys):
    rc = gen_cli.main(
        [
            "--model",
            NAME,
            "--weights",
            str(smollm2_gguf),
            "--method",
            "stepwise",
            "--gen-length",
            "16",
            "--block-length",
            "8",
            "--prompt",
            "def add(a, b):",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "def add(a, b):" in out
    line = [ln for ln in out.splitlines() if ln.startswith("[stepwise] ")]
    assert len(line) == 1 and "NFE=16" in line[0] and "tokens/s=" in line[0]
    assert "compile=" in line[0] and "distinct=" in line[0] and "rep4=" in line[0]


@pytest.mark.real
# `make test-all`: 32 s; the chain tree with the dual cache is a real golden in `make test`
@pytest.mark.slow
def test_real_cli_ssd_lossless(smollm2_gguf, capsys):
    """SSD on the real adapted model reproduces stepwise decoding through the CLI (a short
    prompt, no cache, mix-order; the chain tree with the dual cache is a real golden case)."""
    for extra in (["--cache", "none", "--tree", "mix-order"],):
        rc = gen_cli.main(
            [
                "--model",
                NAME,
                "--weights",
                str(smollm2_gguf),
                "--method",
                "ssd",
                "--gen-length",
                "16",
                "--block-length",
                "8",
                "--draft-length",
                "3",
                "--prompt",
                "def add(a, b):",
                "--compare",
                "--quiet",
                *extra,
            ]
        )
        out = capsys.readouterr().out
        assert rc == 0, out
        assert "outputs: identical" in out and "step_reduction=" in out


@pytest.mark.real
# `make test-all`: 27 s; SSD's identity is tested on tiny models and a real golden
@pytest.mark.slow
def test_dlm_tiny_preset_ssd(smollm2_gguf, monkeypatch, capsys):
    """The random ``dlm-tiny`` preset (SmolLM2 tokenizer from the cache) decodes with SSD."""
    monkeypatch.setenv("JAXSPEC_CACHE", str(smollm2_gguf.parent))
    if smollm2_gguf.name != "SmolLM2-135M-Instruct.Q4_1.gguf":
        pytest.skip("dlm-tiny reads the tokenizer from the cached smollm2 preset file")
    rc = gen_cli.main(
        [
            "--model",
            "dlm-tiny",
            "--method",
            "ssd",
            "--gen-length",
            "16",
            "--block-length",
            "8",
            "--compare",
            "--quiet",
            "--prompt",
            "def f(x):",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "outputs: identical" in out, out
    model, _, tok, preset = load_model("dlm-tiny", log=lambda m: None)
    assert preset.is_diffusion and model.config.head == "llada" and model.config.mask_token_id == 16
    assert model.config.base.hidden_size == 128 and tok.vocab_size == 49152
    with pytest.raises(Exception, match="takes no --weights"):
        load_model("dlm-tiny", weights="x")
