"""Architecture configuration for the causal decoder (Llama / Qwen2 family).

One frozen dataclass describes every model :class:`models.llama.modeling.CausalLM` can build. It is
created from a Hugging Face ``config.json`` (:meth:`ModelConfig.from_hf_dict`), from GGUF
metadata (``models.llama.params``), or by hand for tiny random test models.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SUPPORTED_ARCHS = ("llama", "qwen2")


class ConfigError(ValueError):
    """A model configuration is missing a field or names an unsupported architecture."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama/Qwen2-style decoder.

    Attributes:
      arch: ``"llama"`` or ``"qwen2"`` (Qwen2 = Llama + q/k/v biases).
      vocab_size: number of rows of the token embedding (V).
      hidden_size: model width D.
      intermediate_size: SwiGLU hidden width F.
      num_layers: number of decoder blocks.
      num_heads: query heads H.
      num_kv_heads: key/value heads (grouped-query attention, H % num_kv_heads == 0).
      head_dim: per-head width (usually D // H).
      rope_theta: RoPE base frequency.
      rms_norm_eps: epsilon of every RMSNorm.
      tie_embeddings: if True the LM head is the transposed token embedding.
      qkv_bias: whether q/k/v projections carry a bias (True for Qwen2).
      max_position_embeddings: the context length the model was trained for (tokens).
      bos_token_id / eos_token_ids / pad_token_id: special token ids (may be None / empty).
      mask_token_id: the [MASK] id of a SPACE SAR-SFT model (:mod:`jaxspec.causal.space`);
        None for a plain causal LM.
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    mask_token_id: int | None = None

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHS:
            raise ConfigError(
                f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def from_hf_dict(cls, cfg: Mapping[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (``LlamaConfig`` / ``Qwen2Config``).

        A ``mask_token_id`` key (written by :func:`models.checkpoint.export_hf` for a SPACE
        SAR-SFT model) sets :attr:`mask_token_id`; without it the field stays None.

        Raises:
          ConfigError: unknown ``model_type``, a missing required field, or a
            ``mask_token_id`` that is not an integer id in ``[0, vocab_size)``.
        """
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_ARCHS:
            raise ConfigError(
                f"config.json has model_type={model_type!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            eos = cfg.get("eos_token_id")
            eos_ids = (
                tuple(eos)
                if isinstance(eos, (list, tuple))
                else (() if eos is None else (int(eos),))
            )
            rope_theta = cfg.get("rope_theta")
            if rope_theta is None:
                rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
            mask = cfg.get("mask_token_id")
            if mask is not None and (
                isinstance(mask, bool)
                or not isinstance(mask, int)
                or not 0 <= mask < int(cfg["vocab_size"])
            ):
                raise ConfigError(
                    f"config.json mask_token_id {mask!r} is not a token id in "
                    f"[0, {cfg['vocab_size']})"
                )
            scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
            if scaling and scaling.get("rope_type", scaling.get("type", "default")) not in (
                "default",
                None,
            ):
                raise ConfigError(f"rope_scaling {scaling} is not supported")
            return cls(
                arch=model_type,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rope_theta=float(rope_theta),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
                pad_token_id=cfg.get("pad_token_id"),
                mask_token_id=mask,
            )
        except KeyError as e:  # pragma: no cover - message path
            raise ConfigError(f"config.json is missing required field {e.args[0]!r}") from None

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)
