"""Batching shared by every decoder: prompt checks, bucketed left padding, EOS tests and
the host-side EOS cut.

Layout (all decoders): prompts are left-padded to a bucketed length ``P``; row ``b`` holds
its prompt in slots ``[pad[b], P)`` and generated tokens from slot ``P`` on. Bucketing the
padded length lets one compiled program serve many prompt lengths.
"""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np


class DecodeInputError(ValueError):
    """Bad decoding input: no prompts or an empty prompt, token ids outside the vocabulary,
    a non-positive budget, or prompt + budget longer than the context."""


def bucket_length(n: int, bucket: int) -> int:
    """Round ``n`` up to a multiple of ``bucket`` (at least ``bucket``), so one compile serves
    many prompt lengths."""
    return max(bucket, -(-n // bucket) * bucket)


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[int]:
    """Validate a batch of prompts; returns their lengths.

    Raises:
      DecodeInputError: no prompts, an empty prompt, or an id outside ``[0, vocab_size)``.
    """
    if not prompts:
        raise DecodeInputError("no prompts given")
    lens = [len(p) for p in prompts]
    if min(lens) == 0:
        raise DecodeInputError("empty prompt: every prompt needs at least one token")
    for p in prompts:
        if min(p) < 0 or max(p) >= vocab_size:
            raise DecodeInputError(f"prompt token ids must lie in [0, {vocab_size})")
    return lens


def left_pad(prompts: Sequence[Sequence[int]], bucket: int, pad_id: int = 0):
    """Left-pad ``B`` prompts to ``P = bucket_length(max length, bucket)``.

    Returns:
      ``(buf int32 (B, P), pad int32 (B,))``: the padded prompts and each row's padding count.
    """
    lens = [len(p) for p in prompts]
    P = bucket_length(max(lens), bucket)
    buf = np.full((len(prompts), P), pad_id, np.int32)
    for i, p in enumerate(prompts):
        buf[i, P - len(p) :] = p
    return buf, np.array([P - n for n in lens], np.int32)


def place_batch(params, *arrays) -> tuple:
    """Host batch arrays (leading axis = batch rows) as JAX arrays placed for ``params``.

    When ``params`` live on a :func:`models.sharding.make_mesh` mesh whose ``"data"`` axis
    has more than one device, every array is split by rows over that axis (data
    parallelism); otherwise it is simply transferred. The decoded tokens do not depend on
    the placement.

    Args:
      params: the model's parameter tree (possibly sharded, :func:`models.sharding.shard_params`).
      arrays: numpy arrays ``(B, ...)``.

    Raises:
      models.sharding.MeshError: the data axis does not divide the batch ``B``.
    """
    from jax.sharding import NamedSharding, PartitionSpec

    from models.sharding import MeshError, mesh_of

    mesh = mesh_of(params)
    d = 1 if mesh is None else mesh.shape.get("data", 1)
    if d == 1:
        return tuple(jnp.asarray(a) for a in arrays)
    out = []
    for a in arrays:
        if a.shape[0] % d:
            raise MeshError(
                f"the mesh's data axis of {d} devices does not divide the batch "
                f"of {a.shape[0]} prompts"
            )
        spec = PartitionSpec("data", *([None] * (a.ndim - 1)))
        out.append(jax.device_put(a, NamedSharding(mesh, spec)))
    return tuple(out)


def is_eos(tokens: jax.Array, eos_ids: Sequence[int]) -> jax.Array:
    """bool, same shape as ``tokens``: True where the token is one of ``eos_ids`` (static)."""
    out = jnp.zeros(tokens.shape, bool)
    for e in eos_ids:
        out = out | (tokens == e)
    return out


def cut_after_eos(
    rows, eos_ids: Sequence[int], budget: Optional[Sequence[int]] = None
) -> list[list[int]]:
    """Rows as lists, each first cut to its ``budget`` (if given) and then after its first
    EOS (kept).

    Args:
      rows: ``(B, G)`` array or ``B`` sequences of token ids.
      eos_ids: ids that end a row.
      budget: optional per-row length limit ``(B,)``.
    """
    eos = {int(e) for e in eos_ids}
    out = []
    for b, row in enumerate(np.asarray(rows).tolist() if isinstance(rows, np.ndarray) else rows):
        row = list(row) if budget is None else list(row)[: int(budget[b])]
        for i, t in enumerate(row):
            if t in eos:
                row = row[: i + 1]
                break
        out.append(row)
    return out
