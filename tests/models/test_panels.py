"""The CPU panel kernel (models/llama/panels.py): packing, parity with a float64 reference,
row independence, and the model computing the same function on panel weights."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.testing.tiny import (
    gguf_exact,
    kquant_matrix,
    q4_exact,
    q4_exact_params,
    q8_exact,
    tiny_model,
)
from models.llama import layout, panels
from models.llama.modeling import unstack_layers


def test_pack_round_trip_and_bad_shapes():
    w = np.arange(5 * 48, dtype=np.float32).reshape(5, 48)
    wp = panels.pack(w)
    assert wp.shape == (3, 5, 16) and wp[1, 2, 3] == w[2, 16 + 3]
    np.testing.assert_array_equal(panels.unpack(wp), w)
    np.testing.assert_array_equal(np.asarray(panels.pack(jnp.asarray(w))), wp)
    assert panels.packable(w) and not panels.packable(w[:, :40]) and not panels.packable(w[0])
    assert not panels.packable(w.astype(np.float16))
    with pytest.raises(ValueError, match="multiple of 16"):
        panels.pack(w[:, :40])


@pytest.mark.parametrize("K,N", [(7, 16), (64, 48), (576, 960), (1536, 576)])
@pytest.mark.parametrize("rows", [1, 2, 9, 16, 17, 40])
def test_kernel_matches_a_float64_product(kernel, K, N, rows):
    rng = np.random.default_rng(K * 1000 + N + rows)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    y = np.asarray(jax.jit(panels.panel_product)(jnp.asarray(x), jnp.asarray(panels.pack(w))))
    ref = x.astype(np.float64) @ w.astype(np.float64)
    assert y.shape == (rows, N) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-5 * np.sqrt(K))


def test_a_row_does_not_depend_on_the_rows_beside_it(kernel):
    """Each output is one ordered chain of multiply-adds: row i of a many-row call equals the
    same row alone, bit for bit (a verification pass's rows compute what one-row steps do)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((23, 576)).astype(np.float32))
    wp = jnp.asarray(panels.pack(rng.standard_normal((576, 960)).astype(np.float32)))
    f = jax.jit(panels.panel_product)
    many = np.asarray(f(x, wp))
    for i in (0, 5, 15, 16, 22):
        np.testing.assert_array_equal(np.asarray(f(x[i : i + 1], wp))[0], many[i])
    batched = np.asarray(f(x[:12].reshape(3, 4, 576), wp))  # leading axes flatten to rows
    np.testing.assert_array_equal(batched.reshape(12, 960), many[:12])
    mapped = np.asarray(jax.vmap(f, in_axes=(0, None))(x[:6].reshape(2, 3, 576), wp))
    np.testing.assert_array_equal(mapped.reshape(6, 960), many[:6])


def test_panel_product_errors_and_fallback(kernel):
    wp = jnp.zeros((2, 8, 16), jnp.float32)
    with pytest.raises(ValueError, match="x has 9 features, the panels 8"):
        panels.panel_product(jnp.zeros((1, 9)), wp)
    # bfloat16 takes XLA's einsum over the panels: the same product
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal((8, 32)).astype(np.float32)
    y = panels.panel_product(jnp.asarray(x, jnp.bfloat16), jnp.asarray(panels.pack(w)))
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), x @ w, rtol=0.05, atol=0.1)


def test_model_on_panel_weights_computes_the_same_logits(kernel):
    model, params = tiny_model(64)
    tokens = jnp.asarray([[3, 7, 1, 9, 4], [2, 2, 8, 5, 0]], jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(5), (2, 5))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (2, 5, 5))
    stacked = model.apply({"params": params}, tokens, pos, mask)[0]
    split = unstack_layers(params, panels=True)
    lp = split["layers"][0]
    assert "wqkv_p" in lp and "wo_p" in lp and "wq" not in lp
    on_panels = model.apply({"params": split}, tokens, pos, mask)[0]
    np.testing.assert_allclose(np.asarray(on_panels), np.asarray(stacked), rtol=1e-5, atol=1e-5)


