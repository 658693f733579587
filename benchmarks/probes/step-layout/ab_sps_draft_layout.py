"""SPS with the draft model's weights in the AR loop's layout (output-major, fused q/k/v)
against the stored layout, interleaved in one process.

    python benchmarks/probes/step-layout/ab_sps_draft_layout.py [--limit 4] [--reps 3] [--out FILE]

SmolLM2-135M-Instruct drafts for itself (the only SmolLM2 size the machine holds): greedy,
draft length 5, so every draft is accepted and each step runs the draft model's 2-row pass and
4 one-token steps, then one 6-row verification pass. The arms differ only in the draft model's
weight layout (``DraftModelDrafter.one_token_steps``); the target verifies on the stored layout
in both. 128 new tokens, HumanEval prompts; tokens must be identical to AR in both arms.
"""

from __future__ import annotations

import argparse

import jax

from jaxspec.bench.ab import ab_seconds, ab_table, emit_lines
from jaxspec.bench.machine import cpu_model
from jaxspec.bench.prompts import suite_prompts
from jaxspec.causal.decode import generate
from jaxspec.causal.sps import DraftModelDrafter
from models.llama.layout import DecodePlan
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
    kw = dict(
        max_new_tokens=args.new,
        eos_ids=(2,),
        drafter=DraftModelDrafter(model, 5),
        drafter_params=params,
    )

    def run(arm, ids):
        # the target verifies on stored weights in both arms; the arm is the draft's layout
        plan = DecodePlan(
            layer_loop="unrolled", verify_layout="stored", draft_loop="unrolled", draft_layout=arm
        )
        return generate(model, params, [ids], plan=plan, **kw)

    arms = ("stored", "output-major")
    same = True
    ar_plan = DecodePlan(layer_loop="unrolled")
    for ids in prompts:  # the check, which also compiles both arms
        ref = generate(
            model, params, [ids], max_new_tokens=args.new, eos_ids=(2,), plan=ar_plan
        ).tokens
        same &= all(run(a, ids).tokens == ref for a in arms)
    secs, ratios = ab_seconds(run, arms, prompts, args.reps)
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32 drafting for "
        f"itself (SPS, k = 5, greedy), {args.new} new tokens, {len(prompts)} HumanEval "
        "prompts "
        f"x {args.reps} interleaved reps; identical to AR in both arms: "
        f"{'yes' if same else 'NO'}",
        "",
    ] + ab_table(secs, ratios, "draft model's weights")
    emit_lines(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
