"""``scripts.convert`` outputs that the other entry points can load (issue 18).

* The converted directory carries the source's tokenizer (copied from an HF / jaxspec
  directory, written from a GGUF file's embedded tokenizer), so
  ``scripts.generate --model auto --weights OUT`` runs and the tokenizer read from ``OUT``
  encodes like the source's.
* A SPACE SAR-SFT model (a causal model with a ``[MASK]`` id) survives ``--to hf``: the id is
  written to ``config.json`` and read back, and ``--method space --compare`` is identical to AR.
"""

from __future__ import annotations

import json
import shutil

import pytest

from models.tokenizer import load_tokenizer
from scripts import convert
from scripts import generate as gen_cli

TEXTS = [
    "def add(a, b):\n    return a + b  # the 12345 result\n",
    "Héllo wörld — naïve café 日本語 🙂 ok",
    "<|im_start|>user\nthe quick fox<|im_end|>\n<|endoftext|>",
]
GEN = ["--method", "ngram", "--compare", "--prompt", "ab", "--max-new-tokens", "8", "--quiet"]


def _same_tokenizer(a, b) -> None:
    msgs = [{"role": "user", "content": "Add 2 and 3."}]
    assert a.apply_chat_template(msgs) == b.apply_chat_template(msgs)
    for text in TEXTS + [a.apply_chat_template(msgs)]:
        assert a.encode(text) == b.encode(text), text
        assert a.encode(text, add_special_tokens=True) == b.encode(text, add_special_tokens=True)
    assert (a.bos_token_id, a.eos_token_ids, a.pad_token_id, a.vocab_size, a.add_bos) == (
        b.bos_token_id,
        b.eos_token_ids,
        b.pad_token_id,
        b.vocab_size,
        b.add_bos,
    )


def _generate_ok(weights, capsys) -> None:
    rc = gen_cli.main(["--model", "auto", "--weights", str(weights)] + GEN)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    compare = [line for line in cap.out.splitlines() if line.startswith("[compare]")]
    assert len(compare) == 1 and "outputs: identical" in compare[0], cap.out


@pytest.mark.parametrize("source", ["hf-dir", "gguf"])
def test_converted_checkpoint_carries_the_tokenizer(
    source, tiny_llama, tiny_gguf, tmp_path, capsys
):
    src = tiny_llama.path if source == "hf-dir" else tiny_gguf(tiny_llama)
    js, hf = tmp_path / "js", tmp_path / "hf"
    assert convert.main(["--to", "jaxspec", str(src), str(js)]) == 0
    assert "tokenizer: tokenizer.json, tokenizer_config.json" in capsys.readouterr().out
    _same_tokenizer(load_tokenizer(js), load_tokenizer(src))
    _generate_ok(js, capsys)
    # and on to the HF layout: from the jaxspec directory, and straight from the source
    assert convert.main(["--to", "hf", str(js), str(hf)]) == 0
    capsys.readouterr()
    assert {p.name for p in js.iterdir() if not p.name.startswith("params")} - {
        "jaxspec_config.json"
    } <= {p.name for p in hf.iterdir()}
    _same_tokenizer(load_tokenizer(hf), load_tokenizer(src))
    _generate_ok(hf, capsys)
    assert convert.main(["--to", "hf", str(src), str(tmp_path / "hf2")]) == 0
    _same_tokenizer(load_tokenizer(tmp_path / "hf2"), load_tokenizer(src))
    if source == "hf-dir":  # every tokenizer file of the source, byte for byte
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            assert (js / name).read_bytes() == (src / name).read_bytes()
    else:  # the GGUF's special tokens and template, by name
        cfg = json.loads((js / "tokenizer_config.json").read_text())
        assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"]) == (
            "<|im_start|>",
            "<|im_end|>",
            "<|endoftext|>",
        )
        assert cfg["chat_template"] == load_tokenizer(src).chat_template


