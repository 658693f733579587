"""The decode layout (:func:`models.llama.modeling.unstack_layers`,
:func:`models.llama.layout.decode_layout`) and the decode plan
(:class:`models.llama.layout.DecodePlan`): per-layer weights and an unrolled layer loop compute
the same function as the stacked weights and the ``lax.scan``, and the decoders give identical
outputs with either loop and either weight layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import decode_plan, generate
from jaxspec.core import runtime
from jaxspec.core.drafters import NgramDrafter
from jaxspec.core.sampling import SamplingConfig
from jaxspec.dllm.config import DiffusionDecodeConfig
from jaxspec.dllm.decode import diffusion_generate
from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model, tiny_xlnet
from models.llama import layout, modeling
from models.llama.layout import DecodePlan, decode_layout, resolve_layer_loop
from models.llama.modeling import (
    KVCache,
    _write_cache,
    gemv_blocks,
    grow_cache,
    init_cache,
    output_major_product,
    unstack_layers,
)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # untied / tied LM head
@pytest.mark.parametrize("per_layer", [False, True])
def test_last_rows_are_the_full_passes_last_rows(per_layer, arch):
    """``last_rows`` (the prompt pass's LM head over the rows it needs) returns the full
    pass's last rows, hidden states and logits, and leaves the cache as the full pass does."""
    model, params = tiny_model(layers=2, arch=arch)
    assert ("lm_head" in params) == (arch == "llama")
    params = unstack_layers(params) if per_layer else params
    B, T, S = 2, 7, 10
    tok = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, 64)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    mask = jnp.broadcast_to(jnp.arange(S)[None, :] <= jnp.arange(T)[:, None], (B, T, S))
    args = (tok, pos, mask)
    kw = dict(cache=init_cache(model.config, B, S), cache_index=jnp.zeros((B,), jnp.int32))
    run = jax.jit(
        lambda p, n: model.apply({"params": p}, *args, **kw, last_rows=n), static_argnums=1
    )
    full, cache = run(params, None)
    for n in (1, 3, T):
        part, c = run(params, n)
        assert part.shape == (B, n, model.config.vocab_size)
        np.testing.assert_allclose(part, full[:, T - n :], rtol=1e-5, atol=1e-5)
        # the layers are the full pass's (XLA may fuse them differently: rounding)
        np.testing.assert_allclose(c.k, cache.k, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(c.v, cache.v, rtol=1e-5, atol=1e-5)
    hid, _ = model.apply({"params": params}, *args, **kw, return_hidden=True)
    part, _ = model.apply({"params": params}, *args, **kw, return_hidden=True, last_rows=2)
    np.testing.assert_allclose(part, hid[:, -2:], rtol=1e-6, atol=1e-6)
    for bad in (0, T + 1):
        with pytest.raises(ValueError, match="last_rows must be between 1 and the 7 input rows"):
            model.apply({"params": params}, *args, **kw, last_rows=bad)


@pytest.mark.parametrize("output_major", [False, True])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_unrolled_forward_equals_scanned(arch, output_major):
    model, params = tiny_model(arch=arch, layers=3)
    per_layer = unstack_layers(params, output_major)
    assert isinstance(per_layer["layers"], tuple) and len(per_layer["layers"]) == 3
    if output_major:
        np.testing.assert_array_equal(
            per_layer["layers"][1]["w_up_t"], params["layers"]["w_up"][1].T
        )
        assert "w_up" not in per_layer["layers"][1]
        # q/k/v fused into one (out, in) matrix (modeling.fuse_qkv): their rows in order
        want = jnp.concatenate([params["layers"][m][1].T for m in ("wq", "wk", "wv")], axis=0)
        np.testing.assert_array_equal(per_layer["layers"][1]["wqkv_t"], want)
        assert not {"wq_t", "wk_t", "wv_t", "wq", "wk", "wv"} & per_layer["layers"][1].keys()
    else:
        np.testing.assert_array_equal(per_layer["layers"][1]["wq"], params["layers"]["wq"][1])
    B, T, S = 2, 5, 12
    tok = jax.random.randint(jax.random.PRNGKey(0), (B, T), 0, 64)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    a, _ = model.apply({"params": params}, tok, pos, causal)
    b, _ = model.apply({"params": per_layer}, tok, pos, causal)
    # float32: XLA fuses the unrolled layers differently, so the sums round differently
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    # cached: keys written at slot 3 of a 12-slot cache, the same cache contents either way
    mask = jnp.arange(S)[None, None, :] <= (3 + jnp.arange(T))[None, :, None]
    mask = jnp.broadcast_to(mask, (B, T, S))
    cache = init_cache(model.config, B, S)
    idx = jnp.full((B,), 3, jnp.int32)
    a, ca = model.apply({"params": params}, tok, pos + 3, mask, cache=cache, cache_index=idx)
    b, cb = model.apply({"params": per_layer}, tok, pos + 3, mask, cache=cache, cache_index=idx)
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ca.k, cb.k, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ca.v, cb.v, rtol=2e-5, atol=2e-5)


