"""Model sharding: a ``("data", "model")`` device mesh and per-family sharding rules as data.

A model too big for one device (LLaDA-8B in bfloat16 is 16 GB; a TPU v5e chip has 16 GB)
is split Megatron-style over the mesh's ``"model"`` axis: the q / k / v projections and the
MLP's gate / up matrices by output column, ``wo`` and ``w_down`` by input row, the
embedding and LM head by vocabulary row. The ``"data"`` axis splits the batch of prompts
(:func:`jaxspec.core.batching.place_batch`). Every decoder runs unchanged: its jitted loop
receives sharded parameters and XLA's SPMD partitioner inserts the collectives, so the
tokens and NFE equal the one-device run (``tests/models/test_sharding.py`` checks every
method on 4 and 8 fake CPU devices).

The rules are data, as in MaxText's ``logical_axis_rules`` and jax-llm-examples: each
family's table (:data:`RULES`) names the *logical* axes of every parameter (per layer;
stacked layer weights have an extra leading ``"layers"`` axis), and :data:`AXIS_RULES`
maps logical axes to mesh axes. A logical axis the mesh cannot divide is an error when
splitting it is the point (attention heads, MLP width: :class:`MeshError`), and is
replicated otherwise (grouped-query K/V heads fewer than the model axis, as MaxText does;
a vocabulary that does not divide).

Parameter names with the suffixes the decode layouts add are handled too: ``name + "_t"``
(output-major copy, :func:`models.llama.modeling.unstack_layers`) reverses the axes,
``name + "_q"`` / ``name + "_s"`` (int8 weights and their per-output-channel scales) take
the weight's axes / its output axis.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "model")

# logical axes of each parameter, per layer (see module docstring)
_CAUSAL = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("embed",),
    "layers/attn_norm": ("embed",),
    "layers/mlp_norm": ("embed",),
    "layers/wq": ("embed", "heads"),
    "layers/wk": ("embed", "kv_heads"),
    "layers/wv": ("embed", "kv_heads"),
    "layers/bq": ("heads",),
    "layers/bk": ("kv_heads",),
    "layers/bv": ("kv_heads",),
    "layers/wo": ("heads", "embed"),
    # q/k/v fused in the output-major decode layout (modeling.fuse_qkv): never split (trees
    # laid out over several devices are not fused)
    "layers/wqkv": ("embed", "qkv"),
    "layers/w_gate": ("embed", "mlp"),
    "layers/w_up": ("embed", "mlp"),
    "layers/w_down": ("mlp", "embed"),
}
_XLNET = {
    "word_embedding": ("vocab", "embed"),
    "mask_emb": ("embed",),
    "lm_bias": ("vocab",),
    **{f"layers/{n}": ("embed", "heads", None) for n in ("q", "k", "v", "o", "r")},
    **{f"layers/{n}": ("heads", None) for n in ("r_w_bias", "r_r_bias", "r_s_bias")},
    "layers/seg_embed": (None, "heads", None),
    "layers/attn_ln_scale": ("embed",),
    "layers/attn_ln_bias": ("embed",),
    "layers/ff_w1": ("embed", "mlp"),
    "layers/ff_b1": ("mlp",),
    "layers/ff_w2": ("mlp", "embed"),
    "layers/ff_b2": ("embed",),
    "layers/ff_ln_scale": ("embed",),
    "layers/ff_ln_bias": ("embed",),
}
#: family -> {parameter path: logical axes of one layer's array}. ``causal`` serves Llama /
#: Qwen2 and the masked-diffusion models on the same body (LLaDA, Dream, SPACE's SAR model).
RULES = {"causal": _CAUSAL, "xlnet": _XLNET}

#: logical axis -> (mesh axis, must divide). ``must divide``: a mesh that does not divide the
#: dimension is a :class:`MeshError`; otherwise the axis is replicated.
AXIS_RULES = {
    "heads": ("model", True),
    "mlp": ("model", True),
    "kv_heads": ("model", False),
    "vocab": ("model", False),
    "embed": (None, False),
    "layers": (None, False),
}


class MeshError(ValueError):
    """A mesh that does not fit the model or the batch: more devices than exist, a model
    axis that does not divide the attention heads or the MLP width, a data axis that does
    not divide the batch. One line naming both numbers."""


def parse_mesh(spec: Union[str, Sequence[int]]) -> tuple[int, int]:
    """``"DATAxMODEL"`` (e.g. ``"2x4"``) or ``(data, model)`` -> ``(data, model)``.

    Raises:
      MeshError: not two positive integers.
    """
    try:
        parts = (
            [int(p) for p in spec.lower().split("x")]
            if isinstance(spec, str)
            else [int(p) for p in spec]
        )
    except (TypeError, ValueError):
        parts = []
    if len(parts) != 2 or min(parts) < 1:
        raise MeshError(f"mesh {spec!r} is not DATAxMODEL with two positive integers (e.g. 1x4)")
    return parts[0], parts[1]


def make_mesh(spec: Union[str, Sequence[int]] = "1x1", devices=None) -> Mesh:
    """A 2-D :class:`jax.sharding.Mesh` with axes ``("data", "model")`` over the first
    ``data * model`` devices (default ``jax.devices()``).

    Raises:
      MeshError: a bad ``spec`` or more devices asked for than exist.
    """
    data, model = parse_mesh(spec)
    devices = list(jax.devices() if devices is None else devices)
    if data * model > len(devices):
        raise MeshError(
            f"mesh {data}x{model} needs {data * model} devices, but only "
            f"{len(devices)} are available ({jax.default_backend()})"
        )
    return Mesh(np.array(devices[: data * model]).reshape(data, model), AXES)


def _family(config) -> str:
    from models.xlnet.modeling import XLNetConfig

    if isinstance(config, str):
        if config not in RULES:
            raise KeyError(f"no sharding rules for family {config!r}; known: {', '.join(RULES)}")
        return config
    return "xlnet" if isinstance(config, XLNetConfig) else "causal"


def _base(config):
    return getattr(config, "base", config)  # DiffusionConfig wraps a ModelConfig


def logical_sizes(config) -> dict:
    """Sizes of the logical axes that can be split: ``heads``, ``kv_heads``, ``mlp``,
    ``vocab`` (a ``ModelConfig``, ``DiffusionConfig`` or ``XLNetConfig``)."""
    if _family(config) == "xlnet":
        return {
            "heads": config.n_head,
            "kv_heads": config.n_head,
            "mlp": config.d_inner,
            "vocab": config.vocab_size,
        }
    c = _base(config)
    return {
        "heads": c.num_heads,
        "kv_heads": c.num_kv_heads,
        "mlp": c.intermediate_size,
        "vocab": c.vocab_size,
    }


def check_mesh(config, mesh: Mesh, batch: Optional[int] = None) -> None:
    """Check that ``mesh`` can hold ``config``'s model (and a batch of ``batch`` rows).

    Raises:
      MeshError: the model axis does not divide the attention heads or the MLP width, or the
        data axis does not divide ``batch``.
    """
    m = mesh.shape.get("model", 1)
    sizes = logical_sizes(config)
    for axis, (mesh_axis, strict) in AXIS_RULES.items():
        if strict and mesh_axis == "model" and sizes[axis] % m:
            what = "attention heads" if axis == "heads" else "MLP width"
            raise MeshError(
                f"the mesh's model axis of {m} devices does not divide the model's "
                f"{sizes[axis]} {what}"
            )
    d = mesh.shape.get("data", 1)
    if batch is not None and batch % d:
        raise MeshError(
            f"the mesh's data axis of {d} devices does not divide the batch of {batch} prompts"
        )


def _rule_key(path: str) -> tuple[str, str]:
    """``(table key, suffix)`` of a parameter path: ``layers/wq_t`` -> ``("layers/wq", "_t")``."""
    if path.endswith("_q_t"):  # int8 weights in the output-major decode layout
        return path[:-4], "_t"
    for suffix in ("_t", "_q", "_s"):
        if path.endswith(suffix):
            return path[: -len(suffix)], suffix
    return path, ""


def partition_spec(config, mesh: Mesh, path: str, shape: Sequence[int]) -> PartitionSpec:
    """The :class:`PartitionSpec` of parameter ``path`` (``"embed"``, ``"layers/wq"``,
    ``"layers/wq_t"`` ...) of shape ``shape`` under the family's rule table.

    Args:
      config: the model config (``ModelConfig`` / ``DiffusionConfig`` / ``XLNetConfig``),
        or a family name of :data:`RULES` when the config is not known yet (while loading):
        then divisibility is judged on the array's own dimension instead of the head count.
      mesh: a :func:`make_mesh` mesh.
      path: the parameter's path; a stacked layer weight has one more dimension than its
        rule (the leading ``layers`` axis, never split).
      shape: the parameter's shape.

    Raises:
      KeyError: ``path`` is not in the family's table (a parameter the rules do not cover).
    """
    family = _family(config)
    table = RULES[family]
    key, suffix = _rule_key(path)
    if key not in table and suffix:
        key, suffix = path, ""
    if key not in table:
        raise KeyError(f"no sharding rule for parameter {path!r} ({family} family)")
    logical = table[key]
    if suffix == "_t":
        logical = tuple(reversed(logical))
    elif suffix == "_s":
        logical = logical[-1:]
    logical = ("layers",) * (len(shape) - len(logical)) + tuple(logical)
    sizes = None if isinstance(config, str) else logical_sizes(config)
    spec = []
    for axis, dim in zip(logical, shape):
        mesh_axis, _ = AXIS_RULES.get(axis, (None, False))
        n = mesh.shape.get(mesh_axis, 1) if mesh_axis else 1
        size = dim if sizes is None else sizes.get(axis, dim)
        spec.append(mesh_axis if n > 1 and size % n == 0 and dim % n == 0 else None)
    return PartitionSpec(*spec)


def _paths(tree, prefix=""):
    """``(path, leaf)`` pairs of a parameter dict; per-layer tuples share their layer path."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, f"{prefix}{k}" if not prefix else f"{prefix}/{k}")
    elif isinstance(tree, (tuple, list)):
        for v in tree:
            yield from _paths(v, prefix)
    else:
        yield prefix, tree


