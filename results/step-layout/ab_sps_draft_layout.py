"""SPS with the draft model's weights in the AR loop's layout (output-major, fused q/k/v)
against the stored layout, interleaved in one process (issue 16).

    python results/step-layout/ab_sps_draft_layout.py [--limit 4] [--reps 3] [--out FILE]

SmolLM2-135M-Instruct drafts for itself (the only SmolLM2 size the machine holds): greedy,
draft length 5, so every draft is accepted and each step runs the draft model's 2-row pass and
4 one-token steps, then one 6-row verification pass. The arms differ only in the draft model's
weight layout (``DraftModelDrafter.one_token_steps``); the target verifies on the stored layout
in both. 128 new tokens, HumanEval prompts; tokens must be identical to AR in both arms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from jaxspec.bench.common import cpu_model, emit_lines, suite_prompts
from jaxspec.causal.decode import generate
from jaxspec.causal.sps import DraftModelDrafter
from jaxspec.core.runtime import layer_loop, verify_layout
from models.registry import load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    prompts = [p.ids for p in suite_prompts(tok, ["humaneval"], args.limit)["humaneval"]]
    kw = dict(max_new_tokens=args.new, eos_ids=(2,), drafter=DraftModelDrafter(model, 5),
              drafter_params=params)

    def run(arm, ids):
        DraftModelDrafter.one_token_steps = arm == "output-major"
        try:
            return generate(model, params, [ids], **kw)
        finally:
            DraftModelDrafter.one_token_steps = True

    arms = ("stored", "output-major")
    ratios, secs, same = [], {a: [] for a in arms}, True
    with layer_loop("unrolled"), verify_layout("stored"):
        for i, ids in enumerate(prompts):
            ref = generate(model, params, [ids], max_new_tokens=args.new, eos_ids=(2,)).tokens
            same &= all(run(a, ids).tokens == ref for a in arms)  # also compiles both
            mine = {a: [] for a in arms}
            for r in range(args.reps):
                for a in (arms if (i + r) % 2 == 0 else arms[::-1]):
                    t0 = time.perf_counter()
                    run(a, ids)
                    mine[a].append(time.perf_counter() - t0)
            for a in arms:
                secs[a] += mine[a]
            ratios.append(statistics.median(mine["stored"]) / statistics.median(mine[arms[1]]))
            print(f"prompt {i}: {len(ref[0])} tokens, speedup {ratios[-1]:.2f}", flush=True)
    lines = [f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32 drafting for "
             f"itself (SPS, k = 5, greedy), {args.new} new tokens, {len(prompts)} HumanEval prompts "
             f"x {args.reps} interleaved reps; identical to AR in both arms: "
             f"{'yes' if same else 'NO'}", "",
             "| draft model's weights | seconds per prompt, median | fastest | "
             "median of per-prompt speedups |", "|---|---|---|---|"]
    for a, t in secs.items():
        ratio = 1.0 if a == "stored" else statistics.median(ratios)
        lines.append(f"| {a} | {statistics.median(t):.2f} | {min(t):.2f} | {ratio:.2f}x |")
    lines += ["", "per-prompt speedups: " + ", ".join(f"{r:.2f}" for r in ratios)]
    emit_lines(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
