"""Export a Dream-head :class:`models.diffusion.modeling.DiffusionLM` as a checkpoint folder the
official Dream modeling code loads (``DreamModel.from_pretrained``: Dream-org/Dream and the copy
in NVlabs/Fast-dLLM ``dream/model/modeling_dream.py`` / ``configuration_dream.py``).

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

    cfg: DiffusionConfig = model.config
    base = cfg.base
    if cfg.head != "dream":
        raise ValueError(
            f"export_dream_hf writes Dream checkpoints; this model's head is {cfg.head!r}"
        )
    if base.head_dim * base.num_heads != base.hidden_size:
        raise ValueError(
            f"Dream's attention width is hidden_size // num_heads = "
            f"{base.hidden_size // base.num_heads}; this body has head_dim {base.head_dim}"
        )
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


__all__ = ["export_dream_hf", "GENERATION_CONFIG"]
