"""The DFlash feature cache (``dflash.feature_cache``, :mod:`jaxspec.training.dflash_run`):
the target's feature-layer states of every row computed once into a ``.npy`` memory map and
read back by row instead of running the target every step.

On the tiny random target of ``tests/causal/test_dflash.py`` and its own greedy answers: a
float32 cache trains exactly as on-the-fly features (same losses, gradients, weights,
held-out rows), a float16 cache to a stated tolerance, a cache of another run is refused in
one line, resume continues the same schedule, and an interrupted build continues where it
stopped.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.testing.tiny import tiny_model
from jaxspec.training.config import TrainConfigError, config_from_dict
from jaxspec.training.dflash import dflash_loss, sample_anchors, target_features
from jaxspec.training.dflash_run import (
    DFlashRows,
    FeatureCache,
    build_feature_cache,
    build_rows,
    build_target,
    feature_cache_meta,
    train_dflash,
)
from tests.causal.test_dflash import _dflash_cfg, _distill_file

EOS = 0  # the EOS train_dflash appends for a target without eos_token_ids (the tiny one)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(64, seed=0)


def _distill(tmp_path, tiny):
    """The DFlash tests' distillation file (24 train rows, 4 val rows) with val rows that
    repeat train rows 8..11 instead of 0..3: the val rows' cache rows then differ from the
    first train rows'."""
    path, _, _ = _distill_file(tmp_path, *tiny)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    for r in rows[24:]:
        src = rows[r["i"] - 24 + 8]
        r.update(prompt=src["prompt"], answer=src["answer"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(path, cache=None, dtype="float16", steps=6, **dflash):
    """The tiny ``dflash`` config of the DFlash tests with a train / eval row every step."""
    d = _dflash_cfg(path, steps=steps, eval_every=2, log_every=1, ckpt_every=3).to_dict()
    d["dflash"].update(feature_cache=None if cache is None else str(cache), **dflash)
    d["dflash"]["feature_cache_dtype"] = dtype
    return config_from_dict(d)


def _rows(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "eval"]


def _run(cfg, out, tiny, **kw):
    return train_dflash(cfg, out, model_and_params=tiny, progress=False, **kw)


def _features(cfg, tiny):
    """On-the-fly features of every cache row (train rows, then val rows), float32."""
    model, params = tiny
    train, val, _ = build_rows(cfg, EOS, log=lambda m: None)
    tokens = np.concatenate([train.tokens, val.tokens])
    return np.asarray(target_features(model, params, jnp.asarray(tokens), (0, 1)))


def test_float32_cache_trains_as_on_the_fly_features(tmp_path, tiny):
    """A float32 cache holds the target's features of every row (train then val) and the
    run trained from it has the on-the-fly run's losses, gradient norms, held-out rows and
    weights to float32 round-off; the gradient of Eq. 4 on a batch whose features are
    gathered by the batch's row channel equals the gradient on on-the-fly features."""
    path = _distill(tmp_path, tiny)
    fly = _run(_cfg(path), tmp_path / "fly", tiny)
    cached = _run(_cfg(path, tmp_path / "f32.npy", "float32"), tmp_path / "c", tiny)

    feats = np.load(tmp_path / "f32.npy")
    assert feats.dtype == np.float32 and feats.shape == (28, 40, 2, 32)
    np.testing.assert_allclose(feats, _features(_cfg(path), tiny), rtol=1e-5, atol=1e-5)
    side = json.loads((tmp_path / "f32.json").read_text())
    assert side["done"] == 28 and side["train_rows"] == 24 and side["val_rows"] == 4

    (ft, fe), (ct, ce) = _rows(tmp_path / "fly"), _rows(tmp_path / "c")
    assert [r["step"] for r in ct] == [r["step"] for r in ft] == list(range(1, 7))
    for k in ("loss", "grad_norm", "masked_acc"):
        np.testing.assert_allclose([r[k] for r in ct], [r[k] for r in ft], rtol=1e-5, err_msg=k)
    assert [r["step"] for r in ce] == [r["step"] for r in fe] == [2, 4, 6]
    for k in ("val_loss", "val_masked_acc", "val_accepted"):
        np.testing.assert_allclose([r[k] for r in ce], [r[k] for r in fe], rtol=1e-5, err_msg=k)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
        cached["trainable"],
        fly["trainable"],
    )

    # the gather itself: batch rows -> cache rows -> the gradient of Eq. 4
    model, params = tiny
    cfg = _cfg(path)
    _, _, _, spec = build_target(cfg, model_and_params=tiny)
    train, _, _ = build_rows(cfg, EOS, log=lambda m: None)
    rows = DFlashRows(train.tokens, train.trainable, seed=0, row_base=0)
    b = rows.batch(5, 4)  # epoch 0 ends at sample 24: rows of two permutations
    np.testing.assert_array_equal(b[:, :2], train.batch(5, 4))
    tokens, trainable = jnp.asarray(b[:, 0]), jnp.asarray(b[:, 1].astype(bool))
    anchors, ok = sample_anchors(jax.random.PRNGKey(3), trainable, 8)
    shared = {"embed": params["embed"]}
    own = cached["trainable"]

    def grad(hidden):
        return jax.grad(
            lambda o: dflash_loss(spec, o, shared, tokens, hidden, trainable, anchors, ok, 4.0)[0]
        )(own)

    g_cache = grad(jnp.asarray(FeatureCache(tmp_path / "f32.npy").take(b[:, 2, 0])))
    g_fly = grad(target_features(model, params, tokens, (0, 1)))
    jax.tree.map(
        lambda a, c: np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-7), g_cache, g_fly
    )


