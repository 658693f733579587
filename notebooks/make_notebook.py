"""Write ``notebooks/jaxspec_colab_tpu.ipynb`` (outputs empty) from the cell sources below.

    .venv/bin/python notebooks/make_notebook.py         # rewrite the notebook
    .venv/bin/python notebooks/make_notebook.py --check # exit 1 if the committed file differs

The notebook is the single place the cells are run from; this script is the single place they
are edited (``tests/test_notebook.py`` checks that the two agree, then executes the notebook
headless on tiny checkpoints).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "jaxspec_colab_tpu.ipynb"

INTRO = """\
# jaxspec on a Colab TPU: bring your own LLaDA / Dream / Qwen checkpoint

From `pip install` to lossless speculative decoding of real checkpoints, each method next to the
decoder it must reproduce token for token:

| method | model | reference it is lossless against |
|---|---|---|
| SSD (self speculative decoding) | a LLaDA or Dream dLLM | one-token-per-step stepwise decoding |
| Spiffy (draft graphs) | the same dLLM | the decoder it accelerates (stepwise here) |
| DiffuSpec (CPS + ADL) | a dLLM drafter + a causal Qwen/Llama verifier | the verifier's AR greedy |
| SPACE (auto-correct decoding) | a SAR-SFT causal model (optional) | that model's AR greedy |

The last cells print a speedup table (NFE, tokens per forward, wall time, identical to the
reference) and one plot. Runtime: **Runtime > Change runtime type > TPU**. The README's
"Bring your own checkpoint" section has the same runs as command lines and the memory each
model needs per dtype and device count.

The test suite runs this notebook headless on CPU with tiny random checkpoints
(`tests/test_notebook.py`, parameters through `JAXSPEC_NB_*` environment variables), so the
cells below are the ones that are tested. Edit them in `notebooks/make_notebook.py`.
"""

INSTALL = """\
# 1. Install jaxspec (not editable) with the extra of this runtime: [tpu] on a TPU, [cuda] on
#    an NVIDIA GPU. From a wheel (JAXSPEC_WHEEL: path or URL of jaxspec-*.whl) or from a clone
#    of the repository (REPO_URL, cloned to REPO_DIR). Skipped when JAXSPEC_NOTEBOOK_TEST is set
#    (the test suite) or when jaxspec is already importable (a Jupyter started from a .venv).
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys

WHEEL = os.environ.get("JAXSPEC_WHEEL", "")  # e.g. /content/jaxspec-0.1.0-py3-none-any.whl
REPO_URL = os.environ.get("JAXSPEC_REPO_URL", "")  # git URL of your copy of the jaxspec repository
REPO_DIR = os.environ.get("JAXSPEC_REPO_DIR", "/content/jaxspec")
PIP_ARGS = os.environ.get("JAXSPEC_PIP_ARGS", "").split()  # more pip options, e.g. --no-deps

if os.environ.get("JAXSPEC_NOTEBOOK_TEST") or importlib.util.find_spec("jaxspec") is not None:
    print("jaxspec is importable: install skipped")
else:
    if WHEEL:
        target = WHEEL
    else:
        if not os.path.isdir(REPO_DIR):
            if not REPO_URL:
                raise RuntimeError("set JAXSPEC_WHEEL to a jaxspec wheel, or REPO_URL (or "
                                   "$JAXSPEC_REPO_URL) to the git URL of jaxspec, or clone it "
                                   "to REPO_DIR yourself")
            subprocess.run(["git", "clone", "--depth", "1", REPO_URL, REPO_DIR], check=True)
        target = REPO_DIR
    tpu = (importlib.util.find_spec("libtpu") is not None or os.path.exists("/dev/accel0")
           or os.path.isdir("/dev/vfio"))
    gpu = shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")
    extra = "[tpu]" if tpu else "[cuda]" if gpu else ""
    print("installing", target + extra)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *PIP_ARGS, target + extra],
                   check=True)
    importlib.invalidate_caches()  # the new packages are importable in this kernel now
"""

DEVICES = """\
# 2. Devices, and the dtype `--dtype auto` picks on them (float32 on CPU, bfloat16 on GPU/TPU)
import jax
import numpy as np
from models.registry import resolve_dtype