def test_gemv_blocks_only_for_one_task_one_row_products_on_the_cpu(monkeypatch):
    monkeypatch.setattr(modeling, "ONE_TASK_BLOCKS", 4)
    assert gemv_blocks(1, 576, 576, "cpu") == 4  # SmolLM2-135M wo: one XLA:CPU task
    assert gemv_blocks(2, 576, 576, "cpu") == 1  # two rows: a matrix-matrix product
    assert gemv_blocks(1, 960, 576, "cpu") == 1  # fused q/k/v: already two tasks
    assert gemv_blocks(1, 578, 576, "cpu") == 1  # blocks must divide the rows
    assert gemv_blocks(1, 576, 576, "gpu") == 1
    monkeypatch.setattr(modeling, "ONE_TASK_BLOCKS", 1)
    assert gemv_blocks(1, 576, 576, "cpu") == 1


@pytest.mark.parametrize("lead", [(1,), (1, 1), (3,)])
def test_one_row_product_in_row_blocks_equals_the_plain_product(monkeypatch, lead):
    monkeypatch.setattr(modeling, "ONE_TASK_BLOCKS", 4)
    kx, kw = jax.random.split(jax.random.PRNGKey(3))
    x = jax.random.normal(kx, lead + (96,), jnp.float32)
    w_t = jax.random.normal(kw, (64, 96), jnp.float32)
    got = jax.jit(output_major_product)(x, w_t)
    assert got.shape == lead + (64,)
    np.testing.assert_allclose(got, np.asarray(x) @ np.asarray(w_t).T, rtol=1e-5, atol=1e-5)
    hlo = jax.jit(output_major_product).lower(x, w_t).compile().as_text()
    # one row: a batched product over 4 row blocks; several rows: the plain product
    assert ("lhs_batch_dims={0}" in hlo) == (lead != (3,))
    # a model's row_blocks (a DecodePlan knob) overrides the module default: 1 = plain
    plain = jax.jit(output_major_product, static_argnums=2).lower(x, w_t, 1).compile().as_text()
    assert "lhs_batch_dims={0}" not in plain


@pytest.mark.parametrize("sampled", [False, True])
def test_one_token_steps_identical_with_and_without_row_blocks(monkeypatch, sampled):
    """Every one-row product of the tiny model is a one-task shape, so at batch 1 its AR loop
    and the n-gram loop's one-token steps run each of them in row blocks (the plan's
    ``row_blocks``): the tokens equal the plain products' (greedy, and sampled with the same
    seeds), and greedy AR equals the stacked scan's."""
    model, params = tiny_model(layers=2)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9]]
    cfg = SamplingConfig(temperature=1.0, top_p=0.9) if sampled else SamplingConfig()
    drafters = {"ar": None, "ngram": NgramDrafter(3, 64, max_ngram=2, min_ngram=1)}
    outs = {}
    for blocks in (1, 4):
        plans = {
            "ar": DecodePlan(row_blocks=blocks),  # AR: output-major throughout
            "ngram": DecodePlan(verify_layout="stored", row_blocks=blocks),
        }
        outs[blocks] = {
            (name, seed, i): generate(
                model,
                params,
                [p],
                max_new_tokens=12,
                sampling=cfg,
                drafter=d,
                seed=seed,
                plan=plans[name],
            ).tokens
            for name, d in drafters.items()
            for seed in (0, 1, 2)
            for i, p in enumerate(prompts)
        }
    assert outs[1] == outs[4]
    if not sampled:
        scan = DecodePlan(layer_loop="scan")
        scan = [generate(model, params, [p], max_new_tokens=12, plan=scan).tokens for p in prompts]
        assert [outs[4][("ar", 0, i)] for i in range(len(prompts))] == scan