def test_float16_cache_loss_within_tolerance(tmp_path, tiny):
    """The default float16 cache stores the features rounded to float16 (relative error
    <= 2^-11) and trains to the on-the-fly run's losses within 1e-4 relative (train and
    held-out, 6 steps)."""
    path = _distill(tmp_path, tiny)
    _run(_cfg(path), tmp_path / "fly", tiny)
    _run(_cfg(path, tmp_path / "f16.npy"), tmp_path / "c", tiny)
    feats = np.load(tmp_path / "f16.npy", mmap_mode="r")
    ref = _features(_cfg(path), tiny)
    assert feats.dtype == np.float16
    # float16 rounding (rtol 2^-11) on top of the float32 round-off between the cache's
    # row-by-row forwards and the batched reference (atol 1e-5, as the float32 test allows):
    # with XLA's products (no AVX-512: no panel kernel) a feature of 2.8e-4 differed by 1.8e-6
    np.testing.assert_allclose(feats.astype(np.float32), ref, rtol=2.0**-11, atol=1e-5)
    (ft, fe), (ct, ce) = _rows(tmp_path / "fly"), _rows(tmp_path / "c")
    np.testing.assert_allclose([r["loss"] for r in ct], [r["loss"] for r in ft], rtol=1e-4)
    np.testing.assert_allclose([r["val_loss"] for r in ce], [r["val_loss"] for r in fe], rtol=1e-4)


def test_cache_of_another_run_is_refused(tmp_path, tiny):
    """A cache whose sidecar records other layer ids, other data or another dtype is refused
    before the run opens, with one line naming the field; so are a path that is not ``.npy``
    and an unknown dtype."""
    path = _distill(tmp_path, tiny)
    cache = tmp_path / "feats.npy"
    res = _run(_cfg(path, cache, steps=1), tmp_path / "a", tiny)
    assert res["step"] == 1

    def refused(cfg, match):
        with pytest.raises(TrainConfigError, match=match) as e:
            _run(cfg, tmp_path / "b", tiny)
        assert "\n" not in str(e.value)
        assert not (tmp_path / "b" / "checkpoints").exists()  # nothing opened
        return str(e.value)

    msg = refused(_cfg(path, cache, layer_ids=[1]), "built for another layer_ids")
    assert msg == (
        f"dflash.feature_cache {cache} was built for another layer_ids ([0, 1]; this run: "
        f"[1]): delete feats.npy and feats.json or name another file"
    )
    other = tmp_path / "other.jsonl"
    lines = path.read_text().splitlines()
    other.write_text("\n".join(lines[1:]) + "\n")  # one train row fewer
    refused(_cfg(other, cache), "built for another data_sha256")
    refused(_cfg(path, cache, dtype="float32"), "built for another dtype")
    refused(_cfg(path, tmp_path / "feats.bin"), "must name a .npy file")
    refused(_cfg(path, tmp_path / "x.npy", dtype="int8"), "feature_cache_dtype must be one of")