def test_convert_without_tokenizer_warns(tiny_llama, tmp_path, capsys):
    """A source directory without tokenizer files converts, with one ``warning:`` line."""
    src = tmp_path / "no-tok"
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_llama.path / name, src / name)
    assert convert.main(["--to", "jaxspec", str(src), str(tmp_path / "js")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "no tokenizer files" in err[0]
    assert not (tmp_path / "js" / "tokenizer.json").exists()


def test_space_model_survives_hf_export(tiny_qwen2, tmp_path, capsys):
    """A jaxspec SAR-SFT checkpoint (Qwen2 with [MASK] = 299 and the tiny tokenizer) converted
    ``--to hf`` keeps its mask id, and SPACE runs on the HF directory identical to AR; a plain
    causal export has no ``mask_token_id`` and SPACE refuses it with one error line."""
    from jaxspec.testing.tiny import tiny_model
    from models.checkpoint import save_checkpoint

    sar, params = tiny_model(300, arch="qwen2", seed=2, ctx=128, mask_token_id=299)
    save_checkpoint(tmp_path / "sar", sar.config, params)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_qwen2.path / name, tmp_path / "sar" / name)
    assert convert.main(["--to", "hf", str(tmp_path / "sar"), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["mask_token_id"] == 299
    capsys.readouterr()
    argv = [
        "--model",
        "auto",
        "--weights",
        str(tmp_path / "hf"),
        "--method",
        "space",
        "--mask-groups",
        "3",
        "--compare",
        "--prompt",
        "def add(a, b):",
        "--max-new-tokens",
        "12",
        "--quiet",
    ]
    assert gen_cli.main(argv) == 0
    out = capsys.readouterr().out
    compare = [line for line in out.splitlines() if line.startswith("[compare]")]
    assert len(compare) == 1 and "outputs: identical" in compare[0], out

    assert "mask_token_id" not in json.loads((tiny_qwen2.path / "config.json").read_text())
    argv[3] = str(tiny_qwen2.path)  # a plain Qwen2: no [MASK]
    assert gen_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a SAR-SFT model" in err[0], err


@pytest.mark.real
def test_a_preset_exported_as_a_directory_runs_with_model_auto(
    smollm2_gguf, tmp_path, monkeypatch, capsys
):
    """``scripts.convert --to hf PRESET OUT`` writes the preset as loaded (here the random
    ``dlm-tiny`` LLaDA with SmolLM2's tokenizer): the directory loads to the same parameters
    and tokenizer, and SSD runs on it from the CLI identical to stepwise decoding. XLNet
    presets are refused with one line."""
    import numpy as np

    from models.registry import load_model

    monkeypatch.setenv("JAXSPEC_CACHE", str(smollm2_gguf.parent))
    if smollm2_gguf.name != "SmolLM2-135M-Instruct.Q4_1.gguf":
        pytest.skip("dlm-tiny reads the tokenizer from the cached smollm2 preset file")
    out = tmp_path / "dlm-tiny-hf"
    assert convert.main(["--to", "hf", "dlm-tiny", str(out)]) == 0
    assert "converted preset dlm-tiny" in capsys.readouterr().out
    model, params, tok, _ = load_model("dlm-tiny", log=lambda m: None)
    model2, params2, tok2, _ = load_model("auto", str(out), log=lambda m: None)
    assert model2.config == model.config
    for a, b in zip(
        *(
            sorted(
                ((k, np.asarray(v)) for k, v in p.items() if k != "layers"), key=lambda kv: kv[0]
            )
            for p in (params, params2)
        )
    ):
        np.testing.assert_array_equal(a[1], b[1])
    for name in params["layers"]:
        np.testing.assert_array_equal(
            np.asarray(params["layers"][name]), np.asarray(params2["layers"][name])
        )
    _same_tokenizer(tok2, tok)
    rc = gen_cli.main(
        [
            "--model",
            "auto",
            "--weights",
            str(out),
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
    text = capsys.readouterr().out
    assert rc == 0 and "outputs: identical" in text, text
    assert convert.main(["--to", "hf", "asarm-small", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "already a file" in err[0]
