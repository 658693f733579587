"""Causal-LM methods: autoregressive decoding and chain speculative decoding with any
:class:`jaxspec.core.drafters.Drafter` (n-gram today; SPACE and DiffuSpec build on the same
loop)."""

from jaxspec.causal.decode import DecodeInputError, GenerationResult, generate

__all__ = ["DecodeInputError", "GenerationResult", "generate"]
