"""The causal model's calling convention: a frozen dataclass over a parameter pytree.

``CausalLM(config).apply(params, ...)`` takes the bare tree or ``{"params": tree}``, is
hashable (jit-able as a bound method, equal models compile once), rejects parameters of
another architecture in one line, and computes the same function in the stacked and the
per-layer decode layouts.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.config import ModelConfig
from models.llama.modeling import CausalLM, init_params, unstack_layers

CFG = ModelConfig(
    arch="llama", vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=3,
    num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=False, tie_embeddings=False,
    max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-6,
)  # fmt: skip


def _inputs(t=6):
    tok = jnp.asarray([[3, 14, 15, 92, 65, 35][:t]], jnp.int32)
    pos = jnp.arange(t, dtype=jnp.int32)[None]
    return tok, pos, jnp.tril(jnp.ones((t, t), bool))[None]


def test_bare_and_wrapped_params_and_layouts_agree():
    params = init_params(CFG, seed=3)
    model = CausalLM(CFG)
    bare, cache = model.apply(params, *_inputs())
    assert cache is None and bare.shape == (1, 6, CFG.vocab_size) and bare.dtype == jnp.float32
    wrapped, _ = model.apply({"params": params}, *_inputs())
    np.testing.assert_array_equal(np.asarray(bare), np.asarray(wrapped))
    for output_major in (False, True):  # the unrolled decode layouts compute the same logits
        split, _ = model.apply(unstack_layers(params, output_major), *_inputs())
        np.testing.assert_allclose(np.asarray(split), np.asarray(bare), atol=1e-5)


def test_init_params_is_deterministic_in_the_seed():
    a, b, c = init_params(CFG, 0), init_params(CFG, 0), init_params(CFG, 1)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(a["embed"]), np.asarray(c["embed"]))
    assert set(a) == {"embed", "layers", "final_norm", "lm_head"}
    tied = init_params(dataclasses.replace(CFG, tie_embeddings=True, qkv_bias=True))
    assert "lm_head" not in tied and {"bq", "bk", "bv"} <= set(tied["layers"])


def test_model_is_hashable_and_jits_once_per_architecture():
    params = init_params(CFG)
    a, b = CausalLM(CFG), CausalLM(CFG)
    assert a == b and hash(a) == hash(b) and a.replace(row_blocks=2) != a
    jitted = jax.jit(a.apply)
    np.testing.assert_array_equal(
        np.asarray(jitted(params, *_inputs())[0]), np.asarray(a.apply(params, *_inputs())[0])
    )


def test_params_of_another_model_are_rejected_in_one_line():
    other = init_params(dataclasses.replace(CFG, vocab_size=50))
    with pytest.raises(ValueError, match=r"embedding has shape \(50, 32\).*\(97, 32\)"):
        CausalLM(CFG).apply(other, *_inputs())
