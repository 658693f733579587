"""Slow-tokenizer checkpoints (issue 18): a directory with ``vocab.json`` + ``merges.txt`` and
added tokens but no ``tokenizer.json`` (Dream-v0's layout) loads through
:meth:`models.tokenizer.Tokenizer.from_hf_dir`, which builds the tokenizer in memory
(:func:`models.tokenizer.slow_bpe_tokenizer`). It must tokenize like the fast tokenizer the
layout was written from and like transformers' own ``Qwen2Tokenizer`` reading the same files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from models.tokenizer import Tokenizer, TokenizerError, load_tokenizer, slow_bpe_tokenizer

# added after the tiny BPE's 300 ids, as Dream-v0 adds its mask token after Qwen2.5's ids
MASK, TOOL = "<|mask|>", "<tool_call>"
TEXTS = [
    "def add(a, b):\n    return a + b  # the 12345 result\n",
    "Héllo wörld — naïve café 日本語 🙂 ok",
    "  leading spaces and trailing   ",
    "it's they're I'll 1,000,000.00\r\n\tthe\n\n\nend",
    "<|im_start|>user\nthe quick fox<|im_end|>\n",
    f"<|im_start|>assistant\nx = {MASK}{MASK} + 1{TOOL}call(){TOOL}<|endoftext|>",
    "e\u0301t\u00e9",  # NFC: 'e' + combining acute becomes 'é'
]


def _fast_with_added(src: Path):
    """The fixture's ``tokenizer.json`` plus ``MASK`` (special, id 300) and ``TOOL``
    (non-special, id 301): the fast tokenizer the slow layout below stands for."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    fast = HFTokenizer.from_file(str(src / "tokenizer.json"))
    fast.add_special_tokens([AddedToken(MASK, special=True, normalized=False)])
    fast.add_tokens([AddedToken(TOOL, special=False, normalized=False)])
    assert (fast.token_to_id(MASK), fast.token_to_id(TOOL)) == (300, 301)
    return fast


def _slow_dir(src: Path, dst: Path, tokenizer_class="Qwen2Tokenizer") -> Path:
    """``dst`` with the slow layout of ``src``'s tokenizer: ``vocab.json`` + ``merges.txt``,
    the control tokens in ``added_tokens.json``, and ``MASK`` / ``TOOL`` in the
    ``added_tokens_decoder`` of ``tokenizer_config.json`` (special tokens, template kept)."""
    from tokenizers import Tokenizer as HFTokenizer

    dst.mkdir(parents=True)
    tj = json.loads((src / "tokenizer.json").read_text())
    HFTokenizer.from_file(str(src / "tokenizer.json")).model.save(str(dst))
    (dst / "added_tokens.json").write_text(
        json.dumps({t["content"]: t["id"] for t in tj["added_tokens"]})
    )
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = tokenizer_class
    cfg["added_tokens_decoder"] = {
        "300": {"content": MASK, "special": True, "normalized": False},
        "301": {"content": TOOL, "special": False, "normalized": False},
    }
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not (dst / "tokenizer.json").exists()
    return dst


def test_slow_layout_tokenizes_like_the_fast_tokenizer(tiny_qwen2, tmp_path):
    fast = _fast_with_added(tiny_qwen2.path)
    d = _slow_dir(tiny_qwen2.path, tmp_path / "slow")
    slow = load_tokenizer(d)  # a directory: Tokenizer.from_hf_dir
    ref_cfg = Tokenizer.from_hf_dir(tiny_qwen2.path)
    assert slow.vocab_size == 302
    assert slow.backend.get_vocab(with_added_tokens=True) == fast.get_vocab(with_added_tokens=True)
    for text in TEXTS:
        ids = slow.encode(text)
        assert ids == fast.encode(text, add_special_tokens=False).ids, text
        assert slow.decode(ids, skip_special_tokens=False) == fast.decode(
            ids, skip_special_tokens=False
        )
        assert slow.decode(ids) == fast.decode(ids), text
    assert slow.encode(MASK) == [300] and slow.encode(TOOL) == [301]
    assert slow.decode([300, 301, 72]) == fast.decode([300, 301, 72]) == TOOL + fast.decode([72])
    # special tokens and chat template come from tokenizer_config.json as for a fast directory
    assert (
        (slow.bos_token_id, slow.eos_token_ids, slow.pad_token_id)
        == (ref_cfg.bos_token_id, ref_cfg.eos_token_ids, ref_cfg.pad_token_id)
        == (1, (2,), 0)
    )
    msgs = [{"role": "user", "content": f"fill {MASK} in"}]
    assert slow.apply_chat_template(msgs) == ref_cfg.apply_chat_template(msgs)


def test_slow_layout_matches_transformers_qwen2_tokenizer(tiny_qwen2, tmp_path):
    """transformers reads the same slow files with its ``Qwen2Tokenizer``: an independent
    reference for the normalizer / split / added-token handling."""
    transformers = pytest.importorskip("transformers")
    d = _slow_dir(tiny_qwen2.path, tmp_path / "slow")
    ref = transformers.AutoTokenizer.from_pretrained(str(d))
    assert type(ref).__name__.startswith("Qwen2Tokenizer")
    slow = Tokenizer.from_hf_dir(d)
    for text in TEXTS:
        assert slow.encode(text) == ref.encode(text, add_special_tokens=False), text


def test_slow_layout_errors(tiny_qwen2, tmp_path):
    d = _slow_dir(tiny_qwen2.path, tmp_path / "gap")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"]["305"] = cfg["added_tokens_decoder"].pop(
        "301"
    )  # ids 302..304 missing
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match=r"'<tool_call>' should have id 305, got 301"):
        Tokenizer.from_hf_dir(d)

    d = _slow_dir(tiny_qwen2.path, tmp_path / "gpt2", tokenizer_class="GPT2Tokenizer")
    with pytest.raises(TokenizerError, match="tokenizer_class 'GPT2Tokenizer'.*not supported"):
        Tokenizer.from_hf_dir(d)

    d = _slow_dir(tiny_qwen2.path, tmp_path / "no-merges")
    (d / "merges.txt").unlink()
    with pytest.raises(
        TokenizerError, match=r"tokenizer\.json: file is missing .*vocab\.json \+ merges\.txt"
    ):
        Tokenizer.from_hf_dir(d)
    with pytest.raises(TokenizerError, match=r"merges\.txt: file is missing"):
        slow_bpe_tokenizer(d)

    d = shutil.copytree(tmp_path / "gpt2", tmp_path / "bad-vocab")
    (d / "vocab.json").write_text("[1, 2")
    (d / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match="not a readable BPE"):
        Tokenizer.from_hf_dir(d)


def test_notebook_cli_writes_the_same_tokenizer(tiny_qwen2, tmp_path):
    """``notebooks/tokenizer_json.py`` (kept for the Colab notebook) saves the library's
    tokenizer: the written ``tokenizer.json`` loads and encodes like the in-memory build."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "tokenizer_json", Path(__file__).resolve().parents[2] / "notebooks" / "tokenizer_json.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = _slow_dir(tiny_qwen2.path, tmp_path / "slow")
    in_memory = Tokenizer.from_hf_dir(d)
    assert mod.main([str(d)]) == 0
    assert (d / "tokenizer.json").is_file()
    written = Tokenizer.from_hf_dir(d)
    for text in TEXTS:
        assert written.encode(text) == in_memory.encode(text), text
    assert mod.main([str(tmp_path / "missing")]) == 2