def test_switch_turns_the_layout_off(kernel, monkeypatch):
    monkeypatch.setattr(panels, "PANELS", False)
    assert not panels.panels_active() and layout.layout_name(False) == "stored"
    monkeypatch.setattr(panels, "PANELS", None)
    monkeypatch.setenv(panels.ENV, "0")
    assert layout.layout_name(False) == "stored"
    monkeypatch.setenv(panels.ENV, "1")  # on wherever the kernel builds
    assert layout.layout_name(False) == "panels" and layout.layout_name(True) == "output-major"
    assert not panels.panels_active("gpu")
    # unset (auto): on where the CPU has AVX-512, or AVX2 and FMA (/proc/cpuinfo's flags)
    monkeypatch.delenv(panels.ENV)
    for flags, isa in (
        ("fpu sse sse4_2 avx", None),
        ("fpu sse avx2", None),
        ("fpu sse avx2 fma", "avx2"),
        ("fpu avx2 fma avx512f avx512bw", "avx512"),
    ):
        monkeypatch.setattr(panels, "_cpu_tag", lambda f=flags: f"model name : X\nflags : {f}")
        on = isa is not None
        assert panels.vector_isa() == isa and panels.panels_active() is on
        assert layout.layout_name(False) == ("panels" if on else "stored")


def test_decode_layout_packs_the_head_and_decodes_the_same(kernel):
    """On the CPU the stored decode layout holds panel layers and the LM head in panels
    (cached), for an untied (llama) and a tied (qwen2) head, and speculative decoding on it
    gives AR's greedy tokens."""
    from jaxspec.causal.decode import decode_plan, generate
    from jaxspec.core.drafters import NgramDrafter
    from models.llama.modeling import HEAD_PANELS

    _, tied = tiny_model(64, arch="qwen2")
    tied_tree = layout.decode_layout(tied, "unrolled")
    np.testing.assert_array_equal(
        np.asarray(panels.unpack(tied_tree[HEAD_PANELS])), tied["embed"].T
    )
    model, params = tiny_model(64)
    tree = layout.decode_layout(params, "unrolled")
    assert "wqkv_p" in tree["layers"][0] and tree[HEAD_PANELS].shape == (4, 32, 16)
    head = params["lm_head"] if params.get("lm_head") is not None else params["embed"].T
    np.testing.assert_array_equal(np.asarray(panels.unpack(tree[HEAD_PANELS])), head)
    assert layout.decode_layout(params, "unrolled")[HEAD_PANELS] is tree[HEAD_PANELS]
    assert HEAD_PANELS not in layout.decode_layout(params, "unrolled", output_major=True)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3]]
    ar = generate(model, params, prompts, max_new_tokens=16)
    drafter = NgramDrafter(4, 64)
    plan = decode_plan(model, params, drafter, verify_layout="stored", layer_loop="unrolled")
    ng = generate(model, params, prompts, max_new_tokens=16, drafter=drafter, plan=plan)
    assert ng.settings["verify_layout"] == "panels"
    assert ng.tokens == ar.tokens


def test_batched_steps_run_on_panels_and_decode_the_same(kernel, monkeypatch):
    """At batch >= 2 the AR loop and a speculative loop's one-token steps have several rows:
    the plan puts them on panels, and the tokens equal those of XLA's products."""
    from jaxspec.causal.decode import decode_plan, generate
    from jaxspec.core.drafters import NgramDrafter

    model, params = tiny_model(64)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3], [9, 8, 7, 6]]
    drafter = NgramDrafter(3, 64)
    kw = dict(batch=3, layer_loop="unrolled")
    ar_plan = decode_plan(model, params, **kw)
    ng_plan = decode_plan(model, params, drafter, verify_layout="stored", **kw)  # not timed
    assert ar_plan.settings == {"verify_layout": "panels", "step_layout": "panels"}
    assert ng_plan.settings["step_layout"] == "panels"
    assert decode_plan(model, params, batch=1, layer_loop="unrolled").step_layout == "output-major"
    ar = generate(model, params, prompts, max_new_tokens=12, plan=ar_plan)
    ng = generate(model, params, prompts, max_new_tokens=12, drafter=drafter, plan=ng_plan)
    monkeypatch.setattr(panels, "PANELS", False)
    xla = generate(model, params, prompts, max_new_tokens=12)
    assert ar.tokens == xla.tokens == ng.tokens