def test_decode_layout_walks_trees_and_leaves_xlnet_alone():
    _, params = tiny_model()
    out = decode_layout({"params": params}, "unrolled")
    assert isinstance(out["params"]["layers"], tuple)
    pair = decode_layout((params, np.zeros(3)), "unrolled")
    assert isinstance(pair[0]["layers"], tuple) and isinstance(pair[1], np.ndarray)
    assert decode_layout(params, "scan") is params
    assert "wo_t" in decode_layout(params, "unrolled", output_major=True)["layers"][0]
    # the split is cached per stacked tree: the second call returns the same arrays
    again = decode_layout(params, "unrolled")
    first = again["layers"][0]
    key = "wqkv_p" if "wqkv_p" in first else "wq"  # the CPU panel kernel's layout, else stored
    assert first[key] is decode_layout(params, "unrolled")["layers"][0][key]
    _, xparams = tiny_xlnet()
    leaves = jax.tree_util.tree_leaves(xparams)
    assert all(
        x is y
        for x, y in zip(jax.tree_util.tree_leaves(decode_layout(xparams, "unrolled")), leaves)
    )


@pytest.mark.parametrize("B", [1, 3])
def test_cache_writes_land_in_the_head_major_slots(B):
    """Keys ``(L, B, K, S, Dh)`` and slot-minor values ``(L, B, K, Dh, S)``: a write of ``T``
    new rows at per-row offsets lands where a NumPy loop puts it, and nowhere else."""
    L, K, S, Dh, T, layer = 3, 2, 10, 4, 3, 1
    new = np.random.default_rng(B).normal(size=(B, T, K, Dh)).astype(np.float32)
    index = np.array([2, 5, 0][:B], np.int32)
    keys, vals = np.zeros((L, B, K, S, Dh), np.float32), np.zeros((L, B, K, Dh, S), np.float32)
    for b in range(B):
        for t in range(T):
            keys[layer, b, :, index[b] + t, :] = new[b, t]
            vals[layer, b, :, :, index[b] + t] = new[b, t]
    got_k = _write_cache(
        jnp.zeros(keys.shape), jnp.asarray(new), jnp.int32(layer), jnp.asarray(index)
    )
    got_v = _write_cache(
        jnp.zeros(vals.shape),
        jnp.asarray(new),
        jnp.int32(layer),
        jnp.asarray(index),
        slot_minor=True,
    )
    np.testing.assert_array_equal(got_k, keys)
    np.testing.assert_array_equal(got_v, vals)


def test_grow_cache_keeps_every_slot_in_place():
    """The prompt pass's small cache grows to the loop's: slots keep their places, new ones are
    zero; shrinking is refused."""
    rng = np.random.default_rng(0)
    k = rng.normal(size=(2, 1, 3, 5, 4)).astype(np.float32)
    v = rng.normal(size=(2, 1, 3, 4, 5)).astype(np.float32)
    big = grow_cache(KVCache(k=jnp.asarray(k), v=jnp.asarray(v)), 9)
    assert big.size == 9 and big.k.shape == (2, 1, 3, 9, 4) and big.v.shape == (2, 1, 3, 4, 9)
    np.testing.assert_array_equal(big.k[:, :, :, :5], k)
    np.testing.assert_array_equal(big.v[..., :5], v)
    assert not np.any(big.k[:, :, :, 5:]) and not np.any(big.v[..., 5:])
    with pytest.raises(ValueError, match="cannot grow a 9-slot cache to 4 slots"):
        grow_cache(big, 4)


