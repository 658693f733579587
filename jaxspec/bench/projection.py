"""Projected wall-clock speedups at the papers' model shapes (``--suite projection``).

This is a **projection**, not a measurement of any method at those sizes. It times, on the
device at hand, single forward passes of Llama / Qwen2-layout models with the papers' shapes
(:data:`SHAPES`, random bfloat16 weights: the time of a pass does not depend on the values) and
combines those per-pass times with tokens per target forward (MAT) measured on this run's
small vehicles and with the MAT the papers report (:data:`PAPER_REPORTS`), through the cost
model below.

Cost model (per generated token; ``t(q, b)`` = seconds of one forward of ``b`` rows of ``q``
query positions over a KV cache of :data:`CONTEXT` slots, LM head on every query row):

* AR (the causal reference): ``t(1, 1)``;
* n-gram / prompt lookup (draft length K): ``t(K + 1, 1) / MAT`` (drafting is free; every
  forward verifies K drafts, the most a step can cost);
* SPS (K drafts from a draft model of shape ``d``): ``(t(K + 1, 1) + K t_d(1, 1)) / MAT``;
* SPACE (k mask groups): ``t(1 + k + (k + 1) k, 1) / MAT``: the paper's input, the last
  token, k candidates and k + 1 groups of k masks, in one forward;
* DiffuSpec / SpecDiff (k_max drafts, one refinement step of a drafter of shape ``d``):
  ``(t(k_max + 1, 1) + t_d(k_max, 1)) / MAT``;
* masked diffusion, dual cache, block length L (stepwise, the dLLM reference: one token per
  forward): ``t(L, 1) / MAT`` for stepwise, fixed-k and threshold (MAT = tokens per forward),
  SSD ``t(L, K + 1) / MAT`` (its draft-length K + 1 verification rows as a batch), Spiffy
  ``t(L, D) / MAT`` (D draft-graph nodes as a batch, :data:`SPIFFY_NODES`).

Projected speedup = reference time per token / method time per token. Not modelled: prompt
passes, sampling, host work, the dual cache's full pass at each block's start, and steps that
verify fewer drafts.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Optional, Sequence

CONTEXT = 512  # KV-cache slots of every timed pass (prompt + generated tokens)
SPIFFY_NODES = 10  # the default draft graph's node count (configs/graphs/.../D10.json)
SPACE_K = 5
NGRAM_K = 8
SPS_K = 5
SSD_K = 3
DIFFUSPEC_K = 30
BLOCK = 32


@dataclasses.dataclass(frozen=True)
class Shape:
    """A Llama / Qwen2-layout model shape (the published configs' numbers)."""

    name: str
    family: str  # "causal" or "dllm"
    arch: str  # "llama" or "qwen2"
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = False
    draft: Optional[str] = None  # the SPS / DiffuSpec draft shape projected with it

    def n_params(self) -> int:
        """Parameter count (embeddings, attention, SwiGLU MLP, norms, untied head)."""
        D, F, H, K, Dh = self.hidden, self.intermediate, self.heads, self.kv_heads, self.head_dim
        per_layer = D * H * Dh * 2 + D * K * Dh * 2 + 3 * D * F + 2 * D
        return self.vocab * D * (1 if self.tied else 2) + self.layers * per_layer + D


# Shapes as data (config.json of each released checkpoint).
SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("LLaDA-8B", "dllm", "llama", 126464, 4096, 12288, 32, 32, 32, 128),
        Shape("Dream-7B", "dllm", "qwen2", 152064, 3584, 18944, 28, 28, 4, 128),
        Shape(
            "LLaMA-2-7B", "causal", "llama", 32000, 4096, 11008, 32, 32, 32, 128, draft="LLaMA-68M"
        ),
        Shape(
            "Qwen2.5-7B",
            "causal",
            "qwen2",
            152064,
            3584,
            18944,
            28,
            28,
            4,
            128,
            draft="Qwen2.5-0.5B",
        ),
        Shape(
            "Qwen2.5-32B",
            "causal",
            "qwen2",
            152064,
            5120,
            27648,
            64,
            40,
            8,
            128,
            draft="Qwen2.5-7B",
        ),
        # draft shapes
        Shape("LLaMA-68M", "draft", "llama", 32000, 768, 3072, 2, 12, 12, 64),
        Shape("Qwen2.5-0.5B", "draft", "qwen2", 151936, 896, 4864, 24, 14, 2, 64, tied=True),
        # tiny shapes: the CPU test of this suite
        Shape("tiny-causal", "causal", "llama", 256, 64, 128, 2, 4, 2, 16, draft="tiny-draft"),
        Shape("tiny-dllm", "dllm", "qwen2", 256, 64, 128, 2, 4, 2, 16),
        Shape("tiny-draft", "draft", "llama", 256, 32, 64, 1, 2, 2, 16),
    )
}
SHAPE_SETS = {
    "papers": ("LLaDA-8B", "Dream-7B", "LLaMA-2-7B", "Qwen2.5-7B", "Qwen2.5-32B"),
    "tiny": ("tiny-causal", "tiny-dllm"),
}
# the dLLM drafter of DiffuSpec / SpecDiff per causal target (the paper: Dream-7B for 32B)
DLLM_DRAFTER = {"Qwen2.5-32B": "Dream-7B", "Qwen2.5-7B": "Dream-7B", "tiny-causal": "tiny-dllm"}


