"""Model sharding (:mod:`models.sharding`): the rules as data, mesh errors, and every method
on 4 and 8 fake CPU devices giving the tokens and NFE of one device (issue 18).

The multi-device runs happen in subprocesses (``tests/models/sharding_worker.py``,
``scripts.generate``) because the fake device count must be set before JAX starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from jaxspec.methods import METHODS
from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model, tiny_xlnet
from models.sharding import (
    RULES,
    MeshError,
    check_mesh,
    make_mesh,
    param_shardings,
    parse_mesh,
    partition_spec,
)

ROOT = Path(__file__).resolve().parents[2]


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    )
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _worker(devices: int, *args: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.models.sharding_worker", "--devices", str(devices), *args],
        cwd=ROOT,
        env=_env(devices),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# ------------------------------------------------------------------------ rules (in process)

MESH = AbstractMesh((2, 4), ("data", "model"))


def test_causal_rules_megatron_layout():
    cfg = tiny_model()[0].config  # 4 heads, 2 KV heads, MLP 64, vocab 64
    spec = lambda path, shape: partition_spec(cfg, MESH, path, shape)
    assert spec("layers/wq", (2, 32, 32)) == P(None, None, "model")  # column parallel
    assert spec("layers/w_up", (2, 32, 64)) == P(None, None, "model")
    assert spec("layers/wo", (2, 32, 32)) == P(None, "model", None)  # row parallel
    assert spec("layers/w_down", (2, 64, 32)) == P(None, "model", None)
    assert spec("layers/wk", (2, 32, 16)) == P(None, None, None)  # 2 KV heads < 4: replicated
    assert spec("embed", (64, 32)) == P("model", None)  # vocabulary rows
    assert spec("layers/attn_norm", (2, 32)) == P(None, None)
    # the decode layouts: per-layer, output-major copies and int8 scales
    assert spec("layers/wq", (32, 32)) == P(None, "model")
    assert spec("layers/wq_t", (32, 32)) == P("model", None)
    assert spec("layers/w_down_t", (32, 64)) == P(None, "model")
    assert spec("layers/w_up_s", (64,)) == P("model")
    assert spec("layers/wq_q_t", (32, 32)) == P("model", None)  # int8, output-major
    # a vocabulary the model axis does not divide is replicated
    assert partition_spec(cfg.replace(vocab_size=66), MESH, "embed", (66, 32)) == P(None, None)


def test_xlnet_rules_and_every_parameter_has_a_rule():
    model, params = tiny_xlnet(11, 1, n_head=4)
    assert partition_spec(model.config, MESH, "layers/q", (2, 16, 4, 4)) == P(
        None, None, "model", None
    )
    shard = param_shardings(model.config, params, make_mesh("1x1"))
    assert set(shard) == set(params)
    for m, p in (tiny_model(), tiny_diffusion_model("dream")):
        param_shardings(m.config, p, make_mesh("1x1"))  # no KeyError: every leaf has a rule
    assert set(RULES) == {"causal", "xlnet"}
    with pytest.raises(KeyError, match="no sharding rule for parameter 'layers/nope'"):
        partition_spec(model.config, MESH, "layers/nope", (2, 3))


def test_mesh_errors():
    cfg = tiny_model()[0].config
    with pytest.raises(
        MeshError, match="model axis of 3 devices does not divide the model's 4 attention heads"
    ):
        check_mesh(cfg, AbstractMesh((1, 3), ("data", "model")))
    with pytest.raises(MeshError, match="data axis of 2 devices does not divide the batch of 3"):
        check_mesh(cfg, MESH, batch=3)
    with pytest.raises(MeshError, match="needs 16 devices, but only"):
        make_mesh("2x8")
    with pytest.raises(MeshError, match="is not DATAxMODEL"):
        parse_mesh("4")
    assert parse_mesh("2x4") == (2, 4) and parse_mesh((1, 8)) == (1, 8)


# ------------------------------------------------------------------- fake devices (subprocess)


@pytest.mark.slow  # 5 min on 2 cores: `make test-all`
def test_every_method_identical_on_a_mesh():
    """All registry methods, weights over 4 fake devices and prompts over 2 (a weights-only
    ``1xN`` mesh is the same program with a data axis of 1; ``test_cli_mesh`` runs ``2x2``
    and the mesh errors)."""
    rows = _worker(8, "--mesh", "2x4", "--methods", "all")
    assert [r["method"] for r in rows] == list(METHODS)
    for r in rows:
        assert r["on_mesh"] and "model" in r["wq_spec"], r
        assert r["tokens"] and r["nfe"], r
        assert not r["fused_on_mesh"], r  # q/k/v heads stay split over the model axis


@pytest.mark.slow  # 50 s: `make test-all`; make test keeps the mesh CLI and shard-by-shard loading
def test_sampling_identical_on_a_mesh():
    # one per decoder loop (causal, dLLM, AS-ARM); sps / space sample in the same causal loop
    rows = _worker(8, "--mesh", "2x4", "--temperature", "0.9", "--methods", "ngram,ssd,assd")
    assert len(rows) == 3
    for r in rows:
        assert r["tokens"] and r["nfe"], r


def test_loading_shard_by_shard(tiny_qwen2):
    (r,) = _worker(8, "--mesh", "2x4", "--checkpoint", str(tiny_qwen2.path))
    assert (
        r
        == {
            "values": True,
            "shardings": True,
            "split_leaves": r["split_leaves"],
            "dtype": "bfloat16",
        }
        and r["split_leaves"] >= 6
    )


def _generate(devices: int, *args: str):
    return subprocess.run(
        [sys.executable, "-m", "scripts.generate", *args],
        cwd=ROOT,
        env=_env(devices),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_cli_mesh(tiny_llama):
    base = [
        "--model",
        "hf-directory",
        "--weights",
        str(tiny_llama.path),
        "--prompt",
        "ab",
        "--prompt",
        "cd",
        "--max-new-tokens",
        "8",
    ]
    ok = _generate(4, *base, "--mesh", "2x2", "--method", "ngram", "--compare")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "identical" in ok.stdout
    for mesh, needle in (
        ("1x3", "does not divide the model's"),
        ("1x8", "needs 8 devices"),
        ("4x1", "does not divide the batch of 2"),
    ):
        bad = _generate(4, *base, "--mesh", mesh)
        assert bad.returncode == 2, (mesh, bad.stderr[-2000:])
        lines = bad.stderr.strip().splitlines()
        assert lines[-1].startswith("error:") and needle in lines[-1], (mesh, lines[-3:])
