"""Self-distilled answers as SFT rows (the v3 diffusion recipe): EOS only where the base model
ended its answer, answers cut at the budget kept without EOS or dropped, the three-way mix of
distilled rows, stdlib function samples and plain windows (exact fractions, response-only
masks, pure function of the step), and the mix through the shared training loop (exact
resume)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from jaxspec.training.build import _sft_distill_data, build_data, distill_rows
from jaxspec.training.config import TrainConfigError, load_config
from jaxspec.training.data import DataError, PackedDataset
from jaxspec.training.distill import clean_rows, read_distill
from jaxspec.training.loop import train
from jaxspec.training.sft import SFTMixDataset, distill_samples, pack_samples
from tests.training.test_train import tiny_cfg, tiny_model

EOS, MASK, CAP, T = 2, 16, 6, 10


def _row(prompt, answer, split="train"):
    return {
        "i": 0,
        "kind": "code",
        "split": split,
        "source": "x.py",
        "prompt": prompt,
        "answer": answer,
    }


def test_eos_only_where_the_model_ended_the_answer():
    rows = [
        _row([5, 6], [7, 8, 9]),  # ended: + EOS + EOS padding
        _row([5, 6, 7, 8], [9] * CAP),  # cut at the budget, fills T: no EOS
        _row([5], [9] * CAP),  # cut, 1 + 6 < T: dropped
        _row([5, 6, 7, 8, 9], [10, 11, 12, 13, 14]),  # ended but 5 + 5 + EOS > T: open
        _row([5] * T, [7]),  # prompt fills the row: dropped
        _row([MASK, 5, 6], [7, MASK, 8]),
    ]  # [MASK] ids removed, then ended
    toks, plen, st = distill_samples(rows, T, EOS, answer_cap=CAP, drop_ids=(MASK,))
    np.testing.assert_array_equal(
        toks,
        [
            [5, 6, 7, 8, 9, EOS, EOS, EOS, EOS, EOS],
            [5, 6, 7, 8, EOS, EOS, EOS, EOS, EOS, EOS],
            [5, 6, 7, 8, 9, 9, 9, 9, 9, 9],
            [5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
        ],
    )
    np.testing.assert_array_equal(plen, [2, 2, 4, 5])
    assert st == {
        "rows": 6,
        "ended": 2,
        "open": 2,
        "dropped_cut_short": 1,
        "dropped_prompt_too_long": 1,
        "response_tokens": 8 + 8 + 6 + 5,
    }
    # an ended answer one token short of the budget still gets its EOS
    toks, _, st = distill_samples([_row([5], [9] * (CAP - 1))], T, EOS, answer_cap=CAP)
    assert st["ended"] == 1 and toks[0, CAP] == EOS


def _three_way(fd=0.5, fs=0.25, seed=3):
    cfg = load_config(
        "configs/train/dream-smollm2-135m-v3.yaml",
        [
            f"data.seq_len={T}",
            f"data.distill_fraction={fd}",
            f"data.sft_fraction={fs}",
            f"train.seed={seed}",
        ],
    )
    rows = [_row([20 + i, 21], [30 + i] * 3) for i in range(5)] + [
        _row([40 + i, 41], [50 + i] * 2, "val") for i in range(2)
    ]
    sft = {
        s: pack_samples([([60 + i], [70 + i] * 4) for i in range(n)], T, EOS)[:2]
        for s, n in (("train", 3), ("val", 2))
    }
    sft["meta"] = {}
    windows = (
        PackedDataset(np.full(40 * T, 90, np.int32), T, 1),
        PackedDataset(np.full(8 * T, 91, np.int32), T, 1),
    )
    return _sft_distill_data(cfg, rows, sft, windows, EOS, MASK, {})


def _kind(sample):
    first = int(sample[0, 0])
    return {2: "distill", 4: "distill", 6: "sft", 9: "window"}[first // 10]


def test_three_way_mix_fractions_masks_and_split():
    train_ds, val_ds, meta = _three_way()
    b = train_ds.batch(5, 16)
    assert b.shape == (16, 2, T) and b.dtype == np.int32
    kinds = [_kind(x) for x in b]
    assert (kinds.count("distill"), kinds.count("sft"), kinds.count("window")) == (8, 4, 4)
    for x, k in zip(b, kinds):
        plen = {"distill": 2, "sft": 1, "window": 0}[k]
        # only the response (answer, EOS and padding) is masked; windows entirely
        np.testing.assert_array_equal(x[1], np.arange(T) >= plen)
        if k == "distill":
            assert list(x[0, 2:6]) == [x[0, 2]] * 3 + [EOS] and (x[0, 5:] == EOS).all()
    # held-out: only the file's val rows, the val function samples and the val windows
    vb = np.concatenate(val_ds.fixed_batches(2, 8))
    firsts = {int(x[0, 0]) for x in vb}
    assert firsts <= {40, 41, 60, 61, 91} and {40, 41} <= firsts
    assert meta["distill"]["train"]["ended"] == 5 and meta["distill"]["val"]["ended"] == 2
    # every distilled train row is used once per epoch of the rows
    starts = [int(train_ds.sample(k)[0, 0]) for k in range(1, 20, 2)]
    assert sorted(starts) == sorted([20, 21, 22, 23, 24] * 2)


def test_three_way_mix_is_a_pure_function_of_the_step():
    a, _, _ = _three_way()
    b, _, _ = _three_way()
    np.testing.assert_array_equal(a.batch(7, 8), b.batch(7, 8))
    # resumable indexing: step s of n samples is global samples s*n .. s*n + n - 1
    np.testing.assert_array_equal(a.batch(2, 8), b.batch(1, 16)[:8])
    np.testing.assert_array_equal(a.batch(3, 4), np.stack([b.sample(k) for k in range(12, 16)]))
    c, _, _ = _three_way(seed=4)
    assert not all(np.array_equal(a.batch(s, 8), c.batch(s, 8)) for s in range(4))


def test_fraction_bounds_and_nested_mix():
    cfg = load_config(
        "configs/train/dream-smollm2-135m-v3.yaml",
        ["data.sft_fraction=0.6", "data.distill_fraction=0.5"],
    )
    with pytest.raises(TrainConfigError, match="sft_fraction \\+ data.distill_fraction"):
        build_data(cfg, None, MASK, log=lambda m: None)
    train_ds, _, _ = _three_way(fd=1.0, fs=0.0)  # all distilled rows
    assert {_kind(x) for x in train_ds.batch(0, 8)} == {"distill"}
    train_ds, _, _ = _three_way(fd=0.0, fs=1.0)  # the v2 SFT rows only
    assert {_kind(x) for x in train_ds.batch(0, 8)} == {"sft"}


def test_clean_rows_drops_loops_and_cut_answers():
    """The filter keeps an answer iff its repeated 4-gram rate is within the bound (and, with
    ``ended_only``, it is shorter than the budget); counts add up; bad bounds are errors."""
    loop = [7, 8, 9, 10] * 4  # 16 tokens, 13 4-grams of which 9 repeat: rate 9/13
    once = list(range(30, 42))  # no repeat, 12 tokens: cut at a budget of 12
    ended = [50, 51, 52, 53, 54, 50, 51, 52, 53, 54, 55]  # 8 4-grams, 2 repeated: rate 0.25
    rows = [_row([1], loop), _row([1], once), _row([1], ended, "val")]
    kept, st = clean_rows(rows, answer_cap=12, max_repeated_ngram=0.3)
    assert [r["answer"] for r in kept] == [once, ended]
    assert st == {"rows": 3, "kept": 2, "dropped_looping": 1, "dropped_cut": 0}
    kept, st = clean_rows(rows, answer_cap=12, max_repeated_ngram=0.2, ended_only=True)
    assert kept == [] and (st["dropped_looping"], st["dropped_cut"]) == (2, 1)
    kept, st = clean_rows(rows, answer_cap=12, ended_only=True)
    assert [r["answer"] for r in kept] == [ended] and st["dropped_cut"] == 2
    assert clean_rows(rows, answer_cap=12)[0] == rows
    with pytest.raises(DataError, match="max_repeated_ngram must lie in"):
        clean_rows(rows, answer_cap=12, max_repeated_ngram=1.5)


def test_distill_filter_in_the_config(tmp_path):
    """``data.distill_max_repeated_ngram`` / ``distill_ended_only`` filter the rows
    ``distill_rows`` returns (``build_data`` builds the distill mixes from them) and the DFlash
    rows; out of range and a filter that leaves no train row are one-line errors."""
    from jaxspec.training.dflash_run import build_rows

    path = tmp_path / "d.jsonl"
    looping = _row([5, 6], [7, 8, 9, 10] * 48)  # at the 192-token budget, looping
    clean = _row([5, 6], [20 + i for i in range(40)])
    path.write_text("".join(json.dumps(r) + "\n" for r in [looping, clean, looping]))
    base = ["data.source=stdlib-sft+distill", f"data.distill={path}"]
    cfg = load_config("configs/train/dream-smollm2-135m-v3.yaml", base)
    rows, kept = distill_rows(cfg, log=lambda m: None)
    assert len(rows) == 3 and kept is None
    cfg = load_config(
        "configs/train/dream-smollm2-135m-v3.yaml", base + ["data.distill_max_repeated_ngram=0.2"]
    )
    rows, kept = distill_rows(cfg, log=lambda m: None)
    assert rows == [clean] and kept["dropped_looping"] == 2
    with pytest.raises(TrainConfigError, match="distill_max_repeated_ngram must be in"):
        load_config(
            "configs/train/dream-smollm2-135m-v3.yaml",
            base + ["data.distill_max_repeated_ngram=2"],
        )
    path.write_text(json.dumps(looping) + "\n")
    with pytest.raises(TrainConfigError, match="no train row is left after the filter"):
        distill_rows(cfg, log=lambda m: None)
    d = load_config(
        "configs/train/dflash-smollm2-135m.yaml",
        [f"data.distill={path}", "data.distill_ended_only=true"],
    )
    with pytest.raises(TrainConfigError, match="no train row is left after the filter"):
        build_rows(d, EOS, log=lambda m: None)


def test_read_distill_reads_gzip(tmp_path):
    rows = [_row([1, 2], [3]), _row([4], [5, 6], "val")]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "d.jsonl").write_text(text)
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    assert read_distill(tmp_path / "d.jsonl.gz") == read_distill(tmp_path / "d.jsonl") == rows


def test_three_way_mix_trains_and_resumes_exactly(tmp_path):
    cfg = tiny_cfg(steps=6, ckpt_every=3, eval_every=3)
    rows = [_row([3, 7], [9, 12, 3]), _row([7, 7, 9], [12] * 14), _row([12], [7, 9])]
    dt, dp, _ = distill_samples(rows, 16, EOS, answer_cap=14)
    st, sp, _ = pack_samples([([3, 7], [9, 12, 3]), ([12, 3, 3], [7])], 16, EOS)
    stream = np.tile(np.asarray([3, 7, 9, 12], np.int32), 64)
    inner = SFTMixDataset(st, sp, PackedDataset(stream, 16, 1), 0.5, 1)
    data = (SFTMixDataset(dt, dp, inner, 0.5, 2), SFTMixDataset(dt, dp, inner, 0.5, 3))
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
