"""The library's one-token SmolLM2-135M step (random float32 weights, per-layer output-major,
384-slot cache donated) under one ``XLA_FLAGS`` setting: median / fastest ms of 40 calls, the
greedy token, and how many slot slices and YNNPACK fusions the compiled step holds.
One process per setting, so run it per flag (docs/performance.md, "The cache's slot slices,
again"):

    for f in "" "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise" ...; do
      XLA_FLAGS="$f" python benchmarks/probes/kv-slices/ynn_flags.py; done
"""

import os
import re
import statistics
import time

import jax
import jax.numpy as jnp

from jaxspec.bench.quant_matmul import SMOLLM2 as C
from jaxspec.bench.quant_matmul import _step
from models.llama import modeling as M

params = M.unstack_layers(M.init_params(C, 0), True)
f = _step(C, 1, 384, donate=True)
cache, tok = M.init_cache(C, 1, 384), jnp.full((1, 1), 5, jnp.int32)
out, cache = f(params, cache, tok)
ts = []
for _ in range(40):
    t0 = time.perf_counter()
    out, cache = f(params, cache, tok)
    jax.block_until_ready(out)
    ts.append((time.perf_counter() - t0) * 1e3)
txt = f.lower(params, cache, tok).compile().as_text()
kinds = {k: len(re.findall(k + r"[.\d]* = ", txt)) for k in ("slice_bitcast_fusion", "ynn_fusion")}
print(
    f"| `{os.environ.get('XLA_FLAGS', '') or '(none)'}` | {statistics.median(ts):.2f} | "
    f"{min(ts):.2f} | {int(out[0])} | {kinds['slice_bitcast_fusion']} | {kinds['ynn_fusion']} |"
)
