"""Generate text with a causal LM (autoregressive or lossless speculative decoding) or a
masked-diffusion LM (stepwise, fixed-k or threshold unmasking).

    python -m scripts.generate --model smollm2-135m-instruct --method ngram \
        [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] \
        [--seed S] [--draft-length K] [--fallback none|bigram] [--chat] [--weights PATH]
        [--compare]

With no ``--prompt`` the first ``--limit`` HumanEval prompts are used. Prints each output
and one stats line (NFE, MAT, acceptance, tokens/s, compile time, degeneracy figures).
``--compare`` also runs the AR reference on the same prompts and reports whether the
outputs are identical (greedy) and the wall-clock speedup.

Masked-diffusion presets (``dream-smollm2-135m``) use the diffusion decoder
(:func:`jaxspec.dllm.decode.diffusion_generate`):

    python -m scripts.generate --model dream-smollm2-135m --method stepwise \
        [--gen-length 64] [--block-length 8] [--steps N (default: gen length)] \
        [--remasking low_confidence|random|origin|maskgit_plus|topk_margin|entropy] \
        [--tokens-per-step K | --threshold T] [--cache none|prefix|dual] \
        [--temperature T] [--top-k K] [--top-p P] [--alg-temp A] [--seed S] [--compare]

``--method ssd [--draft-length N (default 3)] [--tree chain|mix-order]`` runs SSD
(:mod:`jaxspec.dllm.ssd`), lossless against one-token-per-step stepwise decoding with the same cache
policy (``--cache none|dual``); with ``--compare`` a greedy mismatch exits with code 1.
``--method spiffy [--graph PATH]`` runs Spiffy (:mod:`jaxspec.dllm.spiffy`) with a calibrated draft
graph (default ``configs/graphs/dream-smollm2-135m/D10.json``, made by ``scripts.calibrate``);
it is lossless against the decoder it accelerates: stepwise (any ``--steps``), or with
``--tokens-per-step K`` / ``--threshold T`` the fixed-k / threshold decoder (``--compare`` runs
exactly that reference; a greedy mismatch exits with code 1).
``--tokens-per-step K`` selects fixed-k parallel decoding and ``--threshold T`` Fast-dLLM
threshold decoding (``--method fixed-k`` / ``--method threshold`` name them explicitly and
require the flag). ``--cache`` selects a Fast-dLLM KV cache (approximate; each cache policy
is its own reference). ``--compare`` also runs the one-token-per-step stepwise reference
(``steps = gen length``, same remasking rule, temperature, cache policy and seed) and reports whether the
outputs are identical; parallel decoding is not lossless, so a difference is reported, not
an error. Without ``--method`` a causal model uses ``ngram`` and a diffusion model ``stepwise``.

AS-ARM (XLNet) infilling with ``asarm-small`` (:mod:`jaxspec.asarm.assd`, :mod:`jaxspec.asarm.infill`):

    python -m scripts.generate --model asarm-small --method assd|assd-ngram|sequential \
        --infill "def add(a, b):\\n    <mask:8>\\n" [--draft-length K] [--temperature T] [--compare]

``<mask:N>`` writes N masked tokens inline (``\\n``, ``\\t`` and ``\\\\`` typed in the template are
expanded); the output is the infilled text and a stats line.

Exit code 2 with a one-line ``error:`` message on bad input (unknown model or method,
a diffusion method with a causal model or ar/ngram with a diffusion model, prompt longer than
the context, draft length < 1, temperature < 0, top-p outside (0, 1], invalid diffusion
lengths/steps/remasking, corrupt or missing weight files).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

CAUSAL_METHODS = ("ar", "ngram")
DIFFUSION_METHODS = ("stepwise", "fixed-k", "threshold", "ssd", "spiffy")
DEFAULT_GRAPH = "configs/graphs/dream-smollm2-135m/D10.json"
ASARM_METHODS = ("sequential", "assd", "assd-ngram")
METHODS = CAUSAL_METHODS + DIFFUSION_METHODS + ASARM_METHODS


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m scripts.generate", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model preset name")
    ap.add_argument("--weights", default=None, help="GGUF file or HF directory (overrides the preset)")
    ap.add_argument("--method", default=None,
                    help=f"decoding method: {', '.join(METHODS)} (default: ngram for causal "
                         f"models, stepwise for diffusion models)")
    ap.add_argument("--prompt", action="append", default=None,
                    help="prompt text (repeat for a batch); default: HumanEval prompts")
    ap.add_argument("--limit", type=int, default=1, help="number of HumanEval prompts when no --prompt")
    ap.add_argument("--start", type=int, default=0, help="first HumanEval problem index")
    ap.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft-length", type=int, default=None,
                    help="k, draft tokens per step (default 8 for ngram, 3 for ssd)")
    ap.add_argument("--max-ngram", type=int, default=3, help="longest suffix the n-gram drafter matches")
    ap.add_argument("--min-ngram", type=int, default=2, help="shortest suffix before the bigram fallback")
    ap.add_argument("--fallback", choices=("none", "bigram"), default="none",
                    help="when no suffix matches: 'none' runs a plain AR step, 'bigram' drafts "
                         "from the ASSD Eq. 23 context bigram model")
    dg = ap.add_argument_group("masked-diffusion decoding (diffusion models only)")
    dg.add_argument("--gen-length", type=int, default=64, help="generated positions")
    dg.add_argument("--block-length", type=int, default=8, help="semi-autoregressive block size")
    dg.add_argument("--steps", type=int, default=None, help="stepwise steps (default: gen length)")
    dg.add_argument("--remasking", default="low_confidence",
                    help="low_confidence, random, origin, maskgit_plus, topk_margin or entropy")
    dg.add_argument("--tokens-per-step", type=int, default=None, help="fixed-k: K tokens per step")
    dg.add_argument("--threshold", type=float, default=None,
                    help="threshold: unmask every position with confidence >= T (at least one)")
    dg.add_argument("--cache", choices=("none", "prefix", "dual"), default="none",
                    help="Fast-dLLM KV cache (approximate; --compare uses the same policy)")
    dg.add_argument("--tree", choices=("chain", "mix-order"), default="chain",
                    help="ssd verification tree: greedy chain (N+1 nodes) or mix-order (2N)")
    dg.add_argument("--graph", default=None,
                    help=f"spiffy draft graph JSON (default {DEFAULT_GRAPH})")
    dg.add_argument("--alg-temp", type=float, default=0.0,
                    help="Dream's alg_temp: sample the unmasked positions from "
                         "softmax(confidence / alg_temp) (0 = most confident first)")
    ag = ap.add_argument_group("AS-ARM infilling (XLNet checkpoints, e.g. --model asarm-small)")
    ag.add_argument("--infill", default=None,
                    help="template with <mask:N> spans; \\n, \\t, \\\\ are expanded (methods "
                         "sequential, assd, assd-ngram; k = --draft-length, default 5)")
    ag.add_argument("--epsilon", type=float, default=0.0,
                    help="ASSD acceptance tolerance (Appendix F.5; > 0 is NOT lossless)")
    ap.add_argument("--compare", action="store_true",
                    help="also run the reference (AR, or one-token-per-step stepwise) and check "
                         "identity / speedup")
    ap.add_argument("--quiet", action="store_true", help="print only the stats lines")
    return ap


def stats_line(label, res, degen) -> str:
    s = res.stats
    acc = "-" if s.draft_length == 0 else f"{s.acceptance_rate:.3f}"
    return (f"[{label}] tokens={int(s.new_tokens.sum())} NFE={int(s.target_nfe.sum())} "
            f"MAT={s.mat:.2f} acceptance={acc} tokens/s={res.tokens_per_s:.1f} "
            f"run={res.run_s:.2f}s compile={res.compile_s:.1f}s "
            f"distinct={degen['distinct_token_share']:.2f} rep4={degen['repeated_ngram_rate']:.2f}")


def diffusion_stats_line(label, res, degen) -> str:
    s = res.stats
    toks = int(s.new_tokens.sum())
    return (f"[{label}] tokens={toks} gen={int(res.full_tokens.size)} NFE={int(s.target_nfe.sum())} "
            f"tokens/NFE={res.full_tokens.size / max(int(s.target_nfe.sum()), 1):.2f} "
            f"tokens/s={toks / max(res.run_s, 1e-9):.1f} run={res.run_s:.2f}s "
            f"compile={res.compile_s:.1f}s "
            f"distinct={degen['distinct_token_share']:.2f} rep4={degen['repeated_ngram_rate']:.2f}")


def _check_method(args, preset) -> str:
    """The method to run for ``preset`` (resolving the default); ValueError on a mismatch."""
    method = args.method or ("stepwise" if preset.is_diffusion else "ngram")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; available: {', '.join(METHODS)}")
    if preset.is_diffusion and method in CAUSAL_METHODS:
        raise ValueError(f"method {method!r} needs a causal model, but {preset.name!r} is a "
                         f"masked-diffusion model; use --method {', '.join(DIFFUSION_METHODS)}")
    if not preset.is_diffusion and method in DIFFUSION_METHODS:
        raise ValueError(f"method {method!r} needs a masked-diffusion model, but {preset.name!r} "
                         f"is causal (e.g. --model dream-smollm2-135m)")
    if method == "fixed-k" and args.tokens_per_step is None:
        raise ValueError("method 'fixed-k' needs --tokens-per-step K")
    if method == "threshold" and args.threshold is None:
        raise ValueError("method 'threshold' needs --threshold T")
    if method == "ssd" and (args.tokens_per_step is not None or args.threshold is not None
                            or args.steps not in (None, args.gen_length)):
        raise ValueError("ssd verifies one-token-per-step stepwise decoding: no "
                         "--tokens-per-step / --threshold, and --steps must equal --gen-length")
    if method != "spiffy" and args.graph is not None:
        raise ValueError("--graph only applies to --method spiffy")
    if method in CAUSAL_METHODS:
        used = [f for f, v in (("--tokens-per-step", args.tokens_per_step),
                               ("--threshold", args.threshold), ("--steps", args.steps),
                               ("--cache", None if args.cache == "none" else args.cache),
                               ("--alg-temp", args.alg_temp or None)) if v is not None]
        if used:
            raise ValueError(f"{', '.join(used)} only apply to masked-diffusion methods")
    return method


def _texts(args, tok):
    from jaxspec.eval.datasets import humaneval_problems, humaneval_prompt

    if args.prompt:
        return [tok.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
                for p in args.prompt]
    probs = humaneval_problems()[args.start:args.start + args.limit]
    return [humaneval_prompt(p, tok, args.chat) for p in probs]


def _print_outputs(args, texts, rows, tok) -> None:
    if args.quiet:
        return
    for text, out in zip(texts, rows):
        print("=" * 80)
        print(text + "\033[1m" + tok.decode(out) + "\033[0m" if sys.stdout.isatty()
              else text + tok.decode(out))
    print("=" * 80)


def main_diffusion(args, method, preset) -> int:
    """``main`` for masked-diffusion presets (stepwise / fixed-k / threshold)."""
    from jaxspec.dllm.decode import DiffusionDecodeConfig, diffusion_generate
    from jaxspec.eval.metrics import mean_degeneracy
    from models.llama.params import WeightFileError
    from models.registry import PresetError, load_model

    try:
        common = dict(gen_length=args.gen_length, block_length=args.block_length,
                      remasking=args.remasking, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, cache=args.cache)
        ref_cfg = DiffusionDecodeConfig(steps=args.gen_length, **common)
        cfg = DiffusionDecodeConfig(steps=args.gen_length if args.steps is None else args.steps,
                                    tokens_per_step=args.tokens_per_step,
                                    threshold=args.threshold, alg_temp=args.alg_temp, **common)
        ssd_cfg = spiffy_cfg = None
        if method == "spiffy":
            from jaxspec.dllm.spiffy import SpiffyConfig, load_graph, spiffy_generate

            spiffy_cfg = SpiffyConfig(cfg, load_graph(args.graph or DEFAULT_GRAPH))
            ref_cfg = cfg
        if method == "ssd":
            from jaxspec.dllm.ssd import SSDConfig, ssd_generate

            ssd_cfg = SSDConfig(dataclasses.replace(cfg, steps=args.gen_length),
                                3 if args.draft_length is None else args.draft_length, args.tree)
        model, params, tok, _ = load_model(args.model, args.weights)
        texts = _texts(args, tok)
        prompts = [tok.encode(t) for t in texts]
        kw = dict(seed=args.seed, eos_ids=tuple(tok.eos_token_ids), pad_id=tok.pad_token_id or 0)
        if ssd_cfg is not None:
            res = ssd_generate(model, params, prompts, ssd_cfg, **kw)
            ref_cfg = ssd_cfg.decode
        elif spiffy_cfg is not None:
            res = spiffy_generate(model, params, prompts, spiffy_cfg, **kw)
        else:
            res = diffusion_generate(model, params, prompts, cfg, **kw)
        ref = diffusion_generate(model, params, prompts, ref_cfg, **kw) if args.compare else None
    except (PresetError, WeightFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    _print_outputs(args, texts, res.tokens, tok)
    label = res.stats.method
    print(diffusion_stats_line(label, res, mean_degeneracy(res.tokens)))
    if ssd_cfg is not None:
        s = res.stats
        print(f"[ssd] draft_length={ssd_cfg.draft_length} tree={ssd_cfg.tree} "
              f"nodes={ssd_cfg.num_nodes} step_reduction={s.extra['step_reduction']:.3f} "
              f"acceptance={s.acceptance_rate:.3f} accept_hist={s.accept_hist.sum(0).tolist()}")
    if spiffy_cfg is not None:
        s = res.stats
        print(f"[spiffy] D={spiffy_cfg.graph.size} unmasking={s.extra['unmasking']} "
              f"reference_nfe={int(s.steps.sum())} nfe_speedup={s.extra['nfe_speedup']:.2f}x "
              f"steps_per_forward_hist={s.accept_hist.sum(0).tolist()}")
    if ref is not None:
        print(diffusion_stats_line(ref_cfg.method if spiffy_cfg is not None else "stepwise-1",
                                   ref, mean_degeneracy(ref.tokens)))
        same = bool(np.array_equal(ref.full_tokens, res.full_tokens))
        steps = cfg.steps if cfg.method == "stepwise" else "-"
        name = label if ssd_cfg or spiffy_cfg else f"{cfg.method} (steps={steps}, cache={cfg.cache})"
        what = (f"its reference, {cfg.method} (steps={steps}, cache={cfg.cache})" if spiffy_cfg
                else f"one-token-per-step stepwise (cache={cfg.cache})")
        print(compare_line(name, what, res, ref, "identical" if same else "DIFFERENT"))
        if (ssd_cfg or spiffy_cfg) and not same and args.temperature == 0:
            return 1
    return 0


def compare_line(method: str, reference: str, res, ref, verdict: str) -> str:
    """The ``[compare]`` line: output identity verdict, wall-clock speedup and NFE ratio of
    ``res`` (the method) against ``ref`` (its reference decoder)."""
    return (f"[compare] {method} vs {reference} outputs: {verdict}; wall-clock speedup "
            f"{ref.run_s / max(res.run_s, 1e-9):.2f}x; NFE ratio "
            f"{ref.stats.target_nfe.sum() / max(res.stats.target_nfe.sum(), 1):.2f}x")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.infill is not None or args.method in ASARM_METHODS:
        from jaxspec.asarm.infill import infill_cli

        return infill_cli(args)
    from models.registry import PresetError, get_preset

    try:
        preset = get_preset(args.model)
        method = _check_method(args, preset)
    except (PresetError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if preset.is_diffusion:
        return main_diffusion(args, method, preset)
    args.method = method
    from jaxspec.causal.decode import DecodeInputError, generate
    from jaxspec.eval.metrics import mean_degeneracy
    from jaxspec.core.drafters import NgramDrafter
    from jaxspec.core.sampling import SamplingConfig
    from models.llama.params import WeightFileError
    from models.registry import load_model

    try:
        args.draft_length = 8 if args.draft_length is None else args.draft_length
        if args.draft_length < 1:
            raise ValueError(f"--draft-length must be >= 1, got {args.draft_length}")
        sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
        model, params, tok, preset = load_model(args.model, args.weights)
        texts = _texts(args, tok)
        prompts = [tok.encode(t) for t in texts]
        eos = tuple(tok.eos_token_ids)
        drafter = None
        if args.method == "ngram":
            drafter = NgramDrafter(args.draft_length, model.config.vocab_size,
                                   max_ngram=args.max_ngram, min_ngram=args.min_ngram,
                                   bigram_fallback=(args.fallback == "bigram"))
        kw = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, seed=args.seed,
                  eos_ids=eos, pad_id=tok.pad_token_id or 0)
        res = generate(model, params, prompts, drafter=drafter, **kw)
        ref = generate(model, params, prompts, drafter=None, **kw) if (
            args.compare and drafter is not None) else None
    except (PresetError, WeightFileError, DecodeInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    _print_outputs(args, texts, res.tokens, tok)
    print(stats_line(args.method, res, mean_degeneracy(res.tokens)))
    if ref is not None:
        print(stats_line("ar", ref, mean_degeneracy(ref.tokens)))
        same = ref.tokens == res.tokens
        what = "identical" if same else "DIFFERENT"
        if not sampling.greedy:
            what += " (sampling: only the distribution is guaranteed equal)"
        print(compare_line(args.method, "ar", res, ref, what))
        if sampling.greedy and not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
