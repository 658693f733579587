"""Build ``tokenizer.json`` for a checkpoint that ships a slow Qwen2-style tokenizer.

jaxspec's loaders (:meth:`models.tokenizer.Tokenizer.from_hf_dir`) read ``tokenizer.json``.
Some checkpoints ship only the slow layout instead: ``vocab.json`` + ``merges.txt`` and their
added tokens in ``added_tokens.json`` / the ``added_tokens_decoder`` of
``tokenizer_config.json`` (Dream-v0, whose tokenizer is Qwen2.5's plus its mask token, per the
Dream repository's issues DreamLM/Dream#54 and #81). This writes the equivalent fast tokenizer
with the ``tokenizers`` library: byte-level BPE, NFC normalization and Qwen2's pre-tokenizer
split (:data:`models.tokenizer.QWEN2_SPLIT`), the added tokens at their recorded ids.

    .venv/bin/python notebooks/tokenizer_json.py DIR [DIR ...]

The Colab notebook calls :func:`write_tokenizer_json` for every checkpoint directory that
lacks ``tokenizer.json``; ``tests/test_notebook.py`` checks the result tokenizes like the
original on a tiny tokenizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from models.tokenizer import QWEN2_SPLIT


def added_tokens(d: Path) -> dict[int, tuple[str, bool]]:
    """``{id: (content, special)}`` from ``added_tokens.json`` and the ``added_tokens_decoder``
    of ``tokenizer_config.json`` (the latter wins; entries of ``added_tokens.json`` count as
    special)."""
    out: dict[int, tuple[str, bool]] = {}
    if (d / "added_tokens.json").is_file():
        out.update({int(i): (t, True)
                    for t, i in json.loads((d / "added_tokens.json").read_text()).items()})
    if (d / "tokenizer_config.json").is_file():
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        for i, t in (cfg.get("added_tokens_decoder") or {}).items():
            out[int(i)] = (t["content"], bool(t.get("special", True)))
    return out


def write_tokenizer_json(d) -> tuple[int, int]:
    """Write ``d/tokenizer.json`` from ``d/vocab.json`` and ``d/merges.txt`` (Qwen2-style
    byte-level BPE) plus the added tokens of :func:`added_tokens`.

    Returns:
      ``(ids, added)``: the tokenizer's id count including added tokens, and how many added
      tokens were recorded.

    Raises:
      FileNotFoundError: ``vocab.json`` or ``merges.txt`` is missing.
      ValueError: an added token would not land on its recorded id (a gap or a clash in the
        recorded ids).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    d = Path(d)
    for name in ("vocab.json", "merges.txt"):
        if not (d / name).is_file():
            raise FileNotFoundError(f"{d / name}: missing (needed to build tokenizer.json)")
    tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    added = added_tokens(d)
    for i in sorted(added):  # in id order: a new token takes the next free id
        content, special = added[i]
        token = AddedToken(content, special=special, normalized=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        if tok.token_to_id(content) != i:
            raise ValueError(f"{d}: added token {content!r} should have id {i}, "
                             f"got {tok.token_to_id(content)}")
    tok.save(str(d / "tokenizer.json"))
    return tok.get_vocab_size(with_added_tokens=True), len(added)


def main(argv=None) -> int:
    dirs = sys.argv[1:] if argv is None else argv
    if not dirs:
        print("usage: python notebooks/tokenizer_json.py DIR [DIR ...]", file=sys.stderr)
        return 2
    for d in dirs:
        try:
            n, k = write_tokenizer_json(d)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{d}: wrote tokenizer.json ({n} ids, {k} added tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