# --------------------------------------------------------------------------- Q4_1 panels


def test_q4_pack_round_trip_and_what_it_refuses():
    """A dequantized Q4_1 matrix packs into 0.75 bytes a weight and unpacks bit for bit
    (numpy and JAX); a matrix that is not exactly Q4_1 is refused (None), never rounded."""
    rng = np.random.default_rng(3)
    w = q4_exact(rng.standard_normal((64, 48)).astype(np.float32))
    wq = panels.pack_q4(w)
    assert wq.dtype == np.uint8 and wq.shape == (3, 2, panels.Q4_BYTES)
    assert panels.is_q4(wq) and not panels.is_q4(panels.pack(w))
    np.testing.assert_array_equal(panels.unpack_q4(wq).view(np.uint32), w.view(np.uint32))
    back = np.asarray(panels.unpack_q4(jnp.asarray(wq)))
    np.testing.assert_array_equal(back.view(np.uint32), w.view(np.uint32))
    np.testing.assert_array_equal(np.asarray(panels.pack_exact(jnp.asarray(w))), wq)
    nudged = w.copy()
    nudged[37, 5] = np.nextafter(nudged[37, 5], np.float32(np.inf))
    assert panels.pack_q4(nudged) is None  # one weight off the grid: the whole matrix
    assert panels.pack_q4(rng.standard_normal((64, 48)).astype(np.float32)) is None
    assert panels.pack_q4(w[:40]) is None and panels.pack_q4(w[:, :40]) is None
    assert panels.pack_q4(w.astype(np.float16)) is None
    assert panels.pack_exact(nudged).dtype == np.float32  # falls back to float32 panels
    constant = np.full((32, 16), 0.25, np.float32)  # d = 0 blocks
    np.testing.assert_array_equal(panels.unpack_q4(panels.pack_q4(constant)), constant)


@pytest.mark.parametrize("K,N", [(32, 16), (576, 960), (1536, 576)])
@pytest.mark.parametrize("rows", [1, 2, 9, 16, 17, 40])
def test_q4_kernel_equals_the_float_panels_bit_for_bit(kernel, K, N, rows):
    """The Q4_1 kernel rebuilds every weight exactly and sums in the float32 kernel's order:
    the same bits, for any row count (more than 16 rows take several passes over a panel)."""
    rng = np.random.default_rng(K + N + rows)
    w = q4_exact((rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((rows, K)).astype(np.float32))
    f = jax.jit(panels.panel_product)
    want = np.asarray(f(x, jnp.asarray(panels.pack(w))))
    got = np.asarray(f(x, jnp.asarray(panels.pack_q4(w))))
    assert got.shape == (rows, N)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match=f"x has {K + 1} features, the Q4_1 panels {K}"):
        panels.panel_product(jnp.zeros((1, K + 1)), jnp.asarray(panels.pack_q4(w)))
    fallback = panels.panel_product(x.astype(jnp.bfloat16), jnp.asarray(panels.pack_q4(w)))
    np.testing.assert_allclose(
        np.asarray(fallback, np.float32), want, rtol=0.05, atol=0.05 * np.abs(want).max()
    )


def test_mixed_qkv_panels_stay_three_products(kernel):
    """q/k/v panels of several kinds (float32 q, Q4_1 k/v here; Q4_K q/k and Q6_K v in a
    Q4_K_M file) are not fused: each keeps its own compact panels; one kind fuses."""
    from models.llama.modeling import fuse_qkv

    rng = np.random.default_rng(5)
    ws = {n: rng.standard_normal((32, 16 * c)).astype(np.float32) for n, c in [("wq", 2)]}
    ws["wk"] = q4_exact(rng.standard_normal((32, 16)).astype(np.float32))
    ws["wv"] = q4_exact(rng.standard_normal((32, 16)).astype(np.float32))
    lp = {n + "_p": jnp.asarray(panels.pack_exact(w)) for n, w in ws.items()}
    assert [panels.is_q4(lp[n + "_p"]) for n in ws] == [False, True, True]
    assert fuse_qkv(lp) is lp
    same = {**lp, "wq_p": jnp.asarray(panels.pack_exact(q4_exact(ws["wq"])))}
    fused = fuse_qkv(same)["wqkv_p"]
    assert panels.is_q4(fused) and fused.shape[0] == 4
    full = np.concatenate([q4_exact(ws["wq"]), ws["wk"], ws["wv"]], axis=1)
    np.testing.assert_array_equal(np.asarray(panels.unpack_q4(fused)), full)


