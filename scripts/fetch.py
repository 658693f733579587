"""Fetch a model preset's weights into the local cache (sha256-checked, re-fetched if corrupt).

python -m scripts.fetch --model smollm2-135m-instruct [--print-path]
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.fetch", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="preset name")
    ap.add_argument("--print-path", action="store_true", help="print only the local file path")
    args = ap.parse_args(argv)
    from models.registry import PresetError, fetch

    try:
        path = fetch(args.model)
    except PresetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path if args.print_path else f"{args.model}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
