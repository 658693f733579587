"""What a prompt pass costs against the cache size it attends over (issue 16): one
SmolLM2-135M forward of ``P`` prompt rows written from slot 0 (random float32 weights,
per-layer output-major layout as the CPU AR loop runs it), with a cache of exactly ``P`` slots
(what ``jaxspec.causal.decode.prefill`` now uses, then ``grow_cache``) and with the decode
loop's ``P + max_new + k + 1`` slots (what it used before), interleaved in one process. Run from
the repository root:

    python results/kv-layout/prefill_slots.py --prompt 128 --max-new 128 512 1024
"""
import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
from jaxspec.bench.common import cpu_model  # noqa: E402
from jaxspec.bench.quant_matmul import SMOLLM2  # noqa: E402
from models.llama import modeling as M  # noqa: E402


def prompt_pass(P: int, S: int):
    model = M.CausalLM(SMOLLM2)

    def f(params, tokens):
        pos = jnp.arange(P, dtype=jnp.int32)[None]
        mask = jnp.arange(S)[None, None, :] <= pos[..., None]
        logits, cache = model.apply({"params": params}, tokens, pos, mask,
                                    cache=M.init_cache(SMOLLM2, 1, S),
                                    cache_index=jnp.zeros((1,), jnp.int32))
        return logits[:, -1].argmax(-1), M.grow_cache(cache, max(S, P))
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
    print("\n| attended slots | ms (fastest / median) | vs the prompt's slots (median) |")
    print("|---|---|---|")
    sizes = [P] + [P + n + a.k + 1 for n in a.max_new]
    fs = {S: prompt_pass(P, S) for S in sizes}
    ts = {S: [] for S in sizes}
    for r in range(a.reps + 2):
        for S in (sizes if r % 2 else sizes[::-1]):
            t = time.perf_counter()
            fs[S](params, tok)[0].block_until_ready()
            if r >= 2:
                ts[S].append(time.perf_counter() - t)
    base = np.median(ts[P])
    for S in sizes:
        t = np.array(ts[S]) * 1e3
        label = f"{S} (the prompt's)" if S == P else f"{S} (max_new {S - P - a.k - 1})"
        print(f"| {label} | {t.min():.1f} / {np.median(t):.1f} | {np.median(t) / 1e3 / base:.2f}x |")


if __name__ == "__main__":
    main()