def _assert_decodes_as_xla_on_panels(model, params, monkeypatch):
    """With quantized panels on, the plan runs one-token steps on panels at batch 1 (n-gram
    verifies on the stored layout), and greedy AR and n-gram give XLA's tokens."""
    from jaxspec.causal.decode import decode_plan, generate
    from jaxspec.core.drafters import NgramDrafter

    monkeypatch.setattr(panels, "Q4", True)
    plan = decode_plan(model, params, batch=1, layer_loop="unrolled")
    assert plan.settings == {"verify_layout": "panels", "step_layout": "panels"}
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3]]
    ar = generate(model, params, prompts, max_new_tokens=12, plan=plan)
    drafter = NgramDrafter(3, 64)
    ng_plan = decode_plan(model, params, drafter, verify_layout="stored", layer_loop="unrolled")
    assert ng_plan.step_layout == "stored"
    ng = generate(model, params, prompts, max_new_tokens=12, drafter=drafter, plan=ng_plan)
    monkeypatch.setattr(panels, "PANELS", False)
    xla = generate(model, params, prompts, max_new_tokens=12)
    assert ar.tokens == ng.tokens == xla.tokens


def test_q4_model_decodes_bit_identical_and_steps_on_panels(kernel, monkeypatch):
    """A model whose matrices are Q4_1-exact (as loaded from a Q4_1 GGUF) is laid out in
    Q4_1 panels: its logits equal those on float32 panels bit for bit; the plan runs its
    one-token steps on panels at batch 1 too; AR and n-gram decode XLA's greedy tokens."""

    model, params = tiny_model(64)
    params = q4_exact_params(params)
    assert layout.quantized_panels(params)
    assert not layout.quantized_panels(tiny_model(64)[1])  # random float32: not Q4_1
    tree = unstack_layers(params, panels=True)
    lp = tree["layers"][0]
    assert all(panels.is_q4(lp[k]) for k in ("wqkv_p", "wo_p", "w_up_p", "w_down_p"))
    tokens = jnp.asarray([[3, 7, 1, 9, 4], [2, 2, 8, 5, 0]], jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(5), (2, 5))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (2, 5, 5))
    on_q4 = np.asarray(model.apply({"params": tree}, tokens, pos, mask)[0])
    monkeypatch.setattr(panels, "Q4", False)
    assert not layout.quantized_panels(params)
    as_float = unstack_layers(params, panels=True)
    assert as_float["layers"][0]["wqkv_p"].dtype == jnp.float32
    on_float = np.asarray(model.apply({"params": as_float}, tokens, pos, mask)[0])
    np.testing.assert_array_equal(on_q4.view(np.uint32), on_float.view(np.uint32))
    _assert_decodes_as_xla_on_panels(model, params, monkeypatch)


def _assert_products_of_float_panels(w, wq, rng):
    """The kernel's products over panels ``wq`` of ``w`` equal the float32 panels' bit for
    bit at 1, 9 and 17 rows, and a row alone equals the same row among 9 or 17."""
    f = jax.jit(panels.panel_product)
    for rows in (1, 9, 17):
        x = jnp.asarray(rng.standard_normal((rows, w.shape[0])).astype(np.float32))
        want = np.asarray(f(x, jnp.asarray(panels.pack(w))))
        got = np.asarray(f(x, jnp.asarray(wq)))
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        one = np.asarray(f(x[:1], jnp.asarray(wq)))
        np.testing.assert_array_equal(one.view(np.uint32), got[:1].view(np.uint32))


