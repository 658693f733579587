"""Tiny random causal LMs for fast tests (pure JAX, no transformers needed)."""

from __future__ import annotations

import jax

from models.config import ModelConfig
from models.llama.modeling import CausalLM, init_params


def tiny_model(vocab: int = 64, *, arch: str = "llama", layers: int = 2, scale: float = 4.0,
               seed: int = 0, ctx: int = 512):
    """A random ``CausalLM`` and its params; ``scale`` sharpens the next-token distributions
    (random init at std 0.02 gives nearly uniform ones, which make acceptance tests weak)."""
    cfg = ModelConfig(arch=arch, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=8,
                      qkv_bias=(arch == "qwen2"), tie_embeddings=(arch == "qwen2"),
                      max_position_embeddings=ctx, rope_theta=10000.0, rms_norm_eps=1e-6)
    params = init_params(cfg, seed)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x * scale if x.ndim >= 2 else x, params)
    return CausalLM(cfg), params


class CharTok:
    """One token per character (id = code point, vocabulary 128): a stand-in tokenizer for
    template, CLI and gate bookkeeping tests."""

    vocab_size = 128

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)
