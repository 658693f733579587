"""The machine a benchmark runs on: its CPU and library versions (:func:`machine_info`), its
memory bandwidth, the batch-1 decoding ceiling (:func:`bandwidth_ceiling`), and the memory maps
left to the process for compiled programs (:func:`check_map_headroom`)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from jaxspec.bench.records import BenchError, _num

#: memory maps a benchmark keeps free for the next compiled program: one XLA CPU program of
#: SmolLM2-135M holds about 1,300-1,700 (``benchmarks/probes/suite-maps``)
MAP_HEADROOM = 4_000


def memory_maps() -> Optional[tuple[int, int]]:
    """``(maps held, limit)``: the lines of ``/proc/self/maps`` and ``vm.max_map_count``, or
    None where they cannot be read (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read().split()[0])
        with open("/proc/self/maps", "rb") as f:
            held = sum(1 for _ in f)
    except (OSError, ValueError, IndexError):
        return None
    return held, limit


def check_map_headroom(
    what: str, headroom: int = MAP_HEADROOM, maps: Optional[Callable] = None
) -> None:
    """Raise before ``what`` (a program about to compile) would meet the kernel's map limit.

    Every XLA CPU program keeps memory maps of its own; a process that reaches
    ``vm.max_map_count`` aborts inside the compiler (``LLVM ERROR: Unable to allocate section
    memory``), losing the run's results. This turns that abort into a clear error first.

    Raises:
      BenchError: fewer than ``headroom`` maps are left (``maps()``, by default
        :func:`memory_maps`, says how many are held and allowed; None skips the check)."""
    got = (maps or memory_maps)()
    if got is None:
        return
    held, limit = got
    if limit - held < headroom:
        raise BenchError(
            f"{what}: this process holds {held:,} of the {limit:,} memory maps the kernel "
            f"allows (vm.max_map_count), and each compiled XLA CPU program takes about 1,500: "
            f"the next compile would abort the process. Run fewer systems, prompt sets or "
            f"prompt lengths per process (e.g. one --*-sets value per run)"
        )


def n_params(params) -> int:
    """Number of scalars in a parameter tree."""
    import jax

    return int(sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)))


def streamed_params(params) -> int:
    """Number of weights one batch-1 decode step reads from memory: every parameter of a causal
    LM except, when it has its own ``lm_head``, the input embedding table, of which a step
    gathers one row (a tied table is the head and is read whole). The ``ar`` suite's bandwidth
    ceiling divides by these bytes: counting an untied table (Qwen2.5-Coder-0.5B's GGUF: 136M of
    630M) put the ceiling 21% low and the decode rate at 128% of it."""
    total = n_params(params)
    if isinstance(params, dict) and "lm_head" in params and "embed" in params:
        total -= int(np.prod(params["embed"].shape))
    return total


MATVEC_MAX_BYTES = 1 << 30


def matvec_bandwidth(
    num_params: int, reps: int = 5, rows: int = 4096, max_bytes: int = MATVEC_MAX_BYTES
) -> dict[str, float]:
    """Measure matrix-vector memory bandwidth over a float32 matrix the size of a model.

    Times ``W @ x`` (numpy/BLAS) for ``W`` float32 ``(rows, ceil(num_params / rows))``: every
    weight byte is read once per product, as in batch-1 decoding. One untimed product, then
    ``reps`` timed ones. The ceiling uses the fastest (other load on the machine only slows a
    product down); the median is reported beside it. The matrix is capped at ``max_bytes``
    (1 GiB, far past any CPU cache, so the rate is still DRAM streaming): a second
    model-sized copy of a 1.5B model (6.2 GB) next to the loaded models ran a 24 GB machine out
    of memory. Divide the model's bytes by ``gb_per_s`` for its ceiling.

    Returns:
      ``{"matrix_bytes", "matvec_s" (fastest seconds), "matvec_median_s", "gb_per_s"
      (1e9 bytes / s at the fastest product)}``.
    """
    product, nbytes = matvec_probe(num_params, rows, max_bytes)
    return _time_products(product, nbytes, reps)


