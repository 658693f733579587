"""Can the one-token step's attention read the KV cache without cutting each layer's slots out
of the stacked buffer? (docs/performance.md, "The cache's slot slices, again")

    python benchmarks/probes/kv-slices/attention_reads.py [--slots 384] [--reps 30] [--steps 32]

XLA:CPU's trace of the AR step shows 60 ``slice_bitcast_fusion`` a step (each layer's keys and
values copied out of the stacked ``(L, B, K, S, Dh)`` / ``(L, B, K, Dh, S)`` cache for the
attention's YNNPACK products). Variants of the same one-token SmolLM2-135M step (random float32
weights, per-layer output-major layout, batch 1), each written out here:

* ``stacked``: the library's formulation (write the new key/value, then read the layer's slots);
* ``tuple-write-first``: one buffer per layer (a tuple of 60 arrays), written then read, so no
  slice is needed;
* ``read-then-write``: per-layer buffers, the attention over the old slots plus the new token's
  key/value as a separate term (an online-softmax merge), the write after the reads;
* ``ew-scores`` / ``ew-values`` / ``ew-both``: the stacked cache, with the score and/or value
  product as an elementwise product and a sum (a loop fusion that can read the slice in place).

Each variant is a ``lax.fori_loop`` of ``--steps`` greedy steps (the decode loop's carry, cache
donated), timed per step, interleaved; it also counts the compiled program's ``copy``
instructions and slot slices. Greedy tokens must agree.
"""

import argparse
import re
import statistics
import time

import jax
import jax.numpy as jnp

from jaxspec.bench.machine import cpu_model
from jaxspec.bench.quant_matmul import SMOLLM2 as C
from models.llama import modeling as M

ap = argparse.ArgumentParser()
ap.add_argument("--slots", type=int, default=384)
ap.add_argument("--reps", type=int, default=10)
ap.add_argument("--steps", type=int, default=32)
ap.add_argument(
    "--variants",
    nargs="+",
    default=[
        "stacked",
        "tuple-write-first",
        "read-then-write",
        "ew-scores",
        "ew-values",
        "ew-both",
    ],
)
args = ap.parse_args()
S = args.slots
params = M.unstack_layers(M.init_params(C, 0), True)
H, K, Dh = C.num_heads, C.num_kv_heads, C.head_dim
G = H // K
scale = Dh**-0.5


