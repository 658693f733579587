"""Bidirectional masked-diffusion LMs (LLaDA-style and Dream-style) on the causal body.

A masked-diffusion LM is the same transformer as :class:`models.llama.modeling.CausalLM` run with a
non-causal attention mask: every (valid) query sees every (valid) key. Because
``CausalLM`` already takes an explicit boolean mask ``(B, T, S)`` and explicit RoPE
positions, :class:`DiffusionLM` only builds that mask and post-processes the logits; the
transformer body, parameter tree and KV cache are ``CausalLM``'s (no duplicated code).

Two heads of the same family:

* ``"llada"`` (LLaDA, Nie et al. 2025, "Large Language Diffusion Models"): the logits at
  position ``i`` predict the token at position ``i``; the mask token id is
  ``config.json["mask_token_id"]`` (126336 for LLaDA-8B). Source: ML-GSAI/LLaDA
  ``generate.py`` (``logits = model(x).logits``, used at ``mask_index`` directly).
* ``"dream"`` (Dream 7B, Ye et al. 2025): a Qwen2 model adapted from an AR checkpoint, so
  the raw logits at position ``i`` predict token ``i + 1``. Dream's sampler shifts them
  right by one before reading masked positions: Dream-org/Dream
  ``generation_utils.py`` (``DreamGenerationMixin._sample``) does
  ``logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)``, i.e.
  ``out[:, i] = raw[:, i - 1]`` for ``i >= 1`` and ``out[:, 0] = raw[:, 0]`` (position 0 is
  never masked: Dream asserts the first token is not a mask). Mask id 151666 for Dream-7B.

The parameter tree is ``CausalLM``'s (see :mod:`models.llama.modeling`), so
:func:`models.llama.modeling.init_params` / :func:`models.llama.modeling.init_cache` serve both
heads; the loaders live in :mod:`models.diffusion.params`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.llama.modeling import HEAD_PANELS, CausalLM, KVCache, lm_logits

HEADS = ("llada", "dream")


@dataclasses.dataclass(frozen=True)
class DiffusionConfig:
    """A masked-diffusion LM: transformer body, head convention and mask token.

    Attributes:
      base: the transformer body (:class:`models.config.ModelConfig`; Llama layout for
        LLaDA, Qwen2 layout for Dream).
      head: ``"llada"`` (logits predict the token at the same position) or ``"dream"``
        (logits shifted right by one, see the module docstring).
      mask_token_id: id of the ``[MASK]`` token, in ``[0, base.vocab_size)``.

    Raises:
      ValueError: unknown ``head``, ``base`` not a ``ModelConfig``, or ``mask_token_id``
        outside the vocabulary.
    """

    base: ModelConfig
    head: str
    mask_token_id: int

    def __post_init__(self):
        if not isinstance(self.base, ModelConfig):
            raise ValueError(f"base must be a ModelConfig, got {type(self.base).__name__}")
        if self.head not in HEADS:
            raise ValueError(
                f"unknown diffusion head {self.head!r}; expected one of {', '.join(HEADS)}"
            )
        if isinstance(self.mask_token_id, bool) or not isinstance(self.mask_token_id, int):
            raise ValueError(f"mask_token_id must be an int, got {self.mask_token_id!r}")
        if not 0 <= self.mask_token_id < self.base.vocab_size:
            raise ValueError(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary "
                f"[0, {self.base.vocab_size})"
            )

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size


def bidirectional_mask(valid: jax.Array) -> jax.Array:
    """Full (non-causal) attention mask for a padded batch.

    Args:
      valid: ``bool (B, T)``; True for real tokens, False for padding.

    Returns:
      ``bool (B, T, T)``: ``mask[b, q, k] = valid[b, q] & valid[b, k]``, plus the diagonal
      so a padded query row sees itself (every row must allow one key, see
      :class:`models.llama.modeling.CausalLM`; padded rows' logits are meaningless).
    """
    valid = jnp.asarray(valid, bool)
    T = valid.shape[-1]
    full = valid[:, :, None] & valid[:, None, :]
    return full | jnp.eye(T, dtype=bool)[None]


def shift_logits(raw: jax.Array) -> jax.Array:
    """Dream's right shift along the sequence axis: ``out[:, i] = raw[:, i-1]`` for
    ``i >= 1``, ``out[:, 0] = raw[:, 0]``. ``raw``: ``(B, T, V)``; same shape and dtype out.
    Source: Dream-org/Dream ``generation_utils.py`` (``torch.cat([logits[:, :1],
    logits[:, :-1]], dim=1)``)."""
    return jnp.concatenate([raw[:, :1], raw[:, :-1]], axis=1)


@dataclasses.dataclass(frozen=True)
class DiffusionLM:
    """Bidirectional LLaDA / Dream LM over the :class:`models.llama.modeling.CausalLM` body.

    Hashable (frozen dataclass), so ``jax.jit(DiffusionLM(cfg).apply)`` works.
    """

    config: DiffusionConfig

    @property
    def body(self) -> CausalLM:
        return CausalLM(self.config.base)

    def apply(
        self,
        params,
        tokens,
        positions,
        attn_mask=None,
        cache: Optional[KVCache] = None,
        cache_index=None,
        shift: bool = True,
        rows=None,
    ):
        """One forward pass.

        Args:
          params: the ``CausalLM`` params tree, or the wrapped ``{"params": tree}``.
          tokens: ``int32 (B, T)`` token ids (masked positions hold ``mask_token_id``).
          positions: ``int32 (B, T)`` RoPE positions.
          attn_mask: ``bool (B, T, S)``; query ``t`` may attend key slot ``s``. ``None``
            means every token sees every token (``S == T``; no padding); it is not allowed
            with a cache. Use :func:`bidirectional_mask` for padded batches.
          cache: optional :class:`models.llama.modeling.KVCache` (``S`` = cache size); the new keys
            are written at slots ``cache_index[b] + t`` before attention.
          cache_index: ``int32 (B,)`` write offsets (required with ``cache``).
          shift: only for head ``"dream"``: apply :func:`shift_logits` (default). The shift
            is within this call's ``T`` tokens, so in a cached call the first row is the
            chunk's own raw row; pass ``shift=False`` for raw next-token rows.
          rows: optional ``(start, n)``: compute the LM head only for the ``n`` (static int)
            *raw* rows ``start[b] + [0, n)`` of each row (``start`` int32 ``(B,)`` or scalar);
            no shift is applied. Saves the head's cost on rows nobody reads.

        Returns:
          ``(logits float32 (B, T, V), cache)`` (``(B, n, V)`` with ``rows``); ``cache`` is
          the updated cache or None.
          For ``"llada"`` row ``i`` scores the token at position ``i``; for ``"dream"`` (with
          ``shift``) likewise, after the shift.

        Raises:
          ValueError: ``attn_mask`` is None with a cache, or has the wrong shape.
        """
        variables = params if "params" in params else {"params": params}
        tokens = jnp.asarray(tokens, jnp.int32)
        positions = jnp.asarray(positions, jnp.int32)
        B, T = tokens.shape
        if attn_mask is None:
            if cache is not None:
                raise ValueError("attn_mask (B, T, cache size) is required when a cache is given")
            attn_mask = jnp.ones((B, T, T), bool)
        attn_mask = jnp.asarray(attn_mask, bool)
        S = T if cache is None else cache.size
        if attn_mask.shape != (B, T, S):
            raise ValueError(f"attn_mask has shape {attn_mask.shape}, expected {(B, T, S)}")
        if rows is not None:
            start, n = rows
            h, cache = self.body.apply(
                variables,
                tokens,
                positions,
                attn_mask,
                cache=cache,
                cache_index=cache_index,
                return_hidden=True,
            )
            start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (B,))
            h = jax.vmap(lambda a, s: jax.lax.dynamic_slice_in_dim(a, s, n, 0))(h, start)
            p = variables["params"]
            return lm_logits(h, p["embed"], p.get("lm_head"), p.get(HEAD_PANELS)), cache
        logits, cache = self.body.apply(
            variables, tokens, positions, attn_mask, cache=cache, cache_index=cache_index
        )
        if self.config.head == "dream" and shift:
            logits = shift_logits(logits)
        return logits, cache


__all__ = ["DiffusionConfig", "DiffusionLM", "bidirectional_mask", "shift_logits", "HEADS"]
