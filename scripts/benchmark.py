"""Benchmark decoding systems side by side and write JSON plus a markdown table.

    python -m scripts.benchmark --suite ar [--limit N] [--out results/ar.json] \
        [--model smollm2-135m-instruct] [--weights PATH] [--max-new-tokens 128] \
        [--draft-length K] [--systems jaxspec/ar,jaxspec/ngram,...] [--chat]

Suite ``ar``: the first ``--limit`` HumanEval prompts, greedy, batch 1, every system run on
each prompt in turn (interleaved, so noise hits all alike) after one untimed warm-up each.
Systems: ``jaxspec/ar`` (baseline and reference), ``jaxspec/ngram``, ``transformers/ar`` and
``transformers/prompt-lookup`` (PyTorch on the same weight file and the same token ids); on
request (``--systems``) ``jaxspec/sps`` and ``transformers/assisted`` with ``--draft-model NAME``
(e.g. ``--model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct``) and
``jaxspec/space`` with a SAR-SFT ``--model``, and ``jaxspec/ar-int8`` / ``jaxspec/ngram-int8``
(weight-only int8 matrices: their rows report the drift from float ``jaxspec/ar`` and identity
with int8 AR). ``--quant int8`` instead quantizes the model of every jaxspec system (the
transformers peers stay in float). The
markdown report (``--out`` with ``.md``) is also printed, together with the measured
memory-bandwidth ceiling for batch-1 float32 decoding.

Suite ``dllm`` (masked-diffusion decoding, :mod:`jaxspec.bench.dllm`):

    python -m scripts.benchmark --suite dllm [--limit 3] [--model dream-smollm2-135m] \
        [--gen-length 256] [--block-length 32] [--methods stepwise fixed-2 fixed-4 threshold-0.9] \
        [--caches none prefix dual] [--remasking low_confidence] [--out results/dllm.json]

Prompts of suites ``dllm``, ``ssd`` and ``spiffy``: ``--prompt-set long`` (default: HumanEval raw
completions alternating with held-out stdlib function bodies, where the model must write) or
``--prompt-set chat`` (HumanEval in the chat template alternating with MT-Bench first turns);
their reports lead with answer-based figures (:mod:`jaxspec.bench.answers`).

The default is the first **3** prompts (a 135M model without a cache costs about
0.7 s per forward on a 2-core CPU, and the suite runs 12 decodes of 256 positions per
prompt: about 13 minutes per prompt here).

Suite ``ssd`` (SSD against stepwise, :mod:`jaxspec.bench.ssd`):

    python -m scripts.benchmark --suite ssd [--limit 2] [--gen-length 256] [--block-length 8] \
        [--ssd-rows 3:chain:dual 4:mix-order:dual 3:chain:none ...] [--no-limit-analysis]

Default: the first **2** HumanEval prompts, gen length 256, block 8 (the paper's setting),
draft lengths 3/4/5 (chain) and 4 (mix-order) with the dual cache (add uncached rows such as
``3:chain:none`` with ``--ssd-rows``), plus the Sec. 5.1 acceptance-limit table (draft
lengths 3-5, top-k 1-5).

Suite ``spiffy`` (Spiffy against the decoder it accelerates, :mod:`jaxspec.bench.spiffy`):

    python -m scripts.benchmark --suite spiffy [--limit 2] [--gen-length 256] \
        [--block-length 32] [--spiffy-rows 3:stepwise 10:threshold-0.9 10:fixed-2 ...] \
        [--graph-dir configs/graphs/dream-smollm2-135m]

Default: the first **2** HumanEval prompts, gen length 256, block 32 (the paper's setting),
dual cache, graphs D = 3/5/8/10 at one token per step and D = 10 with fixed-2 and
threshold-0.9 decoding (Table 2); graphs from ``--graph-dir/D<D>.json`` (``scripts.calibrate``,
calibrated on the last 20 HumanEval problems).

Suite ``assd`` (XLNet AS-ARM: sequential vs ASSD vs ASSD-ngram, :mod:`jaxspec.bench.assd`):

    python -m scripts.benchmark --suite assd [--model asarm-small | --weights FILE] [--limit 8] \
        [--assd-k 5] [--assd-k-sweep 2 3 4 5 6 8] [--assd-seq-len 256] [--assd-mask-rate 0.95] \
        [--assd-temperature 1.0] [--assd-infill-tasks 20] [--assd-no-judge]

Suite ``diffuspec`` (a diffusion LM drafts for a causal target, :mod:`jaxspec.bench.diffuspec`):

    python -m scripts.benchmark --suite diffuspec [--model smollm2-135m-instruct] \
        [--draft-model dream-smollm2-135m] [--limit 5] [--k-max 30] [--k-min 20] \
        [--diffuspec-sets humaneval mt-bench news] [--diffuspec-fixed-k 5 10 20 30] \
        [--diffuspec-refine-steps 1 2 4] [--no-ablations] [--drafter-cache none prefix]

Suite ``space`` (SPACE on a SAR-SFT model, :mod:`jaxspec.bench.space`):

    python -m scripts.benchmark --suite space [--model smollm2-135m-space] \
        [--base-model smollm2-135m-instruct] [--limit 5] [--mask-groups 5] \
        [--space-sets humaneval humaneval-chat mt-bench news] [--space-k-sweep 1 2 ... 8] \
        [--space-batches 1 2 4 8 16] [--quality checkpoints/smollm2-135m-space/quality.json]

Suite ``dflash`` (trained DFlash drafters beside AR / n-gram / SPS / SpecDiff / DiffuSpec,
:mod:`jaxspec.bench.dflash`; the block sweep is one ``--dflash-drafter`` file per block size;
two files of one block size are compared in one run, their rows ending in ``@<name>``, the
file's folder for ``.../NAME/drafter.safetensors``, else its stem):

    python -m scripts.benchmark --suite dflash [--model smollm2-135m-instruct] \
        --dflash-drafter FILE [--dflash-drafter FILE ...] [--draft-model NAME] [--limit 5] \
        [--dflash-sets humaneval mt-bench news] [--draft-length 8] \
        [--dflash-verify-lengths 3 7] [--dflash-dllm-drafter dream-smollm2-135m] \
        [--dflash-draft-vocab draft-vocab.npy] [--dflash-ngram-first]

``--model auto`` (or ``hf-directory``) ``--weights PATH`` reads the model family from the
checkpoint (``models.registry.weights_family``): a Llama / Qwen2 directory or GGUF file runs the
causal suites ``ar`` and ``space``, a LLaDA / Dream directory (or a diffusion jaxspec checkpoint)
the masked-diffusion suites ``dllm``, ``ssd`` and ``spiffy``, an XLNet directory (or a jaxspec
XLNet file) suite ``assd``; another family is a one-line error naming it and the suite.

Exit code 2 with a one-line ``error:`` message on bad input (unknown suite, system, method,
cache policy or model, bad budget or draft length, prompts too long for the context,
unreadable weights or a bad checkpoint directory, a model of a family the suite does not run).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from scripts.common import add_compile_cache_flag

    ap = argparse.ArgumentParser(
        prog="python -m scripts.benchmark", description=__doc__.split("\n")[0]
    )
    _add_run_args(ap)
    _add_model_args(ap)
    _add_causal_args(ap)
    _add_peer_args(ap)
    add_compile_cache_flag(ap)
    _add_suite_dllm_args(ap)
    _add_suite_ssd_args(ap)
    _add_suite_spiffy_args(ap)
    _add_suite_space_args(ap)
    _add_suite_diffuspec_args(ap)
    _add_suite_dflash_args(ap)
    from jaxspec.bench.assd import add_arguments as add_assd_arguments

    add_assd_arguments(ap)
    return ap


def _add_run_args(ap: argparse.ArgumentParser) -> None:
    """The suite, its prompt range and the result file."""
    from jaxspec.bench.systems import SUITES

    ap.add_argument("--suite", required=True, help=f"benchmark suite: {', '.join(SUITES)}")
    ap.add_argument(
        "--limit",
        type=int,
        default=None,
        help="number of HumanEval prompts (default 20 for ar, 3 for dllm)",
    )
    ap.add_argument("--start", type=int, default=0, help="first HumanEval problem index")
    ap.add_argument(
        "--out",
        default=None,
        help="result JSON (default: a new scratch file "
        "runs/bench/SUITE-YYYYmmdd-HHMMSS.json); the markdown table and the chart go "
        "next to it. An existing file (e.g. the committed results/SUITE.json) is "
        "replaced only with --overwrite",
    )
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out file (and its .md / .png)",
    )


def _add_model_args(ap: argparse.ArgumentParser) -> None:
    """The model: preset, weights, dtype and quantization."""
    ap.add_argument(
        "--model",
        default=None,
        help="model preset name (default "
        "smollm2-135m-instruct for ar, dream-smollm2-135m for dllm)",
    )
    ap.add_argument(
        "--weights", default=None, help="GGUF file or HF directory (overrides the preset)"
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="jaxspec parameter / activation dtype: auto "
        "(float32 on CPU, bfloat16 on GPU/TPU), float32 or bfloat16 (suites ar and "
        "dllm; the transformers peers load the same dtype)",
    )
    ap.add_argument(
        "--quant",
        default="none",
        help="weight-only quantization of the jaxspec "
        "model: none or int8 (models.quant; suites ar, dllm, ssd, spiffy). For the "
        "drift from float in one run use --systems jaxspec/ar-int8 jaxspec/ngram-int8",
    )


def _add_causal_args(ap: argparse.ArgumentParser) -> None:
    """Causal decoding: the token budget, the draft length and the n-gram drafter."""
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--draft-length",
        type=int,
        default=8,
        help="K: draft tokens per step of jaxspec/ngram and prompt_lookup_num_tokens",
    )
    ap.add_argument(
        "--max-ngram",
        type=int,
        default=3,
        help="longest suffix matched (jaxspec n-gram drafter and transformers' "
        "max_matching_ngram_size)",
    )
    ap.add_argument("--min-ngram", type=int, default=2, help="shortest suffix of jaxspec's drafter")


def _add_peer_args(ap: argparse.ArgumentParser) -> None:
    """Suite ar's systems, the draft model, the transformers peers and the progress bar."""
    from jaxspec.bench.systems import SYSTEMS

    ap.add_argument(
        "--systems",
        nargs="+",
        default=None,
        help=f"subset of: {', '.join(SYSTEMS)} (jaxspec/ar is always run: it is the baseline)",
    )
    ap.add_argument(
        "--draft-model",
        default=None,
        help="draft model preset of jaxspec/sps and transformers/assisted (same "
        "tokenizer as --model)",
    )
    ap.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument(
        "--torch-device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="device of the transformers peers: auto = cuda when JAX runs on a GPU "
        "and torch sees one, else cpu",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_suite_dllm_args(ap: argparse.ArgumentParser) -> None:
    """Suites dllm and ssd: lengths, rows, caches, remasking, prompt set, overhead."""
    dg = ap.add_argument_group("suites dllm and ssd")
    dg.add_argument("--gen-length", type=int, default=256)
    dg.add_argument(
        "--block-length",
        type=int,
        default=None,
        help="block length (default 32 for dllm, 8 for ssd)",
    )
    dg.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="rows: stepwise, fixed-K, threshold-T (default: stepwise fixed-2 "
        "fixed-4 threshold-0.9)",
    )
    dg.add_argument("--caches", nargs="+", default=None, help="subset of none prefix dual")
    dg.add_argument("--remasking", default="low_confidence")
    dg.add_argument(
        "--prompt-set",
        choices=("long", "chat"),
        default=None,
        help="prompts of suites dllm, ssd and spiffy: long = HumanEval raw "
        "completions alternating with held-out stdlib function bodies "
        "(default), chat = HumanEval in the chat template alternating with "
        "MT-Bench first turns (also picked by --chat); suite diffuspec: the "
        "default of --diffuspec-sets (long, or humaneval-chat mt-bench)",
    )
    dg.add_argument(
        "--overhead-reps",
        type=int,
        default=3,
        help="timed repetitions of each lone forward for loop_overhead (0 = skip)",
    )