print("jax", jax.__version__, "| backend:", jax.default_backend(), "|", len(jax.devices()),
      "devices")
for d in jax.devices():
    print("  ", d)
print("dtype 'auto' ->", np.dtype(resolve_dtype("auto")))
"""

PARAMETERS = """\
# 3. Parameters (papermill tag `parameters`; each can also come from a JAXSPEC_NB_* variable).
#    A checkpoint is a Hugging Face directory (config.json + *.safetensors + tokenizer.json) or a
#    jaxspec checkpoint (python -m scripts.convert --to jaxspec SRC OUT); the family (LLaDA /
#    Dream / Qwen2 / Llama) is read from it (load_model("auto", weights=DIR)).
import os

def _env(name, default, cast=str):
    value = os.environ.get("JAXSPEC_NB_" + name)
    return default if value is None else cast(value)

MODELS_DIR = _env("MODELS_DIR", "/content/models")
# masked-diffusion model for SSD and Spiffy (LLaDA-8B-Instruct or Dream-v0-Instruct-7B)
DLLM = _env("DLLM", f"{MODELS_DIR}/Dream-v0-Instruct-7B")
DLLM_REPO = _env("DLLM_REPO", "Dream-org/Dream-v0-Instruct-7B")  # "" = no download
# DiffuSpec: a dLLM drafter and a causal verifier with the same tokenizer
DRAFTER = _env("DRAFTER", DLLM)
VERIFIER = _env("VERIFIER", f"{MODELS_DIR}/Qwen2.5-7B-Instruct")
VERIFIER_REPO = _env("VERIFIER_REPO", "Qwen/Qwen2.5-7B-Instruct")
# SPACE: a SAR-SFT causal model with a [MASK] token: a jaxspec checkpoint directory or a
# preset (e.g. smollm2-135m-space); "" skips SPACE
SPACE_MODEL = _env("SPACE_MODEL", "")

DTYPE = _env("DTYPE", "auto")              # auto | float32 | bfloat16
# MATMUL_PRECISION highest: float32 matmuls stay float32 on TPU
MATMUL_PRECISION = _env("MATMUL_PRECISION", "highest")
MESH = _env("MESH", "auto")                # auto | none | DATAxMODEL, e.g. 1x4
PROMPT = _env("PROMPT", "")                # "" = the first LIMIT HumanEval problems
LIMIT = _env("LIMIT", 1, int)
CHAT = _env("CHAT", 1, int) == 1           # wrap prompts in the model's chat template
SEED = _env("SEED", 0, int)

GEN_LENGTH = _env("GEN_LENGTH", 256, int)  # dLLM generated positions
BLOCK_LENGTH = _env("BLOCK_LENGTH", 32, int)
# CACHE: none | dual (SSD and Spiffy; the reference uses the same)
CACHE = _env("CACHE", "dual")
SSD_DRAFT_LENGTH = _env("SSD_DRAFT_LENGTH", 3, int)
SPIFFY_GRAPH = _env("SPIFFY_GRAPH", "")    # "" = the default graph (D10), pruned to the block
MAX_NEW_TOKENS = _env("MAX_NEW_TOKENS", 256, int)  # causal generation budget
DIFFUSPEC_K_MAX = _env("DIFFUSPEC_K_MAX", 30, int)
DIFFUSPEC_K_MIN = _env("DIFFUSPEC_K_MIN", 20, int)
PROXY_FILES = _env("PROXY_FILES", 300, int)  # stdlib files for DiffuSpec's 3-gram proxy; 0 = none
MASK_GROUPS = _env("MASK_GROUPS", 5, int)
OUT_DIR = _env("OUT_DIR", "jaxspec-notebook-results")
"""

DOWNLOAD = """\
# 4. Fetch the checkpoints from the Hugging Face Hub when their directories do not exist yet
#    (skipped under the test suite).
import os
from pathlib import Path

def fetch(local_dir, repo):
    if os.environ.get("JAXSPEC_NOTEBOOK_TEST") or not repo or Path(local_dir).exists():
        return
    from huggingface_hub import snapshot_download
    snapshot_download(repo, local_dir=local_dir,
                      allow_patterns=["*.json", "*.safetensors", "*.txt", "*.jinja"])

