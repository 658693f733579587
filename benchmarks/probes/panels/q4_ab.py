"""Q4_1 / Q8_0 panels against float32 panels, one process, arms alternating
(:func:`jaxspec.bench.ab.ab_seconds`): SmolLM2-135M (the GGUF Q4_1 file) decoding HumanEval
prompts greedily at batch 1, AR and n-gram (k = 8, no bigram fallback: the `ar` suite's
system), 128 new tokens:

    python benchmarks/probes/panels/q4_ab.py [--limit 8] [--reps 3] [--out FILE.md]

Arm ``q4``: the decode layout with every projection in Q4_1 panels and the tied head in Q8_0
panels (:func:`models.llama.panels.pack_exact`), so one-token steps run on panels too
(:func:`models.llama.layout.plan`). Arm ``f32``: float32 panels for the verification passes and
XLA's output-major products for one-token steps (the layout before Q4_1 panels,
``JAXSPEC_PANELS_Q4=0``). Both multiply the same float32 matrices; the tokens are checked
identical between the arms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from jaxspec.bench.ab import ab_seconds, emit_lines
from jaxspec.bench.machine import machine_info
from jaxspec.bench.prompts import suite_prompts
from jaxspec.causal.decode import decode_plan, generate
from jaxspec.core.drafters import NgramDrafter
from models.llama import layout, panels
from models.llama.modeling import HEAD_PANELS, unstack_layers
from models.registry import load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not panels.panels_active():
        raise SystemExit("the panel kernel is not active here (JAXSPEC_PANELS=0, no g++, no CPU)")
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    prompts = suite_prompts(tok, ["humaneval"], args.limit)["humaneval"]
    if not layout.quantized_panels(params):
        raise SystemExit("the model's matrices are not Q4_1-exact")
    # arm q4: a tree split ahead in Q4_1 / Q8_0 panels (decoders run a split tree as it is)
    q4 = unstack_layers(params, panels=True)
    q4[HEAD_PANELS] = panels.pack_exact(params["embed"].T)
    assert panels.is_q8(q4[HEAD_PANELS]) and panels.is_q4(q4["layers"][0]["wqkv_p"])
    panels.Q4 = False  # arm f32: the stacked tree, laid out by the decoders as before
    trees = {"q4": q4, "f32": params}
    drafter = NgramDrafter(8, model.config.vocab_size, bigram_fallback=False)  # as `ar` suite
    plans = {
        (arm, m): decode_plan(model, tree, drafter if m == "ngram" else None, layer_loop="unrolled")
        for arm, tree in trees.items()
        for m in ("ar", "ngram")
    }
    tokens: dict = {}

    def run(arm_method, p):
        arm, m = arm_method.split("/")
        out = generate(
            model,
            trees[arm],
            [p.ids],
            max_new_tokens=args.max_new_tokens,
            drafter=drafter if m == "ngram" else None,
            plan=plans[(arm, m)],
        )
        tokens[(arm_method, p.task_id)] = out.tokens
        return out

    lines = [
        f"# Q4_1 / Q8_0 panels against float32 panels ({machine_info().get('cpu', '?')}, "
        f"jax {jax.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"HumanEval, first {len(prompts)} prompts, batch 1, greedy, {args.max_new_tokens} new "
        f"tokens; {args.reps} alternating rounds per prompt.",
        "",
        "| method | plan (f32 arm) | plan (q4 arm) | f32 tok/s | q4 tok/s | q4 speedup (median "
        "over prompts) | tokens identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in ("ar", "ngram"):
        arms = [f"f32/{m}", f"q4/{m}"]
        for a in arms:  # compile, untimed
            run(a, prompts[0])
        secs, ratios = ab_seconds(run, arms, prompts, args.reps)
        new = sum(len(tokens[(arms[0], p.task_id)][0]) for p in prompts)
        rate = {a: new * args.reps / sum(secs[a]) for a in arms}
        same = all(tokens[(arms[0], p.task_id)] == tokens[(arms[1], p.task_id)] for p in prompts)
        lines.append(
            f"| {m} | {plans[('f32', m)].settings} | {plans[('q4', m)].settings} | "
            f"{rate[arms[0]]:.1f} | {rate[arms[1]]:.1f} | {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {'yes' if same else 'NO'} |"
        )
    emit_lines(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
