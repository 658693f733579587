"""XLA's attention against the CPU cached-attention kernel (:mod:`models.llama.attention`) on
the panel decode layout, one process, arms alternating, each arm on its own compiled programs
(:func:`jaxspec.bench.ab.compile_arms`):

    python benchmarks/probes/attention/ab_attention.py [--limit 8] [--reps 3] [--out FILE.md]

1. **Passes**: SmolLM2-135M (the GGUF Q4_1 file, Q4_1 / Q8_0 panels) KV-cached passes of 1, 2,
   4, 9 and 16 query rows written at the end of a 384-slot cache (every slot seen: the costliest
   case; :func:`models.llama.layout.pass_seconds`'s pass), and the 128-row prompt pass; fastest
   and median ms of ``10 * reps`` calls.
2. **Decoding**: the ``ar`` suite's AR and n-gram systems (k = 8, no bigram fallback) on the
   first ``--limit`` HumanEval prompts, batch 1, greedy, 128 new tokens; tokens checked
   identical between the arms.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from jaxspec.bench.ab import ab_seconds, compile_arms, emit_lines, run_arm
from jaxspec.bench.machine import machine_info
from jaxspec.bench.prompts import suite_prompts
from jaxspec.causal.decode import decode_plan, generate
from jaxspec.core.drafters import NgramDrafter
from models.llama import attention, layout, panels
from models.llama.modeling import init_cache
from models.registry import load_model

ARMS = ("xla", "kernel")


def switch(arm):
    attention.KERNEL = arm == "kernel"


def passes(model, tree, reps: int) -> list[str]:
    rows = (1, 2, 4, 9, 16, 128)
    inputs = {
        r: (jnp.zeros((1, r), jnp.int32), init_cache(model.config, 1, 384 if r < 128 else r))
        for r in rows
    }

    # one jitted function object per arm, traced under its switch: JAX's trace caches key on
    # the function, not on the switch
    fns = {a: jax.jit(lambda t, x, c: layout._lone_pass(t, x, c, model=model)) for a in ARMS}
    outs = {}
    for a in ARMS:
        switch(a)
        outs[a] = {r: jax.block_until_ready(fns[a](tree, *args)) for r, args in inputs.items()}
    ms = {(a, r): [] for a in ARMS for r in rows}
    for i in range(10 * reps):
        for a in ARMS if i % 2 == 0 else ARMS[::-1]:
            for r, args in inputs.items():
                t0 = time.perf_counter()
                jax.block_until_ready(fns[a](tree, *args))
                ms[(a, r)].append((time.perf_counter() - t0) * 1e3)
    lines = [
        "| query rows | XLA attention: fastest / median ms | kernel: fastest / median ms | "
        "speedup (medians) | logits max abs diff |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        x, k = ms[("xla", r)], ms[("kernel", r)]
        diff = float(jnp.max(jnp.abs(outs["xla"][r] - outs["kernel"][r])))
        label = f"{r} (prompt pass, cache {r})" if r == 128 else str(r)
        lines.append(
            f"| {label} | {min(x):.1f} / {statistics.median(x):.1f} | {min(k):.1f} / "
            f"{statistics.median(k):.1f} | {statistics.median(x) / statistics.median(k):.2f}x | "
            f"{diff:.1e} |"
        )
    return lines


def decoding(model, params, tok, limit: int, reps: int, max_new: int) -> list[str]:
    prompts = suite_prompts(tok, ["humaneval"], limit)["humaneval"]
    drafter = NgramDrafter(8, model.config.vocab_size, bigram_fallback=False)  # as `ar` suite
    lines = [
        "| method | plan | XLA attention tok/s | kernel tok/s | speedup (median over "
        "prompts) | tokens identical |",
        "|---|---|---|---|---|---|",
    ]
    for m in ("ar", "ngram"):
        d = drafter if m == "ngram" else None
        plan = decode_plan(model, params, d, layer_loop="unrolled")

        def gen(p):
            return generate(model, params, [p.ids], max_new_tokens=max_new, drafter=d, plan=plan)

        outs, exes = compile_arms(ARMS, switch, lambda arm: [gen(p).tokens for p in prompts])

        def run(arm, p):
            return run_arm(exes, arm, gen, p)

        secs, ratios = ab_seconds(run, ARMS, prompts, reps)
        new = sum(len(t[0]) for t in outs["xla"])
        rate = {a: new * reps / sum(secs[a]) for a in ARMS}
        same = outs["xla"] == outs["kernel"]
        lines.append(
            f"| {m} | {plan.settings} | {rate['xla']:.1f} | {rate['kernel']:.1f} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{'yes' if same else 'NO'} |"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not panels.panels_active():
        raise SystemExit("the panel layout is not active here (JAXSPEC_PANELS=0, no g++, no CPU)")
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    tree = layout.decode_layout(params, "unrolled", False)
    lines = [
        f"# XLA's attention against the cached-attention kernel ({machine_info().get('cpu', '?')}"
        f", jax {jax.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"SmolLM2-135M-Instruct, Q4_1 / Q8_0 panels; arms alternating, {args.reps} rounds.",
        "",
        "**KV-cached passes** (384-slot cache, every slot seen; the prompt pass: 128 rows)",
        "",
        *passes(model, tree, args.reps),
        "",
        f"**Decoding** (HumanEval, first {args.limit} prompts, batch 1, greedy, "
        f"{args.max_new_tokens} new tokens)",
        "",
        *decoding(model, params, tok, args.limit, args.reps, args.max_new_tokens),
    ]
    emit_lines(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
