"""AS-ARM training (jaxspec/training/asarm.py + objective.kind=asarm in jaxspec/training/): joint
loss equals per-position passes, lattice order, low-discrepancy prompt lengths, warmup, vocabulary,
embedding projection, loss decrease, exact resume and the exported model file."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.training.asarm import (
    AsarmSection,
    build_vocab,
    joint_loss,
    lattice_order,
    low_discrepancy_uniform,
    mask_rate_range,
    projected_embeddings,
    prompt_lengths,
    xlnet_config,
)
from jaxspec.training.config import TrainConfigError, config_from_dict
from jaxspec.training.data import PackedDataset
from jaxspec.training.loop import train
from models.xlnet.modeling import XLNetConfig, XLNetLM, init_params, load_xlnet

V = 23


def tiny_xlnet(seed=0):
    cfg = XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=4, d_inner=48)
    return XLNetLM(cfg), init_params(cfg, seed=seed, std=0.1)


def test_joint_loss_equals_separate_per_position_passes():
    """Eq. 7 from one density pass == sum of the per-position conditionals, each computed in
    its own pass that queries only that position and scrambles every later masked token
    (so no information from the future can leak)."""
    model, params = tiny_xlnet()
    B, N = 2, 9
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, (B, N)).astype(np.int32)
    m = jnp.array([3, 5], jnp.int32)
    _, visible = lattice_order(jax.random.PRNGKey(1), m, N)
    visible = np.asarray(visible)
    loss, aux = joint_loss(model, params, jnp.asarray(tokens), jnp.asarray(visible))
    total, n = 0.0, 0
    for b in range(B):
        for i in np.flatnonzero(~visible[b]):
            t = tokens[b : b + 1].copy()
            later = (~visible[b]) & (np.arange(N) >= i)
            t[0, later] = rng.integers(0, V, later.sum())  # the target itself and everything after
            vis = visible[b : b + 1]
            # conditioning set for position i: prompt + masked positions before i (Eq. 4 order)
            from models.xlnet.modeling import density_masks

            cm, qm = density_masks(vis)
            lq, _ = model.apply(
                params, t, cm, np.asarray(qm)[:, i : i + 1], query_pos=np.array([[i]])
            )
            logp = jax.nn.log_softmax(lq[0, 0])
            total += -float(logp[tokens[b, i]])
            n += 1
    assert int(aux["n_masked"]) == n
    np.testing.assert_allclose(float(aux["ce_sum"]), total, rtol=1e-5)
    np.testing.assert_allclose(float(loss), total / (B * N), rtol=1e-5)


def test_lattice_order_properties():
    B, N = 64, 20
    m = jnp.asarray(np.random.default_rng(2).integers(1, N, B), jnp.int32)
    sigma, visible = lattice_order(jax.random.PRNGKey(0), m, N)
    sigma, visible, m = np.asarray(sigma), np.asarray(visible), np.asarray(m)
    assert visible.sum(1).tolist() == m.tolist()
    for b in range(B):
        assert sorted(sigma[b]) == list(range(N))  # a permutation
        pre, post = sigma[b, : m[b]], sigma[b, m[b] :]
        assert visible[b, pre].all() and not visible[b, post].any()
        assert (np.diff(pre) > 0).all() and (np.diff(post) > 0).all()  # each part sorted (Eq. 4)
    # the prompt set is uniform: every position is in the prompt about equally often
    many_m = jnp.full((4000,), 5, jnp.int32)
    _, vis = lattice_order(jax.random.PRNGKey(3), many_m, N)
    freq = np.asarray(vis).mean(0)
    assert np.all(np.abs(freq - 5 / N) < 0.04)


def test_low_discrepancy_and_prompt_lengths():
    t = np.sort(np.asarray(low_discrepancy_uniform(jax.random.PRNGKey(4), 8)))
    np.testing.assert_allclose(np.diff(t), 1 / 8, atol=1e-6)  # one point per stratum
    m = np.asarray(prompt_lengths(jax.random.PRNGKey(5), 16, 100, 0.9, 0.99))
    assert m.min() >= 1 and m.max() <= 10 + 1 and len(set(m.tolist())) > 5
    m = np.asarray(prompt_lengths(jax.random.PRNGKey(5), 16, 10, 1.0, 1.0))
    assert (m == 1).all()  # never an empty prompt
    m = np.asarray(prompt_lengths(jax.random.PRNGKey(5), 16, 10, 0.0, 0.0))
    assert (m == 9).all()  # never an empty target


def test_mask_rate_warmup():
    sec = AsarmSection(mask_start=0.15, mask_min=0.9, mask_max=0.99, mask_warmup_steps=100)
    lo, hi = mask_rate_range(0, sec)
    assert float(lo) == pytest.approx(0.15) and float(hi) == pytest.approx(0.15)
    lo, hi = mask_rate_range(50, sec)
    assert float(lo) == pytest.approx(0.525) and float(hi) == pytest.approx(0.57)
    lo, hi = mask_rate_range(1000, sec)
    assert float(lo) == pytest.approx(0.9) and float(hi) == pytest.approx(0.99)


def test_vocab_and_embedding_projection():
    stream = np.array([5, 5, 5, 7, 7, 9, 1, 1, 1, 1, 3])
    v = build_vocab(stream, 4, 12, keep=[3])
    assert v.ids == (3, 1, 5) and v.size == 4
    assert v.encode([1, 9, 3]).tolist() == [1, 3, 0]
    big = np.random.default_rng(0).normal(size=(12, 6))
    e = projected_embeddings(big, v.ids, 4, 0.02)
    assert e.shape == (4, 4) and abs(e[:3].std() - 0.02) < 1e-6
    e = projected_embeddings(big, v.ids, 8, 0.02)  # wider than the source: zero-padded
    assert e.shape == (4, 8) and np.all(e[:3, 3:] == 0)


def _cfg(steps=16, warmup=8, **train_kw):
    return config_from_dict(
        {
            "name": "asarm-test",
            "model": {
                "init": "scratch",
                "hidden_size": 32,
                "intermediate_size": 48,
                "num_layers": 2,
                "num_heads": 4,
                "head_dim": 8,
            },
            "objective": {"kind": "asarm"},
            "asarm": {
                "vocab_size": V,
                "init_std": 0.05,
                "mask_start": 0.15,
                "mask_min": 0.3,
                "mask_max": 0.6,
                "mask_warmup_steps": warmup,
            },
            "data": {"seq_len": 16, "batch_size": 4},
            "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_accum": 2, "weight_decay": 0.0},
            "train": {
                "steps": steps,
                "seed": 3,
                "ckpt_every": 1000,
                "eval_every": 8,
                "eval_batches": 1,
                "log_every": 1,
                **train_kw,
            },
        }
    )


def _data():
    phrase = np.random.default_rng(0).choice([3, 7, 9, 12], p=[0.7, 0.1, 0.1, 0.1], size=64)
    stream = np.tile(phrase.astype(np.int32), 16)
    return PackedDataset(stream, 16, seed=1), PackedDataset(stream[:64], 16, seed=1)


def test_config_switch():
    cfg = _cfg()
    assert cfg.objective.kind == "asarm" and cfg.asarm.vocab_size == V
    x = xlnet_config(cfg)
    assert (x.d_model, x.n_layer, x.n_head, x.d_head, x.d_inner) == (32, 2, 4, 8, 48)
    with pytest.raises(TrainConfigError, match="objective.kind"):
        config_from_dict({"objective": {"kind": "nope"}})


def test_train_loss_decreases_resume_is_exact_and_export(tmp_path):
    cfg = _cfg(steps=16, warmup=1)  # constant masking range after step 0: losses comparable
    model_params = lambda: (XLNetLM(xlnet_config(cfg)), init_params(xlnet_config(cfg), 3, 0.05))
    kw = dict(datasets=_data(), progress=False, log=lambda m: None)
    straight = train(cfg, tmp_path / "a", model_and_params=model_params(), **kw)
    losses = straight["losses"]
    assert np.mean([losses[s] for s in (14, 15, 16)]) < 0.7 * np.mean(
        [losses[s] for s in (2, 3, 4)]
    )
    part = train(cfg, tmp_path / "b", model_and_params=model_params(), stop_after=7, **kw)
    resumed = train(cfg, tmp_path / "b", model_and_params=model_params(), resume=True, **kw)
    assert {**part["losses"], **resumed["losses"]} == losses
    for a, b in zip(jax.tree.leaves(straight["trainable"]), jax.tree.leaves(resumed["trainable"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "eval" for r in rows)
    xcfg, params, vocab, meta = load_xlnet(tmp_path / "a" / "model.safetensors")
    assert xcfg == xlnet_config(cfg) and meta["step"] == 16 and vocab is None
    got = np.asarray(params["layers"]["q"])
    want = np.asarray(straight["trainable"]["layers"]["q"]).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    # export of a (mid-run) checkpoint gives the same file content as the end-of-run export
    from jaxspec.training.asarm import export_checkpoint

    step, nbytes = export_checkpoint(tmp_path / "b")
    assert step == 16 and nbytes > 0
    _, p2, _, _ = load_xlnet(tmp_path / "b" / "model-16.safetensors")
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_timed_checkpoints(tmp_path):
    cfg = _cfg(steps=3, ckpt_every_s=0.0)  # every step passes the wall-time threshold
    train(
        cfg,
        tmp_path,
        model_and_params=(XLNetLM(xlnet_config(cfg)), init_params(xlnet_config(cfg), 3)),
        datasets=_data(),
        progress=False,
        log=lambda m: None,
    )
    kept = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert kept == [2, 3]  # keep_checkpoints = 2 of the three written


def test_continued_training_from_exported_weights(tmp_path):
    """``asarm.init_weights`` + ``train.data_offset``: a second run starts from the first run's
    exported weights (fp16-rounded), its exported meta counts both runs' steps and tokens, and a
    start file whose architecture or vocabulary differs is a one-line config error."""
    from jaxspec.training.asarm import _continued_params, prior_training
    from models.xlnet.modeling import CompactVocab, save_xlnet

    cfg = _cfg(steps=4, warmup=1)
    xcfg = xlnet_config(cfg)
    kw = dict(datasets=_data(), progress=False, log=lambda m: None)
    first = train(
        cfg, tmp_path / "a", model_and_params=(XLNetLM(xcfg), init_params(xcfg, 3, 0.05)), **kw
    )
    vocab = CompactVocab(ids=tuple(range(V - 1)), external_size=40)
    start = tmp_path / "start.safetensors"
    save_xlnet(start, xcfg, first["trainable"], vocab, {"step": 4, "tokens_seen": 4 * 128})
    d = cfg.to_dict()
    d["asarm"]["init_weights"] = str(start)
    d["train"].update(steps=3, data_offset=4)
    cont = config_from_dict(d)
    params = _continued_params(start, xcfg, vocab)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(first["trainable"])):
        np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b).astype(np.float16).astype(np.float32)
        )
    second = train(cont, tmp_path / "b", model_and_params=(XLNetLM(xcfg), params), **kw)
    assert second["step"] == 3
    _, _, _, meta = load_xlnet(tmp_path / "b" / "model.safetensors")
    assert meta["step"] == 4 + 3 and meta["run_step"] == 3
    assert meta["tokens_seen"] == 4 * 128 + 3 * 2 * 4 * 16
    assert meta["continued_from"]["path"] == str(start)
    with pytest.raises(TrainConfigError, match="vocabulary map differs"):
        _continued_params(start, xcfg, CompactVocab(ids=tuple(range(1, V)), external_size=40))
    # the record survives the start file being overwritten (exports into the same path)
    start.write_bytes(b"gone")
    assert prior_training(cont, tmp_path / "b")["step"] == 4
    with pytest.raises(TrainConfigError, match="architecture differs"):
        save_xlnet(
            tmp_path / "wide.safetensors",
            XLNetConfig(vocab_size=V, d_model=32, n_layer=1, n_head=4, d_head=8, d_inner=48),
            {
                **first["trainable"],
                "layers": jax.tree.map(lambda x: x[:1], first["trainable"]["layers"]),
            },
            vocab,
        )
        _continued_params(tmp_path / "wide.safetensors", xcfg, vocab)
    with pytest.raises(TrainConfigError, match="not found"):
        _continued_params(tmp_path / "missing.safetensors", xcfg, vocab)
    with pytest.raises(TrainConfigError, match="data_offset"):
        config_from_dict({**d, "train": {**d["train"], "data_offset": -1}})
