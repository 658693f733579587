"""The n-gram cost gate (:class:`jaxspec.core.drafters.CostGate`) and the per-machine choices of
the decode plan (:func:`jaxspec.causal.decode.decode_plan`, :func:`models.llama.layout.plan`):
the gate is lossless (greedy identity with AR
while it switches between verification and one-token steps; the enumerated joint under
sampling), its estimates follow its documented rule, and ``"auto"`` picks the timed layout."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import decode_plan, generate
from jaxspec.core.drafters import CostGate, DraftContext, Drafter, NgramDrafter
from jaxspec.core.sampling import SamplingConfig
from jaxspec.testing.distribution import check_distribution
from jaxspec.testing.tiny import tiny_model
from models.llama import layout
from models.llama.layout import DecodePlan
from tests.causal.test_decode import _exact_joint, _prompts


def _verifications(stats, k):
    return stats.drafts_proposed // k  # every verification sends k drafts (n-gram: fixed k)


# cost 3.5 takes the same branches as 2.0 (make test-all runs it)
@pytest.mark.parametrize("cost", [1.0, 2.0, pytest.param(3.5, marks=pytest.mark.slow)])
def test_gated_greedy_equals_ar_and_switches(cost):
    """Greedy output is AR's token for token at every gate cost. Cost 1 never withholds a
    draft (the ungated run's stats exactly); cost 2 and 3.5 withhold some (fewer
    verifications than ungated) and still verify some, so both branches and the switch back
    (``alpha`` observed on one-token steps) run."""
    model, params = tiny_model(64, seed=4)
    k = 4
    ng = NgramDrafter(k, 64, max_ngram=3, min_ngram=1)
    totals = np.zeros(2, int)  # verifications: gated, ungated
    for prompt in _prompts(64, seed=2):
        ar = generate(model, params, [prompt], max_new_tokens=40, bucket=16)
        plain = generate(model, params, [prompt], max_new_tokens=40, bucket=16, drafter=ng)
        gated = generate(
            model, params, [prompt], max_new_tokens=40, bucket=16, drafter=ng, gate=cost
        )
        assert gated.tokens == ar.tokens == plain.tokens
        assert gated.settings["verify_cost"] == cost
        v_gated, v_plain = _verifications(gated.stats, k), _verifications(plain.stats, k)
        assert (v_gated <= v_plain).all()
        if cost == 1.0:
            assert (gated.stats.target_nfe == plain.stats.target_nfe).all()
            assert (v_gated == v_plain).all()
        totals += [int(v_gated.sum()), int(v_plain.sum())]
    if cost > 1.0:  # some drafts withheld, some still verified
        assert 0 < totals[0] < totals[1], totals


def test_gate_withholds_and_resumes_on_one_prompt():
    """A prompt that repeats a phrase after a stretch of noise: the gate turns drafting off
    during the noise and back on once the first drafted token is right again."""
    model, params = tiny_model(64, seed=4)
    rng = np.random.default_rng(5)
    phrase = rng.integers(0, 64, 6).tolist()
    prompt = phrase * 4 + rng.integers(0, 64, 30).tolist() + phrase * 3
    k = 4
    ng = NgramDrafter(k, 64, max_ngram=3, min_ngram=1)
    ar = generate(model, params, [prompt], max_new_tokens=48, bucket=16)
    plain = generate(model, params, [prompt], max_new_tokens=48, bucket=16, drafter=ng)
    gated = generate(model, params, [prompt], max_new_tokens=48, bucket=16, drafter=ng, gate=2.0)
    assert gated.tokens == ar.tokens
    v_gated, v_plain = (
        int(_verifications(gated.stats, k)[0]),
        int(_verifications(plain.stats, k)[0]),
    )
    steps = int(gated.stats.steps[0])
    assert 0 < v_gated < v_plain, (v_gated, v_plain)
    assert v_gated < steps  # one-token steps happened between verifications


def test_gated_batch_rows_equal_single_rows():
    model, params = tiny_model(64, seed=4)
    prompts = _prompts(64, seed=3)
    ng = NgramDrafter(3, 64, max_ngram=3, min_ngram=1)
    batch = generate(model, params, prompts, max_new_tokens=20, bucket=16, drafter=ng, gate=2.5)
    for i, p in enumerate(prompts):
        single = generate(model, params, [p], max_new_tokens=20, bucket=16)
        assert single.tokens[0] == batch.tokens[i]


@pytest.mark.parametrize("cost", [1.6, 6.0])
def test_gated_sampling_distribution_exact(cost):
    """Sampled n-gram decoding behind the gate matches the enumerated joint. At cost 6 no
    draft is ever verified (``alpha * beta <= k < cost - 1``): every step is a one-token step
    inside the speculative loop, with the drafter and the gate's bookkeeping running."""
    V, k, N = 6, 3, 10_000
    cfg = SamplingConfig(temperature=1.0)
    model, params = tiny_model(V, seed=7, scale=6.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    exact = _exact_joint(model, params, prompt, k + 2, cfg)
    res = generate(
        model,
        params,
        [prompt] * N,
        max_new_tokens=k + 2,
        sampling=cfg,
        drafter=NgramDrafter(k, V, max_ngram=2, min_ngram=1),
        seed=11,
        bucket=8,
        gate=cost,
    )
    chk = check_distribution(res.tokens, exact)
    assert chk.passed, chk.why
    if cost > k + 1:
        assert int(res.stats.drafts_proposed.sum()) == 0
    else:
        assert 0.02 < res.stats.acceptance_rate < 0.95


def test_gate_estimates_follow_the_rule():
    """``update`` against the docstring's rule, by hand: after a verification ``alpha`` sees
    ``n >= 1`` and ``beta`` sees ``n`` where ``n >= 1``; after a one-token step ``alpha`` sees
    "emitted == first draft" and ``beta`` is kept; rows without a draft or inactive keep both."""
    g = CostGate(NgramDrafter(4, 16), verify_cost=2.0, decay=0.5)
    buf = jnp.asarray(
        [[1, 2, 3, 7, 0], [1, 2, 3, 9, 0], [1, 2, 3, 7, 0], [1, 2, 3, 7, 0]], jnp.int32
    )
    ctx = DraftContext(
        buffer=buf,
        length=jnp.full((4,), 3, jnp.int32),
        pad=jnp.zeros(4, jnp.int32),
        active=jnp.array([True, True, True, False]),
    )
    st = g.init_state((), ctx).replace(
        first=jnp.full((4,), 7, jnp.int32),
        had=jnp.array([True, True, False, True]),
        start=jnp.full((4,), 3, jnp.int32),
    )
    # a one-token step: rows 0 (emitted 7 == first) and 1 (9 != 7) observe alpha
    one = g.update((), st.replace(verified=jnp.array(False)), ctx, jnp.zeros(4, jnp.int32))
    np.testing.assert_allclose(one.alpha, [1.0, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(one.beta, [4.0] * 4)
    # a verification: row 0 accepted 2, row 1 accepted 0
    ver = g.update((), st.replace(verified=jnp.array(True)), ctx, jnp.array([2, 0, 3, 3]))
    np.testing.assert_allclose(ver.alpha, [1.0, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(ver.beta, [3.0, 4.0, 4.0, 4.0])
    # propose withholds where alpha * beta <= cost - 1 = 1
    ctx2 = ctx.replace(
        buffer=jnp.asarray([[1, 2, 1, 2, 1]] * 4, jnp.int32),
        length=jnp.full((4,), 5, jnp.int32),
        active=jnp.ones(4, bool),
    )
    low = ver.replace(alpha=jnp.array([1.0, 0.2, 0.3, 0.9]), beta=jnp.array([2.0, 4.0, 2.0, 1.0]))
    draft, st2 = g.propose((), low, ctx2, jax.random.PRNGKey(0), False)
    np.testing.assert_array_equal(draft.has_draft, [True, False, False, False])
    assert bool(st2.verified) and st2.had.all()


def test_gate_bad_settings_are_clear_errors():
    ng = NgramDrafter(3, 64)
    with pytest.raises(ValueError, match="verify_cost must be >= 1"):
        CostGate(ng, 0.5)
    with pytest.raises(ValueError, match="decay must be in"):
        CostGate(ng, 2.0, decay=1.0)
    model, params = tiny_model(64)
    with pytest.raises(ValueError, match="unknown gate 'fast'"):
        generate(model, params, [[1, 2, 3]], max_new_tokens=4, drafter=ng, gate="fast")
    from jaxspec.methods import get_method

    entry = get_method("ngram", "causal")
    with pytest.raises(ValueError, match="unknown --gate 'fast'"):
        entry.configure(gate="fast")
    with pytest.raises(ValueError, match="--gate must be >= 1"):
        entry.configure(gate="0.5")
    assert entry.configure(gate="2.5").gate == 2.5


def test_space_drafter_refused_by_the_gate():
    class Queries(Drafter):
        name, draft_length, vocab_size, query_slots = "space", 3, 64, 12

        def draft_queries(self, *a):
            raise AssertionError

    with pytest.raises(ValueError, match="draft queries"):
        CostGate(Queries(), 2.0)


def test_plan_picks_the_faster_layout(monkeypatch):
    """``"auto"`` keeps the layout whose timed ``k + 1``-row pass was faster, and the auto gate
    is that pass's cost over a one-token pass in the chosen layout (fake timings); under the
    scan loop nothing is timed and the gate is off; the gate wraps the drafter in
    ``generate``."""
    model, params = tiny_model(64)
    ng = NgramDrafter(4, 64)
    calls = []

    def fake(model, params, B, S, T, output_major, reps=5, store=None):
        calls.append((T, output_major))
        return {(5, False): 0.050, (5, True): 0.040, (1, True): 0.025, (1, False): 0.030}[
            (T, output_major)
        ]

    monkeypatch.setattr(layout, "pass_seconds", fake)
    # the decode path reads no environment: $JAXSPEC_VERIFY_LAYOUT is a command-line default
    monkeypatch.setenv("JAXSPEC_VERIFY_LAYOUT", "stored")
    kw = dict(batch=1, cache_slots=64, layer_loop="unrolled")
    plan = decode_plan(model, params, ng, gate="auto", **kw)
    assert plan.verify_layout == "output-major" and plan.verify_cost == 1.6
    assert plan.settings == {
        "verify_layout": "output-major",
        "step_layout": "output-major",
        "verify_s": {layout.layout_name(False): 0.050, "output-major": 0.040},
        "verify_cost": 1.6,
    }
    plan = decode_plan(model, params, ng, gate="off", verify_layout="stored", **kw)
    assert plan.verify_cost is None
    stored = layout.layout_name(False)  # "panels" where the CPU panel kernel runs them
    assert plan.settings == {"verify_layout": stored, "step_layout": "output-major"}
    # the gate weighs the stored verification pass against an output-major step
    assert (
        decode_plan(model, params, ng, gate="auto", verify_layout="stored", **kw).verify_cost == 2.0
    )
    # a model-based drafter is not gated by "auto"; a given cost gates any drafter
    from jaxspec.testing.drafters import TableDrafter

    assert decode_plan(model, params, TableDrafter(4, 64), gate="auto", **kw).verify_cost is None
    assert decode_plan(model, params, TableDrafter(4, 64), gate=1.5, **kw).verify_cost == 1.5
    calls.clear()
    plan = decode_plan(model, params, ng, gate="auto", batch=1, cache_slots=64, layer_loop="scan")
    assert plan.verify_cost is None and calls == []
    assert plan.settings == {"verify_layout": "stacked", "step_layout": "stacked"}
    # generate wraps the drafter in the plan's gate (greedy: AR's tokens either way)
    res = generate(
        model,
        params,
        [[1, 2, 3, 1, 2, 3]],
        max_new_tokens=8,
        drafter=ng,
        plan=DecodePlan(layer_loop="scan", verify_cost=2.0),
    )
    assert res.settings["verify_cost"] == 2.0
    assert (
        res.tokens
        == generate(
            model,
            params,
            [[1, 2, 3, 1, 2, 3]],
            max_new_tokens=8,
            plan=DecodePlan(layer_loop="scan"),
        ).tokens
    )
    with pytest.raises(ValueError, match="the plan holds the gate"):
        generate(
            model, params, [[1, 2]], max_new_tokens=4, drafter=ng, gate="auto", plan=DecodePlan()
        )
    with pytest.raises(ValueError, match="verify_cost must be >= 1"):
        DecodePlan(verify_cost=0.5)
    with pytest.raises(ValueError, match="unknown gate 'fast'"):
        decode_plan(model, params, ng, gate="fast")


def test_pass_seconds_times_once_per_key():
    model, params = tiny_model(64)
    a = layout.pass_seconds(model, params, 1, 32, 3, True, reps=1)
    n = layout.passes_timed()
    b = layout.pass_seconds(model, params, 1, 48, 3, True, reps=1)  # S is not in the key
    assert a == b > 0 and layout.passes_timed() == n
    layout.pass_seconds(model, params, 1, 32, 4, True, reps=1)
    assert layout.passes_timed() == n + 1


def test_pass_timings_kept_across_processes(tmp_path, monkeypatch):
    """With a store, a timing is written once and a later process (the per-process cache
    cleared) reuses it without compiling or timing, so its plan is the same; another model
    shape or layout is a new key, and an unreadable store is timed afresh."""
    model, params = tiny_model(64)
    store = tmp_path / "timings.json"
    monkeypatch.setattr("jaxspec.causal.decode.timing_store", lambda: store)
    monkeypatch.setattr(layout, "_PASS_SECONDS", {})
    ng = NgramDrafter(draft_length=2, vocab_size=64)
    first = decode_plan(model, params, ng, layer_loop="unrolled")
    table = json.loads(store.read_text())
    assert len(table) == 2 and all(layout.machine_id() in k for k in table)
    assert dict(first.verify_s) == {k.rsplit("|", 1)[1]: v for k, v in table.items()}
    monkeypatch.setattr(layout, "_PASS_SECONDS", {})  # a new process
    with monkeypatch.context() as m:
        m.setattr(layout, "_pass_jit", None)  # compiling a timed pass now would fail
        assert decode_plan(model, params, ng, layer_loop="unrolled") == first
    other, other_params = tiny_model(64, layers=3)
    layout.pass_seconds(other, other_params, 1, 32, 3, True, reps=1, store=store)
    layout.pass_seconds(model, params, 2, 32, 3, True, reps=1, store=store)
    assert len(json.loads(store.read_text())) == 4
    store.write_text("not json")
    monkeypatch.setattr(layout, "_PASS_SECONDS", {})
    assert layout.pass_seconds(model, params, 1, 32, 3, True, reps=1, store=store) > 0
    assert len(json.loads(store.read_text())) == 1


def test_auto_layout_untimed_for_large_weights(monkeypatch):
    """Weights over AUTO_LAYOUT_MAX_BYTES take the stored layout without timing (each timed
    layout would keep another per-layer copy of a large model)."""
    model, params = tiny_model(64)
    monkeypatch.setattr(layout, "AUTO_LAYOUT_MAX_BYTES", 1000)
    monkeypatch.setattr(layout, "pass_seconds", lambda *a, **k: pytest.fail("timed a large model"))
    plan = decode_plan(model, params, NgramDrafter(3, 64), layer_loop="unrolled")
    stored = layout.layout_name(False)
    assert plan.settings == {"verify_layout": stored, "step_layout": stored}
