"""Compile-once execution of the jitted decode loops, with compile and run times measured
separately (DESIGN.md: warm-up/compilation is excluded from throughput and reported as
``compile_s``)."""

from __future__ import annotations

import time
from typing import Any, Callable, Hashable

import jax


def run_compiled(cache: dict, sig: Hashable, jitted: Callable, args: tuple,
                 statics: dict) -> tuple[Any, float, float]:
    """Run ``jitted(*args, **statics)`` through an executable cached under ``sig``.

    Args:
      cache: dict of compiled executables owned by the caller (one per decoder module).
      sig: hashable key covering every shape and static argument that changes the program.
      jitted: a ``jax.jit`` function whose static arguments are the keys of ``statics``.
      args: the traced (array) arguments.

    Returns:
      ``(outputs ready on the host side, compile_s, run_s)``: ``compile_s`` is 0.0 when a
      cached executable was reused; ``run_s`` is wall-clock seconds of the run alone.
    """
    compile_s = 0.0
    exe = cache.get(sig)
    if exe is None:
        t0 = time.perf_counter()
        exe = jitted.lower(*args, **statics).compile()
        compile_s = time.perf_counter() - t0
        cache[sig] = exe
    t0 = time.perf_counter()
    out = jax.block_until_ready(exe(*args))
    return out, compile_s, time.perf_counter() - t0