for local_dir, repo in ((DLLM, DLLM_REPO), (VERIFIER, VERIFIER_REPO)):
    fetch(local_dir, repo)
    print(local_dir, "ok" if Path(local_dir).exists() else "MISSING")
"""

TOKENIZERS = """\
# 5. jaxspec reads tokenizer.json. A checkpoint that ships a slow Qwen2-style tokenizer instead
#    (vocab.json + merges.txt + added tokens: Dream-v0's layout) gets one built with the
#    tokenizers library (notebooks/tokenizer_json.py; the same from a shell:
#    python notebooks/tokenizer_json.py DIR).
import sys
from pathlib import Path

from models.registry import REPO_ROOT, hf_model_type

sys.path.insert(0, str(REPO_ROOT / "notebooks"))
from tokenizer_json import write_tokenizer_json  # noqa: E402

for spec in (DLLM, DRAFTER, VERIFIER, SPACE_MODEL):
    d = Path(str(spec))
    if not d.is_dir() or (d / "tokenizer.json").is_file() or (d / "jaxspec_config.json").is_file():
        continue
    if ((d / "vocab.json").is_file() and (d / "merges.txt").is_file()
            and hf_model_type(d) in ("dream", "qwen2")):
        n, k = write_tokenizer_json(d)
        print(f"{d}: wrote tokenizer.json ({n} ids, {k} added tokens) from vocab.json + merges.txt")
    else:
        print(f"{d}: no tokenizer.json, and no Qwen2-style vocab.json + merges.txt "
              "to build one from")
"""

SETUP = """\
# 6. Helpers: load a checkpoint (sharded over the devices when there are several), run a method
#    and its reference through the method registry (jaxspec.methods), record one table row.
import gc
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jaxspec.core.compile_cache import enable_persistent_cache
from jaxspec.eval.datasets import humaneval_problems, humaneval_prompt
from jaxspec.methods import get_method, reference_of, run
from models.checkpoint import CONFIG_FILE, is_native
from models.config import ModelConfig
from models.diffusion.params import llada_model_config
from models.registry import REPO_ROOT, hf_model_type, is_preset, load_model, resolve_dtype
from models.sharding import make_mesh

if str(REPO_ROOT / "notebooks") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "notebooks"))
from memory_table import model_axis  # noqa: E402  (the README table's mesh rule)

enable_persistent_cache()  # compiled decode loops are reused by the next session
jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION)
N_DEVICES = len(jax.devices())
ROWS, MEMORY = [], []


def body_config(path):
    \"\"\"The transformer body's ModelConfig of a checkpoint directory, read from its config
    file alone (the mesh is chosen before the weights are read).\"\"\"
    p = Path(path)
    if is_native(p):
        fields = json.loads((p / CONFIG_FILE).read_text())["model"]
        return ModelConfig(**{**fields, "eos_token_ids": tuple(fields.get("eos_token_ids") or ())})
    raw = json.loads((p / "config.json").read_text())
    kind = hf_model_type(p)
    if kind == "llada":
        return llada_model_config(raw)
    return ModelConfig.from_hf_dict({**raw, "model_type": "qwen2" if kind == "dream" else kind})


def mesh_for(path):
    \"\"\"MESH "none" / one device: None; "auto": 1xM with the largest M that divides the
    devices and the model's heads and MLP width; else the DATAxMODEL string.\"\"\"
    if MESH == "none" or path is None:
        return None
    if MESH != "auto":
        return make_mesh(MESH)
    m = model_axis(body_config(path), N_DEVICES)
    return None if m == 1 else make_mesh(f"1x{m}")


