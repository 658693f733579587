"""The CPU panel kernel against XLA's products, jitted, fastest and median ms of ``--reps``
calls interleaved round-robin (:func:`jaxspec.bench.quant_matmul.measure`) on this machine:

    python benchmarks/probes/panels/panel_micro.py [--reps 15] [--rows 1 2 4 9 16 64]

For each of SmolLM2-135M's four layer-product shapes (q/k/v fused ``576 x 960``, ``wo``
``576 x 576``, gate and up ``576 x 1536`` each (one ``576 x 3072`` chain here), ``w_down``
``1536 x 576``), a chain of 30 products (one per layer, 30 different matrices, so the weights
stream from memory as in a decode step) at each row count, in three layouts: XLA on input-major
``(in, out)`` weights (``x @ w``), XLA on output-major ``(out, in)`` weights (the AR loop's
layout), the panel kernel on float32 panels (:mod:`models.llama.panels`) and on Q4_1 panels
(:func:`models.llama.panels.pack_exact`: 0.75 bytes a weight); then the tied LM head ``576 x
49152`` (Q8_0 panels, 1.125 bytes a weight). The weights are random matrices quantized to GGUF
Q4_1 (the head: Q8_0) and dequantized, as the SmolLM2-135M file's are, so every arm multiplies
the same float32 matrix; the quantized arm's results are checked bit for bit against the
float32 panels'. Rates are float32 weight bytes
over the fastest call.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.quant_matmul import measure
from jaxspec.testing.tiny import q4_exact, q8_exact
from models.llama import panels

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
LAYERS = 30


def arms():
    stored = jax.jit(lambda x, ws: [x @ w for w in ws])
    out_major = jax.jit(lambda x, ws: [jnp.einsum("mi,oi->mo", x, w) for w in ws])
    on_panels = jax.jit(lambda x, ws: [panels.panel_product(x, w) for w in ws])
    return (
        ("XLA input-major", stored, lambda w: w),
        ("XLA output-major", out_major, lambda w: w.T),
        ("panel kernel", on_panels, panels.pack),
        ("Q4_1 / Q8_0 panels", on_panels, panels.pack_exact),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 9, 16, 64])
    args = ap.parse_args(argv)
    if not panels.panels_active():
        raise SystemExit("the panel kernel is not active here (JAXSPEC_PANELS=0, no g++, no CPU)")
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if "model name" in ln), "?"
    )
    print(f"{cpu}, jax {jax.__version__}, fastest / median ms of {args.reps} interleaved calls\n")
    rng = np.random.default_rng(0)
    names = [a[0] for a in arms()]
    totals = {r: dict.fromkeys(names, 0.0) for r in args.rows}
    print("| product (x 30 layers) | rows | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for k, n in SHAPES + [(576, 49152)]:
        count = 1 if n == 49152 else LAYERS
        exact = q8_exact if n == 49152 else q4_exact  # as in the SmolLM2 file
        ws = [exact(rng.standard_normal((k, n), dtype=np.float32) * 0.05) for _ in range(count)]
        gb = count * k * n * 4 / 1e9
        for rows in args.rows:
            x = jnp.asarray(rng.standard_normal((rows, k), dtype=np.float32))
            named = {name: (f, (x, [jnp.asarray(lay(w)) for w in ws])) for name, f, lay in arms()}
            ref = np.asarray(named[names[0]][0](*named[names[0]][1])[-1])
            for f, a in named.values():
                np.testing.assert_allclose(np.asarray(f(*a)[-1]), ref, rtol=1e-4, atol=1e-4)
            f32, q4 = (np.asarray(named[a][0](*named[a][1])[-1]) for a in names[2:4])
            assert np.array_equal(f32.view(np.uint32), q4.view(np.uint32)), "Q4_1 != float32"
            cells = []
            for name, (med, fast) in measure(named, args.reps).items():
                cells.append(f"{fast:.2f} / {med:.2f} ({gb / fast * 1e3:.0f} GB/s)")
                if n != 49152:
                    totals[rows][name] += fast
            label = "LM head 576 x 49152 (once)" if n == 49152 else f"{k} x {n}"
            print(f"| {label} | {rows} | " + " | ".join(cells) + " |")
    print("\nAll four layer chains (a step's layer products), fastest ms:\n")
    print("| rows | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for rows, d in totals.items():
        print(f"| {rows} | " + " | ".join(f"{d[nm]:.1f}" for nm in names) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
