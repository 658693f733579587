"""Inputs of the AS-ARM infilling decoders: task padding, the decoding order and the attention
orders of the two passes, the loop's constant inputs and one iteration's query window.

Source: Guo & Ermon, arXiv:2504.20456 (ICLR 2026 version: "Self-Speculative Decoding
Accelerates Lossless Inference in Any-Order and Any-Subset Autoregressive Models"): Eq. 4
(decoding order), Fig. 1 / Eq. 6 (attention masks), Algorithm 1 line 3 (the speculated window).

**Task.** A sequence ``x`` of ``N`` tokens in which the positions marked ``masked`` are to be
generated (infilling). The visible positions are the prompt ``x_sigma(<m)``. Sequences are
right-padded to ``S`` = the longest one rounded up to ``bucket`` (:func:`prepare_batch`); pad
slots are neither prompt nor masked and nobody attends to them (relative attention makes the
padding invisible).

**Decoding order** (Eq. 4, :func:`decoding_order`): ``sigma`` lists the prompt positions first
(ascending), then the masked positions left to right. Rank ``r`` of a masked position is its
index among the masked positions (``sigma(m + r)``, :func:`masked_ranks`); in the code ``n``
counts the masked positions decoded so far (the paper's ``n - m``).

**Orders.** An *order* (int32 ``(B, S)``) gives every non-prompt slot the rank under which the
others see it: slot ``j`` is seen by a masked slot ``i`` iff ``order[j] < order[i]``
(:data:`UNSEEN`: seen by nobody). :func:`draft_order` is the parallel-sampling mask of Fig. 1a
(every undecoded slot conditions on ``x_sigma(<n)`` only), :func:`density_order` the density
mask of Fig. 1b over ``x_sigma(<t)``.

Reading order: padding and ranks (host side), the orders, :class:`Inputs` (the loop's constant
traced inputs), :class:`Window` and :func:`query_window` (Algorithm 1 line 3).
"""

from __future__ import annotations

from typing import Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.asarm.config import LoopConfig
from jaxspec.core.batching import bucket_length

UNSEEN = 1 << 30
"""Rank of the slots nobody may attend (undecoded masked slots, padding)."""


# --------------------------------------------------------------------------- host side
def decoding_order(masked: Sequence[bool]) -> tuple[np.ndarray, int]:
    """Eq. 4 decoding order of one sequence.

    Args:
      masked: bool ``(N,)``; True at the positions to generate.

    Returns:
      ``(sigma int32 (N,), m)``: ``sigma`` lists the ``m`` prompt positions in ascending order,
      then the masked positions in ascending order (left to right, Eq. 4).
    """
    masked = np.asarray(masked, bool)
    pos = np.arange(masked.shape[0], dtype=np.int32)
    return np.concatenate([pos[~masked], pos[masked]]).astype(np.int32), int((~masked).sum())


def _check_row(b: int, t, m, vocab_size: int, max_len: Optional[int]):
    """Row ``b`` as ``(tokens int64 (N,), masked bool (N,))``; see :func:`prepare_batch`."""
    t = np.asarray(t, np.int64).reshape(-1) if np.ndim(t) <= 1 else None
    m = np.asarray(m, bool).reshape(-1) if np.ndim(m) <= 1 else None
    if t is None or m is None:
        raise ValueError(f"row {b}: tokens and mask must be 1-D sequences")
    if t.shape != m.shape:
        raise ValueError(f"row {b}: {t.shape[0]} tokens but a mask of {m.shape[0]} entries")
    if t.shape[0] == 0:
        raise ValueError(f"row {b}: empty sequence")
    if not m.any():
        raise ValueError(f"row {b}: no masked positions to generate")
    if max_len is not None and t.shape[0] > max_len:
        last = int(np.flatnonzero(m)[-1])
        raise ValueError(
            f"row {b}: sequence of {t.shape[0]} tokens (last masked position "
            f"{last}) runs past the context of {max_len}"
        )
    vis = t[~m]
    if vis.size and (vis.min() < 0 or vis.max() >= vocab_size):
        raise ValueError(
            f"row {b}: token id {int(vis.min() if vis.min() < 0 else vis.max())} "
            f"outside the model vocabulary [0, {vocab_size})"
        )
    return t, m


def prepare_batch(tokens, masked, vocab_size: int, bucket: int = 16, max_len: Optional[int] = None):
    """Validate and pad a batch of infilling tasks.

    Args:
      tokens: sequence of ``B`` int sequences (lengths may differ); the ids at masked positions
        are ignored (any value in range, e.g. 0).
      masked: sequence of ``B`` bool sequences of the same lengths (True = generate).
      vocab_size: the model's vocabulary size ``V``.
      bucket: the buffer length ``S`` is the longest row rounded up to a multiple of ``bucket``.
      max_len: optional context limit; a row longer than it is an error.

    Returns:
      ``(tokens int32 (B, S), visible bool (B, S), masked bool (B, S), lengths int (B,))``.

    Raises:
      ValueError (one line): empty batch, shape mismatch between a row's tokens and mask, a row
      without masked positions, a row past ``max_len``, or a visible id outside ``[0, V)``.
    """
    if isinstance(tokens, np.ndarray) and tokens.ndim == 1:
        raise ValueError(f"tokens must be a batch (B, N), got shape {tokens.shape}")
    if len(tokens) == 0:
        raise ValueError("empty batch: need at least one sequence")
    if len(masked) != len(tokens):
        raise ValueError(f"{len(tokens)} token rows but {len(masked)} mask rows")
    rows_t, rows_m = [], []
    for b, (t, m) in enumerate(zip(tokens, masked)):
        t, m = _check_row(b, t, m, vocab_size, max_len)
        rows_t.append(np.where(m, 0, t))
        rows_m.append(m)
    if int(bucket) < 1:
        raise ValueError(f"bucket must be >= 1, got {bucket}")
    lengths = np.array([len(t) for t in rows_t])
    S = bucket_length(int(lengths.max()), int(bucket))
    B = len(rows_t)
    tok = np.zeros((B, S), np.int32)
    msk = np.zeros((B, S), bool)
    vis = np.zeros((B, S), bool)
    for b, (t, m) in enumerate(zip(rows_t, rows_m)):
        tok[b, : len(t)] = t
        msk[b, : len(t)] = m
        vis[b, : len(t)] = ~m
    return tok, vis, msk, lengths


