"""SPACE SAR-SFT (:func:`jaxspec.training.objectives.sar_inputs` / ``sar_loss``): the data
transform of Eq. 2 with the causal label shift, the loss of Eq. 3 against explicit truncated
sequences, a SAR run through the shared training loop (loss and mask-row accuracy improve;
the trained model decodes with SPACE identically to AR) and the LoRA delta export."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.causal.decode import generate
from jaxspec.causal.space import space_generate
from jaxspec.testing.tiny import tiny_model
from jaxspec.training.config import TrainConfigError, config_from_dict
from jaxspec.training.data import PackedDataset
from jaxspec.training.loop import train
from jaxspec.training.objectives import sar_group_inputs, sar_inputs, sar_loss
from models.diffusion.delta import load_delta

V, MASK, K = 32, 31, 3


def test_sar_inputs_follow_eq2_with_the_causal_shift():
    toks = jnp.tile(jnp.arange(100, 116, dtype=jnp.int32)[None], (64, 1))
    inp, lab, w, is_mask = (
        np.asarray(x) for x in sar_inputs(jax.random.PRNGKey(0), toks, K, 0.5, 7)
    )
    np.testing.assert_array_equal(lab[:, :-1], np.asarray(toks)[:, 1:])  # row i scores y_{i+1}
    n_sar = 0
    for r in range(64):
        if not is_mask[r].any():  # an AR sample: every position but the last is scored
            np.testing.assert_array_equal(inp[r], np.asarray(toks[r]))
            assert w[r, :-1].all() and w[r, -1] == 0
            continue
        n_sar += 1
        m = int(np.argmax(is_mask[r]))
        assert 1 <= m <= 16 - 1 - K
        assert (np.flatnonzero(is_mask[r]) == np.arange(m, m + K)).all()
        assert (inp[r, m : m + K] == 7).all() and (inp[r, :m] == np.asarray(toks[r, :m])).all()
        # scored: y_1..y_m (AR terms) and the k masks' labels y_{m+1}..y_{m+k}; then truncated
        assert w[r, : m + K].all() and not w[r, m + K :].any()
        assert list(lab[r, m - 1 : m + K]) == list(range(100 + m, 100 + m + K + 1))
    assert 16 < n_sar < 48  # p_ar = 0.5
    for p_ar, want in ((1.0, 0), (0.0, 64)):
        _, _, _, im = sar_inputs(jax.random.PRNGKey(1), toks, K, p_ar, 7)
        assert int(np.asarray(im).any(axis=1).sum()) == want
    with pytest.raises(TrainConfigError, match="seq_len >= k \\+ 2"):
        sar_inputs(jax.random.PRNGKey(0), toks[:, :4], K, 0.5, 7)


def test_sar_loss_equals_explicit_truncated_sequences():
    """Eq. 3: the mean CE over the scored rows equals the CE of explicit uncached passes over
    each row's truncated SAR input ``[y_1..y_{m-1}, M x k]`` (or the full AR row)."""
    model, params = tiny_model(V, seed=2, mask_token_id=MASK)
    toks = jax.random.randint(jax.random.PRNGKey(3), (6, 12), 0, MASK)
    key = jax.random.PRNGKey(4)
    loss, aux = sar_loss(model, params, toks, key, K, 0.5)
    inp, lab, w, is_mask = (np.asarray(x) for x in sar_inputs(key, toks, K, 0.5, MASK))
    ces = []
    T = toks.shape[1]
    fwd = jax.jit(
        lambda x: model.apply(
            {"params": params}, x, jnp.arange(T)[None], jnp.tril(jnp.ones((T, T), bool))[None]
        )[0]
    )
    for r in range(6):
        n = int(w[r].sum())
        seq = np.zeros((1, T), np.int32)
        seq[0, :n] = inp[r, :n]  # the truncated input; right padding is never seen (causal)
        lp = jax.nn.log_softmax(fwd(jnp.asarray(seq))[0], axis=-1)
        ces += [-float(lp[i, lab[r, i]]) for i in range(n)]
    assert float(loss) == pytest.approx(np.mean(ces), rel=1e-5)
    assert float(aux["n_masked"]) == is_mask.sum()


