"""A/B of the KV-cache layout: one KV-cached SmolLM2-135M forward (random float32
weights, per-layer output-major layout as the CPU AR loop runs it, cache donated) with the cache
layout of commit ``--old`` (``(L, B, S, K, Dh)`` keys and values) against the working tree's
(head-major keys ``(L, B, K, S, Dh)``, slot-minor values ``(L, B, K, Dh, S)``), interleaved in
one process. Run from the repository root:

    python benchmarks/probes/kv-layout/ab_cache_layout.py --old c5d0dd1 \
        --shapes 1x384 1x1024 9x384 32x384
"""

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
from jaxspec.bench.machine import cpu_model  # noqa: E402
from jaxspec.bench.quant_matmul import SMOLLM2  # noqa: E402
from models.llama import modeling as new  # noqa: E402


def old_module(commit: str):
    src = subprocess.run(
        ["git", "show", f"{commit}:models/llama/modeling.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    path.write(src)
    path.close()
    spec = importlib.util.spec_from_file_location("old_modeling", path.name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_modeling"] = mod  # flax's dataclass transform looks the module up
    spec.loader.exec_module(mod)
    return mod


def step(M, T: int, S: int):
    model = M.CausalLM(SMOLLM2)

    def f(params, cache, tokens):
        pos = 100 + jnp.arange(T, dtype=jnp.int32)[None]
        mask = jnp.arange(S)[None, None, :] <= pos[..., None]
        logits, cache = model.apply(
            {"params": params},
            tokens,
            pos,
            mask,
            cache=cache,
            cache_index=jnp.array([100], jnp.int32),
        )
        return logits[:, -1].argmax(-1), cache

    return jax.jit(f, donate_argnums=(1,)), M.init_cache(SMOLLM2, 1, S)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", default="c5d0dd1")
    ap.add_argument(
        "--shapes",
        nargs="+",
        default=["1x384", "1x1024", "9x384", "32x384"],
        help="TxS: query rows x cache slots",
    )
    ap.add_argument("--reps", type=int, default=60)
    a = ap.parse_args()
    old = old_module(a.old)
    params = new.unstack_layers(new.init_params(SMOLLM2, 0), True)
    print(f"{cpu_model()} · jax {jax.__version__} · {a.reps} interleaved calls per layout")
    print(
        "\n| rows x slots | old ms (fastest / median) | new ms (fastest / median) | median ratio |"
    )
    print("|---|---|---|---|")
    for shape in a.shapes:
        T, S = map(int, shape.split("x"))
        tok = jnp.full((1, T), 5, jnp.int32)
        runs = {"old": list(step(old, T, S)), "new": list(step(new, T, S))}
        ts = {k: [] for k in runs}
        for r in range(a.reps + 3):
            for k in ("old", "new") if r % 2 else ("new", "old"):
                f, cache = runs[k]
                t = time.perf_counter()
                out, runs[k][1] = f(params, cache, tok)
                out.block_until_ready()
                if r >= 3:
                    ts[k].append(time.perf_counter() - t)
        o, n = (np.array(ts[k]) * 1e3 for k in ("old", "new"))
        print(
            f"| {T} x {S} | {o.min():.2f} / {np.median(o):.2f} | {n.min():.2f} / "
            f"{np.median(n):.2f} | {np.median(o) / np.median(n):.2f}x |"
        )


if __name__ == "__main__":
    main()