def load(spec, role):
    \"\"\"``(model, params, tokenizer)`` of a checkpoint directory or a preset name.\"\"\"
    name, weights = (spec, None) if is_preset(spec) and not Path(spec).exists() else ("auto", spec)
    mesh = mesh_for(weights)
    t0 = time.perf_counter()
    model, params, tok, _ = load_model(name, weights, dtype=DTYPE, mesh=mesh)
    per_device = {}
    for leaf in jax.tree_util.tree_leaves(params):
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    base = getattr(model.config, "base", model.config)
    itemsize = np.dtype(resolve_dtype(DTYPE)).itemsize
    MEMORY.append({
        "role": role, "checkpoint": str(spec), "family": type(model).__name__,
        "parameters": sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)),
        "dtype": str(np.dtype(resolve_dtype(DTYPE))), "devices": len(per_device),
        "mesh": "none" if mesh is None else "x".join(str(s) for s in mesh.devices.shape),
        "weights_gb": sum(x.size * x.dtype.itemsize
                          for x in jax.tree_util.tree_leaves(params)) / 1e9,
        "max_per_device_gb": max(per_device.values()) / 1e9,
        "kv_per_1k_tokens_gb": (2 * base.num_layers * base.num_kv_heads * base.head_dim * 1024
                                * itemsize / 1e9),
    })
    print(f"[{role}] {spec}: {type(model).__name__} {MEMORY[-1]['parameters']:,} parameters, "
          f"{MEMORY[-1]['dtype']}, mesh {MEMORY[-1]['mesh']}, "
          f"loaded in {time.perf_counter() - t0:.1f} s")
    return model, params, tok


def prompts_of(tok):
    if PROMPT:
        texts = [tok.apply_chat_template([{"role": "user", "content": PROMPT}]) if CHAT else PROMPT]
    else:
        texts = [humaneval_prompt(p, tok, CHAT) for p in humaneval_problems()[:LIMIT]]
    return [tok.encode(t) for t in texts]


def run_with_reference(name, model, params, tok, prompts, options, refs, label):
    \"\"\"Run registry method ``name`` (``options``: ``{option: value}``, each method takes the
    ones it knows) and the reference its config names (cached in ``refs`` per reference
    config), print both and append one row to ROWS.\"\"\"
    method = get_method(name)
    config = method.configure(options, strict=False)
    kw = dict(seed=SEED, eos_ids=tuple(tok.eos_token_ids), pad_id=tok.pad_token_id or 0)
    res = run(method, model, params, prompts, config, **kw)
    ref_method, ref_cfg = reference_of(method, config)
    key = (ref_method.name, repr(ref_cfg))
    if key not in refs:
        refs[key] = run(ref_method, model, params, prompts, ref_cfg, **kw)
    ref = refs[key]
    dllm = method.family == "dllm"
    if dllm:
        same = bool(np.array_equal(res.full_tokens, ref.full_tokens))
        tokens, ref_tokens = int(res.full_tokens.size), int(ref.full_tokens.size)
    else:
        same = res.tokens == ref.tokens
        tokens, ref_tokens = int(res.stats.new_tokens.sum()), int(ref.stats.new_tokens.sum())
    nfe, ref_nfe = int(res.stats.target_nfe.sum()), int(ref.stats.target_nfe.sum())
    row = {"model": label, "method": name, "reference": ref_method.name,
           "nfe": nfe, "reference_nfe": ref_nfe, "draft_nfe": int(res.stats.draft_nfe.sum()),
           "tokens": tokens, "tokens_per_step": tokens / max(nfe, 1),
           "reference_tokens_per_step": ref_tokens / max(ref_nfe, 1),
           "wall_s": res.run_s, "reference_wall_s": ref.run_s, "compile_s": res.compile_s,
           "nfe_speedup": ref_nfe / max(nfe, 1), "wall_speedup": ref.run_s / max(res.run_s, 1e-9),
           "identical": same}
    ROWS.append(row)
    print(f"[{name}] NFE {nfe} vs {ref_method.name} {ref_nfe} ({row['nfe_speedup']:.2f}x), "
          f"{row['tokens_per_step']:.2f} tokens/forward, "
          f"wall {res.run_s:.2f} s vs {ref.run_s:.2f} s "
          f"(compile {res.compile_s:.1f} s and {ref.compile_s:.1f} s), "
          f"identical to {ref_method.name}: {'yes' if same else 'NO'}")
    print("   ", repr(tok.decode(res.tokens[0])[:200]))
    return res, ref


