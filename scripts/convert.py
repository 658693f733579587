"""Convert checkpoints between Hugging Face / GGUF layouts and the jaxspec format.

    python -m scripts.convert --to jaxspec SRC OUT   # HF dir (Llama, Qwen2, LLaDA, Dream) or GGUF
    python -m scripts.convert --to hf SRC OUT        # jaxspec checkpoint -> HF layout

``--to jaxspec`` streams: tensors are read one at a time and each assembled parameter is
written to its own file at once (:func:`models.checkpoint.convert_streaming`), so a
multi-shard checkpoint bigger than host memory converts; the HF export is written one shard
per decoder layer. Bad input (missing/corrupt files, unknown layout) gives one ``error:``
line and exit code 2.

Both directions give the output the source's tokenizer (:func:`models.checkpoint.copy_tokenizer`):
the tokenizer files of a source directory are copied, a GGUF source's embedded tokenizer is
written as ``tokenizer.json`` + ``tokenizer_config.json``; so ``--model auto --weights OUT``
works. A source without a tokenizer (or a GGUF tokenizer that cannot be built) gives a
``warning:`` line; the converted weights are kept.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.convert", description=__doc__.split("\n")[0])
    ap.add_argument("--to", choices=("jaxspec", "hf"), required=True, help="target format")
    ap.add_argument("src", help="source checkpoint (directory or .gguf)")
    ap.add_argument("out", help="output directory")
    args = ap.parse_args(argv)
    from models.checkpoint import convert_streaming, copy_tokenizer, export_hf
    from models.registry import load_any
    from models.config import ConfigError
    from models.llama.params import WeightFileError

    src, out = Path(args.src), Path(args.out)
    try:
        if not src.exists():
            raise WeightFileError(f"{src}: does not exist")
        if args.to == "jaxspec":  # one parameter in host memory at a time
            path, config = convert_streaming(src, out, load_any)
        else:
            config, params = load_any(src)
            path = export_hf(out, config, params)
    except (WeightFileError, ConfigError, ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        copied = copy_tokenizer(src, path)
    except (WeightFileError, OSError) as e:  # TokenizerError is a WeightFileError
        print(f"warning: {path}: no tokenizer written ({e})", file=sys.stderr)
        copied = None
    if copied == []:
        print(f"warning: {src} has no tokenizer files, so {path} has none: add a tokenizer.json "
              f"before loading it with --model auto", file=sys.stderr)
    kind = type(config).__name__
    tok = f"; tokenizer: {', '.join(copied)}" if copied else ""
    print(f"converted {src} -> {path} ({args.to}, {kind}{tok})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