def _add_suite_ssd_args(ap: argparse.ArgumentParser) -> None:
    """Suite ssd: the SSD rows and the acceptance-limit table."""
    sg = ap.add_argument_group("suite ssd")
    sg.add_argument(
        "--ssd-rows",
        nargs="+",
        default=None,
        help="SSD rows as N:tree:cache (default 3:chain:dual 4:chain:dual "
        "5:chain:dual 4:mix-order:dual)",
    )
    sg.add_argument(
        "--no-limit-analysis", action="store_true", help="skip the Sec. 5.1 acceptance-limit table"
    )


def _add_suite_spiffy_args(ap: argparse.ArgumentParser) -> None:
    """Suite spiffy: the rows, the calibrated graphs and the cache policy."""
    pg = ap.add_argument_group("suite spiffy")
    pg.add_argument(
        "--spiffy-rows",
        nargs="+",
        default=None,
        help="Spiffy rows as D:rule, rule = stepwise | fixed-K | threshold-T "
        "(default 3/5/8/10:stepwise 10:fixed-2 10:threshold-0.9)",
    )
    pg.add_argument(
        "--graph-dir",
        default="configs/graphs/dream-smollm2-135m",
        help="directory of calibrated graphs D<D>.json",
    )
    pg.add_argument(
        "--cache",
        choices=("none", "dual"),
        default="dual",
        help="cache policy of every spiffy row and its reference (default dual)",
    )