def free(*names):
    \"\"\"Drop models from this namespace so the next section has the device memory.\"\"\"
    for n in names:
        globals().pop(n, None)
    gc.collect()
"""

DLLM_MD = """\
## SSD and Spiffy on the dLLM

Both are lossless against one-token-per-step stepwise decoding with the same block length and
cache policy: greedy outputs must be identical token for token (and in transfer order). Spiffy
uses a draft graph calibrated on `dream-smollm2-135m`; any graph is lossless, and a graph
calibrated on your model (`python -m scripts.calibrate --model auto --weights DIR`) drafts better.
"""

DLLM_RUN = """\
# 7. SSD and Spiffy against stepwise decoding
dllm, dllm_params, dllm_tok = load(DLLM, "dllm")
dllm_prompts = prompts_of(dllm_tok)
dllm_options = dict(gen_length=GEN_LENGTH, block_length=BLOCK_LENGTH, cache=CACHE,
                    draft_length=SSD_DRAFT_LENGTH, graph=SPIFFY_GRAPH or None)
dllm_refs = {}
label = Path(DLLM).name
ssd_result, stepwise_result = run_with_reference("ssd", dllm, dllm_params, dllm_tok, dllm_prompts,
                                                 dllm_options, dllm_refs, label)
spiffy_result, _ = run_with_reference("spiffy", dllm, dllm_params, dllm_tok, dllm_prompts,
                                      dllm_options, dllm_refs, label)
"""

DIFFUSPEC_MD = """\
## DiffuSpec: the dLLM drafts, the causal model verifies

One drafter forward proposes a block; causal-consistency path search (CPS) picks a path through
the drafter's candidate lattice, scored with a 3-gram proxy fitted on the Python standard
library; adaptive draft length (ADL) sets the next block length. Verification is point-mass
speculative sampling, so greedy outputs equal the verifier's AR greedy decoding. Every verifier
token must have the same id for the drafter, and both must have the same embedding rows
(Dream-7B drafting for Qwen2.5-7B is the paper's pair; Dream's tokenizer adds its `[MASK]`).
"""

DIFFUSPEC_RUN = """\
# 8. DiffuSpec against AR decoding of the verifier
from jaxspec.causal.diffuspec import NgramProxy
from jaxspec.training.data import stdlib_files, stdlib_root

if Path(str(DRAFTER)).resolve() != Path(str(DLLM)).resolve():
    free("dllm", "dllm_params")
    drafter, drafter_params, drafter_tok = load(DRAFTER, "drafter")
else:
    drafter, drafter_params, drafter_tok = dllm, dllm_params, dllm_tok
verifier, verifier_params, verifier_tok = load(VERIFIER, "verifier")
# The drafter proposes ids the verifier checks, so every verifier token must mean the same id
# to the drafter. Dream's tokenizer is Qwen2.5's plus extra tokens (its [MASK]): a superset, so
# the drafts need no translation and stay in one jitted loop (scripts.generate, which compares
# tokenizers for identity, translates them through text instead: jaxspec.causal.hetero).
verifier_vocab = verifier_tok.backend.get_vocab(with_added_tokens=True)
drafter_vocab = drafter_tok.backend.get_vocab(with_added_tokens=True)
differ = [t for t, i in verifier_vocab.items() if drafter_vocab.get(t) != i]
extra = sorted(set(drafter_vocab) - set(verifier_vocab), key=drafter_vocab.get)
if differ or verifier.config.vocab_size != drafter.config.vocab_size:
    print(f"DiffuSpec skipped: {len(differ)} verifier tokens have other ids in the drafter's "
          f"tokenizer, or the embeddings differ ({verifier.config.vocab_size} vs "
          f"{drafter.config.vocab_size} rows)")
