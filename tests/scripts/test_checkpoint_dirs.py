"""Checkpoint directories of every family through every command-line entry point (issue 18).

Tiny checkpoints written by transformers (a Qwen2 and a Llama ``save_pretrained``, an
``XLNetLMHeadModel``), the LLaDA / Dream layouts made from them as in
``tests/models/test_diffusion_models.py``, and a jaxspec checkpoint of the Qwen2 with a [MASK]
id (a SAR-SFT stand-in for SPACE), all sharing one tiny byte-level BPE ``tokenizer.json``.
``--model auto --weights DIR`` must read the family from the directory and:

* run every method of that family in ``scripts.generate`` with ``--compare``: lossless
  methods report outputs identical to their reference;
* run ``scripts.benchmark`` (the suite of the family), ``scripts.calibrate`` (dLLM) and
  ``scripts.evaluate`` (dLLM, AS-ARM) at their smallest settings;
* turn every bad directory (unknown architecture, missing shard, a tensor of the wrong shape,
  a tokenizer larger than the embedding) and every method / suite / entry point of another
  family into one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from scripts import benchmark as bench_cli
from scripts import calibrate as calib_cli
from scripts import evaluate as eval_cli
from scripts import generate as gen_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.models.test_diffusion_models import _write_dream_dir, _write_llada_dir  # noqa: E402

CTX = 2048  # long enough for HumanEval prompts in the tiny tokenizer (benchmark, calibrate)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PROMPT = "def add(a, b):"
INFILL = "def f(a):\n    <mask:6>\n"


def _copy_tokenizer(src: Path, dst: Path) -> Path:
    for f in TOKENIZER_FILES:
        shutil.copy(src / f, dst / f)
    return dst


def _edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def dirs(tiny_hf, tmp_path_factory):
    """``{name: directory}`` for qwen2, llama, llada, dream, xlnet and sar (see the module
    docstring). Fresh copies under this module's tmp dirs: the session fixtures stay untouched."""
    from models.checkpoint import save_checkpoint
    from models.llama.params import load_weights

    root = tmp_path_factory.mktemp("ckpt-dirs")
    qwen = tiny_hf("qwen2", tied=True, max_position_embeddings=CTX)
    llama = tiny_hf("llama", tied=False, max_position_embeddings=CTX)
    out = {"qwen2": qwen.path, "llama": llama.path}
    out["llada"] = _copy_tokenizer(llama.path, _write_llada_dir(llama, root / "llada"))
    _edit_config(out["llada"], max_sequence_length=CTX)
    out["dream"] = _copy_tokenizer(qwen.path, _write_dream_dir(qwen, root / "dream"))
    # a Dream drafter with another tokenizer (320 ids, 20 more BPE merges): DiffuSpec drafts
    # for the Qwen2 target through text (jaxspec.causal.hetero)
    other = tiny_hf("qwen2", tied=True, max_position_embeddings=CTX, vocab_size=320)
    out["dream_vocab320"] = _copy_tokenizer(other.path, _write_dream_dir(other, root / "dream320"))

    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(
        vocab_size=300,
        d_model=32,
        n_layer=1,
        n_head=2,
        d_inner=64,
        dropout=0.0,
        attn_type="bi",
        bi_data=False,
        mem_len=None,
    )
    xl = transformers.XLNetLMHeadModel(cfg).eval().float()
    with torch.no_grad():  # peaked conditionals: greedy choices far from ties
        for p in xl.parameters():
            if p.ndim >= 2:
                p.mul_(4.0)
    xl.save_pretrained(root / "xlnet", safe_serialization=True)
    out["xlnet"] = _copy_tokenizer(qwen.path, root / "xlnet")

    from jaxspec.causal.dflash import DFlashSpec, init_drafter, save_drafter

    config, params = load_weights(qwen.path)  # the Qwen2 with a [MASK] id: SPACE runs on it
    spec = DFlashSpec.for_target(config, block_size=4)  # a random DFlash drafter for it
    out["dflash"] = root / "dflash.safetensors"
    save_drafter(out["dflash"], spec, init_drafter(spec, seed=0))
    save_checkpoint(root / "sar", config.replace(mask_token_id=299), params)
    out["sar"] = _copy_tokenizer(qwen.path, root / "sar")
    return out