def matvec_probe(
    num_params: int, rows: int = 4096, max_bytes: int = MATVEC_MAX_BYTES
) -> tuple[Callable[[], Any], int]:
    """``(product, matrix bytes)``: a numpy ``W @ x`` over the float32 matrix of
    :func:`matvec_bandwidth` (allocated once, here), to time whenever the machine's rate is
    wanted, e.g. after every prompt of the ``ar`` suite
    (:func:`jaxspec.bench.ar_suite.run_ar_suite`)."""
    cols = max(1, -(-min(int(num_params), int(max_bytes) // 4) // rows))
    w = np.full((rows, cols), 1e-3, np.float32)
    x = np.ones((cols,), np.float32)
    return (lambda: w @ x), int(w.nbytes)


def _time_products(product: Callable[[], Any], nbytes: int, reps: int) -> dict[str, float]:
    """One untimed ``product()``, then ``reps`` timed ones (each must return when its result
    is ready); the rate is ``nbytes`` over the fastest. The return dict of
    :func:`matvec_bandwidth`."""
    product()
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        product()
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {
        "matrix_bytes": nbytes,
        "matvec_s": best,
        "matvec_median_s": statistics.median(times),
        "gb_per_s": nbytes / best / 1e9,
    }


def device_matvec_bandwidth(
    num_params: int,
    dtype: str = "float32",
    reps: int = 20,
    rows: int = 4096,
    max_bytes: int = MATVEC_MAX_BYTES,
) -> dict[str, float]:
    """:func:`matvec_bandwidth` on JAX's default device (a GPU or TPU): ``W @ x`` jitted, for
    ``W`` of ``dtype`` ``(rows, ceil(num_params / rows))`` held on the device, capped at
    ``max_bytes`` (1 GiB: far past any accelerator's L2 cache). One untimed product (the
    compile), then ``reps`` timed ones, each waited for (``block_until_ready``). Same return
    keys as :func:`matvec_bandwidth`."""
    import jax
    import jax.numpy as jnp

    itemsize = int(np.dtype(jnp.dtype(dtype)).itemsize)
    cols = max(1, -(-min(int(num_params), int(max_bytes) // itemsize) // rows))
    w = jnp.full((rows, cols), 1e-3, dtype)
    x = jnp.ones((cols,), dtype)
    f = jax.jit(lambda a, b: a @ b)
    return _time_products(lambda: f(w, x).block_until_ready(), rows * cols * itemsize, reps)


def bandwidth_ceiling(
    num_params: int, param_dtype: str = "float32", reps: int = 5
) -> dict[str, Any]:
    """The batch-1 decoding ceiling of a model of ``num_params`` weights in ``param_dtype``:
    every weight read once per token at the rate of a matrix-vector product on the device JAX
    runs on (:func:`matvec_bandwidth` on CPU, :func:`device_matvec_bandwidth` on an
    accelerator). Returns the ``bandwidth`` block of the ``ar`` suite's result document
    (``bandwidth_bound_tokens_per_s`` = rate / model bytes)."""
    import jax

    on_cpu = jax.default_backend() == "cpu"
    bw = (
        matvec_bandwidth(num_params, reps=reps)
        if on_cpu
        else device_matvec_bandwidth(num_params, param_dtype, reps=4 * reps)
    )
    model_bytes = int(np.dtype(jax.numpy.dtype(param_dtype)).itemsize) * int(num_params)
    return {
        "num_params": int(num_params),
        "param_dtype": str(param_dtype),
        "device": jax.default_backend(),
        "model_bytes": model_bytes,
        "model_bytes_f32": 4 * int(num_params),
        "matvec_matrix_bytes": int(bw["matrix_bytes"]),
        "matvec_gb_per_s": _num(bw["gb_per_s"], 2),
        "matvec_ms": _num(bw["matvec_s"] * 1e3, 2),
        "matvec_median_ms": _num(bw["matvec_median_s"] * 1e3, 2),
        "bandwidth_bound_tokens_per_s": _num(bw["gb_per_s"] * 1e9 / model_bytes, 2),
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU model, core count and library versions."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for mod in ("jax", "jaxlib", "flax", "numpy", "torch", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent peers are simply not reported
            info[mod] = None
    try:
        import jax

        info["jax_backend"] = jax.default_backend()
        if info["jax_backend"] != "cpu":
            info["accelerator"] = jax.devices()[0].device_kind
    except Exception:  # noqa: BLE001
        pass
    return info