def test_q8_panels_hold_a_q8_matrix_and_multiply_it_bit_for_bit(kernel):
    """Q8_0 (the SmolLM2 file's token embedding): packed at 1.125 bytes a weight, unpacked
    bit for bit, multiplied to the float32 panels' bits; non-Q8_0 matrices refused."""
    rng = np.random.default_rng(7)
    w = q8_exact(rng.standard_normal((96, 64)).astype(np.float32))
    assert panels.pack_q4(w) is None
    wq = panels.pack_q8(w)
    assert wq.dtype == np.int8 and wq.shape == (4, 3, panels.Q8_BYTES) and panels.is_q8(wq)
    np.testing.assert_array_equal(panels.unpack_q8(wq).view(np.uint32), w.view(np.uint32))
    back = np.asarray(panels.unpack_q8(jnp.asarray(wq)))
    np.testing.assert_array_equal(back.view(np.uint32), w.view(np.uint32))
    assert panels.pack_exact(w).dtype == np.int8
    np.testing.assert_array_equal(panels.unpack(panels.as_float_panels(wq)), w)
    assert panels.pack_q8(rng.standard_normal((96, 64)).astype(np.float32)) is None
    # a block whose largest |w| has the code -128 (d * 128): the full int8 range
    codes = rng.integers(-127, 128, (96, 64)).astype(np.float32)
    codes[::32][:, ::3] = -128
    d = np.repeat(rng.uniform(1e-3, 1e-2, (3, 64)).astype(np.float16), 32, axis=0)
    full = d.astype(np.float32) * codes
    np.testing.assert_array_equal(panels.unpack_q8(panels.pack_q8(full)), full)
    _assert_products_of_float_panels(w, wq, rng)
    with pytest.raises(ValueError, match="the Q8_0 panels 96"):
        panels.panel_product(jnp.zeros((1, 95)), jnp.asarray(wq))


def test_a_q8_embedding_gives_a_q8_head(kernel):
    """A tied embedding that is exactly Q8_0 (as in the SmolLM2 file) is packed as the
    decode layout's head in Q8_0 panels; logits equal those on a float32 head bit for bit."""
    from models.llama.modeling import HEAD_PANELS

    model, params = tiny_model(64, arch="qwen2")
    params = {**q4_exact_params(params), "embed": jnp.asarray(q8_exact(params["embed"].T).T)}
    tree = layout.decode_layout(params, "unrolled")
    assert panels.is_q8(tree[HEAD_PANELS])
    np.testing.assert_array_equal(
        np.asarray(panels.unpack_q8(tree[HEAD_PANELS])), np.asarray(params["embed"]).T
    )
    tokens = jnp.asarray([[3, 7, 1, 9]], jnp.int32)
    pos, mask = jnp.arange(4)[None], jnp.tril(jnp.ones((4, 4), bool))[None]
    on_q = np.asarray(model.apply({"params": tree}, tokens, pos, mask)[0])
    float_head = {**tree, HEAD_PANELS: panels.as_float_panels(tree[HEAD_PANELS])}
    on_f = np.asarray(model.apply({"params": float_head}, tokens, pos, mask)[0])
    np.testing.assert_array_equal(on_q.view(np.uint32), on_f.view(np.uint32))


def _zero_signed(a) -> np.ndarray:
    """float32 bits with -0.0 read as +0.0 (a packed block rebuilds -0 as +0: no product
    sees the difference, :func:`models.llama.panels._same_weights`)."""
    return (np.asarray(a, np.float32) + np.float32(0)).view(np.uint32)


def _unpack_any(wq):
    return panels.unpack_q4(wq) if panels.is_q4(wq) else panels.unpack_q8(wq)