else:
    print("drafter tokenizer:", "the verifier's" if not extra else
          f"the verifier's plus {len(extra)} token(s) {extra[:4]}")
    eos = verifier_tok.eos_token_ids[0] if verifier_tok.eos_token_ids else 0
    proxy = None
    if PROXY_FILES > 0:
        root = stdlib_root()
        stream = []
        for f in stdlib_files(root)[:PROXY_FILES]:
            stream += verifier_tok.encode(
                (root / f).read_text(encoding="utf-8", errors="replace")) + [eos]
        proxy = NgramProxy.fit(stream, verifier.config.vocab_size)
        print(f"3-gram proxy fitted on {PROXY_FILES} stdlib files ({len(stream)} tokens)")
    causal_options = dict(max_new_tokens=MAX_NEW_TOKENS, draft_length=DIFFUSPEC_K_MAX,
                          k_min=DIFFUSPEC_K_MIN, dllm_drafter=(drafter, drafter_params),
                          proxy=proxy, eos_id=eos)
    verifier_refs = {}
    run_with_reference("diffuspec", verifier, verifier_params, verifier_tok,
                       prompts_of(verifier_tok), causal_options, verifier_refs,
                       f"{Path(VERIFIER).name} + {Path(DRAFTER).name}")
free("dllm", "dllm_params", "drafter", "drafter_params", "verifier", "verifier_params",
     "causal_options")
"""

SPACE_MD = """\
## SPACE (only with a SAR-SFT checkpoint)

