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
import psutil

from jaxspec.core.compile_cache import enable_persistent_cache, ensure_persistent_cache
from models.llama.modeling import MATRICES, fuse_qkv, has_projection, layer_entry, unstack_layers

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
    in before timing it (:func:`use_compiled`; :func:`jaxspec.bench.common.compile_arms`)."""
    return dict(_EXECUTABLES)


def use_compiled(snapshot: dict) -> None:
    """Make ``snapshot`` (:func:`compiled_snapshot`) the compile cache."""
    _EXECUTABLES.clear()
    _EXECUTABLES.update(snapshot)


# ----------------------------------------------------------------------------- layer layout

LAYER_LOOPS = ("auto", "scan", "unrolled")
VERIFY_LAYOUTS = ("auto", "stored", "output-major")
_OVERRIDES: dict[str, list] = {"layer loop": [], "verify layout": []}  # innermost context last


def _is_causal_layers(layers) -> bool:
    """Whether a stacked ``layers`` dict (or one layer's dict) is a Llama/Qwen2 body's: every
    projection matrix is present in one of its layouts
    (:func:`models.llama.modeling.has_projection`)."""
    return isinstance(layers, Mapping) and all(has_projection(layers, m) for m in MATRICES)
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


# "auto" unrolls the layer loop when the per-layer copy decode_layout makes is at most this
# size, or when the device's bytes in use plus the copy stay within AUTO_UNROLL_MEMORY_SHARE of
# its memory limit (an accelerator's; the rest is left to KV caches and temporaries) or within
# AUTO_UNROLL_HOST_SHARE of the host's RAM (the CPU); a tree split in place
# (decode_layout_in_place) needs no copy
AUTO_UNROLL_MAX_BYTES = 2 << 30
AUTO_UNROLL_MEMORY_SHARE = 0.5
AUTO_UNROLL_HOST_SHARE = 0.8


def device_memory() -> tuple[int, int] | None:
    """``(bytes in use, bytes limit)`` of the first device: an accelerator's allocator
    statistics, or on the CPU the host's RAM (total minus available, total; psutil); None
    where an accelerator does not report them."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        ram = psutil.virtual_memory()
        return int(ram.total - ram.available), int(ram.total)
    stats = device.memory_stats() or {}
    used, limit = stats.get("bytes_in_use"), stats.get("bytes_limit")
    return None if used is None or not limit else (int(used), int(limit))


def _copy_fits(nbytes: int) -> bool:
    """Whether a per-layer copy of ``nbytes`` fits the rule of :func:`resolve_layer_loop`."""
    if nbytes <= AUTO_UNROLL_MAX_BYTES:
        return True
    mem = device_memory()
    cpu = jax.default_backend() == "cpu"
    share = AUTO_UNROLL_HOST_SHARE if cpu else AUTO_UNROLL_MEMORY_SHARE
    return mem is not None and mem[0] + nbytes <= share * mem[1]


def resolve_layer_loop(layer_loop: str | None = None, nbytes: int | None = None) -> str:
    """``"scan"`` or ``"unrolled"``: the argument, else the innermost :func:`layer_loop`
    context, else ``$JAXSPEC_LAYER_LOOP``, else ``"auto"``. ``"auto"`` is ``"unrolled"`` on
    the CPU and a GPU when the per-layer copy of ``nbytes`` (bytes, the stacked layer weights
    :func:`split_bytes` counts; 0 for a tree already split) is at most
    :data:`AUTO_UNROLL_MAX_BYTES` or fits the device's free memory (bytes in use + ``nbytes``
    within :data:`AUTO_UNROLL_MEMORY_SHARE` of its limit, :func:`device_memory`; on the CPU
    within :data:`AUTO_UNROLL_HOST_SHARE` of the host's RAM), else ``"scan"``; when ``nbytes``
    is None, ``"unrolled"`` on the CPU and ``"scan"`` on a GPU; and ``"scan"`` on TPU (not
    measured there). On the CPU the scan decoded SmolLM2-1.7B shapes (float32) 3.0x slower
    than the unrolled loop (``results/gpu/layer-loop/cpu-size-sweep.json``): it is the
    fallback that needs no copy, not a fast path.
    Measured on an H100 in bfloat16 (README "GPU: the layer loop as the model grows"), the
    unrolled loop decoded 1.41x (SmolLM2-135M), 2.64x (1.7B shapes) and 2.55x (Qwen2.5-7B
    shapes) faster than the scan.

    Raises:
      ValueError: an unknown name.
    """
    name = _setting("layer loop", layer_loop, "JAXSPEC_LAYER_LOOP", LAYER_LOOPS, "auto")
    if name == "auto":
        backend = jax.default_backend()
        if backend == "cpu" and nbytes is None:
            return "unrolled"
        fits = nbytes is not None and _copy_fits(nbytes)
        return "unrolled" if backend in ("cpu", "gpu") and fits else "scan"
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
    float32 rounding). Ignored by the ``scan`` loop. A tree split in place
    (:func:`decode_layout_in_place`) has one layout: ``"auto"`` takes it, and asking for the
    other is a ValueError in :func:`jaxspec.causal.decode.tune_verification`.

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


