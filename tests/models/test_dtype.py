"""The dtype policy (``--dtype``; :func:`models.registry.resolve_dtype` / ``cast_params``):
bfloat16 parameters run every causal decoder, speculative decoding stays lossless against AR in
the same dtype, the KV cache follows the parameters, and a bfloat16 forward matches
transformers in bfloat16 within a stated tolerance."""

from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import generate
from jaxspec.core.drafters import NgramDrafter
from jaxspec.testing.tiny import tiny_model
from models.llama.modeling import CausalLM, param_dtype
from models.llama.params import load_hf_dir
from models.registry import PresetError, cast_params, resolve_dtype


def test_resolve_and_cast():
    assert resolve_dtype("float32") == jnp.float32 and resolve_dtype("bfloat16") == jnp.bfloat16
    assert resolve_dtype("auto") == (
        jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    )
    with pytest.raises(PresetError, match="unknown dtype 'fp8'"):
        resolve_dtype("fp8")
    _, params = tiny_model()
    p16 = cast_params({"params": params, "ids": np.arange(3)}, jnp.bfloat16)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(p16["params"]))
    assert p16["ids"].dtype == np.arange(3).dtype and param_dtype(p16["params"]) == jnp.bfloat16


def test_bf16_speculative_decoding_identical_to_bf16_ar():
    model, params = tiny_model(vocab=16)  # a 16-token vocabulary loops: drafts get accepted
    p16 = cast_params(params, jnp.bfloat16)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 8, 9]]
    ar = generate(model, p16, prompts, max_new_tokens=24, seed=4)
    ng = generate(model, p16, prompts, max_new_tokens=24, seed=4, drafter=NgramDrafter(3, 16))
    assert ng.tokens == ar.tokens and all(len(t) == 24 for t in ar.tokens)
    assert ng.stats.target_nfe.sum() < ar.stats.target_nfe.sum()  # drafts were accepted


def test_bf16_matches_transformers_bf16(tiny_llama):
    torch = pytest.importorskip("torch")
    cfg, params = load_hf_dir(tiny_llama.path)
    p16 = cast_params(params, jnp.bfloat16)
    tokens = np.random.RandomState(3).randint(0, cfg.vocab_size, size=(2, 9))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((9, 9), bool)), (2, 9, 9))
    pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
    ours16, _ = CausalLM(cfg).apply({"params": p16}, jnp.asarray(tokens), pos, mask)
    ours32, _ = CausalLM(cfg).apply({"params": params}, jnp.asarray(tokens), pos, mask)
    hf16 = copy.deepcopy(tiny_llama.model).to(torch.bfloat16)  # the fixture's model is shared
    with torch.no_grad():
        ref16 = hf16(torch.as_tensor(tokens)).logits.float().numpy()
    assert ours16.dtype == jnp.float32  # logits are float32 in every dtype
    scale = float(np.abs(ours32).max())
    d_ref = float(np.abs(np.asarray(ours16) - ref16).max())
    d_f32 = float(np.abs(np.asarray(ours16) - np.asarray(ours32)).max())
    print(f"bf16 vs transformers bf16 {d_ref:.3g}, vs our f32 {d_f32:.3g}, |logit| max {scale:.3g}")
    # bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.0039): two bf16
    # implementations that round at different points differ by a few steps of the logit scale
    assert d_ref < 0.05 * scale and d_f32 < 0.05 * scale


def test_bf16_dllm_cache_follows_params_and_ssd_stays_lossless():
    """Masked-diffusion decoding in bfloat16: the Fast-dLLM block cache holds bfloat16
    keys/values, and SSD (dual cache) gives the tokens of bf16 one-token-per-step stepwise
    decoding."""
    from jaxspec.dllm import DiffusionDecodeConfig, SSDConfig, diffusion_generate, ssd_generate
    from jaxspec.dllm.blocks import BlockCache
    from jaxspec.testing.tiny import tiny_diffusion_model

    model, params = tiny_diffusion_model("llada")
    p16 = cast_params(params, jnp.bfloat16)
    cache = BlockCache.start(model, 2, 16, 2, True, p16)
    assert cache.kv.k.dtype == jnp.bfloat16
    assert BlockCache.start(model, 2, 16, 2, True, params).kv.k.dtype == jnp.float32
    prompts = [[5, 6, 7, 8, 9, 10, 11], [3, 1, 4]]
    cfg = DiffusionDecodeConfig(gen_length=16, block_length=8, steps=16, cache="dual")
    ref = diffusion_generate(model, p16, prompts, cfg)
    ssd = ssd_generate(model, p16, prompts, SSDConfig(cfg, 3))
    assert np.array_equal(np.asarray(ssd.full_tokens), np.asarray(ref.full_tokens))