SPACE needs a causal model fine-tuned with semi-autoregressive SFT and a `[MASK]` token
(`mask_token_id` in a jaxspec checkpoint's config, or the `smollm2-135m-space` preset). Its
greedy output equals AR greedy decoding of the same model.
"""

SPACE_RUN = """\
# 9. SPACE against AR decoding of the SAR-SFT model
if not SPACE_MODEL:
    print("SPACE skipped: SPACE_MODEL is empty")
else:
    sar, sar_params, sar_tok = load(SPACE_MODEL, "space")
    if getattr(sar.config, "mask_token_id", None) is None:
        print(f"SPACE skipped: {SPACE_MODEL} has no [MASK] token (not a SAR-SFT model)")
    else:
        run_with_reference("space", sar, sar_params, sar_tok, prompts_of(sar_tok),
                           dict(max_new_tokens=MAX_NEW_TOKENS, mask_groups=MASK_GROUPS),
                           {}, Path(str(SPACE_MODEL)).name)
    free("sar", "sar_params")
"""

TABLE = """\
# 10. The speedup table (wall times exclude compilation; NFE = target-model forwards)
from IPython.display import Markdown, display

def md_table(rows, columns):
    head = "| " + " | ".join(title for title, _ in columns) + " |"
    lines = [head, "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r) for _, fmt in columns) + " |")
    return "\\n".join(lines)

SPEEDUP = md_table(ROWS, [
    ("model", lambda r: r["model"]), ("method", lambda r: r["method"]),
    ("reference", lambda r: r["reference"]),
    ("NFE", lambda r: str(r["nfe"])), ("reference NFE", lambda r: str(r["reference_nfe"])),
    ("draft NFE", lambda r: str(r["draft_nfe"])),
    ("tokens/step", lambda r: f"{r['tokens_per_step']:.2f}"),
    ("wall s", lambda r: f"{r['wall_s']:.2f}"),
    ("reference wall s", lambda r: f"{r['reference_wall_s']:.2f}"),
    ("NFE speedup", lambda r: f"{r['nfe_speedup']:.2f}x"),
    ("wall speedup", lambda r: f"{r['wall_speedup']:.2f}x"),
    ("identical to reference", lambda r: "yes" if r["identical"] else "NO"),
])
def count(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"

def size(gb):
    return f"{gb:.2f} GB" if gb >= 1 else f"{gb * 1e3:.2f} MB"

MEMORY_TABLE = md_table(MEMORY, [
    ("role", lambda r: r["role"]), ("checkpoint", lambda r: Path(r["checkpoint"]).name),
    ("model", lambda r: r["family"]), ("parameters", lambda r: count(r["parameters"])),
    ("dtype", lambda r: r["dtype"]), ("mesh", lambda r: r["mesh"]),
    ("weights", lambda r: size(r["weights_gb"])),
    ("on the fullest device", lambda r: size(r["max_per_device_gb"])),
    ("KV cache per 1k tokens", lambda r: size(r["kv_per_1k_tokens_gb"])),
])
print(SPEEDUP)
print()
print(MEMORY_TABLE)
display(Markdown(SPEEDUP + "\\n\\n" + MEMORY_TABLE))
out = Path(OUT_DIR)
out.mkdir(parents=True, exist_ok=True)
(out / "speedup.json").write_text(json.dumps({
    "backend": jax.default_backend(), "devices": N_DEVICES,
    "dtype": str(np.dtype(resolve_dtype(DTYPE))),
    "rows": ROWS, "memory": MEMORY}, indent=1))
_ = (out / "speedup.md").write_text(SPEEDUP + "\\n\\n" + MEMORY_TABLE + "\\n")
"""

PLOT = """\
# 11. NFE and wall-clock speedup per method (1.0 = the reference)
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3))
x = np.arange(len(ROWS))
ax.bar(x - 0.2, [r["nfe_speedup"] for r in ROWS], 0.4, label="NFE speedup")
ax.bar(x + 0.2, [r["wall_speedup"] for r in ROWS], 0.4, label="wall-clock speedup")
ax.axhline(1.0, color="gray", lw=0.8)
ax.set_xticks(x, [f"{r['method']}\\n({'identical' if r['identical'] else 'DIFFERENT'})"
                  for r in ROWS])
ax.set_ylabel("x reference")
ax.set_title(f"{jax.default_backend()}, {N_DEVICES} device(s), {np.dtype(resolve_dtype(DTYPE))}")
ax.legend()
fig.tight_layout()
fig.savefig(Path(OUT_DIR) / "speedup.png", dpi=120)
plt.show()
"""

NOTES = """\
## Reading the table

* **identical to reference** is the losslessness contract (greedy: token for token). It holds
  exactly in float32. In bfloat16 a verification forward over several tokens rounds differently
  from a one-token step, so near-ties can flip and a `NO` there is rounding, not a bug (README,
  "Performance notes"); run with `DTYPE = "float32"` for the exact check.
  `MATMUL_PRECISION = "highest"` keeps TPU float32 matrix products in float32 (the TPU default
  rounds them through bfloat16); `"default"` is faster.
* **NFE speedup** (reference forwards / method forwards) carries over between machines; the
  wall-clock speedup depends on how cheap a batched verification forward is on the device.
* Memory: the second table is measured from the loaded parameters; the README lists the weight
  memory of LLaDA-8B, Dream-7B and Qwen2.5-7B per dtype and device count
  (`python notebooks/memory_table.py`). Two 7B models in bfloat16 need about 31 GB for weights
  alone, so DiffuSpec with Dream-7B + Qwen2.5-7B needs a multi-chip TPU (the models are sharded
  over the devices: `MESH`).
"""


def build() -> nbformat.NotebookNode:
    """The notebook with empty outputs; the parameters cell carries the papermill tag."""
    v4 = nbformat.v4
    cells = [
        v4.new_markdown_cell(INTRO),
        v4.new_code_cell(INSTALL),
        v4.new_code_cell(DEVICES),
        v4.new_code_cell(PARAMETERS, metadata={"tags": ["parameters"]}),
        v4.new_code_cell(DOWNLOAD),
        v4.new_code_cell(TOKENIZERS),
        v4.new_code_cell(SETUP),
        v4.new_markdown_cell(DLLM_MD),
        v4.new_code_cell(DLLM_RUN),
        v4.new_markdown_cell(DIFFUSPEC_MD),
        v4.new_code_cell(DIFFUSPEC_RUN),
        v4.new_markdown_cell(SPACE_MD),
        v4.new_code_cell(SPACE_RUN),
        v4.new_code_cell(TABLE),
        v4.new_code_cell(PLOT),
        v4.new_markdown_cell(NOTES),
    ]
    for i, c in enumerate(cells):
        c["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives the same file
    nb = v4.new_notebook(cells=cells)
    nb.metadata = {
        "accelerator": "TPU",
        "colab": {"provenance": []},
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = nbformat.writes(build())
    if "--check" in argv:
        same = NOTEBOOK.is_file() and NOTEBOOK.read_text() == text
        print(f"{NOTEBOOK}: {'up to date' if same else 'differs from make_notebook.py'}")
        return 0 if same else 1
    NOTEBOOK.write_text(text)
    print(f"wrote {NOTEBOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
