"""Blocks, windows and caches: the bookkeeping every masked-diffusion decode loop shares
(the reference of :mod:`jaxspec.dllm.decode`, SSD and Spiffy).

* :class:`Layout`: the padded sequence (left-padded prompt of ``P`` slots, then ``G``
  generation slots, then optional never-attended extension slots up to ``S_ext``).
* :class:`Canvas`: the sequence being decoded: tokens, which generation positions are
  still masked, and the step that transferred each one.
* :func:`block_window` / :func:`put_window`: per-row windows of ``L`` (or ``W``) slots.
* :class:`BlockCursor` and :func:`advance_blocks`: the current block of every row and the
  semi-autoregressive advance; with a KV cache the rows move through the blocks in lockstep
  (Fast-dLLM's batched loop): a row whose block is full waits until every row's is.
* :class:`BlockCache`, :func:`prefix_widths`, :func:`window_inputs`, :func:`prepend_prev`:
  Fast-dLLM's prefix / dual caches (Wu et al. 2025, Sec. 3.2): the keys/values of a block's
  first (full) forward, the window forwards against them, and Dream's shifted head, whose
  first block row is the raw logits of slot ``block_start - 1`` kept from the full forward.
* :class:`Counters`: the per-row figures of the stats record (steps, NFE, accepted-tokens
  histogram, drafts proposed, query tokens).
"""

from __future__ import annotations

from typing import Optional

import flax
import jax
import jax.numpy as jnp

from jaxspec.dllm.config import DiffusionDecodeConfig
from models.diffusion.modeling import DiffusionLM, bidirectional_mask
from models.llama.modeling import KVCache, init_cache, param_dtype

MAX_PREFIX_WIDTHS = 8  # distinct window widths compiled for cache="prefix"


def dream_shift(model: DiffusionLM) -> int:
    """1 for Dream's head (position ``s`` is scored by the raw logits of ``s - 1``), else 0."""
    return 1 if model.config.head == "dream" else 0


