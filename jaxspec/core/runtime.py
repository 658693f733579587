"""One compile cache for every jitted decode loop, with compile and run times measured
separately (DESIGN.md: warm-up/compilation is excluded from throughput and reported as
``compile_s``).

Every decoder's host wrapper calls :func:`run_compiled` with its ``jax.jit`` function, the
traced arguments and the static arguments. The cache key is built here, once, from what
changes the compiled program:

* the jitted function itself;
* the tree structure of the traced arguments and, per leaf, its shape, dtype and sharding
  (so a float16 checkpoint, a sharded parameter tree or a new bucketed prompt length each
  compile their own executable);
* every static argument (frozen dataclass configs, the hashable model, meshes).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Mapping
from typing import Any, Callable

import jax
import numpy as np

from models.llama.modeling import MATRICES, unstack_layers

_EXECUTABLES: dict = {}


def _leaf_signature(x) -> tuple:
    """``(shape, dtype, sharding)`` of one traced argument (numpy, jax array or scalar)."""
    if isinstance(x, jax.Array):
        return (x.shape, str(x.dtype), str(x.sharding))
    a = np.asarray(x)
    return (a.shape, str(a.dtype), None)


def compile_key(jitted: Callable, args: tuple, statics: dict) -> tuple:
    """The cache key of ``jitted(*args, **statics)`` (module docstring).

    Raises:
      TypeError: a static argument is not hashable (static arguments must be).
    """
    leaves, treedef = jax.tree_util.tree_flatten(args)
    static_items = tuple(sorted(statics.items()))
    hash(static_items)
    return (jitted, treedef, tuple(_leaf_signature(x) for x in leaves), static_items)


def run_compiled(jitted: Callable, args: tuple, statics: dict) -> tuple[Any, float, float]:
    """Run ``jitted(*args, **statics)`` through an executable cached under :func:`compile_key`.

    Args:
      jitted: a ``jax.jit`` function whose static arguments are the keys of ``statics``.
      args: the traced (array) arguments, any pytree.
      statics: static keyword arguments (hashable values).

    Returns:
      ``(outputs ready on the host side, compile_s, run_s)``: ``compile_s`` is 0.0 when a
      cached executable was reused; ``run_s`` is wall-clock seconds of the run alone.
    """
    key = compile_key(jitted, args, statics)
    compile_s = 0.0
    exe = _EXECUTABLES.get(key)
    if exe is None:
        t0 = time.perf_counter()
        exe = jitted.lower(*args, **statics).compile()
        compile_s = time.perf_counter() - t0
        _EXECUTABLES[key] = exe
    t0 = time.perf_counter()
    out = jax.block_until_ready(exe(*args))
    return out, compile_s, time.perf_counter() - t0


def enable_persistent_cache(directory: str | os.PathLike | None = None,
                            min_compile_s: float = 0.2) -> str | None:
    """Keep compiled XLA programs on disk (JAX's persistent compilation cache), so a second
    process decoding the same shapes loads them instead of compiling (the CPU decode layout's
    unrolled loops take seconds to compile; README "Performance notes").

    Args:
      directory: where; default: the directory already configured in this process (e.g. by
        the test suite), else ``$JAXSPEC_COMPILE_CACHE``, else ``~/.cache/jaxspec/xla``.
        ``"off"`` (argument or variable) disables the cache.
      min_compile_s: programs that compiled faster than this are not stored.

    Returns:
      The directory used, or None when disabled. Loaded programs report a ``compile_s`` of
      the load time in :func:`run_compiled`.
    """
    if directory is None and jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    where = str(directory or os.environ.get("JAXSPEC_COMPILE_CACHE", "")
                or os.path.join(os.path.expanduser("~"), ".cache", "jaxspec", "xla"))
    if where.lower() == "off":
        return None
    os.makedirs(where, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return where


def clear_compiled() -> int:
    """Drop every cached executable (and JAX's own caches); returns how many were dropped."""
    n = len(_EXECUTABLES)
    _EXECUTABLES.clear()
    jax.clear_caches()
    return n


# ----------------------------------------------------------------------------- layer layout

LAYER_LOOPS = ("auto", "scan", "unrolled")
VERIFY_LAYOUTS = ("auto", "stored", "output-major")
_OVERRIDES: dict[str, list] = {"layer loop": [], "verify layout": []}  # innermost context last
_CAUSAL_LAYER_KEYS = frozenset(MATRICES)


def _is_causal_layers(layers) -> bool:
    """Whether a stacked ``layers`` dict is a Llama/Qwen2 body's: every projection matrix is
    present as float (``wq``) or int8 (``wq_q`` with ``wq_s``, :mod:`models.quant`)."""
    return isinstance(layers, Mapping) and all(
        m in layers or (m + "_q" in layers and m + "_s" in layers) for m in _CAUSAL_LAYER_KEYS)
_UNSTACKED: list = []  # [(weakrefs of the stacked leaves, unstacked layers tuple)], newest last


def _setting(what: str, name: str | None, env: str, choices: tuple, default: str) -> str:
    """``name``, else the innermost context of ``what``, else ``$env``, else ``default``;
    checked against ``choices`` (ValueError names the setting and the choices)."""
    stack = _OVERRIDES[what]
    name = name or (stack[-1] if stack else None) or os.environ.get(env, default)
    if name not in choices:
        raise ValueError(f"unknown {what} {name!r}; choose one of {', '.join(choices)}")
    return name


@contextlib.contextmanager
def _override(what: str, name: str, check):
    check(name)
    _OVERRIDES[what].append(name)
    try:
        yield
    finally:
        _OVERRIDES[what].pop()


# "auto" unrolls the layer loop on a GPU only for weights up to this size: the per-layer copy
# (decode_layout) doubles the weights' memory, which a large model on a GPU may not have
AUTO_UNROLL_MAX_BYTES = 2 << 30


def resolve_layer_loop(layer_loop: str | None = None, nbytes: int | None = None) -> str:
    """``"scan"`` or ``"unrolled"``: the argument, else the innermost :func:`layer_loop`
    context, else ``$JAXSPEC_LAYER_LOOP``, else ``"auto"``. ``"auto"`` is ``"unrolled"`` on
    the CPU backend; on a GPU ``"unrolled"`` for weights of ``nbytes`` (bytes, given) up to
    :data:`AUTO_UNROLL_MAX_BYTES` and ``"scan"`` above it or when ``nbytes`` is None; and
    ``"scan"`` on TPU (not measured there). Measured on an H200 (README "GPU"), the unrolled
    loop ran SmolLM2-135M AR 1.24x (float32) / 1.29x (bfloat16) faster than the scan.

    Raises:
      ValueError: an unknown name.
    """
    name = _setting("layer loop", layer_loop, "JAXSPEC_LAYER_LOOP", LAYER_LOOPS, "auto")
    if name == "auto":
        backend = jax.default_backend()
        small = nbytes is not None and nbytes <= AUTO_UNROLL_MAX_BYTES
        return "unrolled" if backend == "cpu" or (backend == "gpu" and small) else "scan"
    return name


def tree_nbytes(tree: Any) -> int:
    """Bytes of the arrays in ``tree`` (other leaves count 0)."""
    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree_util.tree_leaves(tree))


def layer_loop(name: str):
    """``with layer_loop("scan"): ...`` decodes with that layer loop (:func:`resolve_layer_loop`)
    inside the block, e.g. to compare the two in one run (``jaxspec/ar-scan`` in the ``ar``
    benchmark).

    Raises:
      ValueError: an unknown name.
    """
    return _override("layer loop", name, resolve_layer_loop)


def resolve_verify_layout(layout: str | None = None) -> str:
    """Weight layout of the target in speculative decoding's verification passes with the
    unrolled layer loop: ``"stored"`` (input-major), ``"output-major"`` (the AR loop's layout,
    :func:`decode_layout`) or ``"auto"`` (the default: the decoder times one ``K + 1``-row
    pass in both layouts on first use and keeps the faster,
    :func:`jaxspec.causal.decode.tune_verification`). The argument, else the innermost
    :func:`verify_layout` context, else ``$JAXSPEC_VERIFY_LAYOUT``, else ``"auto"``. Which is
    faster depends on the CPU (README "Performance notes"); the decoded tokens do not (up to
    float32 rounding). Ignored by the ``scan`` loop.

    Raises:
      ValueError: an unknown name.
    """
    return _setting("verify layout", layout, "JAXSPEC_VERIFY_LAYOUT", VERIFY_LAYOUTS, "auto")


def verify_layout(name: str):
    """``with verify_layout("output-major"): ...`` verifies drafts on output-major weights
    inside the block (:func:`resolve_verify_layout`; ``jaxspec/ngram-om`` in the ``ar``
    benchmark).

    Raises:
      ValueError: an unknown name.
    """
    return _override("verify layout", name, resolve_verify_layout)


def _unstacked_layers(layers: dict, output_major: bool) -> tuple:
    """Per-layer dicts of a stacked ``layers`` dict, cached per stacked tree (by identity of
    its arrays, held weakly) and layout, so repeated decodes with the same weights split them
    once."""
    leaves = [layers[k] for k in sorted(layers)]
    for refs, om, out in _UNSTACKED:
        if om == output_major and len(refs) == len(leaves) and all(
                r() is x for r, x in zip(refs, leaves)):
            return out
    out = unstack_layers({"layers": layers}, output_major)["layers"]
    try:
        refs = [weakref.ref(x) for x in leaves]
    except TypeError:  # numpy arrays and tracers: no caching
        return out
    _UNSTACKED.append((refs, output_major, out))
    # at most four per-layer copies stay alive: enough for a target in both layouts (AR and
    # speculative loops) plus a draft model, so comparing decoders does not re-split weights
    del _UNSTACKED[:-4]
    return out


def decode_layout(tree: Any, layer_loop: str | None = None, output_major: bool = False) -> Any:
    """Put every Llama/Qwen2-layout parameter tree inside ``tree`` (a params dict, linen
    variables ``{"params": ...}``, or any nest of dicts / tuples / lists holding them, e.g. a
    drafter's ``(dllm_params, proxy)``) into the layout the decode loops run fastest with
    (:func:`resolve_layer_loop`): per-layer weights (:func:`models.llama.modeling.unstack_layers`)
    for ``"unrolled"``, unchanged for ``"scan"`` (``"auto"`` weighs the whole ``tree``). XLNet
    and other trees pass through. The model computes the same function in every layout (up to
    float32 rounding); only the compiled loop differs. ``output_major`` (unrolled only) also
    transposes the projection matrices, faster for one-token steps (the AR loop) and slower
    for verification passes. Int8 weight-only trees (:func:`models.quant.quantize_params`) are
    split the same way (their ``_q`` matrices transposed to ``_q_t`` when ``output_major``;
    scales shared).

    Raises:
      ValueError: unknown ``layer_loop``.
    """
    if resolve_layer_loop(layer_loop, tree_nbytes(tree)) == "scan":
        return tree

    def walk(x):
        if isinstance(x, Mapping):
            layers = x.get("layers")
            if _is_causal_layers(layers):
                return {**x, "layers": _unstacked_layers(dict(layers), output_major)}
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (tuple, list)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        return x

    return walk(tree)