def test_sar_groups_equal_explicit_truncated_inputs():
    """``sar_group_inputs``: every mask row's logits equal the last row of an uncached causal
    pass over its own Eq. 2 sample ``[y_1..y_{m-1}, M x (j+1)]``, its label is
    ``y_{m+j+1}``, and the AR rows equal a plain causal pass (they never see a mask)."""
    model, params = tiny_model(V, seed=2, mask_token_id=MASK)
    T, G = 12, 3
    toks = jax.random.randint(jax.random.PRNGKey(5), (2, T), 0, MASK)
    inputs, pos, mask, lab, w, is_mask = sar_group_inputs(jax.random.PRNGKey(6), toks, K, G, MASK)
    logits = np.asarray(model.apply({"params": params}, inputs, pos, mask)[0])
    fwd = jax.jit(
        lambda x: model.apply(
            {"params": params}, x, jnp.arange(T)[None], jnp.tril(jnp.ones((T, T), bool))[None]
        )[0]
    )
    toks, pos, lab = np.asarray(toks), np.asarray(pos), np.asarray(lab)
    for b in range(2):
        np.testing.assert_allclose(
            logits[b, :T], np.asarray(fwd(jnp.asarray(toks[b : b + 1]))[0]), atol=2e-4
        )
        for g in range(G):
            m = int(pos[b, T + g * K])
            for j in range(K):
                seq = np.zeros((1, T), np.int32)
                seq[0, :m] = toks[b, :m]
                seq[0, m : m + j + 1] = MASK
                want = np.asarray(fwd(jnp.asarray(seq))[0, m + j])
                np.testing.assert_allclose(logits[b, T + g * K + j], want, atol=2e-4)
                assert lab[b, T + g * K + j] == toks[b, m + j + 1]
    assert np.asarray(is_mask)[:, T:].all() and np.asarray(w)[:, T:].all()


def _tiny_sar_cfg(steps, lora=None):
    return config_from_dict(
        {
            "name": "tiny-sar",
            "model": {"init": "preset", "preset": "unused", "mask_token_id": MASK},
            "data": {"seq_len": 16, "batch_size": 8},
            "objective": {"kind": "sar", "sar_k": K, "p_ar": 0.5},
            "optim": {"lr": 1e-2, "warmup_steps": 3, "weight_decay": 0.0},
            **({"lora": lora} if lora else {}),
            "train": {
                "steps": steps,
                "seed": 0,
                "ckpt_every": 1000,
                "eval_every": steps,
                "eval_batches": 1,
                "log_every": 10,
            },
        }
    )


def _loop_data():
    phrase = np.random.default_rng(0).integers(0, 12, 24).astype(np.int32)  # a 24-token loop
    stream = np.tile(phrase, 40)
    return phrase, (PackedDataset(stream, 16, seed=1), PackedDataset(stream[:96], 16, seed=2))


def test_sar_full_finetune_learns_the_mask_rows_and_decodes_losslessly(tmp_path):
    """Full fine-tuning (no ``lora`` section) on a tiny repeated corpus: the loss falls and
    the mask rows learn to draft (accuracy well above chance 1/12); the trained model decodes
    with SPACE, greedy output identical to AR, with more than 1.5 tokens per forward."""
    model, params = tiny_model(V, seed=1, scale=1.0, mask_token_id=MASK)
    phrase, data = _loop_data()
    res = train(
        _tiny_sar_cfg(60),
        tmp_path / "run",
        datasets=data,
        model_and_params=(model, params),
        progress=False,
        log=lambda m: None,
    )
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    tr = [r for r in rows if r["kind"] == "train"]
    assert tr[-1]["loss"] < 0.2 * tr[0]["loss"], (tr[0]["loss"], tr[-1]["loss"])
    assert tr[-1]["masked_acc"] > 0.5
    trained = res["trainable"]
    prompts = [list(map(int, phrase[:10])), list(map(int, phrase[5:12]))]
    ar = generate(model, trained, prompts, max_new_tokens=20, bucket=16)
    sp = space_generate(model, trained, prompts, max_new_tokens=20, mask_groups=K, bucket=16)
    assert sp.tokens == ar.tokens
    assert sp.stats.mat > 1.5, sp.stats.mat  # the trained mask rows draft accepted tokens