@pytest.fixture(autouse=True)
def _small_proxy_corpus(monkeypatch):
    """DiffuSpec's 3-gram proxy is fitted on the tokenized stdlib; tokenizing 12 MB with the
    tiny tokenizer would dominate this file's time, so the proxy sees a small corpus. It only
    shapes the drafts: the --compare identity to AR does not depend on it."""
    import jaxspec.training.data as data

    def small(tokenizer, holdout, *, sep_id, **kw):
        ids = np.asarray(tokenizer.encode("def add(a, b):\n    return a + b\n" * 20), np.uint16)
        return ids, ids[:10], {}

    monkeypatch.setattr(data, "stdlib_tokens", small)


# ----------------------------------------------------------------------------- scripts.generate
COMMON = ["--quiet", "--compare"]
CAUSAL = ["--prompt", PROMPT, "--max-new-tokens", "12"]
DLLM = ["--prompt", PROMPT, "--gen-length", "8", "--block-length", "4"]
GEN_CASES = [  # (directory, method, extra flags); "{dream}" etc. are filled in from `dirs`
    ("qwen2", "ar", CAUSAL),
    ("qwen2", "ngram", CAUSAL + ["--draft-length", "3"]),
    (
        "qwen2",
        "sps",
        CAUSAL + ["--draft-model", "auto", "--draft-weights", "{llama}", "--draft-length", "3"],
    ),
    (
        "qwen2",
        "diffuspec",
        CAUSAL + ["--draft-model", "auto", "--draft-weights", "{dream}", "--draft-length", "4"],
    ),
    (
        "qwen2",
        "specdiff",
        CAUSAL
        + [
            "--draft-model",
            "hf-directory",
            "--draft-weights",
            "{dream}",
            "--draft-length",
            "4",
            "--drafter-cache",
            "prefix",
        ],
    ),
    (
        "qwen2",
        "diffuspec",
        CAUSAL
        + ["--draft-model", "auto", "--draft-weights", "{dream_vocab320}", "--draft-length", "4"],
    ),
    ("sar", "space", CAUSAL + ["--mask-groups", "3"]),
    ("qwen2", "dflash", CAUSAL + ["--dflash-drafter", "{dflash}", "--draft-length", "3"]),
    (
        "qwen2",
        "dflash",
        CAUSAL + ["--dflash-drafter", "{dflash}", "--draft-length", "3", "--ngram-first"],
    ),
    *[
        (d, m, DLLM + extra)
        for d in ("llada", "dream")
        for m, extra in (
            ("stepwise", []),
            ("fixed-k", ["--tokens-per-step", "2"]),
            ("threshold", ["--threshold", "0.5"]),
            ("ssd", ["--draft-length", "3"]),
            ("spiffy", []),
        )
    ],
    ("xlnet", "sequential", ["--infill", INFILL]),
    *[
        ("xlnet", m, ["--infill", INFILL, "--draft-length", "3"])
        for m in ("assd", "assd-ngram", "assd-fused", "assd-fused-ngram")
    ],
]
# their own reference (stepwise: one token per step here): --compare says so, runs nothing
REFERENCES = {"ar", "sequential", "stepwise"}
NOT_LOSSLESS = {"fixed-k", "threshold"}  # --compare reports, identity is not promised