def _add_suite_space_args(ap: argparse.ArgumentParser) -> None:
    """Suite space: the base model, k, the prompt sets, the sweeps and the quality file."""
    xg = ap.add_argument_group("suite space")
    xg.add_argument(
        "--base-model",
        default="smollm2-135m-instruct",
        help="the base model of the SAR delta (the jaxspec/ar-base rows)",
    )
    xg.add_argument("--mask-groups", type=int, default=5, help="SPACE's k (default 5)")
    xg.add_argument(
        "--space-sets",
        nargs="+",
        default=None,
        help="prompt sets: humaneval humaneval-chat mt-bench news (default all)",
    )
    xg.add_argument(
        "--space-k-sweep",
        nargs="*",
        type=int,
        default=None,
        help="k ablation values (default 1..8; empty: skip)",
    )
    xg.add_argument(
        "--space-batches",
        nargs="*",
        type=int,
        default=None,
        help="batch sizes (default 1 2 4 8 16; empty: skip)",
    )
    xg.add_argument("--quality", default=None, help="JSON of the SAR model's quality figures")


def _add_suite_diffuspec_args(ap: argparse.ArgumentParser) -> None:
    """Suite diffuspec: ADL's bounds, the prompt sets, the ablations and the drafter cache."""
    fg = ap.add_argument_group(
        "suite diffuspec (--draft-model: the diffusion drafter, default dream-smollm2-135m)"
    )
    fg.add_argument("--k-max", type=int, default=30, help="DiffuSpec's k_max (default 30)")
    fg.add_argument("--k-min", type=int, default=20, help="DiffuSpec's k_min (default 20)")
    fg.add_argument(
        "--diffuspec-sets",
        nargs="+",
        default=None,
        help="prompt sets: humaneval humaneval-chat mt-bench news (default all)",
    )
    fg.add_argument(
        "--diffuspec-fixed-k",
        nargs="*",
        type=int,
        default=None,
        help="Table 5 fixed draft lengths (default 5 10 20 30; empty: skip)",
    )
    fg.add_argument(
        "--diffuspec-refine-steps",
        nargs="*",
        type=int,
        default=None,
        help="drafter refinement steps S (default 1 2 4; empty: skip)",
    )
    fg.add_argument("--no-ablations", action="store_true", help="skip the Table 2 CPS x ADL grid")
    fg.add_argument(
        "--drafter-cache",
        nargs="+",
        default=["none", "prefix"],
        choices=("none", "prefix"),
        help="drafter caches of the prompt-set rows (default: none prefix; prefix "
        "adds specdiff+prefix / diffuspec+prefix rows)",
    )


def _add_suite_dflash_args(ap: argparse.ArgumentParser) -> None:
    """Suite dflash: the trained drafters and the prompt sets."""
    dg = ap.add_argument_group("suite dflash (--draft-model: the SPS row's draft model)")
    dg.add_argument(
        "--dflash-drafter",
        action="append",
        default=[],
        metavar="FILE",
        help="a trained DFlash drafter (scripts.train's drafter.safetensors); repeat for the "
        "block sweep, or for two drafters of one block size (rows @<folder or stem>)",
    )
    dg.add_argument(
        "--dflash-draft-vocab",
        default=None,
        metavar="FILE",
        help="a draft vocabulary (.npy of token ids, scripts.draft_vocab): every DFlash row "
        "and cost row again with the drafter's LM head on those ids only (-v<size>)",
    )
    dg.add_argument(
        "--dflash-ngram-first",
        action="store_true",
        help="every DFlash row again behind the context n-gram lookup (+ngram: rows whose "
        "last tokens occurred before draft the copy, the drafter drafts the others)",
    )
    dg.add_argument(
        "--dflash-sets",
        nargs="+",
        default=None,
        help="prompt sets: humaneval humaneval-chat mt-bench news (default humaneval "
        "mt-bench news)",
    )
    dg.add_argument(
        "--dflash-verify-lengths",
        nargs="+",
        type=int,
        default=[],
        metavar="K",
        help="also run each drafter at these shorter draft lengths (its whole block is "
        "forwarded, the first K drafts verified; default: the block's B - 1 only)",
    )
    dg.add_argument(
        "--dflash-dllm-drafter",
        default=None,
        metavar="NAME",
        help="a diffusion LM preset (e.g. dream-smollm2-135m): add SpecDiff and DiffuSpec rows "
        "with it as their drafter (default: none)",
    )


HUMANEVAL_PROBLEMS = 164  # the prompt pool of suites ar, dllm, ssd and spiffy


def _at_least(flag: str, value, least) -> None:
    from jaxspec.bench.records import BenchError

    if value is not None and value < least:
        raise BenchError(f"{flag} must be >= {least}, got {value}")


