"""The prompt pass with the LM head over every prompt row against the last row only (the
default since this change), interleaved in one process on the real SmolLM2-135M-Instruct
weights.

    python benchmarks/probes/prompt-head/ab_prompt_head.py [--limit 8] [--reps 3] [--new 1 128]
        [--out FILE]

Arm ``all rows`` runs :func:`jaxspec.causal.decode.prefill` with the old head: the module's
``target_pass`` is wrapped so the prompt pass asks for every row's logits (the loop still
reads the last). Arm ``last row`` is the library as it is. Each arm compiles the AR loop
(:func:`jaxspec.causal.decode.generate`, batch 1, greedy, HumanEval prompts, CPU decode layout)
and keeps its executables; every timed call swaps its arm's executables into the compile
cache, so each arm runs the program it was compiled with. ``--new 1`` times the prompt pass
and first token (TTFT); ``--new 128`` the suite's whole generation. Tokens must be identical.
"""

from __future__ import annotations

import argparse

import jax

from jaxspec.bench.ab import ab_seconds, ab_table, compile_arms, emit_lines, run_arm
from jaxspec.bench.machine import cpu_model
from jaxspec.bench.prompts import suite_prompts
from jaxspec.causal import decode
from models.llama import modeling as M
from models.registry import load_model

ARMS = ("all rows", "last row")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new", type=int, nargs="+", default=[1, 128])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    tree = M.unstack_layers(params, output_major=True)
    prompts = [p.ids for p in suite_prompts(tok, ["humaneval"], args.limit)["humaneval"]]
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32, greedy AR, "
        f"{len(prompts)} HumanEval prompts ({min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens) x {args.reps} interleaved reps",
        "",
    ]
    library = decode.target_pass

    def every_row(*a, last_only=False, **k):
        return library(*a, **k)

    def switch(arm):
        decode.target_pass = every_row if arm == "all rows" else library

    for new in args.new:
        kw = dict(max_new_tokens=new, eos_ids=(2,))
        # the check, which also compiles each arm
        outs, exes = compile_arms(
            ARMS,
            switch,
            lambda arm: [decode.generate(model, tree, [ids], **kw).tokens for ids in prompts],
        )
        decode.target_pass = library
        same = outs[ARMS[0]] == outs[ARMS[1]]

        def run(arm, ids):
            return run_arm(exes, arm, decode.generate, model, tree, [ids], **kw)

        secs, ratios = ab_seconds(run, ARMS, prompts, args.reps)
        lines += [
            f"**{new} new token{'s' if new > 1 else ''}** (identical tokens: "
            f"{'yes' if same else 'NO'})",
            "",
        ]
        lines += ab_table(secs, ratios, "prompt pass's LM head") + [""]
    emit_lines(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
