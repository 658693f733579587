"""Batched candidate-node forwards shared by SSD and Spiffy, and their multi-device layout.

A *node* is a candidate state of the sequence: the current state with some draft tokens
written into the current block (SSD's chain / mix-order tree nodes, Sec. 3.2.3 of the SSD
paper; Spiffy's draft blocks, Sec. 4.1-4.2). Every node is one row of one batched forward,
so a node attends only to itself: the block-diagonal attention of Spiffy's Fig. 2 / SSD's
Eq. 5, with the node's block at the block's own position ids.

* Without a cache every node is a full sequence (the other blocks' hidden states are
  recomputed with the node's block, which is what ``p(. | X'; node)`` means under
  bidirectional attention).
* With the dual cache (Fast-dLLM) every node forwards only its block window against the
  block-start keys/values, tiled per node; the root forward (a block's first iteration) is
  the block's full forward and refills the cache.

**Multi-device verification.** The ``B x M`` node rows of an iteration are one batch, so they
are sharded over a 1-D :class:`jax.sharding.Mesh` with a ``"draft"`` axis (:func:`draft_mesh`);
XLA partitions the forward (GSPMD). :func:`shard_params` additionally splits every weight
matrix over the same devices (last axis). The decoded tokens do not depend on the mesh.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxspec.dllm.blocks import BlockCache, Layout, dream_shift, prepend_prev, window_inputs
from models.diffusion.modeling import DiffusionLM
from models.llama.modeling import KVCache


def draft_mesh(n_devices: Optional[int] = None, devices=None) -> Mesh:
    """A 1-D mesh with axis ``"draft"`` over the first ``n_devices`` devices (default all).

    Raises: ValueError when fewer devices exist than asked for."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices) if n_devices is None else n_devices
    if not 1 <= n <= len(devices):
        raise ValueError(f"asked for {n} devices, {len(devices)} available")
    return Mesh(np.array(devices[:n]), ("draft",))


def shard_params(params, mesh: Mesh):
    """Place ``params`` on ``mesh``: every matrix (ndim >= 2) whose last axis divides by the
    device count is split along it; everything else is replicated. Returns the placed tree."""
    n = mesh.size

    def place(x):
        x = jnp.asarray(x)
        spec = (
            PartitionSpec(*([None] * (x.ndim - 1)), "draft")
            if x.ndim >= 2 and x.shape[-1] % n == 0
            else PartitionSpec()
        )
        return jax.device_put(x, NamedSharding(mesh, spec))

    return jax.tree_util.tree_map(place, params)