def test_auto_layer_loop_on_gpu_unrolls_when_the_copy_fits(monkeypatch):
    """``auto``: unrolled on CPU; on a GPU when the per-layer copy is small or fits the
    device's free memory (within AUTO_UNROLL_MEMORY_SHARE of it), and for a tree already split
    in place; scan on TPU. decode_layout weighs the stacked layer weights (split_bytes)."""
    _, params = tiny_model()
    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "auto")  # the machine's rule (tests/conftest.py)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert resolve_layer_loop("auto") == "unrolled"
    gib = 1 << 30
    monkeypatch.setattr(layout, "device_memory", lambda: (10 * gib, 24 * gib))  # host RAM
    assert resolve_layer_loop("auto", nbytes=9 * gib) == "unrolled"
    assert resolve_layer_loop("auto", nbytes=10 * gib) == "scan"  # 20 GiB > 0.8 of 24
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(layout, "device_memory", lambda: None)  # a backend without stats
    big = layout.AUTO_UNROLL_MAX_BYTES + 1
    assert resolve_layer_loop("auto", nbytes=1000) == "unrolled"
    assert resolve_layer_loop("auto", nbytes=big) == "scan"
    assert resolve_layer_loop("auto") == "scan"  # size unknown: the loop that needs no copy
    assert resolve_layer_loop("unrolled", nbytes=10**12) == "unrolled"  # asked for: kept
    monkeypatch.setattr(layout, "device_memory", lambda: (15 * gib, 80 * gib))  # a 7B, H100
    assert resolve_layer_loop("auto", nbytes=15 * gib) == "unrolled"
    assert resolve_layer_loop("auto", nbytes=26 * gib) == "scan"  # 41 GiB > half of 80
    assert layout.split_bytes(params) == layout.tree_nbytes(params["layers"])
    assert layout.split_bytes({"params": params, "x": np.zeros(3)}) == layout.split_bytes(params)
    assert isinstance(decode_layout(params, "auto")["layers"], tuple)
    monkeypatch.setattr(layout, "AUTO_UNROLL_MAX_BYTES", 0)
    monkeypatch.setattr(layout, "_UNSTACKED", [])  # no copy made yet
    monkeypatch.setattr(
        layout, "device_memory", lambda: (gib, gib + layout.split_bytes(params) - 1)
    )
    assert decode_layout(params, "auto") is params
    # a copy an earlier decode made is reused even when a second one would not fit
    made = decode_layout(params, "unrolled", output_major=True)["layers"]
    assert decode_layout(params, "auto", output_major=True)["layers"] is made
    assert layout.split_bytes(params, output_major=True) == 0
    split = unstack_layers(params)
    assert layout.split_bytes(split) == 0 and layout.tree_layer_loop(split) == "unrolled"
    assert layout.tree_layer_loop(params) == "scan"
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert resolve_layer_loop("auto", nbytes=1000) == "scan"
    assert layout.tree_layer_loop(split, "scan") == "unrolled"  # nothing stacked to scan


