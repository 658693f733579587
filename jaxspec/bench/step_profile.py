"""Probe: where one batch-1 KV-cached decode step's milliseconds go, on this machine.

    python -m jaxspec.bench.step_profile [--reps 30] [--cache 384] [--new 128] [--rows T ...]
                                         [--loops] [--trace]

SmolLM2-135M shapes with random float32 weights (the timing does not depend on the values).
Every row is a separately jitted program, timed after two untimed calls, all rows interleaved
round-robin so a drifting machine hits them alike; the table gives the median and the fastest
milliseconds of ``--reps`` calls. Rows:

* ``step, <layout>``: one cached forward of one token (what the AR loop runs per token), with
  the KV cache of ``--cache`` slots, in the layouts of :func:`models.llama.layout.decode_layout`
  (stacked weights with the ``lax.scan`` layer loop; per-layer input-major; per-layer
  output-major, the CPU AR layout);
* ``products only``: the layer matrix-vector products (150 in the output-major layout, whose
  q/k/v are fused: :func:`models.llama.modeling.fuse_qkv`) and the tied LM head of the same
  step, chained through a cheap nonlinearity and nothing else (no attention, norms, RoPE or
  cache): what XLA's dot kernels cost on these shapes;
* ``LM head only``: the ``(49152, 576)`` tied-head product;
* ``numpy ...``: numpy's matrix-vector product over the same weights, per matrix and as one
  matrix of the same bytes; the latter is the ``ar`` benchmark's bandwidth ceiling;
* ``AR loop, per token``: :func:`jaxspec.causal.decode.generate` (AR, ``--new`` tokens of a
  16-token prompt) divided by the generated tokens, compile excluded; it adds prefill,
  sampling, the while loop and bookkeeping to the step.

``--loops`` adds ``n-gram loop, drafts withheld, per token``: the n-gram decode loop with a
cost gate that withholds every draft (:func:`withheld_ngram`), so each step drafts and then
runs the same one-token pass as the AR loop; the difference is what drafting and the
speculative loop cost per step, which a prompt whose drafts are rarely accepted pays.

``--rows T ...`` adds, per ``T``, forwards of ``T`` query rows (:func:`verify_rows`): what a
verification pass of ``T - 1`` drafts costs beside the one-token step.

The last column is the weight bytes a row streams divided by its fastest time. Compare rows of
one run only: the CPU kind and its load change between machines (docs/performance.md).

``--trace`` then profiles ten calls of the CPU AR layout's step (KV cache donated, as in the
loop) with :mod:`jax.profiler` and XLA:CPU's per-operation trace events
(``--xla_cpu_enable_xprof_traceme``, set before the backend starts), and prints the
milliseconds per step of each kind of compiled operation: ``dot`` (the matrix-vector
products), ``copy_dot_fusion`` (the tied LM head), ``slice_bitcast_fusion`` (each layer's
slots cut out of the stacked KV cache), ``copy_bitcast_fusion`` (other copies; before the
head-major cache of :class:`models.llama.modeling.KVCache`, keys and values transposed for the
attention products), ``ynn_fusion`` (small products handed to YNNPACK), and so on.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.bench.machine import cpu_model
from jaxspec.bench.quant_matmul import SMOLLM2, _step
from jaxspec.bench.quant_matmul import measure as interleaved_ms
from jaxspec.causal.decode import generate
from jaxspec.core.drafters import CostGate, NgramDrafter
from jaxspec.core.sampling import argmax
from models.llama import modeling as M
from models.llama.layout import decode_layout, layout_name


def _products(config):
    """A jitted chain of the step's matrix-vector products (and the tied head) alone, in
    whichever layer layout its params come in (:func:`models.llama.modeling.proj`)."""

    def f(params, x):
        for lp in params["layers"]:
            q, k, v = M.qkv_proj(
                x, lp, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
            )
            kv = k + v
            a = q + jnp.tile(kv, config.hidden_size // kv.shape[-1]) * 1e-3
            h = x + M.proj(a, lp, "wo")
            g = M.proj(h, lp, "w_gate") * M.proj(h, lp, "w_up")
            x = jnp.tanh(h + M.proj(g, lp, "w_down"))
        return argmax(M.lm_logits(x, params["embed"], None))

    return jax.jit(f)


def _layouts(params) -> tuple:
    """The per-layer input-major and output-major trees of stacked ``params``, split once per
    tree (:func:`models.llama.layout.decode_layout` caches them)."""
    return (decode_layout(params, "unrolled"), decode_layout(params, "unrolled", output_major=True))


def _weight_bytes(params) -> int:
    """Bytes of the layer weights and the (tied) head: what one forward streams."""
    return (
        sum(w.nbytes for w in jax.tree_util.tree_leaves(params["layers"])) + params["embed"].nbytes
    )


def cases(config=SMOLLM2, S: int = 384, seed: int = 0) -> tuple[dict, dict]:
    """``({name: (callable, args, weight bytes streamed)}, params)``: every jitted row, and the
    random stacked parameters they share."""
    params = M.init_params(config, seed)
    im, om = _layouts(params)
    head_bytes = params["embed"].nbytes
    tokens = jnp.full((1, 1), 5, jnp.int32)
    cache = M.init_cache(config, 1, S)
    step = _step(config, 1, S)
    x = jnp.ones((1, config.hidden_size), jnp.float32)
    head = jax.jit(lambda e, x: argmax(M.lm_logits(x, e, None)))
    total = _weight_bytes(params)
    return {
        "step, stacked + lax.scan": (step, (params, cache, tokens), total),
        f"step, per-layer {layout_name(False)}": (step, (im, cache, tokens), total),
        "step, per-layer output-major (CPU AR layout)": (step, (om, cache, tokens), total),
        "products only, output-major": (_products(config), (om, x), total),
        "LM head only": (head, (params["embed"], x), head_bytes),
    }, params


def _numpy_mats(params) -> list:
    """Every projection matrix and the head as contiguous output-major numpy arrays."""
    return [
        np.ascontiguousarray(np.asarray(w[i]).T)
        for name, w in params["layers"].items()
        if name in M.MATRICES
        for i in range(w.shape[0])
    ] + [np.asarray(params["embed"])]


def _numpy_rows(params, hidden: int = 576) -> dict:
    """numpy matrix-vector products over the same weights: per matrix, and one matrix of
    ``hidden`` columns."""
    mats = _numpy_mats(params)
    nbytes = sum(m.nbytes for m in mats)
    vecs = {n: np.ones(n, np.float32) for n in {m.shape[1] for m in mats}}
    one = np.ones((nbytes // 4 // hidden, hidden), np.float32)
    x = np.ones(hidden, np.float32)
    return {
        "numpy, per matrix": (lambda: [m @ vecs[m.shape[1]] for m in mats], (), nbytes),
        "numpy, one matrix of the same bytes (the ar ceiling)": (lambda: one @ x, (), nbytes),
    }


def verify_rows(config, params, tokens, S: int = 384) -> dict:
    """Rows for forwards of ``T`` query rows, each ``T`` in ``tokens``: what a speculative
    decoder's verification pass of ``T - 1`` drafts costs against the one-token step. Per
    ``T``: the cached step and the products alone, in the per-layer stored layout (input-major,
    or panels where the CPU panel kernel runs it: :func:`models.llama.layout.layout_name`) and
    output-major layouts (:func:`models.llama.layout.plan` picks between them), and
    numpy's products over the same matrices (per matrix, ``T`` columns)."""
    im, om = _layouts(params)
    stored = layout_name(False)  # "panels" where the CPU panel kernel runs the stored layout
    cache = M.init_cache(config, 1, S)
    mats = _numpy_mats(params)
    nbytes = _weight_bytes(params)
    out = {}
    for T in tokens:
        step, prods = _step(config, T, S), _products(config)
        toks, x = jnp.full((1, T), 5, jnp.int32), jnp.ones((T, config.hidden_size), jnp.float32)
        cols = {n: np.ones((n, T), np.float32) for n in {m.shape[1] for m in mats}}
        out |= {
            f"{T} rows: step, {stored}": (step, (im, cache, toks), nbytes),
            f"{T} rows: step, output-major": (step, (om, cache, toks), nbytes),
            f"{T} rows: products only, {stored}": (prods, (im, x), nbytes),
            f"{T} rows: products only, output-major": (prods, (om, x), nbytes),
            f"{T} rows: numpy, per matrix": (
                lambda cols=cols: [m @ cols[m.shape[1]] for m in mats],
                (),
                nbytes,
            ),
        }
    return out


