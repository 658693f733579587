"""Weight-only int8 quantization of the causal body (Llama / Qwen2 ``CausalLM``, and the
``DiffusionLM`` built on it) for memory-bound batch-1 decoding.

Scheme ``"int8"``: symmetric, per output channel, round to nearest. For each of the seven
projection matrices of :data:`models.llama.modeling.MATRICES` and each output channel ``o``
(one column of an input-major ``(in, out)`` matrix)::

    s[o] = max_i |w[i, o]| / 127          (1 where the column is all zeros)
    q[i, o] = round(w[i, o] / s[o])        in [-127, 127], int8

so ``|w - s * q| <= s / 2`` elementwise (no clipping: ``|w / s| <= 127``). Activations stay in
the model's dtype: :func:`models.llama.modeling.proj` computes ``(x @ q) * s`` with the scale
factored out of the dot product (``q`` is converted to the activation dtype inside the
product). The token embedding, the LM head (tied or not), the norms and the q/k/v biases are
not quantized (they stay in float32 / the cast ``dtype``): the decoders read the embedding's
dtype as the activation and KV-cache dtype (:func:`models.llama.modeling.param_dtype`), and
quantizing the tied embedding would also perturb the input embeddings.

Speed: XLA:CPU (jaxlib 0.10.2) has no matmul that reads int8 operands; it converts each
layer's int8 matrices to float32 in a separate pass before the dot, so on CPU int8 halves
nothing but memory: a SmolLM2-135M one-token forward measured 0.85-1.1x the float32 time and a
9-token verification pass 1.05-1.2x (``python -m jaxspec.bench.quant_matmul``, AMD EPYC, 2
cores). The gain is expected on accelerators, whose compilers can fuse the conversion into the
matmul (not measured here).

Quantized matrices change the model: int8 greedy outputs drift from float32 ones (reported by
the ``jaxspec/ar-int8`` row of the ``ar`` benchmark). Speculative decoding of the int8 model is
lossless against AR decoding of the same int8 model.

No source beyond the standard per-channel absmax scheme (e.g. LLM.int8()'s vector-wise
quantization of weights, Dettmers et al. 2022, without its outlier decomposition).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Optional

import jax
import jax.numpy as jnp

from models.llama.modeling import MATRICES, QKV_FUSED, has_projection

QUANTS = ("none", "int8")
"""``--quant`` values: ``"none"`` keeps the weights as they are, ``"int8"`` is
:func:`quantize_params` with scheme ``"int8"``."""

QMAX = 127
Q_SUFFIX, S_SUFFIX, T_SUFFIX = "_q", "_s", "_t"


class QuantError(ValueError):
    """Unknown quantization scheme, a tree that is already quantized, or a tree that is not a
    ``CausalLM`` parameter tree."""


def quantize_matrix(w: jax.Array, axis: int = -2) -> tuple[jax.Array, jax.Array]:
    """Symmetric int8 quantization of ``w`` with one scale per slice along every axis but
    ``axis`` (the input axis, reduced over).

    Args:
      w: floating array, e.g. ``(in, out)`` or stacked ``(L, in, out)`` with ``axis=-2``
        (input-major), or ``(out, in)`` with ``axis=-1`` (output-major).
      axis: the input (contraction) axis.

    Returns:
      ``(q int8 same shape as w, s float32 w.shape without axis)`` with ``|w - s * q| <= s/2``
      (``s`` broadcast back along ``axis``).
    """
    return _quantize(jnp.asarray(w), axis)


@partial(jax.jit, static_argnums=1)
def _quantize(w, axis):
    w32 = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w32), axis=axis, keepdims=True)
    s = jnp.where(amax > 0, amax / QMAX, 1.0)
    q = jnp.clip(jnp.round(w32 / s), -QMAX, QMAX).astype(jnp.int8)
    return q, jnp.squeeze(s, axis).astype(jnp.float32)


def dequantize_matrix(q: jax.Array, s: jax.Array, axis: int = -2) -> jax.Array:
    """``s * q`` in float32 (the inverse of :func:`quantize_matrix` up to ``s / 2``)."""
    return q.astype(jnp.float32) * jnp.expand_dims(s, axis)


def is_quantized(params) -> bool:
    """Whether a ``CausalLM`` parameter tree (either layout, or ``{"params": tree}``) holds
    quantized projection matrices (``name + "_q"`` or ``name + "_q_t"`` layer entries)."""
    tree = params["params"] if "params" in params else params
    layers = tree.get("layers") if isinstance(tree, Mapping) else None
    if layers is None:
        return False
    dicts = layers if isinstance(layers, (tuple, list)) else [layers]
    return any(k.endswith(Q_SUFFIX) or k.endswith(Q_SUFFIX + T_SUFFIX) for d in dicts for k in d)


def _quantize_layer(lp: Mapping) -> dict:
    out = {}
    for k, v in lp.items():
        if k in MATRICES:  # input-major (in, out), stacked or not
            q, s = quantize_matrix(v, axis=-2)
            out[k + Q_SUFFIX], out[k + S_SUFFIX] = q, s
        elif k.endswith(T_SUFFIX) and k[: -len(T_SUFFIX)] in MATRICES + (QKV_FUSED,):  # (out, in)
            name = k[: -len(T_SUFFIX)]
            q, s = quantize_matrix(v, axis=-1)
            out[name + Q_SUFFIX + T_SUFFIX], out[name + S_SUFFIX] = q, s
        else:
            out[k] = v
    return out


def quantize_params(params, scheme: str = "int8", dtype: Optional[jnp.dtype] = None):
    """Weight-only quantization of a ``CausalLM`` / ``DiffusionLM`` parameter tree (module
    docstring: scheme, error bound, what stays unquantized).

    Args:
      params: the params tree (or the wrapped ``{"params": tree}``) with float layer
        matrices, in the stacked layout (``layers/wq (L, D, H*Dh)`` ...) or the per-layer decode
        layout of :func:`models.llama.modeling.unstack_layers` (input-major ``wq (D, H*Dh)``
        or output-major ``wq_t (H*Dh, D)``). Quantize float32 weights for the smallest error.
      scheme: ``"int8"`` (the only scheme).
      dtype: optional activation dtype (float32 / bfloat16): every other floating leaf
        (embedding, LM head, norms, biases) is cast to it; the scales stay float32.

    Returns:
      A new tree: each matrix ``name`` is replaced by ``name + "_q"`` (int8, the same shape and
      layout; output-major ``name + "_t"`` becomes ``name + "_q_t"``) and ``name + "_s"``
      (float32, one scale per output channel: ``(L, out)`` stacked, ``(out,)`` per layer).
      Everything else is shared (or cast).

    Raises:
      QuantError: unknown ``scheme`` (``"none"`` included: do not call it then), a tree that is
        already quantized, or one without ``CausalLM`` layer matrices (e.g. an XLNet AS-ARM).
    """
    if scheme != "int8":
        raise QuantError(f"unknown quantization scheme {scheme!r}; available: int8")
    wrapped = isinstance(params, Mapping) and "params" in params
    tree = params["params"] if wrapped else params
    layers = tree.get("layers") if isinstance(tree, Mapping) else None
    dicts = (
        (layers if isinstance(layers, (tuple, list)) else [layers]) if layers is not None else []
    )
    if is_quantized(tree):
        raise QuantError("the parameters are already quantized")
    if not dicts or not all(
        isinstance(d, Mapping) and all(has_projection(d, m) for m in MATRICES) for d in dicts
    ):
        raise QuantError(
            "weight-only int8 applies to Llama / Qwen2-layout models (causal and "
            "masked-diffusion); this parameter tree has no such layer matrices"
        )
    if isinstance(layers, (tuple, list)):
        new_layers = type(layers)(_quantize_layer(d) for d in layers)
    else:
        new_layers = _quantize_layer(layers)
    rest = {k: v for k, v in tree.items() if k != "layers"}
    if dtype is not None:
        rest = jax.tree_util.tree_map(
            lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, rest
        )
        new_layers = jax.tree_util.tree_map_with_path(
            lambda path, x: (
                x
                if _is_quant_leaf(path) or not jnp.issubdtype(x.dtype, jnp.floating)
                else x.astype(dtype)
            ),
            new_layers,
        )
    out = {**rest, "layers": new_layers}
    return {**params, "params": out} if wrapped else out


def _is_quant_leaf(path) -> bool:
    """Whether a tree path ends in a quantized matrix or a scale (kept int8 / float32)."""
    key = getattr(path[-1], "key", None)
    return isinstance(key, str) and (
        key.endswith(Q_SUFFIX) or key.endswith(Q_SUFFIX + T_SUFFIX) or key.endswith(S_SUFFIX)
    )


__all__ = [
    "QUANTS",
    "QuantError",
    "quantize_matrix",
    "dequantize_matrix",
    "quantize_params",
    "is_quantized",
]