def test_decode_layout_in_place_splits_once_and_deletes_the_stacked_weights(monkeypatch):
    """On a GPU (faked) the stacked layer weights are split into per-layer arrays and deleted;
    every decoder then runs on the one copy: greedy AR and n-gram outputs, and sampled n-gram
    outputs of one seed, equal the stacked tree's, and verification runs on the split layout
    untimed. On the CPU nothing changes."""
    model, params = tiny_model(layers=3)
    keep = jax.tree_util.tree_map(jnp.array, params)  # an independent stacked copy
    assert layout.decode_layout_in_place(params, "unrolled") is params  # CPU: the loops split
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert layout.decode_layout_in_place(params, "scan") is params
    stacked = params["layers"]["w_up"]
    split = layout.decode_layout_in_place({"params": params}, "unrolled")["params"]
    assert stacked.is_deleted() and not params["embed"].is_deleted()
    assert split["embed"] is params["embed"] and len(split["layers"]) == 3
    want = unstack_layers(keep, output_major=True)["layers"]  # the AR loop's layout
    for got, ref in zip(split["layers"], want, strict=True):
        assert got.keys() == ref.keys()
        for key in ref:
            np.testing.assert_array_equal(got[key], ref[key])
    assert "wqkv_t" in split["layers"][0] and layout.split_layout(split) == "output-major"
    assert layout.decode_layout_in_place(split, "unrolled") is split  # nothing left to split
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 3, 9, 3]]
    kw = dict(max_new_tokens=12, eos_ids=())
    ref = generate(model, keep, prompts, **kw).tokens
    assert generate(model, split, prompts, **kw).tokens == ref
    res = generate(model, split, prompts, drafter=NgramDrafter(3, 64), **kw)
    assert res.tokens == ref
    assert res.settings["verify_layout"] == "output-major" and "verify_s" not in res.settings
    # sampled: the same draws as on the stacked tree (whose distribution test_decode checks)
    samp = dict(kw, sampling=SamplingConfig(temperature=1.0), seed=3, drafter=NgramDrafter(3, 64))
    assert (
        generate(model, split, prompts, **samp).tokens
        == generate(model, keep, prompts, **samp).tokens
    )
    # on the CPU it splits when a copy would not fit the host's RAM (or when forced)
    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "auto")  # the machine's rule (tests/conftest.py)
    _, small = tiny_model(layers=2)
    monkeypatch.setattr(layout, "AUTO_UNROLL_MAX_BYTES", 0)
    monkeypatch.setattr(layout, "device_memory", lambda: (1 << 30, 1 << 33))
    assert layout.decode_layout_in_place(small, "unrolled") is small  # fits: per-call copies
    monkeypatch.setattr(layout, "device_memory", lambda: (1 << 30, 1 << 30))  # RAM full
    assert resolve_layer_loop("auto", nbytes=layout.split_bytes(small)) == "scan"
    assert layout.is_split(layout.decode_layout_in_place(small, "auto"))
    _, other = tiny_model(layers=2)
    assert layout.is_split(layout.decode_layout_in_place(other, "unrolled", force=True))


def test_unknown_layer_loop_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown layer loop 'fast'"):
        resolve_layer_loop("fast")
    with pytest.raises(ValueError, match="unknown layer loop 'fast'; choose one of scan, unr"):
        DecodePlan(layer_loop="fast")
    with pytest.raises(ValueError, match="unknown draft layer loop 'fast'"):
        DecodePlan(draft_loop="fast")
    model, params = tiny_model()
    with pytest.raises(ValueError, match="unknown layer loop 'fast'"):
        decode_plan(model, params, layer_loop="fast")
    # the command-line default, read from the environment in one place
    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "scan")
    assert layout.env_defaults()["layer_loop"] == "scan"
    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "fast")
    with pytest.raises(ValueError, match=r"unknown \$JAXSPEC_LAYER_LOOP 'fast'"):
        layout.env_defaults()


@pytest.mark.parametrize("sampled", [False, True])
def test_decoders_identical_with_either_layer_loop(monkeypatch, sampled):
    model, params = tiny_model()
    prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 6]]
    sampling = SamplingConfig(temperature=1.0 if sampled else 0.0)
    runs = {}
    for loop in ("scan", "unrolled"):
        plan = DecodePlan(layer_loop=loop, verify_layout="stored")
        ar = generate(
            model,
            params,
            prompts,
            max_new_tokens=12,
            sampling=sampling,
            seed=3,
            plan=DecodePlan(layer_loop=loop),
        )
        ng = generate(
            model,
            params,
            prompts,
            max_new_tokens=12,
            sampling=sampling,
            seed=3,
            drafter=NgramDrafter(3, 64),
            plan=plan,
        )
        stored = layout.layout_name(False)  # "panels" where the CPU panel kernel runs them
        assert ng.settings["verify_layout"] == ("stacked" if loop == "scan" else stored)
        runs[loop] = (ar.tokens, ng.tokens)
    assert runs["scan"] == runs["unrolled"]


