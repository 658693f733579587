"""Write ``tokenizer.json`` for a checkpoint that ships a slow Qwen2-style tokenizer.

jaxspec's loader (:meth:`models.tokenizer.Tokenizer.from_hf_dir`) builds the tokenizer in memory
from ``vocab.json`` + ``merges.txt`` and the added tokens of ``added_tokens.json`` /
``tokenizer_config.json`` when ``tokenizer.json`` is missing (Dream-v0's layout;
:func:`models.tokenizer.slow_bpe_tokenizer`). This saves that tokenizer as ``tokenizer.json``,
for other tools and so later loads skip the build:

    .venv/bin/python notebooks/tokenizer_json.py DIR [DIR ...]

The Colab notebook calls :func:`write_tokenizer_json` for every checkpoint directory that
lacks ``tokenizer.json``; ``tests/test_notebook.py`` checks the result tokenizes like the
original on a tiny tokenizer.
"""

from __future__ import annotations

import sys
from pathlib import Path

from models.tokenizer import slow_added_tokens, slow_bpe_tokenizer


def write_tokenizer_json(d) -> tuple[int, int]:
    """Write ``d/tokenizer.json`` built by :func:`models.tokenizer.slow_bpe_tokenizer` from
    ``d/vocab.json`` + ``d/merges.txt`` and the recorded added tokens.

    Returns:
      ``(ids, added)``: the tokenizer's id count including added tokens, and how many added
      tokens were recorded.

    Raises:
      models.tokenizer.TokenizerError (a ValueError): a file is missing or unreadable, or an
        added token would not land on its recorded id.
    """
    d = Path(d)
    tok = slow_bpe_tokenizer(d)
    tok.save(str(d / "tokenizer.json"))
    return tok.get_vocab_size(with_added_tokens=True), len(slow_added_tokens(d))


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
