"""The attention of one layer of a KV-cached pass: XLA's einsums, or one call of a CPU kernel.

On the CPU, XLA runs a layer's attention over the cache as a dozen small ops (two batched dots,
a copy of the layer's slice of each cache, the softmax's passes) whose dispatch costs more than
their arithmetic at one to a few dozen query rows: 3.7 ms of a 15 ms one-token step of
SmolLM2-135M and about 11 ms of a 36 ms 9-row verification pass on a 2-core AMD EPYC (a
``jax.profiler`` trace; docs/performance.md, "a cached pass's attention in one call"). In the
CPU's unrolled decode layouts (per-layer weights: the panel kernel's, :mod:`models.llama.panels`,
output-major or stored) the attention runs in one XLA FFI call of ``kernels/cached_attention.cc``
per layer instead (built into the panel kernel's library), which reads the layer's keys and
values in place in the stacked cache. The scan loop (stacked weights) keeps XLA's attention.

The kernel's result for a query row depends only on that row's query and the cache slots its
mask lets it see: not on how many rows share the pass, the cache's size or the thread. So a
verification pass's row equals the one-token step at the same place bit for bit, as the panel
products do (the kernel's docstring says how). It computes the same function as
:func:`xla_attention` in another rounding order.

``$JAXSPEC_CPU_ATTENTION=0`` (or :data:`KERNEL` False) keeps XLA's attention everywhere.
"""

from __future__ import annotations

import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from models.llama import panels

#: environment switch of the kernel: ``0`` keeps XLA's attention; anything else (or unset) runs
#: the kernel in the CPU's unrolled decode layouts (:func:`kernel_applies`)
ENV = "JAXSPEC_CPU_ATTENTION"
#: force the kernel on (True) or off (False) in the unrolled CPU layouts; None: :data:`ENV`
#: decides
KERNEL: Optional[bool] = None


def xla_attention(
    q: jax.Array, keys: jax.Array, vals: jax.Array, bias: jax.Array, scale: float
) -> jax.Array:
    """Grouped-query attention with XLA's einsums.

    Args:
      q: ``(B, T, H, Dh)`` queries (after RoPE).
      keys: ``(B, K, S, Dh)``; vals: ``(B, K, Dh, S)`` (one layer of a
        :class:`models.llama.modeling.KVCache`, or the pass's own keys laid out alike); head
        ``h`` reads key/value head ``h // (H / K)``.
      bias: additive mask, broadcastable to ``(B, K, H / K, T, S)``: 0 where a row sees a slot,
        the dtype's minimum elsewhere.
      scale: the scores' factor (``Dh ** -0.5``).

    Returns:
      ``(B, T, H * Dh)`` in ``vals``' dtype; the softmax runs in float32.
    """
    B, T, H, Dh = q.shape
    K = keys.shape[1]
    qg = q.reshape(B, T, K, H // K, Dh)
    s = jnp.einsum("btkgd,bksd->bkgts", qg, keys) * scale + bias
    w = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(vals.dtype)
    return jnp.einsum("bkgts,bkds->btkgd", w, vals).reshape(B, T, H * Dh)


def kernel_enabled() -> bool:
    """:data:`KERNEL`, or with None ``$JAXSPEC_CPU_ATTENTION`` not ``0``/``false``/``off``."""
    if KERNEL is not None:
        return bool(KERNEL)
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def kernel_applies(q: jax.Array, per_layer: bool) -> bool:
    """Whether a cached pass's layer runs :func:`cached_attention`: the layer loop is unrolled
    over per-layer weights (the CPU decode layouts, :func:`models.llama.modeling.unstack_layers`:
    panels, output-major or stored; not the scan loop's stacked weights), ``q`` is float32 on
    the CPU backend, the kernel loaded and :func:`kernel_enabled`."""
    return (
        per_layer
        and q.dtype == jnp.float32
        and jax.default_backend() == "cpu"
        and kernel_enabled()
        and panels._load()
    )


def cached_attention(
    q: jax.Array,
    cache_k: jax.Array,
    cache_v: jax.Array,
    layer: jax.Array,
    mask: jax.Array,
    scale: float,
) -> jax.Array:
    """The attention of ``q`` over layer ``layer`` of a stacked cache, by the CPU kernel.

    Args:
      q: float32 ``(B, T, H, Dh)`` (after RoPE).
      cache_k: float32 ``(L, B, K, S, Dh)``; cache_v: float32 ``(L, B, K, Dh, S)``: the whole
        cache (:class:`models.llama.modeling.KVCache`) with this pass's keys and values
        written; the kernel reads layer ``layer`` in place.
      layer: int32 scalar, the layer index (traced or constant).
      mask: bool ``(B, T, S)``: True where a query row sees a slot.
      scale: the scores' factor (``Dh ** -0.5``).

    Returns:
      float32 ``(B, T, H * Dh)``, :func:`xla_attention`'s function in another rounding order.

    Raises:
      ValueError: the shapes disagree (named), or a dtype is not float32.
      RuntimeError: the kernel did not load (check :func:`kernel_applies` first).
    """
    B, T, H, Dh = q.shape
    L, Bk, K, S, Dk = cache_k.shape
    if cache_v.shape != (L, Bk, K, Dk, S) or (Bk, Dk) != (B, Dh) or K == 0 or H % K:
        raise ValueError(
            f"cached_attention: q {q.shape}, keys {cache_k.shape} and values {cache_v.shape} "
            f"disagree (keys (L, B, K, S, Dh), values (L, B, K, Dh, S), H a multiple of K)"
        )
    if tuple(mask.shape) != (B, T, S):
        raise ValueError(f"cached_attention: mask {mask.shape}, expected {(B, T, S)}")
    if {q.dtype, cache_k.dtype, cache_v.dtype} != {jnp.dtype(jnp.float32)}:
        raise ValueError("cached_attention: q and the cache must be float32")
    if not panels._load():
        raise RuntimeError(f"the CPU kernels did not load: {panels._state.get('error')}")
    out = jax.ShapeDtypeStruct((B, T, H, Dh), jnp.float32)
    call = jax.ffi.ffi_call(panels.ATTENTION_TARGET, out, vmap_method="sequential")
    o = call(
        q,
        cache_k,
        cache_v,
        jnp.asarray(layer, jnp.int32),
        jnp.asarray(mask, jnp.bool_),
        scale=np.float32(scale),
    )
    return o.reshape(B, T, H * Dh)


__all__ = ["ENV", "KERNEL", "cached_attention", "kernel_applies", "kernel_enabled", "xla_attention"]
