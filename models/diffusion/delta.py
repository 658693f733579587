"""LoRA deltas for masked-diffusion adaptations: merge into a base tree, save, load.

A *delta* (trained by :mod:`jaxspec.training.loop`, initialised by
:func:`jaxspec.training.objectives.init_delta`) is a nested dict of float32 arrays:

* ``lora``: ``{name: {"a": (L, in, r), "b": (L, r, out)}}`` for targeted stacked matrices of
  ``params["layers"]`` (some of :data:`LORA_TARGETS`); the merged weight is
  ``W + (alpha / r) * a @ b`` per layer (Hu et al. 2021, LoRA);
* ``mask_embed (D,)``: the embedding row of the mask token;
* ``norms``: ``attn_norm (L, D)``, ``mlp_norm (L, D)``, ``final_norm (D,)`` (replace the base's).

It is stored as safetensors (keys ``lora.wq.a``, ``mask_embed``, ``norms.final_norm``, ...)
with JSON-encoded string metadata (``rank``, ``alpha``, ``mask_token_id``, ``head``,
``base_preset``, ...). This module lives in :mod:`models` so that model presets
(:mod:`models.registry`, format ``delta``) can merge a delta without importing :mod:`jaxspec`;
:mod:`jaxspec.training.train` re-exports these names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from models.llama.params import WeightFileError

LORA_TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
NORM_NAMES = ("attn_norm", "mlp_norm", "final_norm")


def merge_delta(base, delta, *, alpha: float, rank: int, mask_token_id: int):
    """Full params tree ``base + delta`` for training or inference (differentiable in
    ``delta``). Each LoRA target becomes ``W + (alpha / rank) * a @ b``; the mask-token
    embedding row and the norms are replaced by the delta's. ``base`` is not modified."""
    scale = alpha / rank
    layers = dict(base["layers"])
    for name, ab in delta.get("lora", {}).items():
        w = layers[name]
        layers[name] = w + (scale * jnp.einsum("lir,lro->lio", ab["a"], ab["b"])).astype(w.dtype)
    out = dict(base)
    norms = delta.get("norms", {})
    for name in ("attn_norm", "mlp_norm"):
        if name in norms:
            layers[name] = norms[name].astype(layers[name].dtype)
    if "final_norm" in norms:
        out["final_norm"] = norms["final_norm"].astype(base["final_norm"].dtype)
    if "mask_embed" in delta:
        out["embed"] = (
            base["embed"].at[mask_token_id].set(delta["mask_embed"].astype(base["embed"].dtype))
        )
    out["layers"] = layers
    return out


def _flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = np.asarray(v)
    return out


def save_delta(path, delta, meta: dict) -> int:
    """Write ``delta`` as safetensors (keys like ``lora.wq.a``, ``mask_embed``,
    ``norms.final_norm``; float32) with string ``meta`` (rank, alpha, mask id, base preset).
    Returns the file size in bytes."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(
        {k: np.ascontiguousarray(v, np.float32) for k, v in _flatten(delta).items()},
        str(tmp),
        metadata={k: json.dumps(v) for k, v in meta.items()},
    )
    tmp.replace(path)
    os.chmod(path, 0o644)
    return path.stat().st_size


def load_delta(path):
    """Inverse of :func:`save_delta`: ``(delta tree of jnp arrays, meta dict)``.

    Raises:
      models.llama.params.WeightFileError: the file is missing, not safetensors, truncated, or its
        metadata is not JSON (one line naming the file).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise WeightFileError(f"{path}: delta file does not exist")
    tree: dict = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = {k: json.loads(v) for k, v in (f.metadata() or {}).items()}
            for k in f.keys():
                node = tree
                *parents, leaf = k.split(".")
                for p in parents:
                    node = node.setdefault(p, {})
                node[leaf] = jnp.asarray(f.get_tensor(k))
    except WeightFileError:
        raise
    except Exception as e:  # safetensors raises its own error types (and OSError, ValueError)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WeightFileError(f"{path}: not a readable safetensors delta ({msg})") from None
    return tree, meta


def check_delta(delta, base) -> None:
    """Check that ``delta`` fits ``base`` (a ``CausalLM`` params tree).

    Raises:
      models.llama.params.WeightFileError: an unknown key, a LoRA target the base lacks, or a shape
        that disagrees with the base.
    """
    unknown = set(delta) - {"lora", "mask_embed", "norms"}
    if unknown:
        raise WeightFileError(f"delta has unknown entries {sorted(unknown)}")
    layers = base["layers"]
    for name, ab in delta.get("lora", {}).items():
        if name not in LORA_TARGETS or name not in layers or set(ab) != {"a", "b"}:
            raise WeightFileError(f"delta has an unknown LoRA target {name!r}")
        L, din, dout = layers[name].shape
        a, b = ab["a"], ab["b"]
        if (
            a.ndim != 3
            or b.ndim != 3
            or a.shape[:2] != (L, din)
            or b.shape[0] != L
            or b.shape[2] != dout
            or a.shape[2] != b.shape[1]
        ):
            raise WeightFileError(
                f"delta LoRA {name}: shapes {a.shape} @ {b.shape} do not fit "
                f"the base's {layers[name].shape}"
            )
    want = {
        "attn_norm": layers["attn_norm"].shape,
        "mlp_norm": layers["mlp_norm"].shape,
        "final_norm": base["final_norm"].shape,
    }
    for name, x in delta.get("norms", {}).items():
        if name not in want or tuple(x.shape) != tuple(want[name]):
            raise WeightFileError(
                f"delta norm {name!r} has shape {tuple(x.shape)}; expected {want.get(name)}"
            )
    if "mask_embed" in delta and tuple(delta["mask_embed"].shape) != (base["embed"].shape[1],):
        raise WeightFileError(
            f"delta mask_embed has shape {tuple(delta['mask_embed'].shape)}; "
            f"expected {(base['embed'].shape[1],)}"
        )


__all__ = ["LORA_TARGETS", "NORM_NAMES", "merge_delta", "save_delta", "load_delta", "check_delta"]