def prefix_widths(prompt_len: int, cfg: DiffusionDecodeConfig) -> tuple[tuple[int, ...], int]:
    """Window widths of ``cache="prefix"`` and the cache size they need.

    The exact window of block ``b`` is ``G - b * L`` tokens; it is rounded up to a multiple of
    ``chunk = L * ceil(num_blocks / 8)`` so that at most :data:`MAX_PREFIX_WIDTHS` distinct
    widths are compiled (the extra slots past the sequence are hidden from attention).

    Returns: ``(width per block, cache size S_c)`` with ``S_c >= prompt_len + G``.
    """
    G, L, nb = cfg.gen_length, cfg.block_length, cfg.num_blocks
    chunk = L * -(-nb // MAX_PREFIX_WIDTHS)
    widths = tuple(-(-(G - b * L) // chunk) * chunk for b in range(nb))
    return widths, max(prompt_len + b * L + w for b, w in enumerate(widths))


# ----------------------------------------------------------------------------- layout


@flax.struct.dataclass
class Layout:
    """The padded sequence of a batch: slots ``[pad[b], P)`` hold row ``b``'s prompt, slots
    ``[P, S)`` the generation, slots ``[S, S_ext)`` are never attended.

    Attributes:
      valid: bool ``(B, S_ext)`` the slot holds a real token (prompt or generation).
      positions: int32 ``(B, S_ext)`` RoPE positions ``slot - pad`` (0 on the padding).
      attn: bool ``(B, S_ext, S_ext)`` full bidirectional attention among valid slots
        (:func:`models.diffusion.modeling.bidirectional_mask`).
    """

    valid: jax.Array
    positions: jax.Array
    attn: jax.Array

    @classmethod
    def of(cls, pad: jax.Array, S: int, S_ext: Optional[int] = None) -> "Layout":
        """The layout of ``pad`` int32 ``(B,)`` over ``S_ext`` (default ``S``) slots."""
        slots = jnp.arange(S if S_ext is None else S_ext, dtype=jnp.int32)[None]
        valid = (slots >= pad[:, None]) & (slots < S)
        return cls(
            valid=valid,
            positions=jnp.maximum(slots - pad[:, None], 0),
            attn=bidirectional_mask(valid),
        )


def block_window(a: jax.Array, off: jax.Array, width: int, axis: int = 0) -> jax.Array:
    """Per-row window ``a[b, off[b] : off[b] + width]`` of ``a`` ``(B, N, ...)`` -> ``(B, width,
    ...)`` (``axis``: the window's axis within a row, default its first)."""
    return jax.vmap(lambda r, o: jax.lax.dynamic_slice_in_dim(r, o, width, axis))(a, off)


def put_window(a: jax.Array, v: jax.Array, off: jax.Array) -> jax.Array:
    """``a`` ``(B, N, ...)`` with row ``b``'s window at ``off[b]`` replaced by ``v[b]``."""
    return jax.vmap(lambda r, x, o: jax.lax.dynamic_update_slice_in_dim(r, x, o, 0))(a, v, off)


@flax.struct.dataclass
class Canvas:
    """The sequence being decoded.

    Attributes:
      tokens: int32 ``(B, S_ext)`` the prompt, then the generation slots (mask token until
        transferred), then the extension slots (never attended).
      masked: bool ``(B, G_ext)`` the generation position is still masked (extension slots
        never are).
      transfer_step: int32 ``(B, G)`` the row's step that transferred the position (-1: not
        yet).
    """

    tokens: jax.Array
    masked: jax.Array
    transfer_step: jax.Array

    @classmethod
    def start(cls, prompt: jax.Array, gen_length: int, mask_id: int, extension: int = 0):
        """All ``G`` generation slots (and ``extension`` more) masked after ``prompt`` int32
        ``(B, P)``."""
        B = prompt.shape[0]
        G, X = gen_length, extension
        tokens = jnp.concatenate([prompt, jnp.full((B, G + X), mask_id, jnp.int32)], axis=1)
        masked = jnp.ones((B, G), bool)
        if X:
            masked = jnp.concatenate([masked, jnp.zeros((B, X), bool)], axis=1)
        return cls(tokens=tokens, masked=masked, transfer_step=jnp.full((B, G), -1, jnp.int32))

    def block(self, start: jax.Array, prompt_len: int, width: int):
        """Row windows ``(tokens (B, width), masked (B, width), transfer_step (B, width))`` of
        the block at slot ``start`` int32 ``(B,)``."""
        off = start - prompt_len
        return (
            block_window(self.tokens, start, width),
            block_window(self.masked, off, width),
            block_window(self.transfer_step, off, width),
        )

    def put_block(
        self,
        start: jax.Array,
        prompt_len: int,
        tokens: jax.Array,
        masked: jax.Array,
        transfer_step: jax.Array,
    ) -> "Canvas":
        """The canvas with the block windows at ``start`` replaced (shapes as :meth:`block`)."""
        off = start - prompt_len
        return Canvas(
            tokens=put_window(self.tokens, tokens, start),
            masked=put_window(self.masked, masked, off),
            transfer_step=put_window(self.transfer_step, transfer_step, off),
        )


# ----------------------------------------------------------------------------- block advance


@flax.struct.dataclass
class BlockCursor:
    """Where every row stands in the semi-autoregressive block sequence.

    Attributes:
      block: int32 ``(B,)`` the current block (``num_blocks`` = done).
      step_in_block: int32 ``(B,)`` reference steps taken in the current block.
      wait: bool ``(B,)`` lockstep (cached) decoding: the row's block is full, another's not.
      fresh: bool ``()`` lockstep decoding: the current block has not had its full forward.
    """

    block: jax.Array
    step_in_block: jax.Array
    wait: jax.Array
    fresh: jax.Array

    @classmethod
    def start(cls, batch: int) -> "BlockCursor":
        zeros = jnp.zeros((batch,), jnp.int32)
        return cls(
            block=zeros, step_in_block=zeros, wait=jnp.zeros((batch,), bool), fresh=jnp.bool_(True)
        )

    def active(self, num_blocks: int) -> jax.Array:
        """bool ``(B,)``: the row takes a step now (blocks left, not waiting)."""
        return (self.block < num_blocks) & ~self.wait

    def start_slot(self, prompt_len: int, block_length: int, num_blocks: int) -> jax.Array:
        """int32 ``(B,)`` the first slot of the current block (the last block once done)."""
        return prompt_len + jnp.minimum(self.block, num_blocks - 1) * block_length


def advance_blocks(
    cur: BlockCursor,
    active: jax.Array,
    block_done: jax.Array,
    steps_taken: jax.Array,
    num_blocks: int,
    lockstep: bool,
) -> BlockCursor:
    """Move rows whose block is complete to the next block.

    Args:
      cur: the cursor before the iteration; active: bool ``(B,)`` the rows that stepped;
      block_done: bool ``(B,)`` the row's block is complete after the iteration;
      steps_taken: int32 ``(B,)`` reference steps the row took (0 where not active);
      num_blocks: the number of blocks; lockstep: cached decoding (every row advances once
        all rows' blocks are complete; ``fresh`` marks the advance).

    Returns: the cursor after the iteration.
    """
    if lockstep:
        done = cur.wait | (active & block_done) | (cur.block >= num_blocks)
        adv = jnp.all(done)
        return BlockCursor(
            block=jnp.where(adv, cur.block + 1, cur.block),
            step_in_block=jnp.where(adv, 0, cur.step_in_block + steps_taken),
            wait=done & ~adv,
            fresh=adv,
        )
    move = active & block_done
    return BlockCursor(
        block=jnp.where(move, cur.block + 1, cur.block),
        step_in_block=jnp.where(move, 0, cur.step_in_block + steps_taken),
        wait=cur.wait,
        fresh=cur.fresh,
    )


# ----------------------------------------------------------------------------- caches


@flax.struct.dataclass
class BlockCache:
    """Fast-dLLM's block cache.

    Attributes:
      kv: the keys/values of the block's first (full) forward over ``S_c`` slots (``None``
        without a cache).
      prev_logits: float32 ``(B, V)`` Dream with a cache: the raw logits of slot
        ``block_start - 1`` from that forward (scores the block's first position); ``None``
        otherwise.
    """

    kv: Optional[KVCache]
    prev_logits: Optional[jax.Array]

    @classmethod
    def start(
        cls, model: DiffusionLM, rows: int, slots: int, batch: int, cached: bool, params=None
    ) -> "BlockCache":
        """An empty cache of ``rows`` sequences x ``slots`` slots (``None`` fields when not
        ``cached``); the keys/values take the dtype of ``params`` (float32 without them,
        bfloat16 for bf16 parameters: :func:`models.llama.modeling.param_dtype`)."""
        if not cached:
            return cls(kv=None, prev_logits=None)
        dtype = jnp.float32 if params is None else param_dtype(params)
        return cls(
            kv=init_cache(model.config.base, rows, slots, dtype),
            prev_logits=(
                jnp.zeros((batch, model.config.vocab_size), jnp.float32)
                if dream_shift(model)
                else None
            ),
        )


def window_inputs(
    tokens: jax.Array, s0: jax.Array, width: int, pad: jax.Array, key_valid: jax.Array
):
    """Inputs of a lockstep window forward against a cache: the ``width`` slots from ``s0``
    (the same for every row).

    Args:
      tokens: int32 ``(R, S_c)``; s0: int32 ``()`` first slot; pad: int32 ``(R,)``;
      key_valid: bool ``(R, S_c)`` the cache slots a query may attend to.

    Returns: ``(tokens int32 (R, width), positions int32 (R, width), mask bool (R, width,
    S_c))``.
    """
    toks = jax.lax.dynamic_slice_in_dim(tokens, s0, width, 1)
    pos = s0 + jnp.arange(width, dtype=jnp.int32)[None] - pad[:, None]
    mask = jnp.broadcast_to(key_valid[:, None, :], (tokens.shape[0], width, key_valid.shape[-1]))
    return toks, pos, mask


def prepend_prev(prev: jax.Array, raw: jax.Array) -> jax.Array:
    """Dream with a cache: the rows scoring a window of ``L`` positions from the window's raw
    rows ``raw`` float32 ``(B, ..., L, V)``: ``prev`` ``(B, V)`` (the raw row before the
    window), then ``raw[..., :L - 1, :]``."""
    lead = raw.shape[:-2]
    first = jnp.broadcast_to(
        prev.reshape(prev.shape[:1] + (1,) * (len(lead) - 1) + (1,) + prev.shape[1:]),
        lead + (1, raw.shape[-1]),
    )
    return jnp.concatenate([first, raw[..., : raw.shape[-2] - 1, :]], axis=-2)


# ----------------------------------------------------------------------------- counters


@flax.struct.dataclass
class Counters:
    """The per-row figures of the stats record, counted while the row is active.

    Attributes:
      steps: int32 ``(B,)`` reference steps taken.
      nfe: int32 ``(B,)`` batched forwards (verification forwards for SSD / Spiffy).
      accept_hist: int32 ``(B, bins)`` iterations that produced ``j`` tokens / steps.
      proposed: int32 ``(B,)`` drafts sent to verification.
      forward_tokens: int32 ``(B,)`` query tokens pushed through the model.
      steps_by_nfe: int32 ``(B, T)``: entry ``i`` = reference steps taken after the row's
        forward ``i`` (cumulative; 0 past the last forward); ``T = 0`` unless ``start`` is given
        ``log_len`` (SSD / Spiffy: which forward committed which reference step).
    """

    steps: jax.Array
    nfe: jax.Array
    accept_hist: jax.Array
    proposed: jax.Array
    forward_tokens: jax.Array
    steps_by_nfe: jax.Array

    @classmethod
    def start(cls, batch: int, bins: int, log_len: int = 0) -> "Counters":
        zeros = jnp.zeros((batch,), jnp.int32)
        return cls(
            steps=zeros,
            nfe=zeros,
            accept_hist=jnp.zeros((batch, bins), jnp.int32),
            proposed=zeros,
            forward_tokens=zeros,
            steps_by_nfe=jnp.zeros((batch, log_len), jnp.int32),
        )

    def add(
        self,
        active: jax.Array,
        steps: jax.Array,
        accept_bin: jax.Array,
        proposed: jax.Array,
        query_tokens: jax.Array,
    ) -> "Counters":
        """Count one iteration: ``steps`` and ``proposed`` int32 ``(B,)`` as taken (0 where
        inactive), ``accept_bin`` int32 ``(B,)`` the histogram bin, ``query_tokens`` the
        tokens one row forwarded (counted where ``active``)."""
        act = active.astype(jnp.int32)
        bins = self.accept_hist.shape[1]
        log = self.steps_by_nfe
        if log.shape[1]:
            hit = (jnp.arange(log.shape[1])[None] == self.nfe[:, None]) & active[:, None]
            log = jnp.where(hit, (self.steps + steps)[:, None], log)
        return Counters(
            steps=self.steps + steps,
            nfe=self.nfe + act,
            steps_by_nfe=log,
            accept_hist=self.accept_hist
            + act[:, None] * jax.nn.one_hot(accept_bin, bins, dtype=jnp.int32),
            proposed=self.proposed + proposed,
            forward_tokens=self.forward_tokens + act * query_tokens,
        )


__all__ = [
    "MAX_PREFIX_WIDTHS",
    "dream_shift",
    "prefix_widths",
    "Layout",
    "Canvas",
    "block_window",
    "put_window",
    "BlockCursor",
    "advance_blocks",
    "BlockCache",
    "window_inputs",
    "prepend_prev",
    "Counters",
]