@dataclasses.dataclass(frozen=True)
class PaperReport:
    """A MAT / speedup a paper reports, with where it stands."""

    method: str
    shape: str
    mat: Optional[float]
    speedup: Optional[float]
    source: str


PAPER_REPORTS: tuple[PaperReport, ...] = (
    PaperReport(
        "diffuspec",
        "Qwen2.5-32B",
        6.99,
        3.08,
        "DiffuSpec Table 1 (Spec-Bench mean; Dream-7B drafter; A100)",
    ),
    PaperReport("specdiff", "Qwen2.5-32B", 6.05, 2.69, "DiffuSpec Table 1 (SpecDiff row)"),
    PaperReport(
        "sps", "Qwen2.5-32B", 6.18, 1.67, "DiffuSpec Table 1 (SPS row; Qwen2.5-7B drafter)"
    ),
    PaperReport("ngram", "Qwen2.5-32B", 2.11, 1.93, "DiffuSpec Table 1 (PLD row)"),
    PaperReport("space", "LLaMA-2-7B", 3.54, 3.18, "SPACE Table 1 (HumanEval-X, greedy; A800)"),
    PaperReport("ssd", "LLaDA-8B", None, 3.46, "SSD abstract (up to; LLaDA and Dream)"),
    PaperReport("spiffy", "LLaDA-8B", None, 3.1, "Spiffy abstract (2.8-3.1x, LLaDA-8B)"),
)


class ProjectionError(ValueError):
    """Unknown shape set or a shape that does not fit the device."""


def model_config(shape: Shape, context: int = CONTEXT):
    """The :class:`models.config.ModelConfig` of a shape."""
    from models.config import ModelConfig

    return ModelConfig(
        arch=shape.arch,
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_layers=shape.layers,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        qkv_bias=shape.arch == "qwen2",
        tie_embeddings=shape.tied,
        max_position_embeddings=max(context, 64),
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )


def random_params(shape: Shape, dtype: str = "bfloat16", seed: int = 0):
    """Random parameters of ``shape`` made on the device leaf by leaf (no host copy):
    normal(0, 0.02) matrices, ones for norms, in ``dtype``."""
    import jax
    import jax.numpy as jnp

    from models.llama.modeling import init_params

    cfg = model_config(shape)
    abstract = jax.eval_shape(lambda: init_params(cfg, seed))
    dt = jnp.dtype(dtype)
    leaves, tree = jax.tree_util.tree_flatten(abstract)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = []
    for k, a in zip(keys, leaves):
        if len(a.shape) >= 2:
            f = jax.jit(
                lambda k, s=a.shape: (0.02 * jax.random.normal(k, s, jnp.float32)).astype(dt)
            )
        else:
            f = jax.jit(lambda k, s=a.shape: jnp.ones(s, dt))
        out.append(f(k))
    return jax.tree_util.tree_unflatten(tree, out)


