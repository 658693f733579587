"""Load LLaDA and Dream Hugging Face checkpoint directories into :mod:`models.diffusion.modeling`.

Both return ``(DiffusionConfig, params)`` where ``params`` is the
:class:`models.llama.modeling.CausalLM` tree (float32 ``jax.Array`` leaves), filled by the same
streaming assembler as :func:`models.llama.params.load_hf_dir`.

Sources of facts (names and config keys only):
  * LLaDA: GSAI-ML/LLaDA-8B ``configuration_llada.py`` / ``modeling_llada.py``
    (``LLaDAModelLM.model = LLaDAModel``; ``LLaDAModel.transformer`` holds ``wte``
    (``embedding_size or vocab_size`` rows), ``blocks.N`` (``LLaDALlamaBlock``), ``ln_f`` and,
    unless ``weight_tying``, ``ff_out``). A block computes
    ``x + attn_out(attn(q_proj, k_proj, v_proj of attn_norm(x)))`` then
    ``x + ff_out(act(ff_proj(h)) * up_proj(h))`` with ``h = ff_norm(x)`` and ``act`` SiLU:
    so ``ff_proj`` is the SwiGLU gate and ``up_proj`` the up branch. RoPE is the
    rotate-half form with base ``rope_theta`` and head width ``d_model // n_heads``;
    norms are RMSNorm with ``rms_norm_eps``; q/k/v carry a bias iff
    ``include_bias or include_qkv_bias``.
  * Dream: Dream-org/Dream ``modeling_dream.py`` (``DreamModel.model`` is a Qwen2-style
    ``DreamBaseModel``: ``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``,
    ``mlp.{gate,up,down}_proj``, ``model.norm``, ``lm_head``) and its ``config.json``
    (``model_type`` ``"Dream"``, Qwen2 keys, ``mask_token_id`` 151666 for Dream-7B).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from models.config import ConfigError, ModelConfig
from models.diffusion.modeling import DiffusionConfig
from models.llama.params import (
    WeightFileError,
    _assemble,
    _dir_source,
    _load_safetensors,
    _read_json,
)

# CausalLM per-layer parameter -> (suffix after "transformer.blocks.N.", transpose).
_LLADA_LAYER_MAP: dict[str, tuple[str, bool]] = {
    "attn_norm": ("attn_norm.weight", False),
    "wq": ("q_proj.weight", True),
    "wk": ("k_proj.weight", True),
    "wv": ("v_proj.weight", True),
    "wo": ("attn_out.weight", True),
    "bq": ("q_proj.bias", False),
    "bk": ("k_proj.bias", False),
    "bv": ("v_proj.bias", False),
    "mlp_norm": ("ff_norm.weight", False),
    "w_gate": ("ff_proj.weight", True),
    "w_up": ("up_proj.weight", True),
    "w_down": ("ff_out.weight", True),
}
# CausalLM top-level parameter -> (name after "transformer.", transpose).
_LLADA_TOP_MAP: dict[str, tuple[str, bool]] = {
    "embed": ("wte.weight", False),
    "final_norm": ("ln_f.weight", False),
    "lm_head": ("ff_out.weight", True),
}
_LLADA_EMBED = "transformer.wte.weight"
_DREAM_EMBED = "model.embed_tokens.weight"


def _require_dir(path) -> Path:
    d = Path(path)
    if not d.is_dir():
        raise WeightFileError(f"{d}: checkpoint directory does not exist")
    return d


def _layout(names: frozenset[str]) -> str:
    """``"llada"``, ``"llada-prefixed"``, ``"qwen2"`` (also Llama / Dream) or ``"unknown"``."""
    if f"model.{_LLADA_EMBED}" in names:
        return "llada-prefixed"
    if _LLADA_EMBED in names:
        return "llada"
    if _DREAM_EMBED in names:
        return "qwen2"
    return "unknown"


def _unknown_layout(where: str, names: frozenset[str], wanted: str) -> WeightFileError:
    sample = ", ".join(sorted(names)[:3]) or "no tensors"
    return WeightFileError(
        f"{where}: tensor layout matches no known architecture for {wanted} "
        f"(expected {'transformer.wte.weight' if wanted == 'LLaDA' else _DREAM_EMBED}; "
        f"found {sample}, ...)"
    )


def _mask_id(raw: dict, where: str) -> int:
    m = raw.get("mask_token_id")
    if m is None:
        raise ConfigError(f"{where}: config.json has no mask_token_id")
    return int(m)


def llada_model_config(raw: dict, where: str = "config.json") -> ModelConfig:
    """:class:`ModelConfig` from a LLaDA ``config.json`` dict.

    Keys read: ``d_model``, ``n_heads``, ``n_kv_heads`` (None -> ``n_heads``), ``n_layers``,
    ``mlp_hidden_size`` (None -> ``mlp_ratio * d_model``), ``vocab_size``,
    ``embedding_size`` (the vocabulary width V when set), ``rope_theta`` (default 10000),
    ``rms_norm_eps`` (default 1e-5), ``include_qkv_bias``, ``weight_tying``,
    ``max_sequence_length``, ``eos_token_id``, ``pad_token_id``.

    Raises:
      ConfigError: a missing key, or a variant this body cannot run (``include_bias``,
        non-RMS norm, non-``llama`` block, activation other than SiLU, no RoPE / ALiBi,
        ``scale_logits``, ``clip_qkv``, ``attention_layer_norm``, block groups).
    """
    checks = [
        ("include_bias", False),
        ("alibi", False),
        ("rope", True),
        ("scale_logits", False),
        ("clip_qkv", None),
        ("attention_layer_norm", False),
        ("block_group_size", 1),
        ("layer_norm_type", "rms"),
        ("block_type", "llama"),
        ("activation_type", "silu"),
    ]
    for key, want in checks:
        if key in raw and raw[key] != want and not (want is False and raw[key] is None):
            raise ConfigError(
                f"{where}: LLaDA option {key}={raw[key]!r} is not supported (need {want!r})"
            )
    try:
        d_model, heads = int(raw["d_model"]), int(raw["n_heads"])
        mlp = raw.get("mlp_hidden_size")
        if mlp is None:
            mlp = int(raw.get("mlp_ratio", 4)) * d_model
        eos = raw.get("eos_token_id")
        eos_ids = (
            tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        )
        return ModelConfig(
            arch="llama",
            vocab_size=int(raw.get("embedding_size") or raw["vocab_size"]),
            hidden_size=d_model,
            intermediate_size=int(mlp),
            num_layers=int(raw["n_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("n_kv_heads") or heads),
            head_dim=d_model // heads,
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(raw.get("weight_tying", False)),
            qkv_bias=bool(raw.get("include_qkv_bias", False)),
            max_position_embeddings=int(raw.get("max_sequence_length", 2048)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            pad_token_id=raw.get("pad_token_id"),
        )
    except KeyError as e:
        raise ConfigError(
            f"{where}: LLaDA config.json is missing required field {e.args[0]!r}"
        ) from None


def load_llada_dir(path) -> tuple[DiffusionConfig, dict]:
    """Load a Hugging Face LLaDA checkpoint directory (``LLaDAModelLM`` layout).

    Args:
      path: directory with a LLaDA ``config.json`` and ``model.safetensors`` or a sharded
        ``model.safetensors.index.json``. Tensor names may carry the ``model.`` prefix
        (``model.transformer.blocks.0.q_proj.weight``, as saved by ``LLaDAModelLM``) or not.

    Returns:
      ``(DiffusionConfig(head="llada"), params)`` in the :mod:`models.llama.modeling` layout,
      float32. ``ff_proj`` -> ``w_gate``, ``up_proj`` -> ``w_up``, ``ff_out`` (block) -> ``w_down``,
      ``attn_out`` -> ``wo``, ``transformer.ff_out`` -> ``lm_head`` (absent when tied).

    Raises:
      WeightFileError: missing directory/files, a tensor layout that is not LLaDA's (one
        line), missing tensors or shapes disagreeing with ``config.json``.
      ConfigError: missing config keys, unsupported LLaDA options, no ``mask_token_id``.
      ValueError: ``mask_token_id`` outside the vocabulary.
    """
    d = _require_dir(path)
    cfg_path = d / "config.json"
    raw = _read_json(cfg_path)
    src, where = _dir_source(d)
    layout = _layout(src.names)
    if layout not in ("llada", "llada-prefixed"):
        raise _unknown_layout(where, src.names, "LLaDA")
    prefix = "model." if layout == "llada-prefixed" else ""
    base = llada_model_config(raw, str(cfg_path))
    config = DiffusionConfig(base=base, head="llada", mask_token_id=_mask_id(raw, str(cfg_path)))

    def fetch(key: str, layer: int | None):
        if layer is None:
            suffix, transpose = _LLADA_TOP_MAP[key]
            name = f"{prefix}transformer.{suffix}"
        else:
            suffix, transpose = _LLADA_LAYER_MAP[key]
            name = f"{prefix}transformer.blocks.{layer}.{suffix}"
        arr = src.get(name)
        return name, (np.ascontiguousarray(arr.T) if transpose else arr)

    return config, _assemble(base, fetch, where)


def load_dream_dir(path) -> tuple[DiffusionConfig, dict]:
    """Load a Hugging Face Dream checkpoint directory (Qwen2 tensor layout).

    Args:
      path: directory with a Dream ``config.json`` (``model_type`` ``"Dream"``, Qwen2 keys
        ``hidden_size``, ``num_attention_heads``, ... and ``mask_token_id``) and
        safetensors weights named as Qwen2 (``model.layers.N.self_attn.q_proj.weight``...).

    Returns:
      ``(DiffusionConfig(head="dream"), params)`` in the :mod:`models.llama.modeling` layout,
      float32.

    Raises:
      WeightFileError: missing directory/files, a tensor layout that is not Qwen2's (one
        line), missing tensors or wrong shapes.
      ConfigError: ``model_type`` is not Dream, missing keys, no ``mask_token_id``.
      ValueError: ``mask_token_id`` outside the vocabulary.
    """
    d = _require_dir(path)
    cfg_path = d / "config.json"
    raw = _read_json(cfg_path)
    if str(raw.get("model_type", "")).lower() != "dream":
        raise ConfigError(f"{cfg_path}: model_type={raw.get('model_type')!r} is not a Dream config")
    src, where = _dir_source(d)
    if _layout(src.names) != "qwen2":
        raise _unknown_layout(where, src.names, "Dream")
    # the body config; the mask id belongs to the DiffusionConfig, not to a causal SAR-SFT base
    qwen = {k: v for k, v in raw.items() if k != "mask_token_id"} | {"model_type": "qwen2"}
    qwen.setdefault("attention_bias", True)  # Dream / Qwen2 q/k/v projections carry biases
    # _hf_config also merges generation_config.json eos ids; it reads config.json itself,
    # so feed the rewritten dict through ModelConfig directly and merge eos the same way.
    base = ModelConfig.from_hf_dict(qwen)
    gen = d / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError):
            eos = None
        eos = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        base = base.replace(
            eos_token_ids=tuple(dict.fromkeys([*base.eos_token_ids, *map(int, eos)]))
        )
    config = DiffusionConfig(base=base, head="dream", mask_token_id=_mask_id(raw, str(cfg_path)))
    return config, _load_safetensors(base, src, where)


def load_diffusion_dir(path) -> tuple[DiffusionConfig, dict]:
    """Load a LLaDA or Dream directory, chosen by its tensor layout and ``model_type``.

    Raises:
      WeightFileError: the layout is neither LLaDA's nor a Dream (Qwen2-layout, ``model_type``
        Dream) checkpoint; otherwise as :func:`load_llada_dir` / :func:`load_dream_dir`.
    """
    d = _require_dir(path)
    src, where = _dir_source(d)
    layout = _layout(src.names)
    if layout.startswith("llada"):
        return load_llada_dir(d)
    raw = _read_json(d / "config.json")
    if layout == "qwen2" and str(raw.get("model_type", "")).lower() == "dream":
        return load_dream_dir(d)
    raise WeightFileError(
        f"{where}: not a LLaDA or Dream checkpoint (tensor layout {layout}, model_type "
        f"{raw.get('model_type')!r})"
    )


__all__ = ["load_llada_dir", "load_dream_dir", "load_diffusion_dir", "llada_model_config"]
