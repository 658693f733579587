"""The decode-step probe (:mod:`jaxspec.bench.step_profile`) on a tiny config: its step rows
compute the same next token in every weight layout, its products-only and numpy rows count the
model's weight bytes, and the trace breakdown says which flag it needs."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxspec.bench import step_profile as sp
from models.config import ModelConfig

TINY = ModelConfig(
    arch="llama",
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    tie_embeddings=True,
    max_position_embeddings=256,
)


def test_rows_run_and_layouts_agree():
    rows, params = sp.cases(TINY, S=128)
    firsts = {n: np.asarray(f(*a)[0]) for n, (f, a, _) in rows.items() if n.startswith("step")}
    assert len(firsts) == 3
    ref = firsts.pop("step, stacked + lax.scan")
    for name, tok in firsts.items():  # the same function in every layout
        np.testing.assert_array_equal(tok, ref, err_msg=name)
    nbytes = (
        sum(x.nbytes for x in jax.tree_util.tree_leaves(params["layers"])) + params["embed"].nbytes
    )
    assert rows["products only, output-major"][2] == nbytes
    np_rows = sp._numpy_rows(params, hidden=TINY.hidden_size)
    matrices = sum(params["layers"][m].nbytes for m in sp.M.MATRICES) + params["embed"].nbytes
    assert np_rows["numpy, per matrix"][2] == matrices
    res = sp.measure({"products": rows["products only, output-major"]}, reps=2)
    assert res["products"][1] > 0


def test_verify_rows_agree_across_layouts():
    """The T-row forwards give the same tokens in both layouts, and numpy's products have
    the shapes of T columns."""
    rows, params = sp.cases(TINY, S=128)
    vr = sp.verify_rows(TINY, params, [1, 3], S=128)
    assert len(vr) == 10
    stored = sp.layout_name(False)  # "panels" where the CPU panel kernel runs them
    for T in (1, 3):
        a = np.asarray(vr[f"{T} rows: step, {stored}"][0](*vr[f"{T} rows: step, {stored}"][1])[0])
        b = np.asarray(
            vr[f"{T} rows: step, output-major"][0](*vr[f"{T} rows: step, output-major"][1])[0]
        )
        np.testing.assert_array_equal(a, b)
        f, args, _ = vr[f"{T} rows: products only, output-major"]
        g, gargs, _ = vr[f"{T} rows: products only, {stored}"]
        np.testing.assert_array_equal(np.asarray(f(*args)), np.asarray(g(*gargs)))
        assert np.asarray(f(*args)).shape == (T,)
        prods = vr[f"{T} rows: numpy, per matrix"][0]()
        assert all(p.shape[1] == T for p in prods)
    assert sp.measure({"v": vr["3 rows: step, output-major"]}, reps=1)["v"][1] > 0


def test_trace_breakdown_names_the_flag_it_needs(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(RuntimeError, match="xla_cpu_enable_xprof_traceme"):
        sp.trace_breakdown(TINY, S=128)


def test_withheld_ngram_loop_is_the_ar_loop_plus_drafting():
    """``--loops``: the n-gram loop behind a gate that withholds every draft verifies nothing
    (no proposals, one target pass per token) and decodes AR's tokens, so its time over the
    AR loop's is drafting and loop overhead alone."""
    params = sp.M.init_params(TINY, 0)
    ar = sp._loop_row(TINY, params, 24)()
    ng = sp._loop_row(TINY, params, 24, sp.withheld_ngram(TINY))()
    assert ng.tokens == ar.tokens and len(ar.tokens[0]) == 24
    assert int(ng.stats.drafts_proposed.sum()) == 0
    assert (ng.stats.target_nfe == ar.stats.target_nfe).all()
