"""Calibrate Spiffy draft graphs offline (Spiffy Algorithm 2, Eq. 24, Appendix E).

    python -m scripts.calibrate --model dream-smollm2-135m --prompts 20 --sizes 3 5 8 10

Runs the vanilla decoder (greedy stepwise, one token per step, the chosen cache) on
calibration prompts taken from the END of HumanEval (problems ``164 - prompts .. 163``; the
benchmarks evaluate from the start, as the paper calibrates on the last 50 problems and
evaluates on the first 100), records the drafting ranks before every step, and writes for
every ``D`` a graph JSON (``--out-dir/D<D>.json``, loadable with ``--graph`` of
``scripts.generate`` / ``scripts.benchmark``) and its picture (``D<D>.png``). The recorded
runs are cached in ``--out-dir/records.npz`` so other strategies or sizes reuse them
(``--reuse``).

``--model auto --weights DIR`` calibrates any LLaDA / Dream checkpoint directory (the family is
read from its ``config.json``); a causal or AS-ARM checkpoint is a one-line error (exit 2), as
are a bad checkpoint directory and a tokenizer that does not fit the model.

``--dtype`` and ``--mesh`` load the model as ``scripts.generate`` does (``auto``: float32 on CPU,
bfloat16 on GPU/TPU; ``DATAxMODEL`` shards it over a device mesh, :mod:`models.sharding`); a
mesh that does not fit the devices or the model is a one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

HUMANEVAL_PROBLEMS = 164


def build_parser() -> argparse.ArgumentParser:
    from scripts.common import add_compile_cache_flag

    ap = argparse.ArgumentParser(
        prog="python -m scripts.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model",
        default="dream-smollm2-135m",
        help="a masked-diffusion preset, or auto / hf-directory with --weights DIR "
        "(a LLaDA / Dream directory or a diffusion jaxspec checkpoint)",
    )
    ap.add_argument("--weights", default=None, help="override the preset's weight path")
    ap.add_argument(
        "--dtype",
        default="auto",
        help="parameter / activation dtype: auto "
        "(float32 on CPU, bfloat16 on GPU/TPU), float32 or bfloat16",
    )
    ap.add_argument(
        "--mesh",
        default=None,
        metavar="DATAxMODEL",
        help="shard the model over a DATAxMODEL device mesh (e.g. 1x8: weights split "
        "over 8 devices), as scripts.generate does: models.sharding",
    )
    ap.add_argument(
        "--prompts",
        type=int,
        default=20,
        help="calibration prompts, taken from the end of HumanEval (default 20)",
    )
    ap.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[3, 5, 8, 10],
        help="draft budgets D to select (default 3 5 8 10)",
    )
    ap.add_argument(
        "--strategy",
        default="degree-1",
        choices=["degree-1", "degree-0", "total"],
        help="Eq. 24 (degree-1), Eq. 26 (degree-0) or Eqs. 27-28 (total)",
    )
    ap.add_argument("--lookahead", type=int, default=10, help="look-ahead levels (default 10)")
    ap.add_argument(
        "--max-vocab-rank", type=int, default=3, help="vocabulary ranks j recorded (default 3)"
    )
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--cache", default="dual", choices=["none", "dual"])
    ap.add_argument("--remasking", default="low_confidence")
    ap.add_argument("--batch", type=int, default=4, help="prompts per decode call")
    ap.add_argument("--out-dir", default="configs/graphs/dream-smollm2-135m")
    ap.add_argument(
        "--reuse", action="store_true", help="reuse --out-dir/records.npz instead of decoding again"
    )
    add_compile_cache_flag(ap)
    return ap


def _save_records(path: Path, recs) -> None:
    arrs = {}
    for n, r in enumerate(recs):
        for f in ("transfer_step", "tokens", "rank", "top", "ok"):
            arrs[f"{n}_{f}"] = getattr(r, f)
        arrs[f"{n}_block_length"] = np.array(r.block_length)
    np.savez_compressed(path, **arrs)


def _load_records(path: Path):
    from jaxspec.dllm.spiffy import CalibrationRecord

    if not path.exists():
        raise FileNotFoundError(f"--reuse: {path} does not exist; run without --reuse first")
    fields = ("transfer_step", "tokens", "rank", "top", "ok", "block_length")
    try:
        if not zipfile.is_zipfile(path):  # np.load would read it as a pickle and say so
            raise ValueError("not an .npz archive")
        with np.load(path, allow_pickle=False) as z:
            n = len({k.split("_")[0] for k in z.files})
            missing = [f"{i}_{f}" for i in range(n) for f in fields if f"{i}_{f}" not in z.files]
            if not n or missing:
                raise ValueError(f"missing arrays {missing[:3]}" if missing else "no records")
            return [
                CalibrationRecord(
                    z[f"{i}_transfer_step"],
                    z[f"{i}_tokens"],
                    z[f"{i}_rank"],
                    z[f"{i}_top"],
                    z[f"{i}_ok"],
                    int(z[f"{i}_block_length"]),
                )
                for i in range(n)
            ]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as e:
        raise ValueError(
            f"--reuse: {path} is corrupt or not a records file of scripts.calibrate "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); delete "
            f"it and run without --reuse"
        ) from None


def _check_args(args) -> None:
    """Every check that needs no model, first (``ValueError``: exit 2, one line)."""
    if not 1 <= args.prompts <= HUMANEVAL_PROBLEMS:
        raise ValueError(
            f"--prompts must lie in [1, {HUMANEVAL_PROBLEMS}] (the calibration "
            f"prompts come from HumanEval's {HUMANEVAL_PROBLEMS}), got "
            f"{args.prompts}"
        )
    for flag, value in (
        ("--lookahead", args.lookahead),
        ("--sizes", min(args.sizes)),
        ("--max-vocab-rank", args.max_vocab_rank),
        ("--batch", args.batch),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    from models.registry import DTYPES, get_preset, is_preset

    if args.dtype not in DTYPES:
        raise ValueError(f"unknown --dtype {args.dtype!r}; choose one of {', '.join(DTYPES)}")
    if not args.reuse:
        if not is_preset(args.model):
            get_preset(args.model)  # PresetError: unknown model, lists the presets
        if args.weights is not None and not Path(args.weights).exists():
            raise ValueError(f"--weights {args.weights} does not exist")


def _prepare_out_dir(out: Path, reuse: bool):
    """Create ``out``; with ``reuse`` read its ``records.npz`` first (a corrupt file fails
    now). Returns the reused records or None."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out-dir {out} is a file, not a directory")
    recs = _load_records(out / "records.npz") if reuse else None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out-dir {out}: cannot create it ({e.strerror or e})") from None
    return recs


