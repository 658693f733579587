"""Train a masked-diffusion LM, AS-ARM or SAR model on the Python stdlib, or a DFlash drafter.

    python -m scripts.train --config configs/train/dlm-tiny.yaml [--out DIR] [--steps N]
        [--resume] [--stop-after N] [--set section.key=value ...] [--no-progress]

Writes ``config.json``, ``checkpoints/<step>/`` (orbax), ``metrics.jsonl``, ``loss.png`` and,
for LoRA configs, ``delta.safetensors`` (for ``objective.kind: dflash``, ``drafter.safetensors``,
for ``scripts.generate --dflash-drafter``) under ``--out`` (default
``$JAXSPEC_CACHE/runs/<config name>``, i.e. ``~/.cache/jaxspec/runs/<name>``). After an
interruption, rerun the same command with ``--resume``: training continues from the latest
checkpoint and reproduces the uninterrupted run exactly (see :mod:`jaxspec.training.loop`).

``--steps`` sets ``train.steps`` (the length of the learning-rate schedule); ``--stop-after``
stops early without changing the schedule.

Exit code 2 with a one-line ``error:`` message on a bad config, an override of the wrong
form, or an output directory that already holds checkpoints without ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from scripts.common import add_compile_cache_flag

    ap = argparse.ArgumentParser(prog="python -m scripts.train", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="configs/train/NAME.yaml")
    ap.add_argument("--out", default=None, help="output directory (default: cache/runs/NAME)")
    ap.add_argument("--steps", type=int, default=None, help="override train.steps")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    ap.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="stop after this many steps (the schedule still spans train.steps)",
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="wall-clock budget: stop cleanly (checkpoint, delta) at the first step "
        "past it; --resume continues the same schedule",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config value (repeatable; VALUE parsed as YAML)",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compile_cache_flag(ap)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.training.config import TrainConfigError, load_config
    from jaxspec.training.data import DataError
    from jaxspec.training.dflash_run import train_dflash
    from jaxspec.training.loop import train
    from models.registry import PresetError
    from scripts.common import setup_compile_cache

    try:
        # every check that needs no model or data first (exit 2, one line)
        overrides = list(args.set)
        if args.steps is not None:
            if args.steps < 1:
                raise TrainConfigError(f"--steps must be >= 1, got {args.steps}")
            overrides.append(f"train.steps={args.steps}")
        if args.stop_after is not None and args.stop_after < 1:
            raise TrainConfigError(f"--stop-after must be >= 1, got {args.stop_after}")
        if args.max_minutes is not None and not 0 < args.max_minutes < float("inf"):
            raise TrainConfigError(
                f"--max-minutes must be a finite value > 0, got {args.max_minutes}"
            )
        cfg = load_config(args.config, overrides)
        out = (
            Path(args.out)
            if args.out
            else Path(os.environ.get("JAXSPEC_CACHE", Path.home() / ".cache" / "jaxspec"))
            / "runs"
            / cfg.name
        )
        if out.exists() and not out.is_dir():
            raise TrainConfigError(f"--out {out} is a file, not a directory")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrainConfigError(f"--out {out}: cannot create it ({e.strerror or e})") from None
        setup_compile_cache(args)
        res = (train_dflash if cfg.objective.kind == "dflash" else train)(
            cfg,
            out,
            resume=args.resume,
            stop_after=args.stop_after,
            max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
            progress=not args.no_progress,
        )
    except (TrainConfigError, DataError, PresetError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    times = res["step_times"]
    steady = times[1:] if len(times) > 1 else times
    sps = sum(steady) / len(steady) if steady else float("nan")
    summary = {
        "out": str(out),
        "step": res["step"],
        "stopped_early": res["stopped_early"],
        "wall_s": round(res["wall_s"], 2),
        "first_step_s (compile)": round(times[0], 2) if times else None,
        "sec_per_step": round(sps, 3),
        "tokens_per_step": res["tokens_per_step"],
        "tokens_per_sec": round(res["tokens_per_step"] / sps, 1) if steady else None,
    }
    for k in ("delta_bytes", "drafter_bytes"):
        if k in res:
            summary[k] = res[k]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
