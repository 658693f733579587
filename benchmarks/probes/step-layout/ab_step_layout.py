"""The n-gram loop's one-token steps on the AR layout against the verification layout,
interleaved in one process on the real SmolLM2-135M-Instruct weights.

    python benchmarks/probes/step-layout/ab_step_layout.py [--limit 8] [--reps 2] [--out FILE]

Both arms verify drafts on the stored (input-major) per-layer weights
(``DecodePlan(verify_layout="stored")``, what the ``ar`` suite's timing picked on this CPU). They
differ in the steps that find no draft to verify (:func:`jaxspec.causal.decode.step`): on the same
stored weights (what the loop did before ``settings["step_layout"]``), or on the output-major
weights with fused q/k/v (the AR loop's layout, now the default). Greedy, draft length 8, n-grams
2-3, no bigram fallback (the suite's ``jaxspec/ngram``), 128 new tokens, HumanEval prompts. The
tokens must be identical between the arms and to AR decoding.
"""

from __future__ import annotations

import argparse

import jax

import jaxspec.causal.decode as D
from jaxspec.bench.ab import ab_seconds, ab_table, emit_lines
from jaxspec.bench.machine import cpu_model
from jaxspec.bench.prompts import suite_prompts
from jaxspec.core.drafters import NgramDrafter
from models.llama.layout import DecodePlan
from models.registry import load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    prompts = [p.ids for p in suite_prompts(tok, ["humaneval"], args.limit)["humaneval"]]
    drafter = NgramDrafter(
        8, model.config.vocab_size, max_ngram=3, min_ngram=2, bigram_fallback=False
    )
    kw = dict(max_new_tokens=args.new, eos_ids=(2,))
    ar_plan = DecodePlan(layer_loop="unrolled")

    def run(arm, ids):
        # verification on stored weights in both arms; the arm is the one-token steps' layout
        plan = DecodePlan(layer_loop="unrolled", verify_layout="stored", step_layout=arm)
        return D.generate(model, params, [ids], drafter=drafter, plan=plan, **kw)

    arms = ("stored", "output-major")
    same, steps, no_draft = True, 0, 0
    for ids in prompts:  # the check, which also compiles both arms
        ref = D.generate(model, params, [ids], plan=ar_plan, **kw).tokens  # AR
        outs = {}
        for a in arms:
            res = run(a, ids)
            assert res.settings["step_layout"] == a, res.settings
            outs[a] = res.tokens
        same &= outs["stored"] == outs["output-major"] == ref
        steps += int(res.stats.target_nfe[0]) - 1
        no_draft += int(res.stats.target_nfe[0]) - 1 - int(res.stats.drafts_proposed[0]) // 8
    secs, ratios = ab_seconds(run, arms, prompts, args.reps)
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32, greedy n-gram "
        f"(k = 8), {args.new} new tokens, {len(prompts)} HumanEval prompts x {args.reps} "
        f"interleaved reps; identical to AR in both arms: {'yes' if same else 'NO'}; "
        f"{no_draft} of {steps} loop steps had no draft ({no_draft / max(steps, 1):.0%})",
        "",
    ]
    lines += ab_table(secs, ratios, "one-token steps on", lambda a: f"{a} weights")
    emit_lines(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
