"""Export a :class:`models.diffusion.modeling.DiffusionLM` as a checkpoint folder its official
modeling code loads: a Dream head (:func:`export_dream_hf`) for ``DreamModel.from_pretrained``
(Dream-org/Dream and the copy in NVlabs/Fast-dLLM ``dream/model/modeling_dream.py`` /
``configuration_dream.py``), a LLaDA head (:func:`export_llada_hf`, last section) for
``LLaDAModelLM.from_pretrained``.

What that code expects, and how a jaxspec Dream differs (facts read from those two files):

* Tensor names are Qwen2's (``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj``
  ..., ``model.norm.weight``, ``lm_head.weight``), ``torch.nn.Linear`` ``(out, in)`` weights:
  :func:`models.checkpoint.export_hf` writes them from the jaxspec tree.
* Its q/k/v projections always carry a bias (``bias=True``). A body without biases (the
  SmolLM2-based Dream) gets zero biases, which compute the same function.
* ``config.json`` has ``model_type`` ``"Dream"`` and the ``DreamConfig`` fields
  (``rope_theta``, ``rms_norm_eps``, ``mask_token_id``, ``pad_token_id``,
  ``tie_word_embeddings`` ...); its head width is ``hidden_size // num_attention_heads``
  (no ``head_dim`` field), so a body whose ``head_dim`` differs cannot be written.
* ``DreamModel.from_pretrained`` also reads ``generation_config.json`` (its
  ``DreamGenerationConfig``): written with the mask, pad, BOS and EOS ids.
* The LM head is written out (``tie_word_embeddings`` false) even for a tied body: the same
  logits, and the folder loads without the weight-tying step, whose key list the official
  class declares in an older transformers format.

Attention in that code is bidirectional (``is_causal=False``, no mask for an unpadded
sequence) and its sampler shifts the logits right by one as :func:`models.diffusion.modeling.
shift_logits` does; the exported folder therefore computes :class:`DiffusionLM`'s function.

:func:`export_llada_hf` writes a LLaDA-head model for the official LLaDA modeling code
(``LLaDAModelLM.from_pretrained``: GSAI-ML/LLaDA-8B and the copy in NVlabs/Fast-dLLM
``llada/model/modeling_llada.py`` / ``configuration_llada.py``). Facts read from those files:

* Tensor names: ``model.transformer.wte.weight``, ``model.transformer.blocks.N.{attn_norm,
  q_proj, k_proj, v_proj, attn_out, ff_norm, ff_proj, up_proj, ff_out}``,
  ``model.transformer.ln_f.weight`` and, unless ``weight_tying``, ``model.transformer.ff_out``
  (``ff_proj`` is the SwiGLU gate, ``up_proj`` its up branch; :mod:`models.diffusion.params`
  holds the map, which :func:`models.checkpoint.export_hf` writes with).
* ``config.json`` holds ``model_type`` ``"llada"`` and the ``ModelConfig`` fields of
  ``configuration_llada.py``, whose defaults are an OLMo model, not LLaDA's: the block is
  ``"llama"`` with ``activation_type`` ``"silu"`` (the default ``"swiglu"`` would split the
  gate in two), norms ``"rms"``, ``rope`` on, dropouts 0, no ALiBi, no input-embedding
  scaling, no logit scaling. The head width is ``d_model // n_heads`` (no ``head_dim``
  field) and RoPE is the rotate-half form with base ``rope_theta`` over positions ``0, 1,
  ...``, so a body whose ``head_dim`` differs cannot be written. q/k/v carry biases iff
  ``include_qkv_bias``.
* Attention is bidirectional (``is_causal=False``; the attention bias it builds is never
  applied) and the logits at position ``i`` score the token at ``i``, as the ``"llada"``
  head does.
* A tied body (no ``lm_head``) is written with ``weight_tying`` true and no
  ``transformer.ff_out``, so the folder loads back through
  :func:`models.diffusion.params.load_llada_dir` into the same tree, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from models.diffusion.modeling import DiffusionConfig, DiffusionLM

GENERATION_CONFIG = "generation_config.json"
_BIASES = (("bq", "wq"), ("bk", "wk"), ("bv", "wv"))


def _stacked_tree(params) -> dict:
    """The bare, stacked, input-major parameter tree of ``params`` (``{"params": tree}``
    accepted; per-layer ``layers`` are stacked back) as numpy arrays.

    Raises:
      ValueError: a tree in another layout (int8 weight-only, output-major or fused q/k/v)."""
    tree = params["params"] if "params" in params else params
    layers = tree["layers"]
    if isinstance(layers, (list, tuple)):
        layers = {k: np.stack([np.asarray(layer[k]) for layer in layers]) for k in layers[0]}
    missing = [k for k in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down") if k not in layers]
    if missing:
        raise ValueError(
            f"export needs the stored (input-major, stacked) parameter layout; this tree's "
            f"layers lack {', '.join(missing)} (int8, output-major or fused q/k/v layout)"
        )
    out = {k: np.asarray(v) for k, v in tree.items() if k != "layers"}
    out["layers"] = {k: np.asarray(v) for k, v in layers.items()}
    return out


def _export_config(model, head: str, family: str, width: str) -> DiffusionConfig:
    """The config of ``model`` (a :class:`DiffusionLM` or its :class:`DiffusionConfig`),
    checked for an export in ``family``'s format.

    Raises:
      ValueError: the model's head is not ``head``, or its attention width ``head_dim *
        num_heads`` is not the hidden size (``family`` derives it as ``width``)."""
    cfg: DiffusionConfig = model.config if isinstance(model, DiffusionLM) else model
    base = cfg.base
    if cfg.head != head:
        raise ValueError(
            f"export_{head}_hf writes {family} checkpoints; this model's head is {cfg.head!r}"
        )
    if base.head_dim * base.num_heads != base.hidden_size:
        raise ValueError(
            f"{family}'s attention width is {width} = "
            f"{base.hidden_size // base.num_heads}; this body has head_dim {base.head_dim}"
        )
    return cfg


def export_dream_hf(
    out_dir,
    model: DiffusionLM,
    params,
    *,
    eos_ids: Sequence[int] = (),
    pad_id: Optional[int] = None,
    torch_dtype: str = "float32",
) -> Path:
    """Write ``model`` / ``params`` as a Dream checkpoint folder (module docstring):
    ``config.json``, ``generation_config.json``, ``model.safetensors.index.json`` and float32
    safetensors shards (one per layer). ``eos_ids`` / ``pad_id`` default to the body's
    ``eos_token_ids`` / ``pad_token_id`` (pad: the first EOS id, else 0); ``torch_dtype`` is
    the dtype the config names (the tensors are float32; a bfloat16 tree converts exactly).

    Returns the folder (created if needed).

    Raises:
      ValueError: a head other than ``"dream"``, ``head_dim != hidden_size // num_heads``,
        or a parameter tree not in the stored layout (:func:`_stacked_tree`)."""
    from models.checkpoint import export_hf

    cfg = _export_config(model, "dream", "Dream", "hidden_size // num_heads")
    base = cfg.base
    tree = _stacked_tree(params)
    layers = tree["layers"]
    for b, w in _BIASES:
        if b not in layers:
            layers[b] = np.zeros(layers[w].shape[:1] + layers[w].shape[-1:], np.float32)
    if "lm_head" not in tree:
        tree["lm_head"] = np.asarray(tree["embed"], np.float32).T
    eos = [int(e) for e in (eos_ids or base.eos_token_ids)]
    pad = pad_id if pad_id is not None else base.pad_token_id
    pad = int(pad if pad is not None else (eos[0] if eos else 0))
    written = DiffusionConfig(
        base.replace(
            qkv_bias=True, tie_embeddings=False, eos_token_ids=tuple(eos), pad_token_id=pad
        ),
        "dream",
        cfg.mask_token_id,
    )
    out = export_hf(out_dir, written, tree)
    conf = json.loads((out / "config.json").read_text())
    conf.pop("head_dim", None)  # DreamConfig has none: hidden_size // num_attention_heads
    conf.update(
        rope_scaling=None,
        use_cache=False,
        use_sliding_window=False,
        attention_dropout=0.0,
        torch_dtype=str(torch_dtype),
    )
    (out / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    gen = {
        "mask_token_id": cfg.mask_token_id,
        "pad_token_id": pad,
        "bos_token_id": base.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
    }
    (out / GENERATION_CONFIG).write_text(json.dumps(gen, indent=2) + "\n")
    return out


# configuration_llada.ModelConfig fields whose defaults (an OLMo model) a LLaDA body overrides,
# or that the official code reads and this export pins (module docstring)
_LLADA_FIXED = {
    "block_type": "llama",
    "activation_type": "silu",
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "bias_for_layer_norm": False,
    "attention_layer_norm": False,
    "attention_layer_norm_with_affine": True,
    "rope": True,
    "rope_full_precision": True,
    "alibi": False,
    "flash_attention": False,
    "multi_query_attention": None,
    "input_emb_norm": False,
    "scale_logits": False,
    "include_bias": False,
    "block_group_size": 1,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
    "init_device": None,
    "use_cache": False,
}


def export_llada_hf(
    out_dir,
    model,
    params,
    *,
    eos_ids: Sequence[int] = (),
    pad_id: Optional[int] = None,
    torch_dtype: str = "float32",
) -> Path:
    """Write a LLaDA-head ``model`` (a :class:`DiffusionLM` or its :class:`DiffusionConfig`)
    and ``params`` as a LLaDA checkpoint folder (module docstring): ``config.json``
    (configuration_llada's keys), ``model.safetensors.index.json`` and float32 safetensors
    shards (one per layer) with ``LLaDAModelLM``'s tensor names. ``eos_ids`` / ``pad_id``
    default to the body's ``eos_token_ids`` / ``pad_token_id`` (pad: the first EOS id, else
    0); ``torch_dtype`` is the dtype the config names (the tensors are float32; a bfloat16
    tree converts exactly). A float32 tree loads back bit for bit with
    :func:`models.diffusion.params.load_llada_dir`.

    Returns the folder (created if needed).

    Raises:
      ValueError: a head other than ``"llada"``, ``head_dim != hidden_size // num_heads``,
        or a parameter tree not in the stored layout (:func:`_stacked_tree`)."""
    from models.checkpoint import export_hf

    cfg = _export_config(model, "llada", "LLaDA", "d_model // n_heads")
    base = cfg.base
    tree = _stacked_tree(params)
    eos = [int(e) for e in (eos_ids or base.eos_token_ids)]
    pad = pad_id if pad_id is not None else base.pad_token_id
    pad = int(pad if pad is not None else (eos[0] if eos else 0))
    written = DiffusionConfig(
        base.replace(
            tie_embeddings="lm_head" not in tree, eos_token_ids=tuple(eos), pad_token_id=pad
        ),
        "llada",
        cfg.mask_token_id,
    )
    out = export_hf(out_dir, written, tree)
    conf = json.loads((out / "config.json").read_text())
    conf.update(_LLADA_FIXED)
    conf.update(
        mlp_ratio=max(1, base.intermediate_size // base.hidden_size),
        train_max_sequence_length=base.max_position_embeddings,
        bos_token_id=base.bos_token_id,
        eos_token_id=eos[0] if len(eos) == 1 else (eos or None),
        torch_dtype=str(torch_dtype),
    )
    (out / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    return out


__all__ = ["export_dream_hf", "export_llada_hf", "GENERATION_CONFIG"]
