"""The AR loop with the one-task ``wo`` product as a batched product over row blocks against the
plain matrix-vector product, interleaved in one process on the real SmolLM2-135M-Instruct
weights.

    python benchmarks/probes/matvec-tasks/ab_wo_blocks.py [--blocks 1 4] [--limit 8] [--reps 3]
        [--out FILE]

Each arm sets :data:`models.llama.modeling.ONE_TASK_BLOCKS` (1 = the plain product), compiles
the AR loop (:func:`jaxspec.causal.decode.generate`, batch 1, greedy, 128 new tokens, HumanEval
prompts) and keeps its executables; every timed call swaps its arm's executables into the
compile cache (:mod:`jaxspec.core.runtime`), so each arm runs the program it was compiled
with. The arms' tokens must be identical.
"""

from __future__ import annotations

import argparse

import jax

from jaxspec.bench.ab import ab_seconds, ab_table, compile_arms, emit_lines, run_arm
from jaxspec.bench.machine import cpu_model
from jaxspec.bench.prompts import suite_prompts
from jaxspec.causal.decode import generate
from models.llama import modeling as M
from models.registry import load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, nargs=2, default=[1, 4])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    tree = M.unstack_layers(params, output_major=True)
    prompts = [p.ids for p in suite_prompts(tok, ["humaneval"], args.limit)["humaneval"]]
    kw = dict(max_new_tokens=args.new, eos_ids=(2,))

    def switch(b):
        M.ONE_TASK_BLOCKS = b

    # the check, which also compiles each arm
    outs, exes = compile_arms(
        args.blocks,
        switch,
        lambda b: [generate(model, tree, [ids], **kw).tokens for ids in prompts],
    )
    same = len({str(o) for o in outs.values()}) == 1

    def run(b, ids):
        return run_arm(exes, b, generate, model, tree, [ids], **kw)

    secs, ratios = ab_seconds(run, tuple(args.blocks), prompts, args.reps)
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32, greedy AR, "
        f"{args.new} new tokens, {len(prompts)} HumanEval prompts x {args.reps} interleaved "
        f"reps; identical tokens: {'yes' if same else 'NO'}",
        "",
    ]
    lines += ab_table(
        secs,
        ratios,
        "one-task products (`wo`, 576 x 576)",
        lambda b: "plain matrix-vector product" if b == 1 else f"batched over {b} row blocks",
    )
    emit_lines(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
