"""The project's own checkpoint format, and export back to Hugging Face layouts.

Native format: a directory with

* ``jaxspec_config.json``: ``{"format": "jaxspec-v1", "model": {ModelConfig fields},
  "diffusion": null | {"head": "llada" | "dream", "mask_token_id": int}}``;
* ``params.safetensors``: the :mod:`models.llama.modeling` parameter tree, flattened with ``/``
  (``embed``, ``layers/wq``, ...), float32, stacked layer weights as in the model; or, as
  written by the streaming converter (:func:`convert_streaming`), ``params.index.json``
  (``{"weight_map": {"layers/wq": "params/layers.wq.safetensors", ...}}``) and one file per
  parameter under ``params/``.

Export (:func:`export_hf`) writes the Hugging Face layout the loaders read (Llama / Qwen2
``config.json`` + ``model.safetensors``, with ``mask_token_id`` in ``config.json`` for a SPACE
SAR-SFT model; Dream = Qwen2 names with ``model_type`` ``"Dream"``;
LLaDA = ``model.transformer.*`` names with a LLaDA ``config.json``), one shard per decoder
layer plus one for the embeddings/head, so no more than one layer's tensors are held as
extra numpy copies at a time.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Callable, Union

import jax
import numpy as np

from models.config import ModelConfig
from models.diffusion.modeling import DiffusionConfig
from models.llama.params import _LAYER_MAP, _TOP_MAP, WeightFileError, put_param

FORMAT = "jaxspec-v1"
CONFIG_FILE = "jaxspec_config.json"
PARAMS_FILE = "params.safetensors"
PARAMS_INDEX = "params.index.json"

AnyConfig = Union[ModelConfig, DiffusionConfig]


def _base(config: AnyConfig) -> ModelConfig:
    return config.base if isinstance(config, DiffusionConfig) else config


def save_checkpoint(out_dir, config: AnyConfig, params: dict) -> Path:
    """Write ``config`` and ``params`` in the native format to ``out_dir`` (created).

    Returns the directory path. Raises ``ValueError`` if ``params`` is not the tree of
    ``config`` (missing ``embed`` or ``layers``)."""
    from safetensors.numpy import save_file

    if "embed" not in params or "layers" not in params:
        raise ValueError(
            "params is not a models.llama.modeling parameter tree (needs 'embed' and 'layers')"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flat = {}
    for k, v in params.items():
        if k == "layers":
            flat.update({f"layers/{lk}": np.asarray(lv, np.float32) for lk, lv in v.items()})
        else:
            flat[k] = np.asarray(v, np.float32)
    save_file(flat, str(out / PARAMS_FILE))
    _write_meta(out, config)
    return out


def is_native(path) -> bool:
    """True if ``path`` is a directory in the native format."""
    return (Path(path) / CONFIG_FILE).is_file()


def load_checkpoint(path) -> tuple[AnyConfig, dict]:
    """Read a native checkpoint. Returns ``(ModelConfig or DiffusionConfig, params)``.

    Raises:
      WeightFileError: missing files, a different ``format`` tag, or an unreadable file.
    """
    from safetensors import safe_open

    d = Path(path)
    cfg_path, par_path, index = d / CONFIG_FILE, d / PARAMS_FILE, d / PARAMS_INDEX
    if not cfg_path.is_file() or not (par_path.is_file() or index.is_file()):
        raise WeightFileError(
            f"{d}: not a jaxspec checkpoint (needs {CONFIG_FILE} and "
            f"{PARAMS_FILE} or {PARAMS_INDEX})"
        )
    try:
        meta = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise WeightFileError(f"{cfg_path}: invalid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise WeightFileError(f"{cfg_path}: format {meta.get('format')!r} is not {FORMAT!r}")
    m = dict(meta["model"])
    m["eos_token_ids"] = tuple(m.get("eos_token_ids") or ())
    base = ModelConfig(**m)
    config: AnyConfig = base
    if meta.get("diffusion"):
        config = DiffusionConfig(base=base, **meta["diffusion"])
    params: dict = {"layers": {}}
    files = [par_path]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise WeightFileError(
                f"{index}: not a parameter index ({type(e).__name__}: {e})"
            ) from None
        files = [d / f for f in dict.fromkeys(weight_map.values())]
    for file in files:
        if not file.is_file():
            raise WeightFileError(f"{file}: parameter file is missing")
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    arr = put_param(name, np.asarray(f.get_tensor(name), np.float32))
                    if name.startswith("layers/"):
                        params["layers"][name.split("/", 1)[1]] = arr
                    else:
                        params[name] = arr
        except Exception as e:  # safetensors raises several types for corrupt files
            raise WeightFileError(f"{file}: cannot read ({type(e).__name__}: {e})") from None
    return config, params


def _write_meta(out: Path, config: AnyConfig) -> None:
    diff = None
    if isinstance(config, DiffusionConfig):
        diff = {"head": config.head, "mask_token_id": config.mask_token_id}
    meta = {"format": FORMAT, "model": dataclasses.asdict(_base(config)), "diffusion": diff}
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def convert_streaming(src, out_dir, load: Callable) -> tuple[Path, AnyConfig]:
    """Convert any checkpoint ``load`` reads (:func:`models.registry.load_any`: a multi-shard HF
    directory, a LLaDA / Dream directory, a GGUF file, a native checkpoint) to the native
    format without ever holding the whole model in host memory.

    The loaders stream tensors one at a time and assemble one stacked parameter at a time
    (:mod:`models.llama.params`); here each finished parameter is written to its own file
    (``params/<path>.safetensors``, listed in ``params.index.json``) through the
    :func:`models.llama.params.place_params` hook and dropped at once, so peak host memory is
    about one stacked parameter (``tests/models/test_convert.py`` measures it with
    ``tracemalloc`` on a 24-layer multi-shard checkpoint). The output is written to
    ``out_dir + ".partial"`` and renamed when complete, so a failed conversion leaves no
    half-written checkpoint behind.

    Returns:
      ``(out_dir Path, config)``.

    Raises:
      WeightFileError, ConfigError: as the loaders (missing / corrupt shards, wrong shapes,
        unknown architecture).
      FileExistsError: ``out_dir`` exists and is not empty.
    """
    from safetensors.numpy import save_file

    from models.llama.params import place_params

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out}: output directory exists and is not empty")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "params").mkdir(parents=True)
    weight_map: dict[str, str] = {}

    def write(path: str, arr: np.ndarray):
        fname = f"params/{path.replace('/', '.')}.safetensors"
        save_file({path: np.ascontiguousarray(arr, np.float32)}, str(tmp / fname))
        weight_map[path] = fname
        return jax.ShapeDtypeStruct(arr.shape, np.float32)  # placeholder, nothing kept

    try:
        with place_params(write):
            config, _ = load(src)
        (tmp / PARAMS_INDEX).write_text(json.dumps({"weight_map": weight_map}, indent=1) + "\n")
        _write_meta(tmp, config)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out, config


# Tokenizer files a checkpoint directory may carry, copied by :func:`copy_tokenizer`.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)


def write_tokenizer(tok, out_dir) -> list[str]:
    """Save a :class:`models.tokenizer.Tokenizer` (a byte-level BPE backend) into ``out_dir``
    as ``tokenizer.json``, a ``tokenizer_config.json`` naming its ``bos_token`` /
    ``eos_token`` / ``pad_token``, ``add_bos_token`` and ``chat_template``, and, when it has
    end ids, a ``generation_config.json`` with all of them (``eos_token_id`` list: EOS, EOT,
    EOM). Returns the file names written. Raises ``OSError`` when a file cannot be written."""
    out = Path(out_dir)
    tok.backend.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "add_bos_token": tok.add_bos,
        "chat_template": tok.chat_template,
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps({k: v for k, v in cfg.items() if v is not None}, indent=2) + "\n"
    )
    written = ["tokenizer.json", "tokenizer_config.json"]
    if tok.eos_token_ids:
        (out / "generation_config.json").write_text(
            json.dumps({"eos_token_id": list(tok.eos_token_ids)}, indent=2) + "\n"
        )
        written.append("generation_config.json")
    return written


def copy_tokenizer(src, out_dir) -> list[str]:
    """Give the converted checkpoint ``out_dir`` the tokenizer of its source ``src``, so
    :func:`models.tokenizer.load_tokenizer` reads the same tokenizer from both.

    * ``src`` a directory (or a ``.safetensors`` / ``.json`` file inside one, as
      :func:`models.tokenizer.load_tokenizer` reads it): every file of :data:`TOKENIZER_FILES`
      it has is copied.
    * ``src`` a GGUF file: the tokenizer embedded in it (:meth:`Tokenizer.from_gguf
      <models.tokenizer.Tokenizer.from_gguf>`, a byte-level BPE) is saved by
      :func:`write_tokenizer`.

    Args:
      src: the conversion's source path.
      out_dir: the existing output directory.

    Returns:
      the file names written into ``out_dir`` (empty when ``src`` has no tokenizer files).

    Raises:
      models.tokenizer.TokenizerError: a GGUF file whose tokenizer cannot be built (no
        tokenizer metadata, a non-BPE model).
      OSError: a file cannot be copied or written.
    """
    from models.llama.params import GGUF_MAGIC
    from models.tokenizer import Tokenizer

    p, out = Path(src), Path(out_dir)
    if p.is_file():
        with open(p, "rb") as f:
            magic = f.read(4)
        if p.suffix.lower() == ".gguf" or magic == GGUF_MAGIC:
            return write_tokenizer(Tokenizer.from_gguf(p), out)
        if p.suffix.lower() not in (".safetensors", ".json"):
            return []
        p = p.parent
    written = []
    for name in TOKENIZER_FILES:
        if (p / name).is_file():
            if (p / name).resolve() != (out / name).resolve():  # converting in place: keep it
                shutil.copyfile(p / name, out / name)
            written.append(name)
    return written


def _hf_config_dict(config: AnyConfig) -> dict:
    c = _base(config)
    eos = list(c.eos_token_ids)
    if isinstance(config, DiffusionConfig) and config.head == "llada":
        return {
            "model_type": "llada",
            "architectures": ["LLaDAModelLM"],
            "d_model": c.hidden_size,
            "n_heads": c.num_heads,
            "n_kv_heads": c.num_kv_heads,
            "n_layers": c.num_layers,
            "mlp_hidden_size": c.intermediate_size,
            "vocab_size": c.vocab_size,
            "embedding_size": c.vocab_size,
            "rope_theta": c.rope_theta,
            "rms_norm_eps": c.rms_norm_eps,
            "include_qkv_bias": c.qkv_bias,
            "include_bias": False,
            "weight_tying": c.tie_embeddings,
            "max_sequence_length": c.max_position_embeddings,
            "mask_token_id": config.mask_token_id,
            "eos_token_id": eos[0] if eos else None,
            "pad_token_id": c.pad_token_id,
            "block_type": "llama",
            "activation_type": "silu",
            "layer_norm_type": "rms",
            "rope": True,
            "alibi": False,
        }
    d = {
        "model_type": c.arch,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_embeddings,
        "attention_bias": c.qkv_bias,
        "max_position_embeddings": c.max_position_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": eos if len(eos) != 1 else eos[0],
        "pad_token_id": c.pad_token_id,
        "hidden_act": "silu",
    }
    if isinstance(config, DiffusionConfig):  # dream
        d.update(
            model_type="Dream", architectures=["DreamModel"], mask_token_id=config.mask_token_id
        )
    else:
        d["architectures"] = ["LlamaForCausalLM" if c.arch == "llama" else "Qwen2ForCausalLM"]
        if c.mask_token_id is not None:  # a SPACE SAR-SFT model (ModelConfig.from_hf_dict reads it)
            d["mask_token_id"] = c.mask_token_id
    return d


def export_hf(out_dir, config: AnyConfig, params: dict) -> Path:
    """Write ``params`` in the Hugging Face layout that matches ``config`` (see module
    docstring): ``config.json``, ``model.safetensors.index.json`` and one shard per layer.
    The result loads back with :func:`models.llama.params.load_hf_dir` (Llama / Qwen2) or
    :func:`models.diffusion.params.load_diffusion_dir` (LLaDA / Dream)."""
    from safetensors.numpy import save_file

    from models.diffusion.params import _LLADA_LAYER_MAP, _LLADA_TOP_MAP

    c = _base(config)
    llada = isinstance(config, DiffusionConfig) and config.head == "llada"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_shards = c.num_layers + 1
    weight_map: dict[str, str] = {}

    def name_of(key: str, layer):
        if llada:
            if layer is None:
                suffix, tr = _LLADA_TOP_MAP[key]
                return f"model.transformer.{suffix}", tr
            suffix, tr = _LLADA_LAYER_MAP[key]
            return f"model.transformer.blocks.{layer}.{suffix}", tr
        if layer is None:
            name, _, tr = _TOP_MAP[key]
            return name, tr
        suffix, _, tr = _LAYER_MAP[key]
        return f"model.layers.{layer}.{suffix}", tr

    def write(shard: int, tensors: dict):
        fname = f"model-{shard:05d}-of-{n_shards:05d}.safetensors"
        save_file(tensors, str(out / fname))
        weight_map.update({k: fname for k in tensors})

    top = {}
    for key, val in params.items():
        if key == "layers":
            continue
        name, tr = name_of(key, None)
        arr = np.asarray(val, np.float32)
        top[name] = np.ascontiguousarray(arr.T) if tr else arr
    write(1, top)
    for i in range(c.num_layers):
        shard = {}
        for key, val in params["layers"].items():
            name, tr = name_of(key, i)
            arr = np.asarray(val[i], np.float32)
            shard[name] = np.ascontiguousarray(arr.T) if tr else arr
        write(i + 2, shard)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"format": "pt"}, "weight_map": weight_map}, indent=1) + "\n"
    )
    (out / "config.json").write_text(json.dumps(_hf_config_dict(config), indent=2) + "\n")
    return out
