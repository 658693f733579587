"""Causal Llama / Qwen2 decoder: a frozen dataclass of the architecture over a parameter pytree.

One module covers both families: grouped-query attention, RMSNorm, rotary position
embeddings (HF "rotate-half" layout, base ``rope_theta``), SwiGLU MLP, optional q/k/v bias
(Qwen2), tied or untied LM head.

Every call takes explicit ``positions`` and an explicit boolean attention ``mask``, so the
same forward serves plain causal passes, KV-cached incremental steps, and draft-verification
passes with arbitrary (tree / permuted) masks. Layer weights are stacked along a leading
axis and the layers run in one ``lax.scan`` (compiles once per layer shape instead of
unrolling 30 layers). Decode loops on the CPU and GPUs pass the per-layer layout of
:func:`unstack_layers` instead, which unrolls the layers (faster per step there).

Parameter tree (``params``; ``{"params": tree}`` is accepted too)::

    embed        (V, D)
    layers/      attn_norm (L, D), wq (L, D, H*Dh), wk (L, D, K*Dh), wv (L, D, K*Dh),
                 [bq (L, H*Dh), bk (L, K*Dh), bv (L, K*Dh)], wo (L, H*Dh, D),
                 mlp_norm (L, D), w_gate (L, D, F), w_up (L, D, F), w_down (L, F, D)
    final_norm   (D,)
    lm_head      (D, V)   only when ``tie_embeddings`` is False

All matrices are stored input-major (``x @ w``), i.e. transposed relative to
``torch.nn.Linear.weight``. A weight-only int8 tree (:func:`models.quant.quantize_params`)
holds ``name_q`` (int8, same shape) and ``name_s`` (float32 ``(L, out)``) instead of each of
the seven projection matrices ``name`` (:data:`MATRICES`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.llama import attention
from models.llama.panels import SUFFIX as PANEL_SUFFIX
from models.llama.panels import pack_exact, packable, panel_product


@flax.struct.dataclass
class KVCache:
    """Key/value cache for all layers.

    Attributes:
      k: float array ``(num_layers, B, num_kv_heads, S, head_dim)``; v: float array
        ``(num_layers, B, num_kv_heads, head_dim, S)``. Both are head-major and ``v`` is
        slot-minor, so the two attention products read a layer's slots as stored: XLA:CPU
        copied the slot-major layout's values transposed (0.5 ms of a 24 ms
        SmolLM2-135M step on a 2-core AMD EPYC).
        Slot ``s`` of row ``b`` holds the key/value of the token written there. Slots are
        addressed by the caller (``cache_index``) and read through the attention ``mask``:
        stale slots (e.g. after rejected draft tokens) are harmless as long as the mask hides
        them, so rolling back is just resetting the caller's length pointer (see
        :func:`rollback`).
    """

    k: jax.Array
    v: jax.Array

    @property
    def size(self) -> int:
        return self.k.shape[3]


def param_dtype(params):
    """The compute dtype of a ``CausalLM`` params tree (or ``{"params": tree}``): its token
    embedding's dtype (float32 or bfloat16; :func:`models.registry.cast_params`). Int8
    weight-only trees (:mod:`models.quant`) keep the embedding in the activation dtype, so this
    is never int8 and the KV caches follow the activations."""
    return (params["params"] if "params" in params else params)["embed"].dtype


def init_cache(config: ModelConfig, batch: int, size: int, dtype=jnp.float32) -> KVCache:
    """Zero cache of ``size`` slots per row: keys ``(L, batch, K, size, Dh)``, values
    ``(L, batch, K, Dh, size)`` (:class:`KVCache`)."""
    L, K, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    return KVCache(
        k=jnp.zeros((L, batch, K, size, Dh), dtype), v=jnp.zeros((L, batch, K, Dh, size), dtype)
    )


def grow_cache(cache: KVCache, size: int) -> KVCache:
    """``cache`` with zero slots appended up to ``size`` slots per row (keys' axis 3, values'
    axis 4): a prompt pass runs on a cache of the prompt's slots, so its attention reads only
    those, and the decode loop continues in the grown one (the slots are where they were).

    Raises:
      ValueError: ``size`` is smaller than the cache."""
    extra = size - cache.size
    if extra < 0:
        raise ValueError(f"cannot grow a {cache.size}-slot cache to {size} slots")

    def grow(x, slot_axis):
        return jnp.pad(x, [(0, extra if a == slot_axis else 0) for a in range(x.ndim)])

    return KVCache(k=grow(cache.k, 3), v=grow(cache.v, 4))


def rollback(lengths: jax.Array, new_lengths: jax.Array) -> jax.Array:
    """Roll a cache back to ``new_lengths`` valid slots per row.

    The cache arrays themselves need no change: entries at or beyond ``new_lengths`` are
    excluded by the next call's attention mask and overwritten by the next write. This
    returns the new per-row length pointer (``int32 (B,)``) and checks it never grows.
    """
    return jnp.minimum(lengths, new_lengths).astype(jnp.int32)


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32: ``x / sqrt(mean(x^2) + eps) * w``."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * w).astype(x.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float):
    """cos/sin tables ``(B, T, head_dim)`` for integer ``positions`` ``(B, T)``."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    ang = positions.astype(jnp.float32)[..., None] * inv_freq  # (B, T, Dh/2)
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x`` ``(B, T, heads, Dh)`` with the HF rotate-half convention."""
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rot * sin[:, :, None, :]


def _write_cache(
    cache_arr: jax.Array,
    new: jax.Array,
    layer: jax.Array,
    index: jax.Array,
    slot_minor: bool = False,
) -> jax.Array:
    """Write ``new`` ``(B, T, K, Dh)`` into layer ``layer`` of ``cache_arr`` at per-row slot
    offsets ``index`` ``(B,)``: keys ``(L, B, K, S, Dh)``, or with ``slot_minor`` values
    ``(L, B, K, Dh, S)`` (:class:`KVCache`). In-place inside jit (no cache copy)."""
    B, T = new.shape[:2]
    if B == 1:  # one contiguous update per head, the common decoding case
        upd = jnp.moveaxis(new, 1, -1 if slot_minor else 2)[None].astype(cache_arr.dtype)
        start = (layer, 0, 0, 0, index[0]) if slot_minor else (layer, 0, 0, index[0], 0)
        return jax.lax.dynamic_update_slice(cache_arr, upd, start)
    rows = jnp.arange(B)[:, None]
    slots = index[:, None] + jnp.arange(T)[None, :]
    heads = (slice(None),) * (2 if slot_minor else 1)
    idx = (layer, rows, *heads, slots)
    # the advanced indices (layer, rows, slots) are split by the sliced axes, so NumPy's rules
    # put their broadcast shape (B, T) first: the value is ``new`` as given, (B, T, K, Dh)
    return cache_arr.at[idx].set(new.astype(cache_arr.dtype))


def _param_key(root: jax.Array, *path) -> jax.Array:
    """The PRNG key of one parameter of :func:`init_params`: ``root`` with ``path`` (the
    parameter's parent names, then its 1-based index in its parent) folded in through the
    leading 32 bits of a SHA-1 of the path. This is the derivation the earlier Flax-linen
    declaration of this model used (``flax.core.scope.LazyRng``), kept so that a seed gives the
    same random test models, and so the same goldens, as before."""
    digest = hashlib.sha1()
    for part in path:
        if isinstance(part, str):
            digest.update(part.encode("utf-8"))
        else:
            digest.update(part.to_bytes((part.bit_length() + 7) // 8, byteorder="big"))
    return jax.random.fold_in(root, jnp.uint32(int.from_bytes(digest.digest()[:4], "big")))


def init_params(config: ModelConfig, seed: int = 0) -> dict:
    """Random parameters of :class:`CausalLM` (module docstring's tree, float32 stacked
    layout) for tests and benchmarks: projection matrices and the embedding / LM head drawn
    from ``N(0, 0.02^2)``, norms one, biases zero. Deterministic in ``seed``."""
    c = config
    L, D, F = c.num_layers, c.hidden_size, c.intermediate_size
    qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    root = jax.random.PRNGKey(seed)

    def normal(key, shape):
        return 0.02 * jax.random.normal(key, shape, jnp.float32)

    shapes = {
        "attn_norm": (L, D), "wq": (L, D, qd), "wk": (L, D, kd), "wv": (L, D, kd),
        "wo": (L, qd, D), "mlp_norm": (L, D), "w_gate": (L, D, F), "w_up": (L, D, F),
        "w_down": (L, F, D),
    }  # fmt: skip
    if c.qkv_bias:
        shapes.update(bq=(L, qd), bk=(L, kd), bv=(L, kd))
    layers = {}
    for i, (name, shape) in enumerate(shapes.items(), start=1):
        if name.endswith("norm"):
            layers[name] = jnp.ones(shape, jnp.float32)
        elif name.startswith("b"):
            layers[name] = jnp.zeros(shape, jnp.float32)
        else:
            layers[name] = normal(_param_key(root, "layers", i), shape)
    params = {
        "embed": normal(_param_key(root, 1), (c.vocab_size, c.hidden_size)),
        "layers": layers,
        "final_norm": jnp.ones((c.hidden_size,), jnp.float32),
    }
    if not c.tie_embeddings:
        params["lm_head"] = normal(_param_key(root, 3), (c.hidden_size, c.vocab_size))
    return params


@dataclasses.dataclass(frozen=True)
class CausalLM:
    """Llama / Qwen2 decoder-only LM: the architecture (static, hashable) over a parameter
    pytree that lives outside (:func:`init_params`, :func:`models.llama.params.load_llama`).
    The same convention as :class:`models.diffusion.modeling.DiffusionLM` and
    :class:`models.xlnet.modeling.XLNetLM`: ``jax.jit(model.apply)`` works.

    Call signature::

        logits, cache = model.apply(params, tokens, positions, mask,
                                    cache=None, cache_index=None)

    Args:
      params: the parameter tree (module docstring), in the stacked layout, a decode layout
        of :func:`unstack_layers`, or weight-only int8 (:mod:`models.quant`); or
        ``{"params": tree}``.
      tokens: ``int32 (B, T)`` token ids.
      positions: ``int32 (B, T)`` absolute positions used for RoPE.
      mask: ``bool (B, T, S)``: query ``t`` may attend key slot ``s``. Without a cache
        ``S == T`` (keys are the ``T`` input tokens); with a cache ``S`` is the cache size
        and the new keys are first written at slots ``cache_index[b] + t``.
        Every query row must allow at least one key.
      cache: optional :class:`KVCache`.
      cache_index: ``int32 (B,)`` write offset per row (required with ``cache``).
      return_hidden: if True return the final hidden states ``(B, T, D)`` instead of logits.
      last_rows: static ``int`` or None: return the logits (or hidden states) of the last
        ``last_rows`` rows only, ``(B, last_rows, V)``; the LM head then multiplies only those
        rows. A prompt pass that needs the last row's logits skips the head's other ``T - 1``
        rows, about a fifth of the multiply-adds of a 192-token SmolLM2-135M prompt (see
        docs/performance.md, "The prompt pass computes one row of logits"). None: all ``T``.
      hidden_layers: static tuple of layer ids in ``0..num_layers-1`` (default empty): also
        return the residual stream after each of those decoder layers, for all ``T`` rows
        (``last_rows`` does not cut them), from the same pass. A feature-conditioned drafter
        (DFlash, :mod:`jaxspec.causal.dflash`) reads them from the verification pass.

    Returns:
      ``(logits float32 (B, T, V), cache)``; ``cache`` is the updated cache or None. With
      ``hidden_layers``: ``(logits, cache, hidden (B, T, len(hidden_layers), D))`` in the
      activation dtype, layer order as given.

    Attributes:
      config: the architecture (:class:`models.config.ModelConfig`).
      row_blocks: row blocks of its one-row output-major products on the CPU
        (:func:`gemv_blocks`; a static knob of :class:`models.llama.layout.DecodePlan`); None:
        :data:`ONE_TASK_BLOCKS`.

    Raises:
      ValueError: the embedding's shape is not the config's ``(vocab_size, hidden_size)``;
        ``cache`` without ``cache_index``; ``last_rows`` outside ``1..T``; a
        ``hidden_layers`` id outside ``0..num_layers-1``.
    """

    config: ModelConfig
    row_blocks: Optional[int] = None

    def replace(self, **changes) -> "CausalLM":
        """A copy with ``changes`` (e.g. ``row_blocks``) applied."""
        return dataclasses.replace(self, **changes)

    def apply(
        self,
        params,
        tokens,
        positions,
        mask,
        cache: Optional[KVCache] = None,
        cache_index=None,
        return_hidden: bool = False,
        last_rows: Optional[int] = None,
        hidden_layers: tuple = (),
    ):
        c = self.config
        p = params["params"] if "params" in params else params
        embed, final_norm, lm_head = p["embed"], p["final_norm"], p.get("lm_head")
        if tuple(embed.shape) != (c.vocab_size, c.hidden_size):
            raise ValueError(
                f"the embedding has shape {tuple(embed.shape)}, the config expects "
                f"{(c.vocab_size, c.hidden_size)} (params of another model?)"
            )
        stored = p["layers"]
        per_layer = isinstance(stored, (tuple, list))  # the decode layout, see unstack_layers
        layers = tuple(stored) if per_layer else dict(stored)
        tokens = jnp.asarray(tokens, jnp.int32)
        positions = jnp.asarray(positions, jnp.int32)

        B, T = tokens.shape
        if last_rows is not None and not 1 <= last_rows <= T:
            raise ValueError(f"last_rows must be between 1 and the {T} input rows, got {last_rows}")
        want = tuple(int(i) for i in hidden_layers)
        bad = [i for i in want if not 0 <= i < c.num_layers]
        if bad:
            raise ValueError(
                f"hidden_layers {bad} outside the model's layers 0..{c.num_layers - 1}"
            )
        H, K, Dh = c.num_heads, c.num_kv_heads, c.head_dim
        x = jnp.take(embed, tokens, axis=0)
        cos, sin = rope_tables(positions, Dh, c.rope_theta)
        bias = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)[:, None, None, :, :]  # (B,1,1,T,S)
        scale = Dh**-0.5
        rb = self.row_blocks
        # the mask as the CPU attention kernel reads it, once per pass; None: XLA's attention
        kernel = cache is not None and attention.kernel_applies(x, per_layer)
        seen = jnp.broadcast_to(mask, (B, T, cache.size)).astype(bool) if kernel else None

        def block(carry, lp):
            h, kc_all, vc_all, li = carry
            a = rms_norm(h, lp["attn_norm"], c.rms_norm_eps)
            q, k, v = qkv_proj(a, lp, H * Dh, K * Dh, rb)
            if c.qkv_bias:
                q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
            q = apply_rope(q.reshape(B, T, H, Dh), cos, sin)
            k = apply_rope(k.reshape(B, T, K, Dh), cos, sin)
            v = v.reshape(B, T, K, Dh)
            if kc_all is not None:
                kc_all = _write_cache(kc_all, k, li, cache_index)
                vc_all = _write_cache(vc_all, v, li, cache_index, slot_minor=True)
            if seen is not None:  # the CPU kernel (unrolled layouts)
                o = attention.cached_attention(q, kc_all, vc_all, li, seen, scale)
            else:
                if kc_all is not None:
                    keys = jax.lax.dynamic_index_in_dim(kc_all, li, 0, keepdims=False)
                    vals = jax.lax.dynamic_index_in_dim(vc_all, li, 0, keepdims=False)
                else:  # no cache: the T new keys and values, laid out like a cache's
                    keys, vals = jnp.swapaxes(k, 1, 2), jnp.transpose(v, (0, 2, 3, 1))
                o = attention.xla_attention(q, keys, vals, bias, scale)
            h = h + proj(o, lp, "wo", rb)
            m = rms_norm(h, lp["mlp_norm"], c.rms_norm_eps)
            g = jax.nn.silu(proj(m, lp, "w_gate", rb)) * proj(m, lp, "w_up", rb)
            h = h + proj(g, lp, "w_down", rb)
            return (h, kc_all, vc_all, li + 1), (h if want else None)

        def run_layers(carry):
            if not per_layer:
                carry, hs = jax.lax.scan(block, carry, layers)
                return carry, (hs[jnp.asarray(want)] if want else None)
            outs = {}
            for i, lp in enumerate(layers):  # unrolled: no per-layer weight slicing
                carry = block(carry[:3] + (jnp.array(i, jnp.int32),), _after(lp, carry[0]))[0]
                outs[i] = carry[0]
            return carry, (jnp.stack([outs[i] for i in want]) if want else None)

        li0 = jnp.array(0, jnp.int32)
        if cache is not None:
            if cache_index is None:
                raise ValueError("cache_index (B,) is required when a cache is given")
            cache_index = jnp.asarray(cache_index, jnp.int32)
            (x, ks, vs, _), hidden = run_layers((x, cache.k, cache.v, li0))
            new_cache = KVCache(k=ks, v=vs)
        else:
            (x, _, _, _), hidden = run_layers((x, None, None, li0))
            new_cache = None
        if last_rows is not None:
            x = x[:, T - last_rows :]
        x = rms_norm(x, final_norm, c.rms_norm_eps)
        out = x if return_hidden else lm_logits(x, embed, lm_head, p.get(HEAD_PANELS))
        if want:  # (n, B, T, D) -> (B, T, n, D)
            return out, new_cache, jnp.moveaxis(hidden, 0, 2)
        return out, new_cache


MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
#: the params entry of the LM head packed in panels (the CPU panel kernel's decode layout)
HEAD_PANELS = "head_p"
QKV = ("wq", "wk", "wv")
#: the name of the q/k/v matrices fused into one in the output-major decode layout (fuse_qkv)
QKV_FUSED = "wqkv"


def _after(lp: dict, h: jax.Array) -> dict:
    """``lp`` with its int8 matrices (:mod:`models.quant`) made data-dependent on the layer
    input ``h``: ``q + z`` with ``z = int8(h[0] != h[0])``, which is 0 for every finite ``h``
    (float ``x != x`` is not folded away). Float layers pass through unchanged.

    Why: in the unrolled per-layer layout nothing orders the int8 -> float conversions
    :func:`proj` needs, so XLA:CPU hoists all of them to the start of the program and
    materialises every layer's converted weights at once (425 MB of temporaries for
    SmolLM2-135M, a decode step 5-7x slower than float32). Tied to their layer's input, the
    conversions of layer ``i`` wait for layer ``i`` and reuse one buffer of about one layer
    (14 MB), as inside the ``lax.scan`` of the stacked layout. Q8 panels
    (:func:`models.llama.panels.pack_q8`, int8 too) are left alone: the panel kernel reads
    their codes in place, and ``q + z`` would copy every panel every pass (a one-token step of
    Qwen2.5-Coder-0.5B on Q8 panels spent 25 of its 51 ms on those copies)."""
    tied = [k for k, w in lp.items() if w.dtype == jnp.int8 and not k.endswith(PANEL_SUFFIX)]
    if not tied:  # Q8 panels (int8 too) go to the kernel as they are: no conversion to order
        return lp
    v = h.reshape(-1)[0]
    z = (v != v).astype(jnp.int8)
    return {k: (w + z if k in tied else w) for k, w in lp.items()}


def unstack_layers(params, output_major: bool = False, panels: bool = False):
    """The decode layout of a parameter tree: ``params["layers"]`` becomes a tuple of ``L``
    per-layer dicts instead of stacked ``(L, ...)`` arrays; every other entry is shared, not
    copied. :class:`CausalLM` accepts both layouts and computes the same function; with
    per-layer weights it unrolls the layer loop instead of a ``lax.scan``.

    Why (docs/performance.md; SmolLM2-135M, AMD EPYC, 2 cores): inside ``lax.scan``
    XLA:CPU copies each layer's weight slice out of the stacked array before the
    matrix-vector product (a ``dynamic-slice`` fusion), so a batch-1 decode step moves the
    layer weights three times instead of once. XLA:GPU copies the slices too (on an H100 the
    unrolled loop decoded 1.41x-2.64x faster, docs/performance.md, "GPU: the layer loop as the
    model grows"); the TPU keeps the stacked layout and the scan, unmeasured
    (:func:`models.llama.layout.decode_layout`).

    Args:
      params: a ``CausalLM`` params tree with stacked ``layers`` (already unstacked trees are
        returned as they are). Works on host arrays and inside ``jit``.
      output_major: store the seven projection matrices transposed, ``(out, in)`` like
        ``torch.nn.Linear.weight``, under ``name + "_t"`` (see :func:`proj`), with q/k/v
        fused into one ``wqkv_t`` (:func:`fuse_qkv`): XLA:CPU's one-token matrix-vector
        product streams them faster, its few-token products (verification passes) slower on
        some CPUs, so AR loops use it and speculative loops time both
        (:func:`models.llama.layout.plan`).
        Int8 matrices ``name + "_q"`` (:mod:`models.quant`) become ``name + "_q_t"``; their
        scales ``name + "_s"`` ``(out,)`` are the same in both layouts.
      panels: (input-major only) pack every float32 projection matrix whose column count is
        a multiple of 16 into 16-column panels ``name + "_p"``: float32 ``(N / 16, K, 16)``,
        or uint8 Q4_1 panels ``(N / 16, K / 32, 384)`` (int8 Q8_0 panels ``(N / 16, K / 32,
        576)``) where the matrix is exactly a dequantized GGUF Q4_1 (Q8_0) tensor
        (:func:`models.llama.panels.pack_exact`; the same products bit for bit from 0.75
        (1.125) bytes a weight), q/k/v fused into one ``wqkv_p``: the layout of
        the CPU panel kernel (:mod:`models.llama.panels`), whose few-row products cost about
        what a one-row product does. The layout modules pass
        :func:`models.llama.panels.panels_active`.

    Returns:
      A new dict; the per-layer arrays are ``L`` slices (or transposed slices) of the stacked
      ones, i.e. a copy of the layer weights.
    """
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):
        return params
    n = next(iter(layers.values())).shape[0]
    panels = panels and not output_major
    per_layer = (
        dict(layer_entry(k, v, i, output_major, panels) for k, v in layers.items())
        for i in range(n)
    )
    fused = output_major or panels
    return {**params, "layers": tuple(map(fuse_qkv, per_layer) if fused else per_layer)}


def layer_entry(
    name: str, stacked, i: int, output_major: bool = False, panels: bool = False
) -> tuple[str, Any]:
    """``(name, array)`` of layer ``i``'s entry ``name`` of a stacked ``layers`` dict in the
    per-layer layout of :func:`unstack_layers`: ``stacked[i]``, or for a projection matrix
    (float, or int8 ``_q`` of :mod:`models.quant`) with ``output_major`` its transpose under
    ``name + "_t"``, or with ``panels`` (a float32 matrix with a multiple of 16 columns, on
    one device) its panels under ``name + "_p"``: Q4_1 (Q8_0) panels where the matrix is
    exactly a dequantized Q4_1 (Q8_0) tensor, else float32 ones
    (:func:`models.llama.panels.pack_exact`)."""
    if output_major and (name in MATRICES or (name.endswith("_q") and name[:-2] in MATRICES)):
        return name + "_t", stacked[i].T
    if panels and name in MATRICES and not _sharded(stacked) and packable(stacked[i]):
        return name + PANEL_SUFFIX, pack_exact(stacked[i])
    return name, stacked[i]


def _sharded(x) -> bool:
    """Whether ``x`` is a concrete array laid out over more than one device."""
    return (
        isinstance(x, jax.Array)
        and not isinstance(x, jax.core.Tracer)
        and len(x.sharding.device_set) > 1
    )


def fuse_qkv(lp: dict) -> dict:
    """One layer's output-major dict (:func:`unstack_layers`) with ``wq_t``, ``wk_t`` and
    ``wv_t`` replaced by their row concatenation ``wqkv_t`` ``((H + 2K) * Dh, D)`` (int8:
    ``wqkv_q_t`` and the concatenated per-row scales ``wqkv_s``), or one panel-packed dict's
    ``wq_p`` / ``wk_p`` / ``wv_p`` by ``wqkv_p`` (their panels in a row: the columns of the
    concatenated matrix, :mod:`models.llama.panels`, where all three are panels of one kind and
    shape: Q4_1 / Q8 panels of different kinds stay three products, each reading its compact
    codes); other dicts unchanged, and
    so are arrays laid out over several devices (their heads are split over the model axis,
    :mod:`models.sharding`, and a fused matrix would mix them).

    Why (docs/performance.md): XLA:CPU's matrix-vector kernel splits a product into
    tasks of at least 2^19 multiply-adds, so SmolLM2-135M's ``576 x 576`` and ``192 x 576``
    products run on one thread (about 14 GB/s on a 2-core AMD EPYC) and the fused
    ``960 x 576`` one on two (about 24 GB/s). The model computes the same q, k and v."""
    for suffix in ("_t", "_q_t", PANEL_SUFFIX):
        names = [m + suffix for m in QKV]
        if not all(n in lp for n in names) or any(_sharded(lp[n]) for n in names):
            continue
        scales = [m + "_s" for m in QKV] if suffix == "_q_t" else []
        out = {k: v for k, v in lp.items() if k not in names and k not in scales}
        parts = [lp[n] for n in names]
        if suffix == PANEL_SUFFIX and len({(w.dtype, w.shape[1:]) for w in parts}) > 1:
            return lp  # panels of several kinds (e.g. Q4_K q/k, Q6_K v): three compact products
        out[QKV_FUSED + suffix] = jnp.concatenate(parts, axis=0)
        if scales:
            out[QKV_FUSED + "_s"] = jnp.concatenate([lp[n] for n in scales], axis=0)
        return out
    return lp


def has_projection(lp, name: str) -> bool:
    """Whether a (stacked or one layer's) ``layers`` dict holds projection ``name`` in any
    decode layout: float ``name`` / ``name + "_t"``, int8 ``name + "_q"`` / ``name + "_q_t"``
    with scales ``name + "_s"`` (:mod:`models.quant`), or for q/k/v fused (:func:`fuse_qkv`)."""
    names = [name] + ([QKV_FUSED] if name in QKV else [])
    return any(
        n in lp
        or n + "_t" in lp
        or n + PANEL_SUFFIX in lp
        or ((n + "_q" in lp or n + "_q_t" in lp) and n + "_s" in lp)
        for n in names
    )


def proj(x: jax.Array, lp: dict, name: str, blocks: Optional[int] = None) -> jax.Array:
    """``x @ W`` for the layer weight ``name``: input-major ``lp[name]`` ``(in, out)``, or its
    output-major copy ``lp[name + "_t"]`` ``(out, in)`` in the AR decode layout
    (:func:`unstack_layers`), where XLA:CPU's matrix-vector product streams faster
    (:func:`output_major_product`, which also spreads one-task products over the threads).

    Weight-only int8 (:func:`models.quant.quantize_params`): ``lp[name + "_q"]`` int8
    ``(in, out)`` (or ``lp[name + "_q_t"]`` ``(out, in)``) with float32 per-output-channel
    scales ``lp[name + "_s"]`` ``(out,)`` gives ``(x @ q) * s``: the int8 matrix is the
    product's operand, converted to the activation dtype, and the scale (in float32) multiplies
    the ``(..., out)`` result, never the matrix. XLA:CPU runs the conversion as its own pass
    (one layer at a time, :func:`_after`); GPU compilers can fuse it into the matmul. The result
    has ``x``'s dtype.

    Panel-packed float32 ``lp[name + "_p"]`` ``(N / 16, K, 16)`` (:func:`unstack_layers`'s
    ``panels``) runs the CPU panel kernel (:func:`models.llama.panels.panel_product`)."""
    if name in lp:
        return x @ lp[name]
    if name + PANEL_SUFFIX in lp:
        return panel_product(x, lp[name + PANEL_SUFFIX])
    if name + "_t" in lp:
        return output_major_product(x, lp[name + "_t"], blocks)
    if name + "_q" in lp:
        y = x @ lp[name + "_q"].astype(x.dtype)
    else:
        y = output_major_product(x, lp[name + "_q_t"].astype(x.dtype), blocks)
    return (y.astype(jnp.float32) * lp[name + "_s"]).astype(x.dtype)


#: XLA:CPU's tiled matrix-vector kernel gives each of its (at most 8) tasks at least this many
#: multiply-adds (``DotOpEmitter::EmitTiledLlvmIrGemv``, read for the constant)
GEMV_TASK_FMAS = 2**19
#: row blocks of a one-task product in :func:`output_major_product` (1 turns the blocking off)
ONE_TASK_BLOCKS = 4


def gemv_blocks(
    rows: int, m: int, k: int, backend: Optional[str] = None, blocks: Optional[int] = None
) -> int:
    """Row blocks for ``x (rows, k) @ w_t.T`` with ``w_t`` ``(m, k)`` in
    :func:`output_major_product`: :data:`ONE_TASK_BLOCKS` when XLA:CPU would run the product
    as one task on one thread (one row, ``m * k`` under :data:`GEMV_TASK_FMAS`; SmolLM2-135M's
    ``576 x 576`` ``wo``) and the blocks divide ``m``; else 1. ``backend`` defaults to JAX's;
    ``blocks`` (a :class:`CausalLM`'s ``row_blocks``) replaces :data:`ONE_TASK_BLOCKS`.

    One row only: with many rows fed by an RMSNorm, XLA:CPU (jaxlib 0.10.2) fuses the norm, the
    broadcast over the blocks and the batched product into one YNNPACK fusion that returns NaN
    from 4,096 rows on (``benchmarks/probes/matvec-tasks/ynn_fusion_repro.py``)."""
    b = ONE_TASK_BLOCKS if blocks is None else int(blocks)
    if (
        rows != 1
        or b <= 1
        or m * k >= GEMV_TASK_FMAS
        or m % b
        or (backend or jax.default_backend()) != "cpu"
    ):
        return 1
    return b


def output_major_product(x: jax.Array, w_t: jax.Array, blocks: Optional[int] = None) -> jax.Array:
    """``x (..., k) @ w_t.T`` for an output-major matrix ``w_t`` ``(m, k)`` -> ``(..., m)``.

    A one-row product that XLA:CPU would give a single task (:func:`gemv_blocks`) runs as a
    batched product over ``b`` blocks of ``m / b`` output rows instead, which XLA:CPU spreads
    over its threads: a chain of SmolLM2-135M ``wo`` products streamed 23-25 GB/s against 16
    on a 2-core AMD EPYC (docs/performance.md, "`wo` in row blocks"). Same sums per output, so the
    result equals the plain product up to float rounding order."""
    m, k = w_t.shape
    rows = math.prod(x.shape[:-1])
    b = gemv_blocks(rows, m, k, blocks=blocks)
    if b == 1:
        return jnp.einsum("...i,oi->...o", x, w_t)
    xb = jnp.broadcast_to(x.reshape(1, k), (b, k))
    y = jnp.einsum("bi,boi->bo", xb, w_t.reshape(b, m // b, k))
    return y.reshape(x.shape[:-1] + (m,))


def qkv_proj(
    x: jax.Array, lp: dict, q_dim: int, kv_dim: int, blocks: Optional[int] = None
) -> tuple:
    """``(q (..., q_dim), k (..., kv_dim), v (..., kv_dim))`` of ``x`` ``(..., D)``: one
    product over the fused ``wqkv`` (:func:`fuse_qkv`) split at ``q_dim`` and
    ``q_dim + kv_dim``, else three :func:`proj` products."""
    if any(QKV_FUSED + suffix in lp for suffix in ("_t", "_q_t", PANEL_SUFFIX)):
        return tuple(jnp.split(proj(x, lp, QKV_FUSED, blocks), (q_dim, q_dim + kv_dim), axis=-1))
    return proj(x, lp, "wq", blocks), proj(x, lp, "wk", blocks), proj(x, lp, "wv", blocks)


def lm_logits(
    x: jax.Array,
    embed: jax.Array,
    lm_head: Optional[jax.Array],
    head_panels: Optional[jax.Array] = None,
) -> jax.Array:
    """LM head: final hidden states ``(..., D)`` -> float32 logits ``(..., V)``, with the
    embedding matrix ``(V, D)`` as the head when ``lm_head`` ``(D, V)`` is None (tied).
    ``head_panels`` ``(V / 16, D, 16)``, the head packed for the CPU panel kernel (a decode
    layout's :data:`HEAD_PANELS` entry, :func:`models.llama.layout.decode_layout`), is
    multiplied by that kernel instead."""
    if head_panels is not None:
        return panel_product(x, head_panels).astype(jnp.float32)
    head = embed.T if lm_head is None else lm_head
    return (x @ head).astype(jnp.float32)