@pytest.mark.parametrize("sampled", [False, True])
def test_verification_identical_in_either_verify_layout(monkeypatch, sampled):
    """A plan with ``verify_layout="output-major"`` hands the speculative loop output-major
    target weights (so does the AR loop, except at batch >= 2 on the CPU panel kernel; drafter
    trees never) and decodes the same tokens."""
    real, seen = layout.decode_layout, []

    def spy(tree, loop="auto", output_major=False):
        seen.append(output_major)
        return real(tree, loop, output_major)

    monkeypatch.setattr(layout, "decode_layout", spy)
    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "unrolled")
    model, params = tiny_model()
    kw = dict(
        max_new_tokens=12,
        seed=3,
        drafter=NgramDrafter(3, 64),
        sampling=SamplingConfig(temperature=1.0 if sampled else 0.0),
    )
    prompts = [[1, 2, 3, 1, 2, 3, 1], [5, 6]]
    stored = generate(model, params, prompts, plan=DecodePlan(verify_layout="stored"), **kw)
    om = generate(model, params, prompts, plan=DecodePlan(verify_layout="output-major"), **kw)
    ar = generate(
        model, params, prompts, max_new_tokens=12, seed=3, sampling=kw["sampling"]
    )  # AR (planned here): output-major
    # per call: the target's verification layout, its one-token step layout when it differs
    # (output-major, the AR loop's), the drafter's; AR at batch 2 runs on panels where the
    # CPU panel kernel is active
    ar_om = layout.layout_name(False) != "panels"
    assert seen == [False, True, False, True, False, ar_om, False]
    assert om.tokens == stored.tokens
    if not sampled:  # greedy: token for token the reference decoder's output
        assert om.tokens == ar.tokens
    assert (om.stats.target_nfe == stored.stats.target_nfe).all()


def test_one_token_steps_of_a_speculative_loop_run_on_the_ar_layout(monkeypatch):
    """With stored-layout verification, the n-gram loop's steps without a draft run on the
    output-major weights (fused q/k/v) and its verification passes on the stored ones; the
    tokens are the AR loop's. Split in place, or with draft queries, one layout serves both."""
    import jaxspec.causal.decode as D

    real, traced = D.verify_step, []

    def spy(cfg, params, st, draft, key, pad):
        traced.append((draft.tokens.shape[1], "wqkv_t" in params["layers"][0]))
        return real(cfg, params, st, draft, key, pad)

    monkeypatch.setattr(D, "verify_step", spy)
    runtime.clear_compiled()
    model, params = tiny_model(layers=2)
    prompts, kw = [[1, 2, 3, 1, 2, 3, 1], [5, 6]], dict(max_new_tokens=12, eos_ids=())
    drafter = NgramDrafter(3, 64)
    plan = decode_plan(model, params, drafter, layer_loop="unrolled", verify_layout="stored")
    assert (plan.layer_loop, plan.verify_layout, plan.step_layout) == (
        "unrolled",
        "stored",
        "output-major",
    )
    ng = generate(model, params, prompts, drafter=drafter, plan=plan, **kw)
    assert ng.settings["step_layout"] == "output-major"
    assert sorted(set(traced)) == [(0, True), (3, False)]
    traced.clear()
    assert generate(model, params, prompts, plan=DecodePlan(), **kw).tokens == ng.tokens
    assert set(traced) == {(0, True)}  # AR: every step output-major
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    split = layout.decode_layout_in_place(params, "unrolled", output_major=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    traced.clear()
    res = generate(model, split, prompts, drafter=NgramDrafter(3, 64), **kw)
    assert res.settings["step_layout"] == layout.layout_name(False) and set(traced) == {
        (0, False),
        (3, False),
    }
    assert res.tokens == ng.tokens
    runtime.clear_compiled()


def test_sps_draft_model_drafts_on_the_ar_layout(monkeypatch):
    """An SPS draft model (``one_token_steps``) gets its weights output-major with fused
    q/k/v, and SPS stays token-identical to AR."""
    from jaxspec.causal.sps import DraftModelDrafter

    real, traced = DraftModelDrafter.propose, []

    def spy(self, params, *a, **k):
        traced.append("wqkv_t" in params["layers"][0])
        return real(self, params, *a, **k)

    monkeypatch.setattr(DraftModelDrafter, "propose", spy)
    runtime.clear_compiled()
    model, params = tiny_model(layers=2)
    dmodel, dparams = tiny_model(layers=1, seed=5)
    prompts, kw = [[1, 2, 3, 1, 2, 3, 1], [5, 6]], dict(max_new_tokens=10, eos_ids=())
    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "unrolled")  # the draft model's "auto" loop
    drafter = DraftModelDrafter(dmodel, 3)
    plan = decode_plan(model, params, drafter, dparams, verify_layout="stored")
    assert (plan.layer_loop, plan.draft_loop, plan.draft_layout) == (
        "unrolled",
        "unrolled",
        "output-major",
    )
    sps = generate(model, params, prompts, drafter=drafter, drafter_params=dparams, plan=plan, **kw)
    assert traced == [True]
    assert sps.tokens == generate(model, params, prompts, plan=DecodePlan(), **kw).tokens
    runtime.clear_compiled()


