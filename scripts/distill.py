"""Self-distillation data for SPACE's SAR-SFT: the base model's greedy answers to stdlib prompts.

    python -m scripts.distill --config configs/train/smollm2-135m-space-distill.yaml \
        [--prompts 2000] [--val-prompts 64] [--max-new-tokens 192] [--batch 8] [--bucket 64] \
        [--chat-fraction 0.5] [--source stdlib|prose|magpie] [--flip-kinds] [--queries FILE] \
        [--code-root DIR ...] [--out FILE] [--no-progress]

The model is the config's ``model.preset`` (the SAR model's base), the prompts come from the
stdlib functions of the config's training split (``--val-prompts`` from its held-out modules),
or, with ``--source prose``, chat-template instructions over news documents and stdlib module
docstrings (``jaxspec.training.distill.prose_prompts``; ``--chat-fraction`` unused), or, with
``--source magpie``, queries the model samples itself from its chat template's pre-query part
(``jaxspec.training.magpie``: chat prompts, and HumanEval-style function stubs for the code
share), kept in ``--queries`` (default: the output file's name with ``.queries.jsonl``);
``--flip-kinds`` asks for every drawn function in the other template (chat <-> code) than an
earlier file with the same ``--seed`` and ``--chat-fraction`` used; ``--code-root DIR ...``
draws the train functions from installed packages' sources instead of the stdlib (the held-out
prompts stay the stdlib's). The answers are appended to ``--out`` (default: the config's
``data.distill``) as JSON lines (:mod:`jaxspec.training.distill`). Rerunning the same command
resumes: prompts already answered are skipped. Exit code 2 with one ``error:`` line on a bad
config or argument.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from scripts.common import add_compile_cache_flag

    ap = argparse.ArgumentParser(
        prog="python -m scripts.distill", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--config", required=True, help="configs/train/NAME.yaml (a SAR config)")
    ap.add_argument("--prompts", type=int, default=2000, help="training prompts (default 2000)")
    ap.add_argument(
        "--val-prompts",
        type=int,
        default=64,
        help="held-out prompts, from the config's hold-out modules (default 64)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=192, help="answer budget (default 192)")
    ap.add_argument("--batch", type=int, default=8, help="prompts per decode batch (default 8)")
    ap.add_argument(
        "--bucket",
        type=int,
        default=64,
        help="prompt lengths round up to a multiple of this: one compile per bucket "
        "(default 64; 256 on an accelerator)",
    )
    ap.add_argument(
        "--chat-fraction",
        type=float,
        default=0.5,
        help="share of prompts in the chat template (the rest: code continuation)",
    )
    ap.add_argument(
        "--source",
        choices=("stdlib", "prose", "magpie"),
        default="stdlib",
        help="stdlib: function prompts (chat and code); prose: chat instructions over news "
        "documents and module docstrings; magpie: queries the model samples itself (chat, "
        "and function stubs for the code share) (default stdlib)",
    )
    ap.add_argument(
        "--queries",
        default=None,
        help="magpie: the sampled queries' JSON-lines file, reused by a rerun (default: --out "
        "with .queries.jsonl)",
    )
    ap.add_argument("--seed", type=int, default=0, help="prompt order seed")
    ap.add_argument(
        "--flip-kinds",
        action="store_true",
        help="stdlib: every drawn function in the other template (chat <-> code) than "
        "the same --seed and --chat-fraction give without it: new prompts for the functions "
        "an earlier file answered",
    )
    ap.add_argument(
        "--code-root",
        nargs="+",
        default=[],
        metavar="DIR",
        help="stdlib: draw the train prompts from the functions of the *.py files under these "
        "directories (installed packages' sources, e.g. .venv/lib/python3.11/site-packages/"
        "networkx) instead of the stdlib's train split; --val-prompts stay the stdlib's "
        "held-out modules",
    )
    ap.add_argument(
        "--out", default=None, help="JSON-lines file (default: the config's data.distill)"
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_compile_cache_flag(ap)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.core.batching import DecodeInputError
    from jaxspec.training.config import TrainConfigError, load_config
    from jaxspec.training.data import DataError
    from jaxspec.training.distill import (
        check_distill_out,
        distill_prompts,
        prose_prompts,
        self_distill,
    )
    from jaxspec.training.magpie import magpie_prompts
    from models.llama.params import WeightFileError
    from models.registry import PresetError, load_model
    from scripts.common import setup_compile_cache

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        for flag, value, least in (
            ("--prompts", args.prompts, 1),
            ("--val-prompts", args.val_prompts, 0),
            ("--max-new-tokens", args.max_new_tokens, 1),
            ("--batch", args.batch, 1),
            ("--bucket", args.bucket, 1),
        ):
            if value < least:
                raise ValueError(f"{flag} must be >= {least}, got {value}")
        if not 0.0 <= args.chat_fraction <= 1.0:
            raise ValueError(f"--chat-fraction must lie in [0, 1], got {args.chat_fraction}")
        if args.flip_kinds and args.source != "stdlib":
            raise ValueError("--flip-kinds applies to --source stdlib only")
        if args.code_root and args.source != "stdlib":
            raise ValueError("--code-root applies to --source stdlib only")
        if args.queries and args.source != "magpie":
            raise ValueError("--queries applies to --source magpie only")
        cfg = load_config(args.config)
        out = args.out or cfg.data.distill
        if not out:
            raise TrainConfigError(f"{args.config} has no data.distill: pass --out FILE")
        if args.source != "magpie" and not cfg.data.holdout:
            raise TrainConfigError(
                f"{args.config} has no data.holdout: the {args.source} prompts are split into "
                "train and held-out by those stdlib modules; use a SAR config such as "
                "configs/train/smollm2-135m-space-distill.yaml"
            )
        if cfg.model.init != "preset" or not cfg.model.preset:
            raise TrainConfigError("self-distillation needs model.init: preset (the base model)")
        if Path(out).is_dir():
            raise ValueError(f"--out {out} is a directory; name a JSON-lines file")
        check_distill_out(out)
        setup_compile_cache(args)
        model, params, tok, _ = load_model(cfg.model.preset, log=log)
        if args.source == "prose":
            make, kw = prose_prompts, dict(seed=args.seed)
        elif args.source == "magpie":
            stem = Path(out).name.removesuffix(".gz").removesuffix(".jsonl")
            queries = args.queries or str(Path(out).with_name(stem + ".queries.jsonl"))

            def make(tok, _holdout, **kw):
                return magpie_prompts(model, params, tok, queries, **kw)

            kw = dict(
                chat_fraction=args.chat_fraction,
                seed=args.seed,
                batch=args.batch,
                bucket=args.bucket,
                progress=not args.no_progress,
            )
        else:
            make, kw = (
                distill_prompts,
                dict(
                    chat_fraction=args.chat_fraction,
                    seed=args.seed,
                    flip_kinds=args.flip_kinds,
                    train_roots=args.code_root,
                ),
            )
        prompts = make(tok, cfg.data.holdout, split="train", n=args.prompts, **kw)
        if args.val_prompts:
            if args.source == "magpie":  # sampled, not split by source: keep train prompts out
                kw["exclude"] = {p["text"] for p in prompts}
            prompts += make(tok, cfg.data.holdout, split="val", n=args.val_prompts, **kw)
        rows = self_distill(
            model,
            params,
            tok,
            prompts,
            out,
            max_new_tokens=args.max_new_tokens,
            batch=args.batch,
            bucket=args.bucket,
            progress=not args.no_progress,
            log=log,
        )
    except (
        TrainConfigError,
        DataError,
        PresetError,
        WeightFileError,
        DecodeInputError,
        ValueError,
        OSError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    answered = sum(len(r["answer"]) for r in rows)
    log(f"[distill] {len(rows)} rows ({answered} answer tokens) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
