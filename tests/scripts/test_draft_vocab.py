"""``scripts.draft_vocab``: the vocabulary it writes (the train rows' most frequent answer
tokens and the EOS ids), its coverage figures, and one-line errors (exit 2) on bad input."""

from __future__ import annotations

import gzip
import json
import types

import numpy as np
import pytest

from scripts import draft_vocab


def _distill(path, rows):
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def _fake_tokenizer(monkeypatch):
    import models.registry as registry

    tok = types.SimpleNamespace(eos_token_ids=[2], vocab_size=64, backend=None)
    monkeypatch.setattr(registry, "load_tokenizer_preset", lambda name, log=None: tok)


def test_writes_the_most_frequent_train_tokens(tmp_path, monkeypatch, capsys):
    """Counted on the train rows only (the val row's tokens are not), EOS kept; the coverage
    figures are the shares of answer tokens inside the vocabulary."""
    _fake_tokenizer(monkeypatch)
    f = _distill(
        tmp_path / "d.jsonl.gz",
        [
            {"split": "train", "prompt": [1], "answer": [5, 5, 5, 9, 9, 11]},
            {"split": "train", "prompt": [1], "answer": [9, 12]},
            {"split": "val", "prompt": [1], "answer": [40, 40, 40, 5]},
        ],
    )
    out = tmp_path / "v.npy"
    assert draft_vocab.main(["--distill", str(f), "--size", "3", "--out", str(out)]) == 0
    np.testing.assert_array_equal(np.load(out), [2, 5, 9])
    report = json.loads(capsys.readouterr().out)
    assert report["size"] == 3 and report["train_answer_tokens"] == 8
    assert report["train_coverage"] == pytest.approx(6 / 8)
    assert report["val_answer_tokens"] == 4 and report["val_coverage"] == pytest.approx(1 / 4)


@pytest.mark.parametrize(
    "rows,extra,message",
    [
        (None, [], "distillation file does not exist"),
        ([{"split": "val", "answer": [1]}], [], "no train rows"),
        ([{"split": "train", "answer": [1]}], ["--size", "0"], "--size must be >= 1, got 0"),
        ([{"split": "train", "answer": [70]}], [], "outside the target's vocabulary 0..63"),
    ],
)
def test_bad_input(tmp_path, monkeypatch, capsys, rows, extra, message):
    _fake_tokenizer(monkeypatch)
    f = tmp_path / "d.jsonl.gz"
    if rows is not None:
        _distill(f, rows)
    rc = draft_vocab.main(["--distill", str(f), "--out", str(tmp_path / "v.npy"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and message in err[-1], err
