"""Tiny random models of every family for fast tests and forks (pure JAX, no transformers
needed): causal (:func:`tiny_model`), masked diffusion (:func:`tiny_diffusion_model`) and
XLNet AS-ARM (:func:`tiny_xlnet`), plus a character tokenizer stand-in."""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig
from models.diffusion.modeling import DiffusionConfig, DiffusionLM
from models.llama.modeling import MATRICES, CausalLM, init_params
from models.xlnet.modeling import XLNetConfig, XLNetLM
from models.xlnet.modeling import init_params as init_xlnet_params


def tiny_model(
    vocab: int = 64,
    *,
    arch: str = "llama",
    layers: int = 2,
    scale: float = 4.0,
    seed: int = 0,
    ctx: int = 512,
    mask_token_id: int | None = None,
):
    """A random ``CausalLM`` and its params; ``scale`` sharpens the next-token distributions
    (random init at std 0.02 gives nearly uniform ones, which make acceptance tests weak)."""
    cfg = ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        qkv_bias=(arch == "qwen2"),
        tie_embeddings=(arch == "qwen2"),
        max_position_embeddings=ctx,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        mask_token_id=mask_token_id,
    )
    params = init_params(cfg, seed)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * scale if x.ndim >= 2 else x, params
    )
    return CausalLM(cfg), params


def q4_exact(w) -> np.ndarray:
    """A float32 matrix ``w`` ``(K, N)`` rounded to GGUF Q4_1 along ``K`` (blocks of 32 inputs
    per output, ``gguf.quants``) and dequantized: the values a Q4_1 GGUF file's tensor loads
    as, which :func:`models.llama.panels.pack_q4` packs exactly. ``K`` a multiple of 32."""
    return _round_trip(w, gguf.GGMLQuantizationType.Q4_1)


def q8_exact(w) -> np.ndarray:
    """:func:`q4_exact` for GGUF Q8_0 (the SmolLM2 file's token embedding, the tied head):
    what :func:`models.llama.panels.pack_q8` packs exactly."""
    return _round_trip(w, gguf.GGMLQuantizationType.Q8_0)


def _round_trip(w, kind) -> np.ndarray:
    q = gguf.quants.quantize(np.ascontiguousarray(np.asarray(w, np.float32).T), kind)
    return np.ascontiguousarray(gguf.quants.dequantize(q, kind).T)


def gguf_exact(w, kind: str) -> np.ndarray:
    """:func:`q4_exact` for any GGUF block format ``gguf.quants`` quantizes (``"Q4_0"``,
    ``"Q4_1"``, ``"Q5_0"``, ``"Q8_0"``, ...): ``w`` ``(K, N)`` rounded along ``K`` and
    dequantized.

    Raises:
      ValueError: a format name ``gguf`` does not know.
    """
    return _round_trip(w, _gguf_type(kind))


def kquant_matrix(K: int, N: int, kind: str, seed: int = 0) -> np.ndarray:
    """A random float32 ``(K, N)`` matrix that is exactly a dequantized GGUF k-quant tensor
    (``"Q4_K"`` or ``"Q6_K"``, blocks of 256 inputs per output) as a Q4_K_M file's projections
    load (:func:`models.llama.params.load_gguf`). ``gguf.quants`` cannot quantize these
    formats, so the blocks are random bytes (codes, 6-bit / int8 sub-block scales) with
    float16 super-block scales near ``1 / (40 sqrt(K))``, dequantized by ``gguf.quants``.

    Raises:
      ValueError: another ``kind``, or ``K`` not a multiple of 256.
    """
    if kind not in ("Q4_K", "Q6_K") or K % 256:
        raise ValueError(f"kquant_matrix: Q4_K or Q6_K with K a multiple of 256, got {kind}, {K}")
    qtype = _gguf_type(kind)
    rng = np.random.default_rng(seed)
    n_blocks = N * K // 256
    raw = rng.integers(0, 256, (n_blocks, gguf.GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    scale = (rng.uniform(0.5, 1.5, (n_blocks, 1)) / (40 * np.sqrt(K))).astype(np.float16)
    if kind == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales / mins, 128 bytes of codes
        raw[:, 0:2] = scale.view(np.uint8)
        raw[:, 2:4] = (scale / 2).astype(np.float16).view(np.uint8)
    else:  # 128 + 64 bytes of codes, 16 int8 scales, d
        raw[:, 192:208] = rng.integers(-64, 64, (n_blocks, 16)).astype(np.int8).view(np.uint8)
        raw[:, 208:210] = (scale / 16).astype(np.float16).view(np.uint8)
    w = gguf.quants.dequantize(raw.reshape(N, -1), qtype)
    return np.ascontiguousarray(np.asarray(w, np.float32).T)


def _gguf_type(kind: str):
    try:
        return gguf.GGMLQuantizationType[kind]
    except KeyError:
        raise ValueError(f"unknown GGUF block format {kind!r}") from None


def q4_exact_params(params: dict) -> dict:
    """``params`` of :func:`tiny_model` with every stacked projection matrix ``(L, K, N)``
    made Q4_1-exact (:func:`q4_exact`), as loaded from a Q4_1 GGUF file."""
    layers = {
        k: jnp.asarray(np.stack([q4_exact(w) for w in np.asarray(v)])) if k in MATRICES else v
        for k, v in params["layers"].items()
    }
    return {**params, "layers": layers}


class CharTok:
    """One token per character (id = code point, vocabulary 128): a stand-in tokenizer for
    template, CLI and gate bookkeeping tests."""

    vocab_size = 128

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class ChatCharTok(CharTok):
    """:class:`CharTok` with a chat template (``<role>text`` per message, then
    ``<assistant>``), EOS id 4 and pad id 0: a stand-in for chat-prompt and distillation
    tests."""

    chat_template = "x"
    eos_token_ids = (4,)
    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def tiny_diffusion_model(
    head: str = "llada",
    *,
    vocab: int = 40,
    scale: float = 4.0,
    head_scale: float = 20.0,
    seed: int = 1,
    ctx: int = 48,
):
    """A random LLaDA (llama body) or Dream (qwen2 body, untied head as in Dream-7B)
    masked-diffusion model with mask id ``vocab - 1``, and its params. The body is scaled by
    ``scale`` and the LM head by ``head_scale``: peaked predictions (max probability about
    0.2-0.95) whose confidences are well apart (gaps >= 1e-4, far above the float jitter
    between padded and unpadded forwards), so rankings are stable."""
    arch = "llama" if head == "llada" else "qwen2"
    base = ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        qkv_bias=(arch == "qwen2"),
        tie_embeddings=False,
        max_position_embeddings=ctx,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    )
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            x * (head_scale if "lm_head" in jax.tree_util.keystr(path) else scale)
            if x.ndim >= 2
            else x
        ),
        init_params(base, seed),
    )
    return DiffusionLM(DiffusionConfig(base, head, vocab - 1)), params


def tiny_xlnet(vocab: int = 11, seed: int = 1, scale: float = 4.0, n_head: int = 2):
    """A random two-stream XLNet AS-ARM (d_model 16, 2 layers, ``n_head`` heads) and its
    params, weights scaled by ``scale`` for peaked conditionals."""
    cfg = XLNetConfig(vocab_size=vocab, d_model=16, n_layer=2, n_head=n_head, d_inner=32)
    params = jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, init_xlnet_params(cfg, seed))
    return XLNetLM(cfg), params