def pass_seconds(
    shape: Shape, params, queries: int, batch: int = 1, *, context: int = CONTEXT, reps: int = 10
) -> float:
    """Median seconds of one jitted forward of ``batch`` rows of ``queries`` query positions
    over a KV cache of ``context`` slots (keys written at ``context - queries``; every query
    sees every earlier slot and the new ones), after two untimed calls."""
    import jax
    import jax.numpy as jnp

    from models.llama.modeling import CausalLM, init_cache, param_dtype

    cfg = model_config(shape, context)
    model = CausalLM(cfg)
    start = context - queries
    cache = init_cache(cfg, batch, context, param_dtype(params))
    toks = jnp.full((batch, queries), 5, jnp.int32)
    pos = jnp.broadcast_to(start + jnp.arange(queries, dtype=jnp.int32), (batch, queries))
    slots = jnp.arange(context)
    mask = jnp.broadcast_to(slots[None, None, :] <= pos[:, :, None], (batch, queries, context))
    idx = jnp.full((batch,), start, jnp.int32)
    f = jax.jit(
        lambda p, c: model.apply({"params": p}, toks, pos, mask, cache=c, cache_index=idx)[0]
    )
    jax.block_until_ready(f(params, cache))
    jax.block_until_ready(f(params, cache))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(params, cache))
        ts.append(time.perf_counter() - t0)
    return float(statistics.median(ts))


def _fits(shape: Shape, bytes_per_param: int = 2, margin: float = 0.75) -> tuple[bool, str]:
    """Whether ``shape``'s weights fit ``margin`` of the first device's free memory (the
    allocator's statistics; the host's RAM on the CPU; a device without statistics always
    fits)."""
    import jax

    need = shape.n_params() * bytes_per_param
    dev = jax.devices()[0]
    stats = (dev.memory_stats() if dev.platform != "cpu" else None) or {}
    used, limit = stats.get("bytes_in_use"), stats.get("bytes_limit")
    if dev.platform == "cpu":  # the host's RAM
        import psutil

        ram = psutil.virtual_memory()
        used, limit = ram.total - ram.available, ram.total
    if used is None or not limit:
        return True, ""
    ok = need <= margin * (limit - used)
    return ok, (
        ""
        if ok
        else f"{need / 2**30:.1f} GiB of weights > {margin:.0%} of the "
        f"{(limit - used) / 2**30:.1f} GiB free"
    )


def passes_for(shape: Shape) -> list[tuple[str, int, int]]:
    """``(label, queries, batch)`` of every pass the cost model needs for ``shape``."""
    if shape.family == "causal":
        qs = sorted(
            {1, NGRAM_K + 1, SPS_K + 1, 1 + SPACE_K + (SPACE_K + 1) * SPACE_K, DIFFUSPEC_K + 1}
        )
        return [(f"q{q}", q, 1) for q in qs]
    if shape.family == "dllm":
        return [
            (f"block{BLOCK}", BLOCK, 1),
            (f"block{BLOCK}x{SSD_K + 1}", BLOCK, SSD_K + 1),
            (f"block{BLOCK}x{SPIFFY_NODES}", BLOCK, SPIFFY_NODES),
            (f"q{DIFFUSPEC_K}", DIFFUSPEC_K, 1),
        ]
    return [("q1", 1, 1)]


