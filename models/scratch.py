"""Randomly initialised masked-diffusion models described by a training config's ``model``
section: the section's schema and the model it builds.

The ``model`` section of ``configs/train/*.yaml`` (:class:`ModelSection`) is read by the
trainer (:mod:`jaxspec.training.config`) and, for ``scratch`` presets such as ``dlm-tiny``, by
the model registry (:func:`models.registry.load_model`), so both build the same model from the
same file: :func:`scratch_diffusion` turns a section with ``init: scratch`` into a Llama-style
:class:`models.diffusion.modeling.DiffusionLM` with parameters from
:func:`models.llama.modeling.init_params` (seed ``train.seed``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from models.config import ModelConfig
from models.diffusion.modeling import DiffusionConfig, DiffusionLM
from models.llama.modeling import init_params


@dataclasses.dataclass
class ModelSection:
    """``init``: ``"scratch"`` (random init from the fields below) or ``"preset"`` (weights of
    ``preset`` from ``configs/models``). ``tokenizer``: preset whose tokenizer encodes the
    data (defaults to ``preset``). ``vocab_size`` None means the tokenizer's."""

    init: str = "scratch"
    preset: Optional[str] = None
    tokenizer: Optional[str] = None
    head: str = "llada"
    mask_token_id: Optional[int] = None
    arch: str = "llama"
    vocab_size: Optional[int] = None
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    max_position_embeddings: int = 2048


def diffusion_model(section: ModelSection, base: ModelConfig) -> DiffusionLM:
    """The :class:`DiffusionLM` of ``base`` with the section's ``head`` and ``mask_token_id``
    (not None)."""
    return DiffusionLM(
        DiffusionConfig(base=base, head=section.head, mask_token_id=int(section.mask_token_id))
    )


def scratch_diffusion(
    section: ModelSection, vocab_size: int, seed: int
) -> tuple[DiffusionLM, dict]:
    """``(DiffusionLM, params)``: the randomly initialised model of an ``init: scratch`` section.

    Args:
      section: the training config's ``model`` section (``mask_token_id`` set).
      vocab_size: ``V`` (the section's ``vocab_size`` or its tokenizer's).
      seed: parameter seed (the config's ``train.seed``).
    """
    m = section
    base = ModelConfig(
        arch=m.arch,
        vocab_size=int(vocab_size),
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        rope_theta=m.rope_theta,
        rms_norm_eps=m.rms_norm_eps,
        tie_embeddings=m.tie_embeddings,
        qkv_bias=(m.arch == "qwen2"),
        max_position_embeddings=m.max_position_embeddings,
    )
    return diffusion_model(m, base), init_params(base, seed)


__all__ = ["ModelSection", "diffusion_model", "scratch_diffusion"]