def _run_meta(args) -> dict:
    """The settings every graph file records."""
    return {
        "model": args.model,
        "prompts": args.prompts,
        "gen_length": args.gen_length,
        "block_length": args.block_length,
        "cache": args.cache,
        "remasking": args.remasking,
        "lookahead": args.lookahead,
        "calibration_set": f"HumanEval/{164 - args.prompts}..163",
    }


def _record(args, decode, meta: dict, rec_path: Path, log) -> list:
    """Load the model, decode the calibration prompts (the last ``--prompts`` HumanEval
    problems) in batches recording what the calibration needs, save the records to
    ``rec_path``; ``meta["record_seconds"]`` gets the decode time."""
    from tqdm import tqdm

    from jaxspec.dllm.spiffy import record_calibration
    from jaxspec.eval.datasets import humaneval_problems, humaneval_prompt
    from models.registry import load_model, require_family

    # hf-directory / auto: the family is read from --weights (LLaDA / Dream directories)
    require_family(args.model, args.weights, "dllm", "scripts.calibrate")
    mesh = None
    if args.mesh:  # MeshError (a ValueError): a bad spec or too few devices
        from models.sharding import make_mesh

        mesh = make_mesh(args.mesh)
    model, params, tok, _ = load_model(
        args.model, args.weights, log=log, dtype=args.dtype, mesh=mesh
    )
    probs = humaneval_problems()[-args.prompts :]
    prompts = [tok.encode(humaneval_prompt(p, tok)) for p in probs]
    recs, t0 = [], time.perf_counter()
    for a in tqdm(
        range(0, len(prompts), args.batch),
        desc="calibration runs",
        unit="batch",
        file=sys.stderr,
    ):
        recs.append(
            record_calibration(
                model,
                params,
                prompts[a : a + args.batch],
                decode,
                args.max_vocab_rank,
                eos_ids=tuple(tok.eos_token_ids),
            )
        )
    meta["record_seconds"] = round(time.perf_counter() - t0, 1)
    _save_records(rec_path, recs)
    return recs


def _select_graphs(args, recs: list, meta: dict, out: Path, log) -> dict:
    """One draft graph per ``--sizes`` D from the records' counts, saved as JSON and PNG.
    Returns ``{D: formulas}``."""
    from jaxspec.dllm.spiffy import calibration_counts, plot_graph, save_graph, select_graph

    counts = calibration_counts(recs, args.lookahead)
    summary = {}
    for D in args.sizes:
        g = select_graph(counts, D, args.strategy, meta=meta)
        stem = out / (f"D{D}" if args.strategy == "degree-1" else f"D{D}-{args.strategy}")
        save_graph(g, stem.with_suffix(".json"))
        plot_graph(
            g,
            stem.with_suffix(".png"),
            f"{args.model}: D = {D} ({args.strategy}, {args.prompts} prompts)",
        )
        summary[D] = [[list(p) for p in f] for f in g.formulas]
        log(f"D={D}: {stem.with_suffix('.json')} score {dict(g.meta)['score']:.0f}")
    return summary


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from scripts.common import setup_compile_cache

    log = lambda m: print(m, file=sys.stderr, flush=True)
    from jaxspec.dllm import DiffusionDecodeConfig
    from jaxspec.dllm.spiffy import GraphError

    out = Path(args.out_dir)
    try:
        _check_args(args)
        decode = DiffusionDecodeConfig(
            args.gen_length,
            args.block_length,
            args.gen_length,
            remasking=args.remasking,
            cache=args.cache,
        )
        recs = _prepare_out_dir(out, args.reuse)
        setup_compile_cache(args)
        meta = _run_meta(args)
        if not args.reuse:
            recs = _record(args, decode, meta, out / "records.npz", log)
        summary = _select_graphs(args, recs, meta, out, log)
        print(json.dumps({"strategy": args.strategy, "graphs": summary}))
        return 0
    except (ValueError, GraphError, FileNotFoundError) as e:
        log(f"error: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
