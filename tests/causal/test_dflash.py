"""DFlash (:mod:`jaxspec.causal.dflash`): the target's hidden-state option, greedy identity
with AR, the exact sampled distribution, the drafter's feature cache, bad input, and the
training objective (:mod:`jaxspec.training.dflash`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.testing.tiny import tiny_model
from models.llama.modeling import (CausalLM, init_cache, rms_norm, unstack_layers)


def _causal(T):
    return jnp.tril(jnp.ones((T, T), bool))[None]


@pytest.mark.parametrize("arch,stacked", [("llama", True), ("qwen2", False)])
def test_hidden_layers_match_a_separate_pass(arch, stacked):
    """A cached pass with ``hidden_layers`` returns the same logits as without it, and the
    residual stream after layer ``i`` equals (after the final norm) the output of a separate
    pass of the model cut to its first ``i + 1`` layers; both layer loops (scan over stacked
    weights, unrolled per-layer weights)."""
    model, params = tiny_model(64, arch=arch, layers=3, seed=4)
    toks = jnp.asarray([[5, 9, 2, 33, 7, 1, 8]])
    T = toks.shape[1]
    pos = jnp.arange(T)[None]
    run = params if stacked else unstack_layers(params)
    cache = init_cache(model.config, 1, T)
    ids = (2, 0, 1)
    plain, _ = model.apply({"params": run}, toks, pos, _causal(T), cache=cache,
                           cache_index=jnp.zeros((1,), jnp.int32))
    logits, _, hidden = model.apply({"params": run}, toks, pos, _causal(T), cache=cache,
                                    cache_index=jnp.zeros((1,), jnp.int32), hidden_layers=ids)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(plain))
    assert hidden.shape == (1, T, 3, model.config.hidden_size)
    for j, i in enumerate(ids):
        cut_cfg = model.config.replace(num_layers=i + 1)
        cut = dict(params, layers={k: v[:i + 1] for k, v in params["layers"].items()})
        want, _ = CausalLM(cut_cfg).apply({"params": cut}, toks, pos, _causal(T),
                                          return_hidden=True)
        got = rms_norm(hidden[:, :, j], params["final_norm"], model.config.rms_norm_eps)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    with pytest.raises(ValueError, match="hidden_layers"):
        model.apply({"params": params}, toks, pos, _causal(T), hidden_layers=(3,))