def resolve_out(args, now: float | None = None) -> Path:
    """The result JSON of this run, checked before anything loads.

    No ``--out``: a new scratch file ``runs/bench/<suite>-<YYYYmmdd-HHMMSS>.json`` (committed
    results are written only on purpose). An existing file needs ``--overwrite``. The folder is
    created and a probe file written and removed in it, so an unwritable ``--out`` fails now,
    not after the run.

    Raises:
      BenchError: ``--out`` is not a ``.json`` path, exists without ``--overwrite``, or its
        folder cannot be created or written.
    """
    import tempfile
    import time

    from jaxspec.bench.records import BenchError

    if args.out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        out = Path("runs") / "bench" / f"{args.suite}-{stamp}.json"
    else:
        out = Path(args.out)
        if out.suffix != ".json":
            raise BenchError(
                f"--out must name a .json file (the .md and .png go next to it), got {args.out}"
            )
    if out.is_dir():
        raise BenchError(f"--out {out} is a directory; name a .json file")
    if not args.overwrite:
        for f in (out, out.with_suffix(".md")):
            if f.exists():
                raise BenchError(
                    f"--out {out}: {f} exists; pass --overwrite to replace it, or "
                    f"leave out --out (results go to runs/bench/)"
                )
    for parent in (out.parent, *out.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                raise BenchError(f"--out {out}: {parent} is not a directory")
            break
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.stem}.", suffix=".probe"):
            pass
    except OSError as e:
        raise BenchError(
            f"--out {out}: cannot write into {out.parent} ({e.strerror or e})"
        ) from None
    return out


def validate_args(args) -> None:
    """Every check that needs no model, run before anything loads (exit 2 on failure):
    ranges of the numeric flags, names of suites / systems / methods / caches / presets, the
    decode configs of the dllm rows, and ``--out`` (:func:`resolve_out`; ``args.out`` becomes
    the resolved path).

    Raises:
      BenchError / PresetError / ValueError: the first bad value, in one line.
    """
    _check_names_and_ranges(args)
    _check_sweeps_and_sets(args)
    if args.suite == "assd":
        _check_assd_args(args)
    if args.suite == "ar":
        from jaxspec.bench.systems import parse_systems

        parse_systems(args.systems)
    _check_diffusion_args(args)
    _check_presets(args)
    args.out = str(resolve_out(args))


def _check_names_and_ranges(args) -> None:
    """The suite, dtype and quantization names, and the ranges of the numeric flags."""
    from jaxspec.bench.records import BenchError
    from jaxspec.bench.systems import SUITES
    from models.registry import DTYPES

    if args.suite not in SUITES:
        raise BenchError(f"unknown suite {args.suite!r}; available: {', '.join(SUITES)}")
    if args.dtype not in DTYPES:
        raise BenchError(f"unknown --dtype {args.dtype!r}; choose one of {', '.join(DTYPES)}")
    if args.quant not in ("none", "int8"):
        raise BenchError(f"unknown --quant {args.quant!r}; choose none or int8")
    _at_least("--limit", args.limit, 1)
    if not 0 <= args.start < HUMANEVAL_PROBLEMS:
        raise BenchError(
            f"--start must lie in [0, {HUMANEVAL_PROBLEMS - 1}] (HumanEval has "
            f"{HUMANEVAL_PROBLEMS} problems), got {args.start}"
        )
    for flag, value, least in (
        ("--max-new-tokens", args.max_new_tokens, 1),
        ("--draft-length", args.draft_length, 1),
        ("--min-ngram", args.min_ngram, 1),
        ("--gen-length", args.gen_length, 1),
        ("--block-length", args.block_length, 1),
        ("--overhead-reps", args.overhead_reps, 0),
        ("--threads", args.threads, 1),
        ("--mask-groups", args.mask_groups, 1),
        ("--assd-k", args.assd_k, 1),
        ("--assd-seq-len", args.assd_seq_len, 2),
        ("--assd-infill-tasks", args.assd_infill_tasks, 0),
    ):
        _at_least(flag, value, least)
    if args.max_ngram < args.min_ngram:
        raise BenchError(
            f"--max-ngram must be >= --min-ngram, got {args.max_ngram} < {args.min_ngram}"
        )
    if args.suite == "diffuspec" and not 1 <= args.k_min <= args.k_max:
        raise BenchError(f"need 1 <= --k-min <= --k-max, got {args.k_min} and {args.k_max}")


def _check_sweeps_and_sets(args) -> None:
    """The values of the sweep flags (each >= 1) and the names of the prompt sets."""
    from jaxspec.bench.prompts import PROMPT_SETS
    from jaxspec.bench.records import BenchError

    for flag, values in (
        ("--space-k-sweep", args.space_k_sweep),
        ("--space-batches", args.space_batches),
        ("--diffuspec-fixed-k", args.diffuspec_fixed_k),
        ("--diffuspec-refine-steps", args.diffuspec_refine_steps),
        ("--assd-k-sweep", args.assd_k_sweep),
    ):
        for v in values or ():
            _at_least(flag, v, 1)
    for flag, values in (
        ("--space-sets", args.space_sets),
        ("--diffuspec-sets", args.diffuspec_sets),
    ):
        bad = sorted(
            set(values or ())
            - set(PROMPT_SETS)
            - ({"long"} if flag == "--diffuspec-sets" else set())
        )
        if bad:
            extra = ", long" if flag == "--diffuspec-sets" else ""
            raise BenchError(
                f"unknown {flag} {bad[0]!r}; available: {', '.join(PROMPT_SETS)}{extra}"
            )


def _check_assd_args(args) -> None:
    """Suite assd: the mask rate, the temperatures and the method names."""
    from jaxspec.bench.assd import MAIN_METHODS
    from jaxspec.bench.records import BenchError

    if not 0.0 < args.assd_mask_rate <= 1.0:
        raise BenchError(f"--assd-mask-rate must lie in (0, 1], got {args.assd_mask_rate}")
    for flag, t in (
        ("--assd-temperature", args.assd_temperature),
        ("--assd-infill-temperature", args.assd_infill_temperature),
    ):
        if not 0.0 <= t < float("inf"):
            raise BenchError(f"{flag} must be a finite value >= 0, got {t}")
    bad = sorted(set(args.assd_methods) - set(MAIN_METHODS))
    if bad:
        raise BenchError(f"unknown --assd-methods {bad[0]!r}; available: {', '.join(MAIN_METHODS)}")