def test_unknown_verify_layout_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown verify layout 'fast'"):
        DecodePlan(verify_layout="fast")
    with pytest.raises(ValueError, match="unknown step layout 'fast'"):
        DecodePlan(step_layout="fast")
    model, params = tiny_model()
    with pytest.raises(ValueError, match="unknown verify layout 'fast'"):
        decode_plan(model, params, NgramDrafter(3, 64), verify_layout="fast")
    # the command-line default, read from the environment in one place
    monkeypatch.delenv("JAXSPEC_VERIFY_LAYOUT", raising=False)
    assert layout.env_defaults()["verify_layout"] == "auto"
    monkeypatch.setenv("JAXSPEC_VERIFY_LAYOUT", "output-major")
    assert layout.env_defaults()["verify_layout"] == "output-major"


def test_diffusion_decoder_identical_with_either_layer_loop(monkeypatch):
    model, params = tiny_diffusion_model()
    cfg = DiffusionDecodeConfig(8, 4, steps=8, remasking="random")
    out = {}
    for loop in ("scan", "unrolled"):
        monkeypatch.setenv("JAXSPEC_LAYER_LOOP", loop)
        out[loop] = diffusion_generate(model, params, [[3, 4, 5], [6]], cfg, seed=1).full_tokens
    np.testing.assert_array_equal(out["scan"], out["unrolled"])


def test_split_in_place_reuses_a_decode_copy_and_fixes_the_verify_layout(monkeypatch):
    """A per-layer copy a decode already made is kept by the in-place split (no second copy);
    an int8 tree splits like a float one (``_q_t`` matrices, shared scales) and decodes the
    same tokens; a verify layout other than the split one is a clear error."""
    from models.quant import quantize_params

    model, params = tiny_model(layers=2)
    made = decode_layout(params, "unrolled", output_major=True)["layers"]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    split = layout.decode_layout_in_place(params, "unrolled")
    assert split["layers"] is made and params["layers"]["wq"].is_deleted()

    _, fresh = tiny_model(layers=2)
    qp = quantize_params(fresh)
    keep = jax.tree_util.tree_map(jnp.array, qp)
    qsplit = layout.decode_layout_in_place(qp, "unrolled")
    assert layout.split_layout(qsplit) == "output-major" and "wqkv_q_t" in qsplit["layers"][0]
    assert qp["layers"]["wq_q"].is_deleted() and layout.split_bytes(qsplit) == 0
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    prompts, kw = [[5, 6, 7, 5, 6, 7, 5, 6]], dict(max_new_tokens=10, eos_ids=())
    ref = generate(model, keep, prompts, **kw).tokens
    assert generate(model, qsplit, prompts, **kw).tokens == ref
    ng = NgramDrafter(3, 64)
    with pytest.raises(ValueError, match="split in place as 'output-maj"):
        decode_plan(model, qsplit, ng, verify_layout="stored")
    with pytest.raises(ValueError, match="split in place as 'output-maj"):
        generate(model, qsplit, prompts, drafter=ng, plan=DecodePlan(verify_layout="stored"), **kw)
    plan = decode_plan(model, qsplit, ng, verify_layout="output-major")
    assert generate(model, qsplit, prompts, drafter=ng, plan=plan, **kw).tokens == ref