@pytest.mark.parametrize(
    "name,method,extra",
    GEN_CASES,
    ids=[
        f"{d}-{m}"
        + ("-other-vocab" if "{dream_vocab320}" in x else "")
        + ("-ngram-first" if "--ngram-first" in x else "")
        for d, m, x in GEN_CASES
    ],
)
def test_generate_every_method_on_every_family(dirs, name, method, extra, capsys):
    """Every method of the family of ``DIR`` runs with ``--model auto --weights DIR``; the
    lossless ones print ``[compare] ... outputs: identical``."""
    argv = ["--model", "auto", "--weights", str(dirs[name]), "--method", method]
    argv += [a.format(**{k: str(v) for k, v in dirs.items()}) for a in extra] + COMMON
    rc = gen_cli.main(argv)
    cap = capsys.readouterr()
    assert rc == 0, (cap.out, cap.err)
    assert "NFE=" in cap.out, cap.out  # the method's stats line
    compare = [line for line in cap.out.splitlines() if line.startswith("[compare]")]
    if method in REFERENCES:
        assert len(compare) == 1 and "is its own reference" in compare[0], compare
        return
    assert len(compare) == 1, cap.out
    if method not in NOT_LOSSLESS:
        assert "outputs: identical" in compare[0], compare[0]


def test_generate_covers_every_method():
    """GEN_CASES names every registered method (a new method must join this test)."""
    from jaxspec.methods import METHODS

    assert {m for _, m, _ in GEN_CASES} == set(METHODS)


