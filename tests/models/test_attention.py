"""The CPU cached-attention kernel (models/llama/attention.py, kernels/cached_attention.cc):
parity with XLA's attention and a float64 reference, row independence (bit for bit), bad
input, and the model computing the same tokens with it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.testing.tiny import tiny_model
from models.llama import attention, panels
from models.llama.modeling import init_cache, unstack_layers


def _case(seed, L, B, K, S, Dh, H, T, p=0.6):
    rng = np.random.default_rng(seed)
    kc = rng.standard_normal((L, B, K, S, Dh)).astype(np.float32)
    vc = rng.standard_normal((L, B, K, Dh, S)).astype(np.float32)
    q = (2 * rng.standard_normal((B, T, H, Dh))).astype(np.float32)
    mask = rng.random((B, T, S)) < p
    return q, kc, vc, mask


def _float64_attention(q, keys, vals, mask, scale):
    """numpy float64: q (B, T, H, Dh), keys (B, K, S, Dh), vals (B, K, Dh, S), mask (B, T, S)
    -> (B, T, H * Dh); a row that sees nothing averages every slot."""
    B, T, H, Dh = q.shape
    G = H // keys.shape[1]
    out = np.zeros((B, T, H, Dh))
    for b in range(B):
        for t in range(T):
            seen = mask[b, t]
            for h in range(H):
                k = keys[b, h // G].astype(np.float64)
                s = k @ q[b, t, h].astype(np.float64) * scale
                s = np.where(seen, s, -np.inf) if seen.any() else np.zeros_like(s)
                w = np.exp(s - s.max())
                w /= w.sum()
                out[b, t, h] = vals[b, h // G].astype(np.float64) @ w
    return out.reshape(B, T, H * Dh)


@pytest.mark.parametrize(
    "L,B,K,S,Dh,H,T",
    [
        (3, 2, 3, 37, 64, 9, 5),  # SmolLM2's heads, a cache size off every vector width
        (2, 1, 1, 19, 8, 2, 3),  # the tiny models' head size
        (2, 1, 2, 100, 12, 4, 9),  # a head size off the vector width
        (1, 1, 3, 384, 64, 9, 1),  # a one-token step
        (2, 3, 2, 64, 16, 4, 11),  # batch 3, rows past one block of four
    ],
)
def test_matches_xla_and_a_float64_reference(kernel, L, B, K, S, Dh, H, T):
    q, kc, vc, mask = _case(S * T + Dh, L, B, K, S, Dh, H, T)
    mask[-1, 0] = False  # a row that sees nothing: the mean of the values, as a softmax gives
    scale = Dh**-0.5
    bias = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)[:, None, None]
    for li in range(L):
        got = np.asarray(
            attention.cached_attention(
                jnp.asarray(q), jnp.asarray(kc), jnp.asarray(vc), jnp.int32(li), mask, scale
            )
        )
        assert got.shape == (B, T, H * Dh) and got.dtype == np.float32
        ref = _float64_attention(q, kc[li], vc[li], mask, scale)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6)
        xla = attention.xla_attention(q, kc[li], vc[li], bias, scale)
        np.testing.assert_allclose(got, np.asarray(xla), rtol=0, atol=4e-6)


def test_a_row_does_not_depend_on_the_rows_beside_it_or_the_cache_size(kernel):
    """A query row's output is a function of its query and the slots it sees: alone, among
    other rows (in any block of the task split), or over a larger cache whose extra slots it
    does not see, the same bits (a verification pass's row equals the one-token step)."""
    L, B, K, S, Dh, H, T = 2, 2, 3, 50, 64, 9, 11
    q, kc, vc, _ = _case(7, L, B, K, S, Dh, H, T)
    slots = np.arange(S)
    q_slot = np.array([[30 + t for t in range(T)], [20 + t for t in range(T)]])
    mask = (slots[None, None, :] >= np.array([3, 0])[:, None, None]) & (
        slots[None, None, :] <= q_slot[:, :, None]
    )
    scale = Dh**-0.5

    def run(q, kc, vc, mask):
        return np.asarray(
            attention.cached_attention(
                jnp.asarray(q), jnp.asarray(kc), jnp.asarray(vc), jnp.int32(1), mask, scale
            )
        )

    many = run(q, kc, vc, mask)
    extra = 29  # more slots, unseen: a cache sized for another draft length
    kc2 = np.concatenate([kc, np.ones((L, B, K, extra, Dh), np.float32)], axis=3)
    vc2 = np.concatenate([vc, np.ones((L, B, K, Dh, extra), np.float32)], axis=4)
    mask2 = np.concatenate([mask, np.zeros((B, T, extra), bool)], axis=2)
    grown = run(q, kc2, vc2, mask2)
    np.testing.assert_array_equal(grown.view(np.uint32), many.view(np.uint32))
    for t in (0, 4, 5, 10):
        alone = run(q[:, t : t + 1], kc, vc, mask[:, t : t + 1])
        np.testing.assert_array_equal(alone.view(np.uint32), many[:, t : t + 1].view(np.uint32))


def test_bad_shapes_are_named(kernel):
    q, kc, vc, mask = _case(0, 2, 1, 2, 16, 8, 4, 3)
    with pytest.raises(ValueError, match="mask"):
        attention.cached_attention(q, kc, vc, jnp.int32(0), mask[:, :, :8], 0.3)
    with pytest.raises(ValueError, match="disagree"):
        attention.cached_attention(q, kc, vc[:, :, :, :4], jnp.int32(0), mask, 0.3)
    with pytest.raises(ValueError, match="disagree"):
        attention.cached_attention(q[:, :, :3], kc, vc, jnp.int32(0), mask, 0.3)
    with pytest.raises(ValueError, match="float32"):
        attention.cached_attention(q.astype(np.float16), kc, vc, jnp.int32(0), mask, 0.3)


def test_model_runs_it_unrolled_and_computes_the_same_function(kernel, monkeypatch):
    """The model's cached passes run the kernel in the unrolled decode layouts (panels and
    output-major; XLA's attention in the scan loop and with the switch off); logits match XLA's
    attention on the same weights, and a multi-row pass's rows equal one-row passes at the same
    places bit for bit."""
    model, params = tiny_model(64)
    tree = unstack_layers(params, panels=True)
    f32 = jnp.zeros((1,), jnp.float32)
    assert attention.kernel_applies(f32, True) and not attention.kernel_applies(f32, False)
    assert not attention.kernel_applies(f32.astype(jnp.bfloat16), True)
    B, S, T = 2, 24, 6
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (B, T)), jnp.int32)
    slots = jnp.broadcast_to(jnp.arange(T), (B, T))
    mask = jnp.arange(S)[None, None, :] <= slots[:, :, None]

    @jax.jit
    def run(tree, tokens, slots, mask, cache, index):
        return model.apply({"params": tree}, tokens, slots, mask, cache=cache, cache_index=index)

    cache = init_cache(model.config, B, S)
    zero = jnp.zeros((B,), jnp.int32)

    def hlo(t):
        def f(t, c):
            return model.apply({"params": t}, tokens, slots, mask, cache=c, cache_index=zero)[0]

        return jax.jit(f).lower(t, cache).as_text()

    assert panels.ATTENTION_TARGET in hlo(tree)
    assert panels.ATTENTION_TARGET in hlo(unstack_layers(params, output_major=True))
    assert panels.ATTENTION_TARGET not in hlo(params)  # stacked: the scan loop
    kern, kcache = run(tree, tokens, slots, mask, cache, zero)
    monkeypatch.setattr(attention, "KERNEL", False)
    xla, _ = jax.jit(
        lambda t, c: model.apply({"params": t}, tokens, slots, mask, cache=c, cache_index=zero)
    )(tree, cache)
    np.testing.assert_allclose(np.asarray(kern), np.asarray(xla), rtol=0, atol=1e-4)
    monkeypatch.setattr(attention, "KERNEL", True)
    # the last 3 rows again, one row per pass over the cache the first 3 rows wrote
    _, c3 = run(tree, tokens[:, :3], slots[:, :3], mask[:, :3], cache, zero)
    for t in range(3, T):
        one, c3 = run(
            tree, tokens[:, t : t + 1], slots[:, t : t + 1], mask[:, t : t + 1], c3, zero + t
        )
        np.testing.assert_array_equal(
            np.asarray(one)[:, 0].view(np.uint32), np.asarray(kern)[:, t].view(np.uint32)
        )