def _cached_split(layers: dict, output_major: bool) -> tuple | None:
    """The cached per-layer copy of a stacked ``layers`` dict in that layout, or None."""
    leaves = [layers[k] for k in sorted(layers)]
    for refs, om, out in _UNSTACKED:
        if om == output_major and len(refs) == len(leaves) and all(
                r() is x for r, x in zip(refs, leaves)):
            return out
    return None


def _deleted(x) -> bool:
    return isinstance(x, jax.Array) and x.is_deleted()


def _unstacked_layers(layers: dict, output_major: bool) -> tuple:
    """Per-layer dicts of a stacked ``layers`` dict, cached per stacked tree (by identity of
    its arrays, held weakly) and layout, so repeated decodes with the same weights split them
    once."""
    out = _cached_split(layers, output_major)
    if out is not None:
        return out
    out = unstack_layers({"layers": layers}, output_major)["layers"]
    try:
        refs = [weakref.ref(layers[k]) for k in sorted(layers)]
    except TypeError:  # numpy arrays and tracers: no caching
        return out
    # copies of stacked trees that are gone (collected, or split in place) are dropped
    _UNSTACKED[:] = [e for e in _UNSTACKED
                     if all(r() is not None and not _deleted(r()) for r in e[0])]
    _UNSTACKED.append((refs, output_major, out))
    # at most four per-layer copies stay alive: enough for a target in both layouts (AR and
    # speculative loops) plus a draft model, so comparing decoders does not re-split weights
    del _UNSTACKED[:-4]
    return out


def _is_body(layers) -> bool:
    """A Llama/Qwen2 body's ``layers``: a stacked dict, or a split tuple of per-layer dicts."""
    return _is_causal_layers(layers) or (isinstance(layers, (tuple, list)) and bool(layers)
                                         and all(map(_is_causal_layers, layers)))


