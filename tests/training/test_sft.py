"""The v2 diffusion recipe's SFT data (issue 15): function samples from Python source, EOS
padding, the response mask, the SFT / window interleave, and SFT batches through the shared
training loop (exact resume included)."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.training.data import DataError, PackedDataset
from jaxspec.training.loop import train
from jaxspec.training.objectives import diffusion_loss
from jaxspec.training.sft import SFTMixDataset, function_samples, pack_samples
from tests.training.test_train import tiny_cfg, tiny_model

SRC = textwrap.dedent('''\
    import functools

    @functools.lru_cache
    def add(a, b):
        """Sum of a and b."""
        total = a + b
        return total

    def nodoc(x):
        return x

    class C:
        def only_doc(self):
            """Nothing else."""

        async def method(self, y):
            """Twice y."""
            return 2 * y
    ''')


def test_function_samples_split_prompt_and_body():
    pairs, skipped = function_samples(SRC)
    assert skipped == 2  # nodoc (no docstring), only_doc (nothing after the docstring)
    by_name = {p.split("def ")[1].split("(")[0]: (p, r) for p, r in pairs}
    assert set(by_name) == {"add", "method"}
    p, r = by_name["add"]
    assert p == '@functools.lru_cache\ndef add(a, b):\n    """Sum of a and b."""\n'
    assert r == "    total = a + b\n    return total\n"
    p, r = by_name["method"]
    assert p.startswith("    async def method(self, y):") and r == "        return 2 * y\n"
    assert function_samples("def broken(:\n") == ([], 0)


def test_pack_samples_eos_padding_and_skips():
    toks, plen, too_long = pack_samples(
        [([1, 2], [3, 4, 5]), ([1] * 6, [2] * 4), ([], [3])], seq_len=8, eos_id=0
    )
    assert too_long == 2  # 6 + 4 + EOS > 8, and an empty prompt
    np.testing.assert_array_equal(toks, [[1, 2, 3, 4, 5, 0, 0, 0]])
    np.testing.assert_array_equal(plen, [2])


def _mix(f=0.25, T=8):
    toks, plen, _ = pack_samples(
        [([1, 2], [3, 4]), ([5], [6, 7, 8]), ([9, 9, 9], [10])], seq_len=T, eos_id=0
    )
    windows = PackedDataset(np.arange(100, 100 + 40 * T) % 20 + 11, T, seed=2)  # ids < V - 1
    return SFTMixDataset(toks, plen, windows, f, seed=5), toks, plen


def test_mix_fraction_mask_and_purity():
    ds, toks, plen = _mix(0.25)
    b = ds.batch(3, 16)
    assert b.shape == (16, 2, 8) and b.dtype == np.int32
    sft = b[:, 1].min(axis=1) == 0  # SFT rows have a masked-out prompt
    assert sft.sum() == 4  # exactly f of the batch
    for row in b[sft]:
        i = int(np.argmax(row[1]))  # first response position = the prompt length
        match = [j for j in range(len(toks)) if np.array_equal(toks[j], row[0])]
        assert match and plen[match[0]] == i and row[1, i:].all()
    assert (b[~sft, 1] == 1).all() and (b[~sft, 0] >= 11).all()  # plain windows
    np.testing.assert_array_equal(b, _mix(0.25)[0].batch(3, 16))  # pure function of the step
    # every SFT sample is used once per epoch of the SFT rows
    ks = [k for k in range(400) if int(np.floor((k + 1) * 0.25)) > int(np.floor(k * 0.25))]
    firsts = [ds._sft_index(j) for j in range(3)]
    assert sorted(firsts) == [0, 1, 2] and len(ks) == 100
    with pytest.raises(DataError, match="sft_fraction must lie in"):
        SFTMixDataset(toks, plen, None, 1.5)
    with pytest.raises(DataError, match="plain windows"):
        SFTMixDataset(toks, plen, None, 0.5)


def test_sft_batch_loss_is_the_response_masked_loss():
    """The loop feeds (n, 2, T) batches to diffusion_loss as tokens + response mask."""
    cfg = tiny_cfg()
    model, params = tiny_model(cfg)
    ds, _, _ = _mix(0.5, T=16)
    b = jnp.asarray(ds.batch(0, 4))
    key = jax.random.PRNGKey(0)
    want, _ = diffusion_loss(model, params, b[:, 0], key, response_mask=b[:, 1].astype(bool))
    full, _ = diffusion_loss(model, params, b[:, 0], key)
    assert np.isfinite(float(want)) and float(want) != pytest.approx(float(full))


def test_sft_training_runs_and_resumes_exactly(tmp_path):
    cfg = tiny_cfg(steps=6, ckpt_every=3, eval_every=3)
    toks, plen, _ = pack_samples(
        [([3, 7], [9, 12, 3]), ([7], [7, 9]), ([12, 3, 3], [7])], seq_len=16, eos_id=2
    )
    stream = np.tile(np.asarray([3, 7, 9, 12], np.int32), 64)
    data = (
        SFTMixDataset(toks, plen, PackedDataset(stream, 16, 1), 0.5, 1),
        SFTMixDataset(toks, plen, PackedDataset(stream, 16, 1), 0.5, 2),
    )
    quiet = dict(progress=False, log=lambda m: None)
    full = train(cfg, tmp_path / "a", datasets=data, model_and_params=tiny_model(cfg), **quiet)
    train(
        cfg, tmp_path / "b", datasets=data, model_and_params=tiny_model(cfg), stop_after=3, **quiet
    )
    resumed = train(
        cfg, tmp_path / "b", datasets=data, model_and_params=tiny_model(cfg), resume=True, **quiet
    )
    assert all(np.isfinite(v) for v in full["losses"].values())
    assert resumed["losses"][6] == pytest.approx(full["losses"][6], rel=1e-6)
