"""Decode layouts of a Llama / Qwen2 parameter tree, and the :class:`DecodePlan` that picks one.

The model (:class:`models.llama.modeling.CausalLM`) computes the same function in every layout
(up to float32 rounding); only the compiled loop and its speed differ:

* **stacked** weights ``(L, ...)`` run the layers in one ``lax.scan`` (the ``"scan"`` layer
  loop): one compiled layer, no copy of the weights; the TPU's layout and the fallback where a
  per-layer copy does not fit;
* **per-layer** weights (:func:`models.llama.modeling.unstack_layers`) unroll the layers (the
  ``"unrolled"`` loop): inside a scan XLA:CPU and XLA:GPU copy each layer's weight slices out
  of the stacked arrays before the products, so the unrolled loop decodes faster (SmolLM2-135M
  on a 2-core AMD EPYC: 16.3 against 20.2 ms a step; an H100 in bfloat16: 1.41x for
  SmolLM2-135M, 2.64x for 1.7B shapes, 2.55x for Qwen2.5-7B shapes), at a per-layer copy of the
  layer weights (or none, split in place: :func:`decode_layout_in_place`) and longer compiles;
* **stored** (input-major ``(in, out)``) or **output-major** (``(out, in)``, q/k/v fused)
  per-layer matrices: XLA:CPU streams one-token products faster output-major; its few-row
  products (verification passes) are faster in either layout depending on the CPU, so a
  speculative decode times both once (:func:`pass_seconds`). On the CPU, where the panel
  kernel builds (:func:`models.llama.panels.panels_active`), the stored layout's per-layer
  matrices are packed in 16-column **panels** (q/k/v fused) and multiplied by that kernel,
  whose few-row products cost about a one-row product; reports name that layout ``panels``
  (:func:`layout_name`).

A :class:`DecodePlan` holds those choices as static knobs (frozen, hashable), computed once by
:func:`plan` (timed on this machine where a choice is ``"auto"``) or written down explicitly,
and handed to the decoders (:func:`jaxspec.causal.decode.generate`'s ``plan``), which lay the
trees out with :func:`plan_trees`. Nothing here reads environment variables on the decode path;
the command-line tools take their defaults from :func:`env_defaults`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import psutil

from models.llama import panels as panel_kernel
from models.llama.modeling import (
    HEAD_PANELS,
    MATRICES,
    _sharded,
    fuse_qkv,
    has_projection,
    init_cache,
    layer_entry,
    param_dtype,
    unstack_layers,
)
from models.llama.panels import is_q4, is_q8, pack_exact, packable, panels_active

LAYER_LOOPS = ("scan", "unrolled")
WEIGHT_LAYOUTS = ("stored", "output-major")
#: environment variables the command-line tools read their defaults from (:func:`env_defaults`)
LAYER_LOOP_ENV = "JAXSPEC_LAYER_LOOP"
VERIFY_LAYOUT_ENV = "JAXSPEC_VERIFY_LAYOUT"

# "auto" unrolls the layer loop when the per-layer copy decode_layout makes is at most this
# size, or when the device's bytes in use plus the copy stay within AUTO_UNROLL_MEMORY_SHARE of
# its memory limit (an accelerator's; the rest is left to KV caches and temporaries) or within
# AUTO_UNROLL_HOST_SHARE of the host's RAM (the CPU); a tree split in place
# (decode_layout_in_place) needs no copy
AUTO_UNROLL_MAX_BYTES = 2 << 30
AUTO_UNROLL_MEMORY_SHARE = 0.5
AUTO_UNROLL_HOST_SHARE = 0.8
#: plan() times the verification layouts only for targets up to this size (each timed layout
#: holds a per-layer copy); larger ones verify on stored weights untimed
AUTO_LAYOUT_MAX_BYTES = 2 << 30


def _check(what: str, name: str, choices: tuple) -> str:
    if name not in choices:
        raise ValueError(f"unknown {what} {name!r}; choose one of {', '.join(choices)}")
    return name


# ----------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """The static layout knobs of a decode (hashable: a static argument of the compiled loop).

    The defaults are the CPU's measured fastest for an autoregressive decode (README
    "Performance notes"): the unrolled layer loop on output-major weights.

    Attributes:
      layer_loop: the target's layer loop, ``"scan"`` (stacked weights) or ``"unrolled"``
        (per-layer weights). A tree split in place (:func:`decode_layout_in_place`) always runs
        unrolled.
      verify_layout: weight layout of the target's multi-row passes (verification and the
        prompt pass), ``"stored"`` or ``"output-major"``; unrolled loop only.
      step_layout: weight layout of the target's one-token steps (the AR loop, and a
        speculative loop's steps with no draft to verify); unrolled loop only.
      draft_loop: the draft model's layer loop (drafter parameters; ``"scan"`` or
        ``"unrolled"``).
      draft_layout: the draft model's weight layout (output-major for a drafter whose
        forwards are one-token steps, :attr:`jaxspec.core.drafters.Drafter.one_token_steps`).
      verify_cost: the cost gate's price of a verification pass in one-token steps (>= 1;
        :class:`jaxspec.core.drafters.CostGate`), or None for no gate.
      row_blocks: row blocks of the target's one-row output-major products on the CPU
        (:func:`models.llama.modeling.gemv_blocks`; 1 turns the blocking off); None: the
        model's default, :data:`models.llama.modeling.ONE_TASK_BLOCKS` (4, measured faster on
        a 2-core AMD EPYC).
      verify_s: the measured seconds of one verification pass per layout, when :func:`plan`
        timed them (a record for reports; not compared or hashed).

    Raises:
      ValueError: an unknown loop or layout name, ``verify_cost < 1`` or ``row_blocks < 1``.
    """

    layer_loop: str = "unrolled"
    verify_layout: str = "output-major"
    step_layout: str = "output-major"
    draft_loop: str = "unrolled"
    draft_layout: str = "stored"
    verify_cost: Optional[float] = None
    row_blocks: Optional[int] = None
    verify_s: tuple = dataclasses.field(default=(), compare=False)

    def __post_init__(self):
        _check("layer loop", self.layer_loop, LAYER_LOOPS)
        _check("draft layer loop", self.draft_loop, LAYER_LOOPS)
        for what in ("verify_layout", "step_layout", "draft_layout"):
            _check(what.replace("_", " "), getattr(self, what), WEIGHT_LAYOUTS)
        if self.verify_cost is not None and not self.verify_cost >= 1.0:
            raise ValueError(
                f"verify_cost must be >= 1 (one-token steps) or None, got {self.verify_cost}"
            )
        if self.row_blocks is not None and not (
            isinstance(self.row_blocks, int) and self.row_blocks >= 1
        ):
            raise ValueError(f"row_blocks must be an integer >= 1 or None, got {self.row_blocks!r}")

    @property
    def settings(self) -> dict:
        """The plan as a report: ``verify_layout`` and ``step_layout`` (``"stacked"`` under the
        scan loop; ``"panels"`` for stored weights run by the CPU panel kernel), ``verify_s``
        (``{layout: seconds}``) when timed, ``verify_cost`` when gated."""
        stacked = self.layer_loop == "scan"

        def shown(layout: str) -> str:  # "stored" is "panels" where the kernel runs them
            return "stacked" if stacked else layout_name(layout == "output-major")

        out: dict = {
            "verify_layout": shown(self.verify_layout),
            "step_layout": shown(self.step_layout),
        }
        if self.verify_s:
            out["verify_s"] = dict(self.verify_s)
        if self.verify_cost is not None:
            out["verify_cost"] = float(self.verify_cost)
        return out


def env_defaults() -> dict:
    """The command-line tools' defaults for :func:`plan`: ``layer_loop`` from
    ``$JAXSPEC_LAYER_LOOP`` and ``verify_layout`` from ``$JAXSPEC_VERIFY_LAYOUT`` (each
    ``"auto"`` when unset). The one place these variables are read; library calls never do.

    Raises:
      ValueError: a variable holds an unknown name.
    """
    loop = os.environ.get(LAYER_LOOP_ENV) or "auto"
    verify = os.environ.get(VERIFY_LAYOUT_ENV) or "auto"
    _check(f"${LAYER_LOOP_ENV}", loop, ("auto",) + LAYER_LOOPS)
    _check(f"${VERIFY_LAYOUT_ENV}", verify, ("auto",) + WEIGHT_LAYOUTS)
    return {"layer_loop": loop, "verify_layout": verify}


# ----------------------------------------------------------------------------- the layer loop


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
    """Whether a per-layer copy of ``nbytes`` fits the rule of :func:`machine_layer_loop`."""
    if nbytes <= AUTO_UNROLL_MAX_BYTES:
        return True
    mem = device_memory()
    cpu = jax.default_backend() == "cpu"
    share = AUTO_UNROLL_HOST_SHARE if cpu else AUTO_UNROLL_MEMORY_SHARE
    return mem is not None and mem[0] + nbytes <= share * mem[1]


def machine_layer_loop(nbytes: int | None = None) -> str:
    """The layer loop ``"auto"`` stands for on this machine: ``"unrolled"`` on the CPU and a
    GPU when the per-layer copy of ``nbytes`` (bytes, the stacked layer weights
    :func:`split_bytes` counts; 0 for a tree already split) is at most
    :data:`AUTO_UNROLL_MAX_BYTES` or fits the device's free memory (bytes in use + ``nbytes``
    within :data:`AUTO_UNROLL_MEMORY_SHARE` of its limit, :func:`device_memory`; on the CPU
    within :data:`AUTO_UNROLL_HOST_SHARE` of the host's RAM), else ``"scan"``; when ``nbytes``
    is None, ``"unrolled"`` on the CPU and ``"scan"`` on a GPU; and ``"scan"`` on TPU (not
    measured there). On the CPU the scan decoded SmolLM2-1.7B shapes (float32) 3.0x slower
    than the unrolled loop (``results/gpu/layer-loop/cpu-size-sweep.json``): it is the
    fallback that needs no copy, not a fast path."""
    backend = jax.default_backend()
    if backend == "cpu" and nbytes is None:
        return "unrolled"
    fits = nbytes is not None and _copy_fits(nbytes)
    return "unrolled" if backend in ("cpu", "gpu") and fits else "scan"


def resolve_layer_loop(layer_loop: str = "auto", nbytes: int | None = None) -> str:
    """``"scan"`` or ``"unrolled"``: ``layer_loop`` itself, or for ``"auto"``
    :func:`machine_layer_loop` of ``nbytes``.

    Raises:
      ValueError: an unknown name.
    """
    _check("layer loop", layer_loop, ("auto",) + LAYER_LOOPS)
    return machine_layer_loop(nbytes) if layer_loop == "auto" else layer_loop


def tree_nbytes(tree: Any) -> int:
    """Bytes of the arrays in ``tree`` (other leaves count 0)."""
    return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree_util.tree_leaves(tree))


# ----------------------------------------------------------------------------- tree walking


def _is_causal_layers(layers) -> bool:
    """Whether a stacked ``layers`` dict (or one layer's dict) is a Llama/Qwen2 body's: every
    projection matrix is present in one of its layouts
    (:func:`models.llama.modeling.has_projection`)."""
    return isinstance(layers, Mapping) and all(has_projection(layers, m) for m in MATRICES)


def _is_body(layers) -> bool:
    """A Llama/Qwen2 body's ``layers``: a stacked dict, or a split tuple of per-layer dicts."""
    return _is_causal_layers(layers) or (
        isinstance(layers, (tuple, list)) and bool(layers) and all(map(_is_causal_layers, layers))
    )


def _map_bodies(
    tree: Any, fn: Callable[[Any], Any], parent: Optional[Callable[[dict], dict]] = None
) -> Any:
    """``tree`` with ``fn(layers)`` in place of the ``layers`` of every Llama/Qwen2-layout body
    inside it (stacked dict or split tuple; in a params dict, the wrapped
    ``{"params": ...}``, or any nest of dicts / tuples / lists holding them), and the dict
    holding them passed through ``parent`` when given; everything else is shared, not
    copied."""

    def walk(x):
        if isinstance(x, Mapping):
            layers = x.get("layers")
            if _is_body(layers):
                out = {**x, "layers": fn(layers)}
                return parent(out) if parent else out
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


# ----------------------------------------------------------------------------- per-layer copies

_UNSTACKED: list = []  # [(weakrefs of the stacked leaves, layout name, layers tuple)], newest last


def layout_name(output_major: bool) -> str:
    """The per-layer layout :func:`decode_layout` makes for ``output_major`` now:
    ``"output-major"``, ``"panels"`` (stored weights on the CPU with the panel kernel,
    :func:`models.llama.panels.panels_active`) or ``"stored"``."""
    if output_major:
        return "output-major"
    return "panels" if panels_active() else "stored"


_QUANT: list = []  # [(weakref of a body's first projection matrix, whether it packs quantized)]


def quantized_panels(tree: Any) -> bool:
    """Whether the panels of the first Llama/Qwen2 body in ``tree`` are (or, packed, would
    be) quantized panels (:func:`models.llama.panels.pack_exact`: Q4_1 panels of a GGUF Q4_1
    or Q4_K tensor, Q8 panels of a Q8_0, Q5_0, Q4_0 or Q6_K one): its layer 0's first
    projection matrix is exactly such a dequantized tensor (checked once per array). On
    quantized panels a one-row product reads 0.75-1.25 bytes a weight instead of 4, so
    one-token steps run on panels at batch 1 too (:func:`plan`); False off the panel kernel."""
    if not panels_active() or not panel_kernel.Q4:
        return False
    bodies = _bodies(tree)
    if not bodies:
        return False
    body = bodies[0]
    if not isinstance(body, Mapping):  # split: look at what it holds
        return any(k.endswith("_p") and (is_q4(w) or is_q8(w)) for k, w in body[0].items())
    name = next((m for m in MATRICES if m in body), None)
    w = None if name is None else body[name]
    if not isinstance(w, jax.Array) or isinstance(w, jax.core.Tracer) or _sharded(w):
        return False
    for ref, exact in _QUANT:
        if ref() is w:
            return exact
    exact = pack_exact(np.asarray(w[0])).dtype != np.float32  # the packing itself decides
    _QUANT[:] = [e for e in _QUANT if e[0]() is not None][-3:]
    _QUANT.append((weakref.ref(w), exact))
    return exact


def _cached_split(layers: dict, output_major: bool) -> tuple | None:
    """The cached per-layer copy of a stacked ``layers`` dict in that layout, or None."""
    leaves = [layers[k] for k in sorted(layers)]
    name = layout_name(output_major)
    for refs, layout, out in _UNSTACKED:
        if (
            layout == name
            and len(refs) == len(leaves)
            and all(r() is x for r, x in zip(refs, leaves))
        ):
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
    panels = layout_name(output_major) == "panels"
    out = unstack_layers({"layers": layers}, output_major, panels)["layers"]
    try:
        refs = [weakref.ref(layers[k]) for k in sorted(layers)]
    except TypeError:  # numpy arrays and tracers: no caching
        return out
    # copies of stacked trees that are gone (collected, or split in place) are dropped
    _UNSTACKED[:] = [
        e for e in _UNSTACKED if all(r() is not None and not _deleted(r()) for r in e[0])
    ]
    _UNSTACKED.append((refs, layout_name(output_major), out))
    # at most four per-layer copies stay alive: enough for a target in both layouts (AR and
    # speculative loops) plus a draft model, so comparing decoders does not re-split weights
    del _UNSTACKED[:-4]
    return out


def split_bytes(tree: Any, output_major: bool | None = None) -> int:
    """Bytes of the stacked Llama/Qwen2 layer weights in ``tree`` (0 for a tree already split
    in place); with ``output_major`` given, only of those without a cached per-layer copy in
    that layout: what :func:`decode_layout` would add now."""
    return sum(
        tree_nbytes(b)
        for b in _bodies(tree)
        if isinstance(b, Mapping)
        and (output_major is None or _cached_split(dict(b), output_major) is None)
    )


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


def tree_layer_loop(tree: Any, layer_loop: str = "auto", output_major: bool = False) -> str:
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


def decode_layout(tree: Any, layer_loop: str = "auto", output_major: bool = False) -> Any:
    """Put every Llama/Qwen2-layout parameter tree inside ``tree`` (a params dict, the wrapped
    variables ``{"params": ...}``, or any nest of dicts / tuples / lists holding them, e.g. a
    drafter's ``(dllm_params, proxy)``) into the layout of ``layer_loop``
    (:func:`tree_layer_loop`): per-layer weights (:func:`models.llama.modeling.unstack_layers`)
    for ``"unrolled"``, unchanged for ``"scan"`` (``"auto"`` weighs the copy,
    :func:`split_bytes`). XLNet and other trees, and trees already split
    (:func:`decode_layout_in_place`), pass through. ``output_major`` (unrolled only) also
    transposes the projection matrices and fuses q/k/v into one
    (:func:`models.llama.modeling.fuse_qkv`). Int8 weight-only trees
    (:func:`models.quant.quantize_params`) are split the same way (their ``_q`` matrices
    transposed to ``_q_t`` when ``output_major``; scales shared). Per-layer copies are cached
    per stacked tree and layout (at most four alive).

    Raises:
      ValueError: unknown ``layer_loop``.
    """
    if tree_layer_loop(tree, layer_loop, output_major) == "scan":
        return tree
    # the head's panels are a second copy of it: not for trees split in place to save memory
    panels = layout_name(output_major) == "panels" and not is_split(tree)
    heads = _with_head_panels if panels else None
    return _map_bodies(
        tree, _stacked(lambda layers: _unstacked_layers(layers, output_major)), heads
    )


_HEADS: list = []  # [(weakref of the head's source array, its panels)], newest last


def _with_head_panels(body: dict) -> dict:
    """``body`` (a params dict whose layers are in panels) with its LM head packed in panels
    under :data:`models.llama.modeling.HEAD_PANELS` (the tied embedding's transpose or
    ``lm_head``; cached per source array, at most two alive), when it is a float32 matrix on
    one device whose vocabulary is a multiple of 16; else unchanged. The head of a verification
    pass has ``K + 1`` rows too: SmolLM2-135M's 9-row head took 4.5 ms on panels against
    7.0-8.4 ms as XLA's product (2-core AMD EPYC)."""
    layers = body.get("layers")
    if not isinstance(layers, tuple) or not any(k.endswith("_p") for k in layers[0]):
        return body  # the layers are not in panels (e.g. nothing packable)
    packed = None if HEAD_PANELS in body else head_panels(body)
    return body if packed is None else {**body, HEAD_PANELS: packed}


def head_panels(params: Mapping) -> Optional[jax.Array]:
    """The LM head of ``params`` (``lm_head`` ``(D, V)``, or the tied ``embed`` ``(V, D)``
    transposed) packed in panels (:func:`models.llama.panels.pack_exact`: Q8_0 panels for a
    GGUF Q8_0 embedding, e.g. SmolLM2-135M's: 2.1 against 4.0 ms a one-row head on a 2-core
    AMD EPYC; else float32 ones), cached per source array
    (at most two alive); None when it is not a float32 JAX array on one device with a
    multiple of 16 ids."""
    src = params.get("lm_head")
    tied = src is None
    src = params.get("embed") if tied else src
    if not isinstance(src, jax.Array) or _sharded(src) or not packable(src.T if tied else src):
        return None
    for ref, packed in _HEADS:
        if ref() is src:
            return packed
    packed = pack_exact(src.T if tied else src)
    _HEADS[:] = [e for e in _HEADS if e[0]() is not None and not _deleted(e[0]())][-1:]
    _HEADS.append((weakref.ref(src), packed))
    return packed


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


def decode_layout_in_place(
    tree: Any, layer_loop: str = "auto", output_major: bool = True, force: bool = False
) -> Any:
    """The one-copy decode layout: where the layer loop (:func:`resolve_layer_loop`, with no
    copy to pay) is ``"unrolled"``, every stacked Llama/Qwen2 body in ``tree`` is split into
    per-layer arrays, **deleting each stacked array once its slices are made**, so the device
    holds the weights once (plus, while splitting, one stacked array: the largest, e.g.
    3.8 GB of a 15 GB Qwen2.5-7B in bfloat16). :func:`decode_layout` then passes the result
    through, and every decoder runs its unrolled layer loop on it, in this one layout:
    ``output_major`` (the default; the AR loop's layout) or input-major. On an H100 in
    bfloat16 the AR loop ran 1.39x (SmolLM2-135M) and 1.58x (1.7B shapes) faster on
    output-major than on input-major per-layer weights.

    On a GPU it always splits. On the CPU it splits only when a per-layer copy would not fit
    the host's RAM (the rule of :func:`machine_layer_loop`) or when ``force``: otherwise the
    decoders make and cache their own copies per call (:func:`decode_layout`), so the AR loop
    runs output-major and speculative decoders time the verification layout for this CPU.
    With the ``scan`` loop (the TPU default) the stacked tree is what runs, and it is
    returned unchanged.

    Use it where the stacked tree is not needed again, e.g. right after loading: the ``scan``
    loop, training and checkpoint conversion need stacked weights, and ``tree``'s stacked
    arrays are deleted (reading them raises JAX's "Array has been deleted" error; if the split
    fails part-way, e.g. out of memory, some of them already are). A per-layer copy a decoder
    already made in this layout is kept instead of splitting again. Host (numpy) arrays are
    split into views, not deleted.

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
        panels = layout_name(output_major) == "panels"
        for name in sorted(layers, key=lambda k: layers[k].nbytes):  # smallest first
            w = layers[name]
            parts = [layer_entry(name, w, i, output_major, panels) for i in range(n)]
            jax.block_until_ready([part for _, part in parts])
            for per_layer, (key, part) in zip(out, parts):
                per_layer[key] = part
            if isinstance(w, jax.Array):
                w.delete()
        fused = output_major or panels
        return tuple(_fused_in_place(lp) for lp in out) if fused else tuple(out)

    return _map_bodies(tree, _stacked(split))


# ----------------------------------------------------------------------------- timing and planning


def _lone_pass(params, tokens, cache, *, model):
    """One KV-cached pass of ``tokens (B, T)`` written at the end of the cache (causal mask)."""
    B, T = tokens.shape
    S = cache.size
    slots = jnp.arange(S - T, S, dtype=jnp.int32)
    mask = jnp.arange(S)[None, None, :] <= slots[None, :, None]
    return model.apply(
        {"params": params},
        tokens,
        jnp.broadcast_to(slots, (B, T)),
        jnp.broadcast_to(mask, (B, T, S)),
        cache=cache,
        cache_index=jnp.full((B,), S - T, jnp.int32),
    )[0]


_pass_jit = jax.jit(_lone_pass, static_argnames=("model",))
_PASS_SECONDS: dict = {}


def passes_timed() -> int:
    """How many distinct passes :func:`pass_seconds` has timed in this process."""
    return len(_PASS_SECONDS)


def machine_id() -> str:
    """What a timing is valid for: the CPU model, the JAX version and the default backend
    (``"AMD EPYC ...|0.10.2|cpu"``). A timing store keyed by it is reused on the same kind of
    machine only."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return f"{cpu or os.uname().machine}|{jax.__version__}|{jax.default_backend()}"


def _store_key(model, params, batch: int, rows: int, output_major: bool) -> str:
    """A process-independent text key of one timed pass: the machine, the model's config,
    the parameter dtype and shapes, batch, rows and layout."""
    shapes = sorted(
        (jax.tree_util.keystr(k), tuple(v.shape))
        for k, v in jax.tree_util.tree_leaves_with_path(params)
    )
    digest = hashlib.sha256(repr((repr(model), shapes)).encode()).hexdigest()[:16]
    name = layout_name(output_major)
    if name == "panels" and quantized_panels(params):
        name = "panels-quant"
    return f"{machine_id()}|{digest}|{param_dtype(params)}|b{int(batch)}|r{int(rows)}|{name}"


def _read_store(store) -> dict:
    try:
        table = json.loads(Path(store).read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def _write_store(store, key: str, seconds: float) -> None:
    """Add one timing to the JSON store, atomically (a temporary file, then a rename); a store
    that cannot be written is skipped (the timing stays in this process)."""
    path = Path(store)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = _read_store(path)
        table[key] = seconds
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(table, f, indent=0, sort_keys=True)
        os.replace(f.name, path)
    except OSError:
        pass


def pass_seconds(
    model,
    params,
    batch: int,
    cache_slots: int,
    rows: int,
    output_major: bool,
    reps: int = 5,
    store: "str | os.PathLike | None" = None,
) -> float:
    """Seconds of one KV-cached pass of ``rows`` query rows (batch ``batch``, ``cache_slots``
    cache slots, unrolled per-layer weights in the ``output_major`` or stored layout:
    :func:`decode_layout`), the fastest of ``reps`` timed calls after one warm-up. Cached per
    process by model, dtype, parameter tree structure, ``batch``, ``rows`` and layout
    (``cache_slots`` is the first caller's: the layouts differ in their weight products, not in
    attention), so a benchmark or a long session measures once. Compiling the pass costs
    seconds (about 3-6 s for SmolLM2-135M).

    ``store``: a JSON file that keeps the timings across processes, keyed by
    :func:`machine_id` and the model's shapes; a timing found there is reused, so every later
    process on the same kind of machine makes the same layout choice, compiles the same
    programs (found in the persistent compile cache) and times nothing."""
    key = (
        model,
        str(param_dtype(params)),
        jax.tree_util.tree_structure(params),
        int(batch),
        int(rows),
        layout_name(output_major),
        not output_major and quantized_panels(params),
    )
    if key not in _PASS_SECONDS:
        skey = None if store is None else _store_key(model, params, batch, rows, output_major)
        stored = None if store is None else _read_store(store).get(skey)
        if isinstance(stored, (int, float)) and stored > 0:
            _PASS_SECONDS[key] = float(stored)
            return _PASS_SECONDS[key]
        tree = decode_layout(params, "unrolled", output_major)
        tokens = jnp.zeros((batch, rows), jnp.int32)
        cache = init_cache(model.config, batch, int(cache_slots), param_dtype(params))
        exe = _pass_jit.lower(tree, tokens, cache, model=model).compile()
        best = float("inf")
        for _ in range(reps + 1):  # the first call warms up
            t0 = time.perf_counter()
            jax.block_until_ready(exe(tree, tokens, cache))
            best = min(best, time.perf_counter() - t0)
        _PASS_SECONDS[key] = best
        if store is not None:
            _write_store(store, skey, best)
    return _PASS_SECONDS[key]


def plan(
    model,
    params,
    *,
    batch: int = 1,
    cache_slots: int = 256,
    verify_rows: int = 1,
    multi_row_steps: bool = False,
    draft_params: Any = (),
    draft_output_major: bool = False,
    gate: "str | float" = "off",
    layer_loop: str = "auto",
    verify_layout: str = "auto",
    store: "str | os.PathLike | None" = None,
) -> DecodePlan:
    """The :class:`DecodePlan` of a decode on this machine (README "Verification passes on the
    CPU"). Once per model and batch shape: the timings are cached per process.

    * ``layer_loop``: ``"auto"`` is :func:`tree_layer_loop` (unrolled on the CPU; on a GPU when
      the per-layer copy fits; a tree split in place runs unrolled).
    * Autoregressive decoding (``verify_rows == 1``): every pass on output-major weights;
      at ``batch >= 2`` on the CPU panel kernel (:func:`layout_name`), on panels, whose
      few-row products are faster (a 2-row step 27.0 against 58.0 ms for SmolLM2-135M on a
      2-core AMD EPYC), and at batch 1 too where the panels are quantized
      (:func:`quantized_panels`); a tree split in place keeps its layout.
    * Speculative decoding (``verify_rows = k + 1``): ``verify_layout`` ``"auto"`` times one
      ``verify_rows``-row pass in both layouts (:func:`pass_seconds`) and keeps the faster;
      weights over :data:`AUTO_LAYOUT_MAX_BYTES` verify on ``"stored"`` untimed; a tree split
      in place verifies on its own layout. One-token steps run output-major (the AR loop's
      layout) unless the tree is split in place, its weights exceed
      :data:`AUTO_LAYOUT_MAX_BYTES`, every pass has several rows (``multi_row_steps``: a
      drafter with draft queries), or the batch has 2+ rows on the panel kernel (or 1 row on
      quantized panels), in which case they share the verification layout.
    * ``gate``: ``"off"``; a float, the price of a verification pass in one-token steps
      (>= 1); or ``"auto"``: the ratio of the two passes' :func:`pass_seconds` on the CPU's
      unrolled loop (rounded to 0.01, at least 1), off elsewhere (on GPU/TPU a
      ``k + 1``-row pass costs about one step).
    * The draft model (``draft_params``): ``"auto"`` layer loop by its own size, output-major
      when ``draft_output_major``, unless its weights pack in quantized panels
      (:func:`quantized_panels`): then on panels, whose one-row products read the GGUF codes.
    * ``store``: a JSON file of timings kept across processes (:func:`pass_seconds`), so the
      plan, and with it the compiled programs, stay the same on this machine from run to run.

    Raises:
      ValueError: an unknown loop, layout or gate, a gate below 1, or a ``verify_layout``
        other than the one the target's weights were split in place in.
    """
    if not isinstance(gate, (int, float)) and gate not in ("auto", "off"):
        raise ValueError(
            f"unknown gate {gate!r}; choose auto, off or a pass cost >= 1 (one-token steps)"
        )
    _check("verify layout", verify_layout, ("auto",) + WEIGHT_LAYOUTS)
    # with the panel kernel a step of batch >= 2 rows is a few-row product: panels; on Q4_1
    # panels a one-row product is faster too (a step's layer products of SmolLM2-135M 5.2
    # against 16.2 ms output-major, 2-core AMD EPYC); so is a draft model's one-token step
    # on quantized panels (Qwen2.5-Coder-0.5B: 32.5 ms a pass against about 60 output-major)
    panels_here = layout_name(False) == "panels"
    panel_steps = panels_here and (batch >= 2 or quantized_panels(params))
    draft_om = draft_output_major and not (panels_here and quantized_panels(draft_params))
    draft = dict(
        draft_loop=tree_layer_loop(draft_params, "auto", draft_om),
        draft_layout="output-major" if draft_om else "stored",
    )
    if verify_rows <= 1:
        split = split_layout(params)
        name = split or ("stored" if panel_steps else "output-major")
        loop = tree_layer_loop(params, layer_loop, output_major=name == "output-major")
        return DecodePlan(layer_loop=loop, verify_layout=name, step_layout=name, **draft)
    loop = tree_layer_loop(params, layer_loop)
    unrolled = loop == "unrolled"
    large = split_bytes(params) > AUTO_LAYOUT_MAX_BYTES
    if unrolled and verify_layout == "auto" and large:
        verify_layout = "stored"  # timing both would hold two more per-layer copies
    split = split_layout(params)  # split in place: the one layout there is
    if split and verify_layout not in ("auto", split):
        raise ValueError(
            f"verify layout {verify_layout!r} asked for, but the target's weights "
            f"were split in place as {split!r} (decode_layout_in_place): split "
            f"them with output_major={verify_layout == 'output-major'} or leave "
            f"the layout auto"
        )
    verify_layout = split or verify_layout
    timed: tuple = ()
    if unrolled and verify_layout == "auto":
        costs = {
            name: pass_seconds(
                model, params, batch, cache_slots, verify_rows, name == "output-major", store=store
            )
            for name in WEIGHT_LAYOUTS
        }
        verify_layout = min(costs, key=costs.get)
        timed = tuple((layout_name(n == "output-major"), c) for n, c in costs.items())
    verify_layout = "stored" if verify_layout == "auto" else verify_layout
    step_om = verify_layout == "output-major" or (
        unrolled and not split and not multi_row_steps and not large and not panel_steps
    )
    if gate == "auto":
        gate = "off"
        if unrolled and jax.default_backend() == "cpu":
            om = verify_layout == "output-major"
            cost = pass_seconds(
                model, params, batch, cache_slots, verify_rows, om, store=store
            ) / pass_seconds(model, params, batch, cache_slots, 1, step_om, store=store)
            gate = round(max(cost, 1.0), 2)  # the loop compiles once per value
    return DecodePlan(
        layer_loop=loop,
        verify_layout=verify_layout,
        step_layout="output-major" if step_om else "stored",
        verify_cost=None if gate == "off" else float(gate),
        verify_s=timed,
        **draft,
    )


def plan_model(model, plan: DecodePlan):
    """``model`` (a :class:`models.llama.modeling.CausalLM`) with the plan's ``row_blocks``
    (the same module when the plan leaves them to the model)."""
    return model if plan.row_blocks is None else model.replace(row_blocks=plan.row_blocks)


def plan_trees(params, plan: DecodePlan) -> tuple[Any, Any]:
    """``(verify, step)``: the target's parameter tree in the plan's verification layout and
    in its one-token-step layout (the same object when they agree, or under the scan loop).

    Raises:
      ValueError: ``params`` was split in place (:func:`decode_layout_in_place`) in another
        layout than the plan's unrolled layouts.
    """
    split = split_layout(params)
    unrolled = plan.layer_loop == "unrolled"
    if split and unrolled and {plan.verify_layout, plan.step_layout} != {split}:
        raise ValueError(
            f"the plan verifies on {plan.verify_layout!r} and steps on "
            f"{plan.step_layout!r} weights, but the target's weights were split in "
            f"place as {split!r} (decode_layout_in_place)"
        )
    verify = decode_layout(params, plan.layer_loop, plan.verify_layout == "output-major")
    if plan.step_layout == plan.verify_layout or plan.layer_loop == "scan":
        return verify, verify
    return verify, decode_layout(params, plan.layer_loop, plan.step_layout == "output-major")


def plan_draft_tree(draft_params, plan: DecodePlan) -> Any:
    """The draft model's parameters in the plan's draft layout."""
    return decode_layout(draft_params, plan.draft_loop, plan.draft_layout == "output-major")


__all__ = [
    "AUTO_LAYOUT_MAX_BYTES",
    "DecodePlan",
    "LAYER_LOOPS",
    "WEIGHT_LAYOUTS",
    "decode_layout",
    "decode_layout_in_place",
    "device_memory",
    "env_defaults",
    "head_panels",
    "is_split",
    "layout_name",
    "machine_id",
    "machine_layer_loop",
    "pass_seconds",
    "plan",
    "plan_draft_tree",
    "plan_model",
    "plan_trees",
    "quantized_panels",
    "resolve_layer_loop",
    "split_bytes",
    "split_layout",
    "tree_layer_loop",
    "tree_nbytes",
]
