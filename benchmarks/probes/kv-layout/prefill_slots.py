"""What a prompt pass costs against the cache size it attends over: one
SmolLM2-135M forward of ``P`` prompt rows written from slot 0 (random float32 weights,
per-layer output-major layout as the CPU AR loop runs it), with a cache of exactly ``P`` slots
(what ``jaxspec.causal.decode.prefill`` now uses, then ``grow_cache``) and with the decode
loop's ``P + max_new + k + 1`` slots (what it used before), interleaved in one process. Run from
the repository root:

    python benchmarks/probes/kv-layout/prefill_slots.py --prompt 128 --max-new 128 512 1024
"""

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
from jaxspec.bench.machine import cpu_model  # noqa: E402
from jaxspec.bench.quant_matmul import SMOLLM2  # noqa: E402
from models.llama import modeling as M  # noqa: E402


def prompt_pass(P: int, attend: int, S: int):
    """The jitted prompt pass over a cache of ``attend`` slots, grown to the loop's ``S``."""
    model = M.CausalLM(SMOLLM2)

    def f(params, tokens):
        pos = jnp.arange(P, dtype=jnp.int32)[None]
        mask = jnp.arange(attend)[None, None, :] <= pos[..., None]
        logits, cache = model.apply(
            {"params": params},
            tokens,
            pos,
            mask,
            cache=M.init_cache(SMOLLM2, 1, attend),
            cache_index=jnp.zeros((1,), jnp.int32),
        )
        return logits[:, -1].argmax(-1), M.grow_cache(cache, S)

    return jax.jit(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--max-new", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    P = a.prompt
    params = M.unstack_layers(M.init_params(SMOLLM2, 0), True)
    tok = jnp.full((1, P), 5, jnp.int32)
    print(f"{cpu_model()} · jax {jax.__version__} · prompt {P} tokens · {a.reps} interleaved calls")
    print(
        "\n| max_new | loop cache slots | before: attend all, ms (fastest / median) "
        "| now: attend "
        "the prompt's, then grow, ms (fastest / median) | median ratio |"
    )
    print("|---|---|---|---|---|")
    runs = {}
    for n in a.max_new:
        S = P + n + a.k + 1
        runs[n, "before"], runs[n, "now"] = prompt_pass(P, S, S), prompt_pass(P, P, S)
    ts = {key: [] for key in runs}
    for r in range(a.reps + 2):
        for key in list(runs) if r % 2 else list(runs)[::-1]:
            t = time.perf_counter()
            runs[key](params, tok)[0].block_until_ready()
            if r >= 2:
                ts[key].append(time.perf_counter() - t)
    for n in a.max_new:
        b, w = (np.array(ts[n, x]) * 1e3 for x in ("before", "now"))
        print(
            f"| {n} | {P + n + a.k + 1} | {b.min():.1f} / {np.median(b):.1f} | "
            f"{w.min():.1f} / {np.median(w):.1f} | {np.median(b) / np.median(w):.2f}x |"
        )


if __name__ == "__main__":
    main()
