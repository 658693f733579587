"""Ways to write SmolLM2-135M's one-task ``wo`` product (``576 x 576``, one input row) on
XLA:CPU, and the row blocking on the two-task shapes (docs/performance.md, "`wo` in row
blocks").

    python benchmarks/probes/matvec-tasks/wo_variants.py [--reps 15]
        [--out results/matvec-tasks/wo_variants.md]

Each variant times a jitted chain of dependent products over distinct matrices (about 300 MB,
as :mod:`tasks`), all variants interleaved call by call; GB/s of the weights read and the
threads busy on average (process CPU time over wall time). Random float32 weights.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.ab import emit_lines
from jaxspec.bench.machine import cpu_model


def _product(kind: str, x, w):
    """One ``(1, k) -> (1, m)`` product of ``x`` with the matrix laid out for ``kind``."""
    if kind == "plain":
        return jnp.einsum("ti,oi->to", x, w)
    if kind == "stored":  # (in, out)
        return x @ w
    if kind == "halves":  # two independent half products
        return jnp.concatenate([jnp.einsum("ti,oi->to", x, h) for h in w], -1)
    if kind.startswith("pad"):  # the row padded to more rows: the matrix-matrix path
        rows = int(kind[3:])
        return jnp.einsum("ti,oi->to", jnp.pad(x, ((0, rows - 1), (0, 0))), w)[:1]
    if kind == "multiply-reduce":
        return jnp.sum(w * x, axis=1)[None]
    b = int(kind.split()[0])  # "<b> blocks": the batched product of output_major_product
    return jnp.einsum("bi,boi->bo", jnp.broadcast_to(x, (b, x.shape[1])), w).reshape(1, -1)


def _layout(kind: str, w: np.ndarray):
    m, k = w.shape
    if kind == "stored":
        return jnp.asarray(w.T.copy())
    if kind == "halves":
        return (jnp.asarray(w[: m // 2].copy()), jnp.asarray(w[m // 2 :].copy()))
    if kind.endswith("blocks"):
        b = int(kind.split()[0])
        return jnp.asarray(w.reshape(b, m // b, k).copy())
    return jnp.asarray(w)


def compare(m: int, k: int, kinds, reps: int, total_bytes: float = 300e6) -> list[str]:
    n = max(1, int(total_bytes // (m * k * 4)))
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((m, k), np.float32) / np.sqrt(k) for _ in range(n)]
    trees = {kd: [_layout(kd, w) for w in mats] for kd in kinds}

    def chain(kind):
        def f(ws, x):
            for w in ws:
                y = _product(kind, x, w)
                x = jnp.tanh(jnp.resize(y, x.shape) + 1e-3 * y.sum())
            return x

        return jax.jit(f)

    fs, x = {kd: chain(kd) for kd in kinds}, jnp.ones((1, k), jnp.float32)
    for kd in kinds:
        for _ in range(3):
            jax.block_until_ready(fs[kd](trees[kd], x))
    wall, cpu = {kd: [] for kd in kinds}, dict.fromkeys(kinds, 0.0)
    for _ in range(reps):
        for kd in kinds:
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(fs[kd](trees[kd], x))
            wall[kd].append(time.perf_counter() - t0)
            cpu[kd] += time.process_time() - c0
    nbytes = n * m * k * 4
    return [
        f"| {m} x {k} | {kd} | {nbytes / np.median(wall[kd]) / 1e9:.1f} | "
        f"{nbytes / min(wall[kd]) / 1e9:.1f} | {cpu[kd] / sum(wall[kd]):.2f} |"
        for kd in kinds
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, {args.reps} interleaved calls per variant, "
        "float32, one input row",
        "",
        "| product (out x in) | written as | GB/s median | GB/s fastest | threads busy |",
        "|---|---|---|---|---|",
    ]
    wo = ["plain", "stored", "halves", "pad2", "pad8", "multiply-reduce", "2 blocks", "4 blocks"]
    lines += compare(576, 576, wo, args.reps)
    for m, k in [(960, 576), (1536, 576), (576, 1536)]:
        lines += compare(m, k, ["plain", "4 blocks"], args.reps)
    emit_lines(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
