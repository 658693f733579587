"""Chains of the SmolLM2-135M layer products (output-major, fused q/k/v; 150 matrices, random
float32) at T query rows, plain and as batched products over 4 / 16 / 64 blocks of output rows
(the one-row ``wo`` trick of docs/performance.md, "`wo` in row blocks", tried on
verification-sized passes). 8 interleaved calls each; median / fastest ms and GB/s of the fastest.

    python benchmarks/probes/verify-layout/nine_row_blocks.py [T]  # default 9; 1: the one-row chain
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp

from jaxspec.bench.quant_matmul import SMOLLM2 as C
from models.llama import modeling as M

T = int(sys.argv[1]) if len(sys.argv) > 1 else 9
params = M.unstack_layers(M.init_params(C, 0), True)
mats = [
    lp[n] for lp in params["layers"] for n in ("wqkv_t", "wo_t", "w_gate_t", "w_up_t", "w_down_t")
]
nbytes = sum(m.nbytes for m in mats)


def make(b):
    def f(mats, x):
        acc = 0.0
        for w in mats:
            m, k = w.shape
            xi = x[:, :k] if k <= x.shape[1] else jnp.tile(x, (1, k // x.shape[1] + 1))[:, :k]
            if b == 1 or m % b:
                y = jnp.einsum("ti,oi->to", xi, w)
            else:
                xb = jnp.broadcast_to(xi[None], (b,) + xi.shape)
                y = jnp.einsum("bti,boi->tbo", xb, w.reshape(b, m // b, k)).reshape(T, m)
            acc = acc + y[:, :8].sum()
            x = x + 1e-6 * acc
        return acc

    return jax.jit(f)


x = jnp.ones((T, 576), jnp.float32)
fs = {b: make(b) for b in (1, 4, 16, 64)}
for f in fs.values():
    jax.block_until_ready(f(mats, x))
ts = {b: [] for b in fs}
for r in range(8):
    for b, f in fs.items():
        t0 = time.perf_counter()
        jax.block_until_ready(f(mats, x))
        ts[b].append(time.perf_counter() - t0)
for b in fs:
    print(
        f"T={T} blocks {b:3d} median {statistics.median(ts[b]) * 1e3:7.1f} ms fastest "
        f"{min(ts[b]) * 1e3:7.1f} ms  {nbytes / min(ts[b]) / 1e9:5.1f} GB/s"
    )
