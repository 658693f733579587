"""Benchmark decoding systems side by side and write JSON plus a markdown table.

    python -m scripts.benchmark --suite ar [--limit N] [--out results/ar.json] \
        [--model smollm2-135m-instruct] [--weights PATH] [--max-new-tokens 128] \
        [--draft-length K] [--systems jaxspec/ar,jaxspec/ngram,...] [--chat]

Suite ``ar``: the first ``--limit`` HumanEval prompts, greedy, batch 1, every system run on
each prompt in turn (interleaved, so noise hits all alike) after one untimed warm-up each.
Systems: ``jaxspec/ar`` (baseline and reference), ``jaxspec/ngram``, ``transformers/ar`` and
``transformers/prompt-lookup`` (PyTorch on the same weight file and the same token ids). The
markdown report (``--out`` with ``.md``) is also printed, together with the measured
memory-bandwidth ceiling for batch-1 float32 decoding.

Exit code 2 with a one-line ``error:`` message on bad input (unknown suite, system or model,
bad budget or draft length, prompts too long for the context, unreadable weights).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from jaxspec.bench import SUITES, SYSTEMS

    ap = argparse.ArgumentParser(prog="python -m scripts.benchmark", description=__doc__.split("\n")[0])
    ap.add_argument("--suite", required=True, help=f"benchmark suite: {', '.join(SUITES)}")
    ap.add_argument("--limit", type=int, default=20, help="number of HumanEval prompts")
    ap.add_argument("--start", type=int, default=0, help="first HumanEval problem index")
    ap.add_argument("--out", default=None, help="result JSON (default results/SUITE.json); "
                    "the markdown table goes next to it")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model preset name")
    ap.add_argument("--weights", default=None, help="GGUF file or HF directory (overrides the preset)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-length", type=int, default=8,
                    help="K: draft tokens per step of jaxspec/ngram and prompt_lookup_num_tokens")
    ap.add_argument("--max-ngram", type=int, default=3,
                    help="longest suffix matched (jaxspec n-gram drafter and transformers' "
                         "max_matching_ngram_size)")
    ap.add_argument("--min-ngram", type=int, default=2, help="shortest suffix of jaxspec's drafter")
    ap.add_argument("--systems", nargs="+", default=None,
                    help=f"subset of: {', '.join(SYSTEMS)} (jaxspec/ar is always run: it is the baseline)")
    ap.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.bench import (BASELINE, SUITES, BenchError, BenchPrompt, JaxspecSystem,
                               TransformersSystem, load_transformers_model, markdown_report,
                               n_params, parse_systems, run_ar_suite, write_results)
    from jaxspec.causal import DecodeInputError
    from models.loading import WeightFileError
    from models.presets import PresetError, fetch, get_preset, load_model

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        if args.suite not in SUITES:
            raise BenchError(f"unknown suite {args.suite!r}; available: {', '.join(SUITES)}")
        systems = parse_systems(args.systems)
        if args.systems and BASELINE not in " ".join(args.systems):
            log(f"[bench] adding {BASELINE}: it is the baseline and reference of every row")
        for flag, v in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens),
                        ("--draft-length", args.draft_length)):
            if v < 1:
                raise BenchError(f"{flag} must be >= 1, got {v}")
        preset = get_preset(args.model)
        if preset.is_diffusion:
            raise PresetError(f"model {args.model!r} is a masked-diffusion model; the benchmark "
                              f"runs causal decoders only (use scripts.generate --method stepwise)")
        if args.weights is not None:
            path = Path(args.weights)
        elif preset.parts:
            path = fetch(preset, log=log)
        else:
            raise PresetError(f"model {args.model!r} needs --weights PATH (an HF directory or GGUF file)")
        model, params, tok, preset = load_model(args.model, str(path), log=log)

        from jaxspec.datasets import humaneval_problems, humaneval_prompt

        probs = humaneval_problems()[args.start:args.start + args.limit]
        if not probs:
            raise BenchError(f"no HumanEval problems at --start {args.start}")
        prompts = [BenchPrompt(p["task_id"], tok.encode(humaneval_prompt(p, tok, args.chat)))
                   for p in probs]
        ctx = model.config.max_position_embeddings
        longest = max(len(p.ids) for p in prompts)
        if longest + args.max_new_tokens > ctx:
            raise DecodeInputError(f"prompt of {longest} tokens + {args.max_new_tokens} new tokens "
                                   f"exceeds the model's context of {ctx} tokens")
        eos = tuple(tok.eos_token_ids)
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
        common = dict(max_new_tokens=args.max_new_tokens, eos_ids=eos, pad_id=pad,
                      draft_length=args.draft_length)
        objs, hf = [], None
        for name in systems:
            family, method = name.split("/")
            if family == "jaxspec":
                objs.append(JaxspecSystem(method, model, params, max_ngram=args.max_ngram,
                                          min_ngram=args.min_ngram, **common))
            else:
                if hf is None:
                    log(f"[bench] loading {path} into transformers (float32)")
                    hf = load_transformers_model(path, threads=args.threads)
                objs.append(TransformersSystem(method, hf, max_ngram=args.max_ngram, **common))
        config = {**vars(args), "systems": systems, "weights": str(path), "eos_ids": list(eos),
                  "torch_threads": (args.threads or os.cpu_count()) if hf is not None else None,
                  "prompt_tokens_max": longest}
        result = run_ar_suite(objs, prompts, model_name=args.model, num_params=n_params(params),
                              config=config, progress=not args.no_progress,
                              decode=lambda ids: tok.decode(ids, skip_special_tokens=False), log=log)
    except (BenchError, PresetError, WeightFileError, DecodeInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    out = Path(args.out or f"results/{args.suite}.json")
    js, md = write_results(result, out)
    print(markdown_report(result))
    log(f"[bench] wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