def time_shapes(
    names: Sequence[str],
    *,
    deadline_s: float = 1e9,
    reps: int = 10,
    log: Callable[[str], None] = print,
) -> dict[str, dict]:
    """Per shape, ``{pass label: seconds}`` (:func:`passes_for`), plus the draft shapes the
    cost model needs; a shape that does not fit the device's memory or the time left gets
    ``{"skipped": reason}``."""
    import gc

    t0 = time.perf_counter()
    wanted = list(names)
    for n in names:
        for extra in (SHAPES[n].draft, DLLM_DRAFTER.get(n)):
            if extra and extra not in wanted:
                wanted.append(extra)
    out: dict[str, dict] = {}
    for n in wanted:
        shape = SHAPES[n]
        left = deadline_s - (time.perf_counter() - t0)
        ok, why = _fits(shape)
        if not ok or left < 5:
            out[n] = {"skipped": why or f"time budget ({left:.0f} s left)"}
            log(f"[projection] {n}: skipped ({out[n]['skipped']})")
            continue
        s0 = time.perf_counter()
        try:
            params = random_params(shape)
            out[n] = {
                label: pass_seconds(shape, params, q, b, reps=reps)
                for label, q, b in passes_for(shape)
            }
        except Exception as e:  # noqa: BLE001 - e.g. out of device memory: the row says so
            out[n] = {"skipped": f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"}
        finally:
            params = None
            gc.collect()
        log(f"[projection] {n}: {time.perf_counter() - s0:.1f} s")
    return out


def method_seconds(method: str, shape: Shape, t: dict, times: dict, mat: float) -> Optional[float]:
    """Seconds per token of ``method`` at ``shape`` under the cost model (module docstring);
    None where the model has no term for it or a needed pass was not timed."""

    def get(name, label):
        return (times.get(name) or {}).get(label)

    if not mat or mat <= 0:
        return None
    if shape.family == "causal":
        if method == "ar":
            return t.get("q1")
        if method == "ngram":
            return t.get(f"q{NGRAM_K + 1}") and t[f"q{NGRAM_K + 1}"] / mat
        if method == "sps":
            d = get(shape.draft, "q1")
            v = t.get(f"q{SPS_K + 1}")
            return None if d is None or v is None else (v + SPS_K * d) / mat
        if method == "space":
            v = t.get(f"q{1 + SPACE_K + (SPACE_K + 1) * SPACE_K}")
            return v and v / mat
        if method in ("diffuspec", "specdiff"):
            d = get(DLLM_DRAFTER.get(shape.name), f"q{DIFFUSPEC_K}")
            v = t.get(f"q{DIFFUSPEC_K + 1}")
            return None if d is None or v is None else (v + d) / mat
        return None
    if shape.family == "dllm":
        if method in ("stepwise", "fixed-k", "threshold"):
            return t.get(f"block{BLOCK}") and t[f"block{BLOCK}"] / mat
        if method == "ssd":
            return t.get(f"block{BLOCK}x{SSD_K + 1}") and t[f"block{BLOCK}x{SSD_K + 1}"] / mat
        if method == "spiffy":
            v = t.get(f"block{BLOCK}x{SPIFFY_NODES}")
            return v and v / mat
    return None


REFERENCE = {"causal": "ar", "dllm": "stepwise"}


def project(times: dict, names: Sequence[str], measured: Sequence[dict] = ()) -> list[dict]:
    """Rows of projected speedups: for every shape of ``names`` and every method with a cost
    term, from the vehicles' MAT (``measured``: greedy batch-1 rows of the method suites,
    field ``mat``, the reference's MAT dividing it for dLLM methods, whose reference already
    takes one forward per token) and from each paper's reported MAT (:data:`PAPER_REPORTS`,
    at its own shape), beside the paper's measured speedup."""
    vehicle_mat: dict[str, float] = {}
    refs = {
        r["vehicle"]: r
        for r in measured
        if r.get("method") in REFERENCE.values()
        and r.get("batch") == 1
        and r.get("temperature") == 0.0
        and r.get("mat")
    }
    for r in measured:
        if r.get("batch") == 1 and r.get("temperature") == 0.0 and r.get("mat"):
            ref = refs.get(r["vehicle"])
            if r["family"] == "dllm" and ref:
                vehicle_mat[r["method"]] = r["mat"] / ref["mat"]
            elif r["family"] == "causal" and r["method"] not in vehicle_mat:
                vehicle_mat[r["method"]] = r["mat"]
    rows = []
    for n in names:
        shape, t = SHAPES[n], times.get(n) or {}
        if "skipped" in t:
            rows.append({"shape": n, "skipped": t["skipped"]})
            continue
        ref = REFERENCE[shape.family]
        t_ref = method_seconds(ref, shape, t, times, 1.0)
        methods = [
            m
            for m in (
                "ngram",
                "sps",
                "space",
                "diffuspec",
                "specdiff",
                "fixed-k",
                "threshold",
                "ssd",
                "spiffy",
            )
            if method_seconds(m, shape, t, times, 1.0) is not None
        ]
        for m in methods:
            row = {
                "shape": n,
                "method": m,
                "reference": ref,
                "ref_ms_per_token": t_ref and 1e3 * t_ref,
            }
            vm = vehicle_mat.get(m)
            if vm:
                tm = method_seconds(m, shape, t, times, vm)
                row.update(vehicle_mat=vm, projected_speedup_vehicle_mat=t_ref / tm)
            for p in PAPER_REPORTS:
                if p.method == m and p.shape == n:
                    row.update(paper_speedup=p.speedup, paper_source=p.source)
                    if p.mat:
                        tm = method_seconds(m, shape, t, times, p.mat)
                        row.update(paper_mat=p.mat, projected_speedup_paper_mat=t_ref / tm)
            rows.append(row)
    return rows


COLUMNS = [
    ("shape", "shape", "{}"),
    ("method", "method", "{}"),
    ("reference", "vs", "{}"),
    ("ref_ms_per_token", "reference ms/token", "{:.2f}"),
    ("vehicle_mat", "vehicle MAT", "{:.2f}"),
    ("projected_speedup_vehicle_mat", "projected (vehicle MAT)", "{:.2f}x"),
    ("paper_mat", "paper MAT", "{:.2f}"),
    ("projected_speedup_paper_mat", "projected (paper MAT)", "{:.2f}x"),
    ("paper_speedup", "paper measured", "{:.2f}x"),
    ("paper_source", "source", "{}"),
    ("skipped", "skipped", "{}"),
]


def run_projection_suite(
    shapes: str = "papers",
    *,
    measured: Sequence[dict] = (),
    deadline_s: float = 1e9,
    reps: int = 10,
    log: Callable[[str], None] = print,
) -> dict:
    """Time the passes of the shape set ``shapes`` (:data:`SHAPE_SETS`) and project; returns
    ``{"rows", "columns", "notes", "title", "pass_seconds"}``.

    Raises:
      ProjectionError: an unknown shape set."""
    if shapes not in SHAPE_SETS:
        raise ProjectionError(f"unknown --shapes {shapes!r}; available: {', '.join(SHAPE_SETS)}")
    names = SHAPE_SETS[shapes]
    times = time_shapes(names, deadline_s=deadline_s, reps=reps, log=log)
    rows = project(times, names, measured)
    notes = [
        "**A projection, not a measurement.** Per-pass times are measured here on random "
        "bfloat16 weights of each shape; MAT comes from this run's vehicles (greedy, "
        "batch 1) or from the papers; the speedup follows from the cost model of "
        "`jaxspec/bench/projection.py`:",
        "AR `t(1)`; n-gram `t(K+1)/MAT`; SPS `(t(K+1) + K t_draft(1))/MAT`; SPACE "
        "`t(1+k+(k+1)k)/MAT`; DiffuSpec / SpecDiff `(t(k_max+1) + t_dLLM(k_max))/MAT`; "
        f"dLLM (dual cache, block {BLOCK}) `t(L)/MAT` for stepwise, fixed-k, threshold; "
        f"SSD `t(L, batch K+1)/MAT`; Spiffy `t(L, batch {SPIFFY_NODES})/MAT`; "
        f"K = {NGRAM_K} (n-gram), {SPS_K} (SPS), {SSD_K} (SSD), k = {SPACE_K} (SPACE), "
        f"k_max = {DIFFUSPEC_K}; KV cache of {CONTEXT} slots.",
        "Not modelled: prompt passes, sampling and host work, the dual cache's full pass "
        "at each block start, steps that verify fewer drafts. dLLM MAT = tokens per "
        "forward over stepwise's.",
        "The papers' speedups were measured on their own hardware (A100 / A800) and "
        "software; they stand beside the projection, not under it.",
    ]
    return {
        "rows": rows,
        "columns": COLUMNS,
        "notes": notes,
        "pass_seconds": times,
        "title": "Projected wall-clock speedups at the papers' shapes (a projection)",
    }