def _check_diffusion_args(args) -> None:
    """Suites dllm, ssd and spiffy: the remasking rule, the rows (dllm: every decode config)
    and the graph folder (spiffy: a relative one missing here is looked up in the package)."""
    from jaxspec.bench.records import BenchError
    from models.registry import REPO_ROOT

    if args.suite in ("dllm", "ssd", "spiffy"):
        from jaxspec.dllm import REMASKING

        if args.remasking not in REMASKING:
            raise BenchError(
                f"unknown --remasking {args.remasking!r}; available: {', '.join(REMASKING)}"
            )
    if args.suite == "dllm":
        from jaxspec.bench.dllm import DLLM_METHODS, method_config
        from jaxspec.dllm import CACHES

        bad = sorted(set(args.caches or ()) - set(CACHES))
        if bad:
            raise BenchError(f"unknown cache policy {bad[0]!r}; expected {', '.join(CACHES)}")
        block = 32 if args.block_length is None else args.block_length
        for m in args.methods or DLLM_METHODS:
            for c in args.caches or CACHES:
                method_config(
                    m,
                    gen_length=args.gen_length,
                    block_length=block,
                    cache=c,
                    remasking=args.remasking,
                )
    if args.suite == "ssd":
        from jaxspec.bench.ssd import parse_rows

        parse_rows(args.ssd_rows)
    if args.suite == "spiffy":
        from jaxspec.bench.spiffy import parse_rows

        parse_rows(args.spiffy_rows)
        graph_dir = Path(args.graph_dir)
        if (
            not graph_dir.is_dir()
            and not graph_dir.is_absolute()
            and (REPO_ROOT / graph_dir).is_dir()
        ):
            args.graph_dir = str(REPO_ROOT / graph_dir)  # the packaged graphs (installed wheel)


def _check_presets(args) -> None:
    """The model / draft model / base model names and the ``--weights`` path."""
    from jaxspec.bench.records import BenchError
    from models.registry import get_preset, is_preset

    for flag, name in (
        ("--model", args.model),
        ("--draft-model", args.draft_model),
        ("--base-model", args.base_model if args.suite == "space" else None),
    ):
        if name is not None and (flag != "--model" or args.suite != "assd" or is_preset(name)):
            get_preset(name)  # PresetError: unknown name, lists the presets
    if args.weights is not None and not Path(args.weights).exists():
        raise BenchError(f"--weights {args.weights} does not exist")


def _write(result, out, write_results, markdown_report, log) -> int:
    """Write a suite's JSON / markdown / chart, print the report; exit code 0."""
    js, md = write_results(result, Path(out))
    print(markdown_report(result))
    log(f"[bench] wrote {js} and {md}")
    return 0


def _run_config(args, model_name: str, limit: int, params) -> dict:
    """The head of a diffusion suite's recorded config: model, prompts, and the dtype and
    quantization the model actually runs in (``--dtype auto`` resolves per backend)."""
    from models.llama.modeling import param_dtype

    return {
        "model": model_name,
        "limit": limit,
        "start": args.start,
        "prompt_set": args.prompt_set,
        "dtype": str(param_dtype(params)),
        "quant": args.quant,
    }


def _diffusion_setup(args, log, default_limit: int):
    """Model, tokenizer and prompts for the diffusion suites (raises on bad input)."""
    from jaxspec.bench.records import BenchError
    from models.registry import load_model, require_family

    model_name = args.model or "dream-smollm2-135m"
    limit = default_limit if args.limit is None else args.limit
    if limit < 1:
        raise BenchError(f"--limit must be >= 1, got {limit}")
    # hf-directory / auto: the family is read from --weights (LLaDA / Dream directories)
    require_family(model_name, args.weights, "dllm", f"suite {args.suite}")
    model, params, tok, _ = load_model(
        model_name, args.weights, log=log, dtype=args.dtype, quant=args.quant
    )
    from jaxspec.bench.answers import prompt_set

    args.prompt_set = args.prompt_set or ("chat" if args.chat else "long")
    prompts = prompt_set(tok, args.prompt_set, limit, args.start)
    return model_name, limit, model, params, tok, prompts


