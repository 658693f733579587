"""Does DFlash training score blocks the way decoding meets them?

For each sequence (a prompt and the target's greedy answer, first 128 tokens), this runs the
training objective's forward (:func:`jaxspec.training.dflash.blocks_at`, teacher-forced on the
answer) at every answer position, and reads each block's drafts before the first argmax miss.
It then reports three figures:

- ``visited MAT``: walk the answer as greedy verification would (anchor = the last emitted
  token; advance by accepted + 1), the MAT that decoding these answers must reach if training
  and decoding agree (compare ``val_mat.py`` and the `dflash` suite, which decode);
- ``first draft``: the share of visited blocks whose first draft is right;
- ``uniform tau``: the mean over every anchor with a complete block, the training eval's
  ``val_greedy_tau``, which reads higher because decoding's anchors follow a rejection.

Sequences: the first ``--n`` (8) held-out rows of the self-distillation set (their stored
answers; ``--rows train`` for training rows, ``--kind code|chat`` for one template), or, with
``--sets``, the first 5 prompts of the benchmark's prompt sets
(:func:`jaxspec.bench.prompts.suite_prompts`, as `--suite dflash` uses them) with the target's
greedy answers decoded here (128 tokens, stopped at EOS).

    python benchmarks/probes/dflash-domain/visited.py [DRAFTER] [--rows val|train]
        [--kind all|code|chat] [--n 8] [--sets humaneval mt-bench news]

2026-11-28, 2-core AMD EPYC:
- held-out rows, the mix-trained drafter of commit ef7d6f6 (before the second mix pass): visited
  MAT 1.748, uniform tau 1.986. Decoding the same 8 prompts (128 tokens, no EOS stop, so past
  the stored answers' ends) gave MAT 1.62: no mismatch between training and decoding. The
  drafter of the second mix pass: visited MAT 1.795, first draft right 0.45, uniform tau 2.019.
- ``--sets humaneval mt-bench news``, the drafter of the second mix pass (beside a training run,
  counts only): visited MAT 1.337 / 1.212 / 1.192, first draft right 0.25 / 0.19 / 0.18,
  uniform tau 1.393 / 1.207 / 1.178. The suite decoded MAT 1.33 / 1.21 / 1.19 on the same
  prompts (`results/dflash-mix2/`): training and decoding agree there too; the drafter's
  first draft is right half as often on these prompts as on its own held-out rows.
- ``--n 10 --kind code`` / ``--kind chat`` / ``--rows train --kind code``, the same drafter:
  held-out code visited MAT 1.791, first draft right 0.45; held-out chat 2.339, 0.63; train
  code 2.136, 0.59 (it has partly memorised its training rows).
- ``--n 64`` (every held-out row, every anchor: no sampled anchors, so drafters compare on the
  same blocks; the training eval draws its anchors from the run's seed): the step-3,000 drafter
  visited MAT 1.633, first draft right 0.41, uniform tau 1.776; after the mix pass (ef7d6f6)
  1.682 / 0.43 / 1.838; after the second mix pass 1.738 / 0.44 / 1.951.
"""

import argparse
import gzip
import json

import jax.numpy as jnp
import numpy as np

from jaxspec.causal.dflash import load_drafter
from jaxspec.training.dflash import blocks_at, target_features
from models.registry import load_model

DRAFTER = "checkpoints/dflash-smollm2-135m/drafter.safetensors"
DISTILL = "checkpoints/smollm2-135m-space/distill.jsonl.gz"
ANSWER = 128


def leads(model, params, spec, own, prompt, answer):
    """Per answer anchor, the number of the block's drafts right before the first miss."""
    shared = {k: params[k] for k in ("embed", "lm_head") if k in params}
    B, P = spec.block_size, len(prompt)
    seq = np.asarray(list(prompt) + list(answer), np.int32)[None]
    T = seq.shape[1]
    hidden = target_features(model, params, jnp.asarray(seq), spec.layer_ids)
    anchors = jnp.arange(P, T, dtype=jnp.int32)[None]
    best = np.asarray(
        jnp.argmax(blocks_at(spec, own, shared, jnp.asarray(seq), hidden, anchors)[0], -1)
    )
    return [
        int(np.cumprod(best[i, : len(seq[0, a + 1 : a + B])] == seq[0, a + 1 : a + B]).sum())
        for i, a in enumerate(range(P, T))
    ]


def report(name, model, params, spec, own, pairs) -> None:
    B = spec.block_size
    hist, uniform = np.zeros(B + 1, int), []
    for prompt, answer in pairs:
        lead = leads(model, params, spec, own, prompt, answer)
        T = len(lead)
        uniform += [n for i, n in enumerate(lead) if i + B - 1 < T]
        i = 0
        while i < T - 1:
            hist[lead[i] + 1] += 1
            i += lead[i] + 1
    visited = (hist * np.arange(B + 1)).sum() / hist.sum()
    first = hist[2:].sum() / hist.sum()
    print(
        f"{name}: visited MAT {visited:.3f}, first draft right {first:.2f}, "
        f"uniform tau {1 + np.mean(uniform):.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter", nargs="?", default=DRAFTER)
    ap.add_argument("--sets", nargs="*", default=None)
    ap.add_argument("--rows", choices=("val", "train"), default="val")
    ap.add_argument("--kind", choices=("all", "code", "chat"), default="all")
    ap.add_argument("--n", type=int, default=8)
    a = ap.parse_args()
    model, params, tok, _ = load_model("smollm2-135m-instruct")
    spec, own = load_drafter(a.drafter)
    if a.sets is None:
        with gzip.open(DISTILL, "rt") as f:
            rows = [
                r
                for r in map(json.loads, f)
                if r.get("split") == a.rows and a.kind in ("all", r.get("kind"))
            ][: a.n]
        pairs = [(r["prompt"], r["answer"][:ANSWER]) for r in rows]
        name = {"val": "held-out", "train": "train"}[a.rows]
        report(f"{name} rows, {a.kind} ({len(rows)})", model, params, spec, own, pairs)
        return
    from jaxspec.bench.prompts import suite_prompts
    from jaxspec.causal.decode import generate

    eos = set(tok.eos_token_ids)
    for name, prompts in suite_prompts(tok, a.sets, 5).items():
        pairs = []
        for p in prompts:
            res = generate(model, params, [p.ids], max_new_tokens=ANSWER, eos_ids=sorted(eos))
            pairs.append((p.ids, [t for t in res.tokens[0] if t not in eos]))
        report(name, model, params, spec, own, pairs)


if __name__ == "__main__":
    main()
