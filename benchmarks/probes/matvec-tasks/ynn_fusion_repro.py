"""Why the row-blocked product is kept to one-row products: an XLA:CPU (jaxlib 0.10.2) fusion that
returns NaN (docs/performance.md, "`wo` in row blocks").

    python benchmarks/probes/matvec-tasks/ynn_fusion_repro.py [--out FILE]

The row-blocked form of :func:`models.llama.modeling.output_major_product` broadcasts the input
rows over ``b`` blocks and runs one batched product. Generalized to many rows and fed by an
RMSNorm (as a q/k/v product is), XLA:CPU puts the norm's reduction, the broadcast and the batched
dot into one YNNPACK fusion (``__ynn_fusion``), and from 4,096 input rows on that fusion's result
is wrong. Here: ``x (rows, 32)`` -> RMSNorm -> ``@ w.T`` for a ``(64, 32)`` matrix, plain and in 4
row blocks, against numpy. (In the tiny test model the q/k/v product of a 64-prompt x 64-token
prompt pass, 4,096 rows, changed every greedy output; the shipped code blocks only one-row
products, whose tokens the tests check.)
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.ab import emit_lines
from jaxspec.bench.machine import cpu_model
from models.llama.modeling import rms_norm


def blocked(x, w_t, b=4):
    """``x (rows, k) @ w_t.T`` as a batched product over ``b`` blocks of output rows."""
    m, k = w_t.shape
    xb = jnp.broadcast_to(x[None], (b,) + x.shape)
    return jnp.einsum("bti,boi->tbo", xb, w_t.reshape(b, m // b, k)).reshape(x.shape[0], m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    k, m = 32, 64
    g = jnp.ones((k,))
    norm = lambda x: rms_norm(x, g, 1e-6)
    lines = [
        f"{cpu_model()}, jax {jax.__version__}, RMSNorm then a (64, 32) matrix; max |error| "
        "against numpy (float32)",
        "",
        "| rows | norm + plain product | norm + 4 row blocks | 4 row blocks alone |",
        "|---|---|---|---|",
    ]
    w = jax.random.normal(jax.random.PRNGKey(1), (m, k))
    for rows in (2048, 4095, 4096, 8192):
        x = jax.random.normal(jax.random.PRNGKey(0), (rows, k))
        ref = np.asarray(norm(x)) @ np.asarray(w).T
        xn = norm(x)
        errs = [
            float(np.abs(np.asarray(jax.jit(f)(a, w)) - ref).max())
            for f, a in (
                (lambda x, w: norm(x) @ w.T, x),
                (lambda x, w: blocked(norm(x), w), x),
                (blocked, xn),
            )
        ]
        lines.append(f"| {rows} | " + " | ".join(f"{e:.2g}" for e in errs) + " |")
    emit_lines(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
