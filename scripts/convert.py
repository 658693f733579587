"""Convert checkpoints between Hugging Face / GGUF layouts and the jaxspec format.

    python -m scripts.convert --to jaxspec SRC OUT   # HF dir (Llama, Qwen2, LLaDA, Dream) or GGUF
    python -m scripts.convert --to hf SRC OUT        # jaxspec checkpoint -> HF layout
    python -m scripts.convert --to hf PRESET OUT     # a preset as loaded, e.g. dream-smollm2-135m

SRC may also name a preset (``models.registry``) that is not a path: it is loaded as
``scripts.generate --model PRESET`` loads it (fetched base weights, a trained delta merged in)
and written with its tokenizer, so ``--model auto --weights OUT`` runs the same model (e.g.
``dream-smollm2-135m`` as a Dream directory). The XLNet presets (``asarm-small``) are already a
file that ``--model auto --weights`` reads; they are refused with a line saying so.

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
    from scripts.common import add_compile_cache_flag, setup_compile_cache

    ap = argparse.ArgumentParser(
        prog="python -m scripts.convert", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--to", choices=("jaxspec", "hf"), required=True, help="target format")
    ap.add_argument("src", help="source checkpoint (directory or .gguf)")
    ap.add_argument("out", help="output directory")
    add_compile_cache_flag(ap)
    args = ap.parse_args(argv)
    setup_compile_cache(args)
    from models.checkpoint import convert_streaming, copy_tokenizer, export_hf
    from models.config import ConfigError
    from models.llama.params import WeightFileError
    from models.registry import is_preset, load_any

    src, out = Path(args.src), Path(args.out)
    if not src.exists() and is_preset(args.src):
        return _convert_preset(args.src, out, args.to)
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
        print(
            f"warning: {src} has no tokenizer files, so {path} has none: add a tokenizer.json "
            f"before loading it with --model auto",
            file=sys.stderr,
        )
    kind = type(config).__name__
    tok = f"; tokenizer: {', '.join(copied)}" if copied else ""
    print(f"converted {src} -> {path} ({args.to}, {kind}{tok})")
    return 0


def _convert_preset(name: str, out: Path, to: str) -> int:
    """``--to jaxspec|hf PRESET OUT``: the preset as :func:`models.registry.load_model` loads
    it, written whole (a 135M model: no streaming needed), with its tokenizer."""
    from models.checkpoint import export_hf, save_checkpoint, write_tokenizer
    from models.config import ConfigError
    from models.llama.params import WeightFileError
    from models.registry import PresetError, get_preset, load_model

    try:
        preset = get_preset(name)
        if preset.format == "asarm":
            raise PresetError(
                f"{name!r} is an XLNet AS-ARM whose checkpoint is already a file "
                f"--model auto --weights reads ({preset.checkpoint}); there is no "
                f"HF export of jaxspec XLNet weights"
            )
        if preset.format == "hf_dir":
            raise PresetError(f"{name!r} names no model by itself: give the directory as SRC")
        model, params, tok, _ = load_model(name)
        path = (save_checkpoint if to == "jaxspec" else export_hf)(out, model.config, params)
        written = write_tokenizer(tok, path)
    except (PresetError, WeightFileError, ConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"converted preset {name} -> {path} ({to}, {type(model.config).__name__}; "
        f"tokenizer: {', '.join(written)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