@pytest.mark.parametrize(
    "kind,packed_as",
    [("Q4_K", "Q4_1"), ("Q6_K", "Q8/16"), ("Q5_0", "Q8/32"), ("Q4_0", "Q4_1")],
)
def test_other_gguf_block_formats_pack_exactly_and_multiply_bit_for_bit(kernel, kind, packed_as):
    """The blocks of a Q4_K_M file's Q4_K and Q6_K tensors and of Q5_0 / Q4_0 ones (made by
    ``gguf.quants``, k-quants from random blocks) are found from the float32 values alone:
    Q4_K and Q4_0 as Q4_1 panels (float32 d, m), Q5_0 as Q8 panels with a scale per 32
    inputs, Q6_K per 16. The panels rebuild every weight bit for bit (but for the sign of
    zero: Q5_0 / Q6_K blocks with d < 0 hold -0.0) and the kernel's products at 1, 9 and 17
    rows equal the float32 panels' bit for bit, with the -0.0 weights in those. One weight
    off the grid: float32 panels."""
    rng = np.random.default_rng(11)
    if kind.endswith("_K"):
        w = kquant_matrix(512, 48, kind, seed=3)
    else:
        w = gguf_exact((rng.standard_normal((512, 48)) / 20).astype(np.float32), kind)
    wq = panels.pack_exact(w)
    got_kind = "Q4_1" if panels.is_q4(wq) else f"Q8/{panels.q8_block(wq)}"
    assert got_kind == packed_as
    if kind in ("Q6_K", "Q5_0"):
        assert np.signbit(w[w == 0]).any()  # the -0.0 weights the claim is about
    np.testing.assert_array_equal(_zero_signed(_unpack_any(wq)), _zero_signed(w))
    np.testing.assert_array_equal(_zero_signed(_unpack_any(jnp.asarray(wq))), _zero_signed(w))
    np.testing.assert_array_equal(panels.unpack(panels.as_float_panels(wq)), _unpack_any(wq))
    _assert_products_of_float_panels(w, wq, rng)
    nudged = w.copy()
    nudged[300, 17] = np.nextafter(nudged[300, 17], np.float32(np.inf))
    assert panels.pack_exact(nudged).dtype == np.float32


def test_q8_16_panels_errors():
    """The 16-input Q8 panels: their layout, the named error of a wrong ``x``, the block sizes
    :func:`pack_q8` knows, and a matrix whose K is no multiple of 16."""
    w = kquant_matrix(256, 32, "Q6_K")
    wq = panels.pack_q8(w, panels.Q8_16_BLOCK)
    assert wq.dtype == np.int8 and wq.shape == (2, 16, panels.Q8_16_BYTES)
    assert panels.pack_q8(w) is None  # its 16-input blocks do not share a scale per 32
    with pytest.raises(ValueError, match="block must be 32 or 16, got 24"):
        panels.pack_q8(w, 24)
    assert panels.pack_q8(w[:248], panels.Q8_16_BLOCK) is None
    with pytest.raises(ValueError, match=r"the Q8 \(16-input block\) panels 256"):
        panels.panel_product(jnp.zeros((1, 255)), jnp.asarray(wq))


def test_a_q5_0_model_decodes_on_quantized_panels(kernel, monkeypatch):
    """A model loaded from a file like Qwen2.5-Coder-0.5B's Q4_K_M (Q5_0 q/k/up/gate, Q8_0
    head; here also Q4_0 v and Q8_0 o): quantized panels, q/k/v of two kinds left unfused;
    logits equal the float32 panels' bit for bit; one-token steps on panels at batch 1;
    greedy AR and n-gram give XLA's tokens."""

    model, params = tiny_model(64, arch="qwen2")
    kinds = {"wq": "Q5_0", "wk": "Q5_0", "wv": "Q4_0", "wo": "Q8_0", "w_gate": "Q5_0"}
    kinds.update(w_up="Q5_0", w_down="Q4_1")
    layers = {
        k: jnp.asarray(np.stack([gguf_exact(w, kinds[k]) for w in np.asarray(v)]))
        if k in kinds
        else v
        for k, v in params["layers"].items()
    }
    params = {**params, "layers": layers, "embed": jnp.asarray(q8_exact(params["embed"].T).T)}
    assert layout.quantized_panels(params)
    tree = unstack_layers(params, panels=True)
    lp = tree["layers"][0]
    assert "wqkv_p" not in lp and panels.is_q8(lp["wq_p"]) and panels.is_q4(lp["wv_p"])
    assert panels.is_q8(lp["wo_p"]) and panels.is_q8(lp["w_up_p"])
    tokens = jnp.asarray([[3, 7, 1, 9, 4]], jnp.int32)
    pos, mask = jnp.arange(5)[None], jnp.tril(jnp.ones((5, 5), bool))[None]
    on_q = np.asarray(model.apply({"params": tree}, tokens, pos, mask)[0])
    monkeypatch.setattr(panels, "Q4", False)
    as_float = unstack_layers(params, panels=True)
    assert as_float["layers"][0]["wqkv_p"].dtype == jnp.float32
    on_f = np.asarray(model.apply({"params": as_float}, tokens, pos, mask)[0])
    np.testing.assert_array_equal(on_q.view(np.uint32), on_f.view(np.uint32))
    # the kernel reads the Q8 panels in place: no int8 op over a whole panel in the program
    # (modeling._after once copied every one every pass, 25 of 51 ms of a Qwen-0.5B step)
    hlo = jax.jit(model.apply).lower({"params": tree}, tokens, pos, mask).compile().as_text()
    assert "jaxspec_panel_matmul_q8" in hlo
    assert not re.search(r"= s8\[\d+,\d+,\d+\]\S* (add|fusion|copy)\(", hlo)
    _assert_decodes_as_xla_on_panels(model, params, monkeypatch)


