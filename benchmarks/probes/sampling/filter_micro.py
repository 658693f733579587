"""The sampled-decoding costs fixed on 2026-11-29, old way against new, jitted, median ms of
``--reps`` calls on this machine:

    python benchmarks/probes/sampling/filter_micro.py [--reps 20]

(timed by :func:`jaxspec.bench.quant_matmul.measure`)

* ``filter_top_k_top_p`` on ``(1, T, 49152)`` logits (T = 1 and 9: a one-token step and a
  9-row verification pass) with ``lax.top_k`` / a sort (``THRESHOLDS_BY_BISECTION = False``,
  the accelerator path) and with the CPU's bisection, for top-k 50, top-p 0.9 and both;
* one row's sampled n-gram proposal (``NgramDrafter(8, 49152).propose``, a 420-slot buffer
  with 300 known tokens) with the bigram draft drawn over the vocabulary (the old
  ``jax.random.categorical(key, log c)``) and among the known successors (the library's).

Each row is traced after setting its arm, so the two arms are separate programs.
"""

from __future__ import annotations

import argparse
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.quant_matmul import measure
from jaxspec.core import drafters, sampling
from jaxspec.core.drafters import DraftContext, NgramDrafter

V = 49152


def median_ms(f, *args, reps: int) -> float:
    """Median ms of ``f(*args)``; the first call (inside the caller's arm) traces it."""
    jax.block_until_ready(f(*args))
    return measure({"f": (f, args)}, reps)["f"][0]


def filter_rows(reps: int) -> list[str]:
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 9, V)) * 3
    out = []
    for top_k, top_p in ((50, 1.0), (0, 0.9), (50, 0.9)):
        for T in (1, 9):
            ms = []
            for bisect in (False, True):
                with mock.patch.object(sampling, "THRESHOLDS_BY_BISECTION", bisect):
                    f = jax.jit(lambda v: sampling.filter_top_k_top_p(v, top_k, top_p))
                    ms.append(median_ms(f, x[:, :T], reps=reps))
            out.append(f"| top-k {top_k}, top-p {top_p}, {T} rows | {ms[0]:.2f} | {ms[1]:.2f} |")
    return out


def _vocabulary_draw(key, tokens, known, cond):
    c, _ = drafters.context_bigram(tokens, known, cond, V)
    return jax.random.categorical(key, jnp.log(c)).astype(jnp.int32)


def ngram_rows(reps: int) -> list[str]:
    rng = np.random.default_rng(0)
    ctx = DraftContext(
        buffer=jnp.asarray(rng.integers(0, 2000, (1, 420)), jnp.int32),
        length=jnp.array([300], jnp.int32),
        pad=jnp.array([0], jnp.int32),
        active=jnp.array([True]),
    )
    d = NgramDrafter(8, V)
    key = jax.random.PRNGKey(0)
    ms = []
    for draw in (_vocabulary_draw, drafters.sample_context_bigram):
        with mock.patch.object(drafters, "sample_context_bigram", draw):
            f = jax.jit(lambda c, k: d.propose((), (), c, k, True)[0].tokens)
            ms.append(median_ms(f, ctx, key, reps=reps))
    return [f"| sampled n-gram proposal, k = 8, 1 row | {ms[0]:.2f} | {ms[1]:.2f} |"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, median ms of {args.reps}\n")
    print("| row | old (sort / vocabulary draw) | new (bisection / known successors) |")
    print("|---|---|---|")
    for line in filter_rows(args.reps) + ngram_rows(args.reps):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