def check_mesh(mesh: Optional[Mesh], batch: int, num_nodes: int) -> None:
    """Raises ValueError when ``batch * num_nodes`` verification rows do not divide over the
    mesh's devices."""
    if mesh is not None and (batch * num_nodes) % mesh.size:
        raise ValueError(
            f"the verification batch ({batch} prompts x {num_nodes} "
            f"nodes) does not divide over the mesh's {mesh.size} devices"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class NodeForwards:
    """The two verification forwards of SSD and Spiffy (one batched call each).

    Attributes:
      model, params: the masked-diffusion LM and its parameters.
      pad: int32 ``(B,)`` left padding; layout: :class:`~jaxspec.dllm.blocks.Layout` over
        ``S_ext`` slots (``S = P + G`` valid ones).
      num_nodes: ``M`` nodes per row; block_length: ``L``; window: ``W``, the rows scored
        (``start + [0, W)``; ``W = L`` with the cache).
      cached: the dual cache; mesh: optional draft mesh sharding the ``B * M`` node rows.
    """

    model: DiffusionLM
    params: Any
    pad: jax.Array
    layout: Layout
    num_nodes: int
    block_length: int
    window: int
    cached: bool
    mesh: Optional[Mesh] = None

    def _shard(self, x, axis: int = 0):
        """Split the verification batch (axis ``axis``) over the mesh's draft axis."""
        if self.mesh is None:
            return x
        spec = PartitionSpec(*([None] * axis), "draft")
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def _rep(self, a):
        """``(B, ...) -> (B * M, ...)``: every row once per node."""
        return jnp.repeat(a, self.num_nodes, axis=0)

    def root(self, tokens: jax.Array, cache: BlockCache, start: jax.Array):
        """Forward only the current state ``tokens`` int32 ``(B, S_ext)`` (with the cache: the
        block's full forward, refilling it and Dream's ``prev_logits``).

        Returns: ``(rows float32 (B, M, W, V), cache)``: the (Dream: shifted) logits scoring
        the window, the same for every node."""
        B, M, W, L = tokens.shape[0], self.num_nodes, self.window, self.block_length
        shift = dream_shift(self.model)
        lay = self.layout
        if not self.cached:
            lg, _ = self.model.apply(
                self.params, tokens, lay.positions, lay.attn, shift=False, rows=(start - shift, W)
            )
            return jnp.broadcast_to(lg[:, None], (B, M, W, lg.shape[-1])), cache
        lg, kv = self.model.apply(
            self.params,
            tokens,
            lay.positions,
            lay.attn,
            cache=cache.kv,
            cache_index=jnp.zeros((B,), jnp.int32),
            shift=False,
            rows=(start - shift, L),
        )
        prev = lg[:, 0] if shift else cache.prev_logits
        return jnp.broadcast_to(lg[:, None], (B, M, L, lg.shape[-1])), BlockCache(kv, prev)

    def nodes(self, tokens: jax.Array, cache: BlockCache, start: jax.Array):
        """Forward every node ``tokens`` int32 ``(B, M, S_ext)``; the cache is read, not
        changed.

        Returns: ``(rows float32 (B, M, W, V), cache)`` as :meth:`root`."""
        B, M, S_ext = tokens.shape
        W, L = self.window, self.block_length
        shift = dream_shift(self.model)
        sh, rep, lay = self._shard, self._rep, self.layout
        if not self.cached:
            lg, _ = self.model.apply(
                self.params,
                sh(tokens.reshape(B * M, S_ext)),
                sh(rep(lay.positions)),
                sh(rep(lay.attn)),
                shift=False,
                rows=(sh(rep(start - shift)), W),
            )
            return lg.reshape(B, M, W, -1), cache
        s0 = start[0]
        win, pos, mask = window_inputs(
            tokens.reshape(B * M, S_ext), s0, L, rep(self.pad), rep(lay.valid)
        )
        tiled = KVCache(
            k=sh(jnp.repeat(cache.kv.k, M, axis=1), 1), v=sh(jnp.repeat(cache.kv.v, M, axis=1), 1)
        )
        raw, _ = self.model.apply(
            self.params,
            sh(win),
            sh(pos),
            sh(mask),
            cache=tiled,
            cache_index=jnp.full((B * M,), s0, jnp.int32),
            shift=False,
            rows=(jnp.zeros((B * M,), jnp.int32), L),
        )
        raw = raw.reshape(B, M, L, -1)
        return (prepend_prev(cache.prev_logits, raw) if shift else raw), cache

    def __call__(
        self,
        root_only: jax.Array,
        tokens: jax.Array,
        node_tokens: jax.Array,
        cache: BlockCache,
        start: jax.Array,
    ):
        """:meth:`root` when ``root_only`` (bool ``()``), else :meth:`nodes`.

        Args: tokens int32 ``(B, S_ext)`` the current state; node_tokens int32 ``(B, M,
        S_ext)``; start int32 ``(B,)`` the block's first slot.

        Returns: ``(rows float32 (B, M, W, V), cache)``."""
        return jax.lax.cond(
            root_only,
            lambda: self.root(tokens, cache, start),
            lambda: self.nodes(node_tokens, cache, start),
        )

    def query_tokens(self, root_only: jax.Array, seq_len: int) -> jax.Array:
        """int32 ``()`` query tokens one row pushes through the model this iteration: one
        full sequence (``seq_len = S`` slots) for the root, ``M`` of them (or ``M`` block
        windows of ``L`` with the cache) otherwise."""
        n_nodes = jnp.where(root_only, 1, self.num_nodes)
        width = seq_len if not self.cached else jnp.where(root_only, seq_len, self.block_length)
        return n_nodes * width


__all__ = ["NodeForwards", "draft_mesh", "shard_params", "check_mesh"]
