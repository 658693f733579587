"""The DFlash training objective: a block-diffusion drafter (:mod:`jaxspec.causal.dflash`)
learns to fill a masked block from the target's hidden states of the context before it.

Objective (DFlash, Chen, Liang, Liu, arXiv 2602.06036; the loss is its Eq. 4):

1. **Target features.** One causal pass of the frozen target over each training sequence
   returns the hidden states after the drafter's ``layer_ids`` (:func:`target_features`; the
   same ``hidden_layers`` option the decoder uses, on the target cut after its deepest
   feature layer, :func:`truncated_target`). The target is frozen, so these can also be
   computed once per row and read back (the paper: "computed on the fly or cached"; the
   ``dflash.feature_cache`` option of :mod:`jaxspec.training.dflash_run`).
2. **Anchors.** DFlash fixes the number of masked blocks per sequence and samples their
   anchor positions afresh for every sequence: per sequence, ``n_anchors`` distinct
   positions ``a`` are drawn uniformly among the trainable ones (:func:`sample_anchors`: ``a``
   and ``a + 1`` are trainable tokens, e.g. the response). Each anchor opens one block
   ``[x_a, mask * (B - 1)]`` at positions ``a .. a + B - 1``, exactly as at decode time (the
   anchor is the last emitted token).
3. **Context.** The block sees the projected features of positions ``< a`` only (at decode
   time the anchor's own hidden state is computed by the next verification pass), and all
   rows of its own block (bidirectional). Blocks never see each other. The blocks of one
   sequence attend to one copy of its context keys / values (:func:`blocks_at`), so memory
   does not grow with ``anchors x context``.
4. **Loss (Eq. 4).** Cross-entropy of draft row ``k = 1 .. B - 1`` against ``x_{a + k}``
   (where that position exists and is trainable), weighted by
   ``w_k = exp(-(k - 1) / gamma)``, which favours the early block positions: a draft counts
   only if every draft before it is accepted. The paper's ``gamma`` is 7 for block size 16
   (5 for 10, 4 for 8). ``gamma = None`` weighs all positions equally. The loss is the
   weighted sum divided by the sum of the weights.

   Sources for step 4: the paper's text was not at hand; the form of Eq. 4 is as NVIDIA NeMo
   AutoModel's DFlash trainer documents it ("the decay-weighted CE of Eq. 4, w_k =
   exp(-(k-1)/gamma)") and the per-block-size ``gamma`` as public DFlash training scripts
   give them (16: 7, 10: 5, 8: 4).

The token embedding and LM head are the target's, frozen: only the drafter's own tree
(:func:`jaxspec.causal.dflash.init_drafter`) is trained.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxspec.causal.dflash import DFlashSpec, block_logits, context_kv

__all__ = [
    "blocks_at",
    "truncated_target",
    "dflash_loss",
    "position_weights",
    "sample_anchors",
    "target_features",
]


def target_features(model, params, tokens: jax.Array, layer_ids: tuple[int, ...]) -> jax.Array:
    """The frozen target's hidden states after ``layer_ids`` for right-padded ``tokens``
    int32 ``(N, T)`` (one causal pass, positions ``0..T-1``): ``(N, T, n, D)``. The layers
    after ``max(layer_ids)`` do not change them: ``model`` / ``params`` may be the target cut
    to its first ``max(layer_ids) + 1`` layers (:func:`truncated_target`)."""
    N, T = tokens.shape
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (N, T, T))
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (N, T))
    _, _, hidden = model.apply(  # last_rows=1: the LM head skips all but one row
        {"params": params}, tokens, pos, mask, last_rows=1, hidden_layers=tuple(layer_ids)
    )
    return jax.lax.stop_gradient(hidden)


def sample_anchors(key: jax.Array, trainable: jax.Array, n_anchors: int):
    """Draw ``n_anchors`` distinct anchors per sequence, uniformly among positions ``a`` with
    ``trainable[a]`` and ``trainable[a + 1]``.

    Args:
      trainable: bool ``(N, T)``; n_anchors: static, >= 1.

    Returns:
      ``(anchors int32 (N, A), ok bool (N, A))``: ``ok`` is False for the slots of a sequence
      with fewer than ``A`` candidates (their anchors are arbitrary and carry no loss).

    Raises:
      ValueError: ``n_anchors`` < 1.
    """
    if n_anchors < 1:
        raise ValueError(f"n_anchors must be >= 1, got {n_anchors}")
    cand = trainable[:, :-1] & trainable[:, 1:]
    score = jnp.where(cand, jax.random.uniform(key, cand.shape), -1.0)
    A = min(n_anchors, cand.shape[1])
    top, idx = jax.lax.top_k(score, A)
    return idx.astype(jnp.int32), top >= 0.0


def truncated_target(model, params, layer_ids: tuple[int, ...]):
    """``(CausalLM, params)`` of the target cut to its first ``max(layer_ids) + 1`` layers
    (stacked ``layers`` weights): the hidden states of ``layer_ids`` are the full target's,
    at a fraction of the cost when the deepest feature layer is early."""
    from models.llama.modeling import CausalLM

    keep = max(layer_ids) + 1
    if keep >= model.config.num_layers:
        return model, params
    cut = dict(params, layers={k: v[:keep] for k, v in params["layers"].items()})
    return CausalLM(model.config.replace(num_layers=keep)), cut


def position_weights(block_size: int, gamma: Optional[float]) -> jax.Array:
    """float32 ``(B - 1,)``: ``exp(-(j - 1) / gamma)`` for draft rows ``j = 1 .. B - 1``
    (ones for ``gamma=None``).

    Raises:
      ValueError: ``gamma`` <= 0."""
    j = jnp.arange(block_size - 1, dtype=jnp.float32)
    if gamma is None:
        return jnp.ones_like(j)
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0 (or None: uniform weights), got {gamma}")
    return jnp.exp(-j / gamma)


def blocks_at(
    spec: DFlashSpec,
    own: dict,
    shared: dict,
    tokens: jax.Array,
    hidden: jax.Array,
    anchors: jax.Array,
) -> jax.Array:
    """The drafter's logits for the blocks opened at ``anchors``, as the decode loop would
    compute them after emitting ``tokens[:, a]`` (the context is the features of positions
    ``< a``; the block's rows sit at positions ``a .. a + B - 1``).

    Args:
      own: the drafter's tree; shared: the target's ``embed`` (and ``lm_head``).
      tokens: int32 ``(N, T)`` sequences from position 0; hidden: ``(N, T, n, D)``
        (:func:`target_features`); anchors: int32 ``(N, A)`` in ``0 .. T - 1``.

    Returns:
      float32 ``(N, A, B - 1, V)``. The ``A`` blocks of a sequence attend to one copy of its
      context keys / values (:func:`jaxspec.causal.dflash.block_logits`): memory grows with
      ``N * T`` for the context and ``N * A * B`` for the blocks, not ``N * A * T``.
    """
    N, T = tokens.shape
    ctx_k, ctx_v = context_kv(
        spec,
        own,
        hidden.astype(own["fc"].dtype),
        jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (N, T)),
    )
    ctx_mask = jnp.arange(T)[None, None] < anchors[..., None]  # (N, A, T)
    return block_logits(
        spec,
        {"draft": own, **shared},
        jnp.take_along_axis(tokens, anchors, axis=1),
        anchors[..., None] + jnp.arange(spec.block_size, dtype=jnp.int32),
        ctx_k,
        ctx_v,
        ctx_mask,
    )


def dflash_loss(
    spec: DFlashSpec,
    own: dict,
    shared: dict,
    tokens: jax.Array,
    hidden: jax.Array,
    trainable: jax.Array,
    anchors: jax.Array,
    ok: jax.Array,
    gamma: Optional[float] = None,
):
    """The weighted block cross-entropy (module docstring).

    Args:
      spec: the drafter's :class:`~jaxspec.causal.dflash.DFlashSpec`.
      own: the drafter's trainable tree; shared: the target's ``embed`` (and ``lm_head``).
      tokens: int32 ``(N, T)``; hidden: ``(N, T, n, D)`` (:func:`target_features`);
      trainable: bool ``(N, T)`` positions whose tokens are targets (and may be anchors);
      anchors, ok: :func:`sample_anchors`; gamma: the position decay (None: uniform).

    Returns:
      ``(loss float32 (), metrics)``: ``acc`` float32 ``(B - 1,)`` the argmax accuracy per
      draft row, ``tokens`` the number of scored tokens, ``hits`` / ``scored`` float32
      ``(B - 1,)`` the counts behind ``acc``, ``accepted`` the drafts before the first argmax
      miss summed over the complete blocks (all ``B - 1`` labels scored) and ``blocks`` their
      number: on the target's own greedy continuations, ``accepted / blocks`` is what greedy
      verification would accept per block (the acceptance length less the bonus token).
    """
    N, T = tokens.shape
    A, Bk = anchors.shape[1], spec.block_size
    j = jnp.arange(Bk, dtype=jnp.int32)
    logits = blocks_at(spec, own, shared, tokens, hidden, anchors).reshape(N * A, Bk - 1, -1)
    a = anchors.reshape(N * A)
    row_seq = jnp.repeat(jnp.arange(N), A)
    tgt_pos = a[:, None] + j[None, 1:]
    inside = tgt_pos < T
    tgt_pos = jnp.minimum(tgt_pos, T - 1)
    labels = tokens[row_seq[:, None], tgt_pos]
    scored = inside & trainable[row_seq[:, None], tgt_pos] & ok.reshape(N * A)[:, None]
    logp = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    w = position_weights(Bk, gamma)[None] * scored
    loss = jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1e-9)
    hit = (jnp.argmax(logits, -1) == labels) & scored
    acc = jnp.sum(hit, 0) / jnp.maximum(jnp.sum(scored, 0), 1)
    complete = jnp.all(scored, axis=1)  # blocks whose B - 1 labels all exist
    lead = jnp.sum(jnp.cumprod(hit, axis=1), axis=1)  # drafts before the first miss
    return loss, {
        "acc": acc,
        "tokens": jnp.sum(scored),
        "hits": jnp.sum(hit, 0).astype(jnp.float32),
        "scored": jnp.sum(scored, 0).astype(jnp.float32),
        "accepted": jnp.sum(jnp.where(complete, lead, 0)).astype(jnp.float32),
        "blocks": jnp.sum(complete).astype(jnp.float32),
    }
