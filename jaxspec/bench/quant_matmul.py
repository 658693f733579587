"""Probe: formulations of the weight-only int8 matrix product against float32, at SmolLM2-135M
shapes (random weights: the timing does not depend on the values), in one process.

    python -m jaxspec.bench.quant_matmul [--reps 15] [--tokens 1 9]

Times one KV-cached forward of ``T`` tokens (``T = 1``: an AR decode step; ``T = 9``: a
verification pass of 8 drafts) of the full model for each formulation of
:func:`models.llama.modeling.proj` on int8 weights (:mod:`models.quant`) and for the float32
baselines, interleaved round-robin after two untimed calls each; prints the median and the
fastest milliseconds. Formulations:

* ``convert-dot``: ``(x @ q.astype(f32)) * s``, what :func:`~models.llama.modeling.proj` does;
* ``dot_general-pref``: ``lax.dot_general(x, q, preferred_element_type=f32) * s`` (JAX lowers it
  to the same convert + dot);
* ``dequant-dot``: ``x @ (q.astype(f32) * s)``, the weights dequantized before the product;
* ``mul-reduce``: ``sum(x[..., :, None] * q.astype(f32), -2) * s``, one fused elementwise
  multiply and reduction; timed for ``T = 1`` only: with jaxlib 0.10.2 XLA:CPU miscompiles
  it for ``T >= 2`` at these shapes (``sum(ones(1, 2, 1, 576) * ones(1536, 576, int8), -1)``
  gives NaN; the 9-token forward of the output-major variant crashes the process);

each in the per-layer decode layout (input-major and output-major,
:func:`models.llama.modeling.unstack_layers`) and in the stacked ``lax.scan`` layout, plus
``convert-dot`` per-layer without the ordering hint of ``models.llama.modeling._after``. The CPU
is often shared: compare rows of one run only.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.llama import modeling as M
from models.quant import quantize_params

SMOLLM2 = ModelConfig(
    arch="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    tie_embeddings=True,
    max_position_embeddings=2048,
)


def _int8(fn_im, fn_om):
    def proj(x, lp, name):
        if name + "_q" in lp:
            return fn_im(x, lp[name + "_q"], lp[name + "_s"])
        return fn_om(x, lp[name + "_q_t"], lp[name + "_s"])

    return proj


def _dg(x, q, s, contract):
    return (
        jax.lax.dot_general(
            x, q, (((x.ndim - 1,), (contract,)), ((), ())), preferred_element_type=x.dtype
        )
        * s
    )


FORMULATIONS = {
    "convert-dot": None,  # models.llama.modeling.proj itself
    "dot_general-pref": _int8(lambda x, q, s: _dg(x, q, s, 0), lambda x, q, s: _dg(x, q, s, 1)),
    "dequant-dot": _int8(
        lambda x, q, s: x @ (q.astype(x.dtype) * s),
        lambda x, q, s: jnp.einsum("...i,oi->...o", x, q.astype(x.dtype) * s[:, None]),
    ),
    "mul-reduce": _int8(
        lambda x, q, s: jnp.sum(x[..., :, None] * q.astype(x.dtype), -2) * s,
        lambda x, q, s: jnp.sum(x[..., None, :] * q.astype(x.dtype), -1) * s,
    ),
}


@contextlib.contextmanager
def _patched(proj=None, hint=True):
    """Trace with another int8 ``proj`` and / or without the per-layer ordering hint."""
    old = M.proj, M._after
    if proj is not None:
        M.proj = lambda x, lp, name: (
            proj(x, lp, name) if (name + "_q" in lp or name + "_q_t" in lp) else old[0](x, lp, name)
        )
    if not hint:
        M._after = lambda lp, h: lp
    try:
        yield
    finally:
        M.proj, M._after = old


def _step(config, T, S, proj=None, hint=True, donate=False):
    model = M.CausalLM(config)

    def f(params, cache, tokens):
        with _patched(proj, hint):
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

    return jax.jit(f, donate_argnums=(1,) if donate else ())  # donate: the cache, in place


def cases(config=SMOLLM2, T=1, S=256, seed=0):
    """``{name: (jitted step, args)}`` for every float32 baseline and int8 formulation."""
    params = M.init_params(config, seed)
    qp = quantize_params(params)
    f_trees = {
        "per-layer input-major": M.unstack_layers(params),
        "per-layer output-major": M.unstack_layers(params, True),
        "scan": params,
    }
    q_trees = {
        "per-layer input-major": M.unstack_layers(qp),
        "per-layer output-major": M.unstack_layers(qp, True),
        "scan": qp,
    }
    tokens = jnp.full((1, T), 5, jnp.int32)
    cache = M.init_cache(config, 1, S)
    out = {f"f32 {lay}": (_step(config, T, S), (p, cache, tokens)) for lay, p in f_trees.items()}
    for name, proj in FORMULATIONS.items():
        if name == "mul-reduce" and T > 1:  # miscompiled by XLA:CPU (module docstring)
            continue
        for lay, p in q_trees.items():
            out[f"int8 {name} {lay}"] = (_step(config, T, S, proj), (p, cache, tokens))
    out["int8 convert-dot per-layer input-major, no hint"] = (
        _step(config, T, S, hint=False),
        (q_trees["per-layer input-major"], cache, tokens),
    )
    return out


def measure(named: dict, reps: int = 15) -> dict:
    """Median and fastest milliseconds per case, calls interleaved round-robin."""
    times = {n: [] for n in named}
    for f, a in named.values():
        for _ in range(2):
            jax.block_until_ready(f(*a))
    for _ in range(reps):
        for n, (f, a) in named.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(*a))
            times[n].append((time.perf_counter() - t0) * 1e3)
    return {n: (statistics.median(t), min(t)) for n, t in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jaxspec.bench.quant_matmul", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 9])
    args = ap.parse_args(argv)
    print(f"{jax.devices()[0].device_kind}, {args.reps} interleaved reps, SmolLM2-135M shapes")
    for T in args.tokens:
        res = measure(cases(T=T), args.reps)
        base = res["f32 per-layer output-major"][0]
        print(
            f"\n| forward of {T} token(s), KV cache 256 | median ms | fastest ms | "
            f"median / f32 per-layer output-major |\n|---|---|---|---|"
        )
        for n, (med, best) in res.items():
            print(f"| {n} | {med:.1f} | {best:.1f} | {med / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
