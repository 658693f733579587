"""Build a DFlash draft vocabulary: the target's most frequent answer tokens.

    python -m scripts.draft_vocab --distill FILE [FILE ...] --size 8192 \
        --out checkpoints/dflash-smollm2-135m/draft-vocab-8192.npy

Counts the answer tokens of the ``train`` rows of self-distillation files (the target's own
continuations, ``scripts.distill``), keeps the ``--size`` most frequent ids plus the model's EOS
ids (:func:`jaxspec.causal.dflash.build_draft_vocab`), and saves them with ``numpy.save``
(sorted int32). Prints the share of answer tokens the vocabulary covers on the train rows and
on the ``val`` rows (not counted; a held-out figure). Load it with ``--dflash-draft-vocab`` of
``scripts.generate`` and ``scripts.benchmark``: the drafter's LM head then runs on those rows
only (exact either way; the uncovered share bounds how often a draft can be right).

Bad input (a missing or corrupt file, no train rows, a size below 1, ids outside the model's
vocabulary) is a one-line error, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.draft_vocab", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--distill", nargs="+", required=True, help="self-distillation files")
    ap.add_argument("--size", type=int, default=8192, help="ids kept (EOS ids included)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="the target's preset")
    ap.add_argument("--out", required=True, help="the .npy file to write")
    return ap


def coverage(rows, vocab: np.ndarray) -> tuple[float, int]:
    """``(share of answer tokens in vocab, answer tokens)`` of ``rows``."""
    ids = np.concatenate([np.asarray(r["answer"], np.int64) for r in rows] or [np.zeros(0)])
    return (float(np.isin(ids, vocab).mean()) if ids.size else float("nan")), int(ids.size)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.causal.dflash import build_draft_vocab, check_draft_vocab
    from jaxspec.training.data import DataError
    from jaxspec.training.distill import read_distill
    from models.registry import PresetError, load_tokenizer_preset, tokenizer_vocab_size

    try:
        if args.size < 1:
            raise ValueError(f"--size must be >= 1, got {args.size}")
        rows = []
        for f in args.distill:
            if not Path(f).is_file():
                raise ValueError(f"{f}: distillation file does not exist")
            rows += read_distill(f)
        train = [r for r in rows if r.get("split") == "train"]
        val = [r for r in rows if r.get("split") == "val"]
        if not train:
            raise ValueError(f"no train rows in {' '.join(args.distill)}")
        tok = load_tokenizer_preset(args.model, log=lambda m: print(m, file=sys.stderr))
        vocab = build_draft_vocab((r["answer"] for r in train), args.size, always=tok.eos_token_ids)
        check_draft_vocab(vocab, tokenizer_vocab_size(tok))
    except (ValueError, DataError, PresetError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, vocab)
    (train_cov, train_n), (val_cov, val_n) = coverage(train, vocab), coverage(val, vocab)
    print(
        json.dumps(
            {
                "out": str(out),
                "size": int(vocab.size),
                "train_answer_tokens": train_n,
                "train_coverage": round(train_cov, 5),
                "val_answer_tokens": val_n,
                "val_coverage": round(val_cov, 5),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