def param_shardings(config, params, mesh: Mesh):
    """A tree like ``params`` (arrays or ``jax.ShapeDtypeStruct``) of :class:`NamedSharding`.

    Raises:
      MeshError: as :func:`check_mesh`.
      KeyError: a parameter without a rule.
    """
    check_mesh(config, mesh)

    def spec(path, leaf):
        return NamedSharding(mesh, partition_spec(config, mesh, path, leaf.shape))

    flat = iter([spec(p, leaf) for p, leaf in _paths(params)])
    return _rebuild(params, flat)


def _rebuild(tree, flat):
    if isinstance(tree, dict):
        return {k: _rebuild(v, flat) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_rebuild(v, flat) for v in tree)
    return next(flat)


def shard_params(config, params, mesh: Mesh):
    """``params`` placed on ``mesh`` by the family's rules (:func:`param_shardings`).

    Raises:
      MeshError, KeyError: as :func:`param_shardings`.
    """
    return jax.tree_util.tree_map(jax.device_put, params, param_shardings(config, params, mesh))


def placement(mesh: Mesh, dtype=None, family: str = "causal"):
    """A loader hook for :func:`models.llama.params.place_params`: ``place(path, host_array)``
    casts one loaded parameter to ``dtype`` on the host (None keeps float32) and transfers
    each device only its own slice (:func:`jax.make_array_from_callback`), so the full model
    never exists as one host or one device copy: the host holds one stacked parameter at a
    time. The config is not known while loading, so splits are judged on the arrays' own
    dimensions; call :func:`check_mesh` with the loaded config afterwards (the registry
    does).
    """

    def place(path: str, arr: np.ndarray) -> jax.Array:
        if dtype is not None:
            arr = arr.astype(dtype)
        sharding = NamedSharding(mesh, partition_spec(family, mesh, path, arr.shape))
        return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])

    return place


def mesh_of(params) -> Optional[Mesh]:
    """The mesh a parameter tree lives on (its first leaf's :class:`NamedSharding`), or None."""
    for leaf in jax.tree_util.tree_leaves(params):
        sh = getattr(leaf, "sharding", None)
        if isinstance(sh, NamedSharding) and sh.mesh.size > 1:
            return sh.mesh
        return None
    return None


__all__ = [
    "AXES",
    "RULES",
    "AXIS_RULES",
    "MeshError",
    "parse_mesh",
    "make_mesh",
    "check_mesh",
    "logical_sizes",
    "partition_spec",
    "param_shardings",
    "shard_params",
    "placement",
    "mesh_of",
]