def main_ssd(args, log) -> int:
    """``--suite ssd``."""
    from jaxspec.bench.records import BenchError
    from jaxspec.bench.ssd import markdown_report, parse_rows, run_ssd_suite, write_results
    from models.llama.params import WeightFileError
    from models.registry import PresetError

    try:
        rows = parse_rows(args.ssd_rows)
        block = 8 if args.block_length is None else args.block_length
        model_name, limit, model, params, tok, prompts = _diffusion_setup(args, log, 2)
        eos = tuple(tok.eos_token_ids)
        config = {
            **_run_config(args, model_name, limit, params),
            "gen_length": args.gen_length,
            "block_length": block,
            "rows": [f"{n}:{t}:{c}" for n, t, c in rows],
            "remasking": args.remasking,
            "chat": args.chat,
            "eos_ids": list(eos),
            "batch": 1,
            "temperature": 0.0,
            "prompt_tokens_max": max(len(p.ids) for p in prompts),
        }
        result = run_ssd_suite(
            model,
            params,
            prompts,
            model_name=model_name,
            gen_length=args.gen_length,
            block_length=block,
            rows=rows,
            remasking=args.remasking,
            eos_ids=eos,
            pad_id=tok.pad_token_id or 0,
            config=config,
            progress=not args.no_progress,
            prompt_set=args.prompt_set,
            limit_analysis=not args.no_limit_analysis,
            log=log,
        )
    except (BenchError, PresetError, WeightFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(result, args.out, write_results, markdown_report, log)


def main_spiffy(args, log) -> int:
    """``--suite spiffy``."""
    from jaxspec.bench.records import BenchError
    from jaxspec.bench.spiffy import (
        load_graphs,
        markdown_report,
        parse_rows,
        run_spiffy_suite,
        write_results,
    )
    from models.llama.params import WeightFileError
    from models.registry import PresetError

    try:
        rows = parse_rows(args.spiffy_rows)
        graphs = load_graphs(args.graph_dir, [D for D, _ in rows])
        block = 32 if args.block_length is None else args.block_length
        model_name, limit, model, params, tok, prompts = _diffusion_setup(args, log, 2)
        eos = tuple(tok.eos_token_ids)
        config = {
            **_run_config(args, model_name, limit, params),
            "gen_length": args.gen_length,
            "block_length": block,
            "cache": args.cache,
            "rows": [f"{D}:{r}" for D, r in rows],
            "graph_dir": args.graph_dir,
            "remasking": args.remasking,
            "chat": args.chat,
            "eos_ids": list(eos),
            "batch": 1,
            "temperature": 0.0,
            "prompt_tokens_max": max(len(p.ids) for p in prompts),
        }
        result = run_spiffy_suite(
            model,
            params,
            prompts,
            model_name=model_name,
            graphs=graphs,
            gen_length=args.gen_length,
            block_length=block,
            rows=rows,
            cache=args.cache,
            remasking=args.remasking,
            eos_ids=eos,
            pad_id=tok.pad_token_id or 0,
            config=config,
            progress=not args.no_progress,
            prompt_set=args.prompt_set,
        )
    except (BenchError, PresetError, WeightFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(result, args.out, write_results, markdown_report, log)


def main_dllm(args, log) -> int:
    """``--suite dllm``."""
    from jaxspec.bench.dllm import DLLM_METHODS, markdown_report, run_dllm_suite, write_results
    from jaxspec.bench.records import BenchError
    from jaxspec.dllm import CACHES
    from models.llama.params import WeightFileError
    from models.registry import PresetError

    try:
        model_name, limit, model, params, tok, prompts = _diffusion_setup(args, log, 3)
        eos = tuple(tok.eos_token_ids)
        methods = args.methods or list(DLLM_METHODS)
        block = 32 if args.block_length is None else args.block_length
        caches = args.caches or list(CACHES)
        config = {
            **_run_config(args, model_name, limit, params),
            "gen_length": args.gen_length,
            "block_length": block,
            "methods": methods,
            "caches": caches,
            "remasking": args.remasking,
            "chat": args.chat,
            "eos_ids": list(eos),
            "batch": 1,
            "temperature": 0.0,
            "prompt_tokens_max": max(len(p.ids) for p in prompts),
        }
        result = run_dllm_suite(
            model,
            params,
            prompts,
            model_name=model_name,
            gen_length=args.gen_length,
            block_length=block,
            methods=methods,
            caches=caches,
            remasking=args.remasking,
            eos_ids=eos,
            pad_id=tok.pad_token_id or 0,
            config=config,
            progress=not args.no_progress,
            overhead_reps=args.overhead_reps,
            decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
            prompt_set=args.prompt_set,
            log=log,
        )
    except (BenchError, PresetError, WeightFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(result, args.out, write_results, markdown_report, log)


def main_space(args, log) -> int:
    """``--suite space``."""
    import json

    from jaxspec.bench.records import BenchError
    from jaxspec.bench.space import (
        BATCH_SIZES,
        K_SWEEP,
        PROMPT_SETS,
        markdown_report,
        run_space_suite,
        write_results,
    )
    from models.llama.params import WeightFileError
    from models.registry import PresetError, load_model, require_family

    try:
        name = args.model or "smollm2-135m-space"
        require_family(name, args.weights, "causal", "suite space")
        if args.mask_groups < 1:
            raise BenchError(f"--mask-groups must be >= 1, got {args.mask_groups}")
        model, params, tok, _ = load_model(name, args.weights, log=log)
        _, base_params, _, _ = load_model(args.base_model, log=log)
        quality = json.loads(Path(args.quality).read_text()) if args.quality else None
        result = run_space_suite(
            (model, params),
            base_params,
            tok,
            sets=args.space_sets or PROMPT_SETS,
            limit=5 if args.limit is None else args.limit,
            k=args.mask_groups,
            ks=K_SWEEP if args.space_k_sweep is None else args.space_k_sweep,
            batch_sizes=BATCH_SIZES if args.space_batches is None else args.space_batches,
            max_new_tokens=args.max_new_tokens,
            model_name=name,
            quality=quality,
            config={"base_model": args.base_model},
            progress=not args.no_progress,
            log=log,
        )
    except (BenchError, PresetError, WeightFileError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(result, args.out, write_results, markdown_report, log)


def main_diffuspec(args, log) -> int:
    """``--suite diffuspec``."""
    from jaxspec.bench.diffuspec import (
        FIXED_K,
        REFINE_STEPS,
        diffuspec_drafter_options,
        markdown_report,
        run_diffuspec_suite,
        write_results,
    )
    from jaxspec.bench.prompts import PROMPT_SETS
    from jaxspec.bench.records import BenchError
    from models.llama.params import WeightFileError
    from models.registry import PresetError, load_model, require_family

    try:
        name = args.model or "smollm2-135m-instruct"
        dname = args.draft_model or "dream-smollm2-135m"
        if not 1 <= args.k_min <= args.k_max:
            raise BenchError(f"need 1 <= --k-min <= --k-max, got {args.k_min} and {args.k_max}")
        require_family(name, args.weights, "causal", "suite diffuspec")
        require_family(dname, None, "dllm", "the diffuspec drafter (--draft-model)")
        model, params, tok, _ = load_model(name, args.weights, log=log, dtype=args.dtype)
        dmodel, dparams, dtok, _ = load_model(dname, log=log, dtype=args.dtype)
        if not tok.same_vocabulary(dtok):
            log(
                f"[diffuspec] {dname} and {name} have different tokenizers: drafts are "
                f"translated through text (jaxspec.causal.hetero)"
            )
        log("[diffuspec] fitting the 3-gram proxy on the stdlib training split")
        drafter = diffuspec_drafter_options((dmodel, dparams), dtok, tok)
        result = run_diffuspec_suite(
            (model, params),
            drafter,
            tok,
            sets=args.diffuspec_sets
            or {"long": ("long",), "chat": ("humaneval-chat", "mt-bench"), None: PROMPT_SETS}[
                args.prompt_set
            ],
            limit=5 if args.limit is None else args.limit,
            k_max=args.k_max,
            k_min=args.k_min,
            fixed_k=FIXED_K if args.diffuspec_fixed_k is None else args.diffuspec_fixed_k,
            refine_steps=(
                REFINE_STEPS if args.diffuspec_refine_steps is None else args.diffuspec_refine_steps
            ),
            ablations=not args.no_ablations,
            drafter_caches=args.drafter_cache,
            max_new_tokens=args.max_new_tokens,
            model_name=name,
            drafter_name=dname,
            progress=not args.no_progress,
            log=log,
        )
    except (BenchError, PresetError, WeightFileError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(result, args.out, write_results, markdown_report, log)


def drafter_name(path) -> str:
    """A drafter file's short name in the dflash suite's rows: the folder of a
    ``drafter.safetensors`` (``runs/b4-magpie/drafter.safetensors`` -> ``b4-magpie``), else
    the file's stem."""
    p = Path(path)
    return (p.parent.name or p.stem) if p.stem == "drafter" else p.stem


def main_dflash(args, log) -> int:
    """``--suite dflash``."""
    from jaxspec.bench.dflash import PROMPT_SETS, markdown_report, run_dflash_suite, write_results
    from jaxspec.bench.records import BenchError
    from jaxspec.causal.dflash import load_drafter
    from models.llama.params import WeightFileError
    from models.registry import PresetError, load_model, require_family

    try:
        name = args.model or "smollm2-135m-instruct"
        require_family(name, args.weights, "causal", "suite dflash")
        if args.dflash_dllm_drafter:
            require_family(args.dflash_dllm_drafter, None, "dllm", "--dflash-dllm-drafter")
        if not args.dflash_drafter:
            raise BenchError("suite dflash needs --dflash-drafter FILE (one per block size)")
        if any(k < 1 for k in args.dflash_verify_lengths):
            raise BenchError(
                f"--dflash-verify-lengths must be >= 1, got {args.dflash_verify_lengths}"
            )
        drafters = [load_drafter(f) for f in args.dflash_drafter]  # one-line ValueErrors
        names = [drafter_name(f) for f in args.dflash_drafter]
        if len(set(names)) != len(names):
            raise BenchError(
                f"--dflash-drafter files need distinct names (folders or stems): {names}"
            )
        vocab = None
        if args.dflash_draft_vocab:
            from jaxspec.causal.dflash import load_draft_vocab

            vocab = load_draft_vocab(args.dflash_draft_vocab, drafters[0][0].vocab_size)
        model, params, tok, _ = load_model(name, args.weights, log=log)
        draft = None
        if args.draft_model:
            dmodel, dparams, _, _ = load_model(args.draft_model, log=log)
            draft = (dmodel, dparams)
        dllm = None
        if args.dflash_dllm_drafter:
            from jaxspec.bench.diffuspec import diffuspec_drafter_options

            dmodel, dparams, dtok, _ = load_model(args.dflash_dllm_drafter, log=log)
            dllm = diffuspec_drafter_options((dmodel, dparams), dtok, tok)
        result = run_dflash_suite(
            (model, params),
            drafters,
            tok,
            sets=args.dflash_sets or PROMPT_SETS,
            limit=5 if args.limit is None else args.limit,
            max_new_tokens=args.max_new_tokens,
            draft_model=draft,
            draft_length=args.draft_length,
            dllm_drafter=dllm,
            verify_lengths=args.dflash_verify_lengths,
            draft_vocab=vocab,
            ngram_first=args.dflash_ngram_first,
            model_name=name,
            drafter_names=names,
            config={
                "drafters": list(args.dflash_drafter),
                "draft_vocab_file": args.dflash_draft_vocab,
                "draft_model": args.draft_model,
                "dllm_drafter": args.dflash_dllm_drafter,
            },
            progress=not args.no_progress,
            log=log,
        )
    except (BenchError, PresetError, WeightFileError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(result, args.out, write_results, markdown_report, log)


def _suite_main(suite: str):
    """The ``main_<suite>(args, log)`` of a suite other than ar (None for ar)."""
    return {
        "dllm": main_dllm,
        "ssd": main_ssd,
        "spiffy": main_spiffy,
        "space": main_space,
        "diffuspec": main_diffuspec,
        "dflash": main_dflash,
    }.get(suite)


def _ar_check(args, log) -> list[str]:
    """Suite ar's defaults and budgets; the systems to run (the baseline always among them).

    Raises:
      BenchError / ValueError: an unknown system or a budget below 1.
    """
    from jaxspec.bench.records import BenchError
    from jaxspec.bench.systems import BASELINE, parse_systems

    args.model = args.model or "smollm2-135m-instruct"
    args.limit = 20 if args.limit is None else args.limit
    systems = parse_systems(args.systems)
    if args.systems and BASELINE not in " ".join(args.systems):
        log(f"[bench] adding {BASELINE}: it is the baseline and reference of every row")
    for flag, v in (
        ("--limit", args.limit),
        ("--max-new-tokens", args.max_new_tokens),
        ("--draft-length", args.draft_length),
    ):
        if v < 1:
            raise BenchError(f"{flag} must be >= 1, got {v}")
    return systems


def _ar_load(args, log):
    """Suite ar's model: ``(model, params, tok, path)``, ``path`` the weight file the
    transformers peers load too.

    Raises:
      PresetError / WeightFileError: an unknown preset, a model of another family, a preset
        without weights and no ``--weights``, unreadable weights.
    """
    from models.registry import PresetError, fetch, get_preset, load_model, require_family

    preset = get_preset(args.model)
    # hf-directory / auto: the family is read from --weights
    require_family(args.model, args.weights, "causal", f"suite {args.suite}")
    if args.weights is not None:
        path = Path(args.weights)
    elif preset.parts:
        path = fetch(preset, log=log)
    else:
        raise PresetError(
            f"model {args.model!r} needs --weights PATH (an HF directory or GGUF file)"
        )
    model, params, tok, _ = load_model(
        args.model, str(path), log=log, dtype=args.dtype, quant=args.quant
    )
    return model, params, tok, path


def _ar_prompts(args, model, tok):
    """Suite ar's HumanEval prompts and the longest one's length in tokens.

    Raises:
      BenchError: no problem at ``--start``.
      DecodeInputError: the longest prompt plus ``--max-new-tokens`` exceeds the context.
    """
    from jaxspec.bench.records import BenchError, BenchPrompt
    from jaxspec.causal.decode import DecodeInputError
    from jaxspec.eval.datasets import humaneval_problems, humaneval_prompt

    probs = humaneval_problems()[args.start : args.start + args.limit]
    if not probs:
        raise BenchError(f"no HumanEval problems at --start {args.start}")
    prompts = [
        BenchPrompt(p["task_id"], tok.encode(humaneval_prompt(p, tok, args.chat))) for p in probs
    ]
    ctx = model.config.max_position_embeddings
    longest = max(len(p.ids) for p in prompts)
    if longest + args.max_new_tokens > ctx:
        raise DecodeInputError(
            f"prompt of {longest} tokens + {args.max_new_tokens} new tokens "
            f"exceeds the model's context of {ctx} tokens"
        )
    return prompts, longest


def _ar_draft(args, systems, tok, log):
    """The draft model of the systems that take one: ``(model, params, weight path)``, or None
    when no such system runs.

    Raises:
      BenchError: no ``--draft-model``, or one with another tokenizer than ``--model``.
    """
    from jaxspec.bench.records import BenchError
    from models.registry import fetch, get_preset, load_model

    if not any(s in ("jaxspec/sps", "transformers/assisted") for s in systems):
        return None
    if not args.draft_model:
        raise BenchError("jaxspec/sps and transformers/assisted need --draft-model NAME")
    dmodel, dparams, dtok, _ = load_model(args.draft_model, log=log, dtype=args.dtype)
    if not tok.same_vocabulary(dtok):
        raise BenchError(
            f"draft model {args.draft_model!r} has a different tokenizer than {args.model!r}"
        )
    return dmodel, dparams, fetch(get_preset(args.draft_model), log=log)


def _ar_systems(args, systems, model, params, path, draft, common, log):
    """The system objects of suite ar, in ``systems`` order, and the transformers model of the
    peers (None when no peer runs; loaded once, in the jaxspec model's dtype)."""
    from jaxspec.bench.systems import (
        JaxspecSystem,
        TransformersSystem,
        load_transformers_model,
        torch_device,
    )
    from models.llama.modeling import param_dtype

    objs, hf = [], None
    for name in systems:
        family, method = name.split("/")
        if family == "jaxspec":
            # the methods that take a causal draft model read it; the others ignore it
            opts = {"draft_model": draft[:2]} if draft else None
            objs.append(
                JaxspecSystem(
                    method,
                    model,
                    params,
                    max_ngram=args.max_ngram,
                    min_ngram=args.min_ngram,
                    options=opts,
                    **common,
                )
            )
            continue
        if hf is None:
            tdtype = str(param_dtype(params))
            tdev = torch_device(args.torch_device)
            log(f"[bench] loading {path} into transformers ({tdtype}, {tdev})")
            hf = load_transformers_model(path, threads=args.threads, dtype=tdtype, device=tdev)
        assistant = None
        if method == "assisted":
            log(f"[bench] loading {draft[2]} into transformers ({tdtype}, {tdev})")
            assistant = load_transformers_model(
                draft[2], threads=args.threads, dtype=tdtype, device=tdev
            )
        objs.append(
            TransformersSystem(method, hf, max_ngram=args.max_ngram, assistant=assistant, **common)
        )
    return objs, hf


def main_ar(args, log):
    """``--suite ar``: check, load the model and prompts, build the systems, run them
    interleaved; returns the suite result (errors propagate to :func:`main`)."""
    from jaxspec.bench.ar_suite import run_ar_suite
    from jaxspec.bench.machine import streamed_params
    from models.llama.modeling import param_dtype

    systems = _ar_check(args, log)
    model, params, tok, path = _ar_load(args, log)
    prompts, longest = _ar_prompts(args, model, tok)
    eos = tuple(tok.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    common = dict(
        max_new_tokens=args.max_new_tokens,
        eos_ids=eos,
        pad_id=pad,
        draft_length=args.draft_length,
    )
    draft = _ar_draft(args, systems, tok, log)
    objs, hf = _ar_systems(args, systems, model, params, path, draft, common, log)
    config = {
        **vars(args),
        "systems": systems,
        "weights": str(path),
        "eos_ids": list(eos),
        "torch_threads": (args.threads or os.cpu_count()) if hf is not None else None,
        "torch_device": str(next(hf.parameters()).device) if hf is not None else None,
        "prompt_tokens_max": longest,
    }
    return run_ar_suite(
        objs,
        prompts,
        model_name=args.model,
        num_params=streamed_params(params),
        param_dtype=str(param_dtype(params)),
        config=config,
        progress=not args.no_progress,
        decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
        log=log,
    )


def main(argv=None) -> int:
    """The command: parse and check the flags, run the suite, write and print its report;
    exit code 0, or 2 with one ``error:`` line on bad input."""
    args = build_parser().parse_args(argv)
    from jaxspec.bench.ar_suite import markdown_report, write_results
    from jaxspec.bench.records import BenchError
    from jaxspec.bench.systems import SUITES
    from jaxspec.causal.decode import DecodeInputError
    from models.llama.params import WeightFileError
    from models.registry import PresetError, is_preset, require_family
    from scripts.common import setup_compile_cache

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        validate_args(args)  # before any model loads: exit 2 with one line
        setup_compile_cache(args)
        if args.quant != "none" and args.suite in ("assd", "space", "diffuspec", "dflash"):
            raise BenchError(
                f"--quant applies to suites ar, dllm, ssd and spiffy, not {args.suite}"
            )
        if args.suite == "assd":
            from jaxspec.bench.assd import main_assd

            if is_preset(args.model):  # else a weight file / checkpoint name: load_asarm's
                require_family(args.model, args.weights, "asarm", "suite assd")
            return main_assd(args, log)
        if args.suite not in SUITES:
            raise BenchError(f"unknown suite {args.suite!r}; available: {', '.join(SUITES)}")
        suite_main = _suite_main(args.suite)
        if suite_main is not None:
            return suite_main(args, log)
        result = main_ar(args, log)
    except (BenchError, PresetError, WeightFileError, DecodeInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    return _write(result, args.out, write_results, markdown_report, log)


if __name__ == "__main__":
    sys.exit(main())