def test_the_avx2_build_computes_the_same_bits(kernel):
    """The kernel built for AVX2 (``-march=haswell``: 12 float32 / Q8_0 and 10 Q4_1 rows a
    pass, a panel row as two ymm halves, one half a pass past 6 / 5 rows) gives the native
    build's products bit for bit, for float32, Q4_1 and Q8_0 panels (on an AVX2 machine the
    native build is that code path)."""
    import ctypes
    import pathlib

    if "avx2" not in pathlib.Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2")
    lib = ctypes.CDLL(str(panels.build(arch="haswell")))
    symbols = {
        "": "JaxspecPanelMatmul",
        "_q4": "JaxspecPanelMatmulQ4",
        "_q8": "JaxspecPanelMatmulQ8",
    }
    for kind, symbol in symbols.items():
        jax.ffi.register_ffi_target(
            f"test_avx2{kind}", jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
        )
    rng = np.random.default_rng(11)
    w4 = q4_exact(rng.standard_normal((576, 96)).astype(np.float32))
    w8 = q8_exact(rng.standard_normal((576, 96)).astype(np.float32))
    for rows in (1, 3, 4, 5, 6, 7, 9, 17):
        x = jnp.asarray(rng.standard_normal((rows, 576)).astype(np.float32))
        for kind, wp in (
            ("", panels.pack(w4)),
            ("_q4", panels.pack_q4(w4)),
            ("_q8", panels.pack_q8(w8)),
        ):
            out = jax.ShapeDtypeStruct((rows, 96), jnp.float32)
            avx2 = jax.ffi.ffi_call(f"test_avx2{kind}", out)(x, jnp.asarray(wp))
            native = panels.panel_product(x, jnp.asarray(wp))
            np.testing.assert_array_equal(
                np.asarray(avx2).view(np.uint32), np.asarray(native).view(np.uint32)
            )


def test_a_quantized_draft_model_steps_on_panels(kernel):
    """SPS's draft model in quantized panels (Q4_1-exact here) drafts on panels, not on
    output-major float32 weights; SPS stays token-identical to AR."""
    from jaxspec.causal.decode import decode_plan, generate
    from jaxspec.causal.sps import DraftModelDrafter

    model, params = tiny_model(layers=2)
    dmodel, dparams = tiny_model(layers=1, seed=5)
    dparams = q4_exact_params(dparams)
    drafter = DraftModelDrafter(dmodel, 3)
    plan = decode_plan(model, params, drafter, dparams, layer_loop="unrolled")
    assert plan.draft_layout == "stored"
    prompts, kw = [[1, 2, 3, 1, 2, 3, 1], [5, 6]], dict(max_new_tokens=10, eos_ids=())
    sps = generate(model, params, prompts, drafter=drafter, drafter_params=dparams, plan=plan, **kw)
    assert sps.tokens == generate(model, params, prompts, **kw).tokens