def _map_bodies(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` with ``fn(layers)`` in place of the ``layers`` of every Llama/Qwen2-layout body
    inside it (stacked dict or split tuple; in a params dict, linen variables
    ``{"params": ...}``, or any nest of dicts / tuples / lists holding them); everything else
    is shared, not copied."""
    def walk(x):
        if isinstance(x, Mapping):
            layers = x.get("layers")
            if _is_body(layers):
                return {**x, "layers": fn(layers)}
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (tuple, list)) and not hasattr(x, "_fields"):
            return type(x)(walk(v) for v in x)
        return x

    return walk(tree)


def _stacked(fn: Callable[[dict], Any]) -> Callable[[Any], Any]:
    """``fn`` for stacked bodies (given as a plain dict); split bodies pass through."""
    return lambda layers: fn(dict(layers)) if isinstance(layers, Mapping) else layers


def _bodies(tree: Any) -> list:
    """Every Llama/Qwen2-layout ``layers`` entry inside ``tree``: stacked dicts and split
    (per-layer tuple) bodies alike."""
    found: list = []
    _map_bodies(tree, lambda layers: found.append(layers) or layers)
    return found


def split_bytes(tree: Any, output_major: bool | None = None) -> int:
    """Bytes of the stacked Llama/Qwen2 layer weights in ``tree`` (0 for a tree already split
    in place); with ``output_major`` given, only of those without a cached per-layer copy in
    that layout: what :func:`decode_layout` would add now."""
    return sum(tree_nbytes(b) for b in _bodies(tree) if isinstance(b, Mapping) and (
        output_major is None or _cached_split(dict(b), output_major) is None))


def split_layout(tree: Any) -> str | None:
    """``"output-major"`` or ``"stored"``: the layout of the first body of ``tree`` split in
    place (:func:`decode_layout_in_place`), or None when it holds none."""
    for body in _bodies(tree):
        if not isinstance(body, Mapping):
            return "output-major" if any(k.endswith("_t") for k in body[0]) else "stored"
    return None


def is_split(tree: Any) -> bool:
    """Whether ``tree`` holds a body split in place (:func:`decode_layout_in_place`)."""
    return split_layout(tree) is not None


def tree_layer_loop(tree: Any, layer_loop: str | None = None, output_major: bool = False) -> str:
    """The layer loop the decoders run on ``tree``: ``"unrolled"`` when it holds a body split
    in place (:func:`is_split`; its model has no stacked weights to scan, so any setting runs
    unrolled), else :func:`resolve_layer_loop` weighing the per-layer copy in the
    ``output_major`` layout that is not cached yet (:func:`split_bytes`), so a copy made by
    an earlier decode is reused even when a second one would not fit. (A tree mixing split
    and stacked bodies counts as split: its stacked bodies are copied unchecked.)

    Raises:
      ValueError: unknown ``layer_loop`` (for a tree with no split body).
    """
    if is_split(tree):
        return "unrolled"
    return resolve_layer_loop(layer_loop, split_bytes(tree, output_major))


def decode_layout(tree: Any, layer_loop: str | None = None, output_major: bool = False) -> Any:
    """Put every Llama/Qwen2-layout parameter tree inside ``tree`` (a params dict, linen
    variables ``{"params": ...}``, or any nest of dicts / tuples / lists holding them, e.g. a
    drafter's ``(dllm_params, proxy)``) into the layout the decode loops run fastest with
    (:func:`resolve_layer_loop`): per-layer weights (:func:`models.llama.modeling.unstack_layers`)
    for ``"unrolled"``, unchanged for ``"scan"`` (``"auto"`` weighs the copy,
    :func:`split_bytes`). XLNet and other trees, and trees already split
    (:func:`decode_layout_in_place`), pass through. The model computes the same function in
    every layout (up to float32 rounding); only the compiled loop differs. ``output_major``
    (unrolled only) also transposes the projection matrices and fuses q/k/v into one
    (:func:`models.llama.modeling.fuse_qkv`), faster for one-token steps (the AR loop) and
    slower for verification passes. Int8 weight-only trees
    (:func:`models.quant.quantize_params`) are split the same way (their ``_q`` matrices
    transposed to ``_q_t`` when ``output_major``; scales shared).

    Raises:
      ValueError: unknown ``layer_loop``.
    """
    if tree_layer_loop(tree, layer_loop, output_major) == "scan":
        return tree
    return _map_bodies(tree, _stacked(lambda layers: _unstacked_layers(layers, output_major)))


def _fused_in_place(lp: dict) -> dict:
    """:func:`models.llama.modeling.fuse_qkv` of one layer's dict, deleting the separate q/k/v
    arrays once the fused one exists (so fusing holds one layer's q/k/v twice at most)."""
    fused = fuse_qkv(lp)
    if fused is not lp:
        jax.block_until_ready(fused)
        for key in lp.keys() - fused.keys():
            if isinstance(lp[key], jax.Array):
                lp[key].delete()
    return fused


def decode_layout_in_place(tree: Any, layer_loop: str | None = None,
                           output_major: bool = True, force: bool = False) -> Any:
    """The one-copy decode layout: where the layer loop (:func:`resolve_layer_loop`, with no
    copy to pay) is ``"unrolled"``, every stacked Llama/Qwen2 body in ``tree`` is split into
    per-layer arrays, **deleting each stacked array once its slices are made**, so the device
    holds the weights once (plus, while splitting, one stacked array: the largest, e.g.
    3.8 GB of a 15 GB Qwen2.5-7B in bfloat16). :func:`decode_layout` then passes the result
    through, and every decoder runs its unrolled layer loop on it, in this one layout:
    ``output_major`` (the default; the AR loop's layout, :func:`models.llama.modeling.
    unstack_layers`) or input-major. On an H100 in bfloat16 the AR loop ran 1.39x
    (SmolLM2-135M) and 1.58x (1.7B shapes) faster on output-major than on input-major
    per-layer weights (README "GPU: the layer loop as the model grows").

    On a GPU it always splits. On the CPU it splits only when a per-layer copy would not fit
    the host's RAM (the rule of :func:`resolve_layer_loop`) or when ``force``: otherwise the
    decoders make and cache their own copies per call (:func:`decode_layout`), so the AR loop
    runs output-major and speculative decoders time the verification layout for this CPU.
    With the ``scan`` loop (the TPU default) the stacked tree is what runs, and it is
    returned unchanged.

    Use it where the stacked tree is not needed again, e.g. right after loading
    (``scripts.generate`` does, output-major for AR and for an output-major verification
    layout, stored otherwise): the ``scan`` loop, training and checkpoint conversion need
    stacked weights, and ``tree``'s stacked arrays are deleted (reading them raises JAX's
    "Array has been deleted" error; if the split fails part-way, e.g. out of memory, some of
    them already are). A per-layer copy a decoder already made in this layout is kept instead
    of splitting again. Host (numpy) arrays are split into views, not deleted.

    Returns:
      the tree with per-layer bodies (the same object when nothing was split).

    Raises:
      ValueError: unknown ``layer_loop`` (when ``tree`` has stacked layer weights).
    """
    nbytes = split_bytes(tree)
    if not nbytes or resolve_layer_loop(layer_loop, 0) != "unrolled":
        return tree
    if jax.default_backend() == "cpu" and not force and _copy_fits(nbytes):
        return tree

    def split(layers: dict) -> tuple:
        cached = _cached_split(layers, output_major)  # a decode's copy: keep it, drop the rest
        if cached is not None:
            for w in layers.values():
                if isinstance(w, jax.Array):
                    w.delete()
            return cached
        n = next(iter(layers.values())).shape[0]
        out: list[dict] = [{} for _ in range(n)]
        for name in sorted(layers, key=lambda k: layers[k].nbytes):  # smallest first
            w = layers[name]
            parts = [layer_entry(name, w, i, output_major) for i in range(n)]
            jax.block_until_ready([part for _, part in parts])
            for per_layer, (key, part) in zip(out, parts):
                per_layer[key] = part
            if isinstance(w, jax.Array):
                w.delete()
        return tuple(_fused_in_place(lp) for lp in out) if output_major else tuple(out)

    return _map_bodies(tree, _stacked(split))
