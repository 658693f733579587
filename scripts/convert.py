"""Convert checkpoints between Hugging Face / GGUF layouts and the jaxspec format.

    python -m scripts.convert --to jaxspec SRC OUT   # HF dir (Llama, Qwen2, LLaDA, Dream) or GGUF
    python -m scripts.convert --to hf SRC OUT        # jaxspec checkpoint -> HF layout

Tensors are read one at a time (streaming loaders) and the HF export is written one shard
per decoder layer. Bad input (missing/corrupt files, unknown layout) gives one ``error:``
line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DIFFUSION_TYPES = ("llada", "dream")


def load_any(src: Path):
    """Load SRC as (config, params): native checkpoint, LLaDA/Dream dir, Llama/Qwen2 dir or GGUF."""
    from models.checkpoint import is_native, load_checkpoint
    from models.diffusion.params import load_diffusion_dir
    from models.llama.params import load_weights

    if is_native(src):
        return load_checkpoint(src)
    cfg = src / "config.json"
    if src.is_dir() and cfg.is_file():
        try:
            model_type = str(json.loads(cfg.read_text()).get("model_type", "")).lower()
        except ValueError:
            model_type = ""
        if model_type in DIFFUSION_TYPES:
            return load_diffusion_dir(src)
    return load_weights(src)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.convert", description=__doc__.split("\n")[0])
    ap.add_argument("--to", choices=("jaxspec", "hf"), required=True, help="target format")
    ap.add_argument("src", help="source checkpoint (directory or .gguf)")
    ap.add_argument("out", help="output directory")
    args = ap.parse_args(argv)
    from models.checkpoint import export_hf, save_checkpoint
    from models.config import ConfigError
    from models.llama.params import WeightFileError

    src, out = Path(args.src), Path(args.out)
    try:
        if not src.exists():
            raise WeightFileError(f"{src}: does not exist")
        config, params = load_any(src)
        path = save_checkpoint(out, config, params) if args.to == "jaxspec" else export_hf(out, config, params)
    except (WeightFileError, ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kind = type(config).__name__
    print(f"converted {src} -> {path} ({args.to}, {kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