def masked_ranks(masked: np.ndarray):
    """Ranks of a padded batch's masked slots (Eq. 4).

    Args:
      masked: bool ``(B, S)`` (:func:`prepare_batch`), at least one True per row.

    Returns:
      ``(rank int32 (B, S), pos_of_rank int32 (B, S), G int32 (B,))``: the rank of each masked
      slot among the masked slots (:data:`UNSEEN` elsewhere), ``sigma(m + r)`` the slot of rank
      ``r`` (padded with the last masked slot) and the masked counts ``N - m``.
    """
    B, S = masked.shape
    rank = np.where(masked, np.cumsum(masked, axis=1) - 1, UNSEEN).astype(np.int32)
    pos = np.zeros((B, S), np.int32)
    G = masked.sum(1).astype(np.int32)
    for b in range(B):
        p = np.flatnonzero(masked[b])
        pos[b, : len(p)] = p
        pos[b, len(p) :] = p[-1]
    return rank, pos, G


# --------------------------------------------------------------------------- orders
def draft_order(rank: jax.Array, n: jax.Array) -> jax.Array:
    """Order for a draft pass after ``n (B,)`` decoded masked tokens (Alg. 1 lines 4-8)."""
    return jnp.where(rank < n[:, None], rank, UNSEEN)


def density_order(rank: jax.Array, t: jax.Array) -> jax.Array:
    """Order for the density pass over ``x_sigma(<t)`` (Alg. 1 lines 13-15; ``t (B,)`` counts
    the masked tokens decoded or drafted)."""
    return jnp.where(rank < t[:, None], rank, UNSEEN)


# --------------------------------------------------------------------------- loop inputs
@flax.struct.dataclass
class Inputs:
    """Traced inputs of one compiled loop, constant across its iterations (:func:`prepare_batch`,
    :func:`masked_ranks`)."""

    visible: jax.Array  # bool (B, S): prompt slots x_sigma(<m)
    masked: jax.Array  # bool (B, S): slots to generate
    rank: jax.Array  # int32 (B, S): rank of a masked slot among the masked; UNSEEN elsewhere
    pos_of_rank: jax.Array  # int32 (B, S): sigma(m + r), the slot of rank r (padded with the last)
    num_masked: jax.Array  # int32 (B,): G, masked slots per row (N - m)
    k: jax.Array  # int32 (): tokens speculated per iteration, 1 <= k <= slots
    epsilon: jax.Array  # float32 (): Appendix F.5 acceptance tolerance (0: lossless)


def known_slots(inp: Inputs, decoded: jax.Array) -> jax.Array:
    """bool ``(B, S)``: the prompt and the ``decoded`` (int32 ``(B,)``) masked slots."""
    return inp.visible | (inp.masked & (inp.rank < decoded[:, None]))


@flax.struct.dataclass
class Window:
    """The masked slots one iteration works on (Alg. 1 line 3: ``t = min(n + k, N - m)``)."""

    active: jax.Array  # bool (B,): rows with masked slots left
    live: jax.Array  # int32 (B,): t - n, tokens speculated (0 on finished rows)
    query_pos: jax.Array  # int32 (B, K): slot sigma(m + n + j) of query j (clamped past the end)
    use: jax.Array  # bool (B, K): j < t - n


def query_window(cfg: LoopConfig, inp: Inputs, decoded: jax.Array) -> Window:
    """The draft slots after ``decoded`` (``n``, int32 ``(B,)``) tokens (Alg. 1 line 3:
    ``t = min(n + k, N - m)``; fused variants keep one more slot for the bonus row:
    ``t = min(n + k, N - m - 1)``)."""
    P = cfg.draft_slots
    S = inp.visible.shape[1]
    j = jnp.arange(P)[None, :]
    active = decoded < inp.num_masked
    room = inp.num_masked - decoded - (1 if cfg.variant.fused else 0)
    live = jnp.where(active, jnp.clip(jnp.minimum(jnp.minimum(P, inp.k), room), 0), 0)
    qpos = jnp.take_along_axis(inp.pos_of_rank, jnp.minimum(decoded[:, None] + j, S - 1), axis=1)
    return Window(active=active, live=live, query_pos=qpos, use=j < live[:, None])


__all__ = [
    "UNSEEN",
    "decoding_order",
    "prepare_batch",
    "masked_ranks",
    "draft_order",
    "density_order",
    "Inputs",
    "known_slots",
    "Window",
    "query_window",
]