@pytest.mark.parametrize("arch", ["haswell", "x86-64"])
def test_other_vector_widths_match_the_reference(kernel, arch):
    """The kernel built for AVX2 (``-march=haswell``: 8 lanes; on an AVX-512 host not the
    native code path) and for baseline x86-64 (4 lanes, the generic reductions) computes the
    same function: within float64 reference tolerance, and rows independent bit for bit."""
    import ctypes
    import pathlib

    if arch == "haswell" and "avx2" not in pathlib.Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2")
    lib = ctypes.CDLL(str(panels.build(arch=arch)))
    target = f"test_attention_{arch.replace('-', '_')}"
    jax.ffi.register_ffi_target(
        target, jax.ffi.pycapsule(lib.JaxspecCachedAttention), platform="cpu"
    )
    L, B, K, S, Dh, H, T = 2, 2, 3, 45, 64, 9, 6
    q, kc, vc, mask = _case(3, L, B, K, S, Dh, H, T)
    mask[0, 1] = False
    scale = Dh**-0.5

    def run(q, mask):
        out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
        o = jax.ffi.ffi_call(target, out)(
            jnp.asarray(q),
            jnp.asarray(kc),
            jnp.asarray(vc),
            jnp.int32(1),
            jnp.asarray(mask),
            scale=np.float32(scale),
        )
        return np.asarray(o).reshape(q.shape[0], q.shape[1], -1)

    got = run(q, mask)
    ref = _float64_attention(q, kc[1], vc[1], mask, scale)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6)
    alone = run(q[:, 4:5], mask[:, 4:5])
    np.testing.assert_array_equal(alone.view(np.uint32), got[:, 4:5].view(np.uint32))