def _loop_row(config, params, new: int, drafter=None):
    """Per-token time of the decode loop, AR or with ``drafter`` (compile excluded by an
    untimed first call)."""
    model = M.CausalLM(config)
    prompt = [[(7 * i) % min(1000, config.vocab_size - 3) + 3 for i in range(16)]]

    def run():
        return generate(model, params, prompt, max_new_tokens=new, eos_ids=(), drafter=drafter)

    run()
    return run


def withheld_ngram(config, k: int = 8) -> CostGate:
    """The n-gram drafter (``k`` drafts, no fallback) behind a cost gate that withholds every
    draft (cost ``k + 2`` > the most a draft can be expected to yield): each step drafts and
    then runs a one-token target pass, so its loop minus the AR loop is the drafter's and the
    speculative loop's own per-step cost (``--loops``)."""
    return CostGate(NgramDrafter(k, config.vocab_size, bigram_fallback=False), float(k + 2))


_RUNTIME_EVENTS = ("ThunkExecutor", "Pjit", "Common", "Parse", "Handle", "Allocate", "$", "end: ")


def trace_breakdown(
    config=SMOLLM2, S: int = 384, calls: int = 10
) -> list[tuple[str, float, float]]:
    """``[(operation kind, ms per step, operations per step)]``, largest first, of the CPU AR
    layout's one-token step (module docstring, ``--trace``). Needs ``XLA_FLAGS`` to contain
    ``--xla_cpu_enable_xprof_traceme=true`` before JAX's backend starts.

    Raises:
      RuntimeError: the flag is missing, or the trace holds no per-operation events."""
    if "xla_cpu_enable_xprof_traceme=true" not in os.environ.get("XLA_FLAGS", ""):
        raise RuntimeError("set XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true before JAX starts")
    params = M.unstack_layers(M.init_params(config, 0), True)
    step = _step(config, 1, S, donate=True)
    cache, tokens = M.init_cache(config, 1, S), jnp.full((1, 1), 5, jnp.int32)
    for _ in range(3):
        out, cache = step(params, cache, tokens)
        out.block_until_ready()
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        for _ in range(calls):
            out, cache = step(params, cache, tokens)
            out.block_until_ready()
        jax.profiler.stop_trace()
        files = glob.glob(os.path.join(tmp, "**", "*.trace.json.gz"), recursive=True)
        events = json.load(gzip.open(files[0]))["traceEvents"] if files else []
    us, n = collections.defaultdict(float), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith(_RUNTIME_EVENTS):
            kind = re.sub(r"[.\d]+$", "", e["name"])
            us[kind] += e["dur"]
            n[kind] += 1
    if not us:
        raise RuntimeError("the profile has no XLA:CPU operation events")
    return sorted(((k, v / calls / 1e3, n[k] / calls) for k, v in us.items()), key=lambda r: -r[1])


