"""Decoders: AR baseline vs an uncached reference loop, speculative greedy identity,
sampling exactness against the enumerated joint distribution, bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import DecodeInputError, decode_plan, generate
from jaxspec.core.drafters import NgramDrafter
from jaxspec.core.sampling import SamplingConfig, process_logits
from jaxspec.testing.distribution import check_distribution, enumerate_chain
from jaxspec.testing.tiny import gguf_exact, q4_exact_params, tiny_model
from models.llama.layout import layout_name
from models.llama.modeling import MATRICES


@functools.partial(jax.jit, static_argnums=0)
def _forward(model, params, toks):
    T = toks.shape[1]
    pos = jnp.arange(T, dtype=jnp.int32)[None]
    mask = jnp.tril(jnp.ones((T, T), bool))[None]
    return model.apply({"params": params}, toks, pos, mask)[0]


_process = jax.jit(process_logits, static_argnums=1)


def _reference_greedy(model, params, prompt, n, eos=()):
    """Uncached greedy loop; the sequence is right-padded to a fixed length (a causal pass
    never looks right), so one compilation serves every step."""
    seq = list(prompt)
    out = []
    T = 128
    for _ in range(n):
        buf = np.zeros((1, T), np.int32)
        buf[0, : len(seq)] = seq
        logits = np.asarray(_forward(model, params, jnp.asarray(buf))[0, len(seq) - 1])
        t = int(np.argmax(logits))
        out.append(t)
        seq.append(t)
        if t in eos:
            break
    return out


def _prompts(vocab, seed=0):
    rng = np.random.default_rng(seed)
    base = [rng.integers(0, vocab, size=n).tolist() for n in (3, 9, 20)]
    return [b * 3 for b in base]  # repeated text gives the n-gram drafter matches


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ar_matches_uncached_reference(arch):
    model, params = tiny_model(64, arch=arch)
    prompts = _prompts(64)
    res = generate(model, params, prompts, max_new_tokens=24, bucket=16)
    for p, got in zip(prompts, res.tokens):
        assert got == _reference_greedy(model, params, p, 24)
    assert res.stats.nfe_per_token == 1.0
    assert res.stats.target_nfe.tolist() == [24, 24, 24]


@pytest.mark.parametrize("k,fallback", [(1, True), (3, True), (6, True), (4, False)])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ngram_greedy_identical_to_ar(arch, k, fallback):
    model, params = tiny_model(64, arch=arch, seed=1)
    prompts = _prompts(64, seed=2)
    ar = generate(model, params, prompts, max_new_tokens=40, bucket=16)
    sd = generate(
        model,
        params,
        prompts,
        max_new_tokens=40,
        bucket=16,
        drafter=NgramDrafter(k, 64, max_ngram=3, bigram_fallback=fallback),
    )
    assert sd.tokens == ar.tokens
    # the drafter must actually have helped somewhere, otherwise the test checks nothing
    assert sd.stats.accept_hist[:, 2:].sum() > 0
    assert (sd.stats.target_nfe <= ar.stats.target_nfe).all()


def test_eos_and_budget_cut():
    model, params = tiny_model(64, seed=3)
    prompts = _prompts(64, seed=4)
    ar = generate(model, params, prompts, max_new_tokens=30, bucket=16)
    eos = ar.tokens[1][5]  # a token the model does emit
    ref = [_reference_greedy(model, params, p, 30, eos=(eos,)) for p in prompts]
    for drafter in (None, NgramDrafter(4, 64)):
        res = generate(
            model, params, prompts, max_new_tokens=30, bucket=16, eos_ids=(eos,), drafter=drafter
        )
        assert res.tokens == ref
        assert res.tokens[1][-1] == eos and len(res.tokens[1]) <= 6


def test_batch_rows_independent_of_padding():
    model, params = tiny_model(64, seed=5)
    prompts = _prompts(64, seed=6)
    batch = generate(
        model, params, prompts, max_new_tokens=16, bucket=64, drafter=NgramDrafter(3, 64)
    )
    for i, p in enumerate(prompts):
        single = generate(
            model, params, [p], max_new_tokens=16, bucket=16, drafter=NgramDrafter(3, 64)
        )
        assert single.tokens[0] == batch.tokens[i]


def _exact_joint(model, params, prompt, n_new, cfg, eos=()):
    """Enumerate p(x_1..x_n | prompt) under the processed distribution of ``cfg``: uncached
    causal forwards of prompt + prefix from position 0 (no left padding), for every running
    prefix (outcomes end at the budget or after an EOS token, as :func:`generate` cuts
    them). Prefixes go in chunks of 512 rows right-padded to a multiple of 16 tokens (a
    causal pass never looks right), so one compilation serves every depth and prompt."""
    P = len(prompt)
    T = -(-(P + n_new) // 16) * 16
    chunk = 512

    def next_logprobs(prefixes):
        M, i = prefixes.shape
        out = []
        for a in range(0, M, chunk):
            part = prefixes[a : a + chunk]
            toks = np.zeros((chunk, T), np.int32)
            toks[: len(part), :P] = prompt
            toks[: len(part), P : P + i] = part
            logits = _forward(model, params, jnp.asarray(toks))[: len(part), P + i - 1]
            out.append(np.asarray(_process(logits, cfg)))
        return np.concatenate(out)

    return enumerate_chain(next_logprobs, n_new, eos_ids=eos)


def _sample(model, params, prompt, n_new, cfg, drafter, n, exact, **kw):
    """``(check, result)``: ``n`` sampled continuations of ``prompt`` (seed 11, bucket 8; ``kw``
    to :func:`generate`, e.g. ``plan``) checked against the enumerated joint ``exact``."""
    res = generate(
        model,
        params,
        [prompt] * n,
        max_new_tokens=n_new,
        sampling=cfg,
        drafter=drafter,
        seed=11,
        bucket=8,
        **kw,
    )
    return check_distribution(res.tokens, exact), res


@pytest.mark.parametrize(
    "cfg,k",
    [
        (SamplingConfig(temperature=1.0), 3),
        (SamplingConfig(temperature=0.8, top_k=4, top_p=0.9), 2),
    ],
)
def test_sampling_distribution_exact(cfg, k):
    """Speculative (n-gram) and AR sampling both match the enumerated joint distribution
    (:func:`jaxspec.testing.distribution.check_distribution`: no impossible outcome,
    chi-square, TV within the noise floor's quantile). ``k + 2`` new tokens: the bonus token
    of the first step after prefill lies inside the budget."""
    V, n_new, N = 6, k + 2, 10_000
    model, params = tiny_model(V, seed=7, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, n_new, cfg)
    assert abs(sum(exact.values()) - 1) < 1e-4
    results = {}
    for name, drafter in (
        ("ar", None),
        ("ngram", NgramDrafter(k, V, max_ngram=2, min_ngram=1)),
        ("ngram-nofb", NgramDrafter(k, V, max_ngram=3, min_ngram=1, bigram_fallback=False)),
        # 3-gram suffixes only: past the prompt most steps miss and draw from the bigram
        # fallback c(. | last token) (with min_ngram 1 a seen last token always matches)
        ("ngram-bigram", NgramDrafter(k, V, max_ngram=3, min_ngram=3)),
    ):
        chk, res = _sample(model, params, prompt, n_new, cfg, drafter, N, exact)
        results[name] = (chk, res.stats)
    for name, (chk, _) in results.items():
        assert chk.passed, (name, chk.why)
    for name in ("ngram", "ngram-nofb", "ngram-bigram"):
        st = results[name][1]
        assert 0.02 < st.acceptance_rate < 0.95, (name, st.acceptance_rate)  # accepted and rejected
        assert st.accept_hist[:, k + 1].sum() > 0, name  # all k accepted: bonus tokens drawn


@pytest.mark.parametrize("formats", ["Q4_1", "Q5_0/Q4_0/Q8_0"])
def test_sampling_distribution_exact_on_q4_panels(monkeypatch, formats):
    """A model whose matrices are exactly Q4_1 (as loaded from a Q4_1 GGUF file), or a mix of
    Q5_0 / Q4_0 / Q8_0 as in Qwen2.5-Coder's Q4_K_M files (Q8 panels, q/k/v of two kinds left
    unfused), decodes on the CPU kernel's quantized panels (steps and verification passes):
    AR and n-gram sampling still match the float32 model's enumerated joint distribution. The
    kernel is switched on (it is off by default on a CPU without AVX-512 or AVX2 + FMA)."""
    from models.llama import layout, panels

    monkeypatch.setattr(panels, "PANELS", True)
    try:
        panels.panels_active()
    except panels.KernelBuildError as e:
        pytest.skip(f"the panel kernel cannot be built here: {e}")
    V, k, N = 6, 3, 10_000
    model, params = tiny_model(V, seed=7, scale=6.0)
    if formats == "Q4_1":
        params = q4_exact_params(params)
    else:
        kinds = dict(wq="Q5_0", wk="Q5_0", wv="Q4_0", wo="Q8_0", w_gate="Q5_0", w_up="Q5_0")
        layers = {
            n: jnp.asarray(np.stack([gguf_exact(w, kinds.get(n, "Q4_0")) for w in np.asarray(v)]))
            if n in MATRICES
            else v
            for n, v in params["layers"].items()
        }
        params = {**params, "layers": layers}
    assert layout.quantized_panels(params)
    lp = layout.decode_layout(params, "unrolled")["layers"][0]
    if formats == "Q4_1":
        assert panels.is_q4(lp["wqkv_p"])
    else:
        assert "wqkv_p" not in lp and panels.is_q8(lp["wq_p"]) and panels.is_q4(lp["wv_p"])
    prompt, cfg = [1, 2, 3, 1, 2, 3, 1, 2], SamplingConfig(temperature=1.0)
    exact = _exact_joint(model, params, prompt, k + 2, cfg)
    for drafter in (None, NgramDrafter(k, V, max_ngram=2, min_ngram=1)):
        plan = decode_plan(
            model, params, drafter, batch=N, verify_layout="stored", layer_loop="unrolled"
        )
        assert plan.settings == {"verify_layout": "panels", "step_layout": "panels"}
        chk, _ = _sample(model, params, prompt, k + 2, cfg, drafter, N, exact, plan=plan)
        assert chk.passed, (drafter, chk.why)


@pytest.mark.parametrize("layout", ["output-major", "stored"])
def test_sampling_distribution_exact_with_output_major_verification(monkeypatch, layout):
    """The unrolled layer loop with verification on output-major weights
    (a :class:`models.llama.layout.DecodePlan`) samples the enumerated joint distribution too
    (the suite otherwise runs the scan loop, where the layout setting does not apply); so
    does verification on the stored weights with the one-token steps on output-major ones
    (two weight trees in one loop, ``settings["step_layout"]``)."""
    from jaxspec.causal.decode import decode_plan

    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "unrolled")
    V, k, N = 6, 3, 10_000
    cfg = SamplingConfig(temperature=1.0)
    model, params = tiny_model(V, seed=7, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, k + 2, cfg)
    drafter = NgramDrafter(k, V, max_ngram=2, min_ngram=1)
    plan = decode_plan(model, params, drafter, verify_layout=layout)
    chk, res = _sample(model, params, prompt, k + 2, cfg, drafter, N, exact, plan=plan)
    shown = layout_name(layout == "output-major")  # stored: "panels" with the CPU kernel
    assert (res.settings["verify_layout"], res.settings["step_layout"]) == (shown, "output-major")
    assert chk.passed, chk.why
    assert 0.02 < res.stats.acceptance_rate < 0.95


# the n-gram case runs one-token steps (no draft) and verification passes; AR's one-token steps
# alone are make test-all's
@pytest.mark.parametrize("method", [pytest.param("ar", marks=pytest.mark.slow), "ngram"])
def test_sampling_distribution_exact_at_batch_1_with_row_blocked_products(monkeypatch, method):
    """At batch 1 every one-token step's products of the tiny model run in row blocks
    (:func:`models.llama.modeling.output_major_product`; the many-row tests above take the
    plain product): 10,000 batch-1 decodes, one seed each, of AR and n-gram on the unrolled
    loop (one-token steps on the output-major layout) sample the enumerated joint."""
    from models.llama import modeling

    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "unrolled")
    V, k, N = 6, 3, 10_000
    cfg = SamplingConfig(temperature=1.0)
    model, params = tiny_model(V, seed=7, scale=6.0)
    c = model.config
    # the tiny model's one-row products are all one-task shapes, so all of them run in blocks
    assert all(
        modeling.gemv_blocks(1, m, kk, "cpu") == modeling.ONE_TASK_BLOCKS > 1
        for m, kk in [
            ((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, c.hidden_size),
            (c.hidden_size, c.num_heads * c.head_dim),
            (c.intermediate_size, c.hidden_size),
            (c.hidden_size, c.intermediate_size),
        ]
    )
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, k + 2, cfg)
    drafter = NgramDrafter(k, V, max_ngram=2, min_ngram=1) if method == "ngram" else None
    toks, proposed = [], 0
    for seed in range(N):
        res = generate(
            model,
            params,
            [prompt],
            max_new_tokens=k + 2,
            sampling=cfg,
            drafter=drafter,
            seed=seed,
            bucket=8,
        )
        toks += res.tokens
        proposed += int(res.stats.drafts_proposed.sum())
    chk = check_distribution(toks, exact)
    assert chk.passed, chk.why
    assert (proposed > 0) == (method == "ngram")


def test_sps_sampling_distribution_exact_with_the_draft_model_on_the_ar_layout(monkeypatch):
    """SPS under the unrolled loop: the draft model drafts on output-major weights
    (``one_token_steps``) while the target verifies on stored ones; the samples still follow
    the enumerated joint (the mutation suite runs SPS under the scan loop)."""
    from jaxspec.causal.decode import decode_plan
    from jaxspec.causal.sps import DraftModelDrafter

    monkeypatch.setenv("JAXSPEC_LAYER_LOOP", "unrolled")
    V, k, N = 6, 3, 10_000
    cfg = SamplingConfig(temperature=1.0)
    model, params = tiny_model(V, seed=7, scale=6.0)
    dmodel, dparams = tiny_model(V, layers=1, seed=3, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, k + 2, cfg)
    drafter = DraftModelDrafter(dmodel, k, cfg)
    res = generate(
        model,
        params,
        [prompt] * N,
        max_new_tokens=k + 2,
        sampling=cfg,
        drafter=drafter,
        drafter_params=dparams,
        seed=11,
        bucket=8,
        plan=decode_plan(model, params, drafter, dparams, verify_layout="stored"),
    )
    chk = check_distribution(res.tokens, exact)
    assert chk.passed, chk.why
    assert 0.02 < res.stats.acceptance_rate < 0.95


def test_seed_reproducible():
    model, params = tiny_model(64, seed=8)
    cfg = SamplingConfig(temperature=1.0, top_p=0.95)
    a = generate(
        model,
        params,
        _prompts(64),
        max_new_tokens=12,
        sampling=cfg,
        seed=5,
        drafter=NgramDrafter(3, 64),
        bucket=16,
    )
    b = generate(
        model,
        params,
        _prompts(64),
        max_new_tokens=12,
        sampling=cfg,
        seed=5,
        drafter=NgramDrafter(3, 64),
        bucket=16,
    )
    c = generate(
        model,
        params,
        _prompts(64),
        max_new_tokens=12,
        sampling=cfg,
        seed=6,
        drafter=NgramDrafter(3, 64),
        bucket=16,
    )
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def test_bad_input():
    model, params = tiny_model(64, ctx=64)
    with pytest.raises(DecodeInputError, match="exceeds the model's context"):
        generate(model, params, [[1] * 60], max_new_tokens=10)
    with pytest.raises(DecodeInputError, match="empty prompt"):
        generate(model, params, [[]], max_new_tokens=10)
    with pytest.raises(DecodeInputError, match="max_new_tokens"):
        generate(model, params, [[1]], max_new_tokens=0)
    with pytest.raises(DecodeInputError, match="token ids"):
        generate(model, params, [[1, 99]], max_new_tokens=4)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        generate(model, params, [[1]], max_new_tokens=4, drafter=NgramDrafter(2, 128))
    with pytest.raises(ValueError, match="draft length"):
        NgramDrafter(0, 64)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1, top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1, top_p=1.5)