def test_resume_with_cache_continues_the_schedule(tmp_path, tiny):
    """A cached run stopped after 3 steps and resumed ends with the uninterrupted cached
    run's weights and metrics rows, and the resumed run reads the cache without rebuilding
    it."""
    path = _distill(tmp_path, tiny)
    cache = tmp_path / "feats.npy"
    cfg = _cfg(path, cache)
    whole = _run(cfg, tmp_path / "whole", tiny)
    stamp = cache.stat().st_mtime_ns, (tmp_path / "feats.json").stat().st_mtime_ns
    part = _run(cfg, tmp_path / "part", tiny, stop_after=3)
    assert part["step"] == 3
    logs = []
    rest = _run(cfg, tmp_path / "part", tiny, resume=True, log=logs.append)
    assert rest["step"] == 6 and any("resumed from step 3" in m for m in logs)
    assert not any("to compute" in m for m in logs)
    assert (cache.stat().st_mtime_ns, (tmp_path / "feats.json").stat().st_mtime_ns) == stamp
    jax.tree.map(np.testing.assert_array_equal, rest["trainable"], whole["trainable"])
    timing = ("sec_per_step", "tokens_per_sec")
    (pt, pe), (wt, we) = _rows(tmp_path / "part"), _rows(tmp_path / "whole")
    assert pe == we
    assert [{k: v for k, v in r.items() if k not in timing} for r in pt] == [
        {k: v for k, v in r.items() if k not in timing} for r in wt
    ]


def test_interrupted_build_continues(tmp_path, tiny, monkeypatch):
    """A build stopped by its time budget records the rows it flushed; rows past that count
    (garbage here) are recomputed on the next call, which ends with the cache a single build
    writes; so does a build stopped by Ctrl-C (it records the rows written). Without its
    ``.npy`` the sidecar's count is ignored and the build starts over. Through
    ``train_dflash``: a budget spent on the cache runs no step, and the rerun finishes the
    cache and trains."""
    model, params = tiny
    path = _distill(tmp_path, tiny)
    cfg = _cfg(path, tmp_path / "x.npy")
    _, _, _, spec = build_target(cfg, model_and_params=tiny)
    train, val, _ = build_rows(cfg, EOS, log=lambda m: None)
    meta = feature_cache_meta(cfg, spec, model, params, train, val)
    tokens = np.concatenate([train.tokens, val.tokens])
    kw = dict(progress=False, log=lambda m: None)

    ref = tmp_path / "ref.npy"
    assert build_feature_cache(ref, meta, model, params, tokens, 4, **kw)
    part = tmp_path / "part.npy"
    assert not build_feature_cache(part, meta, model, params, tokens, 4, max_seconds=0, **kw)
    assert json.loads((tmp_path / "part.json").read_text())["done"] == 4
    mm = np.load(part, mmap_mode="r+")
    mm[4:] = np.nan  # what a killed build may leave past its count
    mm.flush()
    del mm
    assert build_feature_cache(part, meta, model, params, tokens, 4, **kw)
    np.testing.assert_array_equal(np.load(part), np.load(ref))
    assert json.loads((tmp_path / "part.json").read_text())["done"] == 28

    calls = []

    def interrupted(x, dtype=None):  # Ctrl-C while the third batch is prepared
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return jnp.asarray(x, dtype)

    import jaxspec.training.dflash_run as dr

    again = tmp_path / "again.npy"
    monkeypatch.setattr(dr, "jnp", SimpleNamespace(asarray=interrupted, int32=jnp.int32))
    with pytest.raises(KeyboardInterrupt):
        build_feature_cache(again, meta, model, params, tokens, 4, **kw)
    monkeypatch.undo()
    assert json.loads((tmp_path / "again.json").read_text())["done"] == 8
    assert build_feature_cache(again, meta, model, params, tokens, 4, **kw)
    np.testing.assert_array_equal(np.load(again), np.load(ref))

    part.unlink()  # the sidecar says done, the file is gone: start over
    assert build_feature_cache(part, meta, model, params, tokens, 4, **kw)
    np.testing.assert_array_equal(np.load(part), np.load(ref))

    res = _run(cfg, tmp_path / "run", tiny, max_seconds=0.0)
    assert res["step"] == 0 and res["stopped_early"] and res["step_times"] == []
    assert json.loads((tmp_path / "x.json").read_text())["done"] == 4
    res = _run(cfg, tmp_path / "run", tiny, resume=True, stop_after=2)
    assert res["step"] == 2
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), np.load(ref))
