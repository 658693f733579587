"""Whole KV-cached forwards of SmolLM2-135M (the GGUF Q4_1 file) on its CPU decode layout, by
query-row count: fastest / median ms of ``--reps`` rounds, the row counts interleaved.

    JAXSPEC_PANELS_Q4={0,1} python benchmarks/probes/panels/pass_rows.py [--reps 25]

With ``JAXSPEC_PANELS_Q4=1`` (the default) the layers are in Q4_1 panels and the head in Q8_0
panels (:func:`models.llama.panels.pack_exact`); with ``0`` in float32 panels. A pass of
``T`` rows is a verification pass of ``T - 1`` drafts (1 row: a one-token step), over a
``--cache``-slot cache (:func:`models.llama.layout.pass_seconds`'s pass).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp

from models.llama import layout
from models.llama.modeling import init_cache
from models.registry import load_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--cache", type=int, default=384)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 9])
    args = ap.parse_args(argv)
    model, params, _, _ = load_model("smollm2-135m-instruct", log=lambda m: None)
    tree = layout.decode_layout(params, "unrolled", False)
    step = layout._pass_jit
    inputs = {
        r: (jnp.zeros((1, r), jnp.int32), init_cache(model.config, 1, args.cache, jnp.float32))
        for r in args.rows
    }
    for r, a in inputs.items():  # compile and warm up
        for _ in range(3):
            jax.block_until_ready(step(tree, *a, model=model))
    secs: dict[int, list[float]] = {r: [] for r in inputs}
    for _ in range(args.reps):
        for r, a in inputs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(step(tree, *a, model=model))
            secs[r].append(time.perf_counter() - t0)
    kind = "Q4_1 / Q8_0" if layout.quantized_panels(params) else "float32"
    print(f"JAXSPEC_PANELS_Q4={os.environ.get('JAXSPEC_PANELS_Q4', '1')} ({kind} panels): ", end="")
    print(
        " | ".join(
            f"{r} rows {min(v) * 1e3:.1f} / {statistics.median(v) * 1e3:.1f} ms"
            for r, v in secs.items()
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
