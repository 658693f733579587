"""Layer loops on an accelerator as the model grows: speed and memory.

    python benchmarks/probes/gpu/layer-loop/size_sweep.py
        [--models smollm2-135m smollm2-1.7b qwen2.5-7b]
        [--new 128] [--reps 3] [--dtype bfloat16] [--out results/gpu/layer-loop/size-sweep.json]

Random weights in the shapes of each named model (the timing does not depend on the values),
batch-1 greedy AR decoding (:func:`jaxspec.causal.decode.generate`, a 64-token prompt) with
these layer loops, in this order:

* ``scan``: stacked ``(L, ...)`` weights and a ``lax.scan`` over the layers;
* ``scan, unroll=True`` (with ``--unroll``): the same stacked weights, the scan fully unrolled
  at trace time (each layer's weights a static slice inside the one program: no copy of the
  weights outside it);
* ``unrolled (per-layer copy)``: :func:`models.llama.layout.decode_layout`'s per-layer tree
  (``layer_loop="unrolled"``), a second, per-layer copy of the layer weights on the device;
* ``auto`` (with ``--auto``): what ``layer_loop="auto"`` picks for the stacked tree
  (:func:`models.llama.layout.tree_layer_loop`: unrolled when the copy fits);
* ``split in place``: :func:`models.llama.layout.decode_layout_in_place` (what
  ``scripts.generate`` does on a GPU; forced on the CPU, where it splits only when a copy
  would not fit the RAM): per-layer weights, the stacked ones deleted, one copy.

Per loop: compile seconds, the median of ``--reps`` timed decodes as tokens per second, the
compiled program's temporary bytes (``memory_analysis``), the device's bytes in use after the
runs (the weights, and the per-layer copy where there is one; on the CPU the host's RAM in use
by all processes), and whether the tokens equal the
``scan`` row's. Copies are freed before the next model.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.machine import cpu_model
from jaxspec.causal.decode import decode_plan, generate
from jaxspec.core import runtime
from models.config import ModelConfig
from models.llama import layout
from models.llama import modeling as M

CONFIGS = {
    "smollm2-135m": ModelConfig(
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
    ),
    "smollm2-1.7b": ModelConfig(
        arch="llama",
        vocab_size=49152,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=24,
        num_heads=32,
        num_kv_heads=32,
        head_dim=64,
        rope_theta=130000.0,
        tie_embeddings=True,
        max_position_embeddings=8192,
    ),
    "qwen2.5-7b": ModelConfig(
        arch="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        rope_theta=1e6,
        qkv_bias=True,
        max_position_embeddings=32768,
    ),
}


def random_params(config: ModelConfig, dtype, seed: int = 0):
    """Random parameters of ``config``'s shapes, made on the device in ``dtype``."""
    shapes = jax.eval_shape(lambda: M.init_params(config, seed))
    leaves, tree = jax.tree_util.tree_flatten(shapes)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    make = jax.jit(lambda k, s: jax.random.normal(k, s.shape, dtype) * 0.02, static_argnums=1)
    return jax.tree_util.tree_unflatten(
        tree, [make(k, jax.ShapeDtypeStruct(s.shape, dtype)) for k, s in zip(keys, leaves)]
    )


def _in_use() -> int | None:
    """The device's bytes in use (on the CPU: the host's RAM in use, all processes)."""
    mem = layout.device_memory()
    return None if mem is None else mem[0]


def _temp_bytes() -> int | None:
    """Temporary bytes of the most recently compiled decode program."""
    exe = list(runtime._EXECUTABLES.values())[-1]
    try:
        return int(exe.memory_analysis().temp_size_in_bytes)
    except Exception:  # backends without memory analysis
        return None


def run_loop(name: str, config: ModelConfig, params, new: int, reps: int) -> dict:
    model = M.CausalLM(config)
    prompt = [[(7 * i) % 1000 + 3 for i in range(64)]]
    scan = jax.lax.scan
    if name == "scan, unroll=True":
        jax.lax.scan = functools.partial(scan, unroll=True)
    loop = {"scan": "scan", "scan, unroll=True": "scan", "auto": "auto"}.get(name, "unrolled")
    try:
        jax.clear_caches()
        runtime._EXECUTABLES.clear()
        plan = decode_plan(model, params, layer_loop=loop)
        picked = plan.layer_loop
        first = generate(model, params, prompt, max_new_tokens=new, eos_ids=(), plan=plan)
        runs = [
            generate(model, params, prompt, max_new_tokens=new, eos_ids=(), plan=plan)
            for _ in range(reps)
        ]
    finally:
        jax.lax.scan = scan
    run_s = float(np.median([r.run_s for r in runs]))
    return {
        "loop": name,
        "ran": picked,
        "compile_s": round(first.compile_s, 1),
        "tok_s": round(new / run_s, 1),
        "ms_per_token": round(1e3 * run_s / new, 3),
        "temp_bytes": _temp_bytes(),
        "bytes_in_use": _in_use(),
        "tokens": first.tokens[0],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--unroll", action="store_true", help="also the scan with unroll=True")
    ap.add_argument("--auto", action="store_true", help="also layer_loop auto (stacked tree)")
    ap.add_argument("--out", default="results/gpu/layer-loop/size-sweep.json")
    args = ap.parse_args(argv)
    dev = jax.devices()[0]
    out = {
        "device": f"{dev.device_kind} ({jax.default_backend()})",
        "host_cpu": cpu_model(),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "new_tokens": args.new,
        "reps": args.reps,
        "models": {},
    }
    for name in args.models:
        config = CONFIGS[name]
        params = random_params(config, jnp.dtype(args.dtype))
        nbytes = layout.tree_nbytes(params)
        rows = []
        loops = ["scan"] + ["scan, unroll=True"] * args.unroll + ["unrolled (per-layer copy)"]
        for loop in loops + ["auto"] * args.auto + ["split in place"]:
            t0 = time.perf_counter()
            if loop == "auto":
                layout._UNSTACKED.clear()
                gc.collect()  # auto weighs the copy against the memory in use
            if loop == "split in place":
                layout._UNSTACKED.clear()
                gc.collect()
                params = layout.decode_layout_in_place(params, "unrolled", force=True)
            row = run_loop(loop, config, params, args.new, args.reps)
            row["identical_to_scan"] = row["tokens"] == rows[0]["tokens"] if rows else True
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(name, {k: v for k, v in row.items() if k != "tokens"}, flush=True)
        out["models"][name] = {
            "param_bytes": nbytes,
            "memory": layout.device_memory(),
            "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
        }
        del params
        layout._UNSTACKED.clear()
        runtime._EXECUTABLES.clear()
        jax.clear_caches()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