def measure(rows: dict, reps: int) -> dict:
    """Median and fastest milliseconds per row, calls interleaved round-robin
    (:func:`jaxspec.bench.quant_matmul.measure`)."""
    return interleaved_ms({n: (f, a) for n, (f, a, _) in rows.items()}, reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m jaxspec.bench.step_profile", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--reps", type=int, default=30, help="timed calls per row (default 30)")
    ap.add_argument("--cache", type=int, default=384, help="KV-cache slots (default 384)")
    ap.add_argument("--new", type=int, default=128, help="AR loop tokens (default 128)")
    ap.add_argument(
        "--rows",
        type=int,
        nargs="*",
        default=[],
        metavar="T",
        help="also time forwards of T query rows (a verification pass of T - 1 "
        "drafts), e.g. --rows 1 2 9",
    )
    ap.add_argument(
        "--loops",
        action="store_true",
        help="also time the n-gram decode loop with every draft withheld (per token: "
        "the drafter's and the speculative loop's own cost over the AR loop)",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="also print the per-operation breakdown of the AR layout's step",
    )
    args = ap.parse_args(argv)
    if args.trace:  # XLA reads its flags when the backend starts, which no code here did yet
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"
        ).strip()
    if args.reps < 1 or args.cache < 128 or args.new < 1 or any(t < 1 for t in args.rows):
        ap.error(
            "--reps, --new and --rows must be >= 1 and --cache >= 128 (the probe writes slot 100)"
        )
    rows, params = cases(S=args.cache)
    rows.update(_numpy_rows(params, SMOLLM2.hidden_size))
    rows.update(verify_rows(SMOLLM2, params, args.rows, args.cache))
    loop = _loop_row(SMOLLM2, params, args.new)
    rows["AR loop (generate), whole run"] = (loop, (), 0)
    if args.loops:
        rows["n-gram loop, drafts withheld, whole run"] = (
            _loop_row(SMOLLM2, params, args.new, withheld_ngram(SMOLLM2)),
            (),
            0,
        )
    res = measure(rows, args.reps)
    print(
        f"{cpu_model()}, {jax.devices()[0].device_kind}, jax {jax.__version__}, {args.reps} "
        f"interleaved reps, SmolLM2-135M shapes, float32, cache {args.cache} slots\n"
    )
    print("| row | median ms | fastest ms | GB/s (weights / fastest) |\n|---|---|---|---|")
    for n, (med, best) in res.items():
        nbytes = rows[n][2]
        if n.endswith("whole run"):
            n = n.replace(" (generate)", "").replace("whole run", f"per token ({args.new} new)")
            med, best = med / args.new, best / args.new
            nbytes = rows["numpy, per matrix"][2]
        print(f"| {n} | {med:.2f} | {best:.2f} | {nbytes / best / 1e6:.1f} |")
    if args.trace:
        print(
            "\n| operation kind (XLA:CPU trace, CPU AR layout, cache donated) | ms / step | "
            "per step |\n|---|---|---|"
        )
        for kind, ms, count in trace_breakdown(S=args.cache)[:15]:
            print(f"| {kind} | {ms:.2f} | {count:g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
