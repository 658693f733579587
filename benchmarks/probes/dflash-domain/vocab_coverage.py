"""How much of the target's output on the benchmark prompts a draft vocabulary covers.

Decodes the first ``--limit`` (5) prompts of each set (:func:`jaxspec.bench.prompts.
suite_prompts`, as `--suite dflash` uses them) greedily with the target (AR, 128 new tokens,
stopped at EOS) and prints, per set and per vocabulary file, the share of the answer tokens
that lie inside it: a draft can only be right on those (every other token comes from the
verifier's correction or bonus token).

    python benchmarks/probes/dflash-domain/vocab_coverage.py VOCAB.npy [VOCAB.npy ...]
        [--sets humaneval mt-bench news] [--limit 5]

2026-11-29, 2-core AMD EPYC (beside a self-distillation run; counts only), the committed
vocabularies of `checkpoints/dflash-smollm2-135m` (the same 533 / 640 / 472 answer tokens as
the `dflash` suite decodes):

    humaneval: 0.919 (4,096 ids), 0.953 (8,192 ids)
    mt-bench:  0.688, 0.766
    news:      0.710, 0.826

The vocabularies come from mostly-code self-distillation files: on chat and news a quarter and
a sixth of the target's tokens cannot be drafted with 8,192 ids (MAT did not move there, as
the drafter rarely drafts those tokens right anyway; a drafter trained on chat data needs a
vocabulary built from chat answers too).
"""

import argparse

import numpy as np

from jaxspec.bench.prompts import suite_prompts
from jaxspec.causal.decode import generate
from jaxspec.causal.dflash import load_draft_vocab
from models.registry import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("vocab", nargs="+")
    ap.add_argument("--sets", nargs="+", default=["humaneval", "mt-bench", "news"])
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    vocabs = {v: load_draft_vocab(v, model.config.vocab_size) for v in args.vocab}
    eos = tuple(tok.eos_token_ids)
    for name, prompts in suite_prompts(tok, args.sets, args.limit).items():
        res = generate(
            model,
            params,
            [p.ids for p in prompts],
            max_new_tokens=args.max_new_tokens,
            eos_ids=eos,
        )
        toks = np.concatenate([np.asarray(t, np.int64) for t in res.tokens])
        cells = [f"{np.isin(toks, ids).mean():.3f} ({len(ids)} ids)" for ids in vocabs.values()]
        print(f"{name}: {toks.size} answer tokens; inside: {', '.join(cells)}")


if __name__ == "__main__":
    main()