def make(variant):
    def f(params, cache, tok, idx):
        # cache: variant 'stacked': KVCache; else tuple of (k_i (1,K,S,Dh), v_i (1,K,Dh,S))
        x = jnp.take(params["embed"], tok, axis=0)  # (1,1,D)
        pos = idx[None, None]
        cos, sin = M.rope_tables(pos, Dh, C.rope_theta)
        s_ar = jnp.arange(S)
        valid = s_ar <= idx
        bias = jnp.where(valid, 0.0, jnp.finfo(jnp.float32).min)
        out_cache = []
        kc_all, vc_all = (cache.k, cache.v) if isinstance(cache, M.KVCache) else (None, None)
        for i, lp in enumerate(params["layers"]):
            a = M.rms_norm(x, lp["attn_norm"], C.rms_norm_eps)
            q, k, v = M.qkv_proj(a, lp, H * Dh, K * Dh)
            q = M.apply_rope(q.reshape(1, 1, H, Dh), cos, sin)
            k = M.apply_rope(k.reshape(1, 1, K, Dh), cos, sin)
            v = v.reshape(1, 1, K, Dh)
            qg = q.reshape(1, K, G, Dh)
            if variant == "stacked":
                li = jnp.array(i, jnp.int32)
                kc_all = M._write_cache(kc_all, k, li, idx[None])
                vc_all = M._write_cache(vc_all, v, li, idx[None], slot_minor=True)
                keys = jax.lax.dynamic_index_in_dim(kc_all, li, 0, keepdims=False)
                vals = jax.lax.dynamic_index_in_dim(vc_all, li, 0, keepdims=False)
                s = jnp.einsum("bkgd,bksd->bkgs", qg, keys) * scale + bias
                w = jax.nn.softmax(s, axis=-1)
                o = jnp.einsum("bkgs,bkds->bkgd", w, vals)
            elif variant.startswith("ew"):
                li = jnp.array(i, jnp.int32)
                kc_all = M._write_cache(kc_all, k, li, idx[None])
                vc_all = M._write_cache(vc_all, v, li, idx[None], slot_minor=True)
                keys = jax.lax.dynamic_index_in_dim(kc_all, li, 0, keepdims=False)
                vals = jax.lax.dynamic_index_in_dim(vc_all, li, 0, keepdims=False)
                if variant in ("ew-scores", "ew-both"):
                    s = (qg[:, :, :, None, :] * keys[:, :, None, :, :]).sum(-1) * scale + bias
                else:
                    s = jnp.einsum("bkgd,bksd->bkgs", qg, keys) * scale + bias
                w = jax.nn.softmax(s, axis=-1)
                if variant in ("ew-values", "ew-both"):
                    o = (w[:, :, :, None, :] * vals[:, :, None, :, :]).sum(-1)
                else:
                    o = jnp.einsum("bkgs,bkds->bkgd", w, vals)
            elif variant == "tuple-write-first":
                kc, vc = cache[i]
                kc = jax.lax.dynamic_update_slice(kc, jnp.moveaxis(k, 1, 2), (0, 0, idx, 0))
                vc = jax.lax.dynamic_update_slice(vc, jnp.moveaxis(v, 1, -1), (0, 0, 0, idx))
                s = jnp.einsum("bkgd,bksd->bkgs", qg, kc) * scale + bias
                w = jax.nn.softmax(s, axis=-1)
                o = jnp.einsum("bkgs,bkds->bkgd", w, vc)
                out_cache.append((kc, vc))
            else:  # read old, then write
                kc, vc = cache[i]
                old = s_ar < idx
                b_old = jnp.where(old, 0.0, jnp.finfo(jnp.float32).min)
                s_o = jnp.einsum("bkgd,bksd->bkgs", qg, kc) * scale + b_old
                s_n = jnp.einsum("bkgd,bkd->bkg", qg, k[:, 0]) * scale
                m = jnp.maximum(s_o.max(-1), s_n)
                e_o, e_n = jnp.exp(s_o - m[..., None]), jnp.exp(s_n - m)
                z = e_o.sum(-1) + e_n
                o = (
                    jnp.einsum("bkgs,bkds->bkgd", e_o, vc) + e_n[..., None] * v[:, 0][:, :, None]
                ) / z[..., None]
                kc = jax.lax.dynamic_update_slice(kc, jnp.moveaxis(k, 1, 2), (0, 0, idx, 0))
                vc = jax.lax.dynamic_update_slice(vc, jnp.moveaxis(v, 1, -1), (0, 0, 0, idx))
                out_cache.append((kc, vc))
            h = x + M.proj(o.reshape(1, 1, H * Dh), lp, "wo")
            mm = M.rms_norm(h, lp["mlp_norm"], C.rms_norm_eps)
            x = h + M.proj(
                jax.nn.silu(M.proj(mm, lp, "w_gate")) * M.proj(mm, lp, "w_up"), lp, "w_down"
            )
        x = M.rms_norm(x, params["final_norm"], C.rms_norm_eps)
        nxt = M.lm_logits(x, params["embed"], None)[:, -1].argmax(-1)
        new = M.KVCache(kc_all, vc_all) if kc_all is not None else tuple(out_cache)
        return nxt, new

    return f


def init(variant):
    if variant == "stacked" or variant.startswith("ew"):
        return M.init_cache(C, 1, S)
    return tuple((jnp.zeros((1, K, S, Dh)), jnp.zeros((1, K, Dh, S))) for _ in range(C.num_layers))


variants = args.variants
N = args.steps


def looped(v):
    step = make(v)

    def loop(params, cache, tok):
        def body(j, c):
            cache, t = c
            n, cache = step(params, cache, t, 100 + j)
            return cache, n[:, None].astype(jnp.int32)

        cache, t = jax.lax.fori_loop(0, N, body, (cache, tok))
        return t, cache

    return jax.jit(loop, donate_argnums=(1,))


fns = {v: looped(v) for v in variants}
caches = {v: init(v) for v in variants}
tok = jnp.array([[5]], jnp.int32)
last = {}
for v in variants:  # compile, and the greedy token after N steps
    t, caches[v] = fns[v](params, caches[v], tok)
    last[v] = int(t[0, 0])
times = {v: [] for v in variants}
for r in range(args.reps):
    for v in variants if r % 2 == 0 else variants[::-1]:
        t0 = time.perf_counter()
        t, caches[v] = fns[v](params, caches[v], tok)
        jax.block_until_ready(t)
        times[v].append((time.perf_counter() - t0) * 1e3 / N)
print(
    f"{cpu_model()}, jax {jax.__version__}, SmolLM2-135M shapes, float32, {S} slots, "
    f"{N} steps a call, {args.reps} interleaved calls; greedy tokens agree: "
    f"{'yes' if len(set(last.values())) == 1 else 'NO'}\n"
)
print("| variant | ms / step, median | fastest | copies | slot slices |")
print("|---|---|---|---|---|")
for v in variants:
    txt = fns[v].lower(params, caches[v], tok).compile().as_text()
    copies = len(re.findall(r"\} copy\(", txt))
    slices = len(re.findall(r"slice_bitcast_fusion[.\d]* = ", txt))
    print(
        f"| {v} | {statistics.median(times[v]):.2f} | {min(times[v]):.2f} | {copies} | {slices} |"
    )
