"""``scripts.calibrate --dtype / --mesh`` (issue 18), on a tiny Dream directory at the smallest
settings: the flags load the model as ``scripts.generate`` does (``--dtype float32 --mesh 1x1``
on CPU records exactly what the default float32 load records, so the selected graph is the
same), and a mesh or dtype that cannot be had is one ``error:`` line and exit code 2."""

from __future__ import annotations

import json
import shutil

import pytest

from scripts import calibrate as calib_cli

pytest.importorskip("transformers")

from tests.models.test_diffusion_models import _write_dream_dir  # noqa: E402

CTX = 2048  # HumanEval prompts fit the tiny tokenizer's context


@pytest.fixture(scope="module")
def dream_dir(tiny_hf, tmp_path_factory):
    qwen = tiny_hf("qwen2", tied=True, max_position_embeddings=CTX)
    d = _write_dream_dir(qwen, tmp_path_factory.mktemp("calib") / "dream")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen.path / name, d / name)
    return d


def _argv(d, out, *extra):
    return [
        "--model",
        "auto",
        "--weights",
        str(d),
        "--prompts",
        "1",
        "--sizes",
        "2",
        "--lookahead",
        "2",
        "--gen-length",
        "8",
        "--block-length",
        "4",
        "--cache",
        "none",
        "--batch",
        "1",
        "--out-dir",
        str(out),
        *extra,
    ]


def test_calibrate_dtype_and_mesh(dream_dir, tmp_path, capsys, monkeypatch):
    import models.registry

    seen, load = [], models.registry.load_model

    def spy(*a, **kw):  # what calibrate asks the loader for
        seen.append((kw.get("dtype"), None if kw.get("mesh") is None else dict(kw["mesh"].shape)))
        return load(*a, **kw)

    monkeypatch.setattr(models.registry, "load_model", spy)
    assert calib_cli.main(_argv(dream_dir, tmp_path / "default")) == 0
    default = json.loads(capsys.readouterr().out)
    assert (
        calib_cli.main(_argv(dream_dir, tmp_path / "flags", "--dtype", "float32", "--mesh", "1x1"))
        == 0
    )
    flags = json.loads(capsys.readouterr().out)
    # (load_model calls itself for the plain load under a dtype / mesh: those calls pass neither)
    assert [c for c in seen if c != (None, None)] == [
        ("auto", None),
        ("float32", {"data": 1, "model": 1}),
    ]
    assert flags["graphs"]["2"] and flags == default
    a = json.loads((tmp_path / "default" / "D2.json").read_text())
    b = json.loads((tmp_path / "flags" / "D2.json").read_text())
    a.get("meta", {}).pop("record_seconds", None)
    b.get("meta", {}).pop("record_seconds", None)
    assert a == b


@pytest.mark.parametrize(
    "extra,needles",
    [
        # too few devices, or (with 3+ devices) a model axis that does not divide the 4 heads
        (
            ["--mesh", "1x3"],
            ("mesh 1x3 needs 3 devices", "model axis of 3 devices does not divide"),
        ),
        (["--mesh", "nonsense"], ("is not DATAxMODEL",)),
        (["--dtype", "float16"], ("float16",)),
    ],
)
def test_calibrate_bad_mesh_or_dtype_one_line_exit_2(dream_dir, tmp_path, capsys, extra, needles):
    assert calib_cli.main(_argv(dream_dir, tmp_path / "g", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert any(n in err[0] for n in needles), err
    assert not (tmp_path / "g" / "D2.json").exists()
