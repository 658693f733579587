"""The Colab TPU notebook (``notebooks/jaxspec_colab_tpu.ipynb``) runs headless on CPU.

Tiny checkpoints in the layouts a user brings (a LLaDA HF directory written by
:func:`models.checkpoint.export_hf`, a Dream directory over the tiny transformers Qwen2 of
``conftest.tiny_hf``, that Qwen2 directory itself as the causal verifier, a jaxspec checkpoint of a
SAR model with a ``[MASK]`` id) are passed to the notebook through its ``JAXSPEC_NB_*``
variables, and the notebook is executed by nbclient in a kernel of this interpreter. Every method
(SSD, Spiffy, DiffuSpec, SPACE) must be identical to its reference, and the memory the notebook
reports must be the loaded models' real parameter bytes. The committed notebook must equal what
``notebooks/make_notebook.py`` writes (outputs empty), and the docs' memory table script must
count the parameters the model code builds.

The install cell is skipped here (``JAXSPEC_NOTEBOOK_TEST``: this interpreter has jaxspec
already); ``tests/test_wheel.py`` runs it in a new virtual environment with the built wheel.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "jaxspec_colab_tpu.ipynb"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
LLADA_MASK_ID = 299


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "notebooks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _n_params(params) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))


def _qwen_and_dream_tokenizers(qwen_dir: Path, verifier: Path, dream: Path) -> None:
    """Mimic Qwen2.5 / Dream-v0: the verifier's tokenizer.json is the tiny BPE without its last
    merge (ids 0..298, the embedding keeps 300 rows); the Dream directory ships that BPE as a
    slow tokenizer (vocab.json + merges.txt, no tokenizer.json) plus an added ``<|mask|>`` at
    id 299, as Dream-v0 adds its mask token after Qwen2.5's ids."""
    from tokenizers import Tokenizer

    tj = json.loads((qwen_dir / "tokenizer.json").read_text())
    vocab, merges = tj["model"]["vocab"], tj["model"]["merges"]
    last = max(vocab, key=vocab.get)
    assert vocab[last] == 299 and "".join(merges[-1]) == last
    del vocab[last]
    tj["model"]["merges"] = merges[:-1]
    (verifier / "tokenizer.json").write_text(json.dumps(tj))
    Tokenizer.from_str(json.dumps(tj)).model.save(str(dream))  # vocab.json, merges.txt
    added = {t["content"]: t["id"] for t in tj["added_tokens"]} | {"<|mask|>": 299}
    (dream / "added_tokens.json").write_text(json.dumps(added))
    cfg = json.loads((qwen_dir / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {
        str(i): {"content": t, "special": True} for t, i in added.items()
    }
    (dream / "tokenizer_config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def checkpoints(tiny_hf, tmp_path_factory):
    """``{JAXSPEC_NB_* name: path}`` of the tiny checkpoints, and their parameter counts."""
    from jaxspec.testing.tiny import tiny_diffusion_model, tiny_model
    from models.checkpoint import export_hf, save_checkpoint
    from models.llama.params import load_hf_dir
    from tests.models.test_diffusion_models import _write_dream_dir

    qwen = tiny_hf("qwen2", tied=True)  # its tokenizer serves every checkpoint
    root = tmp_path_factory.mktemp("notebook-checkpoints")
    llada, llada_params = tiny_diffusion_model("llada", vocab=300, ctx=128)
    assert llada.config.mask_token_id == LLADA_MASK_ID
    export_hf(root / "llada", llada.config, llada_params)
    sar, sar_params = tiny_model(300, arch="qwen2", seed=2, ctx=128, mask_token_id=299)
    save_checkpoint(root / "space", sar.config, sar_params)
    for d in ("llada", "space"):
        for f in TOKENIZER_FILES:
            shutil.copy(qwen.path / f, root / d / f)
    verifier = shutil.copytree(qwen.path, root / "qwen")  # the session fixture stays untouched
    _write_dream_dir(qwen, root / "dream")  # the verifier's weights as a Dream dLLM: the drafter
    _qwen_and_dream_tokenizers(qwen.path, verifier, root / "dream")
    qwen_params = _n_params(load_hf_dir(qwen.path)[1])
    paths = {
        "DLLM": root / "llada",
        "DRAFTER": root / "dream",
        "VERIFIER": verifier,
        "SPACE_MODEL": root / "space",
    }
    counts = {
        "dllm": _n_params(llada_params),
        "drafter": qwen_params,
        "verifier": qwen_params,
        "space": _n_params(sar_params),
    }
    return paths, counts


def _kernel(tmp_path: Path, monkeypatch) -> str:
    """A kernelspec running this interpreter (the venv's ipykernel), found first through
    ``$JUPYTER_PATH`` whatever kernels the user has installed."""
    d = tmp_path / "jupyter" / "kernels" / "jaxspec-notebook-test"
    d.mkdir(parents=True)
    (d / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "jaxspec notebook test",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return d.name


def test_committed_notebook_is_the_generated_one():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert _script("make_notebook").main(["--check"]) == 0
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert [c for c in code if "parameters" in c.metadata.get("tags", [])]


def test_notebook_runs_every_method_identical_to_its_reference(checkpoints, tmp_path, monkeypatch):
    paths, counts = checkpoints
    out = tmp_path / "out"
    env = {
        "DLLM": paths["DLLM"],
        "DRAFTER": paths["DRAFTER"],
        "VERIFIER": paths["VERIFIER"],
        "SPACE_MODEL": paths["SPACE_MODEL"],
        "DLLM_REPO": "",
        "VERIFIER_REPO": "",
        "DTYPE": "float32",
        "MESH": "auto",
        "PROMPT": "def add(a, b):",
        "CHAT": 1,
        "GEN_LENGTH": 16,
        "BLOCK_LENGTH": 8,
        "CACHE": "dual",
        "MAX_NEW_TOKENS": 16,
        "DIFFUSPEC_K_MAX": 6,
        "DIFFUSPEC_K_MIN": 3,
        "PROXY_FILES": 2,
        "MASK_GROUPS": 3,
        "OUT_DIR": out,
    }
    for k, v in env.items():
        monkeypatch.setenv(f"JAXSPEC_NB_{k}", str(v))
    monkeypatch.setenv("JAXSPEC_NOTEBOOK_TEST", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("JAXSPEC_COMPILE_CACHE", jax.config.jax_compilation_cache_dir or "off")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb,
        kernel_name=_kernel(tmp_path, monkeypatch),
        timeout=600,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()

    result = json.loads((out / "speedup.json").read_text())
    rows = {r["method"]: r for r in result["rows"]}
    assert list(rows) == ["ssd", "spiffy", "diffuspec", "space"]
    assert {m: r["reference"] for m, r in rows.items()} == {
        "ssd": "stepwise",
        "spiffy": "stepwise",
        "diffuspec": "ar",
        "space": "ar",
    }
    assert all(r["identical"] for r in rows.values()), rows
    for m in ("ssd", "spiffy"):  # every generated position, one token per reference forward
        assert rows[m]["tokens"] == 16 and rows[m]["reference_nfe"] >= 16
    assert rows["diffuspec"]["draft_nfe"] > 0 and rows["space"]["draft_nfe"] == 0
    assert all(0 < r["nfe"] and 0 < r["tokens"] for r in rows.values())

    mem = {m["role"]: m for m in result["memory"]}
    assert {r: m["parameters"] for r, m in mem.items()} == counts
    for m in mem.values():  # float32 on one device: all the weights on it
        assert m["weights_gb"] == pytest.approx(4 * m["parameters"] / 1e9)
        assert m["max_per_device_gb"] == pytest.approx(m["weights_gb"]) and m["devices"] == 1
    assert mem["dllm"]["family"] == "DiffusionLM" and mem["space"]["family"] == "CausalLM"

    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "identical to reference" in text and "| ssd |" in text and "| NO |" not in text
    # the Dream directory's tokenizer.json was built from vocab.json + merges.txt: it tokenizes
    # like the verifier's and has the added [MASK] at 299
    assert "wrote tokenizer.json (300 ids, 4 added tokens)" in text
    assert "the verifier's plus 1 token(s) ['<|mask|>']" in text
    from models.tokenizer import load_tokenizer

    drafter_tok, verifier_tok = load_tokenizer(paths["DRAFTER"]), load_tokenizer(paths["VERIFIER"])
    sample = "<|im_start|>user\ndef add(a, b):\n    return a + b  # 42 théorie\n<|im_end|>\n"
    assert drafter_tok.encode(sample) == verifier_tok.encode(sample)
    assert drafter_tok.encode("<|mask|>") == [299] and 299 not in verifier_tok.encode("<|mask|>")
    assert (out / "speedup.png").stat().st_size > 0
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_memory_table_counts_the_model_code_parameters():
    """The memory table's script: parameter counts from ``jax.eval_shape`` of the model equal
    the closed formula (checked inside ``rows``) and the published sizes; a 28-head model
    cannot be split over 8 devices, so its 8-device mesh is 2x4."""
    table = {r["model"]: r for r in _script("memory_table").rows()}
    assert 8.0e9 < table["LLaDA-8B-Instruct"]["params"] < 8.1e9
    assert 7.6e9 < table["Qwen2.5-7B-Instruct"]["params"] < 7.65e9
    assert table["Qwen2.5-7B-Instruct"]["mesh_8"] == "2x4"
    assert table["LLaDA-8B-Instruct"]["mesh_8"] == "1x8"
    assert (
        table["LLaDA-8B-Instruct"]["bf16_per_device_8"]
        < table["LLaDA-8B-Instruct"]["bf16_gb"] / 7.9
    )
