"""How many threads XLA:CPU gives a one-token matrix-vector product, per shape.

    python benchmarks/probes/matvec-tasks/tasks.py [--reps 15] [--out results/matvec-tasks/tasks.md]

XLA:CPU lowers a matrix-vector product to its tiled GEMV kernel and splits the output rows into
``min(ceil(m / ceil(2**19 / k)), 8)`` tasks: at least 2^19 multiply-adds per task (XLA's
``DotOpEmitter::EmitTiledLlvmIrGemv``, read for the constant). For each SmolLM2-135M product
shape ``(m, k)`` (output-major, ``(out, in)``), this times a chain of distinct matrices of about
300 MB where each product's input is the previous product's output (as in a decode step, so
XLA cannot run two of them at once), and reports GB/s and the threads busy on average (process
CPU time over wall time). Random float32 weights; the timing does not depend on the values.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.machine import cpu_model

SHAPES = {
    "wq, wo (576 x 576)": (576, 576),
    "wk, wv (192 x 576)": (192, 576),
    "wq + wk + wv fused (960 x 576)": (960, 576),
    "w_gate, w_up (1536 x 576)": (1536, 576),
    "w_down (576 x 1536)": (576, 1536),
}


def predicted_tasks(m: int, k: int) -> int:
    return min(math.ceil(m / math.ceil(2**19 / k)), 8)


def chain(m: int, k: int, total_bytes: float = 300e6, seed: int = 0):
    """A jitted chain of dependent products over distinct ``(m, k)`` matrices, and its args."""
    n = max(1, int(total_bytes // (m * k * 4)))
    rng = np.random.default_rng(seed)
    ws = [jnp.asarray(rng.standard_normal((m, k), np.float32) / np.sqrt(k)) for _ in range(n)]

    def f(ws, x):
        for w in ws:
            y = jnp.einsum("ti,oi->to", x, w)
            # the next input depends on every output row (no row can be dropped)
            x = jnp.tanh(jnp.resize(y, x.shape) + 1e-3 * y.sum())
        return x

    return jax.jit(f), (ws, jnp.ones((1, k), jnp.float32)), n * m * k * 4


def measure(f, args, reps: int) -> tuple[float, float, float]:
    """(median s, fastest s, threads busy on average)."""
    for _ in range(3):
        jax.block_until_ready(f(*args))
    ts, c0, w0 = [], time.process_time(), time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)), min(ts), (time.process_time() - c0) / (time.perf_counter() - w0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    lines = [
        f"{cpu_model()}, {jax.device_count()} device(s), jax {jax.__version__}, "
        f"{args.reps} calls per shape, float32",
        "",
        "| product | XLA tasks (2^19 FMA each) | GB/s median | GB/s fastest | threads busy |",
        "|---|---|---|---|---|",
    ]
    for name, (m, k) in SHAPES.items():
        f, a, nbytes = chain(m, k)
        med, best, threads = measure(f, a, args.reps)
        lines.append(
            f"| {name} | {predicted_tasks(m, k)} | {nbytes / med / 1e9:.1f} | "
            f"{nbytes / best / 1e9:.1f} | {threads:.2f} |"
        )
        print(lines[-1], flush=True)
    if args.out:  # the rows were printed as they came
        pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
