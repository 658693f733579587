"""Generate text with a causal LM, autoregressively or with lossless speculative decoding.

    python -m scripts.generate --model smollm2-135m-instruct --method ngram \
        [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] \
        [--seed S] [--draft-length K] [--fallback none|bigram] [--chat] [--weights PATH]
        [--compare]

With no ``--prompt`` the first ``--limit`` HumanEval prompts are used. Prints each output
and one stats line (NFE, MAT, acceptance, tokens/s, compile time, degeneracy figures).
``--compare`` also runs the AR reference on the same prompts and reports whether the
outputs are identical (greedy) and the wall-clock speedup.

Exit code 2 with a one-line ``error:`` message on bad input (unknown model or method,
prompt longer than the context, draft length < 1, temperature < 0, top-p outside (0, 1],
corrupt or missing weight files).
"""

from __future__ import annotations

import argparse
import sys

METHODS = ("ar", "ngram")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m scripts.generate", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model preset name")
    ap.add_argument("--weights", default=None, help="GGUF file or HF directory (overrides the preset)")
    ap.add_argument("--method", default="ngram", help=f"decoding method: {', '.join(METHODS)}")
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
    ap.add_argument("--draft-length", type=int, default=8, help="k, draft tokens per step")
    ap.add_argument("--max-ngram", type=int, default=3, help="longest suffix the n-gram drafter matches")
    ap.add_argument("--min-ngram", type=int, default=2, help="shortest suffix before the bigram fallback")
    ap.add_argument("--fallback", choices=("none", "bigram"), default="none",
                    help="when no suffix matches: 'none' runs a plain AR step, 'bigram' drafts "
                         "from the ASSD Eq. 23 context bigram model")
    ap.add_argument("--compare", action="store_true", help="also run AR and check identity / speedup")
    ap.add_argument("--quiet", action="store_true", help="print only the stats lines")
    return ap


def stats_line(label, res, degen) -> str:
    s = res.stats
    acc = "-" if s.draft_length == 0 else f"{s.acceptance_rate:.3f}"
    return (f"[{label}] tokens={int(s.new_tokens.sum())} NFE={int(s.target_nfe.sum())} "
            f"MAT={s.mat:.2f} acceptance={acc} tokens/s={res.tokens_per_s:.1f} "
            f"run={res.run_s:.2f}s compile={res.compile_s:.1f}s "
            f"distinct={degen['distinct_token_share']:.2f} rep4={degen['repeated_ngram_rate']:.2f}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.causal import DecodeInputError, generate
    from jaxspec.datasets import humaneval_problems, humaneval_prompt
    from jaxspec.metrics import mean_degeneracy
    from jaxspec.ngram import NgramDrafter
    from jaxspec.sampling import SamplingConfig
    from models.loading import WeightFileError
    from models.presets import PresetError, load_model

    try:
        if args.method not in METHODS:
            raise ValueError(f"unknown method {args.method!r}; available: {', '.join(METHODS)}")
        if args.draft_length < 1:
            raise ValueError(f"--draft-length must be >= 1, got {args.draft_length}")
        sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
        model, params, tok, preset = load_model(args.model, args.weights)
        if args.prompt:
            texts = [tok.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
                     for p in args.prompt]
        else:
            probs = humaneval_problems()[args.start:args.start + args.limit]
            texts = [humaneval_prompt(p, tok, args.chat) for p in probs]
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

    if not args.quiet:
        for text, out in zip(texts, res.tokens):
            print("=" * 80)
            print(text + "\033[1m" + tok.decode(out) + "\033[0m" if sys.stdout.isatty()
                  else text + tok.decode(out))
        print("=" * 80)
    print(stats_line(args.method, res, mean_degeneracy(res.tokens)))
    if ref is not None:
        print(stats_line("ar", ref, mean_degeneracy(ref.tokens)))
        same = ref.tokens == res.tokens
        what = "identical" if same else "DIFFERENT"
        if not sampling.greedy:
            what += " (sampling: only the distribution is guaranteed equal)"
        print(f"[compare] {args.method} vs ar outputs: {what}; wall-clock speedup "
              f"{ref.run_s / max(res.run_s, 1e-9):.2f}x; NFE ratio "
              f"{ref.stats.target_nfe.sum() / max(res.stats.target_nfe.sum(), 1):.2f}x")
        if sampling.greedy and not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
