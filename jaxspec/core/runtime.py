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

import time
from typing import Any, Callable

import jax
import numpy as np

from jaxspec.core.compile_cache import ensure_persistent_cache

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
        ensure_persistent_cache()  # on by default (jaxspec.core.compile_cache)
        t0 = time.perf_counter()
        exe = jitted.lower(*args, **statics).compile()
        compile_s = time.perf_counter() - t0
        _EXECUTABLES[key] = exe
    t0 = time.perf_counter()
    out = jax.block_until_ready(exe(*args))
    return out, compile_s, time.perf_counter() - t0


def clear_compiled() -> int:
    """Drop every cached executable (and JAX's own caches); returns how many were dropped."""
    n = len(_EXECUTABLES)
    _EXECUTABLES.clear()
    jax.clear_caches()
    return n


def compiled_snapshot() -> dict:
    """A copy of the compile cache (the executables :func:`run_compiled` keeps), so an A/B
    probe whose arms trace different code can compile each arm once and swap its programs back
    in before timing it (:func:`use_compiled`; :func:`jaxspec.bench.ab.compile_arms`)."""
    return dict(_EXECUTABLES)


def use_compiled(snapshot: dict) -> None:
    """Make ``snapshot`` (:func:`compiled_snapshot`) the compile cache."""
    _EXECUTABLES.clear()
    _EXECUTABLES.update(snapshot)
