"""The AR loop with the one-task ``wo`` product as a batched product over row blocks against the
plain matrix-vector product, interleaved in one process on the real SmolLM2-135M-Instruct
weights (issue 16).

    python results/matvec-tasks/ab_wo_blocks.py [--blocks 1 2 4] [--reps 8] [--new 128] [--out FILE]

Each arm sets :data:`models.llama.modeling.ONE_TASK_BLOCKS` (1 = the plain product), compiles
the AR loop (:func:`jaxspec.causal.decode.generate`, batch 1, greedy) and keeps its executables;
the timed calls swap each arm's executables into the compile cache
(:mod:`jaxspec.core.runtime`), so every arm runs the program it was compiled with. The tokens
must be identical; each repetition runs the arms in alternating order.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from jaxspec.bench.common import cpu_model, emit_lines
from jaxspec.causal.decode import generate
from jaxspec.core import runtime
from models.llama import modeling as M
from models.registry import load_model

PROMPTS = ['def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
           'def is_palindrome(s: str) -> bool:\n    """Check whether s reads the same backwards."""\n',
           'from typing import List\n\n\ndef mean(xs: List[float]) -> float:\n']


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    tree = M.unstack_layers(params, output_major=True)
    prompts = [tok.encode(p) for p in PROMPTS]
    kw = dict(max_new_tokens=args.new, eos_ids=())
    exes, outs = {}, {}
    for b in args.blocks:
        M.ONE_TASK_BLOCKS = b
        jax.clear_caches()
        runtime._EXECUTABLES.clear()
        outs[b] = [generate(model, tree, [p], **kw).tokens for p in prompts]
        exes[b] = dict(runtime._EXECUTABLES)
    same = len({str(o) for o in outs.values()}) == 1
    ms = {b: [] for b in args.blocks}
    order = list(args.blocks)
    for r in range(args.reps):
        for b in (order if r % 2 == 0 else order[::-1]):
            runtime._EXECUTABLES.clear()
            runtime._EXECUTABLES.update(exes[b])
            for p in prompts:
                t0 = time.perf_counter()
                generate(model, tree, [p], **kw)
                ms[b].append((time.perf_counter() - t0) / args.new * 1e3)
    base = statistics.median(ms[order[0]])
    lines = [f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32, greedy AR, "
             f"{args.new} new tokens, {len(prompts)} prompts x {args.reps} interleaved reps; "
             f"identical tokens: {'yes' if same else 'NO'}", "",
             "| one-task products (`wo`, 576 x 576) | ms / token median | fastest | median speedup |",
             "|---|---|---|---|"]
    for b, t in ms.items():
        name = "plain matrix-vector product" if b == 1 else f"batched over {b} row blocks"
        lines.append(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f} | "
                     f"{base / statistics.median(t):.2f}x |")
    emit_lines(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
