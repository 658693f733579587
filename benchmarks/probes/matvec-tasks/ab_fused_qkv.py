"""The AR loop with q/k/v fused into one product against three products, interleaved in one
process on the real SmolLM2-135M-Instruct weights.

    python benchmarks/probes/matvec-tasks/ab_fused_qkv.py [--reps 8] [--new 128] [--out FILE]

Both trees are the per-layer output-major decode layout
(:func:`models.llama.modeling.unstack_layers`), one with ``wqkv_t`` (the default since this
change, :func:`models.llama.modeling.fuse_qkv`) and one with the three matrices split back out.
Greedy AR (:func:`jaxspec.causal.decode.generate`, batch 1) over a few HumanEval-style prompts;
the tokens must be identical, and each repetition runs both trees in alternating order.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from jaxspec.bench.ab import emit_lines
from jaxspec.bench.machine import cpu_model
from jaxspec.causal.decode import generate
from models.llama import modeling as M
from models.registry import load_model

PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    'def is_palindrome(s: str) -> bool:\n    """Check whether s reads the same backwards."""\n',
    "from typing import List\n\n\ndef mean(xs: List[float]) -> float:\n",
]


def unfused(tree, config):
    """The output-major tree with ``wqkv_t`` split back into ``wq_t``, ``wk_t``, ``wv_t``."""
    q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim

    def split(lp):
        q, k, v = jnp.split(lp["wqkv_t"], (q_dim, q_dim + kv_dim), axis=0)
        return {
            **{key: w for key, w in lp.items() if key != "wqkv_t"},
            "wq_t": q,
            "wk_t": k,
            "wv_t": v,
        }

    return {**tree, "layers": tuple(split(lp) for lp in tree["layers"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    fused = M.unstack_layers(params, output_major=True)
    assert "wqkv_t" in fused["layers"][0]
    trees = {
        "three products (wq_t, wk_t, wv_t)": unfused(fused, model.config),
        "fused (wqkv_t)": fused,
    }
    prompts = [tok.encode(p) for p in PROMPTS]
    kw = dict(max_new_tokens=args.new, eos_ids=())
    outs = {n: [generate(model, t, [p], **kw).tokens for p in prompts] for n, t in trees.items()}
    same = len({str(o) for o in outs.values()}) == 1
    ms = {n: [] for n in trees}
    order = list(trees)
    for r in range(args.reps):
        for n in order if r % 2 == 0 else order[::-1]:
            for p in prompts:
                t0 = time.perf_counter()
                generate(model, trees[n], [p], **kw)
                ms[n].append((time.perf_counter() - t0) / args.new * 1e3)
    base = statistics.median(ms[order[0]])
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M-Instruct float32, greedy AR, "
        f"{args.new} new tokens, {len(prompts)} prompts x {args.reps} interleaved reps; "
        f"identical tokens: {'yes' if same else 'NO'}",
        "",
        "| layout | ms / token median | fastest | median speedup |",
        "|---|---|---|---|",
    ]
    for n, t in ms.items():
        lines.append(
            f"| {n} | {statistics.median(t):.2f} | {min(t):.2f} | "
            f"{base / statistics.median(t):.2f}x |"
        )
    emit_lines(lines, args.out)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
