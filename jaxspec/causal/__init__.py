"""Causal-LM methods: autoregressive decoding and chain speculative decoding with any
:class:`jaxspec.core.drafters.Drafter` (n-gram today; SPACE and DiffuSpec build on the same
loop)."""

from jaxspec.causal.decode import (
    DecodeInputError,
    DecodePlan,
    GenerationResult,
    decode_plan,
    generate,
)

__all__ = ["DecodeInputError", "DecodePlan", "GenerationResult", "decode_plan", "generate"]