def test_sar_lora_delta_export(tmp_path):
    """A LoRA SAR run exports a delta whose metadata names the objective and the [MASK] id."""
    model, params = tiny_model(V, seed=1, mask_token_id=MASK)
    _, data = _loop_data()
    train(
        _tiny_sar_cfg(2, {"rank": 2, "alpha": 4.0}),
        tmp_path / "run",
        datasets=data,
        model_and_params=(model, params),
        progress=False,
        log=lambda m: None,
    )
    delta, meta = load_delta(tmp_path / "run" / "delta.safetensors")
    assert meta["objective"] == "sar" and int(meta["mask_token_id"]) == MASK
    assert meta["head"] == "causal" and set(delta) == {"lora", "mask_embed", "norms"}


def test_sar_lora_continues_from_an_exported_delta(tmp_path):
    """``lora.init_delta`` starts a run from an exported delta: its first loss equals the loss
    of the stored delta on that batch (not of a fresh delta), the export counts both runs'
    steps and tokens, and a delta of another rank is a one-line config error."""
    model, params = tiny_model(V, seed=1, mask_token_id=MASK)
    _, data = _loop_data()
    quiet = dict(
        datasets=data, model_and_params=(model, params), progress=False, log=lambda m: None
    )
    train(_tiny_sar_cfg(3, {"rank": 2, "alpha": 4.0}), tmp_path / "a", **quiet)
    first = tmp_path / "a" / "delta.safetensors"
    stored, meta = load_delta(first)
    assert int(meta["step"]) == 3
    lora = {"rank": 2, "alpha": 4.0, "init_delta": str(first)}
    cont = _tiny_sar_cfg(2, lora)
    cont.optim.lr = 0.0  # the first step's loss must be the stored delta's
    train(cont, tmp_path / "b", **quiet)
    fresh = _tiny_sar_cfg(2, {"rank": 2, "alpha": 4.0})
    fresh.optim.lr = 0.0
    train(fresh, tmp_path / "c", **quiet)
    loss = lambda d: [
        json.loads(l)
        for l in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
        if json.loads(l)["kind"] == "train"
    ][0]["loss"]
    assert loss("b") != pytest.approx(loss("c"), rel=1e-6)  # the start delta was used...
    got, meta_b = load_delta(tmp_path / "b" / "delta.safetensors")
    for k in ("mask_embed",):
        np.testing.assert_array_equal(
            np.asarray(got[k]), np.asarray(stored[k])
        )  # ...unchanged at lr 0
    np.testing.assert_array_equal(
        np.asarray(got["lora"]["wq"]["b"]), np.asarray(stored["lora"]["wq"]["b"])
    )
    assert int(meta_b["step"]) == 5 and int(meta_b["run_step"]) == 2
    assert int(meta_b["tokens_seen"]) == 5 * int(meta["tokens_seen"]) // 3
    with pytest.raises(TrainConfigError, match="init_delta"):
        train(
            _tiny_sar_cfg(1, {"rank": 4, "alpha": 4.0, "init_delta": str(first)}),
            tmp_path / "d",
            **quiet,
        )


def test_sar_config_errors():
    with pytest.raises(TrainConfigError, match="sar_k"):
        config_from_dict({"objective": {"kind": "sar", "sar_k": 0}})
    with pytest.raises(TrainConfigError, match="p_ar"):
        config_from_dict({"objective": {"kind": "sar", "p_ar": 1.5}})
