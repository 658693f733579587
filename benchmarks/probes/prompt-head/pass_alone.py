"""The prompt pass alone, with the LM head over every row against the last row only
(docs/performance.md, "The prompt pass computes one row of logits").

    python benchmarks/probes/prompt-head/pass_alone.py [P ...]     # default 128 192

SmolLM2-135M shapes, random float32 weights in the per-layer stored layout, batch 1: a P-token
prompt written into a P-slot cache, then the greedy first token, either from the full
``(1, P, V)`` logits or from the last row's (``return_hidden`` and the head on that row: what
``CausalLM(last_rows=1)`` does). 10 interleaved calls each; median and fastest ms.
"""

import sys

import jax
import jax.numpy as jnp

from jaxspec.bench.quant_matmul import SMOLLM2, measure
from models.llama import modeling as M

params = M.init_params(SMOLLM2, 0)
p = M.unstack_layers(params)
model = M.CausalLM(SMOLLM2)
for P in [int(a) for a in sys.argv[1:]] or [128, 192]:

    def mk(last, P=P):
        def f(params, cache, tokens):
            pos = jnp.arange(P, dtype=jnp.int32)[None]
            mask = jnp.arange(P)[None, None, :] <= pos[..., None]
            idx = jnp.array([0], jnp.int32)
            if not last:
                logits, cache = model.apply(
                    {"params": params}, tokens, pos, mask, cache=cache, cache_index=idx
                )
                return logits[:, -1].argmax(-1), cache
            h, cache = model.apply(
                {"params": params},
                tokens,
                pos,
                mask,
                cache=cache,
                cache_index=idx,
                return_hidden=True,
            )
            return M.lm_logits(h[:, -1:], params["embed"], None)[:, -1].argmax(-1), cache

        return jax.jit(f)

    args = (p, M.init_cache(SMOLLM2, 1, P), jnp.full((1, P), 5, jnp.int32))
    r = measure({"all rows": (mk(False), args), "last row": (mk(True), args)}, reps=10)
    for n, (med, best) in r.items():
        print(f"P={P} {n:10s} median {med:8.1f} ms  fastest {best:8.1f} ms")