# ----------------------------------------------------------------------------- other entry points
def test_benchmark_suites_on_checkpoint_dirs(dirs, tmp_path, capsys):
    """``scripts.benchmark --model auto``: suite ar on the Qwen2 directory (jaxspec rows
    identical to jaxspec/ar), dllm on the LLaDA directory, assd on the XLNet directory."""
    out = tmp_path / "ar.json"
    rc = bench_cli.main(
        [
            "--suite",
            "ar",
            "--model",
            "auto",
            "--weights",
            str(dirs["qwen2"]),
            "--limit",
            "1",
            "--max-new-tokens",
            "4",
            "--systems",
            "jaxspec/ar",
            "jaxspec/ngram",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(r["identical_to_reference"] for r in rows), rows

    out = tmp_path / "dllm.json"
    rc = bench_cli.main(
        [
            "--suite",
            "dllm",
            "--model",
            "hf-directory",
            "--weights",
            str(dirs["llada"]),
            "--limit",
            "1",
            "--gen-length",
            "8",
            "--block-length",
            "4",
            "--methods",
            "stepwise",
            "--caches",
            "none",
            "--overhead-reps",
            "0",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["rows"]

    out = tmp_path / "assd.json"
    rc = bench_cli.main(
        [
            "--suite",
            "assd",
            "--model",
            "auto",
            "--weights",
            str(dirs["xlnet"]),
            "--limit",
            "1",
            "--assd-seq-len",
            "16",
            "--assd-k-sweep",
            "--assd-infill-tasks",
            "0",
            "--assd-no-judge",
            "--assd-methods",
            "assd",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["sequential", "assd"], rows


def test_calibrate_on_dream_dir(dirs, tmp_path, capsys):
    """``scripts.calibrate --model auto`` records stepwise runs of a Dream directory and
    writes a graph."""
    rc = calib_cli.main(
        [
            "--model",
            "auto",
            "--weights",
            str(dirs["dream"]),
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
            str(tmp_path),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    graph = json.loads((tmp_path / "D2.json").read_text())
    assert graph and json.loads(cap.out)["graphs"]["2"]


@pytest.mark.parametrize(
    "name,extra",
    [
        (
            "llada",
            [
                "--prompts",
                "2",
                "--prompt-length",
                "16",
                "--gen-length",
                "8",
                "--block",
                "4",
                "--batch",
                "2",
            ],
        ),
        (
            "xlnet",
            ["--sequences", "2", "--seq-len", "16", "--no-judge", "--no-greedy", "--batch", "2"],
        ),
    ],
)
def test_evaluate_on_checkpoint_dirs(dirs, name, extra, tmp_path, capsys):
    """``scripts.evaluate --model auto``: the masked-diffusion figures of a LLaDA directory
    (no AR columns: there is no base model) and the AS-ARM gate of an XLNet directory."""
    out = tmp_path / "gate.json"
    rc = eval_cli.main(["--model", "auto", "--weights", str(dirs[name]), "--out", str(out)] + extra)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(out.read_text())
    assert "verdict: " in cap.out and res["verdict"] in ("PASS", "FAIL")
    if name == "llada":
        assert res["head"] == "llada" and res["completions"]["ar"] is None
        assert len(res["samples"]["diffusion"]) == 2
    else:
        assert res["meta"]["format"] == "hf-xlnet" and len(res["snippets"]) == 2


def test_eos_gate_on_a_llada_directory(dirs, tmp_path, capsys):
    """``scripts.evaluate --model auto --eos-gate`` (issue 15's v2 gate): held-out function
    prompts, completions scored before their first EOS, the three checks and a verdict."""
    out = tmp_path / "eos.json"
    rc = eval_cli.main(
        [
            "--model",
            "auto",
            "--weights",
            str(dirs["llada"]),
            "--eos-gate",
            "--out",
            str(out),
            "--prompts",
            "2",
            "--gen-length",
            "8",
            "--block",
            "4",
            "--batch",
            "2",
            "--humaneval",
            "0",
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    res = json.loads(out.read_text())
    assert res["settings"]["prompts"] == 2 and len(res["checks"]) == 3
    assert res["verdict"] == ("PASS" if all(c["passed"] for c in res["checks"]) else "FAIL")
    assert f"verdict: {res['verdict']}" in cap.out
    assert set(res["masked_accuracy"]) == {"0.15", "0.50"}
    assert eval_cli.main(["--model", "auto", "--weights", str(dirs["llada"]), "--eos-gate"]) == 2
    assert "needs --out" in capsys.readouterr().err
    v3 = ["--model", "auto", "--weights", str(dirs["llada"]), "--eos-gate", "--gate-rule", "v3"]
    assert eval_cli.main(v3 + ["--out", str(out)]) == 2  # v3 compares with AR: no base here
    assert "needs the base" in capsys.readouterr().err


# ----------------------------------------------------------------------------- bad input
def _entry(kind: str, d: Path, tmp: Path):
    """``(main, argv)`` of one entry point on directory ``d`` at its smallest settings."""
    w = ["--model", "auto", "--weights", str(d)]
    return {
        "generate-causal": (gen_cli.main, w + ["--prompt", "x", "--max-new-tokens", "4"]),
        "generate-dllm": (
            gen_cli.main,
            w
            + ["--method", "stepwise", "--prompt", "x", "--gen-length", "8", "--block-length", "4"],
        ),
        "generate-asarm": (gen_cli.main, w + ["--method", "assd", "--infill", "x = <mask:3>"]),
        "benchmark-ar": (
            bench_cli.main,
            ["--suite", "ar"]
            + w
            + [
                "--limit",
                "1",
                "--max-new-tokens",
                "4",
                "--systems",
                "jaxspec/ar",
                "--out",
                str(tmp / "b.json"),
                "--no-progress",
            ],
        ),
        "benchmark-dllm": (
            bench_cli.main,
            ["--suite", "dllm"]
            + w
            + [
                "--limit",
                "1",
                "--gen-length",
                "8",
                "--block-length",
                "4",
                "--methods",
                "stepwise",
                "--caches",
                "none",
                "--out",
                str(tmp / "b.json"),
                "--no-progress",
            ],
        ),
        "benchmark-assd": (
            bench_cli.main,
            ["--suite", "assd"]
            + w
            + [
                "--limit",
                "1",
                "--assd-seq-len",
                "16",
                "--assd-k-sweep",
                "--assd-infill-tasks",
                "0",
                "--assd-no-judge",
                "--out",
                str(tmp / "b.json"),
                "--no-progress",
            ],
        ),
        "calibrate": (
            calib_cli.main,
            w
            + [
                "--prompts",
                "1",
                "--sizes",
                "2",
                "--gen-length",
                "8",
                "--block-length",
                "4",
                "--cache",
                "none",
                "--out-dir",
                str(tmp / "graphs"),
            ],
        ),
        "evaluate-dllm": (
            eval_cli.main,
            w + ["--prompts", "1", "--prompt-length", "16", "--gen-length", "8", "--block", "4"],
        ),
        "evaluate-asarm": (
            eval_cli.main,
            w + ["--sequences", "1", "--seq-len", "16", "--no-judge"],
        ),
    }[kind]


ENTRIES = {
    "causal": ("generate-causal", "benchmark-ar"),
    "dllm": ("generate-dllm", "benchmark-dllm", "calibrate", "evaluate-dllm"),
    "asarm": ("generate-asarm", "benchmark-assd", "evaluate-asarm"),
}
BASE = {"causal": "qwen2", "dllm": "dream", "asarm": "xlnet"}
SHAPE = {  # (tensor, stored shape, wrong stored shape, needle pieces)
    "causal": (
        "model.layers.1.self_attn.k_proj.weight",
        (32, 64),
        (16, 64),
        ("has shape (64, 16)", "expects (64, 32)"),
    ),
    "dllm": (
        "model.layers.1.self_attn.k_proj.weight",
        (32, 64),
        (16, 64),
        ("has shape (64, 16)", "expects (64, 32)"),
    ),
    "asarm": (
        "transformer.layer.0.ff.layer_1.weight",
        (64, 32),
        (48, 32),
        ("has shape (48, 32)", "expects (64, 32)"),
    ),
}


def _shard(src: Path, dst: Path) -> str:
    """Copy ``src`` to ``dst`` with its weights split into two safetensors shards and a
    ``model.safetensors.index.json``; returns the second shard's file name."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    half = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    weight_map = {}
    for fname, part in half.items():
        save_file({n: tensors[n] for n in part}, str(dst / fname))
        weight_map.update({n: fname for n in part})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def bad_dirs(dirs, tmp_path_factory):
    """``{(case, family): (directory, needles)}``: broken copies of the good directories."""
    from safetensors.numpy import load_file, save_file
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("bad-dirs")
    out = {}
    d = shutil.copytree(dirs["qwen2"], root / "unknown-arch")
    _edit_config(d, model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"])
    out["unknown-arch", "any"] = (
        d,
        ("unknown architecture (model_type 'gpt_neox'", "GPTNeoXForCausalLM"),
    )
    d = shutil.copytree(dirs["qwen2"], root / "no-arch")
    _edit_config(d, model_type=None, architectures=None)
    out["no-arch", "any"] = (d, ("names neither model_type nor architectures",))
    for fam, base in BASE.items():
        d = root / f"missing-shard-{fam}"
        gone = _shard(dirs[base], d)
        (d / gone).unlink()
        out["missing-shard", fam] = (d, ("safetensors shard is missing", gone))

        d = shutil.copytree(dirs[base], root / f"wrong-shape-{fam}")
        tensors = load_file(str(d / "model.safetensors"))
        name, good, bad, needles = SHAPE[fam]
        assert tensors[name].shape == good
        tensors[name] = np.zeros(bad, np.float32)
        save_file(tensors, str(d / "model.safetensors"))
        out["wrong-shape", fam] = (d, (f"tensor {name}", *needles))

        d = shutil.copytree(dirs[base], root / f"big-tokenizer-{fam}")
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        tok.add_tokens([f"<extra_{i}>" for i in range(5)])
        tok.save(str(d / "tokenizer.json"))
        out["big-tokenizer", fam] = (
            d,
            ("the tokenizer has 305 ids but the model's embedding has only 300 rows",),
        )
    return out


BAD_CASES = (
    [
        ("unknown-arch", "any", e)
        for e in ("generate-causal", "benchmark-ar", "calibrate", "evaluate-dllm")
    ]
    + [("no-arch", "any", "generate-causal")]
    + [
        (case, fam, e)
        for case in ("missing-shard", "wrong-shape", "big-tokenizer")
        for fam, entries in ENTRIES.items()
        for e in entries
    ]
)


def _one_error_line(err: str, needles) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("case,fam,entry", BAD_CASES, ids=[f"{c}-{f}-{e}" for c, f, e in BAD_CASES])
def test_bad_checkpoint_dir_one_line_exit_2(bad_dirs, case, fam, entry, tmp_path, capsys):
    d, needles = bad_dirs[case, fam]
    main, argv = _entry(entry, d, tmp_path)
    assert main(argv) == 2
    _one_error_line(capsys.readouterr().err, needles)


WRONG_FAMILY = [  # (entry point, directory, needles): a method / suite / tool of another family
    (
        "generate-causal",
        "llada",
        ("method 'ngram' needs a causal model", "llada", "is masked-diffusion"),
    ),
    (
        "generate-dllm",
        "qwen2",
        ("method 'stepwise' needs a masked-diffusion model", "qwen2", "is causal"),
    ),
    (
        "generate-causal",
        "xlnet",
        (
            "method 'ngram' needs a causal model",
            "xlnet",
            "is any-order (XLNet AS-ARM)",
            "with --infill",
        ),
    ),
    (
        "generate-asarm",
        "dream",
        ("method 'assd' needs an any-order (XLNet AS-ARM) model", "dream", "is masked-diffusion"),
    ),
    ("generate-asarm", "qwen2", ("method 'assd' needs an any-order", "is causal")),
    (
        "benchmark-ar",
        "llada",
        ("llada is a masked-diffusion model (dllm)", "suite ar takes causal models only"),
    ),
    ("benchmark-ar", "xlnet", ("any-order (XLNet AS-ARM) model (asarm)", "suite ar")),
    (
        "benchmark-dllm",
        "qwen2",
        ("qwen2", "is a causal model (causal)", "suite dllm takes masked-diffusion models only"),
    ),
    (
        "benchmark-assd",
        "dream",
        (
            "is a masked-diffusion model (dllm)",
            "suite assd takes any-order (XLNet AS-ARM) models only",
        ),
    ),
    ("calibrate", "qwen2", ("is a causal model (causal)", "scripts.calibrate takes masked-")),
    ("calibrate", "xlnet", ("is an any-order (XLNet AS-ARM) model", "scripts.calibrate")),
    ("evaluate-dllm", "qwen2", ("is a causal model (causal)", "scripts.evaluate")),
]


@pytest.mark.parametrize(
    "entry,name,needles", WRONG_FAMILY, ids=[f"{e}-{n}" for e, n, _ in WRONG_FAMILY]
)
def test_wrong_family_one_line_exit_2(dirs, entry, name, needles, tmp_path, capsys):
    main, argv = _entry(entry, dirs[name], tmp_path)
    if entry == "generate-causal":
        argv += ["--method", "ngram"]
    assert main(argv) == 2
    _one_error_line(capsys.readouterr().err, needles)


def test_family_detection(dirs, bad_dirs):
    """weights_family reads config.json (model_type, else architectures) and jaxspec files."""
    from models.config import ConfigError
    from models.registry import weights_family

    fam = {k: weights_family(v) for k, v in dirs.items() if k != "dflash"}  # a drafter file
    assert fam == {
        "qwen2": "causal",
        "llama": "causal",
        "llada": "dllm",
        "dream": "dllm",
        "dream_vocab320": "dllm",
        "xlnet": "asarm",
        "sar": "causal",
    }
    d = bad_dirs["no-arch", "any"][0]
    _edit_config(d, architectures=["XLNetLMHeadModel"])  # architectures alone decide
    try:
        assert weights_family(d) == "asarm"
    finally:
        _edit_config(d, architectures=None)
    with pytest.raises(ConfigError, match="unknown architecture"):
        weights_family(bad_dirs["unknown-arch", "any"][0])


def test_drafter_cache_across_vocabularies_one_line_exit_2(dirs, capsys):
    """The drafter prefix cache needs the target's vocabulary (the cross-vocabulary loop
    re-encodes the drafter's context every step): one line, exit 2."""
    argv = [
        "--model",
        "auto",
        "--weights",
        str(dirs["qwen2"]),
        "--method",
        "diffuspec",
        "--draft-model",
        "auto",
        "--draft-weights",
        str(dirs["dream_vocab320"]),
        "--drafter-cache",
        "prefix",
        *CAUSAL,
        "--quiet",
    ]
    assert gen_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "another vocabulary" in err and "\n" not in err
