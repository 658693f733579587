"""``jnp.argmax`` against :func:`jaxspec.core.sampling.argmax` (two vectorizable reductions,
the library's since this change): alone on logits-shaped arrays, and inside the
decode loops on real weights, interleaved in one process.

    python benchmarks/probes/argmax/ab_argmax.py [--parts micro dllm ar] [--reps 3] [--caches dual]
        [--gen-length 64] [--dllm-reps 8] [--out FILE]

``micro``: both functions jitted on float32 ``(rows, V)`` normal logits, ``V`` = 49,152
(SmolLM2) and 151,936 (Qwen2.5), every call timed, the arms alternating; fastest and median ms.

``dllm``: stepwise decoding of ``dream-smollm2-135m`` (gen ``--gen-length``, block 32,
low-confidence remasking, greedy) with the ``--caches`` (default: dual), 2 HumanEval prompts x
``--dllm-reps``, and its **loop
overhead** as the ``dllm`` suite defines it: the decode's wall clock over the sum of its
forwards each timed alone (:func:`jaxspec.bench.dllm.forward_costs`).

``ar``: the ``ar`` suite's ``jaxspec/ar`` and ``jaxspec/ngram`` systems on SmolLM2-135M-Instruct
(128 new tokens, draft length 8, 8 HumanEval prompts, CPU decode layout).

In the loops the arm ``jnp.argmax`` puts ``jnp.argmax`` back in every module that imports the
library's ``argmax``; each arm compiles its own programs (:func:`jaxspec.bench.ab.
compile_arms`). Tokens must be identical.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from jaxspec.asarm import passes as assd_passes
from jaxspec.bench.ab import ab_seconds, ab_table, compile_arms, emit_lines, run_arm
from jaxspec.bench.dllm import forward_costs, method_config, stepwise_forward_seconds
from jaxspec.bench.machine import cpu_model
from jaxspec.bench.prompts import suite_prompts
from jaxspec.bench.systems import JaxspecSystem
from jaxspec.causal import diffuspec, space, sps
from jaxspec.core import sampling, verify
from jaxspec.dllm import reference
from jaxspec.dllm.decode import diffusion_generate
from models.registry import load_model

ARMS = ("jnp.argmax", "two reductions")
LIBRARY = sampling.argmax
USERS = (sampling, verify, reference, space, sps, diffuspec, assd_passes)


def plain_argmax(x, axis=-1):
    return jnp.argmax(x, axis=axis).astype(jnp.int32)


def switch(arm):
    for module in USERS:
        module.argmax = plain_argmax if arm == ARMS[0] else LIBRARY


def micro(reps: int) -> list[str]:
    lines = [
        "**Alone** (jitted, float32 normal logits; ms per call over "
        f"{10 * reps} alternating calls)",
        "",
        "| shape | jnp.argmax median | fastest | two reductions median | fastest "
        "| speedup (medians) |",
        "|---|---|---|---|---|---|",
    ]
    fns = {ARMS[0]: jax.jit(plain_argmax), ARMS[1]: jax.jit(LIBRARY)}
    for V in (49152, 151936):
        for rows in (1, 9, 32):
            x = jax.random.normal(jax.random.PRNGKey(rows), (1, rows, V), jnp.float32) * 3
            assert (fns[ARMS[0]](x) == fns[ARMS[1]](x)).all()
            ts = {a: [] for a in ARMS}
            for i in range(10 * reps):
                for a in ARMS if i % 2 == 0 else ARMS[::-1]:
                    t0 = time.perf_counter()
                    jax.block_until_ready(fns[a](x))
                    ts[a].append((time.perf_counter() - t0) * 1e3)
            m = {a: statistics.median(t) for a, t in ts.items()}
            lines.append(
                f"| (1, {rows}, {V}) | {m[ARMS[0]]:.3f} | {min(ts[ARMS[0]]):.3f} | "
                f"{m[ARMS[1]]:.3f} | {min(ts[ARMS[1]]):.3f} | "
                f"{m[ARMS[0]] / m[ARMS[1]]:.2f}x |"
            )
    return lines + [""]


def dllm(reps: int, caches, gen_length: int) -> list[str]:
    model, params, tok, _ = load_model("dream-smollm2-135m", log=lambda m: None)
    prompts = [p.ids for p in suite_prompts(tok, ["humaneval"], 2)["humaneval"]]
    eos, pad = tuple(tok.eos_token_ids), tok.pad_token_id or 0
    lines = []
    for cache in caches:
        cfg = method_config("stepwise", gen_length=gen_length, block_length=32, cache=cache)
        gen = lambda ids: diffusion_generate(model, params, [ids], cfg, eos_ids=eos, pad_id=pad)
        outs, exes = compile_arms(ARMS, switch, lambda arm: [gen(ids).tokens for ids in prompts])
        switch(ARMS[1])
        same = outs[ARMS[0]] == outs[ARMS[1]]
        lone = [
            stepwise_forward_seconds(
                forward_costs(model, params, len(ids), cfg, reps=5), len(ids), cfg
            )
            for ids in prompts
        ]
        run_s = {a: [] for a in ARMS}

        def run(arm, i):
            run_s[arm].append((i, run_arm(exes, arm, gen, prompts[i]).run_s))

        secs, ratios = ab_seconds(run, ARMS, range(len(prompts)), reps)
        over = {a: statistics.median(s / lone[i] - 1 for i, s in run_s[a]) for a in ARMS}
        lines += [
            f"**dLLM stepwise, {cache} cache, gen {gen_length}** (2 prompts x {reps} reps; "
            f"identical tokens: {'yes' if same else 'NO'}; lone forwards "
            f"{', '.join(f'{s:.2f}' for s in lone)} s per prompt)",
            "",
        ]
        lines += ab_table(secs, ratios, "argmax")
        lines += [
            "",
            "loop overhead (median over calls of decode seconds / lone forwards - 1): "
            + ", ".join(f"{a} {over[a]:+.1%}" for a in ARMS),
            "",
        ]
    return lines


def ar(reps: int) -> list[str]:
    model, params, tok, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    prompts = [p.ids for p in suite_prompts(tok, ["humaneval"], 8)["humaneval"]]
    lines = []
    for method in ("ar", "ngram"):
        system = JaxspecSystem(method, model, params, max_new_tokens=128, eos_ids=(2,), pad_id=0)
        outs, exes = compile_arms(
            ARMS, switch, lambda arm: [system.run(ids).tokens for ids in prompts]
        )
        switch(ARMS[1])
        same = outs[ARMS[0]] == outs[ARMS[1]]
        secs, ratios = ab_seconds(
            lambda arm, ids: run_arm(exes, arm, system.run, ids), ARMS, prompts, reps
        )
        lines += [
            f"**jaxspec/{method}, SmolLM2-135M-Instruct** (8 prompts x {reps} reps, 128 "
            f"new tokens, draft length 8; identical tokens: {'yes' if same else 'NO'})",
            "",
        ]
        lines += ab_table(secs, ratios, "argmax") + [""]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--parts", nargs="+", default=["micro", "dllm", "ar"], choices=["micro", "dllm", "ar"]
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--caches", nargs="+", default=["dual"], choices=["none", "prefix", "dual"])
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--dllm-reps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    lines = [f"{cpu_model()}, jax {jax.__version__}, float32, greedy", ""]
    for part in args.parts:
        lines += (
            dllm(args.dllm_reps, args.caches, args.gen_length)
            if part == "dllm"
            else {"micro": micro, "ar": ar}[part](args.reps)
        )
        print("\n".join(lines), file=sys.stderr)
    emit_lines(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
