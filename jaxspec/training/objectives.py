"""Training objectives of masked-diffusion LMs: the LLaDA forward process and loss, and the
trainable LoRA delta of a parameter-efficient adaptation.

Objective (LLaDA, Nie et al. 2025, "Large Language Diffusion Models", Eq. 3 and the
ML-GSAI/LLaDA ``GUIDELINES.md`` pre-training / SFT snippets): per sequence draw
``t ~ U(0, 1)`` and set ``p = (1 - eps) * t + eps`` (so ``p`` lies in ``(eps, 1]``; ``eps``
= 1e-3 as in the guidelines, keeping ``1/p`` bounded); mask every maskable token
independently with probability ``p``; the loss is the cross-entropy of the masked tokens,
each weighted by ``1/p``:

* pre-training: ``sum_{masked} CE / p`` divided by ``B * T`` (all tokens of the batch);
* SFT (``response_mask`` given): only response tokens are maskable, and each sequence's sum is
  divided by its response length, then averaged over the batch.

Dream variant (Dream 7B, Ye et al. 2025): the model is an adapted autoregressive LM whose raw
logits at ``i`` predict token ``i + 1``; :class:`models.diffusion.modeling.DiffusionLM` with head
``"dream"`` already shifts them right by one, so row ``i`` scores token ``i`` and the same loss
code applies. Position 0 has no predicting row after the shift and is never masked (Dream's
sampler asserts the same). Dream's context-adaptive noise rescheduling (CART) is not
implemented: the plain LLaDA ``1/p`` weighting is used for both heads.

Parameter-efficient adaptation (for ``dream-smollm2-135m``): the trainable *delta*
(:func:`init_delta`) is

* LoRA factors ``a (L, in, r)`` (Gaussian, std ``1/sqrt(in)``) and ``b (L, r, out)`` (zeros) for
  each targeted stacked matrix of ``params["layers"]`` (``wq wk wv wo w_gate w_up w_down``);
  the merged weight is ``W + (alpha / r) * a @ b`` per layer (Hu et al. 2021, LoRA);
* ``mask_embed (D,)``: the embedding row of the mask token (initialised from the base row);
* ``norms``: ``attn_norm (L, D)``, ``mlp_norm (L, D)``, ``final_norm (D,)``.

Only the delta and its optimiser state are checkpointed; the frozen base is reloaded from
its preset. :func:`models.diffusion.delta.merge_delta` builds the full inference tree;
:func:`~models.diffusion.delta.save_delta` / :func:`~models.diffusion.delta.load_delta` store the
delta as safetensors.

SPACE's SAR-SFT objective (:func:`sar_inputs`, :func:`sar_loss`) trains a causal LM with the
same LoRA delta (the mask embedding row is SPACE's [MASK]). The AS-ARM objective (ASSD Eq. 7)
lives in :mod:`jaxspec.training.asarm`.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import jax
import jax.numpy as jnp

from jaxspec.training.config import LoraSection, TrainConfigError
from models.diffusion.delta import LORA_TARGETS
from models.diffusion.modeling import DiffusionConfig, DiffusionLM


def forward_process(
    key: jax.Array,
    tokens: jax.Array,
    mask_token_id: int,
    maskable: Optional[jax.Array] = None,
    eps: float = 1e-3,
):
    """LLaDA forward (noising) process.

    Args:
      key: PRNG key.
      tokens: ``int32 (B, T)`` clean tokens.
      mask_token_id: id written at masked positions.
      maskable: ``bool (B, T)``; positions that may be masked (default all).
      eps: lower bound of the mask probability.

    Returns:
      ``(noisy int32 (B, T), masked bool (B, T), p float32 (B,))`` with
      ``p = (1 - eps) * t + eps``, ``t ~ U(0, 1)`` per sequence.
    """
    B, T = tokens.shape
    kt, km = jax.random.split(key)
    t = jax.random.uniform(kt, (B,), jnp.float32)
    p = (1.0 - eps) * t + eps
    masked = jax.random.uniform(km, (B, T), jnp.float32) < p[:, None]
    if maskable is not None:
        masked = masked & maskable
    noisy = jnp.where(masked, jnp.int32(mask_token_id), tokens.astype(jnp.int32))
    return noisy, masked, p


def masked_diffusion_loss(
    logits: jax.Array,
    targets: jax.Array,
    masked: jax.Array,
    p_mask: jax.Array,
    response_len: Optional[jax.Array] = None,
):
    """LLaDA's weighted masked cross-entropy.

    Args:
      logits: ``float (B, T, V)``; row ``i`` scores the token at position ``i`` (for Dream,
        the already shifted logits).
      targets: ``int32 (B, T)`` clean tokens.
      masked: ``bool (B, T)`` masked positions (the only ones scored).
      p_mask: ``float32 (B,)`` mask probability of each sequence.
      response_len: ``(B,)`` response lengths in SFT mode, or None (pre-training).

    Returns:
      ``(loss float32 scalar, aux)`` with ``loss = sum_masked CE / p / (B * T)`` (pre-training)
      or ``mean_b [sum_{masked in b} CE / p_b / response_len_b]`` (SFT); ``aux`` holds
      ``ce_sum`` (unweighted CE summed over masked tokens), ``n_masked`` and ``n_correct``
      (argmax hits at masked positions).
    """
    B, T = targets.shape
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    ce = lse - tgt
    m = masked.astype(jnp.float32)
    weighted = ce * m / p_mask[:, None]
    if response_len is None:
        loss = jnp.sum(weighted) / (B * T)
    else:
        loss = jnp.mean(
            jnp.sum(weighted, axis=1) / jnp.maximum(response_len.astype(jnp.float32), 1.0)
        )
    hit = (jnp.argmax(logits, axis=-1) == targets) & masked
    aux = {
        "ce_sum": jnp.sum(ce * m),
        "n_masked": jnp.sum(m),
        "n_correct": jnp.sum(hit.astype(jnp.float32)),
    }
    return loss, aux


def maskable_positions(config: DiffusionConfig, shape, response_mask=None) -> jax.Array:
    """``bool (B, T)``: positions the forward process may mask (response tokens in SFT mode;
    never position 0 for the Dream head, which has no row predicting it)."""
    B, T = shape
    m = jnp.ones((B, T), bool) if response_mask is None else jnp.asarray(response_mask, bool)
    if config.head == "dream":
        m = m.at[:, 0].set(False)
    return m


def diffusion_loss(
    model: DiffusionLM,
    params,
    tokens: jax.Array,
    key: jax.Array,
    eps: float = 1e-3,
    response_mask: Optional[jax.Array] = None,
):
    """Noise ``tokens`` (``int32 (B, T)``), run ``model`` bidirectionally and score the masked
    tokens with :func:`masked_diffusion_loss`. ``response_mask`` (``bool (B, T)``) selects
    SFT mode. Returns ``(loss, aux)``."""
    cfg = model.config
    B, T = tokens.shape
    maskable = maskable_positions(cfg, (B, T), response_mask)
    noisy, masked, p = forward_process(key, tokens, cfg.mask_token_id, maskable, eps)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    logits, _ = model.apply(params, noisy, positions)
    rlen = (
        None if response_mask is None else jnp.sum(jnp.asarray(response_mask, jnp.float32), axis=1)
    )
    return masked_diffusion_loss(logits, tokens, masked, p, rlen)


def sar_inputs(key: jax.Array, tokens: jax.Array, k: int, p_ar: float, mask_token_id: int):
    """SPACE's SAR-SFT data transform (Sec. 3.1, Eq. 2) on packed windows, static shapes.

    Each row stays an AR sample with probability ``p_ar``; otherwise a start ``m`` is drawn
    uniformly from ``[1, T - 1 - k]`` (0-based; ``y_{m-1}`` must exist to predict ``y_m`` and
    ``y_{m+k}`` must exist as the last label), tokens ``m .. m+k-1`` become [MASK] and the row
    is truncated after them (Eq. 2's ``y^k_{<m}``): later positions get weight 0.

    **Label alignment** (the causal shift): row ``i``'s logits score ``y_{i+1}``. An AR row
    scores ``y_1 .. y_{T-1}`` (positions ``0 .. T-2``). A SAR row scores positions ``0 .. m+k-1``:
    ``0 .. m-1`` are the AR terms ``y_1 .. y_m`` of Eq. 3 (the first sum, plus its ``t = m``
    term, whose context ``y_{<m}`` holds no mask), and mask ``m + j`` scores ``y_{m+j+1}``,
    ``j = 0 .. k-1``: the ``k + 1`` labels ``y_m .. y_{m+k}`` of Eq. 3's second sum. At
    inference mask ``j`` of a group likewise drafts the token ``j + 1`` places after the one
    the verifier emits (:mod:`jaxspec.causal.space`).

    Args:
      key: PRNG key; tokens: int32 ``(B, T)`` clean windows (``T >= k + 2``).
      k: masks per group; p_ar: probability of an AR sample; mask_token_id: the [MASK] id.

    Returns:
      ``(inputs int32 (B, T), labels int32 (B, T), weight float32 (B, T), is_mask bool (B, T))``
      where ``labels[:, i] = tokens[:, i+1]`` (the last column repeats the last token, weight
      0) and ``is_mask`` marks the [MASK] inputs.
    """
    B, T = tokens.shape
    if T < k + 2:
        raise TrainConfigError(f"SAR-SFT needs seq_len >= k + 2 = {k + 2}, got {T}")
    ka, km = jax.random.split(key)
    sar = jax.random.uniform(ka, (B,)) >= p_ar
    m = jax.random.randint(km, (B,), 1, T - k)  # 1 .. T-1-k inclusive
    i = jnp.arange(T)[None, :]
    is_mask = sar[:, None] & (i >= m[:, None]) & (i < m[:, None] + k)
    inputs = jnp.where(is_mask, jnp.int32(mask_token_id), tokens.astype(jnp.int32))
    labels = jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1).astype(jnp.int32)
    keep = jnp.where(sar[:, None], i < m[:, None] + k, i < T - 1)
    return inputs, labels, keep.astype(jnp.float32), is_mask


def sar_loss(
    model, params, tokens: jax.Array, key: jax.Array, k: int, p_ar: float, groups: int = 0
):
    """SPACE's SAR-SFT loss (Eqs. 1 and 3): mean cross-entropy over the scored rows of the
    :class:`models.llama.modeling.CausalLM` ``model`` (its config's ``mask_token_id`` is the
    [MASK] id). ``groups = 0``: the paper's pipeline (:func:`sar_inputs`, one group per SAR
    sample, plain causal pass); ``groups > 0``: every row is an AR sample carrying ``groups``
    mask groups (:func:`sar_group_inputs`; ``p_ar`` unused).

    Returns ``(loss float32 scalar, aux)``; ``aux`` holds ``ce_sum`` and, over the [MASK]
    rows only (the drafting rows), ``n_masked`` and ``n_correct`` (argmax hits).
    """
    B, T = tokens.shape
    mid = model.config.mask_token_id
    if groups > 0:
        inputs, positions, mask, labels, weight, is_mask = sar_group_inputs(
            key, tokens, k, groups, mid
        )
    else:
        inputs, labels, weight, is_mask = sar_inputs(key, tokens, k, p_ar, mid)
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    logits, _ = model.apply({"params": params}, inputs, positions, mask)
    return _scored_ce(logits, labels, weight, is_mask)


def sar_group_inputs(key: jax.Array, tokens: jax.Array, k: int, groups: int, mask_token_id: int):
    """Many SAR samples in one pass: SPACE's mask groups attached to a full AR row.

    The paper's pipeline (:func:`sar_inputs`) spends a whole forward on one mask group and
    drops the rest of the row. Here each row keeps its AR terms (Eq. 1 on all ``T`` tokens)
    and ``groups`` groups of ``k`` [MASK] rows are appended, group ``g`` anchored at a start
    ``m_g`` drawn uniformly from ``[1, T - 1 - k]``. Mask ``j`` of group ``g`` sits at position
    ``m_g + j``, sees tokens ``0 .. m_g - 1`` and masks ``0 .. j`` of its own group (the
    decoder's rule, :mod:`jaxspec.causal.space`), and is labelled ``y_{m_g + j + 1}``. So each
    group's rows are exactly the mask rows of Eq. 2's truncated sample ``y^k_{<m_g}``, and
    their cross-entropy is the second sum of Eq. 3; the AR rows never see a mask.

    Returns ``(inputs int32 (B, T+E), positions int32 (B, T+E), mask bool (B, T+E, T+E),
    labels int32 (B, T+E), weight float32 (B, T+E), is_mask bool (B, T+E))`` with
    ``E = groups * k``.
    """
    B, T = tokens.shape
    if T < k + 2:
        raise TrainConfigError(f"SAR-SFT needs seq_len >= k + 2 = {k + 2}, got {T}")
    E = groups * k
    m = jax.random.randint(key, (B, groups), 1, T - k)  # (B, G)
    g = jnp.repeat(jnp.arange(groups), k)  # (E,)
    j = jnp.tile(jnp.arange(k), groups)
    start = m[:, g]  # (B, E)
    tokens = tokens.astype(jnp.int32)
    inputs = jnp.concatenate([tokens, jnp.full((B, E), mask_token_id, jnp.int32)], axis=1)
    positions = jnp.concatenate([jnp.broadcast_to(jnp.arange(T), (B, T)), start + j], axis=1)
    labels = jnp.concatenate(
        [tokens[:, 1:], tokens[:, -1:], jnp.take_along_axis(tokens, start + j + 1, axis=1)], axis=1
    )
    weight = jnp.concatenate(
        [jnp.broadcast_to(jnp.arange(T) < T - 1, (B, T)), jnp.ones((B, E), bool)], axis=1
    ).astype(jnp.float32)
    ar_ar = jnp.tril(jnp.ones((T, T), bool))
    top = jnp.concatenate([jnp.broadcast_to(ar_ar, (B, T, T)), jnp.zeros((B, T, E), bool)], 2)
    sees_tok = jnp.arange(T)[None, None, :] < start[:, :, None]  # (B, E, T)
    own = (g[:, None] == g[None, :]) & (j[None, :] <= j[:, None])  # (E, E)
    bottom = jnp.concatenate([sees_tok, jnp.broadcast_to(own, (B, E, E))], axis=2)
    is_mask = jnp.concatenate([jnp.zeros((B, T), bool), jnp.ones((B, E), bool)], axis=1)
    return inputs, positions, jnp.concatenate([top, bottom], axis=1), labels, weight, is_mask


def _scored_ce(logits, labels, weight, is_mask):
    logits = logits.astype(jnp.float32)
    ce = (
        jax.nn.logsumexp(logits, axis=-1)
        - jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
    )
    loss = jnp.sum(ce * weight) / jnp.maximum(jnp.sum(weight), 1.0)
    mk = is_mask.astype(jnp.float32)
    hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32) * mk
    return loss, {
        "ce_sum": jnp.sum(ce * weight),
        "n_masked": jnp.sum(mk),
        "n_correct": jnp.sum(hit),
    }


def init_delta(base, lora: LoraSection, mask_token_id: int, key: jax.Array):
    """Initial trainable delta for ``base`` (the ``CausalLM`` params tree).

    Returns a dict ``{"lora": {name: {"a": (L, in, r), "b": (L, r, out)}}, "mask_embed": (D,),
    "norms": {...}}`` (float32); ``b`` is zero so the merged model equals the base.

    Raises:
      TrainConfigError: an unknown LoRA target or a non-positive rank.
    """
    if lora.rank <= 0:
        raise TrainConfigError(f"lora.rank must be positive, got {lora.rank}")
    layers = base["layers"]
    delta: dict[str, Any] = {"lora": {}}
    for i, name in enumerate(lora.targets):
        if name not in LORA_TARGETS or name not in layers:
            raise TrainConfigError(f"unknown LoRA target {name!r}; expected some of {LORA_TARGETS}")
        L, din, dout = layers[name].shape
        a = jax.random.normal(
            jax.random.fold_in(key, i), (L, din, lora.rank), jnp.float32
        ) / math.sqrt(din)
        delta["lora"][name] = {"a": a, "b": jnp.zeros((L, lora.rank, dout), jnp.float32)}
    if lora.train_mask_embed:
        delta["mask_embed"] = jnp.array(base["embed"][mask_token_id], jnp.float32, copy=True)
    if lora.train_norms:
        copy = lambda x: jnp.array(x, jnp.float32, copy=True)  # never alias the base
        delta["norms"] = {
            "attn_norm": copy(layers["attn_norm"]),
            "mlp_norm": copy(layers["mlp_norm"]),
            "final_norm": copy(base["final_norm"]),
        }
    return delta


__all__ = [
    "forward_process",
    "masked_diffusion_loss",
    "maskable_positions",
    "diffusion_loss",
    "sar_inputs",
    "sar_group_inputs",
    "sar_loss",
    "init_delta",
]
