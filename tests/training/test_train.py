"""Training: objective, Dream shift alignment, LoRA delta, loss decrease, exact resume, data."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.training.config import (
    LoraSection,
    TrainConfig,
    TrainConfigError,
    config_from_dict,
    load_config,
)
from jaxspec.training.data import (
    DataError,
    PackedDataset,
    is_heldout,
    module_name,
    split_files,
    stdlib_files,
    stdlib_root,
)
from jaxspec.training.loop import train
from jaxspec.training.objectives import diffusion_loss, init_delta, masked_diffusion_loss
from models.config import ModelConfig
from models.diffusion.delta import load_delta, merge_delta, save_delta
from models.diffusion.modeling import DiffusionConfig, DiffusionLM
from models.llama.modeling import init_params

ROOT = Path(__file__).resolve().parents[2]
V = 32


def tiny_cfg(head="llada", steps=30, **train_kw) -> TrainConfig:
    return config_from_dict(
        {
            "name": "tiny-test",
            "model": {
                "init": "scratch",
                "head": head,
                "mask_token_id": V - 1,
                "vocab_size": V,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_layers": 2,
                "num_heads": 4,
                "num_kv_heads": 2,
                "head_dim": 8,
            },
            "data": {"seq_len": 16, "batch_size": 4},
            "optim": {"lr": 1e-2, "warmup_steps": 3, "grad_accum": 2, "weight_decay": 0.0},
            "train": {
                "steps": steps,
                "seed": 3,
                "ckpt_every": 1000,
                "eval_every": 1000,
                "eval_batches": 1,
                "log_every": 1,
                **train_kw,
            },
        }
    )


@functools.lru_cache(maxsize=None)
def _tiny_params(base: ModelConfig):
    return jax.jit(init_params, static_argnums=(0, 1))(base, 0)  # one compile, not per op


def tiny_model(cfg: TrainConfig):
    m = cfg.model
    base = ModelConfig(
        arch="llama",
        vocab_size=V,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        tie_embeddings=True,
        rms_norm_eps=1e-6,
    )
    model = DiffusionLM(DiffusionConfig(base=base, head=m.head, mask_token_id=m.mask_token_id))
    return model, _tiny_params(base)  # train() copies before donating, so sharing is safe


def tiny_data(seq_len=16):
    # A tiny repeated corpus: one fixed 64-token phrase (skewed unigram distribution, entropy
    # ~1 nat vs ln(32) = 3.5 at init) repeated; the mask id never occurs.
    phrase = np.random.default_rng(0).choice([3, 7, 9, 12], p=[0.7, 0.1, 0.1, 0.1], size=64)
    stream = np.tile(phrase.astype(np.int32), 16)
    return PackedDataset(stream, seq_len, seed=1), PackedDataset(stream[:64], seq_len, seed=1)


K = 30  # steps of the straight run shared by the loss and resume tests


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    cfg = tiny_cfg(steps=K, ckpt_every=K // 2, eval_every=K // 2)
    out = tmp_path_factory.mktemp("straight")
    res = train(
        cfg,
        out,
        datasets=tiny_data(),
        model_and_params=tiny_model(cfg),
        progress=False,
        log=lambda m: None,
    )
    return cfg, out, res


# ------------------------------------------------------------------ objective
def test_one_over_t_weighting_hand_computed():
    # B=1, T=4, V=3; positions 1 and 3 masked with p = 0.5.
    logits = jnp.array([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 2.0]]])
    targets = jnp.array([[0, 0, 1, 1]])
    masked = jnp.array([[False, True, False, True]])
    p = jnp.array([0.5])
    loss, aux = masked_diffusion_loss(logits, targets, masked, p)
    ce1 = -(1.0 - math.log(math.e + 2))  # -log softmax([1,0,0])[0]
    ce3 = -(0.0 - math.log(2 + math.e**2))  # -log softmax([0,0,2])[1]
    want = (ce1 / 0.5 + ce3 / 0.5) / (1 * 4)  # LLaDA: sum CE/t over masked, / (B*T)
    assert float(loss) == pytest.approx(want, rel=1e-6)
    assert float(aux["n_masked"]) == 2 and float(aux["n_correct"]) == 1
    # SFT normalisation: divided by the response length (here 2) instead of T.
    loss_sft, _ = masked_diffusion_loss(logits, targets, masked, p, response_len=jnp.array([2.0]))
    assert float(loss_sft) == pytest.approx((ce1 / 0.5 + ce3 / 0.5) / 2, rel=1e-6)


def test_sft_masks_only_response_tokens():
    cfg = tiny_cfg()
    model, params = tiny_model(cfg)
    toks = jnp.asarray(tiny_data()[0].batch(0, 4))
    resp = jnp.zeros((4, 16), bool).at[:, 10:].set(True)
    from jaxspec.training.objectives import forward_process, maskable_positions

    noisy, masked, _ = jax.jit(
        lambda k, t, r: forward_process(k, t, V - 1, maskable_positions(model.config, (4, 16), r))
    )(jax.random.PRNGKey(0), toks, resp)
    assert not bool(masked[:, :10].any()) and bool(masked[:, 10:].any())
    assert bool((noisy[:, :10] == toks[:, :10]).all())
    loss, _ = jax.jit(lambda p, t, k, r: diffusion_loss(model, p, t, k, response_mask=r))(
        params, toks, jax.random.PRNGKey(0), resp
    )
    assert np.isfinite(float(loss))


def test_dream_loss_reads_the_row_predicting_token_i():
    cfg = tiny_cfg(head="dream")
    model, params = tiny_model(cfg)
    toks = jnp.asarray(tiny_data()[0].batch(0, 1))  # (1, 16)
    # Find a key whose forward process masks some positions (never position 0 for Dream).
    from jaxspec.training.objectives import forward_process, maskable_positions

    key = jax.random.PRNGKey(5)
    noisy, masked, p = jax.jit(
        lambda k, t: forward_process(k, t, V - 1, maskable_positions(model.config, (1, 16)))
    )(key, toks)
    assert not bool(masked[0, 0]) and int(masked.sum()) >= 1
    loss, _ = jax.jit(lambda p, t, k: diffusion_loss(model, p, t, k))(params, toks, key)
    pos = jnp.arange(16, dtype=jnp.int32)[None]
    raw, _ = jax.jit(lambda p, x: model.apply(p, x, pos, shift=False))(
        params, noisy
    )  # raw[:, j] predicts token j + 1
    logp = jax.nn.log_softmax(raw[0], -1)
    want = sum(-float(logp[i - 1, int(toks[0, i])]) for i in np.flatnonzero(np.asarray(masked[0])))
    want /= float(p[0]) * 16
    assert float(loss) == pytest.approx(want, rel=1e-5)
    # ... and not the unshifted row i.
    wrong = sum(-float(logp[i, int(toks[0, i])]) for i in np.flatnonzero(np.asarray(masked[0])))
    assert abs(wrong / (float(p[0]) * 16) - want) > 1e-3


# ------------------------------------------------------------------ LoRA delta
def test_lora_merge_equals_base_when_b_is_zero_and_delta_io(tmp_path):
    cfg = tiny_cfg()
    model, base = tiny_model(cfg)
    lora = LoraSection(rank=4, alpha=8.0)
    delta = init_delta(base, lora, V - 1, jax.random.PRNGKey(0))
    merged = merge_delta(base, delta, alpha=8.0, rank=4, mask_token_id=V - 1)
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(base)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # A non-zero b changes exactly the targeted matrices by (alpha/r) a @ b.
    d2 = jax.tree.map(lambda x: x, delta)
    d2["lora"]["wq"]["b"] = jnp.ones_like(delta["lora"]["wq"]["b"])
    m2 = merge_delta(base, d2, alpha=8.0, rank=4, mask_token_id=V - 1)
    np.testing.assert_allclose(
        m2["layers"]["wq"],
        base["layers"]["wq"]
        + 2.0 * jnp.einsum("lir,lro->lio", d2["lora"]["wq"]["a"], d2["lora"]["wq"]["b"]),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_array_equal(m2["layers"]["wk"], base["layers"]["wk"])
    size = save_delta(tmp_path / "d.safetensors", delta, {"rank": 4})
    back, meta = load_delta(tmp_path / "d.safetensors")
    assert meta == {"rank": 4} and size > 0
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(delta)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_lora_checkpoint_holds_no_base_weights(tmp_path):
    cfg = tiny_cfg(head="dream", steps=2, ckpt_every=1, eval_batches=0)
    cfg.lora = LoraSection(rank=2, alpha=4.0)
    model, base = tiny_model(cfg)
    res = train(
        cfg,
        tmp_path / "run",
        datasets=tiny_data(),
        model_and_params=(model, base),
        progress=False,
        log=lambda m: None,
    )
    import orbax.checkpoint as ocp

    ck = tmp_path / "run" / "checkpoints" / "2"
    tree = ocp.StandardCheckpointer().restore(ck / "default")
    leaves = jax.tree_util.tree_flatten_with_path(tree["trainable"])[0]
    names = {jax.tree_util.keystr(p) for p, _ in leaves}
    assert names and all(("lora" in n or "mask_embed" in n or "norms" in n) for n in names)
    # every base matrix (embedding, stacked projections); the trained norms are part of the delta
    base_shapes = {
        tuple(x.shape) for x in jax.tree.leaves(base) if x.ndim >= 2 and x.size >= V * 32
    }
    for _, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        assert tuple(np.shape(x)) not in base_shapes
    keys = load_delta(tmp_path / "run" / "delta.safetensors")[0]
    assert set(keys) == {"lora", "mask_embed", "norms"}
    assert res["delta_bytes"] < sum(x.size * 4 for x in jax.tree.leaves(base))


# ------------------------------------------------------------------ train loop
def test_loss_decreases_on_tiny_repeated_corpus(straight_run):
    cfg, out, res = straight_run
    losses = [res["losses"][s] for s in sorted(res["losses"])]
    assert len(losses) == K
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < 0.6 * first, (first, last)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == list(range(1, K + 1))
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [K // 2, K]
    assert (out / "loss.png").stat().st_size > 0


def test_exact_resume_after_interruption(straight_run, tmp_path):
    cfg, out_a, straight = straight_run
    data = tiny_data()
    part = train(
        cfg,
        tmp_path / "b",
        datasets=data,
        model_and_params=tiny_model(cfg),
        stop_after=K // 2 + 2,
        progress=False,
        log=lambda m: None,
    )  # "crash" at 17
    assert part["step"] == K // 2 + 2
    with pytest.raises(TrainConfigError):  # refuses to overwrite without --resume
        train(
            cfg,
            tmp_path / "b",
            datasets=data,
            model_and_params=tiny_model(cfg),
            progress=False,
            log=lambda m: None,
        )
    resumed = train(
        cfg,
        tmp_path / "b",
        datasets=data,
        model_and_params=tiny_model(cfg),
        resume=True,
        progress=False,
        log=lambda m: None,
    )
    # the last checkpoint before the crash is step 17 (written at the stop); resuming
    # continues at step 18 and reproduces the straight run exactly
    assert sorted(resumed["losses"]) == list(range(K // 2 + 3, K + 1))
    assert {**part["losses"], **resumed["losses"]} == straight["losses"]
    for a, b in zip(jax.tree.leaves(straight["trainable"]), jax.tree.leaves(resumed["trainable"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows_a = [json.loads(l) for l in (out_a / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(l) for l in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    key = lambda rows: [(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in rows]
    assert key(rows_a) == key(rows_b)


def test_time_budget_stops_cleanly_and_resumes_exactly(straight_run, tmp_path):
    """``max_seconds`` (``scripts.train --max-minutes``): a spent budget ends the run after the
    step in hand with a checkpoint and an eval row; ``resume`` then finishes the same schedule
    and reproduces the straight run."""
    cfg, _, straight = straight_run
    data = tiny_data()
    part = train(
        cfg,
        tmp_path / "t",
        datasets=data,
        model_and_params=tiny_model(cfg),
        max_seconds=0.0,
        progress=False,
        log=lambda m: None,
    )
    assert part["step"] == 1 and part["stopped_early"]
    assert (tmp_path / "t" / "checkpoints" / "1").is_dir()
    rows = [json.loads(l) for l in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("train", 1), ("eval", 1)]
    resumed = train(
        cfg,
        tmp_path / "t",
        datasets=data,
        model_and_params=tiny_model(cfg),
        resume=True,
        progress=False,
        log=lambda m: None,
    )
    assert resumed["step"] == K and not resumed["stopped_early"]
    assert {**part["losses"], **resumed["losses"]} == straight["losses"]
    for a, b in zip(jax.tree.leaves(straight["trainable"]), jax.tree.leaves(resumed["trainable"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_resume_from_periodic_checkpoint_redoes_lost_steps(straight_run, tmp_path):
    """A hard crash between checkpoints: only the periodic checkpoint (step 15) survives."""
    import shutil

    cfg, _, straight = straight_run
    data = tiny_data()
    train(
        cfg,
        tmp_path / "c",
        datasets=data,
        model_and_params=tiny_model(cfg),
        stop_after=K // 2 + 2,
        progress=False,
        log=lambda m: None,
    )
    shutil.rmtree(tmp_path / "c" / "checkpoints" / str(K // 2 + 2))  # lost with the crash
    resumed = train(
        cfg,
        tmp_path / "c",
        datasets=data,
        model_and_params=tiny_model(cfg),
        resume=True,
        progress=False,
        log=lambda m: None,
    )
    assert sorted(resumed["losses"]) == list(range(K // 2 + 1, K + 1))
    for a, b in zip(jax.tree.leaves(straight["trainable"]), jax.tree.leaves(resumed["trainable"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------ data / config
def test_batches_are_a_function_of_the_step():
    ds = PackedDataset(np.arange(1000), 10, seed=4)
    assert ds.num_sequences == 100
    np.testing.assert_array_equal(
        ds.batch(7, 8), PackedDataset(np.arange(1000), 10, seed=4).batch(7, 8)
    )
    seen = np.concatenate([ds.indices(s, 10) for s in range(10)])
    assert sorted(seen) == list(range(100))  # one epoch = a permutation
    assert not np.array_equal(ds.indices(10, 10), ds.indices(0, 10))  # next epoch reshuffled


def test_stdlib_split_and_module_names():
    assert module_name(Path("json/__init__.py")) == "json"
    assert module_name(Path("email/mime/text.py")) == "email.mime.text"
    assert is_heldout(Path("json/decoder.py"), ["json"]) and not is_heldout(
        Path("jsonx.py"), ["json"]
    )
    files = stdlib_files()
    assert not any(p in ("test", "tests", "idle_test") for f in files for p in f.parts)
    cfg = load_config(ROOT / "configs/train/dlm-tiny.yaml")
    train_f, val_f = split_files(files, cfg.data.holdout)
    assert val_f and not set(train_f) & set(val_f)


def test_stdlib_root_override(tmp_path, monkeypatch):
    """``$JAXSPEC_STDLIB_ROOT`` replaces the interpreter's stdlib (a copy of another Python's,
    for the same corpus on a GPU image); a path that is no directory is a DataError."""
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("y = 2\n")
    (tmp_path / "abc.py").write_text("z = 3\n")
    monkeypatch.setenv("JAXSPEC_STDLIB_ROOT", str(tmp_path))
    assert stdlib_root() == tmp_path
    assert stdlib_files() == [Path("abc.py"), Path("json/__init__.py")]
    monkeypatch.setenv("JAXSPEC_STDLIB_ROOT", str(tmp_path / "missing"))
    with pytest.raises(DataError, match="JAXSPEC_STDLIB_ROOT"):
        stdlib_root()


def test_configs_load_and_reject_unknown_keys():
    for name in ("dlm-tiny", "dream-smollm2-135m-v1", "dream-smollm2-135m-v2"):
        cfg = load_config(ROOT / f"configs/train/{name}.yaml", ["train.steps=7"])
        assert cfg.train.steps == 7 and cfg.model.mask_token_id is not None
    assert load_config(ROOT / "configs/train/dream-smollm2-135m-v1.yaml").lora is not None
    with pytest.raises(TrainConfigError):
        config_from_dict({"optim": {"learning_rate": 1}})


def test_cli_errors_exit_2(tmp_path, capsys):
    from scripts.train import main

    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert main(["--config", str(ROOT / "configs/train/dlm-tiny.yaml"), "--set", "bogus"]) == 2
    (tmp_path / "run" / "checkpoints" / "5").mkdir(parents=True)
    assert (
        main(
            ["--config", str(ROOT / "configs/train/dlm-tiny.yaml"), "--out", str(tmp_path / "run")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("error:") == 3 and "--resume" in err


def test_resume_warning_names_changed_keys_and_ignores_keys_added_since():
    """A saved config.json without a key the schema gained since (at its default now) is not a
    change; a changed value is named as ``section.key``."""
    from jaxspec.training.config import load_config
    from jaxspec.training.loop import _changed_keys

    cfg = load_config("configs/train/dflash-smollm2-135m.yaml")
    saved = cfg.to_dict()
    del saved["dflash"]["feature_cache"], saved["dflash"]["feature_cache_dtype"]
    assert _changed_keys(saved, cfg) == []
    saved["optim"]["lr"] = 1e-3
    saved["dflash"]["gamma"] = 5.0
    assert _changed_keys(saved, cfg) == ["dflash.gamma", "optim.lr"]
    assert _changed_keys({"nonsense": {}}, cfg) == ["config.json"]
