"""Bad input to the command-line tools ``scripts.benchmark``, ``scripts.train``,
``scripts.calibrate``, ``scripts.distill``, ``scripts.convert`` and ``scripts.fetch``: one row per
case, each run as a user runs it (``python -m scripts.NAME`` in a subprocess). Every row must
exit with code 2 and print exactly one line, ``error: ...``, naming the value and what is
allowed, before any model or data loads (each row takes about as long as the imports).

A row's message is the whole line; a message ending in ``...`` is a prefix (lines that list
every preset or system, which grow). ``{tmp}`` stands for the test's temporary folder, where
:func:`_files` writes the files some rows need (a malformed YAML, a corrupt ``records.npz``, an
existing result file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = "configs/train/dlm-tiny.yaml"
DISTILL = "configs/train/smollm2-135m-space-distill.yaml"
SUITES = "ar, dllm, ssd, spiffy, assd, space, diffuspec, dflash"
DTYPES = "auto, float32, bfloat16"
REMASKING = "low_confidence, random, origin, maskgit_plus, topk_margin, entropy"
DLLM_METHOD = "expected stepwise, fixed-K (e.g. fixed-2) or threshold-T (e.g. threshold-0.9)"
TRAIN_KEYS = (
    "['ckpt_every', 'ckpt_every_s', 'data_offset', 'eval_batches', 'eval_every', "
    "'keep_checkpoints', 'log_every', 'seed', 'steps']"
)
RO = "/sys/jaxspec-test" if os.geteuid() == 0 else "{tmp}/read-only"  # root writes anywhere else

CASES = [
    # ------------------------------------------------------------------ scripts.benchmark
    ("benchmark", "--suite nope", f"unknown suite 'nope'; available: {SUITES}"),
    ("benchmark", "--suite ar --limit 0", "--limit must be >= 1, got 0"),
    ("benchmark", "--suite dllm --limit 0", "--limit must be >= 1, got 0"),
    ("benchmark", "--suite space --limit -1", "--limit must be >= 1, got -1"),
    ("benchmark", "--suite assd --limit 0", "--limit must be >= 1, got 0"),
    (
        "benchmark",
        "--suite ar --start 164",
        "--start must lie in [0, 163] (HumanEval has 164 problems), got 164",
    ),
    ("benchmark", "--suite ar --max-new-tokens 0", "--max-new-tokens must be >= 1, got 0"),
    ("benchmark", "--suite ar --draft-length 0", "--draft-length must be >= 1, got 0"),
    (
        "benchmark",
        "--suite ar --min-ngram 3 --max-ngram 2",
        "--max-ngram must be >= --min-ngram, got 2 < 3",
    ),
    ("benchmark", "--suite ar --threads 0", "--threads must be >= 1, got 0"),
    (
        "benchmark",
        "--suite ar --systems jaxspec/magic",
        "unknown system 'jaxspec/magic'; available: jaxspec/ar, jaxspec/ngram, ...",
    ),
    ("benchmark", "--suite ar --model gpt5", "unknown model 'gpt5'; available: asarm-small, ..."),
    ("benchmark", "--suite ar --draft-model gpt5", "unknown model 'gpt5'; available: ..."),
    (
        "benchmark",
        "--suite ar --dtype float16",
        f"unknown --dtype 'float16'; choose one of {DTYPES}",
    ),
    ("benchmark", "--suite ar --quant int4", "unknown --quant 'int4'; choose none or int8"),
    (
        "benchmark",
        "--suite diffuspec --quant int8",
        "--quant applies to suites ar, dllm, ssd and spiffy, not diffuspec",
    ),
    (
        "benchmark",
        "--suite ar --weights {tmp}/missing.gguf",
        "--weights {tmp}/missing.gguf does not exist",
    ),
    (
        "benchmark",
        "--suite dllm --gen-length 100",
        "gen_length 100 is not a multiple of block_length 32",
    ),
    ("benchmark", "--suite dllm --block-length 0", "--block-length must be >= 1, got 0"),
    ("benchmark", "--suite dllm --methods magic", f"unknown method 'magic'; {DLLM_METHOD}"),
    (
        "benchmark",
        "--suite dllm --caches bogus",
        "unknown cache policy 'bogus'; expected none, prefix, dual",
    ),
    (
        "benchmark",
        "--suite dllm --remasking bogus",
        f"unknown --remasking 'bogus'; available: {REMASKING}",
    ),
    (
        "benchmark",
        "--suite ssd --ssd-rows x:chain",
        "bad SSD row 'x:chain': expected N:tree:cache, e.g. 3:chain:dual",
    ),
    ("benchmark", "--suite spiffy --spiffy-rows 3:magic", f"unknown method 'magic'; {DLLM_METHOD}"),
    ("benchmark", "--suite diffuspec --k-min 40", "need 1 <= --k-min <= --k-max, got 40 and 30"),
    (
        "benchmark",
        "--suite diffuspec --diffuspec-sets poems",
        "unknown --diffuspec-sets 'poems'; available: humaneval, humaneval-chat, mt-bench, "
        "news, long",
    ),
    ("benchmark", "--suite space --mask-groups 0", "--mask-groups must be >= 1, got 0"),
    ("benchmark", "--suite space --space-batches 0", "--space-batches must be >= 1, got 0"),
    (
        "benchmark",
        "--suite assd --assd-mask-rate 1.5",
        "--assd-mask-rate must lie in (0, 1], got 1.5",
    ),
    (
        "benchmark",
        "--suite assd --assd-temperature inf",
        "--assd-temperature must be a finite value >= 0, got inf",
    ),
    (
        "benchmark",
        "--suite assd --assd-methods magic",
        "unknown --assd-methods 'magic'; available: assd, assd-ngram, assd-fused, assd-fused-ngram",
    ),
    (
        "benchmark",
        "--suite ar --out {tmp}/exists.json",
        "--out {tmp}/exists.json: {tmp}/exists.json exists; pass --overwrite to replace it, or "
        "leave out --out (results go to runs/bench/)",
    ),
    (
        "benchmark",
        "--suite ar --out {tmp}/file.txt/r.json",
        "--out {tmp}/file.txt/r.json: {tmp}/file.txt is not a directory",
    ),
    ("benchmark", f"--suite ar --out {RO}/r.json", f"--out {RO}/r.json: cannot write into ..."),
    (
        "benchmark",
        "--suite ar --out {tmp}/r.txt",
        "--out must name a .json file (the .md and .png go next to it), got {tmp}/r.txt",
    ),
    # ------------------------------------------------------------------ scripts.train
    ("train", "--config {tmp}/missing.yaml", "config file {tmp}/missing.yaml not found"),
    (
        "train",
        "--config {tmp}/malformed.yaml",
        "{tmp}/malformed.yaml is not valid YAML: expected ',' or '}', but got '<stream end>' at "
        "line 3, column 1",
    ),
    (
        "train",
        "--config {tmp}/list.yaml",
        "{tmp}/list.yaml must hold a mapping of sections (name, model, data, ...), got list",
    ),
    (
        "train",
        "--config {tmp}/section.yaml",
        "config section 'train' must be a mapping of keys, got 5",
    ),
    (
        "train",
        f"--config {TINY} --set train.steps=many",
        "train.steps must be an integer, got 'many'",
    ),
    ("train", f"--config {TINY} --set train.steps=2.5", "train.steps must be an integer, got 2.5"),
    ("train", f"--config {TINY} --set optim.lr=fast", "optim.lr must be a number, got 'fast'"),
    ("train", f"--config {TINY} --set train.steps=0", "train.steps must be >= 1, got 0"),
    (
        "train",
        f"--config {TINY} --set data.sft_fraction=1.5",
        "data.sft_fraction must be in [0, 1], got 1.5",
    ),
    ("train", f"--config {TINY} --set lora.rank=0", "lora.rank must be >= 1, got 0"),
    (
        "train",
        f"--config {TINY} --set model.tie_embeddings=maybe",
        "model.tie_embeddings must be true or false, got 'maybe'",
    ),
    (
        "train",
        f"--config {TINY} --set steps=3",
        "override 'steps=3' is not of the form section.key=value",
    ),
    (
        "train",
        f"--config {TINY} --set train.steps=[1",
        "override 'train.steps=[1': the value is not valid YAML: expected ',' or ']', but got "
        "'<stream end>' at line 1, column 3",
    ),
    (
        "train",
        f"--config {TINY} --set train.nope=1",
        f"unknown key(s) ['nope'] in section 'train'; expected {TRAIN_KEYS}",
    ),
    (
        "train",
        f"--config {TINY} --set magic.x=1",
        "unknown config section 'magic'; "
        "expected model, data, objective, optim, train, lora, asarm, dflash",
    ),
    (
        "train",
        f"--config {TINY} --set objective.kind=gan",
        "unknown objective.kind 'gan'; expected one of ('diffusion', 'asarm', 'sar', 'dflash')",
    ),
    ("train", f"--config {TINY} --steps 0", "--steps must be >= 1, got 0"),
    ("train", f"--config {TINY} --stop-after 0", "--stop-after must be >= 1, got 0"),
    (
        "train",
        f"--config {TINY} --max-minutes 0",
        "--max-minutes must be a finite value > 0, got 0.0",
    ),
    (
        "train",
        f"--config {TINY} --out {{tmp}}/file.txt",
        "--out {tmp}/file.txt is a file, not a directory",
    ),
    ("train", f"--config {TINY} --out {RO}/run", f"--out {RO}/run: cannot create it (..."),
    # ------------------------------------------------------------------ scripts.calibrate
    (
        "calibrate",
        "--reuse --out-dir {tmp}/corrupt",
        "--reuse: {tmp}/corrupt/records.npz is corrupt or not a records file of scripts.calibrate "
        "(not an .npz archive); delete it and run without --reuse",
    ),
    (
        "calibrate",
        "--reuse --out-dir {tmp}/foreign",
        "--reuse: {tmp}/foreign/records.npz is corrupt or not a records file of scripts.calibrate "
        "(missing arrays ['0_transfer_step', '0_tokens', '0_rank']); delete it and run without "
        "--reuse",
    ),
    (
        "calibrate",
        "--reuse --out-dir {tmp}/empty",
        "--reuse: {tmp}/empty/records.npz does not exist; run without --reuse first",
    ),
    (
        "calibrate",
        "--prompts 0",
        "--prompts must lie in [1, 164] (the calibration prompts come from HumanEval's 164), got 0",
    ),
    (
        "calibrate",
        "--prompts 165",
        "--prompts must lie in [1, 164] (the calibration prompts come "
        "from HumanEval's 164), got 165",
    ),
    ("calibrate", "--sizes 3 0", "--sizes must be >= 1, got 0"),
    ("calibrate", "--lookahead 0", "--lookahead must be >= 1, got 0"),
    ("calibrate", "--batch 0", "--batch must be >= 1, got 0"),
    ("calibrate", "--model gpt5", "unknown model 'gpt5'; available: ..."),
    ("calibrate", "--dtype float16", f"unknown --dtype 'float16'; choose one of {DTYPES}"),
    ("calibrate", "--weights {tmp}/missing", "--weights {tmp}/missing does not exist"),
    ("calibrate", "--gen-length 100", "gen_length 100 is not a multiple of block_length 32"),
    ("calibrate", "--remasking bogus", f"unknown remasking 'bogus'; expected one of {REMASKING}"),
    (
        "calibrate",
        "--out-dir {tmp}/file.txt",
        "--out-dir {tmp}/file.txt is a file, not a directory",
    ),
    # ------------------------------------------------------------------ scripts.distill
    ("distill", f"--config {DISTILL} --prompts 0", "--prompts must be >= 1, got 0"),
    (
        "distill",
        f"--config {DISTILL} --chat-fraction 2",
        "--chat-fraction must lie in [0, 1], got 2.0",
    ),
    ("distill", f"--config {TINY}", f"{TINY} has no data.distill: pass --out FILE"),
    (
        "distill",
        f"--config {DISTILL} --out {{tmp}}",
        "--out {tmp} is a directory; name a JSON-lines file",
    ),
    (
        "distill",
        "--config {tmp}/malformed.yaml",
        "{tmp}/malformed.yaml is not valid YAML: expected ',' or '}', but got '<stream end>' at "
        "line 3, column 1",
    ),
    # ------------------------------------------------------------------ convert, fetch
    ("convert", "--to hf {tmp}/missing {tmp}/out", "{tmp}/missing: does not exist"),
    ("fetch", "--model nope", "unknown model 'nope'; available: asarm-small, ..."),
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    """The files some rows need (module docstring)."""
    d = tmp_path_factory.mktemp("bad-inputs")
    (d / "malformed.yaml").write_text("name: x\ntrain: {steps: 3\n")
    (d / "list.yaml").write_text("- a\n- b\n")
    (d / "section.yaml").write_text("train: 5\n")
    (d / "exists.json").write_text("{}\n")
    (d / "file.txt").write_text("a file\n")
    (d / "corrupt").mkdir()
    (d / "corrupt" / "records.npz").write_bytes(b"not an npz archive" * 8)
    (d / "foreign").mkdir()
    np.savez(d / "foreign" / "records.npz", x=np.arange(3))
    (d / "empty").mkdir()
    if os.geteuid() != 0:
        (d / "read-only").mkdir(mode=0o500)
    return d


def _id(case) -> str:
    entry, argv, _ = case
    return f"{entry}:{argv.replace('{tmp}/', '')}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bad_input_exit_2_one_line(case, tmp):
    entry, argv, message = (s.replace("{tmp}", str(tmp)) for s in case)
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAXSPEC_NO_COMPILE_CACHE": "1",
        "PYTHONPATH": str(ROOT),
    }
    r = subprocess.run(
        [sys.executable, "-m", f"scripts.{entry}", *argv.split()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1, lines
    if message.endswith("..."):
        assert lines[0].startswith("error: " + message[:-3]), lines[0]
    else:
        assert lines[0] == "error: " + message


def test_benchmark_writes_nothing_before_a_bad_input_fails(tmp):
    """A rejected run leaves no scratch folder or probe file behind (``--out`` is checked last,
    and its probe file is removed)."""
    r = subprocess.run(
        [sys.executable, "-m", "scripts.benchmark", "--suite", "ar", "--limit", "0"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
    )
    assert r.returncode == 2 and not (tmp / "runs").exists()
    assert not [p for p in tmp.rglob("*.probe")]
